/* A megad's long life: what it keeps on disk (the journal, job
 * directories) and in memory (a job's replay) stays bounded however many
 * jobs it has seen. Each case
 * drives real megads through many cheap jobs and counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "harness.h"

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

/* Records in a journal file (u32 length | u32 crc | payload each), or -1. */
static long journal_records(const char *dir) {
  char path[256];
  snprintf(path, sizeof path, "%s/journal", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  long n = 0;
  unsigned char h[8];
  while (fread(h, 1, 8, f) == 8) {
    uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                   (uint32_t)h[3] << 24;
    if (fseek(f, (long)len, SEEK_CUR)) break;
    n++;
  }
  fclose(f);
  return n;
}

/* A job that waits for a second node: it stays pending on one. */
static void submit_waiting(hd *d, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 2, NULL);
  spec.nnodes_min = 2;
  mega_err err = {0};
  if (hd_submit(d, &spec, id, len, &err) != MEGA_OK) fail_msg("SubmitJob: %s", err.msg);
}

#define JOBS 150

/* The journal was compacted only when megad started: one that ran for
 * weeks appended every record of every job (each job's records, then its
 * ForgetRecord) to a file retention never shrank, and read it all back on
 * its next start. Now it stays within a few times what its table holds. */
static void test_journal_stays_bounded(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "s1", 1, NULL, NULL, (const char *const[]){"--retain-jobs", "2", NULL}));
  char waiting[64], id[64], last[64] = "";
  submit_waiting(&d, waiting, sizeof waiting); /* pending throughout */
  for (int i = 0; i < JOBS; i++) {
    submit_waiting(&d, id, sizeof id);
    mega_err err = {0};
    if (hd_cancel(&d, id, NULL, &err) != MEGA_OK) fail_msg("CancelJob %s: %s", id, err.msg);
    snprintf(last, sizeof last, "%s", id);
  }
  assert_int_equal(hd_stop(&d), 0);
  long recs = journal_records(d.dir);
  /* a job costs about six records; three jobs are kept */
  if (recs < 0 || recs >= JOBS) {
    print_message("the journal holds %ld records after %d jobs\n", recs, JOBS + 1);
    hd_dump_log(&d);
  }
  assert_true(recs > 0 && recs < JOBS);
  /* what the rewrites kept is the table: the waiting job, the newest
   * ended one, and the next id */
  assert_true(hd_restart(&d, NULL));
  Mega__V1__Job *j = hd_get_job(&d, waiting, &(mega_err){0});
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_PENDING);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  j = hd_get_job(&d, last, &(mega_err){0});
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  submit_waiting(&d, id, sizeof id);
  char want[64];
  snprintf(want, sizeof want, "j-%d-s1", JOBS + 2);
  assert_string_equal(id, want);
  assert_false(hd_log_has(&d, "JOURNAL DAMAGED"));
  hd_cleanup(&d);
}

/* Entries in d's STATE/jobs; whether it holds id's directory. */
static int job_dirs(const hd *d, const char *id, bool *has) {
  char path[256];
  snprintf(path, sizeof path, "%s/jobs", d->dir);
  DIR *dir = opendir(path);
  int n = 0;
  *has = false;
  for (struct dirent *e; dir && (e = readdir(dir));) {
    if (e->d_name[0] == '.') continue;
    n++;
    *has = *has || !strcmp(e->d_name, id);
  }
  if (dir) closedir(dir);
  return n;
}

/* job_dirs once d's retention has brought them down to want (its
 * removal follows the job's end on its own event loop), or after 5 s. */
static int job_dirs_settled(const hd *d, const char *id, int want, bool *has) {
  int n = job_dirs(d, id, has);
  for (int i = 0; i < 250 && n > want; i++) {
    usleep(20 * 1000);
    n = job_dirs(d, id, has);
  }
  if (n > want) hd_dump_log(d);
  return n;
}

#define TWO_NODE_JOBS 5

/* A node kept the directory (its ranks' logs) of every job another node
 * coordinated that ran ranks on it: the coordinator's retention removed
 * only its own, so a worker node's disk filled with one per job for ever
 * (101 after 360 jobs, 50 retained, in a soak with etcd). Now the same
 * --retain-jobs holds for them, counted from their last launch's end. */
static void test_others_job_dirs_are_retained(void **state) {
  (void)state;
  const char *const extra[] = {"--retain-jobs", "2", NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "r1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n2, "r2", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char id[64] = "";
  for (int i = 0; i < TWO_NODE_JOBS; i++) {
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, n1.dir, 1, NULL);
    spec.nnodes_min = spec.nnodes_max = 2; /* a rank on each node */
    spec.nproc_per_node = 1;
    mega_err err = {0};
    assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
    hd_watch w;
    hd_watch_job(&n1, id, true, 60000, &w);
    assert_true(hd_succeeded(&n1, &w));
    hd_watch_free(&w);
  }
  /* the last launch's end on r2 starts its retention; the newest stay */
  bool has = false;
  int n = job_dirs_settled(&n2, id, 2, &has);
  assert_int_equal(n, 2);
  assert_true(has);
  /* the coordinator's own removal also runs after the watch saw the end */
  n = job_dirs_settled(&n1, id, 2, &has);
  assert_int_equal(n, 2);
  assert_true(has);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* A worker of d other than not_pid (0: any), waited for up to 20 s; 0 if none. */
static pid_t new_worker(const hd *d, pid_t not_pid) {
  for (int i = 0; i < 2000; i++) {
    pid_t pids[4];
    int n = hd_workers(d, pids, 4);
    for (int k = 0; k < n; k++)
      if (pids[k] != not_pid) return pids[k];
    usleep(10 * 1000);
  }
  return 0;
}

#define KILLS 20
#define ATTEMPT_DIRS_KEPT 16 /* MEGAD_ATTEMPT_DIRS_KEPT */

/* Every attempt left its directory (its ranks' logs) on each node for as
 * long as the job was kept: 300 kills of one job's worker left 300 (900
 * files), and restarts for a lost node or megad's own restart are not
 * counted against --max-restarts, so nothing bounded them. Now a node
 * keeps the newest 16. */
static void test_attempt_dirs_are_bounded(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "a1", 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--simulate-compute", "1:1", NULL};
  hd_tiny_spec(&spec, d.dir, 100000, extra);
  spec.max_restarts = 100;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t w = 0;
  for (int i = 0; i <= KILLS; i++) { /* attempt i's worker; the last one lives */
    w = new_worker(&d, w);
    if (!w) hd_dump_log(&d);
    assert_true(w > 0);
    if (i < KILLS) kill(w, SIGKILL);
  }
  /* attempt KILLS started: its launch pruned the ones before */
  char path[256];
  snprintf(path, sizeof path, "%s/jobs/%s", d.dir, id);
  DIR *dir = opendir(path);
  assert_non_null(dir);
  int n = 0, lowest = KILLS + 1;
  for (struct dirent *e; (e = readdir(dir));) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    n++;
    if (atoi(e->d_name) < lowest) lowest = atoi(e->d_name);
  }
  closedir(dir);
  if (n != ATTEMPT_DIRS_KEPT) hd_dump_log(&d);
  assert_int_equal(n, ATTEMPT_DIRS_KEPT);
  assert_int_equal(lowest, KILLS + 1 - ATTEMPT_DIRS_KEPT);
  assert_int_equal(hd_cancel(&d, id, NULL, &err), MEGA_OK);
  hd_cleanup(&d);
}

#define RANKED 64 /* MEGA_JOB_HISTORY_RANKS */
#define REPLAY_ITERS (RANKED + 36)

typedef struct replay_count {
  int steps, ranked, first_ranked, world_wrong;
} replay_count;

static void count_ranks(void *arg, const Mega__V1__WatchJobResponse *it) {
  replay_count *c = arg;
  if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) return;
  c->steps++;
  c->world_wrong += it->step->world_size != 2;
  if (it->step->n_ranks && !c->ranked++) c->first_ranked = (int)it->step->iteration;
}

/* The lines of out holding needle. */
static int lines_with(const char *out, const char *needle) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* A job's replay held every rank's figures for each of its last 1,024
 * steps, for as long as megad kept the job (~190 bytes per rank per step:
 * 200 MB for a 1,024-rank job). Now only the newest steps keep theirs; a
 * replay of an ended job still shows every step, the old ones with their
 * job-level figures and world size. */
static void test_replay_keeps_newest_ranks(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "h1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, REPLAY_ITERS, NULL);
  spec.nproc_per_node = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, id, false, 60000, &w);
  assert_true(hd_succeeded(&d, &w));
  hd_watch_free(&w);

  replay_count c = {0};
  hd_watch_job_cb(&d, id, true, 10000, &w, count_ranks, &c);
  assert_int_equal(w.end, MEGA_OK);
  assert_non_null(w.final);
  assert_int_equal(c.steps, REPLAY_ITERS);
  assert_int_equal(c.ranked, RANKED);
  assert_int_equal(c.first_ranked, REPLAY_ITERS - RANKED + 1);
  assert_int_equal(c.world_wrong, 0);
  assert_int_equal(w.ranks, 2);
  hd_watch_free(&w);

  /* megactl watch of the ended job: a line per step either way */
  static char out[256 * 1024];
  char args[256];
  snprintf(args, sizeof args, "--server %s watch %s --json", d.addr, id);
  assert_int_equal(hd_megactl(out, sizeof out, args), 0);
  assert_int_equal(lines_with(out, "\"iteration\":"), REPLAY_ITERS);
  assert_int_equal(lines_with(out, "\"world_size\":2,"), REPLAY_ITERS);
  assert_int_equal(lines_with(out, "\"ranks\":[]"), REPLAY_ITERS - RANKED);
  assert_non_null(strstr(out, "\"iteration\":1,"));
  snprintf(args, sizeof args, "--server %s watch %s --plain", d.addr, id);
  assert_int_equal(hd_megactl(out, sizeof out, args), 0);
  char first[64], last[64];
  snprintf(first, sizeof first, "iter 1/%d loss ", REPLAY_ITERS);
  snprintf(last, sizeof last, "iter %d/%d loss ", REPLAY_ITERS, REPLAY_ITERS);
  assert_non_null(strstr(out, first));
  assert_non_null(strstr(strstr(out, last), " bubble "));
  assert_int_equal(lines_with(out, " bubble "), RANKED);
  hd_cleanup(&d);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_journal_stays_bounded, teardown),
      cmocka_unit_test_teardown(test_others_job_dirs_are_retained, teardown),
      cmocka_unit_test_teardown(test_attempt_dirs_are_bounded, teardown),
      cmocka_unit_test_teardown(test_replay_keeps_newest_ranks, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
