/* daemon/recovery: the state machine of attempts, without daemons. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/recovery.h"

static mega_job *job(uint32_t nmin, uint32_t nmax, uint32_t max_restarts, const char *save) {
  const char *args[] = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                        "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size",
                        "12", "--lr", "0.001", "--train-iters", "50", "--data-path", "/d",
                        "--save", save};
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.args = (char **)args;
  spec.n_args = save ? 20 : 18;
  spec.nnodes_min = nmin;
  spec.nnodes_max = nmax;
  spec.max_restarts = max_restarts;
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 0, &j, NULL), MEGA_OK);
  assert_true(j->spec_ok);
  return j;
}

static void ends(void **state) {
  (void)state;
  mega_job *j = job(1, 1, 0, NULL);
  assert_int_equal(mega_recovery_decide(j, MEGA_END_DONE, NULL).next, MEGA_JOB_SUCCEEDED);
  mega_recovery r = mega_recovery_decide(j, MEGA_END_CANCELLED, "cancelled: by me");
  assert_int_equal(r.next, MEGA_JOB_CANCELLED);
  assert_string_equal(r.why, "cancelled: by me");
  /* a bad job fails, whatever the budget */
  j->max_restarts = 5;
  r = mega_recovery_decide(j, MEGA_END_FATAL, "invalid job: --hidden-size");
  assert_int_equal(r.next, MEGA_JOB_FAILED);
  assert_string_equal(r.why, "invalid job: --hidden-size");
  mega_job_free(j);
}

/* Rank failures use the budget; fail fast stays the default. */
static void crashes_count(void **state) {
  (void)state;
  mega_job *j = job(1, 1, 0, NULL);
  mega_recovery r = mega_recovery_decide(j, MEGA_END_CRASH, "rank 1 exited with signal 9");
  assert_int_equal(r.next, MEGA_JOB_FAILED);
  assert_string_equal(r.why, "rank 1 exited with signal 9");
  j->max_restarts = 2;
  r = mega_recovery_decide(j, MEGA_END_CRASH, "x");
  assert_int_equal(r.next, MEGA_JOB_RESTARTING);
  assert_true(r.counted);
  j->restarts = 2;
  r = mega_recovery_decide(j, MEGA_END_CRASH, "rank 0 hung");
  assert_int_equal(r.next, MEGA_JOB_FAILED);
  assert_non_null(strstr(r.why, "rank 0 hung (all 2 restarts of --max-restarts used)"));
  mega_job_free(j);
}

/* A cause as long as a rank's exit makes it (coord_run.c: up to 1600
 * bytes, a signal's hint and the rank's last stderr line) is the job's
 * error whole, with the restarts note after it: it was cut at 320 bytes,
 * mid-hint, so the last words and the note never showed. */
static void long_causes_stay_whole(void **state) {
  (void)state;
  char cause[1500];
  memset(cause, 'x', sizeof cause - 1);
  cause[sizeof cause - 1] = '\0';
  memcpy(cause + sizeof cause - 13, "; last words", 12);
  mega_job *j = job(1, 1, 0, NULL);
  mega_recovery r = mega_recovery_decide(j, MEGA_END_CRASH, cause);
  assert_int_equal(r.next, MEGA_JOB_FAILED);
  assert_string_equal(r.why, cause);
  r = mega_recovery_decide(j, MEGA_END_FATAL, cause);
  assert_string_equal(r.why, cause);
  j->max_restarts = j->restarts = 2;
  r = mega_recovery_decide(j, MEGA_END_CRASH, cause);
  assert_int_equal(r.next, MEGA_JOB_FAILED);
  assert_int_equal(strncmp(r.why, cause, strlen(cause)), 0);
  assert_string_equal(r.why + strlen(cause), " (all 2 restarts of --max-restarts used)");
  mega_job_free(j);
}

/* Membership changes never use the budget, and need a job that can
 * recover; a launch a node refused, or megad's own restart, never fail. */
static void membership_is_not_counted(void **state) {
  (void)state;
  mega_job *fixed = job(2, 2, 0, NULL), *elastic = job(2, 4, 0, NULL), *budget = job(2, 2, 1, NULL);
  assert_int_equal(mega_recovery_decide(fixed, MEGA_END_NODE_LOST, "node n3 missed heartbeats").next,
                   MEGA_JOB_FAILED);
  mega_recovery r = mega_recovery_decide(elastic, MEGA_END_NODE_LOST, "n3");
  assert_int_equal(r.next, MEGA_JOB_RESTARTING);
  assert_false(r.counted);
  budget->restarts = 1; /* used up: still recovers from a lost node */
  r = mega_recovery_decide(budget, MEGA_END_NODE_LOST, "n3");
  assert_int_equal(r.next, MEGA_JOB_RESTARTING);
  assert_false(r.counted);
  mega_end_kind never_fail[] = {MEGA_END_LAUNCH, MEGA_END_COORDINATOR, MEGA_END_RESCALE};
  for (size_t i = 0; i < 3; i++) {
    r = mega_recovery_decide(fixed, never_fail[i], "why");
    assert_int_equal(r.next, MEGA_JOB_RESTARTING);
    assert_false(r.counted);
  }
  mega_job_free(fixed);
  mega_job_free(elastic);
  mega_job_free(budget);
}

static void node_ranges(void **state) {
  (void)state;
  mega_job *j = job(2, 4, 0, NULL);
  uint32_t lo, hi;
  mega_recovery_node_range(j, &lo, &hi);
  assert_int_equal(lo, 2);
  assert_int_equal(hi, 4);
  j->coord.want_nodes = 3; /* megactl rescale pins it */
  mega_recovery_node_range(j, &lo, &hi);
  assert_int_equal(lo, 3);
  assert_int_equal(hi, 3);
  j->coord.want_nodes = 9; /* out of range: ignored */
  mega_recovery_node_range(j, &lo, &hi);
  assert_int_equal(lo, 2);
  assert_int_equal(hi, 4);
  mega_job_free(j);
  j = job(0, 0, 0, NULL);
  mega_recovery_node_range(j, &lo, &hi);
  assert_int_equal(lo, 1);
  assert_int_equal(hi, 1);
  mega_job_free(j);
}

/* Grow back when nodes return; meet a rescale target either way. */
static void replans(void **state) {
  (void)state;
  mega_job *j = job(2, 4, 0, NULL);
  assert_true(mega_recovery_should_replan(j, 3, 4));
  assert_false(mega_recovery_should_replan(j, 3, 3));
  assert_false(mega_recovery_should_replan(j, 3, 2)); /* never shrink by itself */
  assert_false(mega_recovery_should_replan(j, 3, 0));
  j->coord.want_nodes = 2;
  assert_true(mega_recovery_should_replan(j, 3, 2));
  assert_false(mega_recovery_should_replan(j, 2, 2));
  mega_job_free(j);
  j = job(2, 2, 3, NULL); /* not elastic: never grows */
  assert_false(mega_recovery_should_replan(j, 2, 3));
  mega_job_free(j);
}

/* The next attempt resumes from --save once a checkpoint was committed
 * there; the submitted flags are never edited. */
static void attempt_flags(void **state) {
  (void)state;
  mega_job *j = job(1, 1, 1, "/ck");
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_recovery_attempt_spec(j, &s, NULL), MEGA_OK);
  assert_null(s.load);
  assert_false(s.exit_on_missing_checkpoint); /* nothing committed: a fresh start is right */
  mega_jobspec_free(&s);
  j->ckpt_iteration = 20;
  j->spec.finetune = j->spec.no_load_optim = true; /* started from a pretrained model */
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_recovery_attempt_spec(j, &s, NULL), MEGA_OK);
  assert_string_equal(s.load, "/ck");
  assert_false(s.finetune); /* its own checkpoint resumes whole */
  assert_false(s.no_load_optim);
  /* a commit was recorded: a --save found empty fails, never starts afresh */
  assert_true(s.exit_on_missing_checkpoint);
  assert_false(j->spec.exit_on_missing_checkpoint);
  assert_null(j->spec.load);
  assert_true(j->spec.finetune);
  mega_jobspec_free(&s);
  j->spec_ok = false;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_recovery_attempt_spec(j, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "submit it again"));
  mega_job_free(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(ends),
      cmocka_unit_test(crashes_count),
      cmocka_unit_test(long_causes_stay_whole),
      cmocka_unit_test(membership_is_not_counted),
      cmocka_unit_test(node_ranges),
      cmocka_unit_test(replans),
      cmocka_unit_test(attempt_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
