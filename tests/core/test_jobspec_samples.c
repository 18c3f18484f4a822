/* Sample-based training (--train-samples and the LR's sample bounds, with
 * Megatron's asserts as refusals) and the batch-size rampup against
 * Megatron's rule, restated here. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobspec_fixture.h"

/* ---- sample-based training ---- */

/* the base job by samples: --train-iters dropped */
static void make_samples(mega_jobspec *s, char *const *extra, int n) {
  make_spec(s, extra, n);
  s->train_iters = -1;
}

static void test_sample_flags(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--train-samples", "100", "--lr-decay-samples", "80",
                        "--lr-warmup-samples", "8"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_train_iters(&s), 12); /* 100 // 8: the partial batch dropped */
  mega_lr_samples l;
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.warmup == 8 && l.decay == 80 && l.wsd_decay == 0);
  s.lr_decay_samples = -1; /* the decay defaults to --train-samples */
  s.lr_warmup_samples = 0;
  s.lr_warmup_fraction = 0.25;
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.decay == 100 && l.warmup == 25);
  mega_jobspec_free(&s);
  /* by iterations, the bounds are iterations x the global batch */
  make_spec(&s, ARGV("--lr-decay-iters", "9", "--lr-warmup-fraction", "0.1"));
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.decay == 72 && fabs(l.warmup - 7.2) < 1e-12);
  mega_jobspec_free(&s);

  /* Megatron's asserts, as refusals that say what to give */
  make_samples(&s, NULL, 0);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--train-iters is required (or --train-samples)");
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--train-samples", "80"), 1, -1,
                     "--train-iters and --train-samples exclude each other");
  /* fewer samples than one batch (8) train no iteration: refused, not a
   * job that ends "succeeded after 0 iterations" */
  make_samples(&s, ARGV("--train-samples", "7"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--train-samples 7 is fewer than one global batch (--global-batch-size 8): "
                   "the job would train no iteration; give at least 8 samples, or --train-iters");
  mega_jobspec_free(&s);
  make_samples(&s, ARGV("--train-samples", "8"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_train_iters(&s), 1);
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--lr-decay-samples", "80"), 1, -1,
                     "--lr-decay-samples is for sample-based training (--train-samples); with "
                     "--train-iters give --lr-decay-iters");
  expect_check_error(ARGV("--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"), 1, -1,
                     "--lr-warmup-fraction and --lr-warmup-iters exclude each other");
  make_samples(&s, ARGV("--train-samples", "80", "--lr-decay-iters", "5"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--lr-decay-iters is for iteration-based training; with --train-samples "
                   "give --lr-decay-samples");
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--lr-decay-style", "WSD"), 1, -1,
                     "--lr-decay-style WSD needs the length of its final anneal: "
                     "--lr-wsd-decay-iters N");
  expect_check_error(ARGV("--lr-wsd-decay-iters", "3"), 1, -1,
                     "--lr-wsd-decay-iters is for --lr-decay-style WSD");
  expect_check_error(ARGV("--lr-warmup-init", "1"), 1, -1,
                     "--lr-warmup-init 1 is larger than --lr 0.001");
  expect_parse_error(ARGV("--lr-warmup-fraction", "1"), MEGA_ERR_INVALID,
                     "--lr-warmup-fraction must be less than 1");
  expect_check_ok(ARGV("--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3",
                       "--lr-wsd-decay-style", "minus_sqrt"), 1, -1);
  expect_check_ok(ARGV("--lr-decay-style", "inverse-square-root", "--lr-warmup-iters", "2"), 1,
                  -1);
}

/* ---- the rampup against Megatron's rule, restated ---- */

/* RampupBatchsizeNumMicroBatchesCalculator.update: the global batch after
 * c consumed samples, with n = (G - start) / inc increments of S / n
 * samples each (Python's float division and int()). */
static int megatron_batch(int64_t c, int start, int inc, int64_t S, int G) {
  if (c > S) return G;
  int n = (G - start) / inc;
  double per = (double)S / n;
  return start + (int)((double)c / per) * inc;
}

/* training.py's update_train_iters with a rampup, one iteration at a time:
 * the ramp's iterations while at most S (and T) samples are consumed, then
 * whole global batches. */
static int64_t megatron_train_iters(int start, int inc, int64_t S, int G, int64_t T) {
  int64_t it = 0, c = 0;
  while (c <= S && c <= T) {
    c += megatron_batch(c, start, inc, S, G);
    it++;
  }
  if (T > c) it += (T - c) / G;
  return it;
}

static void test_rampup_small(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  /* 2 2 40 up to 8: three increments of 13.33 samples */
  make_samples(&s, ARGV("--global-batch-size", "8", "--rampup-batch-size", "2", "2", "40",
                        "--train-samples", "100"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  /* consumed 0, 2, ..., 12 take 2; 14, 18, 22, 26 take 4; 30, 36 take 6; then 8 */
  const int want[] = {2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 8, 8, 8};
  int64_t c = 0;
  for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
    assert_int_equal(mega_jobspec_samples_before(&s, i), c);
    assert_int_equal(mega_jobspec_batch_of(&s, i), want[i]);
    c += want[i];
  }
  /* 13 iterations ramp to 42 samples, then (100 - 42) // 8 = 7 more */
  assert_int_equal(mega_jobspec_train_iters(&s), 20);
  assert_int_equal(megatron_train_iters(2, 2, 40, 8, 100), 20);
  mega_jobspec_free(&s);
}

static void test_rampup_gpt3(void **state) {
  (void)state;
  /* the 175B script's ramp: 16 16 5859375 up to 1536, 500000 x 1536 samples */
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--micro-batch-size", "1", "--global-batch-size", "1536",
                        "--rampup-batch-size", "16", "16", "5859375", "--train-samples",
                        "768000000"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  int64_t c = 0, i = 0;
  for (; c <= 5859375 + 3 * 1536; i++) {
    int b = megatron_batch(c, 16, 16, 5859375, 1536);
    if (mega_jobspec_samples_before(&s, i) != c || mega_jobspec_batch_of(&s, i) != b)
      fail_msg("iteration %lld: samples %lld batch %d, Megatron's %lld and %d", (long long)i,
               (long long)mega_jobspec_samples_before(&s, i), mega_jobspec_batch_of(&s, i),
               (long long)c, b);
    c += b;
  }
  assert_int_equal(mega_jobspec_train_iters(&s),
                   megatron_train_iters(16, 16, 5859375, 1536, 768000000));
  s.train_samples = 3000000; /* ending inside the ramp */
  assert_int_equal(mega_jobspec_train_iters(&s),
                   megatron_train_iters(16, 16, 5859375, 1536, 3000000));
  mega_jobspec_free(&s);
}

static void test_rampup_checks(void **state) {
  (void)state;
  /* Megatron refuses a ramp with iteration-based training: the refusal
   * gives the sample counts to write instead */
  expect_check_error(ARGV("--rampup-batch-size", "2", "2", "40", "--lr-decay-iters", "9"), 1,
                     -1,
                     "--rampup-batch-size needs sample-based training, as in Megatron: give "
                     "--train-samples 80 instead of --train-iters 10 (10 iterations of "
                     "--global-batch-size 8), and --lr-decay-samples 72 for --lr-decay-iters 9");
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "4", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--global-batch-size 8 minus START 2 is not divisible by INCR 4");
  mega_jobspec_free(&s);
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "8", "2", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "START 8 must be less than --global-batch-size 8");
  mega_jobspec_free(&s);
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "x", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "takes three whole numbers, START INCR SAMPLES");
  mega_jobspec_free(&s);
  /* bounds that keep the ramp's walk short */
  make_samples(&s, ARGV("--global-batch-size", "200000", "--train-samples", "800000",
                        "--rampup-batch-size", "2", "2", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "ramps in 99999 steps, more than the 65536 allowed");
  mega_jobspec_free(&s);
  /* every batch of the ramp divides by micro batch x DP (micro 2, DP 2 here) */
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "2", "40"));
  assert_int_equal(mega_jobspec_check_all(&s, 2, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "every batch of the ramp must divide by --micro-batch-size 2 x "
                   "data-parallel size 2 = 4");
  assert_int_equal(mega_jobspec_check_all(&s, 1, -1, &err), MEGA_OK);
  mega_jobspec_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sample_flags),
      cmocka_unit_test(test_rampup_small),
      cmocka_unit_test(test_rampup_gpt3),
      cmocka_unit_test(test_rampup_checks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
