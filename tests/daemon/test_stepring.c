/* daemon/model/stepring: the step curve the web view draws, thinned to a
 * bound with the start and restart/rescale marks kept, and filled from the
 * journal's step records too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>

#include "web_fixture.h"

static void test_ring_thins_and_marks(void **state) {
  (void)state;
  mega_stepring r = {0};
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  for (uint64_t it = 1; it <= 100000; it++) {
    /* attempt 1 resumes at 40000 from a checkpoint at 39000; attempt 2 rescales */
    uint32_t attempt = it <= 40000 ? 0 : it <= 70000 ? 1 : 2;
    uint64_t iter = attempt == 0 ? it : it - 1000 * attempt;
    wf_step(&s, rm, rp, iter, attempt, attempt == 2 ? 2 : 4);
    assert_int_equal(mega_stepring_push(&r, &s, NULL), MEGA_OK);
  }
  assert_true(r.n <= MEGA_STEPRING_CAP);
  assert_true(r.n > MEGA_STEPRING_CAP / 2);
  uint64_t b = r.base; /* points are numbered after the curve's epoch */
  assert_int_equal(r.seq, b + 100000);
  assert_int_equal(r.thinned, 100000 - r.n);
  assert_int_equal(r.v[0].seq, b + 1); /* the start stays */
  assert_int_equal(r.v[r.n - 1].seq, b + 100000);
  for (size_t i = 1; i < r.n; i++) assert_true(r.v[i].seq > r.v[i - 1].seq);
  /* recent points at full resolution, old ones sparser */
  assert_int_equal(r.v[r.n - 1].seq - r.v[r.n - 100].seq, 99);
  assert_true(r.v[100].seq > b + 1000);
  /* both attempts' starts were kept and marked */
  assert_int_equal(r.nmarks, 2);
  assert_int_equal(r.marks[0].iteration, 39001);
  assert_int_equal(r.marks[0].attempt, 1);
  assert_int_equal(r.marks[0].world, r.marks[0].prev_world);
  assert_int_equal(r.marks[1].attempt, 2);
  assert_int_equal(r.marks[1].world, 2);
  assert_int_equal(r.marks[1].prev_world, 4);
  bool found[2] = {false, false};
  for (size_t i = 0; i < r.n; i++)
    for (int m = 0; m < 2; m++) found[m] |= r.v[i].seq == r.marks[m].seq;
  assert_true(found[0] && found[1]);
  /* the cursor */
  assert_int_equal(mega_stepring_after(&r, 0), 0);
  assert_int_equal(mega_stepring_after(&r, b + 100000), r.n);
  assert_int_equal(mega_stepring_after(&r, b + 99999), r.n - 1);
  /* a point's figures: the bubble is the ranks' mean, grad sync the most */
  assert_true(r.v[r.n - 1].bubble > 0.199 && r.v[r.n - 1].bubble < 0.201);
  assert_true(r.v[r.n - 1].grad_sync_s > 0.00199 && r.v[r.n - 1].grad_sync_s < 0.00201);
  mega_stepring_free(&r);
}

/* A cursor is known only to the curve that numbered it: a curve made anew
 * (megad restarted, the job's record was rebuilt) has another epoch, so an
 * old cursor, even one below the new curve's length, is told apart. */
static void test_ring_epochs(void **state) {
  (void)state;
  mega_stepring a = {0}, b = {0};
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  assert_true(mega_stepring_knows(&a, 0));
  assert_false(mega_stepring_knows(&a, 1)); /* no point yet */
  mega_stepring_seed(MEGA_STEPRING_EPOCHS - 1); /* the last epoch, then it wraps to 1 */
  for (uint64_t it = 1; it <= 5; it++) {
    wf_step(&s, rm, rp, it, 0, 4);
    assert_int_equal(mega_stepring_push(&a, &s, NULL), MEGA_OK);
  }
  for (uint64_t it = 1; it <= 9; it++) {
    wf_step(&s, rm, rp, it, 0, 4);
    assert_int_equal(mega_stepring_push(&b, &s, NULL), MEGA_OK);
  }
  assert_int_equal(a.base, (uint64_t)MEGA_STEPRING_EPOCHS << 32);
  assert_int_equal(b.base, 1ull << 32);
  assert_true(a.seq < 1ull << 53); /* exact in JavaScript */
  assert_true(mega_stepring_knows(&a, a.base) && mega_stepring_knows(&a, a.seq));
  assert_false(mega_stepring_knows(&a, a.seq + 1)); /* past it */
  assert_false(mega_stepring_knows(&b, a.seq));    /* another curve's */
  assert_false(mega_stepring_knows(&b, 3));         /* a plain number (an older megad's) */
  /* freed, the ring starts a curve of a new epoch */
  mega_stepring_free(&a);
  wf_step(&s, rm, rp, 1, 0, 4);
  assert_int_equal(mega_stepring_push(&a, &s, NULL), MEGA_OK);
  assert_int_equal(a.base, 2ull << 32);
  assert_false(mega_stepring_knows(&a, b.base + 1));
  mega_stepring_free(&a);
  mega_stepring_free(&b);
}

/* Eval loss on every iteration: pinning them all would leave no room, so
 * thinning drops them too, and the ring stays bounded. */
static void test_ring_dense_evals(void **state) {
  (void)state;
  mega_stepring r = {0};
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  for (uint64_t it = 1; it <= 20000; it++) {
    wf_step(&s, rm, rp, it, 0, 2);
    s.has_eval_loss = true;
    assert_int_equal(mega_stepring_push(&r, &s, NULL), MEGA_OK);
  }
  assert_true(r.n <= MEGA_STEPRING_CAP);
  assert_int_equal(r.thinned + r.n, 20000);
  assert_int_equal(r.v[r.n - 1].iteration, 20000);
  mega_stepring_free(&r);
}

/* The curve is filled from the journal's step records too, and a job record
 * replayed over its job keeps it. */
static void test_ring_from_journal(void **state) {
  (void)state;
  mega_jobs t;
  mega_jobs_init(&t);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "j";
  spec.args = wf_args;
  spec.n_args = wf_nargs;
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-2-n1", &spec, "n1", 1000, &j, NULL), MEGA_OK);
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_job(j, &buf, &len, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK);
  for (uint64_t it = 1; it <= 3; it++) {
    Mega__V1__StepMetrics s;
    Mega__V1__RankMetrics rm[4];
    Mega__V1__RankMetrics *rp[4];
    wf_step(&s, rm, rp, it, 0, 2);
    uint8_t *sb;
    size_t sl;
    assert_int_equal(mega_jrec_step("j-2-n1", &s, &sb, &sl, NULL), MEGA_OK);
    assert_int_equal(mega_jobs_apply(&t, sb, sl, NULL), MEGA_OK);
    free(sb);
  }
  assert_int_equal(mega_jobs_table_find(&t, "j-2-n1")->hist.curve.n, 3);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK); /* the job again */
  const mega_job *k = mega_jobs_table_find(&t, "j-2-n1");
  assert_int_equal(k->hist.curve.n, 3);
  assert_int_equal(k->hist.curve.v[2].iteration, 3);
  free(buf);
  mega_job_free(j);
  mega_jobs_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_thins_and_marks),
      cmocka_unit_test(test_ring_dense_evals),
      cmocka_unit_test(test_ring_epochs),
      cmocka_unit_test(test_ring_from_journal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
