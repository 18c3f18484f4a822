/* The journal when the disk fills up or the process runs out of file
 * descriptors (daemon/model/journal.h): a write that fails part way
 * (ENOSPC, or EFBIG past ulimit -f, which stands in for a full disk here:
 * RLIMIT_FSIZE needs no root and stops a write at an exact byte) leaves the
 * journal as it was before the call, so appends after the disk has room
 * again follow good records, and the next replay finds no damage that
 * never was; a rewrite that fails after its rename appends to the new file,
 * and one a crash cut short leaves no temp file once the journal opens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/model/journal.h"

static int setup(void **state) {
  char *dir = strdup("/tmp/mega-journal-full-XXXXXX");
  if (!dir || !mkdtemp(dir)) return -1;
  *state = dir;
  signal(SIGXFSZ, SIG_IGN); /* as megad: the write fails with EFBIG instead */
  return 0;
}

static int teardown(void **state) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", (char *)*state);
  int rc = system(cmd);
  free(*state);
  return rc;
}

/* Files may grow to `bytes` from now on (RLIM_INFINITY: as before). */
static void file_limit(rlim_t bytes) {
  struct rlimit r;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &r), 0);
  r.rlim_cur = bytes == RLIM_INFINITY ? r.rlim_max : bytes;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &r), 0);
}

static off_t size_of(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return st.st_size;
}

static int count(void *ctx, const uint8_t *rec, size_t len) {
  (void)rec;
  (void)len;
  (*(int *)ctx)++;
  return 0;
}

/* Replays path from a fresh open: the records, and what the report said. */
static int replay(const char *path, mega_journal_report *r) {
  mega_journal *j;
  mega_err err = {0};
  int n = 0;
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, count, &n, r, &err), MEGA_OK);
  mega_journal_close(j);
  return n;
}

/* Files in dir whose names start with prefix. */
static int files_named(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

static const char rec[] = "a job record of some length, as megad writes them";

/* A new journal at path (in the test's dir) with n records. */
static mega_journal *with_records(void **state, char *path, size_t cap, int n) {
  snprintf(path, cap, "%s/journal", (char *)*state);
  mega_journal *j;
  mega_err err = {0};
  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  assert_int_equal(mega_journal_replay(j, NULL, NULL, NULL, &err), MEGA_OK);
  for (int i = 0; i < n; i++) assert_int_equal(mega_journal_append(j, rec, sizeof rec, &err), MEGA_OK);
  return j;
}

/* Appends cut at every point of a record, then room again: the next append
 * follows the good records, and replay finds three records and no damage
 * (it used to find a damaged region, say so loudly and rewrite). */
static void failed_append_leaves_the_journal_as_it_was(void **state) {
  char path[256];
  mega_err err = {0};
  mega_journal *j = with_records(state, path, sizeof path, 1);
  off_t before = size_of(path);
  /* nothing written, half a header, part of the payload, one byte short */
  const rlim_t cuts[] = {0, 4, 8 + 10, 8 + sizeof rec - 1};
  for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
    file_limit((rlim_t)before + cuts[k]);
    mega_status st = mega_journal_append(j, rec, sizeof rec, &err);
    file_limit(RLIM_INFINITY);
    assert_int_equal(st, MEGA_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(size_of(path), before);
  }
  assert_int_equal(mega_journal_append(j, rec, sizeof rec, &err), MEGA_OK);
  assert_int_equal(mega_journal_append(j, rec, sizeof rec, &err), MEGA_OK);
  mega_journal_close(j);
  mega_journal_report r;
  assert_int_equal(replay(path, &r), 3);
  assert_int_equal(r.damaged_regions, 0);
  assert_int_equal(r.torn_bytes, 0);
  assert_string_equal(r.copy, "");
}

/* A batch (a retention pass's forgets) is all or nothing on a full disk. */
static void failed_batch_leaves_the_journal_as_it_was(void **state) {
  char path[256];
  mega_err err = {0};
  mega_journal *j = with_records(state, path, sizeof path, 1);
  off_t before = size_of(path);
  const void *recs[] = {rec, rec, rec};
  size_t lens[] = {sizeof rec, sizeof rec, sizeof rec};
  file_limit((rlim_t)before + 8 + sizeof rec + 20); /* the first fits, the second is cut */
  mega_status st = mega_journal_append_many(j, recs, lens, 3, &err);
  file_limit(RLIM_INFINITY);
  assert_int_equal(st, MEGA_ERR_IO);
  assert_int_equal(size_of(path), before);
  assert_int_equal(mega_journal_append_many(j, recs, lens, 3, &err), MEGA_OK);
  mega_journal_close(j);
  mega_journal_report r;
  assert_int_equal(replay(path, &r), 4);
  assert_int_equal(r.damaged_regions, 0);
  assert_int_equal(r.torn_bytes, 0);
}

/* A rewrite (compaction) that finds no room fails and leaves the journal
 * whole and in use, and no temp file. */
static void failed_rewrite_keeps_the_old_journal(void **state) {
  char path[256];
  mega_err err = {0};
  mega_journal *j = with_records(state, path, sizeof path, 4);
  const void *recs[] = {rec, rec, rec};
  size_t lens[] = {sizeof rec, sizeof rec, sizeof rec};
  file_limit(8 + sizeof rec + 20);
  mega_status st = mega_journal_rewrite(j, recs, lens, 3, &err);
  file_limit(RLIM_INFINITY);
  assert_int_equal(st, MEGA_ERR_IO);
  assert_int_equal(files_named((char *)*state, "journal.tmp"), 0);
  assert_int_equal(mega_journal_append(j, rec, sizeof rec, &err), MEGA_OK);
  mega_journal_close(j);
  mega_journal_report r;
  assert_int_equal(replay(path, &r), 5);
  assert_int_equal(r.damaged_regions, 0);
}

/* A torn tail (a crash) found on a full disk: the copy of the file as found
 * cannot be kept, and replay says so; no half-written copy is left behind
 * (each failed start of a megad that systemd restarts left one). */
static void copy_that_cannot_be_kept_is_not_left_half_written(void **state) {
  char path[256];
  mega_err err = {0};
  mega_journal *j = with_records(state, path, sizeof path, 40);
  mega_journal_close(j);
  int fd = open(path, O_WRONLY | O_APPEND);
  const uint8_t torn[] = {20, 0, 0, 0, 1, 2};
  assert_int_equal(write(fd, torn, sizeof torn), (ssize_t)sizeof torn);
  close(fd);
  off_t size = size_of(path);

  assert_int_equal(mega_journal_open(path, &j, &err), MEGA_OK);
  file_limit((rlim_t)size / 2);
  mega_status st = mega_journal_replay(j, NULL, NULL, NULL, &err);
  file_limit(RLIM_INFINITY);
  mega_journal_close(j);
  assert_int_equal(st, MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "cannot keep a copy"));
  assert_int_equal(files_named((char *)*state, "journal.damaged-"), 0);
  assert_int_equal(size_of(path), size); /* nothing cut without its copy */

  mega_journal_report r;
  assert_int_equal(replay(path, &r), 40); /* room again: cut, and the copy kept */
  assert_int_equal(r.torn_bytes, sizeof torn);
  assert_int_equal(files_named((char *)*state, "journal.damaged-"), 1);
}

/* The lowest free file descriptor. */
static int lowest_free_fd(void) {
  int fd = dup(0);
  assert_true(fd >= 0);
  close(fd);
  return fd;
}

/* A rewrite with one file descriptor left (RLIMIT_NOFILE): its temp file
 * opens and is renamed into place, so the new file is the journal now, and
 * appends go to it. They went to the old file, unlinked by the rename,
 * when the directory could not be opened to sync: lost without a word. */
static void rewrite_that_cannot_sync_appends_to_the_new_file(void **state) {
  char path[256];
  mega_err err = {0};
  mega_journal *j = with_records(state, path, sizeof path, 4);
  const void *recs[] = {rec, rec, rec};
  size_t lens[] = {sizeof rec, sizeof rec, sizeof rec};
  struct rlimit was, r;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
  r = was;
  r.rlim_cur = (rlim_t)lowest_free_fd() + 1; /* the temp file's, and no more */
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &r), 0);
  mega_status st = mega_journal_rewrite(j, recs, lens, 3, &err);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
  /* (closing the old file first frees a descriptor for the sync now) */
  if (st != MEGA_OK) assert_non_null(strstr(err.msg, path));
  static const char after[] = "written after the rewrite";
  assert_int_equal(mega_journal_append(j, after, sizeof after, &err), MEGA_OK);
  mega_journal_close(j);
  mega_journal_report rep;
  assert_int_equal(replay(path, &rep), 4); /* the rewrite's 3, then this */
  assert_int_equal(rep.damaged_regions, 0);
}

/* A rewrite that a crash cut short left journal.tmp (as big as the
 * journal); the next open removes it, and the journal is as it was. */
static void crashed_rewrite_leaves_no_temp(void **state) {
  char path[256], tmp[300];
  mega_journal *j = with_records(state, path, sizeof path, 3);
  mega_journal_close(j);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs("half a rewrite", f);
  fclose(f);
  mega_journal_report r;
  assert_int_equal(replay(path, &r), 3);
  assert_int_equal(r.damaged_regions, 0);
  assert_int_equal(files_named((char *)*state, "journal.tmp"), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(failed_append_leaves_the_journal_as_it_was, setup, teardown),
      cmocka_unit_test_setup_teardown(failed_batch_leaves_the_journal_as_it_was, setup, teardown),
      cmocka_unit_test_setup_teardown(failed_rewrite_keeps_the_old_journal, setup, teardown),
      cmocka_unit_test_setup_teardown(copy_that_cannot_be_kept_is_not_left_half_written, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(rewrite_that_cannot_sync_appends_to_the_new_file, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(crashed_rewrite_leaves_no_temp, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
