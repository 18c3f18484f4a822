/* The rule for which communicator carries what (worker/rank/rank_comm.c), proven
 * on CPU: a cuda rank moves device tensors on NCCL and host memory on Gloo,
 * and here both are Gloo, but with env.check_comm_memory every rank builds
 * the two apart and each checks every buffer it is given against the cpu
 * backend's live allocations. So a call site that would hand NCCL host
 * memory fails here. Jobs run as threads meeting through a FileStore, once
 * plain and once checked, and must give the same losses and norms to the
 * bit. The first tests show the check itself catches a misrouted buffer. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/backend/backend.h"
#include "worker/comm/comm_check.h"
#include "worker/rank/rank.h"

#define WORLD 4
#define ITERS 3

static char dir[256], data[512];

/* ---- the check itself ---- */

static void test_cpu_backend_owns(void **state) {
  (void)state;
  mega_backend_cpu_opts o = {.threads = 1, .track_memory = true};
  mega_backend *be;
  mega_err err = {0};
  assert_int_equal(mega_backend_cpu_create(&o, &be, &err), MEGA_OK);
  float *a = NULL, *b = NULL;
  assert_int_equal(be->ops->alloc(be, 100 * sizeof(float), (void **)&a, &err), MEGA_OK);
  assert_int_equal(be->ops->alloc(be, 10 * sizeof(float), (void **)&b, &err), MEGA_OK);
  double host[4];
  assert_true(mega_backend_cpu_owns(be, a, 100 * sizeof(float)));
  assert_true(mega_backend_cpu_owns(be, a + 50, 50 * sizeof(float)));
  assert_false(mega_backend_cpu_owns(be, a + 50, 51 * sizeof(float))); /* runs past its end */
  assert_true(mega_backend_cpu_owns(be, b, sizeof(float)));
  assert_false(mega_backend_cpu_owns(be, host, sizeof host));
  be->ops->free(be, b);
  assert_false(mega_backend_cpu_owns(be, b, sizeof(float)));
  be->ops->free(be, a);
  mega_backend_destroy(be);
}

typedef struct pair_arg {
  const char *rdv;
  int rank;
  mega_backend *be;
  mega_status host_on_dev, dev_on_dev, host_on_host;
  char why[512];
} pair_arg;

static bool owned(void *be, const void *p, size_t n) { return mega_backend_cpu_owns(be, p, n); }

static void *pair_main(void *arg) {
  pair_arg *a = arg;
  mega_err err = {0};
  mega_store *store = NULL;
  mega_comm *g = NULL, *d = NULL;
  mega_status st = mega_store_open_file(a->rdv, "check", &store, &err);
  if (st == MEGA_OK) st = mega_comm_create(store, "g", a->rank, 2, NULL, 20000, &g, &err);
  if (st == MEGA_OK) st = mega_comm_check_wrap(g, owned, a->be, "device memory", &d, &err);
  mega_store_close(store);
  float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, *dev = NULL;
  if (st == MEGA_OK) st = a->be->ops->alloc(a->be, sizeof host, (void **)&dev, &err);
  if (st != MEGA_OK) {
    a->dev_on_dev = st;
    snprintf(a->why, sizeof a->why, "%s", err.msg);
  } else {
    a->host_on_dev = mega_comm_all_reduce(d, host, 8, 0, &err);
    snprintf(a->why, sizeof a->why, "%s", err.msg);
    a->dev_on_dev = mega_comm_all_reduce(d, dev, 8, 0, &err);
  }
  a->be->ops->free(a->be, dev);
  mega_comm_destroy(d);
  return NULL;
}

static void test_check_refuses_host_memory(void **state) {
  (void)state;
  char rdv[600];
  snprintf(rdv, sizeof rdv, "%s/rdv-pair", dir);
  assert_int_equal(mkdir(rdv, 0755), 0);
  mega_backend_cpu_opts o = {.threads = 1, .track_memory = true};
  pair_arg a[2];
  pthread_t t[2];
  mega_err err = {0};
  for (int k = 0; k < 2; k++) {
    a[k] = (pair_arg){.rdv = rdv, .rank = k};
    assert_int_equal(mega_backend_cpu_create(&o, &a[k].be, &err), MEGA_OK);
    assert_int_equal(pthread_create(&t[k], NULL, pair_main, &a[k]), 0);
  }
  for (int k = 0; k < 2; k++) {
    pthread_join(t[k], NULL);
    assert_int_equal(a[k].host_on_dev, MEGA_ERR_INTERNAL);
    assert_non_null(strstr(a[k].why, "not device memory"));
    assert_int_equal(a[k].dev_on_dev, MEGA_OK);
    mega_backend_destroy(a[k].be);
  }
}

/* ---- jobs, plain and checked ---- */

typedef struct shared {
  const mega_jobspec *job;
  char rdv[600];
  bool check;
  double loss[ITERS], norm[WORLD][ITERS];
  mega_status st[WORLD];
  mega_err err[WORLD];
} shared;

typedef struct rank_arg {
  shared *sh;
  int rank;
} rank_arg;

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  shared *sh = a->sh;
  mega_rank_env env = {.job = sh->job, .rank = a->rank, .world_size = WORLD,
                       .store_dir = sh->rdv, .kv_prefix = "comm-test", .kv_timeout_ms = 30000,
                       .device = -1, .check_comm_memory = sh->check};
  mega_rank *r = NULL;
  mega_err err = {0};
  mega_status st = mega_rank_create(&env, &r, &err);
  if (st == MEGA_OK) st = mega_rank_setup(r, &err);
  for (int i = 0; i < ITERS && st == MEGA_OK; i++) {
    mega_rank_metrics m;
    st = mega_rank_step(r, &m, &err);
    if (st == MEGA_OK && m.has_loss && m.dp_rank == 0 && m.tp_rank == 0) sh->loss[i] = m.loss;
    if (st == MEGA_OK) sh->norm[a->rank][i] = m.grad_norm;
  }
  if (st == MEGA_OK && sh->job->save) st = mega_rank_save(r, &err);
  if (st == MEGA_OK) st = mega_rank_save_wait(r, &err);
  if (st != MEGA_OK && r) mega_rank_abort(r, "a check failed");
  mega_rank_destroy(r);
  sh->st[a->rank] = st;
  sh->err[a->rank] = err;
  return NULL;
}

static void run_job(shared *sh, const char *tag) {
  snprintf(sh->rdv, sizeof sh->rdv, "%s/rdv-%s-%d", dir, tag, sh->check);
  assert_int_equal(mkdir(sh->rdv, 0755), 0);
  pthread_t t[WORLD];
  rank_arg a[WORLD];
  for (int k = 0; k < WORLD; k++) {
    a[k] = (rank_arg){.sh = sh, .rank = k};
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &a[k]), 0);
  }
  for (int k = 0; k < WORLD; k++) pthread_join(t[k], NULL);
  for (int k = 0; k < WORLD; k++)
    if (sh->st[k] != MEGA_OK) fail_msg("%s, rank %d: %s", tag, k, sh->err[k].msg);
}

/* argv: the parallel layout and features; --save under dir/tag. */
static void job_init(mega_jobspec *j, const char *tag, int argc, const char *const *argv) {
  mega_jobspec_defaults(j);
  j->num_layers = 4;
  j->hidden_size = 16;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 8;
  j->train_iters = ITERS;
  j->lr = 1e-2;
  char save[600];
  snprintf(save, sizeof save, "%s/save-%s", dir, tag);
  char *args[32];
  int n = 0;
  args[n++] = "--data-path";
  args[n++] = data;
  for (int i = 0; i < argc; i++) args[n++] = (char *)argv[i];
  mega_err err = {0};
  if (mega_jobspec_parse(j, n, args, &err) != MEGA_OK) fail_msg("%s", err.msg);
  j->save = strdup(save);
  if (mega_jobspec_check_all(j, WORLD, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

static void same_run(const char *tag, int argc, const char *const *argv) {
  mega_jobspec j;
  job_init(&j, tag, argc, argv);
  shared plain = {.job = &j}, checked = {.job = &j, .check = true};
  run_job(&plain, tag);
  /* the checked run saves into the same directory: a later iteration's
   * checkpoint beside the first is fine */
  run_job(&checked, tag);
  for (int i = 0; i < ITERS; i++) {
    assert_true(plain.loss[i] > 0);
    if (plain.loss[i] != checked.loss[i])
      fail_msg("%s: iteration %d's loss %.9g plain, %.9g checked", tag, i + 1, plain.loss[i],
               checked.loss[i]);
    for (int k = 0; k < WORLD; k++)
      if (plain.norm[k][i] != checked.norm[k][i])
        fail_msg("%s: rank %d's grad norm at %d differs", tag, k, i + 1);
  }
  mega_jobspec_free(&j);
}

/* PP and DP: activations, buckets and the distributed optimizer's shards
 * on the device side; shape messages, loss sums, norm pieces, the moments'
 * gather and the writers' group on the host side. */
static void test_pp_dp_routing(void **state) {
  (void)state;
  const char *argv[] = {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer",
                        "--overlap-grad-reduce", "--variable-seq-lengths"};
  same_run("ppdp", 5, argv);
}

/* TP (sequence parallel) and PP: the model's collectives and the layernorm
 * gradients on the device side; the checkpoint's slices on the host side. */
static void test_tp_pp_routing(void **state) {
  (void)state;
  const char *argv[] = {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                        "2", "--sequence-parallel"};
  same_run("tppp", 5, argv);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "rankcomm");
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
      cmocka_unit_test(test_cpu_backend_owns),
      cmocka_unit_test(test_check_refuses_host_memory),
      cmocka_unit_test(test_pp_dp_routing),
      cmocka_unit_test(test_tp_pp_routing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
