/* daemon/stepmerge: reports of one iteration from every rank become one
 * StepMetrics, whatever their order; missing ranks hold it back; duplicates
 * are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <stdbool.h>

#include "daemon/model/stepmerge.h"

/* A 4-rank job: TP 1, PP 2, DP 2 (rank = dp + 2*pp); the last stage (ranks
 * 2, 3) has the loss; rank 3 is the slowest. */
typedef struct rep {
  Mega__V1__StepReport r;
  Mega__V1__RankMetrics m;
} rep;

static void make(rep *x, uint32_t rank, uint64_t it) {
  mega__v1__step_report__init(&x->r);
  mega__v1__rank_metrics__init(&x->m);
  x->r.iteration = it;
  x->r.metrics = &x->m;
  x->m.rank = rank;
  x->m.dp_rank = rank % 2;
  x->m.pp_rank = rank / 2;
  x->m.compute_s = 0.1 * (rank + 1);
  x->m.bubble_s = 0.01 * (rank + 1);
  x->m.step_time_s = 0.5 + 0.1 * rank;
  x->m.peak_activation_bytes = 1000u * (rank + 1);
  x->r.lr = 1e-3;
  x->r.tokens = 64; /* each replica's share */
  if (rank >= 2) {
    x->r.has_loss = true;
    x->r.loss = 5.0 - (double)it;
  }
  if (rank == 0) {
    x->r.has_grad_norm = true;
    x->r.grad_norm = 2.5;
  }
}

static void check_merged(const mega_step_done *d, uint64_t it) {
  const Mega__V1__StepMetrics *s = d->step;
  assert_int_equal(s->iteration, it);
  assert_true(s->loss == 5.0 - (double)it);
  assert_true(s->grad_norm == 2.5);
  assert_true(s->lr == 1e-3);
  assert_true(s->step_time_s == 0.5 + 0.3);
  /* two replicas of 64 tokens each, counted once per replica */
  assert_true(s->tokens_per_s > 128 / 0.8 - 1e-9 && s->tokens_per_s < 128 / 0.8 + 1e-9);
  assert_int_equal(s->n_ranks, 4);
  for (uint32_t r = 0; r < 4; r++) {
    assert_int_equal(s->ranks[r]->rank, r);
    assert_int_equal(s->ranks[r]->pp_rank, r / 2);
    assert_int_equal(s->ranks[r]->dp_rank, r % 2);
    assert_true(s->ranks[r]->compute_s == 0.1 * (r + 1));
    assert_int_equal(s->ranks[r]->peak_activation_bytes, 1000u * (r + 1));
    assert_int_equal(d->reports[r]->iteration, it);
  }
}

static void test_every_order(void **state) {
  (void)state;
  /* all 24 orders of the four ranks */
  int perm[4] = {0, 1, 2, 3};
  int c[4] = {0}, k = 0, orders = 0;
  for (;;) {
    mega_stepmerge *m = mega_stepmerge_new(4, 0, 0);
    assert_non_null(m);
    for (int i = 0; i < 4; i++) {
      rep x;
      make(&x, (uint32_t)perm[i], 1);
      mega_step_done *d = NULL;
      assert_int_equal(mega_stepmerge_add(m, (uint32_t)perm[i], &x.r, &d, NULL), MEGA_OK);
      if (i < 3) {
        assert_null(d);
      } else {
        assert_non_null(d);
        check_merged(d, 1);
        mega_step_done_free(d);
      }
    }
    assert_int_equal(mega_stepmerge_pending(m), 0);
    mega_stepmerge_free(m);
    orders++;
    /* Heap's algorithm, iteratively */
    while (k < 4 && c[k] >= k) c[k++] = 0;
    if (k == 4) break;
    int a = k % 2 ? c[k] : 0, t = perm[a];
    perm[a] = perm[k];
    perm[k] = t;
    c[k]++;
    k = 0;
  }
  assert_int_equal(orders, 24);
}

static void test_interleaved_iterations(void **state) {
  (void)state;
  /* Ranks run ahead of each other: rank 0 reports three iterations before
   * rank 3 reports its first; iterations still merge, each once. */
  mega_stepmerge *m = mega_stepmerge_new(4, 2, 0);
  const int seq[][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 3},
                        {3, 1}, {2, 3}, {3, 2}, {3, 3}};
  int merged = 0;
  for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
    rep x;
    make(&x, (uint32_t)seq[i][0], (uint64_t)seq[i][1]);
    mega_step_done *d = NULL;
    assert_int_equal(mega_stepmerge_add(m, (uint32_t)seq[i][0], &x.r, &d, NULL), MEGA_OK);
    if (d) {
      merged++;
      check_merged(d, (uint64_t)merged);
      assert_int_equal(d->step->attempt, 2);
      mega_step_done_free(d);
    }
  }
  assert_int_equal(merged, 3);
  mega_stepmerge_free(m);
}

static void test_missing_rank(void **state) {
  (void)state;
  mega_stepmerge *m = mega_stepmerge_new(4, 0, 4);
  for (uint64_t it = 1; it <= 6; it++)
    for (uint32_t r = 0; r < 3; r++) { /* rank 3 never reports */
      rep x;
      make(&x, r, it);
      mega_step_done *d = NULL;
      assert_int_equal(mega_stepmerge_add(m, r, &x.r, &d, NULL), MEGA_OK);
      assert_null(d);
    }
  /* a window of 4: iterations 1 and 2 were given up */
  assert_int_equal(mega_stepmerge_pending(m), 4);
  assert_int_equal(mega_stepmerge_dropped(m), 2);
  /* rank 3 catching up on iteration 3 completes it */
  rep x;
  make(&x, 3, 3);
  mega_step_done *d = NULL;
  assert_int_equal(mega_stepmerge_add(m, 3, &x.r, &d, NULL), MEGA_OK);
  assert_non_null(d);
  check_merged(d, 3);
  mega_step_done_free(d);
  /* a late report of a dropped iteration is refused, not restarted */
  make(&x, 3, 1);
  mega_err err = {0};
  assert_int_equal(mega_stepmerge_add(m, 3, &x.r, &d, &err), MEGA_ERR_INVALID);
  mega_stepmerge_free(m);
}

static void test_duplicates_and_bad_reports(void **state) {
  (void)state;
  mega_stepmerge *m = mega_stepmerge_new(2, 0, 0);
  rep x;
  mega_step_done *d = NULL;
  mega_err err = {0};
  make(&x, 0, 1);
  assert_int_equal(mega_stepmerge_add(m, 0, &x.r, &d, &err), MEGA_OK);
  assert_int_equal(mega_stepmerge_add(m, 0, &x.r, &d, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "rank 0 reported iteration 1 twice"));
  assert_null(d);
  make(&x, 5, 1);
  assert_int_equal(mega_stepmerge_add(m, 5, &x.r, &d, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "world is 2"));
  make(&x, 1, 0);
  assert_int_equal(mega_stepmerge_add(m, 1, &x.r, &d, &err), MEGA_ERR_INVALID);
  make(&x, 1, 1);
  assert_int_equal(mega_stepmerge_add(m, 1, &x.r, &d, &err), MEGA_OK);
  assert_non_null(d);
  assert_int_equal(d->step->n_ranks, 2);
  mega_step_done_free(d);
  /* a duplicate after the merge is refused too */
  assert_int_equal(mega_stepmerge_add(m, 1, &x.r, &d, &err), MEGA_ERR_INVALID);
  assert_null(d);
  mega_stepmerge_free(m);
}

/* A lost rank never reports iterations 5 to 7, which the others completed:
 * flushing up to 6 merges 5 and 6 from what came (the loss is there), in
 * order, and leaves 7; their late reports are refused. */
static void test_flush_partial(void **state) {
  (void)state;
  mega_stepmerge *m = mega_stepmerge_new(4, 2, 0);
  for (uint64_t it = 5; it <= 7; it++)
    for (uint32_t r = 0; r < 4; r++) {
      if (r == 1) continue;
      rep x;
      make(&x, r, it);
      mega_step_done *d = NULL;
      assert_int_equal(mega_stepmerge_add(m, r, &x.r, &d, NULL), MEGA_OK);
      assert_null(d);
    }
  mega_step_done *d = NULL;
  for (uint64_t it = 5; it <= 6; it++) {
    assert_int_equal(mega_stepmerge_flush(m, 6, &d, NULL), MEGA_OK);
    assert_non_null(d);
    assert_int_equal(d->step->iteration, it);
    assert_int_equal(d->step->attempt, 2);
    assert_true(d->step->loss == 5.0 - (double)it);
    assert_true(d->step->grad_norm == 2.5);
    assert_int_equal(d->step->n_ranks, 4);
    assert_null(d->reports[1]);
    assert_true(d->step->ranks[1]->compute_s == 0);
    assert_int_equal(d->step->ranks[1]->rank, 1);
    assert_true(d->step->ranks[2]->compute_s == 0.1 * 3);
    mega_step_done_free(d);
  }
  assert_int_equal(mega_stepmerge_flush(m, 6, &d, NULL), MEGA_OK);
  assert_null(d);
  assert_int_equal(mega_stepmerge_pending(m), 1);
  rep x;
  make(&x, 1, 5);
  mega_err err = {0};
  assert_int_equal(mega_stepmerge_add(m, 1, &x.r, &d, &err), MEGA_ERR_INVALID);
  mega_stepmerge_free(m);
}

/* No rank computed a loss (--simulate-compute: the last stage reports none):
 * the step says so, where a loss of 0 would read as a perfect model. */
static void test_no_loss(void **state) {
  (void)state;
  mega_stepmerge *m = mega_stepmerge_new(4, 0, 0);
  mega_step_done *d = NULL;
  for (uint32_t r = 0; r < 4; r++) {
    rep x;
    make(&x, r, 1);
    x.r.has_loss = false;
    x.r.loss = 0;
    assert_int_equal(mega_stepmerge_add(m, r, &x.r, &d, NULL), MEGA_OK);
  }
  assert_non_null(d);
  assert_true(d->step->no_loss);
  assert_true(d->step->grad_norm == 2.5);
  mega_step_done_free(d);
  /* with the loss stage's reports, the loss is there */
  for (uint32_t r = 0; r < 4; r++) {
    rep x;
    make(&x, r, 2);
    assert_int_equal(mega_stepmerge_add(m, r, &x.r, &d, NULL), MEGA_OK);
  }
  assert_non_null(d);
  assert_false(d->step->no_loss);
  check_merged(d, 2);
  mega_step_done_free(d);
  mega_stepmerge_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_order),
      cmocka_unit_test(test_interleaved_iterations),
      cmocka_unit_test(test_missing_rank),
      cmocka_unit_test(test_duplicates_and_bad_reports),
      cmocka_unit_test(test_flush_partial),
      cmocka_unit_test(test_no_loss),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
