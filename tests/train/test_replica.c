/* Recovery from replicas through mega_rank, with the ranks as threads
 * meeting through a FileStore. A job runs K iterations at DP 2, saves a
 * checkpoint, and its ranks hold their state and serve it (mega_rank_hold,
 * mega_replica_serve). Then the job goes on at DP 1 twice: once loading
 * the checkpoint, once fetching from the held ranks of data-parallel rank 0
 * alone (as if rank 1 of every stage had died; with the distributed
 * optimizer its shard comes from rank 0's copy). The two continuations
 * must be bit for bit the same: the replicas hand over exactly the state a
 * checkpoint holds. Both stay within the equivalence tolerance of the
 * uninterrupted DP 2 run. A fetch without the right token is refused. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "core/jobspec.h"
#include "worker/rank/rank.h"

#define N 6 /* iterations of the job */
#define K 3 /* where it stops and goes on */
#define MAXW 8
#define RTOL 2e-5 /* tests/engine/pipeline_check.py's */

static char dir[256], data[512];
static int runs;

typedef struct cfg {
  int pp, tp;
  bool dist;
} cfg;

/* One world of ranks. */
typedef struct world {
  const mega_jobspec *job;
  int size, steps;
  char rdv[600];
  bool save, hold;                 /* after the steps: save, then hold and serve */
  const mega_replica_plan *plan;   /* fetch instead of --load */
  double loss[N + 1];              /* by iteration, from the loss rank */
  int64_t first[MAXW];             /* the iteration each rank started from */
  mega_status st[MAXW];
  mega_err err[MAXW];
  /* holding ranks */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nheld;
  mega_rank_held held[MAXW];
  char addr[MAXW][300];
  uint8_t token[MAXW][16];
  bool done;
} world;

typedef struct rank_arg {
  world *w;
  int rank;
} rank_arg;

static bool stop_serving(void *arg) {
  world *w = arg;
  pthread_mutex_lock(&w->mu);
  bool d = w->done;
  pthread_mutex_unlock(&w->mu);
  return d;
}

static mega_status hold_and_serve(world *w, mega_rank *r, int rank, mega_err *err) {
  mega_rank_held h;
  mega_replica_server *srv = NULL;
  mega_status st = mega_rank_hold(r, &h, err);
  if (st == MEGA_OK) st = mega_replica_serve_open(r, &h, NULL, "job-t", 0, &srv, err);
  pthread_mutex_lock(&w->mu);
  if (st == MEGA_OK) {
    w->held[rank] = h;
    snprintf(w->addr[rank], sizeof w->addr[rank], "%s", mega_replica_server_address(srv));
    size_t tl;
    memcpy(w->token[rank], mega_replica_server_token(srv, &tl), 16);
  }
  w->nheld++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (st == MEGA_OK) st = mega_replica_serve(srv, stop_serving, w, 60000, err);
  mega_replica_server_close(srv);
  return st;
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  world *w = a->w;
  mega_rank_env env = {.job = w->job, .rank = a->rank, .world_size = w->size,
                       .store_dir = w->size > 1 ? w->rdv : NULL, .kv_prefix = "replica-test",
                       .kv_timeout_ms = 30000, .device = -1, .attempt = w->plan ? 1 : 0,
                       .replicas = w->plan};
  mega_rank *r = NULL;
  mega_err err = {0};
  mega_status st = mega_rank_create(&env, &r, &err);
  if (st == MEGA_OK) st = mega_rank_setup(r, &err);
  if (st == MEGA_OK) w->first[a->rank] = mega_rank_iteration(r);
  for (int i = 0; i < w->steps && st == MEGA_OK; i++) {
    mega_rank_metrics m;
    st = mega_rank_step(r, &m, &err);
    if (st == MEGA_OK && m.has_loss && m.dp_rank == 0 && m.tp_rank == 0)
      w->loss[m.iteration] = m.loss;
  }
  if (st == MEGA_OK && w->save) st = mega_rank_save(r, &err);
  if (st == MEGA_OK && w->save) st = mega_rank_save_wait(r, &err);
  if (w->hold) {
    if (st != MEGA_OK) { /* still count it, so the main thread does not wait forever */
      pthread_mutex_lock(&w->mu);
      w->nheld++;
      pthread_cond_broadcast(&w->cv);
      pthread_mutex_unlock(&w->mu);
    } else {
      st = hold_and_serve(w, r, a->rank, &err);
    }
  }
  if (st != MEGA_OK && r) mega_rank_abort(r, "a check failed");
  mega_rank_destroy(r);
  w->st[a->rank] = st;
  w->err[a->rank] = err;
  return NULL;
}

static void world_start(world *w, pthread_t *t, rank_arg *a) {
  snprintf(w->rdv, sizeof w->rdv, "%s/rdv-%d", dir, runs++);
  assert_int_equal(mkdir(w->rdv, 0755), 0);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (int k = 0; k < w->size; k++) {
    a[k] = (rank_arg){.w = w, .rank = k};
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &a[k]), 0);
  }
}

static void world_join(world *w, pthread_t *t, bool expect_ok) {
  for (int k = 0; k < w->size; k++) pthread_join(t[k], NULL);
  for (int k = 0; k < w->size && expect_ok; k++)
    if (w->st[k] != MEGA_OK) fail_msg("rank %d: %s", k, w->err[k].msg);
}

static void world_run(world *w, bool expect_ok) {
  pthread_t t[MAXW];
  rank_arg a[MAXW];
  world_start(w, t, a);
  world_join(w, t, expect_ok);
}

static void job_init(mega_jobspec *j, const cfg *c, int nranks, const char *save,
                     const char *load) {
  mega_jobspec_defaults(j);
  j->num_layers = 4;
  j->hidden_size = 16;
  j->num_attention_heads = 2;
  j->seq_length = 16;
  j->micro_batch_size = 2;
  j->global_batch_size = 8;
  j->train_iters = N;
  j->lr = 1e-2;
  j->clip_grad = 0.5;
  j->pipeline_model_parallel_size = c->pp;
  j->tensor_model_parallel_size = c->tp;
  j->use_distributed_optimizer = c->dist;
  if (mega_jobspec_parse(j, 2, (char *const[]){"--data-path", (char *)data}, NULL) != MEGA_OK)
    fail_msg("--data-path %s", data);
  if (save) j->save = strdup(save);
  if (load) j->load = strdup(load);
  mega_err err = {0};
  if (mega_jobspec_check_all(j, nranks, 4000, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

/* The plan a coordinator makes when data-parallel rank 1 of every stage is
 * lost: each (pp, tp) from its dp 0 rank, which holds every parameter and
 * either every moment or shards 0 and 1 (its own and its copy). */
static size_t plan_from_dp0(const world *old, const cfg *c, mega_replica_source *src,
                            int shards[][2], mega_replica_plan *plan) {
  size_t n = 0;
  for (int k = 0; k < old->size; k++) {
    const mega_rank_held *h = &old->held[k];
    if (h->dp != 0) continue;
    assert_true(h->all_params);
    assert_int_equal(h->iteration, K);
    if (c->dist) {
      assert_int_equal(h->nshards, 2); /* its own and the copy of dp 1's */
      assert_false(h->full_moments);
      shards[n][0] = h->shards[0];
      shards[n][1] = h->shards[1];
    } else {
      assert_true(h->full_moments);
    }
    src[n] = (mega_replica_source){.pp = h->pp, .tp = h->tp, .donor_rank = k,
                                   .address = old->addr[k], .token = old->token[k],
                                   .token_len = 16, .params = true,
                                   .full_moments = !c->dist, .shards = c->dist ? shards[n] : NULL,
                                   .nshards = c->dist ? 2 : 0};
    n++;
  }
  *plan = (mega_replica_plan){.job_id = "job-t", .attempt = 0, .iteration = K, .dp_size = 2,
                              .sources = src, .nsources = n};
  return n;
}

static void check_case(const cfg *c) {
  int old_size = c->pp * c->tp * 2, new_size = c->pp * c->tp;
  char save[600];
  snprintf(save, sizeof save, "%s/save-%d", dir, runs);
  mega_jobspec jold, jnew, jload;
  job_init(&jold, c, old_size, save, NULL);
  job_init(&jnew, c, new_size, NULL, NULL);
  job_init(&jload, c, new_size, NULL, save);

  mega_jobspec jref; /* no --save: an uninterrupted DP 2 run */
  job_init(&jref, c, old_size, NULL, NULL);
  world ref = {.job = &jref, .size = old_size, .steps = N};
  world_run(&ref, true);

  /* K iterations at DP 2, a checkpoint, then every rank holds and serves */
  world old = {.job = &jold, .size = old_size, .steps = K, .save = true, .hold = true};
  pthread_t t[MAXW];
  rank_arg a[MAXW];
  world_start(&old, t, a);
  pthread_mutex_lock(&old.mu);
  while (old.nheld < old_size) pthread_cond_wait(&old.cv, &old.mu);
  pthread_mutex_unlock(&old.mu);

  world from_ckpt = {.job = &jload, .size = new_size, .steps = N - K};
  world_run(&from_ckpt, true);

  mega_replica_source src[MAXW];
  int shards[MAXW][2];
  mega_replica_plan plan;
  assert_int_equal(plan_from_dp0(&old, c, src, shards, &plan), (size_t)new_size);
  world from_rep = {.job = &jnew, .size = new_size, .steps = N - K, .plan = &plan};
  world_run(&from_rep, true);

  /* distributed: the same from the two shards' parameters only, dp 1's
   * from dp 0's copy, which steps parameters of its own (grads.h) */
  world from_shards = {.job = &jnew, .size = new_size, .steps = N - K, .plan = &plan};
  mega_replica_source by_shard[MAXW];
  mega_replica_plan shard_plan = plan;
  if (c->dist) {
    memcpy(by_shard, src, sizeof by_shard);
    for (int k = 0; k < new_size; k++) {
      by_shard[k].params = false;
      by_shard[k].shard_params = true;
    }
    shard_plan.sources = by_shard;
    from_shards.plan = &shard_plan;
    world_run(&from_shards, true);
  }

  /* a fetch with another token is refused */
  mega_replica_source bad[MAXW];
  memcpy(bad, src, sizeof bad);
  uint8_t wrong[16] = {0};
  for (int k = 0; k < new_size; k++) bad[k].token = wrong;
  mega_replica_plan bad_plan = plan;
  bad_plan.sources = bad;
  world refused = {.job = &jnew, .size = new_size, .steps = 1, .plan = &bad_plan};
  world_run(&refused, false);
  assert_int_not_equal(refused.st[0], MEGA_OK);
  assert_non_null(strstr(refused.err[0].msg, "the token does not match"));

  pthread_mutex_lock(&old.mu);
  old.done = true;
  pthread_mutex_unlock(&old.mu);
  world_join(&old, t, true);

  for (int k = 0; k < new_size; k++) {
    assert_int_equal(from_rep.first[k], K);
    assert_int_equal(from_ckpt.first[k], K);
  }
  for (int it = K + 1; it <= N; it++) {
    /* the replicas' state is the checkpoint's, bit for bit */
    if (memcmp(&from_rep.loss[it], &from_ckpt.loss[it], sizeof(double)))
      fail_msg("iteration %d: loss %.12g from replicas, %.12g from the checkpoint", it,
               from_rep.loss[it], from_ckpt.loss[it]);
    if (c->dist && memcmp(&from_shards.loss[it], &from_ckpt.loss[it], sizeof(double)))
      fail_msg("iteration %d: loss %.12g from the shards' parameters, %.12g from the "
               "checkpoint", it, from_shards.loss[it], from_ckpt.loss[it]);
    /* and DP 1 from there follows the uninterrupted DP 2 run */
    double want = ref.loss[it];
    if (fabs(from_rep.loss[it] - want) > RTOL * fabs(want))
      fail_msg("iteration %d: loss %.9g after recovery, uninterrupted %.9g", it,
               from_rep.loss[it], want);
  }
  for (int it = 1; it <= K; it++) assert_memory_equal(&old.loss[it], &ref.loss[it], sizeof(double));
  mega_jobspec_free(&jold);
  mega_jobspec_free(&jnew);
  mega_jobspec_free(&jload);
  mega_jobspec_free(&jref);
}

static void test_pp2_dp2_plain(void **state) {
  (void)state;
  check_case(&(cfg){.pp = 2, .tp = 1});
}

static void test_pp2_dp2_distributed(void **state) {
  (void)state;
  check_case(&(cfg){.pp = 2, .tp = 1, .dist = true});
}

static void test_tp2_dp2_distributed(void **state) {
  (void)state;
  check_case(&(cfg){.pp = 1, .tp = 2, .dist = true});
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "replica");
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
      cmocka_unit_test(test_pp2_dp2_plain),
      cmocka_unit_test(test_pp2_dp2_distributed),
      cmocka_unit_test(test_tp2_dp2_distributed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
