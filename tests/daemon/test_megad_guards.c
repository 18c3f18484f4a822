/* What megad guards, end to end: a job waiting for a node survives the
 * node's return, a state dir belongs to one megad, a damaged journal keeps
 * its jobs, and files are checked before any rank starts. Each case runs as
 * a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

/* A tiny 5-iteration job on two nodes of one rank each, submitted to d. */
static void submit_two_nodes(hd *d, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 5, NULL);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  mega_err err = {0};
  assert_int_equal(hd_submit(d, &spec, id, len, &err), MEGA_OK);
}

/* ---- a job waiting for a node runs when the node is back (it failed with
 * "connection refused" once) ---- */

static void test_waiting_job_runs_when_node_returns(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "r1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "r2", 1, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  hd_kill(&n2);
  char id[64];
  mega_err err = {0};
  submit_two_nodes(&n1, id, sizeof id);
  /* r2 is lost (1.5 s of heartbeats, longer on a loaded machine); the job
   * waits (a launch r2 refused requeues it) */
  bool dead = false;
  for (int i = 0; i < 300 && !dead; i++) {
    usleep(100000);
    Mega__V1__ListNodesResponse *ln = hd_list_nodes(&n1, NULL);
    for (size_t k = 0; ln && k < ln->n_nodes; k++)
      dead |= !strcmp(ln->nodes[k]->id, "r2") &&
              ln->nodes[k]->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD;
    if (ln) protobuf_c_message_free_unpacked(&ln->base, NULL);
  }
  assert_true(dead);
  usleep(300000); /* a launch or two refused meanwhile */
  Mega__V1__Job *j = hd_get_job(&n1, id, &err);
  assert_non_null(j);
  assert_true(j->state == STATE(PENDING) || j->state == STATE(RESTARTING));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_true(hd_restart(&n2, NULL));
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  assert_true(hd_succeeded(&n1, &w));
  assert_int_equal(w.final->restarts, 0); /* a refused launch requeues; it is no failure */
  hd_watch_free(&w);
  /* r2 came back as a new incarnation: a node up (once raised only for a
   * node never seen before), not a second loss of a node already lost */
  if (!hd_log_has(&n1, "node r2") || !hd_log_has(&n1, "is alive again (was dead)"))
    hd_dump_log(&n1);
  assert_true(hd_log_has(&n1, "is alive again (was dead)"));
  assert_false(hd_log_has(&n1, "node r2 restarted"));
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* ---- a node that heartbeats but cannot be reached: launches back off ---- */

/* r2 advertises 127.0.0.2 but listens on 127.0.0.1: its heartbeats reach
 * r1, r1's calls never reach it. Each attempt's launch there is refused;
 * the coordinator used to place the job again at once, five attempts a
 * second, workers spawned and killed each time, for ever. */
static void test_refused_launches_back_off(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "b1", 1, NULL, NULL, NULL));
  const char *away[] = {"--advertise", "127.0.0.2", NULL};
  assert_true(hd_start(&n2, "b2", 1, n1.addr, NULL, away));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char id[64];
  mega_err err = {0};
  submit_two_nodes(&n1, id, sizeof id);
  bool refused = false;
  for (int i = 0; i < 200 && !refused; i++) {
    usleep(50000);
    refused = hd_event_ms(&n1, id, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING, 0,
                          "cannot start ranks 1..1 on node b2") > 0;
  }
  assert_true(refused);
  sleep(6);
  Mega__V1__Job *j = hd_get_job(&n1, id, &err);
  assert_non_null(j);
  uint32_t attempts = j->attempt;
  assert_false(j->state == STATE(SUCCEEDED) || j->state == STATE(FAILED));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* 0, 0.5, 1, 2, 4 s: six attempts in 6 s at most (about 30 without) */
  fprintf(stderr, "%u attempts in 6 s\n", attempts + 1);
  assert_true(attempts >= 1);
  assert_true(attempts <= 6);
  assert_true(hd_event_ms(&n1, id, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING, 0,
                          "launch refused 2 times in a row: next try in 0.5 s") > 0);
  assert_int_equal(hd_cancel(&n1, id, "test", &err), MEGA_OK);
  assert_true(hd_node_workers_gone(&n1, 5000));
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* ---- two megads on one state dir: the second is refused ---- */

static void test_state_dir_is_locked(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "l1", 1, NULL, NULL, NULL));
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' serve --listen 127.0.0.1:0 --state-dir '%s' --slots 1 2>&1",
           getenv("MEGAD"), d.dir);
  FILE *p = popen(cmd, "r");
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_not_equal(WEXITSTATUS(st), 0);
  char want[64];
  snprintf(want, sizeof want, "in use by another megad (pid %d)", (int)d.pid);
  if (!strstr(out, want)) fprintf(stderr, "got: %s\n", out);
  assert_non_null(strstr(out, want));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* ---- a damaged journal keeps every job it can ---- */

static void test_damaged_journal_keeps_jobs(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "j1", 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 1, NULL);
  char ids[6][64];
  mega_err err = {0};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(hd_submit(&d, &spec, ids[i], sizeof ids[i], &err), MEGA_OK);
    hd_watch w;
    hd_watch_job(&d, ids[i], false, 60000, &w);
    hd_watch_free(&w);
  }
  assert_int_equal(hd_stop(&d), 0);
  /* one flipped byte in the middle of the journal */
  char path[256];
  snprintf(path, sizeof path, "%s/journal", d.dir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  int fd = open(path, O_RDWR);
  off_t at = st.st_size / 2;
  char c;
  assert_int_equal(pread(fd, &c, 1, at), 1);
  c ^= 0x5a;
  assert_int_equal(pwrite(fd, &c, 1, at), 1);
  close(fd);
  assert_true(hd_restart(&d, NULL));
  for (int i = 0; i < 6; i++) {
    Mega__V1__Job *j = hd_get_job(&d, ids[i], &err);
    assert_non_null(j); /* each job has several records: none is lost */
    protobuf_c_message_free_unpacked(&j->base, NULL);
  }
  FILE *f = fopen(d.log, "r");
  char log[65536];
  size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
  log[n] = '\0';
  if (f) fclose(f);
  assert_non_null(strstr(log, "JOURNAL DAMAGED"));
  assert_non_null(strstr(log, ".damaged-"));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* Zeros over whole records (a zeroed block) are damage too: they once read
 * as empty records, and the jobs they held were gone with only "N jobs
 * replayed" in the log. Every job is either back or named as lost, and the
 * file as found is kept. */
static void test_zeroed_journal_is_reported(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "z1", 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 1, NULL);
  enum { N = 6 };
  char ids[N][64];
  mega_err err = {0};
  for (int i = 0; i < N; i++) {
    assert_int_equal(hd_submit(&d, &spec, ids[i], sizeof ids[i], &err), MEGA_OK);
    hd_watch w;
    hd_watch_job(&d, ids[i], false, 60000, &w);
    hd_watch_free(&w);
  }
  assert_int_equal(hd_stop(&d), 0);
  /* 1 KiB of zeros from the record boundary nearest the middle */
  char path[256];
  snprintf(path, sizeof path, "%s/journal", d.dir);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  int fd = open(path, O_RDWR);
  off_t at = 0;
  for (;;) {
    uint8_t head[4];
    assert_int_equal(pread(fd, head, 4, at), 4);
    uint32_t len = head[0] | head[1] << 8 | head[2] << 16 | (uint32_t)head[3] << 24;
    off_t next = at + 8 + (off_t)len;
    if (next >= st.st_size / 2) break;
    at = next;
  }
  assert_true(at + 1024 < st.st_size);
  char zeros[1024] = {0};
  assert_int_equal(pwrite(fd, zeros, sizeof zeros, at), (ssize_t)sizeof zeros);
  close(fd);
  assert_true(hd_restart(&d, NULL));
  FILE *f = fopen(d.log, "r");
  static char log[1 << 16];
  size_t n = f ? fread(log, 1, sizeof log - 1, f) : 0;
  log[n] = '\0';
  if (f) fclose(f);
  const char *said = strstr(log, "JOURNAL DAMAGED");
  if (!said) hd_dump_log(&d);
  assert_non_null(said);
  assert_non_null(strstr(said, "1 damaged region ("));
  char where[64];
  snprintf(where, sizeof where, "the first at byte %lld", (long long)at);
  assert_non_null(strstr(said, where));
  /* the copy, as found */
  char copy[400];
  snprintf(copy, sizeof copy, "%s/journal.damaged-", d.dir);
  const char *named = strstr(said, copy);
  assert_non_null(named);
  assert_int_equal(sscanf(named, "%399[^ ;,)]", copy), 1);
  struct stat cst;
  size_t cl = strlen(copy);
  if (cl && copy[cl - 1] == '.') copy[cl - 1] = '\0'; /* the sentence's end */
  assert_int_equal(stat(copy, &cst), 0);
  assert_int_equal(cst.st_size, st.st_size);
  int lost = 0;
  for (int i = 0; i < N; i++) {
    Mega__V1__Job *j = hd_get_job(&d, ids[i], NULL);
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    else lost++;
    /* not back: the log names it */
    if (!j && !strstr(said, ids[i]))
      fail_msg("job %s is gone and the log does not say so", ids[i]);
  }
  fprintf(stderr, "%.*s\n", (int)strcspn(said, "\n"), said);
  fprintf(stderr, "zeroed 1 KiB at byte %lld of %lld: %d of %d jobs lost and named\n",
          (long long)at, (long long)st.st_size, lost, N);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* ---- what only a node can check fails before any rank starts, naming
 * the node; what the coordinator can check fails at submit ---- */

static void test_files_checked_before_ranks_start(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "f1", 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  char dir[160];
  snprintf(dir, sizeof dir, "%s/sub", n1.dir);
  mkdir(dir, 0755);
  mega_err err = {0};
  char id[64];
  /* at submit: a missing data file, a directory, --save naming a file */
  const char *missing[] = {"--data-path", "/nonexistent/corpus.txt", NULL};
  hd_tiny_spec(&spec, n1.dir, 2, missing);
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--data-path /nonexistent/corpus.txt"));
  const char *is_dir[] = {"--data-path", dir, NULL};
  hd_tiny_spec(&spec, n1.dir, 2, is_dir);
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "is not a file"));
  char file[200];
  snprintf(file, sizeof file, "%s/tiny.txt", n1.dir);
  const char *save_file[] = {"--save", file, NULL};
  hd_tiny_spec(&spec, n1.dir, 2, save_file);
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--save"));
  assert_non_null(strstr(err.msg, "is a file"));
  /* --save where no directory can be made: under a file, or in /proc
   * (root may "write" there, so megad tries) */
  char under_file[240];
  snprintf(under_file, sizeof under_file, "%s/ck", file);
  const char *save_under[] = {"--save", under_file, NULL};
  hd_tiny_spec(&spec, n1.dir, 2, save_under);
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "under a file: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "which is a file"));
  const char *save_proc[] = {"--save", "/proc/nope/ck", NULL};
  hd_tiny_spec(&spec, n1.dir, 2, save_proc);
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "in /proc: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "cannot create directories in /proc"));

  /* at placement: the data file went away while the job waited */
  char data[200];
  snprintf(data, sizeof data, "%s/only-here.txt", n1.dir);
  FILE *f = fopen(file, "r"), *g = fopen(data, "w");
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, k, g);
  fclose(f);
  fclose(g);
  const char *later[] = {"--data-path", data, NULL};
  hd_tiny_spec(&spec, n1.dir, 2, later);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  unlink(data);
  assert_true(hd_start(&n2, "f2", 1, n1.addr, NULL, NULL));
  hd_watch w;
  hd_watch_job(&n1, id, true, 30000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(FAILED));
  fprintf(stderr, "refused at placement: %s\n", w.final->error);
  assert_non_null(strstr(w.final->error, "cannot read --data-path"));
  assert_non_null(strstr(w.final->error, "node f"));
  assert_null(strstr(w.events_text, "started"));
  hd_watch_free(&w);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* ---- a --save that went bad while the job waited fails the job at its
 * start, once: a restart would meet it again, so none is spent ---- */

static void test_bad_save_is_not_retried(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "b1", 1, NULL, NULL, NULL));
  char parent[200], save[220];
  snprintf(parent, sizeof parent, "%s/runs", n1.dir);
  snprintf(save, sizeof save, "%s/ck", parent);
  const char *extra[] = {"--save", save, NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n1.dir, 5, extra);
  spec.nnodes_min = spec.nnodes_max = 2; /* waits for n2 */
  spec.nproc_per_node = 1;
  spec.max_restarts = 3;
  mega_err err = {0};
  char id[64];
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  FILE *f = fopen(parent, "w"); /* now --save lies under a file */
  assert_non_null(f);
  fclose(f);
  assert_true(hd_start(&n2, "b2", 1, n1.addr, NULL, NULL));
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  assert_non_null(w.final);
  if (w.final->state != STATE(FAILED) || w.final->restarts)
    fprintf(stderr, "events:\n%s", w.events_text);
  assert_int_equal(w.final->state, STATE(FAILED));
  fprintf(stderr, "bad --save at the start: %s\n", w.final->error);
  assert_non_null(strstr(w.final->error, "cannot create"));
  assert_int_equal(w.final->restarts, 0);
  assert_int_equal(w.final->attempt, 0);
  hd_watch_free(&w);

  /* its --save, free now that it ended, goes to a new job; resuming the
   * failed one while that job has not ended is refused, naming it */
  assert_int_equal(unlink(parent), 0);
  hd_cleanup(&n2);
  hd_tiny_spec(&spec, n1.dir, 5, extra);
  spec.nnodes_min = spec.nnodes_max = 2; /* n2 is gone: it never runs */
  spec.nproc_per_node = 1;
  char id2[64];
  if (hd_submit(&n1, &spec, id2, sizeof id2, &err) != MEGA_OK) fail_msg("%s", err.msg);
  Mega__V1__ResumeJobRequest req = MEGA__V1__RESUME_JOB_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(mega_rpc_unary(n1.ch, &mega_control_resume_job, &req.base, 10000, &resp, &err),
                   MEGA_ERR_INVALID);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  fprintf(stderr, "resume on a taken --save: %s\n", err.msg);
  assert_non_null(strstr(err.msg, id2));
  hd_cleanup(&n1);
}

/* ---- two jobs that have not ended may not share a --save; an ended
 * job's is free again ---- */

static void test_one_live_job_per_save(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "s1", 1, NULL, NULL, NULL));
  char save[200], other[240];
  snprintf(save, sizeof save, "%s/ck", d.dir);
  /* the same directory spelled another way, not made yet */
  snprintf(other, sizeof other, "%s/./ck/", d.dir);
  const char *a_flags[] = {"--save", save, NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 5, a_flags);
  spec.nnodes_min = 2; /* waits for a second node: nothing runs */
  mega_err err = {0};
  char a[64], b[64];
  assert_int_equal(hd_submit(&d, &spec, a, sizeof a, &err), MEGA_OK);
  const char *b_flags[] = {"--save", other, NULL};
  hd_tiny_spec(&spec, d.dir, 5, b_flags);
  spec.nnodes_min = 2;
  assert_int_equal(hd_submit(&d, &spec, b, sizeof b, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "shared --save: %s\n", err.msg);
  assert_non_null(strstr(err.msg, a));
  assert_non_null(strstr(err.msg, "has not ended"));
  /* a --save of its own is fine */
  char mine[220];
  snprintf(mine, sizeof mine, "%s/ck2", d.dir);
  const char *c_flags[] = {"--save", mine, NULL};
  hd_tiny_spec(&spec, d.dir, 5, c_flags);
  spec.nnodes_min = 2;
  assert_int_equal(hd_submit(&d, &spec, b, sizeof b, &err), MEGA_OK);
  /* a ended, its --save is free for the job that goes on from it */
  assert_int_equal(hd_cancel(&d, a, "test", &err), MEGA_OK);
  hd_tiny_spec(&spec, d.dir, 5, b_flags);
  spec.nnodes_min = 2;
  assert_int_equal(hd_submit(&d, &spec, b, sizeof b, &err), MEGA_OK);
  hd_cleanup(&d);
}

/* ---- SIGUSR1, SIGUSR2 (a scheduler's warning, a stray kill), SIGHUP (a closed
 * terminal) and SIGXFSZ (a file at ulimit -f) are logged and change nothing;
 * their default action ended megad silently ---- */

static void test_user_signals_are_logged(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "u1", 1, NULL, NULL, NULL));
  /* SIGHUP too: a closed terminal or a reload out of habit must not end
   * megad (and its jobs) without a word */
  static const int sigs[] = {SIGUSR2, SIGUSR1, SIGHUP, SIGXFSZ};
  static const char *const names[] = {"got SIGUSR2", "got SIGUSR1",
                                      "got SIGHUP; megad does nothing on it",
                                      "got SIGXFSZ: a file reached this process's size limit"};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(kill(d.pid, sigs[i]), 0);
    assert_true(hd_wait_log(&d, names[i], 5000));
    assert_true(hd_pid_alive(d.pid));
  }
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
      cmocka_unit_test_teardown(test_waiting_job_runs_when_node_returns, teardown),
      cmocka_unit_test_teardown(test_refused_launches_back_off, teardown),
      cmocka_unit_test_teardown(test_state_dir_is_locked, teardown),
      cmocka_unit_test_teardown(test_damaged_journal_keeps_jobs, teardown),
      cmocka_unit_test_teardown(test_zeroed_journal_is_reported, teardown),
      cmocka_unit_test_teardown(test_files_checked_before_ranks_start, teardown),
      cmocka_unit_test_teardown(test_bad_save_is_not_retried, teardown),
      cmocka_unit_test_teardown(test_one_live_job_per_save, teardown),
      cmocka_unit_test_teardown(test_user_signals_are_logged, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
