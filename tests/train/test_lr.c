/* The LR schedule against hand-computed values, one style at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "worker/optim/lr_sched.h"

#define near(a, b) assert_true(fabs((a) - (b)) < 1e-12)

static void test_constant(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1e-3, .min_lr = 0, .warmup = 4, .decay = 10,
                     .style = MEGA_LR_CONSTANT};
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
  near(mega_lr_at(&s, 0), 0.0); /* warmup starts at 0, as Megatron's init_lr */
  near(mega_lr_at(&s, 1), 2.5e-4);
  near(mega_lr_at(&s, 2), 5e-4);
  near(mega_lr_at(&s, 4), 1e-3);
  near(mega_lr_at(&s, 5), 1e-3);
  near(mega_lr_at(&s, 1000), 1e-3); /* constant ignores decay_iters */
  s.warmup = 0;
  near(mega_lr_at(&s, 0), 1e-3);
}

static void test_linear(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1.0, .min_lr = 0.1, .warmup = 2, .decay = 12,
                     .style = MEGA_LR_LINEAR};
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
  near(mega_lr_at(&s, 0), 0.0);
  near(mega_lr_at(&s, 1), 0.5);
  near(mega_lr_at(&s, 2), 1.0);
  near(mega_lr_at(&s, 3), 0.91);  /* r = 1/10: 0.1 + 0.9 * 0.9 */
  near(mega_lr_at(&s, 7), 0.55);  /* r = 1/2 */
  near(mega_lr_at(&s, 12), 0.1);
  near(mega_lr_at(&s, 13), 0.1);
  near(mega_lr_at(&s, 500), 0.1);
}

static void test_cosine(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1.0, .min_lr = 0.0, .warmup = 0, .decay = 10,
                     .style = MEGA_LR_COSINE};
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
  near(mega_lr_at(&s, 0), 1.0);
  assert_true(fabs(mega_lr_at(&s, 3) - 0.7938926261462366) < 1e-12); /* (cos(0.3 pi)+1)/2 */
  near(mega_lr_at(&s, 5), 0.5);
  near(mega_lr_at(&s, 10), 0.0);
  near(mega_lr_at(&s, 11), 0.0);
  /* with warmup and a floor: lr 2e-4, min 2e-5, warmup 10, decay 110 */
  mega_lr_sched w = {.lr = 2e-4, .min_lr = 2e-5, .warmup = 10, .decay = 110,
                     .style = MEGA_LR_COSINE};
  near(mega_lr_at(&w, 5), 1e-4);
  near(mega_lr_at(&w, 10), 2e-4);
  near(mega_lr_at(&w, 60), 1.1e-4); /* r = 1/2: 2e-5 + 1.8e-4 * 0.5 */
  assert_true(fabs(mega_lr_at(&w, 35) - (2e-5 + 1.8e-4 * 0.8535533905932737)) < 1e-15);
  near(mega_lr_at(&w, 110), 2e-5);
}

static void test_check(void **state) {
  (void)state;
  mega_err err = {0};
  mega_lr_sched s = {.lr = 1.0, .min_lr = 2.0, .decay = 10, .style = MEGA_LR_LINEAR};
  assert_int_equal(mega_lr_sched_check(&s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--min-lr"));
  s.min_lr = 0;
  s.warmup = 10;
  assert_int_equal(mega_lr_sched_check(&s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "must exceed the warmup"));
  s.style = MEGA_LR_CONSTANT;
  assert_int_equal(mega_lr_sched_check(&s, &err), MEGA_OK);
}

/* Megatron's OptimizerParamScheduler.get_lr, WSD branch: coeff 1 until
 * n > decay - wsd; then with q = (n - (decay - wsd)) / wsd,
 *   exponential 2 * 0.5^q - 1, linear 1 - q, cosine 0.5 (cos(pi q) + 1),
 *   minus_sqrt 1 - sqrt(q),
 * lr = min + coeff (max - min). Here max 1, min 0.1, warmup 10, decay 110,
 * wsd 40: the anneal starts after 70. The values below are those
 * formulas worked by hand (q = 0.25 at n = 80). */
static void test_wsd(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1.0, .min_lr = 0.1, .warmup = 10, .decay = 110, .wsd_decay = 40,
                     .style = MEGA_LR_WSD};
  const struct {
    mega_wsd_style st;
    double at80; /* 0.1 + 0.9 coeff(0.25) */
  } want[] = {
      {MEGA_WSD_EXPONENTIAL, 0.1 + 0.9 * (2 * 0.8408964152537145 - 1)}, /* 0.5^0.25 */
      {MEGA_WSD_LINEAR, 0.775},
      {MEGA_WSD_COSINE, 0.1 + 0.9 * 0.8535533905932737}, /* (cos(pi/4) + 1) / 2 */
      {MEGA_WSD_MINUS_SQRT, 0.55},
  };
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    s.wsd_style = want[k].st;
    assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
    near(mega_lr_at(&s, 5), 0.5);   /* warmup */
    near(mega_lr_at(&s, 10), 1.0);  /* its end */
    near(mega_lr_at(&s, 50), 1.0);  /* stable */
    near(mega_lr_at(&s, 70), 1.0);  /* the anneal's start */
    near(mega_lr_at(&s, 80), want[k].at80);
    near(mega_lr_at(&s, 110), 0.1); /* q = 1: every shape ends at min */
    near(mega_lr_at(&s, 111), 0.1); /* past the decay */
  }
  s.wsd_decay = 0;
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_ERR_INVALID);
}

/* Megatron's inverse-square-root: after the warmup (and while n <= decay)
 * max(min, max_lr * sqrt(max(warmup, 1)) / sqrt(max(n, 1))). */
static void test_inverse_sqrt(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1.0, .min_lr = 0.05, .warmup = 4, .decay = 1000,
                     .style = MEGA_LR_INVERSE_SQRT};
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
  near(mega_lr_at(&s, 2), 0.5);         /* warmup */
  near(mega_lr_at(&s, 4), 1.0);         /* its end */
  near(mega_lr_at(&s, 16), 0.5);        /* 2 / 4 */
  near(mega_lr_at(&s, 100), 0.2);       /* 2 / 10 */
  near(mega_lr_at(&s, 900), 2.0 / 30);  /* 0.0667 */
  near(mega_lr_at(&s, 1001), 0.05);     /* past the decay: min */
  s.min_lr = 0.1;
  near(mega_lr_at(&s, 900), 0.1);       /* the floor */
  s.warmup = 0;                         /* max(warmup, 1) and max(n, 1) */
  near(mega_lr_at(&s, 0), 1.0);
  near(mega_lr_at(&s, 4), 0.5);
}

/* --lr-warmup-init: the warmup runs from it, init + (max - init) n / warmup. */
static void test_warmup_init(void **state) {
  (void)state;
  mega_lr_sched s = {.lr = 1.0, .min_lr = 0, .init_lr = 0.1, .warmup = 10, .decay = 20,
                     .style = MEGA_LR_LINEAR};
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_OK);
  near(mega_lr_at(&s, 0), 0.1);
  near(mega_lr_at(&s, 5), 0.55);
  near(mega_lr_at(&s, 10), 1.0);
  s.init_lr = 2;
  assert_int_equal(mega_lr_sched_check(&s, NULL), MEGA_ERR_INVALID);
}

/* A job's schedule counts samples, as Megatron's get_optimizer_param_scheduler
 * builds it: iteration bounds times the global batch, sample bounds as
 * given, a warmup fraction of the decay. */
static void test_from_job(void **state) {
  (void)state;
  mega_jobspec j;
  mega_jobspec_defaults(&j);
  j.global_batch_size = 4;
  j.train_iters = 10;
  j.lr = 1e-3;
  j.min_lr = 1e-4;
  j.lr_warmup_iters = 2;
  j.lr_decay_iters = 9;
  j.lr_decay_style = MEGA_LR_COSINE;
  mega_lr_sched s = mega_lr_sched_from_job(&j);
  assert_true(s.warmup == 8 && s.decay == 36 && s.style == MEGA_LR_COSINE);
  /* iteration 2 (0-based) after 8 samples: the warmup's end */
  near(mega_lr_at(&s, (double)mega_jobspec_samples_before(&j, 2)), 1e-3);
  /* by samples: --train-samples 100, a tenth of it warmup */
  j.train_iters = -1;
  j.train_samples = 100;
  j.lr_warmup_iters = 0;
  j.lr_decay_iters = -1;
  j.lr_warmup_fraction = 0.1;
  s = mega_lr_sched_from_job(&j);
  assert_true(s.warmup == 10 && s.decay == 100);
  near(mega_lr_at(&s, 55), 1e-4 + 9e-4 * 0.5); /* r = 1/2 */
  mega_jobspec_free(&j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constant),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_cosine),
      cmocka_unit_test(test_check),
      cmocka_unit_test(test_wsd),
      cmocka_unit_test(test_inverse_sqrt),
      cmocka_unit_test(test_warmup_init),
      cmocka_unit_test(test_from_job),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
