/* Stopping early as asked, end to end: Megatron's --exit-interval and
 * --exit-signal-handler under `megad run` (exit 92, a committed checkpoint
 * where it stopped, and a resumed run whose losses are the uninterrupted
 * run's), and under `megad serve` on two nodes, where SIGTERM to every
 * megad (a scheduler's warning before a time limit) leaves the job STOPPED,
 * resumable, in the coordinator's journal. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/exitcode.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define MAXIT 10096

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

typedef struct run_out {
  double loss[MAXIT + 1]; /* by iteration; NAN where none was printed */
  int last;               /* the last iteration printed */
  int status;             /* exit status; -1 if killed */
  char err[8192];         /* what it said on stderr */
} run_out;

/* megad run --slots 2 --json with the tiny PP-2 job on dir's data, iters
 * iterations and extra flags. With term_after > 0, SIGTERM goes to megad
 * once that many iterations were printed. */
static void run_megad(const char *dir, int iters, const char *const *extra, int term_after,
                      run_out *o) {
  Mega__V1__JobSpec spec;
  const char *all[32];
  int k = 0;
  all[k++] = "--pipeline-model-parallel-size";
  all[k++] = "2";
  for (int i = 0; extra && extra[i]; i++) all[k++] = extra[i];
  all[k] = NULL;
  hd_tiny_spec(&spec, dir, iters, all);
  const char *argv[80];
  int n = 0;
  argv[n++] = getenv("MEGAD");
  argv[n++] = "run";
  argv[n++] = "--slots";
  argv[n++] = "2";
  argv[n++] = "--json";
  argv[n++] = "--worker";
  argv[n++] = getenv("MEGAW");
  for (size_t i = 0; i < spec.n_args; i++) argv[n++] = spec.args[i];
  argv[n] = NULL;
  int out[2];
  assert_int_equal(pipe(out), 0);
  char err_path[192];
  snprintf(err_path, sizeof err_path, "%s/megad-run.err", dir);
  pid_t pid = fork();
  if (pid == 0) {
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (e >= 0) dup2(e, 2);
    dup2(out[1], 1);
    close(out[0]);
    execv(argv[0], (char **)argv);
    _exit(127);
  }
  close(out[1]);
  FILE *f = fdopen(out[0], "r");
  for (int i = 0; i <= MAXIT; i++) o->loss[i] = -1;
  o->last = 0;
  char line[16384];
  int printed = 0;
  while (fgets(line, sizeof line, f)) {
    int it = 0;
    double loss = 0;
    const char *p = strstr(line, "\"loss\":");
    /* under --simulate-compute a step's loss is null: the step still counts */
    if (sscanf(line, "{\"iteration\":%d", &it) == 1 && p && it > 0 && it <= MAXIT) {
      if (sscanf(p, "\"loss\":%lf", &loss) == 1) o->loss[it] = loss;
      o->last = it;
      if (++printed == term_after) kill(pid, SIGTERM);
    }
  }
  fclose(f);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  o->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o->err[0] = '\0';
  FILE *e = fopen(err_path, "r");
  if (e) {
    o->err[fread(o->err, 1, sizeof o->err - 1, e)] = '\0';
    fclose(e);
  }
}

static int latest_checkpoint(const char *save) {
  char path[256];
  snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", save);
  FILE *f = fopen(path, "r");
  int it = -1;
  if (f) {
    if (fscanf(f, "%d", &it) != 1) it = -1;
    fclose(f);
  }
  return it;
}

/* --exit-interval 5 of 12 iterations: stops at 5 and at 10 (exit 92, the
 * checkpoint committed there), the third run finishes; every loss is the
 * uninterrupted run's, to the last bit. */
static void test_exit_interval_resumes_exactly(void **state) {
  (void)state;
  char dir[128], save[192];
  hd_tmpdir(dir, sizeof dir);
  snprintf(save, sizeof save, "%s/ck", dir);
  static run_out whole, part;
  run_megad(dir, 12, NULL, 0, &whole);
  assert_int_equal(whole.status, 0);
  assert_int_equal(whole.last, 12);
  const char *extra[] = {"--save", save, "--load", save, "--exit-interval", "5", NULL};
  int first = 1;
  static const int stops[] = {5, 10, 12};
  for (int r = 0; r < 3; r++) {
    run_megad(dir, 12, extra, 0, &part);
    assert_int_equal(part.status, r < 2 ? MEGA_EXIT_REQUEUE : 0);
    if (r < 2) { /* megad run ends with its job: no megactl resume can reach it */
      fprintf(stderr, "%s", part.err);
      assert_non_null(strstr(part.err, "committed: a run with --load"));
      assert_null(strstr(part.err, "megactl resume"));
    }
    assert_int_equal(part.last, stops[r]);
    assert_int_equal(latest_checkpoint(save), stops[r]);
    for (int it = first; it <= part.last; it++) assert_true(part.loss[it] == whole.loss[it]);
    first = part.last + 1;
  }
  hd_rmdir(dir);
}

/* --exit-signal-handler: SIGTERM to megad run saves the iteration it
 * stopped at and exits 92; a run with --load goes on from there. The tiny
 * job trains an iteration in a millisecond or less: with 100, a loaded
 * machine once read the third line only after the run had trained to its
 * end (exit 0, a checkpoint of iteration 100); 400 leave it the time. */
#define SIGTERM_ITERS 400

static void test_sigterm_saves_and_stops(void **state) {
  (void)state;
  char dir[128], save[192];
  hd_tmpdir(dir, sizeof dir);
  snprintf(save, sizeof save, "%s/ck", dir);
  static run_out whole, part;
  run_megad(dir, SIGTERM_ITERS, NULL, 0, &whole);
  assert_int_equal(whole.status, 0);
  const char *extra[] = {"--save", save, "--load", save, "--exit-signal-handler", NULL};
  run_megad(dir, SIGTERM_ITERS, extra, 3, &part);
  if (part.status != MEGA_EXIT_REQUEUE)
    fprintf(stderr, "the run went on to iteration %d of %d after SIGTERM at the third\n",
            part.last, SIGTERM_ITERS);
  assert_int_equal(part.status, MEGA_EXIT_REQUEUE);
  assert_true(part.last >= 3 && part.last < SIGTERM_ITERS);
  int stopped = part.last;
  assert_int_equal(latest_checkpoint(save), stopped);
  for (int it = 1; it <= stopped; it++) assert_true(part.loss[it] == whole.loss[it]);
  run_megad(dir, SIGTERM_ITERS, extra, 0, &part);
  assert_int_equal(part.status, 0);
  assert_int_equal(part.last, SIGTERM_ITERS);
  assert_true(part.loss[stopped] < 0); /* it went on from the checkpoint, not the start */
  for (int it = stopped + 1; it <= SIGTERM_ITERS; it++)
    assert_true(part.loss[it] == whole.loss[it]);
  hd_rmdir(dir);
}

/* --exit-duration-in-mins 1 (suite long: it takes a minute): the job stops
 * at the first boundary after a minute, STOPPED (exit 92), without --save
 * nothing to resume from. */
static void test_exit_duration(void **state) {
  (void)state;
  char dir[128];
  hd_tmpdir(dir, sizeof dir);
  static run_out part;
  const char *extra[] = {"--exit-duration-in-mins", "1", "--simulate-compute", "20:40", NULL};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  run_megad(dir, 1000000, extra, 0, &part);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  assert_int_equal(part.status, MEGA_EXIT_REQUEUE);
  assert_true(s >= 60 && s < 120);
  assert_true(part.last > 100 && part.last < 1000000);
  hd_rmdir(dir);
}

/* Two megads serve a job on both nodes; both get SIGTERM, as srun passes
 * Slurm's warning on: they exit 0 once the job saved, and the coordinator's
 * journal says STOPPED, with why and where it goes on from. */
static void test_serve_sigterm_leaves_job_stopped(void **state) {
  (void)state;
  hd a, b;
  assert_true(hd_start(&a, "x1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&b, "x2", 1, a.addr, NULL, NULL));
  char save[192];
  snprintf(save, sizeof save, "%s/ck", a.dir);
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--save", save,
                         "--exit-signal-handler", NULL};
  hd_tiny_spec(&spec, a.dir, 100000, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  /* b may not be in a's view yet: submit until both nodes are there */
  for (int i = 0; i < 100 && hd_submit(&a, &spec, id, sizeof id, &err) != MEGA_OK; i++)
    usleep(100000);
  if (err.status != MEGA_OK) fail_msg("submit: %s", err.msg);
  Mega__V1__Job *j = NULL;
  for (int i = 0; i < 300; i++) {
    j = hd_get_job(&a, id, &err);
    if (j && j->last_iteration >= 3) break;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    j = NULL;
    usleep(100000);
  }
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  kill(b.pid, SIGTERM);
  assert_int_equal(hd_stop(&a), 0);
  assert_int_equal(hd_stop(&b), 0);
  assert_true(hd_log_has(&a, "save a checkpoint and stop first"));
  assert_true(hd_restart(&a, NULL));
  j = hd_get_job(&a, id, &err);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(STOPPED));
  assert_true(j->checkpoint_iteration > 0);
  assert_int_equal(j->checkpoint_iteration, j->last_iteration);
  assert_non_null(strstr(j->error, "got SIGTERM"));
  assert_non_null(strstr(j->error, "is committed"));
  assert_int_equal(latest_checkpoint(save), (int)j->checkpoint_iteration);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup(&a);
  hd_cleanup(&b);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_exit_interval_resumes_exactly, teardown),
      cmocka_unit_test_teardown(test_sigterm_saves_and_stops, teardown),
      cmocka_unit_test_teardown(test_serve_sigterm_leaves_job_stopped, teardown),
      cmocka_unit_test_teardown(test_exit_duration, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
