/* Resume exactness: N iterations straight equal N/2, save, a new rank
 * loading the checkpoint, N/2 more, bit for bit. Also the save schedule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/rank.h"
#include "worker/rank_ckpt.h"

#define N 6

static char dir[256], data[512], save[512];

static void job_init(mega_jobspec *j) {
  mega_jobspec_defaults(j);
  j->num_layers = 2;
  j->hidden_size = 16;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 8; /* 4 microbatches accumulate */
  j->train_iters = N;
  j->lr = 1e-2;
  j->lr_warmup_iters = 2;
  j->lr_decay_style = MEGA_LR_COSINE;
  j->min_lr = 1e-3;
  j->clip_grad = 0.5; /* active: the norms here are above it */
  j->data_path = strdup(data);
  mega_err err = {0};
  if (mega_jobspec_check(j, 1, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

static mega_rank *rank_new(const mega_jobspec *j) {
  mega_rank_env env = {.job = j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  mega_err err = {0};
  if (mega_rank_create(&env, &r, &err) != MEGA_OK || mega_rank_setup(r, &err) != MEGA_OK)
    fail_msg("%s", err.msg);
  return r;
}

static void run(mega_jobspec *j, int iters, mega_rank_metrics *out, int64_t *first_it,
                bool expect_resume) {
  mega_err err = {0};
  mega_rank *r = rank_new(j);
  assert_int_equal(mega_rank_loaded_path(r) != NULL, expect_resume);
  *first_it = mega_rank_iteration(r);
  for (int i = 0; i < iters; i++)
    if (mega_rank_step(r, &out[i], &err) != MEGA_OK) fail_msg("%s", err.msg);
  if (j->save) assert_int_equal(mega_rank_save(r, &err), MEGA_OK);
  mega_rank_destroy(r);
}

static void test_resume_bit_exact(void **state) {
  (void)state;
  mega_rank_metrics straight[N], split[N];
  int64_t it0;
  mega_jobspec j;
  job_init(&j);
  run(&j, N, straight, &it0, false);
  assert_int_equal(it0, 0);
  assert_true(straight[N - 1].loss < straight[0].loss);
  assert_true(straight[2].grad_norm > j.clip_grad); /* clipping is active */

  j.save = strdup(save);
  run(&j, N / 2, split, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(save);
  run(&j, N / 2, split + N / 2, &it0, true);
  assert_int_equal(it0, N / 2);
  for (int i = 0; i < N; i++) {
    assert_int_equal(split[i].iteration, i + 1);
    /* bit for bit: the same data, weights, moments, step count and LR */
    assert_memory_equal(&split[i].loss, &straight[i].loss, sizeof(double));
    assert_memory_equal(&split[i].grad_norm, &straight[i].grad_norm, sizeof(double));
    assert_memory_equal(&split[i].lr, &straight[i].lr, sizeof(double));
  }
  mega_jobspec_free(&j);
}

static void test_save_schedule(void **state) {
  (void)state;
  char sdir[600];
  snprintf(sdir, sizeof sdir, "%s/sched", dir);
  mega_jobspec j;
  job_init(&j);
  j.save = strdup(sdir);
  j.save_interval = 4;
  j.train_iters = 6;
  bool due[7] = {0};
  for (int i = 1; i <= 6; i++) due[i] = mega_rank_ckpt_due(&j, i);
  assert_false(due[1] || due[2] || due[3] || due[5]);
  assert_true(due[4]);
  assert_true(due[6]); /* the last iteration */

  /* run() saves when due: exactly iterations 4 and 6 exist afterwards. */
  mega_err err = {0};
  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
  assert_int_equal(mega_rank_run(r, &err), MEGA_OK);
  mega_rank_destroy(r);
  char p[700];
  for (int i = 1; i <= 6; i++) {
    mega_ckpt_iter_path(p, sizeof p, sdir, i);
    assert_int_equal(access(p, F_OK) == 0, i == 4 || i == 6);
  }
  mega_jobspec_free(&j);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "resume");
  snprintf(data, sizeof data, "%s/data.txt", dir);
  snprintf(save, sizeof save, "%s/ckpt", dir);
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
      cmocka_unit_test(test_resume_bit_exact),
      cmocka_unit_test(test_save_schedule),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
