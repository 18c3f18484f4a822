/* Recovery from replicas, the fetching side: at setup, a rank of a new
 * attempt takes its state from the held ranks of its (pp, tp) coordinate
 * (mega_rank_env.replicas) instead of --load. Tensors come by index and
 * element offset, so a distributed optimizer's shards cut for the old
 * data-parallel size are put together as whole moments and cut again for
 * this one, as a checkpoint load does (rank_load.c). rank_hold.c serves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "worker/rank/rank_internal.h"
#include "worker/rank/replica_net.h"
#include "worker/rank/replica_recv.h"

#define CONNECT_MS 5000
#define IO_MS 30000

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Everything src has for this rank, on a connection of its own. */
static mega_status fetch_from(mega_rank *r, mega_replica_recv *rv, const mega_replica_plan *plan,
                              const mega_replica_source *src, mega_err *err) {
  int fd;
  mega_status st = mega_net_connect(src->address, CONNECT_MS, IO_MS, &fd, err);
  if (st != MEGA_OK) return st;
  uint32_t shards[8];
  size_t ns = src->nshards;
  if (ns > 8) { /* a rank holds its own shard and one copy */
    close(fd);
    return mega_fail(err, MEGA_ERR_INVALID, "a replica source names %zu shards", ns);
  }
  for (size_t i = 0; i < ns; i++) shards[i] = (uint32_t)src->shards[i];
  Mega__V1__ReplicaRequest q = MEGA__V1__REPLICA_REQUEST__INIT;
  q.token.data = (uint8_t *)src->token;
  q.token.len = src->token_len;
  q.job_id = (char *)plan->job_id;
  q.attempt = (uint32_t)r->env.attempt;
  q.rank = (uint32_t)r->env.rank;
  q.iteration = (uint64_t)plan->iteration;
  q.params = src->params;
  q.full_moments = src->full_moments;
  q.shards = shards;
  q.n_shards = ns;
  q.shard_params = src->shard_params;
  st = mega_frame_write(fd, &q.base, 0, err);
  mega_replica_want want = {.job_id = plan->job_id, .attempt = plan->attempt,
                            .donor_rank = src->donor_rank, .iteration = plan->iteration,
                            .pp = r->me.pp, .tp = r->me.tp};
  if (st == MEGA_OK) st = mega_replica_recv_stream(rv, fd, &want, src->address, err);
  close(fd);
  if (st != MEGA_OK)
    mega_err_prefix(err, "fetching from rank %d of attempt %d at %s", src->donor_rank,
                    plan->attempt, src->address);
  return st;
}

static mega_status fetch_all(mega_rank *r, mega_replica_recv *rv, const mega_replica_plan *plan,
                             mega_err *err) {
  mega_status st = MEGA_OK;
  size_t used = 0;
  for (size_t i = 0; i < plan->nsources && st == MEGA_OK; i++) {
    const mega_replica_source *src = &plan->sources[i];
    if (src->pp != r->me.pp || src->tp != r->me.tp) continue;
    used++;
    st = fetch_from(r, rv, plan, src, err);
  }
  if (st == MEGA_OK && !used)
    return mega_fail(err, MEGA_ERR_INTERNAL, "the replica plan has no source for pp %d, tp %d",
                     r->me.pp, r->me.tp);
  if (st == MEGA_OK) st = mega_replica_recv_whole(rv, err);
  return st;
}

mega_status rank_fetch_replicas(mega_rank *r, mega_err *err) {
  const mega_replica_plan *plan = r->env.replicas;
  double t0 = now_s();
  bool dist = r->job->use_distributed_optimizer;
  rank_whole_moments w = {0};
  mega_status st = MEGA_OK;
  if (dist) {
    st = rank_whole_moments_alloc(r, &w, err);
    if (st == MEGA_OK) mega_chunks_point_moments(&r->chunks, w.avg, w.sq);
  }
  /* after the moments are pointed at: the receiver keeps the views */
  mega_replica_recv rv = {0};
  if (st == MEGA_OK)
    st = mega_replica_recv_init(&rv, r->chunks.ckpt, r->chunks.nparams, r->be, dist, err);
  if (st == MEGA_OK) st = fetch_all(r, &rv, plan, err);
  if (st == MEGA_OK && dist) {
    st = mega_grads_scatter_moments(r->chunks.grads, r->optim, w.avg, w.sq, err);
    if (st == MEGA_OK && r->copy)
      st = mega_grads_scatter_copy_moments(r->chunks.grads, r->copy, w.avg, w.sq, err);
  }
  if (dist) {
    mega_chunks_point_moments(&r->chunks, NULL, NULL);
    rank_whole_moments_free(&w);
  }
  int64_t steps = rv.steps, eval_done = rv.eval_done;
  uint64_t bytes = rv.bytes;
  mega_replica_recv_free(&rv);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "recovering iteration %lld from replicas", (long long)plan->iteration);
    return st;
  }
  mega_optim_set_steps(r->optim, steps);
  if (r->copy) mega_optim_set_steps(r->copy, steps);
  r->iteration = plan->iteration;
  r->eval_done = eval_done;
  if (r->env.on_recovered) r->env.on_recovered(r->env.arg, plan->iteration, bytes, now_s() - t0);
  return MEGA_OK;
}
