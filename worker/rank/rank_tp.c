/* A rank's tensor parallelism: the model's TP collectives over the rank's
 * TP communicator (timed, for tp_comm_s), the sequence-parallel layernorm
 * gradients summed over the group, and whole tensors gathered from the
 * group's slices for the writer of a checkpoint. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/rank/rank_internal.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the model's collectives ---- */

static const size_t *equal_counts(rank_tp *t, size_t n) {
  for (int i = 0; i < t->size; i++) t->counts[i] = n;
  return t->counts;
}

static mega_status tp_done(rank_tp *t, double t0, mega_status st, mega_err *err,
                           const char *what) {
  t->comm_s += now_s() - t0;
  if (st != MEGA_OK) mega_err_prefix(err, "tensor-parallel %s", what);
  return st;
}

static mega_status tp_all_reduce(void *ctx, float *buf, size_t n, mega_err *err) {
  rank_tp *t = ctx;
  double t0 = now_s();
  return tp_done(t, t0, mega_comm_all_reduce(t->comm, buf, n, 0, err), err, "all-reduce");
}

static mega_status tp_all_reduce_max(void *ctx, float *buf, size_t n, mega_err *err) {
  rank_tp *t = ctx;
  double t0 = now_s();
  return tp_done(t, t0, mega_comm_all_reduce_max(t->comm, buf, n, 0, err), err, "max");
}

static mega_status gather_on(rank_tp *t, mega_comm *c, const float *in, float *out, size_t n,
                             mega_err *err) {
  double t0 = now_s();
  mega_status st = mega_comm_all_gather(c, in, out, equal_counts(t, n), MEGA_DT_F32, 0, err);
  return tp_done(t, t0, st, err, "all-gather");
}

static mega_status tp_all_gather(void *ctx, const float *in, float *out, size_t n,
                                 mega_err *err) {
  rank_tp *t = ctx;
  return gather_on(t, t->comm, in, out, n, err);
}

static mega_status tp_reduce_scatter(void *ctx, const float *in, float *out, size_t n,
                                     mega_err *err) {
  rank_tp *t = ctx;
  double t0 = now_s();
  mega_status st = mega_comm_reduce_scatter(t->comm, in, out, equal_counts(t, n), 0, err);
  return tp_done(t, t0, st, err, "reduce-scatter");
}

static const mega_gpt_tp_ops tp_ops = {.all_reduce = tp_all_reduce,
                                       .all_reduce_max = tp_all_reduce_max,
                                       .all_gather = tp_all_gather,
                                       .reduce_scatter = tp_reduce_scatter};

mega_status rank_tp_init(mega_rank *r, mega_gpt_tp *out, mega_err *err) {
  rank_tp *t = &r->tp;
  *t = (rank_tp){.size = r->topo.tp};
  *out = (mega_gpt_tp){.size = r->topo.tp, .rank = r->me.tp,
                       .sequence_parallel = r->job->sequence_parallel && r->topo.tp > 1};
  if (t->size < 2) return MEGA_OK;
  if (!(t->counts = calloc((size_t)t->size, sizeof *t->counts)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the TP group");
  out->ops = &tp_ops;
  out->ctx = t; /* its comm arrives with the groups, before any pass */
  return MEGA_OK;
}

void rank_tp_free(mega_rank *r) {
  rank_tp_whole_free(r);
  free(r->tp.counts);
  r->tp.counts = NULL;
}

double rank_tp_take_comm_s(mega_rank *r) {
  double s = r->tp.comm_s;
  r->tp.comm_s = 0;
  return s;
}

/* ---- finalize_model_grads: the layernorms under sequence parallelism ---- */

mega_status rank_tp_finalize_grads(mega_rank *r, mega_err *err) {
  if (r->topo.tp < 2 || !r->job->sequence_parallel) return MEGA_OK;
  mega_status st = MEGA_OK;
  double t0 = now_s();
  for (int v = 0; v < r->chunks.vp && st == MEGA_OK; v++) {
    int n;
    const mega_param_info *p = mega_gpt_params(r->chunks.stages[v], &n);
    float *g = mega_gpt_grad_data(r->chunks.stages[v]);
    for (int i = 0; i < n && st == MEGA_OK; i++)
      if (p[i].sp_partial)
        st = mega_comm_all_reduce(r->tp.comm, g + p[i].offset, p[i].numel, 0, err);
  }
  r->tp.comm_s += now_s() - t0;
  if (st != MEGA_OK) mega_err_prefix(err, "summing the sequence-parallel layernorm gradients");
  return st;
}

/* ---- checkpoints: whole tensors for the writer ---- */

void rank_tp_whole_free(mega_rank *r) {
  rank_tp *t = &r->tp;
  for (size_t i = 0; t->whole && i < t->nwhole; i++) {
    free(t->whole[i].param);
    free(t->whole[i].exp_avg);
    free(t->whole[i].exp_avg_sq);
  }
  free(t->whole);
  free(t->local);
  t->whole = t->local = NULL;
  t->nwhole = 0;
}

mega_status rank_tp_whole_build(mega_rank *r, const mega_ckpt_param *local, size_t n,
                                mega_err *err) {
  rank_tp *t = &r->tp;
  t->whole = calloc(n + 1, sizeof *t->whole);
  if (!t->whole) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for whole tensors");
  t->nwhole = n;
  for (size_t i = 0; i < n; i++) {
    mega_ckpt_param *w = &t->whole[i];
    *w = local[i];
    w->tp_size = 1; /* whole */
    w->tp_rank = 0;
    w->param = malloc(w->numel * sizeof(float));
    w->exp_avg = local[i].exp_avg ? malloc(w->numel * sizeof(float)) : NULL;
    w->exp_avg_sq = local[i].exp_avg_sq ? malloc(w->numel * sizeof(float)) : NULL;
    if (!w->param || (local[i].exp_avg && !w->exp_avg) ||
        (local[i].exp_avg_sq && !w->exp_avg_sq))
      return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the whole tensor %s (%zu floats)",
                       w->name, w->numel);
  }
  return MEGA_OK;
}

/* The writer's whole[i] from every TP rank's slice: one all-gather per
 * sliced tensor of [param | exp_avg | exp_avg_sq]; replicated tensors are
 * the writer's own. Every rank of the TP group calls it, in the same
 * order. */
mega_status rank_tp_gather(mega_rank *r, const mega_ckpt_param *local, size_t n, mega_err *err) {
  rank_tp *t = &r->tp;
  bool writer = t->whole != NULL;
  size_t maxn = 1;
  for (size_t i = 0; i < n; i++)
    if (local[i].numel > maxn) maxn = local[i].numel;
  /* a slice's three parts, and every rank's; or a whole replicated one */
  float *mine = malloc(3 * maxn * sizeof(float)), *all = malloc(3 * maxn * sizeof(float));
  mega_status st = mine && all ? MEGA_OK
                               : mega_fail(err, MEGA_ERR_NOMEM, "out of memory gathering slices");
  for (size_t i = 0; i < n && st == MEGA_OK; i++) {
    const mega_ckpt_param *p = &local[i];
    const float *src[3] = {p->param, p->exp_avg, p->exp_avg_sq};
    size_t ln = mega_ckpt_param_local(p);
    int k = 0;
    for (int j = 0; j < 3 && st == MEGA_OK; j++)
      if (src[j])
        st = r->be->ops->memcpy(r->be, mine + (size_t)k++ * ln, src[j], ln * sizeof(float),
                                MEGA_COPY_D2H, err);
    if (st != MEGA_OK) break;
    bool sliced = p->tp_size > 1 && !mega_tp_split_replicated(&p->tp);
    if (sliced) st = gather_on(t, t->hcomm, mine, all, (size_t)k * ln, err); /* host copies */
    if (st != MEGA_OK || !writer) continue;
    mega_ckpt_param *w = &t->whole[i];
    float *dst[3] = {w->param, w->exp_avg, w->exp_avg_sq};
    for (int j = 0, q = 0; j < 3; j++) {
      if (!src[j]) continue;
      if (!sliced)
        memcpy(dst[j], mine + (size_t)q * ln, ln * sizeof(float));
      else
        for (int rk = 0; rk < t->size; rk++)
          mega_tp_place(&p->tp, t->size, rk, all + ((size_t)rk * k + q) * ln, dst[j]);
      q++;
    }
  }
  free(mine);
  free(all);
  return st;
}
