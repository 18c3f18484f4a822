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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constant),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_cosine),
      cmocka_unit_test(test_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
