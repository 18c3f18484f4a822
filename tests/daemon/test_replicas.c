/* The replica plan (daemon/model/replicas.h): which held ranks of an ended
 * attempt the next one takes its state from, or why it goes back to the
 * checkpoint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/model/replicas.h"

#define MAXD 16

typedef struct fixture {
  Mega__V1__RankHeld held[MAXD];
  uint32_t shards[MAXD][2];
  mega_replica_donor d[MAXD];
  size_t n;
  char addr[MAXD][32];
} fixture;

/* A held rank: (pp, tp, dp) at iteration; shards NULL: every moment. */
static void add(fixture *f, uint32_t rank, uint32_t pp, uint32_t tp, uint32_t dp, uint64_t it,
                bool all_params, int s0, int s1) {
  Mega__V1__RankHeld *h = &f->held[f->n];
  mega__v1__rank_held__init(h);
  h->iteration = it;
  h->pp = pp;
  h->tp = tp;
  h->dp = dp;
  h->all_params = all_params;
  h->full_moments = s0 < 0;
  size_t ns = 0;
  if (s0 >= 0) f->shards[f->n][ns++] = (uint32_t)s0;
  if (s1 >= 0) f->shards[f->n][ns++] = (uint32_t)s1;
  h->shards = f->shards[f->n];
  h->n_shards = ns;
  snprintf(f->addr[f->n], sizeof f->addr[f->n], "127.0.0.1:%u", 5000 + rank);
  h->address = f->addr[f->n];
  f->d[f->n] = (mega_replica_donor){.rank = rank, .node_id = "n", .held = h};
  f->n++;
}

static Mega__V1__ReplicaPlan *plan(const fixture *f, uint32_t tp, uint32_t pp, uint32_t dp,
                                   bool dist, uint64_t ckpt, char *why) {
  mega_replicas_in in = {.attempt = 3, .tp = tp, .pp = pp, .dp = dp, .distributed = dist,
                         .donors = f->d, .ndonors = f->n, .ckpt_iteration = ckpt};
  Mega__V1__ReplicaPlan *p = NULL;
  mega_err err = {0};
  assert_int_equal(mega_replicas_plan(&in, &p, why, 400, &err), MEGA_OK);
  return p;
}

/* As plan, for an attempt that took the replicas' state of iteration floor. */
static Mega__V1__ReplicaPlan *plan_above(const fixture *f, uint32_t pp, uint32_t dp,
                                         uint64_t floor, char *why) {
  mega_replicas_in in = {.attempt = 3, .tp = 1, .pp = pp, .dp = dp, .donors = f->d,
                         .ndonors = f->n, .floor = floor};
  Mega__V1__ReplicaPlan *p = NULL;
  mega_err err = {0};
  assert_int_equal(mega_replicas_plan(&in, &p, why, 400, &err), MEGA_OK);
  return p;
}

static const Mega__V1__ReplicaSource *source_for(const Mega__V1__ReplicaPlan *p, uint32_t rank) {
  for (size_t i = 0; i < p->n_sources; i++)
    if (p->sources[i]->donor_rank == rank) return p->sources[i];
  return NULL;
}

/* PP 2 x DP 2, rank 1 (pp 0, dp 1) lost: each stage from a survivor. */
static void test_shrink_plain(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 12, true, -1, -1);
  add(&f, 2, 1, 0, 0, 12, true, -1, -1);
  add(&f, 3, 1, 0, 1, 12, true, -1, -1);
  char why[400];
  Mega__V1__ReplicaPlan *p = plan(&f, 1, 2, 2, false, 10, why);
  assert_non_null(p);
  assert_int_equal(p->iteration, 12);
  assert_int_equal(p->attempt, 3);
  assert_int_equal(p->dp_size, 2);
  assert_int_equal(p->n_sources, 2);
  const Mega__V1__ReplicaSource *s0 = source_for(p, 0);
  assert_non_null(s0);
  assert_true(s0->params && s0->full_moments);
  assert_int_equal(s0->pp, 0);
  assert_string_equal(s0->address, "127.0.0.1:5000");
  /* stage 1 has two donors: one serves */
  assert_true(source_for(p, 2) || source_for(p, 3));
  const char *ids[4];
  assert_int_equal(mega_replicas_plan_nodes(p, ids, 4), 1);
  mega_replicas_plan_free(p);
}

/* A stage with no survivor: back to the checkpoint, saying which. */
static void test_lost_stage(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 2, 1, 0, 0, 12, true, -1, -1);
  add(&f, 3, 1, 0, 1, 12, true, -1, -1);
  char why[400];
  assert_null(plan(&f, 1, 2, 2, false, 10, why));
  assert_string_equal(why, "no replica of pipeline stage 0 holds iteration 12");
}

static void test_nothing_held_and_dp1(void **state) {
  (void)state;
  fixture f = {0};
  char why[400];
  assert_null(plan(&f, 1, 2, 2, false, 0, why));
  assert_string_equal(why, "no rank kept its state");
  add(&f, 1, 1, 0, 0, 7, true, -1, -1);
  assert_null(plan(&f, 1, 2, 1, false, 0, why));
  assert_non_null(strstr(why, "DP is 1, so no stage has a replica"));
  assert_non_null(strstr(why, "pipeline stage 0"));
}

/* Ranks that took one more step than their peers: the newest iteration
 * every coordinate has wins; a coordinate that only has the older one
 * makes the plan use it everywhere. */
static void test_newest_common_iteration(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 13, true, -1, -1);
  add(&f, 2, 1, 0, 0, 13, true, -1, -1);
  add(&f, 3, 1, 0, 1, 12, true, -1, -1);
  char why[400];
  Mega__V1__ReplicaPlan *p = plan(&f, 1, 2, 2, false, 0, why);
  assert_non_null(p);
  assert_int_equal(p->iteration, 13);
  assert_non_null(source_for(p, 2));
  mega_replicas_plan_free(p);

  fixture g = {0};
  add(&g, 0, 0, 0, 0, 12, true, -1, -1);
  add(&g, 1, 0, 0, 1, 13, true, -1, -1);
  add(&g, 3, 1, 0, 1, 12, true, -1, -1);
  p = plan(&g, 1, 2, 2, false, 0, why);
  assert_non_null(p);
  assert_int_equal(p->iteration, 12);
  assert_non_null(source_for(p, 0));
  assert_non_null(source_for(p, 3));
  mega_replicas_plan_free(p);

  fixture h = {0};
  add(&h, 0, 0, 0, 0, 12, true, -1, -1);
  add(&h, 3, 1, 0, 1, 13, true, -1, -1);
  assert_null(plan(&h, 1, 2, 2, false, 0, why));
  assert_string_equal(why, "no replica of pipeline stage 0 holds iteration 13");
}

/* Distributed optimizer, DP 2, each rank holding its shard and its
 * neighbour's: dp 0 alone covers its stage. */
static void test_distributed_copy_covers(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 20, true, 0, 1);
  add(&f, 2, 1, 0, 0, 20, true, 0, 1);
  add(&f, 3, 1, 0, 1, 20, true, 1, 0);
  char why[400];
  Mega__V1__ReplicaPlan *p = plan(&f, 1, 2, 2, true, 0, why);
  assert_non_null(p);
  const Mega__V1__ReplicaSource *s = source_for(p, 0);
  assert_non_null(s);
  assert_true(s->params);
  assert_false(s->full_moments);
  assert_false(s->shard_params);
  assert_int_equal(s->n_shards, 2);
  /* stage 1: its params donor also takes both shards (one connection) */
  size_t n1 = 0;
  for (size_t i = 0; i < p->n_sources; i++) n1 += p->sources[i]->pp == 1;
  assert_int_equal(n1, 1);
  mega_replicas_plan_free(p);
}

/* A shard whose owner and copy are both gone; and, when no rank has every
 * parameter whole (each failed after its own step), the parameters come
 * shard by shard. */
static void test_distributed_lost_shard_and_torn(void **state) {
  (void)state;
  fixture f = {0};
  /* DP 4, shift 1: rank d holds d and d-1; ranks 1 and 2 lost: shard 1 is
   * gone (owner 1, copy on 2) */
  add(&f, 0, 0, 0, 0, 5, true, 0, 3);
  add(&f, 3, 0, 0, 3, 5, true, 3, 2);
  char why[400];
  assert_null(plan(&f, 1, 1, 4, true, 0, why));
  assert_non_null(strstr(why, "shard 1 of pipeline stage 0's optimizer state at iteration 5"));

  fixture g = {0};
  add(&g, 0, 0, 0, 0, 6, false, 0, 1);
  add(&g, 1, 0, 0, 1, 6, false, 1, 0);
  Mega__V1__ReplicaPlan *p = plan(&g, 1, 1, 2, true, 0, why);
  assert_non_null(p);
  for (size_t i = 0; i < p->n_sources; i++) {
    assert_false(p->sources[i]->params);
    assert_true(p->sources[i]->shard_params);
  }
  size_t shards = 0;
  for (size_t i = 0; i < p->n_sources; i++) shards += p->sources[i]->n_shards;
  assert_int_equal(shards, 2);
  mega_replicas_plan_free(p);
}

/* TP 2: each tensor rank of a stage from a donor of its own tensor rank. */
static void test_tensor_parallel(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 9, true, -1, -1);
  add(&f, 1, 0, 1, 0, 9, true, -1, -1);
  char why[400];
  assert_null(plan(&f, 2, 2, 2, false, 0, why)); /* stage 1 lost */
  assert_string_equal(why, "no replica of pipeline stage 1, tensor rank 0 holds iteration 9");
  add(&f, 6, 1, 0, 1, 9, true, -1, -1);
  add(&f, 7, 1, 1, 1, 9, true, -1, -1);
  Mega__V1__ReplicaPlan *p = plan(&f, 2, 2, 2, false, 0, why);
  assert_non_null(p);
  assert_int_equal(p->n_sources, 4);
  assert_int_equal(source_for(p, 7)->tp, 1);
  mega_replicas_plan_free(p);
}

/* A committed checkpoint newer than every replica: the checkpoint. */
static void test_checkpoint_newer(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 9, true, -1, -1);
  char why[400];
  assert_null(plan(&f, 1, 1, 2, false, 10, why));
  assert_string_equal(why, "the checkpoint of iteration 10 is newer than the replicas' state");
}

/* An attempt that was taking the replicas' state of iteration 165 ended
 * before its ranks had it: what they hold (iteration 0, their fresh
 * buffers) is nothing of the run, and no plan goes back to it. */
static void test_ranks_without_their_state(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 0, true, -1, -1);
  add(&f, 1, 1, 0, 0, 0, true, -1, -1);
  char why[400];
  assert_null(plan_above(&f, 2, 2, 165, why));
  assert_non_null(strstr(why, "no rank of attempt 3 had its state yet"));
  assert_non_null(strstr(why, "iteration 165"));
  /* those that had it cover the job from where they got it, or later */
  add(&f, 2, 0, 0, 1, 165, true, -1, -1);
  add(&f, 3, 1, 0, 1, 165, true, -1, -1);
  Mega__V1__ReplicaPlan *p = plan_above(&f, 2, 2, 165, why);
  assert_non_null(p);
  assert_int_equal(p->iteration, 165);
  assert_null(source_for(p, 0));
  assert_null(source_for(p, 1));
  mega_replicas_plan_free(p);
}

/* After an upgrade of the coordinator (a rolling upgrade): ranks of
 * another build are no donors, since a job's ranks run one build. */
static void test_other_build_gives_nothing(void **state) {
  (void)state;
  fixture f = {0};
  add(&f, 0, 0, 0, 0, 12, true, -1, -1);
  add(&f, 1, 0, 0, 1, 12, true, -1, -1);
  add(&f, 2, 1, 0, 0, 12, true, -1, -1);
  add(&f, 3, 1, 0, 1, 12, true, -1, -1);
  for (size_t i = 0; i < f.n; i++) f.d[i].version = "0.2+new";
  f.d[0].node_id = f.d[2].node_id = "old";
  f.d[0].version = f.d[2].version = "0.1";
  mega_replicas_in in = {.attempt = 3, .tp = 1, .pp = 2, .dp = 2, .donors = f.d,
                         .ndonors = f.n, .version = "0.2+new"};
  Mega__V1__ReplicaPlan *p = NULL;
  mega_err err = {0};
  char why[400];
  assert_int_equal(mega_replicas_plan(&in, &p, why, sizeof why, &err), MEGA_OK);
  assert_non_null(p); /* from the new build's ranks 1 and 3 alone */
  for (size_t i = 0; i < p->n_sources; i++)
    assert_true(p->sources[i]->donor_rank == 1 || p->sources[i]->donor_rank == 3);
  mega_replicas_plan_free(p);
  f.d[3].version = NULL; /* not known: none either */
  assert_int_equal(mega_replicas_plan(&in, &p, why, sizeof why, &err), MEGA_OK);
  assert_null(p);
  assert_string_equal(why, "no replica of pipeline stage 1 holds iteration 12 (node old's "
                           "ranks, which ran another build of mega, are no donors)");
  f.d[1].version = "0.1";
  in.ndonors = 2;
  assert_int_equal(mega_replicas_plan(&in, &p, why, sizeof why, &err), MEGA_OK);
  assert_null(p);
  assert_string_equal(why, "the ranks that kept it ran another build of mega (node old: 0.1, "
                           "not 0.2+new), and a job's ranks run one build");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shrink_plain),
      cmocka_unit_test(test_lost_stage),
      cmocka_unit_test(test_nothing_held_and_dp1),
      cmocka_unit_test(test_newest_common_iteration),
      cmocka_unit_test(test_distributed_copy_covers),
      cmocka_unit_test(test_distributed_lost_shard_and_torn),
      cmocka_unit_test(test_tensor_parallel),
      cmocka_unit_test(test_checkpoint_newer),
      cmocka_unit_test(test_ranks_without_their_state),
      cmocka_unit_test(test_other_build_gives_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
