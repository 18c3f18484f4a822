/* --bf16 on the cpu backend trains as fp32 does, within a stated
 * tolerance: the linear layers' GEMMs take inputs rounded to bf16 (8 bits
 * of mantissa, a relative error up to 2^-8 per input) and accumulate in
 * fp32, with fp32 master weights, gradients and AdamW state. Over ITERS
 * steps each loss stays within RTOL of the fp32 run's, and the runs really
 * differ (the flag took effect). The jobspec refuses what --bf16 cannot
 * honour. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/rank/rank.h"

#define ITERS 8
/* measured here: at most 5.2e-5 relative over the 8 steps; the bound
 * leaves a factor of 20 */
#define RTOL 1e-3

static char dir[256], data[512];

static void job_init(mega_jobspec *j, bool bf16) {
  mega_jobspec_defaults(j);
  j->num_layers = 2;
  j->hidden_size = 32;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 4;
  j->train_iters = ITERS;
  j->lr = 3e-3;
  if (mega_jobspec_parse(j, 2, (char *const[]){"--data-path", (char *)data}, NULL) != MEGA_OK)
    fail_msg("--data-path %s", data);
  j->bf16 = bf16;
  mega_err err = {0};
  if (mega_jobspec_check(j, 1, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

static void train(bool bf16, double *loss, double *norm) {
  mega_jobspec j;
  job_init(&j, bf16);
  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  mega_err err = {0};
  if (mega_rank_create(&env, &r, &err) != MEGA_OK || mega_rank_setup(r, &err) != MEGA_OK)
    fail_msg("%s", err.msg);
  for (int i = 0; i < ITERS; i++) {
    mega_rank_metrics m;
    if (mega_rank_step(r, &m, &err) != MEGA_OK) fail_msg("%s", err.msg);
    loss[i] = m.loss;
    norm[i] = m.grad_norm;
  }
  mega_rank_destroy(r);
  mega_jobspec_free(&j);
}

static void test_tracks_fp32(void **state) {
  (void)state;
  double l32[ITERS], n32[ITERS], l16[ITERS], n16[ITERS];
  train(false, l32, n32);
  train(true, l16, n16);
  double worst = 0;
  bool differ = false;
  for (int i = 0; i < ITERS; i++) {
    double rel = fabs(l16[i] - l32[i]) / l32[i];
    printf("iteration %d: loss fp32 %.7f bf16 %.7f (rel %.2e), grad norm %.5f %.5f\n", i + 1,
           l32[i], l16[i], rel, n32[i], n16[i]);
    if (rel > worst) worst = rel;
    differ |= l16[i] != l32[i];
  }
  printf("worst relative loss difference %.2e (bound %.0e)\n", worst, RTOL);
  assert_true(differ);
  assert_true(worst <= RTOL);
  assert_true(l16[ITERS - 1] < l16[0]); /* it learns */
}

static void test_refusals(void **state) {
  (void)state;
  mega_jobspec j;
  job_init(&j, true);
  mega_err err = {0};
  char *argv[] = {"--simulate-compute", "1:2"};
  assert_int_equal(mega_jobspec_parse(&j, 2, argv, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_check(&j, 1, 4000, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "--bf16")) fail_msg("%s", err.msg);
  mega_jobspec_free(&j);
  mega_jobspec_defaults(&j);
  char *fp16[] = {"--data-path", data, "--bf16", "--fp16"};
  assert_int_not_equal(mega_jobspec_parse(&j, 4, fp16, &err), MEGA_OK); /* no fp16 at all */
  assert_non_null(strstr(err.msg, "--fp16"));
  mega_jobspec_free(&j);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "bf16");
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
      cmocka_unit_test(test_tracks_fp32),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
