/* The distributed optimizer's shards (grads.h): a bucket's all-gather, the
 * ranges of the shard copy, its gradients' exchange, and the moments
 * gathered whole for a checkpoint or scattered back into the optimizers. */
#include <stdlib.h>
#include <string.h>

#include "worker/engine/grads_internal.h"

int mega_grads_copy_shard(const mega_grads *g) { return g->copy_shard; }

const mega_optim_range *mega_grads_copy_ranges(const mega_grads *g, size_t *n) {
  *n = g->copy.n;
  return g->copy.ranges;
}

const mega_grads_piece *mega_grads_copy_pieces(const mega_grads *g, size_t *n) {
  *n = g->copy.n;
  return g->copy.piece;
}

/* All-gathers bucket b's shards of buf (laid out as the chunk's buffers)
 * in place, over comm. */
mega_status mega_grads__gather_bucket(mega_grads *g, mega_comm *comm, int b, float *buf,
                                      mega_req **req, mega_err *err) {
  const mega_grads_bucket *k = &g->buckets[b];
  size_t counts[g->o.dp_size];
  for (int d = 0; d < g->o.dp_size; d++) counts[d] = k->shard_numel;
  float *base = buf + k->offset;
  return mega_comm_iall_gather(comm, base + k->shard_offset, base, counts, MEGA_DT_F32, 0, req,
                               err);
}

mega_status mega_grads__copy_own_params(mega_grads *g, mega_err *err) {
  g->copy_at = calloc((size_t)g->nbuckets + 1, sizeof *g->copy_at);
  if (!g->copy_at) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the shard copy");
  size_t n = 0;
  for (int b = 0; b < g->nbuckets; b++) {
    g->copy_at[b] = n;
    n += g->buckets[b].shard_numel;
  }
  g->copy_numel = n;
  mega_status st = g->be->ops->alloc(g->be, (n ? n : 1) * sizeof(float), (void **)&g->copy_params,
                                     err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "the shard copy's parameters");
    return st;
  }
  range_set *c = &g->copy;
  for (size_t i = 0; i < c->n; i++) { /* pos: the range's place in its chunk's buffers */
    const mega_grads_bucket *k = &g->buckets[c->bucket[i]];
    size_t shard_lo = k->offset + k->shard_numel * (size_t)g->copy_shard;
    c->ranges[i].params = g->copy_params + g->copy_at[c->bucket[i]] + (c->pos[i] - shard_lo);
  }
  return MEGA_OK;
}

mega_status mega_grads_copy_take_params(mega_grads *g, mega_err *err) {
  if (g->copy_shard < 0) return MEGA_OK;
  mega_status st = MEGA_OK;
  for (int b = 0; b < g->nbuckets && st == MEGA_OK; b++) {
    const mega_grads_bucket *k = &g->buckets[b];
    const float *from = g->chunks[k->chunk].params + k->offset +
                        k->shard_numel * (size_t)g->copy_shard;
    if (k->shard_numel)
      st = g->be->ops->memcpy(g->be, g->copy_params + g->copy_at[b], from,
                              k->shard_numel * sizeof(float), MEGA_COPY_D2D, err);
  }
  if (st != MEGA_OK) mega_err_prefix(err, "taking the shard copy's parameters");
  return st;
}

size_t mega_grads_copy_param_bytes(const mega_grads *g) {
  return g->copy_shard < 0 ? 0 : g->copy_numel * sizeof(float);
}

#define COPY_TAG 0x5c00u /* + bucket: the shard copy's gradients on the DP communicator */

static mega_status wait_copy(mega_grads *g, mega_status st, mega_err *err) {
  for (int i = 0; g->copy_req && i < 2 * g->nbuckets; i++) {
    if (!g->copy_req[i]) continue;
    if (st == MEGA_OK) st = mega_req_wait(g->copy_req[i], 0, err);
    mega_req_free(g->copy_req[i]);
  }
  free(g->copy_req);
  g->copy_req = NULL;
  if (st != MEGA_OK) mega_err_prefix(err, "exchanging the optimizer shard copy's gradients");
  return st;
}

mega_status mega_grads_wait_copy(mega_grads *g, mega_err *err) {
  return wait_copy(g, MEGA_OK, err);
}

mega_status mega_grads_post_copy(mega_grads *g, mega_err *err) {
  if (g->copy_shard < 0 || !g->comm) return MEGA_OK;
  mega_status st = wait_copy(g, MEGA_OK, err); /* one in flight at a time */
  if (st != MEGA_OK) return st;
  int dp = g->o.dp_size, me = g->o.dp_rank;
  int to = (me + (me - g->copy_shard + dp) % dp) % dp; /* the rank that copies mine */
  int n = g->nbuckets;
  mega_req **reqs = g->copy_req = calloc((size_t)(2 * n + 1), sizeof *reqs);
  if (!reqs) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the shard copy");
  for (int b = 0; b < n && st == MEGA_OK; b++) {
    const mega_grads_bucket *k = &g->buckets[b];
    float *base = g->chunks[k->chunk].grads + k->offset;
    size_t bytes = k->shard_numel * sizeof(float);
    st = mega_comm_isend(g->comm, base + k->shard_offset, bytes, to, COPY_TAG + (uint32_t)b,
                         &reqs[2 * b], err);
    if (st == MEGA_OK)
      st = mega_comm_irecv(g->comm, base + k->shard_numel * (size_t)g->copy_shard, bytes,
                           g->copy_shard, COPY_TAG + (uint32_t)b, &reqs[2 * b + 1], err);
  }
  return st == MEGA_OK ? MEGA_OK : wait_copy(g, st, err);
}

mega_status mega_grads_gather_moments(mega_grads *g, mega_optim *o, float *const *exp_avg,
                                      float *const *exp_avg_sq, mega_err *err) {
  for (int v = 0; v < g->vp; v++) {
    memset(exp_avg[v], 0, g->chunks[v].numel * sizeof(float));
    memset(exp_avg_sq[v], 0, g->chunks[v].numel * sizeof(float));
  }
  mega_status st = MEGA_OK;
  for (size_t i = 0; i < g->own.n && st == MEGA_OK; i++) {
    int v = g->own.chunk[i];
    size_t n = g->own.ranges[i].numel * sizeof(float), at = g->own.pos[i];
    st = g->be->ops->memcpy(g->be, exp_avg[v] + at, mega_optim_exp_avg(o, i), n, MEGA_COPY_D2H,
                            err);
    if (st == MEGA_OK)
      st = g->be->ops->memcpy(g->be, exp_avg_sq[v] + at, mega_optim_exp_avg_sq(o, i), n,
                              MEGA_COPY_D2H, err);
  }
  if (st != MEGA_OK || !g->o.distributed || !g->comm) return st;
  for (int b = 0; b < g->nbuckets && st == MEGA_OK; b++) {
    int v = g->buckets[b].chunk;
    for (int m = 0; m < 2 && st == MEGA_OK; m++) {
      mega_req *req = NULL;
      st = mega_grads__gather_bucket(g, g->hcomm, b, m ? exp_avg_sq[v] : exp_avg[v], &req, err);
      if (st == MEGA_OK) st = mega_req_wait(req, 0, err);
      mega_req_free(req);
    }
  }
  if (st != MEGA_OK) mega_err_prefix(err, "gathering the optimizer's moments");
  return st;
}

static mega_status scatter(mega_grads *g, const range_set *r, mega_optim *o,
                           float *const *exp_avg, float *const *exp_avg_sq, mega_err *err) {
  mega_status st = MEGA_OK;
  for (size_t i = 0; i < r->n && st == MEGA_OK; i++) {
    int v = r->chunk[i];
    size_t n = r->ranges[i].numel * sizeof(float), at = r->pos[i];
    st = g->be->ops->memcpy(g->be, mega_optim_exp_avg(o, i), exp_avg[v] + at, n, MEGA_COPY_H2D,
                            err);
    if (st == MEGA_OK)
      st = g->be->ops->memcpy(g->be, mega_optim_exp_avg_sq(o, i), exp_avg_sq[v] + at, n,
                              MEGA_COPY_H2D, err);
  }
  return st;
}

mega_status mega_grads_scatter_moments(mega_grads *g, mega_optim *o, float *const *exp_avg,
                                       float *const *exp_avg_sq, mega_err *err) {
  return scatter(g, &g->own, o, exp_avg, exp_avg_sq, err);
}

mega_status mega_grads_scatter_copy_moments(mega_grads *g, mega_optim *copy, float *const *exp_avg,
                                           float *const *exp_avg_sq, mega_err *err) {
  return scatter(g, &g->copy, copy, exp_avg, exp_avg_sq, err);
}
