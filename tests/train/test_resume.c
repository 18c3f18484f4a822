/* Resume exactness: N iterations straight equal N/2, save, a new trainer
 * loading the checkpoint, N/2 more, bit for bit. Also the save schedule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/backend/backend.h"
#include "worker/train.h"

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

static void run(mega_jobspec *j, int iters, mega_step_report *out, int64_t *first_it,
                bool expect_resume) {
  mega_err err = {0};
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_trainer *t;
  bool resumed;
  if (mega_trainer_create(j, be, NULL, &t, &resumed, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(resumed, expect_resume);
  *first_it = mega_trainer_iteration(t);
  for (int i = 0; i < iters; i++)
    if (mega_trainer_step(t, &out[i], &err) != MEGA_OK) fail_msg("%s", err.msg);
  if (j->save) assert_int_equal(mega_trainer_save(t, &err), MEGA_OK);
  mega_trainer_destroy(t);
  mega_backend_destroy(be);
}

static void test_resume_bit_exact(void **state) {
  (void)state;
  mega_step_report straight[N], split[N];
  int64_t it0;
  mega_jobspec j;
  job_init(&j);
  run(&j, N, straight, &it0, false);
  assert_int_equal(it0, 0);
  assert_true(straight[N - 1].loss < straight[0].loss);
  assert_true(straight[2].clip_coef < 1.0);

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
  mega_err err = {0};
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_trainer *t;
  assert_int_equal(mega_trainer_create(&j, be, NULL, &t, NULL, &err), MEGA_OK);
  bool due[7] = {0};
  for (int i = 1; i <= 6; i++) {
    assert_int_equal(mega_trainer_step(t, NULL, &err), MEGA_OK);
    due[i] = mega_trainer_save_due(t);
  }
  assert_false(due[1] || due[2] || due[3] || due[5]);
  assert_true(due[4]);
  assert_true(due[6]); /* the last iteration */
  mega_trainer_destroy(t);
  mega_backend_destroy(be);
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
