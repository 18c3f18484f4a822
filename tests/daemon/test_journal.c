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
  /* an empty record is refused: replay would take one for damage */
  assert_int_equal(mega_journal_append(j, "", 0, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "empty record"));
  const void *recs[] = {"x", ""};
  size_t lens[] = {1, 0};
  assert_int_equal(mega_journal_append_many(j, recs, lens, 2, &err), MEGA_ERR_INVALID);
  append(j, "job-1 running");
  mega_journal_close(j);

  mega_journal_report r = {.torn_bytes = 99};
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(r.torn_bytes, 0);
  assert_int_equal(r.damaged_regions, 0);
  assert_int_equal(r.records, 2);
  assert_string_equal(r.copy, "");
  assert_int_equal(c.n, 2);
  assert_string_equal(c.recs[0], "submit job-1");
  assert_string_equal(c.recs[1], "job-1 running");
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

  /* whole but wrong: damage, not a tear (a crash cuts a record short; it
   * does not change one) */
  mega_journal_report r;
  collected c = reopen_and_replay(path, &r);
  assert_int_equal(c.n, 1);
  assert_string_equal(c.recs[0], "good");
  assert_int_equal(r.torn_bytes, 0);
  assert_int_equal(r.damaged_regions, 1);
  assert_int_equal(r.damaged_bytes, 8 + strlen("flipped"));
  assert_int_equal(r.first_damage, 8 + 4);
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
  assert_int_equal(r.damaged_bytes, sizeof head); /* no record of ours was ever that long */
  assert_int_equal(r.torn_bytes, 0);
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


/* n records "rec-%03d" of 12 bytes each (20 with their frame). */
#define REC 20
static void fill(const char *path, int n) {
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  char (*text)[16] = calloc((size_t)n, sizeof *text);
  const void **recs = calloc((size_t)n, sizeof *recs);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  for (int i = 0; i < n; i++) {
    snprintf(text[i], sizeof text[i], "record-%05d", i);
    recs[i] = text[i];
    lens[i] = strlen(text[i]);
  }
  assert_int_equal(mega_journal_append_many(j, recs, lens, (size_t)n, &err), MEGA_OK);
  mega_journal_close(j);
  free(text);
  free(recs);
  free(lens);
}

static void zero(const char *path, off_t at, size_t len) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  char *z = calloc(1, len);
  assert_int_equal(pwrite(fd, z, len, at), (ssize_t)len);
  free(z);
  close(fd);
}

static int count(void *ctx, const uint8_t *rec, size_t len) {
  (void)rec;
  (void)len;
  (*(int *)ctx)++;
  return 0;
}

static int replay_count(const char *path, mega_journal_report *r) {
  int n = 0;
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, count, &n, r, &err), MEGA_OK);
  mega_journal_close(j);
  return n;
}

/* Zeros at a record boundary are damage, not a run of empty records (the
 * crc32 of nothing is 0): 4 KiB zeroed dropped 8 jobs with no word. */
static void zeroed_block_is_damage(void **state) {
  const char *path = path_in(state, "j");
  fill(path, 1000); /* 20,000 bytes */
  zero(path, 100 * REC, 4096);
  mega_journal_report r;
  int n = replay_count(path, &r);
  /* 4096 bytes from record 100's start end inside record 304 (4096 = 204.8
   * records): records 100 to 304 are lost, the rest replayed */
  assert_int_equal(n, 1000 - 205);
  assert_int_equal(r.records, 1000 - 205);
  assert_int_equal(r.damaged_regions, 1);
  assert_int_equal(r.damaged_bytes, 205 * REC);
  assert_int_equal(r.first_damage, 100 * REC);
  assert_int_equal(r.torn_bytes, 0);
  struct stat st;
  assert_int_equal(stat(r.copy, &st), 0); /* the file as found */
  assert_int_equal(st.st_size, 1000 * REC);
  /* rewritten from the good records: nothing wrong the next time */
  mega_journal_report r2;
  assert_int_equal(replay_count(path, &r2), 1000 - 205);
  assert_int_equal(r2.damaged_regions + r2.torn_bytes, 0);
}

/* Half the journal zeroed, to its end: one region of that size, at the
 * end, not one of 133 bytes among 8,184 good records. */
static void zeroed_half_is_damage_at_the_end(void **state) {
  const char *path = path_in(state, "j");
  fill(path, 1000);
  zero(path, 500 * REC, 500 * REC);
  mega_journal_report r;
  assert_int_equal(replay_count(path, &r), 500);
  assert_int_equal(r.damaged_regions, 1);
  assert_int_equal(r.damaged_bytes, 500 * REC);
  assert_int_equal(r.torn_bytes, 0);
  assert_string_not_equal(r.copy, "");
}

/* A journal of random bytes is damage through and through, not "a torn
 * last record". */
static void random_bytes_are_damage(void **state) {
  const char *path = path_in(state, "j");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  uint32_t x = 12345;
  for (int i = 0; i < 65536; i++) {
    x = x * 1103515245u + 12345u;
    fputc((int)(x >> 24), f);
  }
  fclose(f);
  mega_journal_report r;
  assert_int_equal(replay_count(path, &r), 0);
  assert_int_equal(r.damaged_regions, 1);
  assert_int_equal(r.damaged_bytes, 65536);
  assert_int_equal(r.torn_bytes, 0);
  struct stat st;
  assert_int_equal(stat(r.copy, &st), 0);
  assert_int_equal(st.st_size, 65536);
}

/* Every damaged replay keeps its copy, even two in one second. */
static void every_copy_is_kept(void **state) {
  const char *path = path_in(state, "j");
  char first[4096];
  for (int k = 0; k < 2; k++) {
    fill(path, 10);
    zero(path, 3 * REC, REC);
    mega_journal_report r;
    assert_int_equal(replay_count(path, &r), 9 + 9 * k); /* one lost each time */
    assert_int_equal(r.damaged_regions, 1);
    struct stat st;
    assert_int_equal(stat(r.copy, &st), 0);
    if (k == 0) snprintf(first, sizeof first, "%s", r.copy);
    else assert_string_not_equal(first, r.copy);
    assert_int_equal(stat(first, &st), 0);
    assert_int_equal(st.st_size, 10 * REC); /* the first copy, untouched */
  }
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
      cmocka_unit_test_setup_teardown(zeroed_block_is_damage, setup, teardown),
      cmocka_unit_test_setup_teardown(zeroed_half_is_damage_at_the_end, setup, teardown),
      cmocka_unit_test_setup_teardown(random_bytes_are_damage, setup, teardown),
      cmocka_unit_test_setup_teardown(every_copy_is_kept, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
