/* Resume exactness: N iterations straight equal N/2, save, a new rank
 * loading the checkpoint, N/2 more, bit for bit, evaluation included. Also
 * the save schedule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/optim/lr_sched.h"
#include "worker/rank/rank.h"
#include "worker/rank/rank_saver.h"

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
  if (mega_jobspec_parse(j, 2, (char *const[]){"--data-path", (char *)data}, NULL) != MEGA_OK)
    fail_msg("--data-path %s", data);
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
  if (j->save) {
    if (mega_rank_save(r, &err) != MEGA_OK) fail_msg("save: %s", err.msg);
    if (mega_rank_save_wait(r, &err) != MEGA_OK) fail_msg("save: %s", err.msg);
  }
  mega_rank_destroy(r);
}

static void assert_same_steps(const mega_rank_metrics *a, const mega_rank_metrics *b, int n) {
  for (int i = 0; i < n; i++) {
    assert_int_equal(a[i].iteration, b[i].iteration);
    assert_memory_equal(&a[i].loss, &b[i].loss, sizeof(double));
    assert_memory_equal(&a[i].grad_norm, &b[i].grad_norm, sizeof(double));
    assert_memory_equal(&a[i].lr, &b[i].lr, sizeof(double));
  }
}

/* Byte-for-byte equality of one file in two checkpoint directories. */
static void assert_same_file(const char *d1, const char *d2, const char *name) {
  char p1[700], p2[700];
  snprintf(p1, sizeof p1, "%s/%s", d1, name);
  snprintf(p2, sizeof p2, "%s/%s", d2, name);
  FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
  assert_non_null(f1);
  assert_non_null(f2);
  int c1, c2;
  long at = 0;
  do {
    c1 = fgetc(f1);
    c2 = fgetc(f2);
    if (c1 != c2) fail_msg("%s and %s differ at byte %ld", p1, p2, at);
    at++;
  } while (c1 != EOF);
  fclose(f1);
  fclose(f2);
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
  j.no_load_rng = true; /* accepted, and nothing to skip: still bit for bit */
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

/* A checkpoint's trainer_state.json without key, as an older mega wrote
 * it, the manifest's entry updated so that the directory stays complete. */
static void drop_state_key(const char *it_dir, const char *key) {
  char p[800];
  snprintf(p, sizeof p, "%s/trainer_state.json", it_dir);
  json_error_t je;
  json_t *st = json_load_file(p, 0, &je);
  assert_non_null(st);
  assert_int_equal(json_object_del(st, key), 0);
  assert_int_equal(json_dump_file(st, p, JSON_INDENT(2)), 0);
  json_decref(st);
  uint64_t size;
  uint32_t crc;
  mega_err err = {0};
  if (mega_ckpt_file_sum(p, &size, &crc, &err) != MEGA_OK) fail_msg("%s", err.msg);
  char mp[800];
  snprintf(mp, sizeof mp, "%s/manifest.json", it_dir);
  json_t *man = json_load_file(mp, 0, &je);
  assert_non_null(man);
  json_t *e = json_object_get(json_object_get(man, "files"), "trainer_state.json");
  assert_non_null(e);
  json_object_set_new(e, "size", json_integer((json_int_t)size));
  json_object_set_new(e, "crc32", json_integer((json_int_t)crc));
  assert_int_equal(json_dump_file(man, mp, JSON_INDENT(2)), 0);
  json_decref(man);
}

/* Evaluation after a resume reads the windows the uninterrupted run's
 * would: the checkpoint records the batches evaluated (Megatron's
 * consumed_valid_samples); one without the record takes Megatron's
 * fallback, --eval-iters batches every --eval-interval iterations. A
 * resumed run that evaluated from batch 0 again reported iteration 4's
 * evaluation on iteration 2's windows. */
static void test_resume_evaluation(void **state) {
  (void)state;
  char sdir[600], it3[700];
  snprintf(sdir, sizeof sdir, "%s/ckpt_eval", dir);
  mega_ckpt_iter_path(it3, sizeof it3, sdir, N / 2);
  mega_rank_metrics straight[N], split[N];
  int64_t it0;
  mega_jobspec j;
  job_init(&j);
  j.eval_interval = 2;
  j.eval_iters = 1;
  run(&j, N, straight, &it0, false);
  for (int i = 0; i < N; i++) assert_int_equal(straight[i].has_eval_loss, (i + 1) % 2 == 0);
  /* each evaluation reads other windows, so reading the wrong ones shows */
  assert_true(straight[1].eval_loss != straight[3].eval_loss);
  assert_true(straight[3].eval_loss != straight[5].eval_loss);

  j.save = strdup(sdir);
  run(&j, N / 2, split, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(sdir);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) drop_state_key(it3, "consumed_valid_samples");
    run(&j, N / 2, split + N / 2, &it0, true);
    assert_int_equal(it0, N / 2);
    assert_same_steps(split, straight, N);
    for (int i = 0; i < N; i++) {
      assert_int_equal(split[i].has_eval_loss, straight[i].has_eval_loss);
      assert_memory_equal(&split[i].eval_loss, &straight[i].eval_loss, sizeof(double));
    }
  }
  mega_jobspec_free(&j);
}

/* Exactly iterations 4 and 6 of 6 were saved in sdir. */
static void assert_saved_4_and_6(const char *sdir) {
  char p[700];
  for (int i = 1; i <= 6; i++) {
    mega_ckpt_iter_path(p, sizeof p, sdir, i);
    assert_int_equal(access(p, F_OK) == 0, i == 4 || i == 6);
  }
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
  assert_saved_4_and_6(sdir);
  mega_jobspec_free(&j);
}

/* A --train-samples job (Megatron's sample-based training, no
 * --train-iters) saves its last iteration and stops at --exit-interval like
 * an iteration-based one: 48 samples of 8 are 6 iterations. */
static void test_save_schedule_by_samples(void **state) {
  (void)state;
  char sdir[600];
  snprintf(sdir, sizeof sdir, "%s/by-samples", dir);
  mega_jobspec j;
  job_init(&j);
  j.train_iters = -1;
  j.train_samples = 6 * 8;
  j.lr_warmup_iters = 0;
  j.lr_warmup_samples = 16;
  j.save = strdup(sdir);
  mega_err err = {0};
  if (mega_jobspec_check(&j, 1, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(mega_jobspec_train_iters(&j), 6);
  for (int i = 1; i <= 6; i++) assert_int_equal(mega_rank_ckpt_due(&j, i), i == 6);

  j.exit_interval = 4;
  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
  if (mega_rank_run(r, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(mega_rank_iteration(r), 4);
  assert_non_null(mega_rank_stopped(r));
  assert_non_null(strstr(mega_rank_stopped(r), "--exit-interval 4"));
  mega_rank_destroy(r);

  /* resumed without the stop: on to the last iteration, which is saved */
  j.exit_interval = 0;
  j.load = strdup(sdir);
  assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
  if (mega_rank_run(r, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(mega_rank_iteration(r), 6);
  assert_null(mega_rank_stopped(r));
  mega_rank_destroy(r);
  assert_saved_4_and_6(sdir);
  mega_jobspec_free(&j);
}

/* --async-save writes the same bytes as a synchronous save, and resuming
 * from it is the same run. */
static void test_async_bit_identical(void **state) {
  (void)state;
  char sync_dir[600], async_dir[600];
  snprintf(sync_dir, sizeof sync_dir, "%s/sync", dir);
  snprintf(async_dir, sizeof async_dir, "%s/async", dir);
  mega_rank_metrics straight[N], a[N], b[N];
  int64_t it0;
  mega_jobspec j;
  job_init(&j);
  run(&j, N, straight, &it0, false);
  j.save = strdup(sync_dir);
  run(&j, N / 2, a, &it0, false);
  free(j.save);
  j.save = strdup(async_dir);
  j.async_save = true;
  run(&j, N / 2, b, &it0, false);
  char d1[700], d2[700];
  mega_ckpt_iter_path(d1, sizeof d1, sync_dir, N / 2);
  mega_ckpt_iter_path(d2, sizeof d2, async_dir, N / 2);
  assert_same_file(d1, d2, "model.safetensors");
  assert_same_file(d1, d2, "optimizer.safetensors");
  assert_same_file(d1, d2, "config.json");
  free(j.save);
  j.save = NULL;
  j.async_save = false;
  j.load = strdup(async_dir);
  run(&j, N / 2, b + N / 2, &it0, true);
  assert_same_steps(b, straight, N);
  mega_jobspec_free(&j);
}

/* What a launcher sees: phases, checkpoint reports and the commit go-ahead. */
typedef struct seen {
  char phases[64][16];
  int64_t phase_it[64];
  int nphases;
  mega_rank_ckpt_report reps[16];
  int nreps;
  int64_t awaited[8];
  int nawaited;
  int64_t refuse; /* await_commit refuses this iteration */
} seen;

static void on_phase(void *arg, const char *phase, int64_t it) {
  seen *s = arg;
  if (s->nphases < 64) {
    snprintf(s->phases[s->nphases], 16, "%s", phase);
    s->phase_it[s->nphases++] = it;
  }
}

static void on_checkpoint(void *arg, const mega_rank_ckpt_report *r) {
  seen *s = arg;
  if (s->nreps < 16) s->reps[s->nreps++] = *r;
}

static mega_status await_commit(void *arg, int64_t it, mega_err *err) {
  seen *s = arg;
  s->awaited[s->nawaited++] = it;
  if (it == s->refuse) return mega_fail(err, MEGA_ERR_CANCELLED, "a newer attempt runs");
  return MEGA_OK;
}

static void test_reports_phases_commit(void **state) {
  (void)state;
  for (int async = 0; async < 2; async++) {
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/reports%d", dir, async);
    mega_jobspec j;
    job_init(&j);
    j.train_iters = 4;
    j.save = strdup(sdir);
    j.save_interval = 2;
    j.async_save = async;
    seen s = {.refuse = 4};
    mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1, .attempt = 2,
                         .on_phase = on_phase, .on_checkpoint = on_checkpoint,
                         .await_commit = await_commit, .arg = &s};
    mega_err err = {0};
    mega_rank *r;
    assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
    if (mega_rank_run(r, &err) != MEGA_OK) fail_msg("%s", err.msg);
    mega_rank_destroy(r);

    /* setup, then train before each step, checkpoint at each save (and
     * while the last write is waited for) */
    static const char *const want[] = {"setup", "train", "train", "checkpoint", "train",
                                       "train", "checkpoint", "checkpoint"};
    static const int64_t want_it[] = {0, 0, 1, 2, 2, 3, 4, 4};
    assert_int_equal(s.nphases, 8);
    for (int i = 0; i < 8; i++) {
      assert_string_equal(s.phases[i], want[i]);
      assert_int_equal(s.phase_it[i], want_it[i]);
    }
    /* iteration 2: durable, then committed; iteration 4: durable, refused */
    assert_int_equal(s.nawaited, 2);
    assert_int_equal(s.awaited[0], 2);
    assert_int_equal(s.awaited[1], 4);
    assert_int_equal(s.nreps, 3);
    assert_int_equal(s.reps[0].iteration, 2);
    assert_false(s.reps[0].committed);
    assert_true(s.reps[0].bytes > 0);
    assert_int_equal(s.reps[1].iteration, 2);
    assert_true(s.reps[1].committed);
    assert_true(s.reps[1].bytes > s.reps[0].bytes); /* the whole checkpoint */
    assert_int_equal(s.reps[2].iteration, 4);
    assert_false(s.reps[2].committed);
    for (int i = 0; i < 3; i++) {
      assert_true(s.reps[i].blocked_s >= 0 && s.reps[i].blocked_s <= s.reps[i].duration_s);
      if (!async) assert_true(s.reps[i].blocked_s == s.reps[i].duration_s);
    }
    char p[700];
    mega_ckpt_iter_path(p, sizeof p, sdir, 4);
    assert_false(tu_exists(p)); /* refused: nothing committed */
    snprintf(p, sizeof p, "%s/.tmp.iter_0000004.a2", sdir);
    assert_false(tu_exists(p)); /* removed with the refusal */
    char *path = NULL;
    assert_int_equal(mega_ckpt_resolve(sdir, &path, NULL, &err), MEGA_OK);
    assert_non_null(strstr(path, "iter_0000002"));
    free(path);
    mega_ckpt_iter_path(p, sizeof p, sdir, 2);
    strcat(p, "/trainer_state.json");
    json_t *ts = json_load_file(p, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(ts, "attempt")), 2);
    json_decref(ts);
    mega_jobspec_free(&j);
  }
}

/* Megatron's scheduler flags: a different LR schedule is refused, unless
 * the job's (override) or the checkpoint's (use-checkpoint) is chosen. */
static void test_scheduler_flags(void **state) {
  (void)state;
  char sdir[600];
  snprintf(sdir, sizeof sdir, "%s/sched", dir);
  mega_rank_metrics straight[N], got[N];
  int64_t it0;
  mega_jobspec j;
  job_init(&j);
  run(&j, N, straight, &it0, false);
  j.save = strdup(sdir);
  run(&j, N / 2, got, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(sdir);
  j.lr = 2e-2; /* not what the checkpoint ran with */

  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  mega_err err = {0};
  assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
  assert_int_equal(mega_rank_setup(r, &err), MEGA_ERR_INVALID);
  mega_rank_destroy(r);
  if (!strstr(err.msg, "--lr 0.01, but this job has 0.02") ||
      !strstr(err.msg, "--override-opt_param-scheduler") ||
      !strstr(err.msg, "--use-checkpoint-opt_param-scheduler"))
    fail_msg("%s", err.msg);

  /* the checkpoint's schedule: the same run as the straight one */
  j.use_checkpoint_opt_param_scheduler = true;
  run(&j, N / 2, got + N / 2, &it0, true);
  assert_same_steps(got, straight, N);

  /* this job's schedule: its LR from the resumed iteration on */
  j.use_checkpoint_opt_param_scheduler = false;
  j.override_opt_param_scheduler = true;
  run(&j, N / 2, got + N / 2, &it0, true);
  mega_lr_sched mine = mega_lr_sched_from_job(&j);
  for (int i = N / 2; i < N; i++) {
    assert_true(got[i].lr == mega_lr_at(&mine, (double)mega_jobspec_samples_before(&j, i)));
    assert_true(got[i].lr != straight[i].lr);
  }
  assert_memory_equal(&got[N / 2].loss, &straight[N / 2].loss, sizeof(double)); /* same weights */
  mega_jobspec_free(&j);
}

/* --finetune loads the weights only (iteration 0, fresh Adam, data from the
 * start); --no-load-optim keeps the iteration and data position but starts
 * Adam fresh. The data here is exactly 3 iterations long, so iteration 3's
 * batch is iteration 0's, and with a constant LR both flags take the same
 * steps on the same weights. */
static void test_finetune_no_load_optim(void **state) {
  (void)state;
  char sdir[600], small[600];
  snprintf(sdir, sizeof sdir, "%s/finetune", dir);
  snprintf(small, sizeof small, "%s/data24.txt", dir);
  tu_write_repetitive(small, 24 * 16 + 1); /* 24 windows of 16: 3 batches of 8 */
  mega_jobspec j;
  job_init(&j);
  assert_int_equal(mega_jobspec_parse(&j, 2, (char *const[]){"--data-path", small}, NULL), MEGA_OK);
  j.lr_decay_style = MEGA_LR_CONSTANT;
  j.lr_warmup_iters = 0;
  j.min_lr = 0;
  mega_rank_metrics straight[N], first[N], ft[2], nlo[3], resumed[3];
  int64_t it0;
  run(&j, N, straight, &it0, false);
  j.save = strdup(sdir);
  run(&j, 3, first, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(sdir);

  j.finetune = true;
  run(&j, 2, ft, &it0, true);
  assert_int_equal(it0, 0);
  assert_int_equal(ft[0].iteration, 1);
  /* iteration 4's weights on iteration 0's batch (= iteration 3's) */
  assert_memory_equal(&ft[0].loss, &straight[3].loss, sizeof(double));
  assert_memory_equal(&ft[0].grad_norm, &straight[3].grad_norm, sizeof(double));

  j.finetune = false;
  j.no_load_optim = true;
  run(&j, 3, nlo, &it0, true);
  assert_int_equal(it0, 3);
  assert_int_equal(nlo[0].iteration, 4);
  assert_memory_equal(&nlo[0].loss, &straight[3].loss, sizeof(double));
  /* fresh Adam: one step like --finetune's, unlike the straight run's */
  assert_memory_equal(&nlo[1].loss, &ft[1].loss, sizeof(double));
  assert_true(nlo[1].loss != straight[4].loss);

  j.no_load_optim = false;
  run(&j, 3, resumed, &it0, true);
  assert_same_steps(resumed, straight + 3, 3);

  /* a checkpoint saved after --no-load-optim has fewer optimizer steps than
   * iterations, and still resumes */
  free(j.save);
  char sdir2[700];
  snprintf(sdir2, sizeof sdir2, "%s/after-nlo", dir);
  j.save = strdup(sdir2);
  j.no_load_optim = true;
  run(&j, 1, nlo, &it0, true);
  free(j.save);
  free(j.load);
  j.save = NULL;
  j.load = strdup(sdir2);
  j.no_load_optim = false;
  run(&j, 1, nlo, &it0, true);
  assert_int_equal(it0, 4);
  mega_jobspec_free(&j);
}

/* A checkpoint whose optimizer.safetensors was deleted by hand: a resume
 * is refused, saying the weights are whole and naming --no-load-optim;
 * --no-load-optim and --finetune load its weights. (With an older complete
 * checkpoint beside it a resume falls back to that one, as for any
 * incomplete checkpoint: test_ckpt_damage.) */
static void test_optimizer_deleted(void **state) {
  (void)state;
  char sdir[600], opt[700];
  snprintf(sdir, sizeof sdir, "%s/no-optim", dir);
  mega_jobspec j;
  job_init(&j);
  mega_rank_metrics m[2];
  int64_t it0;
  j.save = strdup(sdir);
  run(&j, 2, m, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(sdir);
  snprintf(opt, sizeof opt, "%s/iter_0000002/optimizer.safetensors", sdir);
  assert_int_equal(unlink(opt), 0);
  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r = NULL;
  mega_err err = {0};
  mega_status st = mega_rank_create(&env, &r, &err);
  if (st == MEGA_OK) st = mega_rank_setup(r, &err);
  mega_rank_destroy(r);
  assert_int_equal(st, MEGA_ERR_INVALID);
  if (!strstr(err.msg, "optimizer.safetensors is missing") ||
      !strstr(err.msg, "--no-load-optim loads them") || !strstr(err.msg, "iteration 2"))
    fail_msg("%s", err.msg);
  j.no_load_optim = true;
  run(&j, 1, m, &it0, true);
  assert_int_equal(it0, 2);
  j.no_load_optim = false;
  j.finetune = true;
  run(&j, 1, m, &it0, true);
  assert_int_equal(it0, 0);
  mega_jobspec_free(&j);
}

/* --finetune of a Llama at a longer context: RoPE's positions shape no
 * tensor, so the weights load (longer-context fine-tuning, as Megatron
 * allows); GPT-2's wpe has a row per position, so there it is refused. */
static void finetune_longer(bool llama) {
  char sdir[600];
  snprintf(sdir, sizeof sdir, "%s/longer-%s", dir, llama ? "llama" : "gpt2");
  mega_jobspec j;
  job_init(&j);
  char *const arch[] = {"--position-embedding-type", "rope", "--normalization", "RMSNorm",
                        "--swiglu", "--ffn-hidden-size", "32"};
  mega_err err = {0};
  if (llama) {
    assert_int_equal(mega_jobspec_parse(&j, 7, arch, &err), MEGA_OK);
    assert_int_equal(mega_jobspec_check(&j, 1, 4000, &err), MEGA_OK);
  }
  j.save = strdup(sdir);
  mega_rank_metrics m[N];
  int64_t it0;
  run(&j, 2, m, &it0, false);
  free(j.save);
  j.save = NULL;
  j.load = strdup(sdir);
  j.finetune = true;
  j.seq_length = 32;
  assert_int_equal(mega_jobspec_check(&j, 1, 4000, &err), MEGA_OK);
  mega_rank_env env = {.job = &j, .rank = 0, .world_size = 1, .device = -1};
  mega_rank *r;
  assert_int_equal(mega_rank_create(&env, &r, &err), MEGA_OK);
  mega_status st = mega_rank_setup(r, &err);
  if (llama) {
    if (st != MEGA_OK) fail_msg("%s", err.msg);
    assert_non_null(mega_rank_loaded_path(r));
    assert_int_equal(mega_rank_iteration(r), 0);
    assert_int_equal(mega_rank_step(r, &m[0], &err), MEGA_OK);
  } else {
    assert_int_equal(st, MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, "n_positions 16, but this job has --max-position-embeddings"));
  }
  mega_rank_destroy(r);
  if (llama) {
    /* the trained weights, not a fresh start: at the new length they
     * predict the repetitive data better than the initial ones */
    mega_rank_metrics fresh[1];
    j.finetune = false;
    free(j.load);
    j.load = NULL;
    run(&j, 1, fresh, &it0, false);
    assert_true(m[0].loss < fresh[0].loss);
  }
  mega_jobspec_free(&j);
}

static void test_finetune_longer_context(void **state) {
  (void)state;
  finetune_longer(true);
  finetune_longer(false);
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
      cmocka_unit_test(test_resume_evaluation),
      cmocka_unit_test(test_save_schedule),
      cmocka_unit_test(test_save_schedule_by_samples),
      cmocka_unit_test(test_async_bit_identical),
      cmocka_unit_test(test_reports_phases_commit),
      cmocka_unit_test(test_scheduler_flags),
      cmocka_unit_test(test_finetune_no_load_optim),
      cmocka_unit_test(test_optimizer_deleted),
      cmocka_unit_test(test_finetune_longer_context),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
