/* Checkpoints of a parallel job through mega_rank, with the ranks as
 * threads meeting through a FileStore: PP=2 x DP=2 (ranks 0 and 2 write,
 * rank 0 commits). A synchronous save returns on every rank only once the
 * checkpoint is committed, even while the committer waits for its go-ahead;
 * every rank reports its part; stale temp directories are cleared before
 * anyone writes; with --async-save the commit comes later, from the
 * checkpoint thread, and the run waits for it. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/rank/rank.h"

#define WORLD 4

static char dir[256], data[512];

typedef struct shared {
  const mega_jobspec *job;
  char save[600], rdv[600];
  pthread_mutex_t mu;
  mega_rank_ckpt_report reps[32];
  char rep_path[32][700]; /* a report's path lives only during the call */
  int rep_rank[32];
  int nreps;
  int awaited;
  /* what each rank saw right after mega_rank_save returned */
  bool committed_after_save[WORLD];
  mega_status st[WORLD];
  mega_err err[WORLD];
} shared;

typedef struct rank_arg {
  shared *sh;
  int rank;
} rank_arg;

static void on_checkpoint(void *arg, const mega_rank_ckpt_report *r) {
  rank_arg *a = arg;
  pthread_mutex_lock(&a->sh->mu);
  if (a->sh->nreps < 32) {
    a->sh->rep_rank[a->sh->nreps] = a->rank;
    snprintf(a->sh->rep_path[a->sh->nreps], 700, "%s", r->path);
    a->sh->reps[a->sh->nreps++] = *r;
  }
  pthread_mutex_unlock(&a->sh->mu);
}

/* A slow coordinator: the commit waits a while for its go-ahead. */
static mega_status await_commit(void *arg, int64_t it, mega_err *err) {
  rank_arg *a = arg;
  (void)it;
  (void)err;
  pthread_mutex_lock(&a->sh->mu);
  a->sh->awaited++;
  pthread_mutex_unlock(&a->sh->mu);
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return MEGA_OK;
}

static bool committed(const char *save, int64_t it) {
  char p[700];
  mega_ckpt_iter_path(p, sizeof p, save, it);
  strcat(p, "/" MEGA_CKPT_MANIFEST_FILE);
  char *path = NULL;
  mega_err err = {0};
  bool ok = tu_exists(p) && mega_ckpt_resolve(save, &path, NULL, &err) == MEGA_OK &&
            strstr(path, "iter_0000002") != NULL;
  free(path);
  return ok;
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  shared *sh = a->sh;
  mega_rank_env env = {.job = sh->job, .rank = a->rank, .world_size = WORLD,
                       .store_dir = sh->rdv, .kv_prefix = "ckpt-test", .kv_timeout_ms = 30000,
                       .device = -1, .on_checkpoint = on_checkpoint,
                       .await_commit = await_commit, .arg = a};
  mega_rank *r = NULL;
  mega_err err = {0};
  mega_status st = mega_rank_create(&env, &r, &err);
  if (st == MEGA_OK) st = mega_rank_setup(r, &err);
  mega_rank_metrics m;
  for (int i = 0; i < 2 && st == MEGA_OK; i++) st = mega_rank_step(r, &m, &err);
  if (st == MEGA_OK) st = mega_rank_save(r, &err);
  if (st == MEGA_OK) sh->committed_after_save[a->rank] = committed(sh->save, 2);
  for (int i = 0; i < 2 && st == MEGA_OK; i++) st = mega_rank_step(r, &m, &err);
  if (st == MEGA_OK) st = mega_rank_save_wait(r, &err);
  if (st != MEGA_OK && r) mega_rank_abort(r, "a check failed");
  mega_rank_destroy(r);
  sh->st[a->rank] = st;
  sh->err[a->rank] = err;
  return NULL;
}

static void run_job(shared *sh) {
  pthread_t t[WORLD];
  rank_arg a[WORLD];
  for (int k = 0; k < WORLD; k++) {
    a[k] = (rank_arg){.sh = sh, .rank = k};
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &a[k]), 0);
  }
  for (int k = 0; k < WORLD; k++) pthread_join(t[k], NULL);
  for (int k = 0; k < WORLD; k++)
    if (sh->st[k] != MEGA_OK) fail_msg("rank %d: %s", k, sh->err[k].msg);
}

static void job_init(mega_jobspec *j, const char *save, bool async) {
  mega_jobspec_defaults(j);
  j->num_layers = 4;
  j->hidden_size = 16;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 8;
  j->train_iters = 4;
  j->lr = 1e-2;
  j->pipeline_model_parallel_size = 2;
  if (mega_jobspec_parse(j, 2, (char *const[]){"--data-path", (char *)data}, NULL) != MEGA_OK)
    fail_msg("--data-path %s", data);
  j->save = strdup(save);
  j->async_save = async;
  mega_err err = {0};
  if (mega_jobspec_check_all(j, WORLD, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

static void check_reports(shared *sh) {
  /* one "saved" report per rank (writers 0 and 2 with bytes), one commit */
  int saved[WORLD] = {0}, commits = 0;
  for (int i = 0; i < sh->nreps; i++) {
    const mega_rank_ckpt_report *r = &sh->reps[i];
    assert_int_equal(r->iteration, 2);
    assert_non_null(strstr(sh->rep_path[i], "iter_0000002"));
    if (r->committed) {
      assert_int_equal(sh->rep_rank[i], 0);
      commits++;
      continue;
    }
    int k = sh->rep_rank[i];
    saved[k]++;
    assert_int_equal(r->bytes > 0, k == 0 || k == 2);
  }
  for (int k = 0; k < WORLD; k++) assert_int_equal(saved[k], 1);
  assert_int_equal(commits, 1);
  assert_int_equal(sh->awaited, 1);
}

static void test_sync_save_returns_committed(void **state) {
  (void)state;
  shared sh = {.mu = PTHREAD_MUTEX_INITIALIZER};
  snprintf(sh.save, sizeof sh.save, "%s/sync", dir);
  snprintf(sh.rdv, sizeof sh.rdv, "%s/rdv-sync", dir);
  assert_int_equal(mkdir(sh.rdv, 0755), 0);
  /* an interrupted save of an earlier run, and one of another attempt */
  char p[800];
  snprintf(p, sizeof p, "%s/.tmp.iter_0000002.a0", sh.save);
  assert_int_equal(mkdir(sh.save, 0755), 0);
  assert_int_equal(mkdir(p, 0755), 0);
  strcat(p, "/junk.safetensors");
  tu_write_text(p, "half a shard");
  snprintf(p, sizeof p, "%s/.tmp.iter_0000009.a5", sh.save);
  assert_int_equal(mkdir(p, 0755), 0);

  mega_jobspec j;
  job_init(&j, sh.save, false);
  sh.job = &j;
  run_job(&sh);
  for (int k = 0; k < WORLD; k++)
    if (!sh.committed_after_save[k]) fail_msg("rank %d: save returned before the commit", k);
  check_reports(&sh);
  snprintf(p, sizeof p, "%s/iter_0000002/junk.safetensors", sh.save);
  assert_false(tu_exists(p));
  assert_int_equal(tu_count_prefix(sh.save, ".tmp"), 0);
  char it[700];
  mega_ckpt_iter_path(it, sizeof it, sh.save, 2);
  mega_err err = {0};
  assert_int_equal(mega_ckpt_verify(it, 2, &err), MEGA_OK);
  assert_int_equal(tu_count_prefix(it, "model-0000"), 2); /* one shard per stage */
  mega_jobspec_free(&j);
}

static void test_async_save_commits_later(void **state) {
  (void)state;
  shared sh = {.mu = PTHREAD_MUTEX_INITIALIZER};
  snprintf(sh.save, sizeof sh.save, "%s/async", dir);
  snprintf(sh.rdv, sizeof sh.rdv, "%s/rdv-async", dir);
  assert_int_equal(mkdir(sh.rdv, 0755), 0);
  mega_jobspec j;
  job_init(&j, sh.save, true);
  sh.job = &j;
  run_job(&sh); /* waits for the write before each rank's destroy */
  check_reports(&sh);
  assert_true(committed(sh.save, 2));
  mega_jobspec_free(&j);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "rankckpt");
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
      cmocka_unit_test(test_sync_save_returns_committed),
      cmocka_unit_test(test_async_save_commits_later),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
