/* megad on a full disk, end to end. A full disk is megad's file size limit
 * here (RLIMIT_FSIZE, set on the running megad with prlimit): it needs no
 * root and no mount, stops a write at an exact byte, and the write fails as
 * on a full disk (EFBIG for ENOSPC; megad catches SIGXFSZ). What the journal
 * could not take is written from memory once there is room, so a restart
 * finds every job as it ended, and a job refused for want of room needs no
 * rewrite; a log file at the limit does not make megad spin. Each case
 * runs as a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

/* megad may write files up to `bytes` from now on (RLIM_INFINITY: as before). */
static void file_limit(const hd *d, rlim_t bytes) {
  struct rlimit r;
  assert_int_equal(prlimit(d->pid, RLIMIT_FSIZE, NULL, &r), 0);
  r.rlim_cur = bytes == RLIM_INFINITY ? r.rlim_max : bytes;
  assert_int_equal(prlimit(d->pid, RLIMIT_FSIZE, &r, NULL), 0);
}

static off_t size_of(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return st.st_size;
}

/* A job that trains until cancelled, its worker running. */
static void start_long_job(hd *d, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  const char *slow[] = {"--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, d->dir, 100000, slow);
  spec.nproc_per_node = 1;
  mega_err err = {0};
  assert_int_equal(hd_submit(d, &spec, id, len, &err), MEGA_OK);
  pid_t pids[4];
  assert_true(hd_wait_workers(d, 1, 20000, pids));
}

static Mega__V1__JobState state_of(hd *d, const char *id) {
  mega_err err = {0};
  Mega__V1__Job *j = hd_get_job(d, id, &err);
  if (!j) fail_msg("GetJob %s: %s", id, err.msg);
  Mega__V1__JobState s = j->state;
  protobuf_c_message_free_unpacked(&j->base, NULL);
  return s;
}

/* The disk fills: a new job is refused with the journal's reason (its
 * first record cut 4 bytes in, and cut back out). */
static void refuse_on_a_full_disk(hd *d) {
  char journal[200];
  snprintf(journal, sizeof journal, "%s/journal", d->dir);
  file_limit(d, (rlim_t)size_of(journal) + 4);
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 1, NULL);
  char refused[64];
  mega_err err = {0};
  assert_int_not_equal(hd_submit(d, &spec, refused, sizeof refused, &err), MEGA_OK);
  assert_true(hd_text_ok("the refusal", err.msg, HD_ALL(journal, "File too large"), NULL));
}

/* The disk fills while id runs (a job refused), then not a byte fits, as
 * on a real full disk, where a rewrite from memory would not fit either
 * (room for a file of the journal's size would let the table, which is
 * smaller, be written at once), and id is cancelled: its end is in
 * memory, not in the journal. */
static void cancel_on_a_full_disk(hd *d, const char *id) {
  refuse_on_a_full_disk(d);
  file_limit(d, 1);
  mega_err err = {0};
  assert_int_equal(hd_cancel(d, id, "the disk filled", &err), MEGA_OK);
  assert_int_equal(state_of(d, id), STATE(CANCELLED));
}

/* A restart finds id cancelled, and no damage in the journal. */
static void restart_finds_it_cancelled(hd *d, const char *id) {
  assert_true(hd_restart(d, NULL));
  assert_int_equal(state_of(d, id), STATE(CANCELLED));
  assert_false(hd_log_has(d, "DAMAGED"));
  assert_false(hd_log_has(d, "torn"));
  assert_false(hd_log_has(d, "resuming"));
}

/* Room again: the next retention pass (a job's end starts one) writes the
 * journal from memory. Before, the cancel was never journaled, and megad
 * killed then resumed the cancelled job as if it had been running. */
static void test_journal_catches_up_when_there_is_room(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "f1", 1, NULL, NULL, NULL));
  char id[64], next[64];
  start_long_job(&d, id, sizeof id);
  cancel_on_a_full_disk(&d, id);
  file_limit(&d, RLIM_INFINITY);
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 1, NULL);
  spec.nproc_per_node = 1;
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, next, sizeof next, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, next, false, 30000, &w);
  assert_true(hd_succeeded(&d, &w));
  hd_watch_free(&w);
  assert_true(hd_wait_log(&d, "journal: rewritten from the jobs in memory", 15000));
  restart_finds_it_cancelled(&d, id);
  assert_int_equal(state_of(&d, next), STATE(SUCCEEDED));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* An operator frees space and restarts megad (SIGTERM) at once: megad
 * writes the journal from memory as it stops. */
static void test_stop_writes_what_the_journal_missed(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "f2", 1, NULL, NULL, NULL));
  char id[64];
  start_long_job(&d, id, sizeof id);
  cancel_on_a_full_disk(&d, id);
  file_limit(&d, RLIM_INFINITY);
  assert_int_equal(hd_stop(&d), 0);
  restart_finds_it_cancelled(&d, id);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* A job refused on a full disk (its first record could not be written)
 * leaves the journal whole: the table holds nothing the file lacks, so no
 * rewrite follows. It was once counted as a change the journal missed,
 * and megad rewrote the journal for it at its next retention pass or its
 * stop. (megad's log is at the limit too: what it said then is lost.) */
static void test_refused_job_needs_no_rewrite(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "f4", 1, NULL, NULL, NULL));
  refuse_on_a_full_disk(&d);
  file_limit(&d, RLIM_INFINITY);
  assert_int_equal(hd_stop(&d), 0); /* a stop rewrites a journal that is behind */
  assert_false(hd_log_has(&d, "journal: rewritten"));
  hd_cleanup(&d);
}

/* Write calls d's megad has made (/proc/PID/io), failed ones too. */
static long long write_calls(const hd *d) {
  char path[64], line[128];
  snprintf(path, sizeof path, "/proc/%d/io", (int)d->pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  long long n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "syscw: %lld", &n) == 1) break;
  fclose(f);
  assert_true(n >= 0);
  return n;
}

/* megad's own log at the limit (systemd's LimitFSIZE= with its stderr in
 * a file): the warning about SIGXFSZ cannot be written, and its failed
 * write raised SIGXFSZ again, for ever: megad spun a core on writes that
 * all failed. Now it says so once, then at most once a minute. */
static void test_log_at_the_limit_does_not_spin(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "f3", 1, NULL, NULL, NULL));
  file_limit(&d, (rlim_t)size_of(d.log));
  assert_int_equal(kill(d.pid, SIGXFSZ), 0);
  long long before = write_calls(&d);
  usleep(500 * 1000); /* a window to count in: what is measured is no event */
  long long made = write_calls(&d) - before;
  file_limit(&d, RLIM_INFINITY);
  if (made > 20) fail_msg("megad made %lld write calls in 0.5 s with its log at the limit", made);
  mega_err err = {0};
  Mega__V1__ListNodesResponse *r = hd_list_nodes(&d, &err);
  assert_non_null(r); /* still serving */
  protobuf_c_message_free_unpacked(&r->base, NULL);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_journal_catches_up_when_there_is_room, teardown),
      cmocka_unit_test_teardown(test_stop_writes_what_the_journal_missed, teardown),
      cmocka_unit_test_teardown(test_log_at_the_limit_does_not_spin, teardown),
      cmocka_unit_test_teardown(test_refused_job_needs_no_rewrite, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
