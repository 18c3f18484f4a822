/* The evaluation after training, at the rank (worker/rank/rank_eval.c):
 * the last iteration's report goes out whatever the evaluation does, a
 * failed evaluation says so, and an exit at the last iteration comes
 * before the evaluation, as in Megatron's pretrain, ending the run (not
 * stopping it). Ranks run as threads meeting through a FileStore. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/rank/rank.h"

#define ITERS 3

static char dir[256], data[512];

/* What one rank's launcher saw. */
typedef struct rank_arg {
  const mega_jobspec *job;
  const char *rdv;
  int rank, world;
  bool abort_at_end; /* this rank is aborted as an evaluation after iteration 3 begins */
  mega_rank *r;
  int64_t reported[ITERS + 2];
  bool final_eval[ITERS + 2];
  int nreports;
  char note[512];
  bool stopped;
  mega_status st;
  mega_err err;
} rank_arg;

static void on_step(void *arg, const mega_rank_metrics *m) {
  rank_arg *a = arg;
  if (a->nreports < ITERS + 2) {
    a->final_eval[a->nreports] = m->has_final_eval_loss;
    a->reported[a->nreports++] = m->iteration;
  }
}

/* megad's abort (a peer lost, the job cancelled) in the middle of it */
static void on_phase(void *arg, const char *phase, int64_t it) {
  rank_arg *a = arg;
  if (a->abort_at_end && !strcmp(phase, "eval") && it == ITERS)
    mega_rank_abort(a->r, "aborted by the test as the evaluation after training began");
}

static void on_note(void *arg, const char *note) {
  rank_arg *a = arg;
  snprintf(a->note, sizeof a->note, "%s", note);
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  mega_rank_env env = {.job = a->job, .rank = a->rank, .world_size = a->world,
                       .store_dir = a->world > 1 ? a->rdv : NULL, .kv_prefix = "end-eval",
                       .kv_timeout_ms = 30000, .device = -1, .on_step = on_step,
                       .on_phase = on_phase, .on_note = on_note, .arg = a};
  a->st = mega_rank_create(&env, &a->r, &a->err);
  if (a->st == MEGA_OK) a->st = mega_rank_run(a->r, &a->err);
  a->stopped = a->r && mega_rank_stopped(a->r);
  mega_rank_destroy(a->r);
  return NULL;
}

static void run_ranks(rank_arg *a, int world, const char *tag) {
  char rdv[600];
  snprintf(rdv, sizeof rdv, "%s/rdv-%s", dir, tag);
  assert_int_equal(mkdir(rdv, 0755), 0);
  pthread_t t[world];
  for (int k = 0; k < world; k++) {
    a[k].rdv = rdv;
    a[k].rank = k;
    a[k].world = world;
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &a[k]), 0);
  }
  for (int k = 0; k < world; k++) pthread_join(t[k], NULL);
}

/* the tiny GPT over the plain file, evaluated only after training (an
 * interval past the end), argv on top */
static void job_init(mega_jobspec *j, int world, int argc, const char *const *argv) {
  mega_jobspec_defaults(j);
  j->num_layers = 2;
  j->hidden_size = 16;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 8;
  j->train_iters = ITERS;
  j->lr = 1e-2;
  j->eval_interval = 100;
  j->eval_iters = 2;
  char *args[16];
  int n = 0;
  args[n++] = "--data-path";
  args[n++] = data;
  for (int i = 0; i < argc; i++) args[n++] = (char *)argv[i];
  mega_err err = {0};
  if (mega_jobspec_parse(j, n, args, &err) != MEGA_OK ||
      mega_jobspec_check_all(j, world, 4000, &err) != MEGA_OK)
    fail_msg("%s", err.msg);
}

static void assert_reported_every_iteration(const rank_arg *a) {
  if (a->nreports != ITERS)
    fail_msg("rank %d reported %d iterations of %d (%s)", a->rank, a->nreports, ITERS,
             a->err.msg);
  for (int i = 0; i < ITERS; i++) assert_int_equal(a->reported[i], i + 1);
}

/* DP 2, rank 1 aborted as the evaluation after training begins: both
 * ranks fail, and both reported iteration 3, which they had trained. */
static void test_failed_end_eval_keeps_last_report(void **state) {
  (void)state;
  mega_jobspec j;
  job_init(&j, 2, 0, NULL);
  rank_arg a[2] = {{.job = &j}, {.job = &j, .abort_at_end = true}};
  run_ranks(a, 2, "abort");
  for (int k = 0; k < 2; k++) {
    assert_int_not_equal(a[k].st, MEGA_OK);
    assert_reported_every_iteration(&a[k]);
    assert_false(a[k].final_eval[ITERS - 1]);
  }
  /* each error names what failed, after what */
  for (int k = 0; k < 2; k++)
    if (!strstr(a[k].err.msg, "the evaluation after training failed on the validation set "
                              "(iteration 3 is trained and reported): "))
      fail_msg("rank %d: %s", k, a[k].err.msg);
  mega_jobspec_free(&j);
}

/* --eval-interval 3: the evaluation of iteration 3 itself (in its step)
 * fails; the iteration is trained, so it is reported all the same. */
static void test_failed_interval_eval_keeps_last_report(void **state) {
  (void)state;
  mega_jobspec j;
  job_init(&j, 2, 2, (const char *const[]){"--eval-interval", "3"});
  rank_arg a[2] = {{.job = &j}, {.job = &j, .abort_at_end = true}};
  run_ranks(a, 2, "abort-interval");
  for (int k = 0; k < 2; k++) {
    assert_int_not_equal(a[k].st, MEGA_OK);
    assert_reported_every_iteration(&a[k]);
    if (!strstr(a[k].err.msg, "evaluation after iteration 3: "))
      fail_msg("rank %d: %s", k, a[k].err.msg);
  }
  mega_jobspec_free(&j);
}

/* The same job untouched evaluates after iteration 3, in its report. */
static void test_end_eval_in_last_report(void **state) {
  (void)state;
  mega_jobspec j;
  job_init(&j, 2, 0, NULL);
  rank_arg a[2] = {{.job = &j}, {.job = &j}};
  run_ranks(a, 2, "whole");
  for (int k = 0; k < 2; k++) {
    if (a[k].st != MEGA_OK) fail_msg("rank %d: %s", k, a[k].err.msg);
    assert_reported_every_iteration(&a[k]);
    assert_true(a[k].final_eval[ITERS - 1]);
  }
  assert_string_equal(a[1].note, ""); /* notes come from rank 0 */
  mega_jobspec_free(&j);
}

/* --exit-interval 3 of 3: Megatron's train() exits there (sys.exit)
 * before pretrain evaluates. Nothing is left to train: the run ended, and
 * rank 0 says why it did not evaluate. */
static void test_exit_at_last_iteration(void **state) {
  (void)state;
  mega_jobspec j;
  job_init(&j, 1, 2, (const char *const[]){"--exit-interval", "3"});
  rank_arg a[1] = {{.job = &j}};
  run_ranks(a, 1, "exit");
  if (a[0].st != MEGA_OK) fail_msg("%s", a[0].err.msg);
  assert_reported_every_iteration(&a[0]);
  assert_false(a[0].final_eval[ITERS - 1]);
  assert_false(a[0].stopped);
  if (!strstr(a[0].note, "no evaluation after training: --exit-interval 3"))
    fail_msg("note: '%s'", a[0].note);
  mega_jobspec_free(&j);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "endeval");
  snprintf(data, sizeof data, "%s/data.txt", dir);
  tu_write_repetitive(data, 4000);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_failed_end_eval_keeps_last_report),
      cmocka_unit_test(test_failed_interval_eval_keeps_last_report),
      cmocka_unit_test(test_end_eval_in_last_report),
      cmocka_unit_test(test_exit_at_last_iteration),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
