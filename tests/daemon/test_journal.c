#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/model/journal.h"

typedef struct collected {
  int n;
  char recs[16][64];
  size_t lens[16];
} collected;

static int collect(void *ctx, const uint8_t *rec, size_t len) {
  collected *c = ctx;
  if (c->n >= 16 || len >= 64) return 1;
  memcpy(c->recs[c->n], rec, len);
  c->recs[c->n][len] = '\0';
  c->lens[c->n++] = len;
  return 0;
}

static int setup(void **state) {
  char *dir = strdup("/tmp/mega-journal-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  *state = dir;
  return 0;
}

static int teardown(void **state) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", (char *)*state);
  int rc = system(cmd);
  free(*state);
  return rc;
}

static char *path_in(void **state, const char *name) {
  static char buf[256];
  snprintf(buf, sizeof buf, "%s/%s", (char *)*state, name);
  return buf;
}

static void append(mega_journal *j, const char *s) {
  mega_err err = {0};
  assert_int_equal(mega_journal_append(j, s, strlen(s), &err), MEGA_OK);
}

static collected reopen_and_replay(const char *path, mega_journal_report *rep) {
  collected c = {0};
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, collect, &c, rep, &err), MEGA_OK);
  mega_journal_close(j);
  return c;
}

static void records_survive_reopen_in_order(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, collect, &(collected){0}, NULL, &err), MEGA_OK);
  append(j, "submit job-1");
  append(j, "");
  append(j, "job-1 running");
  mega_journal_close(j);

  mega_journal_report r = {.torn_bytes = 99};
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(r.torn_bytes, 0);
  assert_int_equal(r.damaged_regions, 0);
  assert_int_equal(r.records, 3);
  assert_string_equal(r.copy, "");
  assert_int_equal(c.n, 3);
  assert_string_equal(c.recs[0], "submit job-1");
  assert_int_equal(c.lens[1], 0);
  assert_string_equal(c.recs[2], "job-1 running");
}

static void torn_tail_is_cut_and_appends_continue(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  append(j, "first");
  append(j, "second");
  mega_journal_close(j);

  /* A crash mid-append: half of a third record's header and payload. */
  int fd = open(path, O_WRONLY | O_APPEND);
  const uint8_t torn[] = {20, 0, 0, 0, 1, 2, 3, 4, 'x', 'y'};
  assert_int_equal(write(fd, torn, sizeof torn), (ssize_t)sizeof torn);
  close(fd);

  mega_journal_report r;
  mega_journal *j2;
  collected c = {0};
  assert_int_equal(mega_journal_open(path, &j2, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j2, collect, &c, &r, &err), MEGA_OK);
  assert_int_equal(c.n, 2);
  assert_int_equal(r.torn_bytes, sizeof torn);
  assert_int_equal(r.damaged_regions, 0);
  /* what was cut is kept beside the journal */
  struct stat st;
  assert_int_equal(stat(r.copy, &st), 0);
  assert_int_equal(st.st_size, 2 * 8 + strlen("first") + strlen("second") + sizeof torn);
  unlink(r.copy);
  append(j2, "third");
  mega_journal_close(j2);

  c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 3);
  assert_string_equal(c.recs[2], "third");
  assert_int_equal(r.torn_bytes, 0);
}

/* One flipped byte in the middle is damage, not a torn tail: the records
 * after it survive, the file as found is kept, and the journal is rewritten
 * clean. (An earlier megad cut the file there: 11 jobs became 6.) */
static void damage_mid_journal_keeps_the_records_after_it(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  const char *names[] = {"job-1", "job-2", "job-3", "job-4", "job-5"};
  for (int i = 0; i < 5; i++) append(j, names[i]);
  mega_journal_close(j);

  int fd = open(path, O_RDWR);
  off_t at = 2 * (8 + 5) + 8 + 2; /* inside job-3's payload */
  assert_int_equal(pwrite(fd, "X", 1, at), 1);
  close(fd);

  mega_journal_report r;
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 4);
  assert_string_equal(c.recs[0], "job-1");
  assert_string_equal(c.recs[1], "job-2");
  assert_string_equal(c.recs[2], "job-4");
  assert_string_equal(c.recs[3], "job-5");
  assert_int_equal(r.damaged_regions, 1);
  assert_int_equal(r.damaged_bytes, 8 + 5);
  assert_int_equal(r.torn_bytes, 0);
  struct stat st;
  assert_int_equal(stat(r.copy, &st), 0);
  assert_int_equal(st.st_size, 5 * (8 + 5));
  unlink(r.copy);

  /* rewritten: the next replay finds nothing wrong */
  c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 4);
  assert_int_equal(r.damaged_regions, 0);
  assert_string_equal(r.copy, "");
}

static void corrupt_record_ends_the_log(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  append(j, "good");
  append(j, "flipped");
  mega_journal_close(j);

  /* Flip one payload byte of the second record: its CRC no longer holds. */
  int fd = open(path, O_RDWR);
  off_t at = 8 + 4 + 8 + 2;
  assert_int_equal(pwrite(fd, "X", 1, at), 1);
  close(fd);

  mega_journal_report r;
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 1);
  assert_string_equal(c.recs[0], "good");
  assert_int_equal(r.torn_bytes, 8 + strlen("flipped"));
  unlink(r.copy);
}

static void absurd_length_is_not_allocated(void **state) {
  const char *path = path_in(state, "j");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const uint8_t head[] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
  assert_int_equal(write(fd, head, sizeof head), (ssize_t)sizeof head);
  close(fd);
  mega_journal_report r;
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 0);
  assert_int_equal(r.torn_bytes, sizeof head);
  unlink(r.copy);
}

static void rewrite_replaces_everything(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  for (int i = 0; i < 5; i++) append(j, "old");
  const char *a = "compact-a", *b = "compact-b";
  const void *recs[] = {a, b};
  size_t lens[] = {strlen(a), strlen(b)};
  assert_int_equal(mega_journal_rewrite(j, recs, lens, 2, &err), MEGA_OK);
  append(j, "after");
  mega_journal_close(j);

  collected c = reopen_and_replay(path, NULL);
  assert_int_equal(c.n, 3);
  assert_string_equal(c.recs[0], "compact-a");
  assert_string_equal(c.recs[1], "compact-b");
  assert_string_equal(c.recs[2], "after");
  struct stat st;
  assert_int_not_equal(stat(path_in(state, "j.tmp"), &st), 0);
}

static void unwritable_path_is_a_clear_error(void **state) {
  (void)state;
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open("/nonexistent-dir/j", &j, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent-dir/j"));
  assert_non_null(strstr(err.msg, "No such file"));
}

static void refusing_callback_stops_replay(void **state) {
  const char *path = path_in(state, "j");
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  char big[100];
  memset(big, 'a', sizeof big);
  assert_int_equal(mega_journal_append(j, big, sizeof big, &err), MEGA_OK);
  mega_journal_close(j);
  collected c = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, collect, &c, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "refused"));
  mega_journal_close(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(records_survive_reopen_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(torn_tail_is_cut_and_appends_continue, setup, teardown),
      cmocka_unit_test_setup_teardown(corrupt_record_ends_the_log, setup, teardown),
      cmocka_unit_test_setup_teardown(absurd_length_is_not_allocated, setup, teardown),
      cmocka_unit_test_setup_teardown(rewrite_replaces_everything, setup, teardown),
      cmocka_unit_test_setup_teardown(unwritable_path_is_a_clear_error, setup, teardown),
      cmocka_unit_test_setup_teardown(refusing_callback_stops_replay, setup, teardown),
      cmocka_unit_test_setup_teardown(damage_mid_journal_keeps_the_records_after_it, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
