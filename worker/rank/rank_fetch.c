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

#define PIECE(k) MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_##k
#define PIECE_FLOATS (1u << 20) /* rank_hold.c sends no bigger piece */
#define CONNECT_MS 5000
#define IO_MS 30000

typedef struct fetch {
  mega_rank *r;
  bool host_moments; /* the views' moments are host arrays (distributed optimizer) */
  float *stage;      /* PIECE_FLOATS */
  uint64_t got[4];   /* floats received, by piece kind */
  uint64_t bytes;
  bool have_hdr;
  int64_t steps, eval_done;
} fetch;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Receives one piece's floats into its place. */
static mega_status take_piece(fetch *f, int fd, const Mega__V1__ReplicaPiece *p,
                              const char *from, mega_err *err) {
  mega_chunks *c = &f->r->chunks;
  if (p->kind < PIECE(PARAM) || p->kind > PIECE(EXP_AVG_SQ) || p->tensor >= c->nparams ||
      p->count > PIECE_FLOATS ||
      p->offset + p->count > mega_ckpt_param_local(&c->ckpt[p->tensor]))
    return mega_fail(err, MEGA_ERR_PEER, "the replica at %s sent a piece out of bounds", from);
  const mega_ckpt_param *cp = &c->ckpt[p->tensor];
  float *dst = p->kind == PIECE(PARAM)     ? cp->param
               : p->kind == PIECE(EXP_AVG) ? cp->exp_avg
                                           : cp->exp_avg_sq;
  if (!dst)
    return mega_fail(err, MEGA_ERR_PEER, "the replica at %s sent moments of %s, which has none",
                     from, cp->name);
  dst += p->offset;
  size_t bytes = (size_t)p->count * sizeof(float);
  mega_status st;
  if (p->kind != PIECE(PARAM) && f->host_moments) {
    st = mega_net_read_all(fd, dst, bytes, "the moments", err);
  } else {
    st = mega_net_read_all(fd, f->stage, bytes, "the state", err);
    if (st == MEGA_OK)
      st = f->r->be->ops->memcpy(f->r->be, dst, f->stage, bytes, MEGA_COPY_H2D, err);
  }
  f->got[p->kind] += p->count;
  f->bytes += bytes;
  return st;
}

static mega_status check_header(fetch *f, const mega_replica_plan *plan,
                                const mega_replica_source *src,
                                const Mega__V1__ReplicaHeader *h, mega_err *err) {
  mega_rank *r = f->r;
  if (h->error && h->error[0])
    return mega_fail(err, MEGA_ERR_PEER, "the replica at %s refused: %s", src->address,
                     h->error);
  if (strcmp(h->job_id, plan->job_id) || h->attempt != (uint32_t)plan->attempt ||
      h->rank != (uint32_t)src->donor_rank || h->iteration != (uint64_t)plan->iteration ||
      h->pp != (uint32_t)r->me.pp || h->tp != (uint32_t)r->me.tp ||
      h->ntensors != r->chunks.nparams)
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replica at %s is job %s attempt %u rank %u (pp %u, tp %u, iteration "
                     "%llu, %llu tensors), not the one planned: job %s attempt %d rank %d (pp %d, "
                     "tp %d, iteration %lld, %zu tensors)",
                     src->address, h->job_id, h->attempt, h->rank, h->pp, h->tp,
                     (unsigned long long)h->iteration, (unsigned long long)h->ntensors,
                     plan->job_id, plan->attempt, src->donor_rank, r->me.pp, r->me.tp,
                     (long long)plan->iteration, r->chunks.nparams);
  if (f->have_hdr && (h->optimizer_steps != f->steps || h->eval_done != f->eval_done))
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replicas disagree: %lld optimizer steps and %lld evaluation batches "
                     "at %s, %lld and %lld before",
                     (long long)h->optimizer_steps, (long long)h->eval_done, src->address,
                     (long long)f->steps, (long long)f->eval_done);
  f->have_hdr = true;
  f->steps = h->optimizer_steps;
  f->eval_done = h->eval_done;
  return MEGA_OK;
}

/* Everything src has for this rank, on a connection of its own. */
static mega_status fetch_from(fetch *f, const mega_replica_plan *plan,
                              const mega_replica_source *src, mega_err *err) {
  mega_rank *r = f->r;
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
  ProtobufCMessage *m = NULL;
  if (st == MEGA_OK)
    st = mega_frame_read(fd, &mega__v1__replica_header__descriptor, 1u << 16, &m, err);
  if (st == MEGA_OK && !m) st = mega_fail(err, MEGA_ERR_PEER, "the replica closed the connection");
  if (st == MEGA_OK) st = check_header(f, plan, src, (Mega__V1__ReplicaHeader *)m, err);
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  while (st == MEGA_OK) {
    m = NULL;
    st = mega_frame_read(fd, &mega__v1__replica_piece__descriptor, 1u << 10, &m, err);
    if (st == MEGA_OK && !m) st = mega_fail(err, MEGA_ERR_PEER, "the replica closed midway");
    if (st != MEGA_OK) break;
    Mega__V1__ReplicaPiece *p = (Mega__V1__ReplicaPiece *)m;
    bool end = p->kind == PIECE(END);
    if (!end) st = take_piece(f, fd, p, src->address, err);
    protobuf_c_message_free_unpacked(m, NULL);
    if (end) break;
  }
  close(fd);
  if (st != MEGA_OK)
    mega_err_prefix(err, "fetching from rank %d of attempt %d at %s", src->donor_rank,
                    plan->attempt, src->address);
  return st;
}

/* Every parameter and moment of the rank's tensors came, once. */
static mega_status check_whole(const fetch *f, mega_err *err) {
  uint64_t want = 0;
  for (size_t k = 0; k < f->r->chunks.nparams; k++)
    want += mega_ckpt_param_local(&f->r->chunks.ckpt[k]);
  const uint64_t *g = f->got;
  if (g[PIECE(PARAM)] == want && g[PIECE(EXP_AVG)] == want && g[PIECE(EXP_AVG_SQ)] == want)
    return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INTERNAL,
                   "the replicas sent %llu parameters and %llu and %llu moments of %llu: the "
                   "plan does not cover this rank",
                   (unsigned long long)g[PIECE(PARAM)], (unsigned long long)g[PIECE(EXP_AVG)],
                   (unsigned long long)g[PIECE(EXP_AVG_SQ)], (unsigned long long)want);
}

static mega_status fetch_all(fetch *f, const mega_replica_plan *plan, mega_err *err) {
  mega_status st = MEGA_OK;
  size_t used = 0;
  for (size_t i = 0; i < plan->nsources && st == MEGA_OK; i++) {
    const mega_replica_source *src = &plan->sources[i];
    if (src->pp != f->r->me.pp || src->tp != f->r->me.tp) continue;
    used++;
    st = fetch_from(f, plan, src, err);
  }
  if (st == MEGA_OK && !used)
    return mega_fail(err, MEGA_ERR_INTERNAL, "the replica plan has no source for pp %d, tp %d",
                     f->r->me.pp, f->r->me.tp);
  if (st == MEGA_OK) st = check_whole(f, err);
  return st;
}

mega_status rank_fetch_replicas(mega_rank *r, mega_err *err) {
  const mega_replica_plan *plan = r->env.replicas;
  double t0 = now_s();
  bool dist = r->job->use_distributed_optimizer;
  fetch f = {.r = r, .host_moments = dist, .stage = malloc(PIECE_FLOATS * sizeof(float))};
  if (!f.stage) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the replica fetch");
  rank_whole_moments w = {0};
  mega_status st = MEGA_OK;
  if (dist) {
    st = rank_whole_moments_alloc(r, &w, err);
    if (st == MEGA_OK) mega_chunks_point_moments(&r->chunks, w.avg, w.sq);
  }
  if (st == MEGA_OK) st = fetch_all(&f, plan, err);
  if (st == MEGA_OK && dist) {
    st = mega_grads_scatter_moments(r->chunks.grads, r->optim, w.avg, w.sq, err);
    if (st == MEGA_OK && r->copy)
      st = mega_grads_scatter_copy_moments(r->chunks.grads, r->copy, w.avg, w.sq, err);
  }
  if (dist) {
    mega_chunks_point_moments(&r->chunks, NULL, NULL);
    rank_whole_moments_free(&w);
  }
  free(f.stage);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "recovering iteration %lld from replicas", (long long)plan->iteration);
    return st;
  }
  mega_optim_set_steps(r->optim, f.steps);
  if (r->copy) mega_optim_set_steps(r->copy, f.steps);
  r->iteration = plan->iteration;
  r->eval_done = f.eval_done;
  if (r->env.on_recovered) r->env.on_recovered(r->env.arg, plan->iteration, f.bytes, now_s() - t0);
  return MEGA_OK;
}
