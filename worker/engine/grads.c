/* Gradient buffers, buckets, their data-parallel reductions and the
 * parameter gather (grads.h; the shards' copy and moments: grads_shard.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/engine/grads_internal.h"

#define ALIGN 16 /* floats: every tensor and shard on a 64-byte line */

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

long long mega_grads_default_bucket_size(int dp_size) {
  long long b = 1000000LL * (dp_size > 0 ? dp_size : 1);
  return b > 40000000LL ? b : 40000000LL;
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static bool is_wte(const mega_param_info *p) { return p->tied_embedding; }

/* Appends the buckets of one chunk and sets each param's offset; returns
 * the chunk's buffer length. Buckets are grown as needed. */
static mega_status layout_chunk(mega_grads *g, chunk *c, size_t *offset, mega_err *err) {
  int np;
  const mega_param_info *p = mega_gpt_params(c->stage, &np);
  const mega_grads_opts *o = &g->o;
  long long limit = o->overlap ? (o->bucket_size > 0 ? o->bucket_size
                                                     : mega_grads_default_bucket_size(o->dp_size))
                               : -1;
  size_t pad = o->distributed ? (size_t)ALIGN * (size_t)o->dp_size : ALIGN;
  int cap = np + 1;
  mega_grads_bucket *nb = realloc(g->buckets, (size_t)(g->nbuckets + cap) * sizeof *nb);
  if (!nb) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for gradient buckets");
  g->buckets = nb;
  c->b0 = g->nbuckets;
  size_t pos = 0;
  mega_grads_bucket *cur = NULL;
  /* A bucket ends at its padded end; the next starts there. */
#define CLOSE()                                                           \
  do {                                                                    \
    cur->numel_unpadded = pos - cur->offset;                              \
    pos = cur->offset + round_up(pos - cur->offset, pad);                 \
    cur->numel = pos - cur->offset;                                       \
    cur = NULL;                                                           \
  } while (0)
  /* The tied embedding ends a bucket, so a loss stage's copy (its first
   * gradient) is alone and goes to the embedding stage at once
   * (grads_tied.c), with or without overlap. With the distributed
   * optimizer wte is alone too (its shards must cover the same elements on
   * both stages); without, the first stage's last small params join it:
   * one collective fewer where the backward ends, the grad sync's exposed
   * tail (bench_dp.py timeline). */
  for (int i = np - 1; i >= 0; i--) {
    bool tied = is_wte(&p[i]) && (o->distributed || o->overlap || p[i].tied_copy);
    if (tied && cur && o->distributed) CLOSE();
    if (!cur) {
      cur = &g->buckets[g->nbuckets++];
      *cur = (mega_grads_bucket){.chunk = c->index, .offset = pos, .param_lo = i + 1,
                                 .param_hi = i + 1};
    }
    pos = round_up(pos, ALIGN);
    offset[i] = pos;
    pos += p[i].numel;
    cur->param_lo = i;
    c->bucket_of[i] = (int)(cur - g->buckets);
    if (tied) {
      cur->tied = true;
      cur->tied_copy = p[i].tied_copy;
      CLOSE();
    } else if (limit > 0 && (long long)(pos - cur->offset) >= limit) {
      CLOSE();
    }
  }
  if (cur) CLOSE();
#undef CLOSE
  c->nb = g->nbuckets - c->b0;
  c->numel = pos ? pos : ALIGN;
  for (int b = c->b0; b < g->nbuckets; b++) {
    mega_grads_bucket *k = &g->buckets[b];
    if (o->distributed) {
      k->shard_numel = k->numel / (size_t)o->dp_size;
      k->shard_offset = k->shard_numel * (size_t)o->dp_rank;
    } else {
      k->shard_offset = 0;
      k->shard_numel = k->numel;
    }
  }
  return MEGA_OK;
}

static void on_unit(void *arg, int first, int count) {
  chunk *c = arg;
  mega_grads_ready(c->g, c->index, first, count);
}

static void on_need(void *arg, int first, int count) {
  chunk *c = arg;
  mega_grads_need(c->g, c->index, first, count);
}

static void range_set_free(range_set *r) {
  free(r->ranges);
  free(r->chunk);
  free(r->pos);
  free(r->skip);
  free(r->piece);
  free(r->bucket);
  free(r->late);
  free(r->sumsq);
  *r = (range_set){0};
}

/* The optimizer's ranges: whole params, or their pieces inside data-parallel
 * rank d's shards. */
static mega_status build_ranges(mega_grads *g, int d, range_set *out, mega_err *err) {
  size_t cap = 0;
  for (int v = 0; v < g->vp; v++) {
    int np;
    mega_gpt_params(g->chunks[v].stage, &np);
    cap += (size_t)np;
  }
  range_set r = {.ranges = calloc(cap + 1, sizeof *r.ranges),
                 .chunk = calloc(cap + 1, sizeof *r.chunk),
                 .pos = calloc(cap + 1, sizeof *r.pos), .skip = calloc(cap + 1, sizeof *r.skip),
                 .piece = calloc(cap + 1, sizeof *r.piece),
                 .bucket = calloc(cap + 1, sizeof *r.bucket),
                 .late = calloc(cap + 1, sizeof *r.late),
                 .sumsq = calloc(cap + 1, sizeof *r.sumsq)};
  if (!r.ranges || !r.chunk || !r.pos || !r.skip || !r.piece || !r.bucket || !r.late ||
      !r.sumsq) {
    range_set_free(&r);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for optimizer ranges");
  }
  size_t n = 0, k0 = 0;
  for (int v = 0; v < g->vp; v++) {
    chunk *c = &g->chunks[v];
    int np;
    const mega_param_info *p = mega_gpt_params(c->stage, &np);
    for (int i = 0; i < np; i++) {
      const mega_grads_bucket *b = &g->buckets[c->bucket_of[i]];
      size_t lo = p[i].offset, hi = p[i].offset + p[i].numel;
      size_t slo = b->offset, shi = b->offset + b->numel;
      if (g->o.distributed) {
        slo = b->offset + b->shard_numel * (size_t)d;
        shi = slo + b->shard_numel;
      }
      if (lo < slo) lo = slo;
      if (hi > shi) hi = shi;
      if (lo >= hi) continue;
      r.ranges[n] = (mega_optim_range){.params = c->params + lo, .grads = c->grads + lo,
                                       .numel = hi - lo, .decay = p[i].decay};
      r.chunk[n] = v;
      r.pos[n] = lo;
      r.piece[n] = (mega_grads_piece){.param = k0 + (size_t)i, .elem = lo - p[i].offset};
      const mega_gpt_tp *tp = mega_gpt_stage_tp(c->stage);
      r.skip[n] = p[i].tied_copy || (tp->rank > 0 && mega_tp_split_replicated(&p[i].tp));
      r.bucket[n] = c->bucket_of[i];
      r.late[n] = p[i].tied_embedding || p[i].sp_partial;
      n++;
    }
    k0 += (size_t)np;
  }
  r.n = n;
  *out = r;
  return MEGA_OK;
}

static mega_status alloc_norm(mega_grads *g, mega_err *err) {
  size_t n = g->own.n ? g->own.n : 1;
  g->norm_post = calloc(n, sizeof *g->norm_post);
  if (!g->norm_post) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the norm's ranges");
  mega_status st = g->be->ops->alloc(g->be, n * sizeof(double), (void **)&g->norm_slots, err);
  if (st != MEGA_OK) mega_err_prefix(err, "the gradient norm's sums (%zu doubles)", n);
  return st;
}

mega_status mega_grads_create(mega_backend *be, mega_gpt_stage *const *stages, int vp,
                              const mega_grads_opts *opts, mega_grads **out, mega_err *err) {
  *out = NULL;
  if (opts->dp_size < 1 || opts->dp_rank < 0 || opts->dp_rank >= opts->dp_size)
    return mega_fail(err, MEGA_ERR_INVALID, "data-parallel rank %d of %d is out of range",
                     opts->dp_rank, opts->dp_size);
  mega_grads *g = calloc(1, sizeof *g);
  if (!g) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for gradient buffers");
  g->be = be;
  g->o = *opts;
  g->vp = vp;
  g->chunks = calloc((size_t)vp, sizeof *g->chunks);
  mega_status st = g->chunks ? MEGA_OK : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  size_t *offset = NULL;
  for (int v = 0; v < vp && st == MEGA_OK; v++) {
    chunk *c = &g->chunks[v];
    *c = (chunk){.g = g, .index = v, .stage = stages[v]};
    int np;
    mega_gpt_params(c->stage, &np);
    free(offset);
    offset = calloc((size_t)np + 1, sizeof *offset);
    c->bucket_of = calloc((size_t)np + 1, sizeof *c->bucket_of);
    if (!offset || !c->bucket_of) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory for gradient buffers");
      break;
    }
    st = layout_chunk(g, c, offset, err);
    if (st == MEGA_OK) st = be->ops->alloc(be, c->numel * sizeof(float), (void **)&c->params, err);
    if (st == MEGA_OK) st = be->ops->alloc(be, c->numel * sizeof(float), (void **)&c->grads, err);
    if (st != MEGA_OK) {
      mega_err_prefix(err, "gradient buffers of chunk %d (%zu floats)", v, c->numel);
      break;
    }
    be->ops->memset0(be, c->params, c->numel * sizeof(float));
    be->ops->memset0(be, c->grads, c->numel * sizeof(float));
    st = mega_gpt_rebind(c->stage, c->params, c->grads, c->numel, offset, err);
    if (st == MEGA_OK) {
      mega_gpt_on_grads_done(c->stage, on_unit, c);
      mega_gpt_on_params_needed(c->stage, on_need, c);
    }
  }
  free(offset);
  if (st == MEGA_OK) {
    int n = g->nbuckets;
    g->ready = calloc((size_t)n + 1, sizeof *g->ready);
    g->launched = calloc((size_t)n + 1, sizeof *g->launched);
    g->req = calloc((size_t)n + 1, sizeof *g->req);
    g->preq = calloc((size_t)n + 1, sizeof *g->preq);
    g->timing = calloc((size_t)n + 1, sizeof *g->timing);
    g->normed = calloc((size_t)n + 1, sizeof *g->normed);
    g->order = calloc((size_t)n + 1, sizeof *g->order);
    if (!g->ready || !g->launched || !g->req || !g->preq || !g->timing || !g->normed ||
        !g->order)
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory for %d buckets", n);
  }
  if (st == MEGA_OK) st = build_ranges(g, opts->dp_rank, &g->own, err);
  if (st == MEGA_OK) st = alloc_norm(g, err);
  g->copy_shard = -1;
  int shift = opts->shard_copy_shift;
  if (st == MEGA_OK && opts->distributed && opts->dp_size > 1 && shift > 0) {
    g->copy_shard = ((opts->dp_rank - shift) % opts->dp_size + opts->dp_size) % opts->dp_size;
    if (g->copy_shard == opts->dp_rank) g->copy_shard = -1; /* a shift of DP: no copy */
    else st = build_ranges(g, g->copy_shard, &g->copy, err);
    if (st == MEGA_OK && g->copy_shard >= 0) st = mega_grads__copy_own_params(g, err);
  }
  if (st != MEGA_OK) {
    mega_grads_destroy(g);
    return st;
  }
  *out = g;
  return MEGA_OK;
}

void mega_grads_destroy(mega_grads *g) {
  if (!g) return;
  for (int b = 0; g->req && b < g->nbuckets; b++) mega_req_free(g->req[b]);
  for (int b = 0; g->preq && b < g->nbuckets; b++) mega_req_free(g->preq[b]);
  for (int i = 0; g->copy_req && i < 2 * g->nbuckets; i++) mega_req_free(g->copy_req[i]);
  free(g->copy_req);
  for (int v = 0; g->chunks && v < g->vp; v++) {
    chunk *c = &g->chunks[v];
    /* The stage keeps borrowing the buffers until it is destroyed; only
     * stop its callbacks from reaching freed memory. */
    if (c->stage) {
      mega_gpt_on_grads_done(c->stage, NULL, NULL);
      mega_gpt_on_params_needed(c->stage, NULL, NULL);
    }
    if (c->params) g->be->ops->free(g->be, c->params);
    if (c->grads) g->be->ops->free(g->be, c->grads);
    free(c->bucket_of);
  }
  free(g->chunks);
  free(g->buckets);
  free(g->ready);
  free(g->launched);
  free(g->req);
  free(g->preq);
  free(g->timing);
  free(g->normed);
  free(g->order);
  if (g->norm_slots) g->be->ops->free(g->be, g->norm_slots);
  free(g->norm_post);
  range_set_free(&g->own);
  range_set_free(&g->copy);
  if (g->copy_params) g->be->ops->free(g->be, g->copy_params);
  free(g->copy_at);
  mega_grads__tied_free(g);
  free(g);
}

void mega_grads_set_comm(mega_grads *g, mega_comm *dp, mega_comm *host) {
  g->comm = dp;
  g->hcomm = host ? host : dp;
}

int mega_grads_num_buckets(const mega_grads *g) { return g->nbuckets; }

const mega_grads_bucket *mega_grads_bucket_at(const mega_grads *g, int i) {
  return i >= 0 && i < g->nbuckets ? &g->buckets[i] : NULL;
}

void mega_grads_chunk_buckets(const mega_grads *g, int c, int *first, int *count) {
  *first = g->chunks[c].b0;
  *count = g->chunks[c].nb;
}

mega_status mega_grads_start(mega_grads *g, mega_err *err) {
  for (int b = 0; b < g->nbuckets; b++)
    if (g->req[b])
      return mega_fail(err, MEGA_ERR_INTERNAL,
                       "gradient bucket %d's reduction is still in flight at the start of an "
                       "iteration", b);
  for (int v = 0; v < g->vp; v++) g->chunks[v].enabled = false;
  g->zero_chunk = 0;
  g->zero_at = 0;
  g->still_zero = false;
  memset(g->ready, 0, (size_t)g->nbuckets * sizeof *g->ready);
  memset(g->launched, 0, (size_t)g->nbuckets * sizeof *g->launched);
  memset(g->timing, 0, (size_t)g->nbuckets * sizeof *g->timing);
  memset(g->normed, 0, (size_t)g->nbuckets * sizeof *g->normed);
  g->norder = g->taken = 0;
  g->failed = MEGA_OK;
  return mega_grads__tied_start(g, err);
}

bool mega_grads_zero(mega_grads *g, size_t max_floats) {
  while (g->zero_chunk < g->vp && max_floats > 0) {
    chunk *c = &g->chunks[g->zero_chunk];
    size_t n = c->numel - g->zero_at;
    if (n > max_floats) n = max_floats;
    g->be->ops->memset0(g->be, c->grads + g->zero_at, n * sizeof(float));
    g->zero_at += n;
    max_floats -= n;
    if (g->zero_at == c->numel) {
      g->zero_chunk++;
      g->zero_at = 0;
    }
  }
  return g->zero_chunk == g->vp;
}

void mega_grads_still_zero(mega_grads *g) {
  g->zero_chunk = g->vp;
  g->zero_at = 0;
  g->still_zero = true;
}

void mega_grads_enable(mega_grads *g, int c, bool on) { g->chunks[c].enabled = on; }

static mega_status launch(mega_grads *g, int b, mega_err *err) {
  mega_grads_bucket *k = &g->buckets[b];
  chunk *c = &g->chunks[k->chunk];
  g->launched[b] = true;
  if (g->on_launch) g->on_launch(g->on_launch_arg, b);
  bool sent;
  mega_status st = mega_grads__tied_launch(g, b, &sent, err);
  if (st != MEGA_OK || sent) return st; /* the copy is not reduced here (grads_tied.c) */
  g->timing[b] = (mega_grads_timing){.launched = wall_s(), .cpu_s = -1, .runq_s = -1};
  if (!g->comm) return MEGA_OK;
  float *data = c->grads + k->offset;
  if (g->o.distributed) {
    size_t counts[g->o.dp_size];
    for (int d = 0; d < g->o.dp_size; d++) counts[d] = k->shard_numel;
    st = mega_comm_ireduce_scatter(g->comm, data, data + k->shard_offset, counts, 0, &g->req[b],
                                   err);
  } else {
    st = mega_comm_iall_reduce(g->comm, data, k->numel, 0, &g->req[b], err);
  }
  if (st != MEGA_OK) mega_err_prefix(err, "launching gradient bucket %d", b);
  else g->order[g->norder++] = b;
  return st;
}

static void take_finished(mega_grads *g);

/* Params of one unit are contiguous in the buffer, so the buckets they
 * complete are too; launched in bucket order. */
static void count_ready(mega_grads *g, chunk *c, int first, int count) {
  int lo = g->nbuckets, hi = -1;
  for (int i = first; i < first + count; i++) {
    int b = c->bucket_of[i];
    g->ready[b]++;
    if (b < lo) lo = b;
    if (b > hi) hi = b;
  }
  for (int b = lo; b <= hi; b++) {
    const mega_grads_bucket *k = &g->buckets[b];
    if (g->launched[b] || g->ready[b] < k->param_hi - k->param_lo) continue;
    if (g->failed == MEGA_OK) g->failed = launch(g, b, &g->fail_err);
  }
}

void mega_grads_ready(mega_grads *g, int ci, int first, int count) {
  chunk *c = &g->chunks[ci];
  if (g->zero_chunk < g->vp && g->failed == MEGA_OK)
    g->failed = mega_fail(&g->fail_err, MEGA_ERR_INTERNAL,
                          "gradients of chunk %d accumulated before mega_grads_zero finished "
                          "zeroing them", ci);
  if (c->enabled) count_ready(g, c, first, count); /* else no_sync */
  take_finished(g);
}

static mega_status sticky(mega_grads *g, mega_err *err) {
  if (g->failed == MEGA_OK) return MEGA_OK;
  if (err) *err = g->fail_err;
  return g->failed;
}

mega_status mega_grads_launch(mega_grads *g, int ci, mega_err *err) {
  mega_status st = sticky(g, err);
  chunk *c = &g->chunks[ci];
  for (int b = c->b0; b < c->b0 + c->nb && st == MEGA_OK; b++)
    if (!g->launched[b]) st = launch(g, b, err);
  return st;
}

/* Keeps bucket b's times once its reduction is over. */
static void note_done(mega_grads *g, int b) {
  mega_grads_timing *t = &g->timing[b];
  mega_req_times rt;
  if (mega_req_get_times(g->req[b], &rt)) {
    t->started = rt.started;
    t->done = rt.done;
    t->cpu_s = rt.cpu_s;
    t->runq_s = rt.runq_s;
  }
  t->waited = wall_s();
}

/* Range i's squares, to be posted into its slot (what mega_grads_sumsq
 * adds up). */
static void queue_range(mega_grads *g, size_t i, size_t *k) {
  const mega_optim_range *r = &g->own.ranges[i];
  g->norm_post[(*k)++] = (mega_sumsq_range){.x = r->grads, .n = r->numel,
                                            .out = &g->norm_slots[i]};
}

/* Bucket b is reduced: the norm's share of its ranges that are final. */
static mega_status norm_bucket(mega_grads *g, int b, mega_err *err) {
  if (g->normed[b]) return MEGA_OK;
  g->normed[b] = true;
  if (g->still_zero) return MEGA_OK;
  size_t k = 0;
  for (size_t i = 0; i < g->own.n; i++)
    if (g->own.bucket[i] == b && !g->own.skip[i] && !g->own.late[i]) queue_range(g, i, &k);
  return mega_sum_squares_post(g->be, g->norm_post, k, err);
}

/* Bucket b's reduction is over (st its result): its times kept, its
 * request released, and average_in_collective's 1/DP applied. */
static void take(mega_grads *g, int b, mega_status st) {
  note_done(g, b);
  mega_req_free(g->req[b]);
  g->req[b] = NULL;
  if (st == MEGA_OK && g->o.average_in_collective && g->o.dp_size > 1) {
    /* backend memory: on the device under cuda, so a backend op */
    const mega_grads_bucket *k = &g->buckets[b];
    g->be->ops->scale(g->be, g->chunks[k->chunk].grads + k->offset + k->shard_offset,
                      k->shard_numel, 1.0f / (float)g->o.dp_size);
  }
}

/* Backward finished a unit: the buckets whose reductions are over already
 * are taken now, their norm's share too, rather than in the wait at the
 * schedule's end, where that work (two passes over every bucket on the
 * cpu backend) ran beside the last reductions and slowed them. The tied
 * embedding's bucket is left to the wait, which orders its exchange. */
static void take_finished(mega_grads *g) {
  while (g->taken < g->norder && !g->req[g->order[g->taken]]) g->taken++;
  for (int i = g->taken; i < g->norder && g->failed == MEGA_OK; i++) {
    int b = g->order[i];
    if (!g->req[b] || (g->tied.comm && b == g->tied.bucket)) continue;
    bool done = false;
    mega_err e = {0};
    /* the rest finish after this one; a failure is the wait's to report */
    if (mega_req_test(g->req[b], &done, &e) != MEGA_OK || !done) break;
    take(g, b, MEGA_OK);
    if (g->failed == MEGA_OK) g->failed = norm_bucket(g, b, &g->fail_err);
  }
}

mega_status mega_grads_wait(mega_grads *g, int ci, mega_err *err) {
  mega_status st = mega_grads_launch(g, ci, err);
  chunk *c = &g->chunks[ci];
  for (int b = c->b0; b < c->b0 + c->nb; b++) {
    if (g->req[b]) {
      if (st == MEGA_OK) {
        st = mega_req_wait(g->req[b], 0, err);
        if (st != MEGA_OK) mega_err_prefix(err, "gradient bucket %d", b);
      }
      take(g, b, st);
    }
    if (st == MEGA_OK) st = mega_grads__tied_reduced(g, b, err);
    if (st == MEGA_OK) st = norm_bucket(g, b, err);
  }
  return st;
}

const mega_grads_timing *mega_grads_timing_of(const mega_grads *g, int b) {
  return b >= 0 && b < g->nbuckets ? &g->timing[b] : NULL;
}

double mega_grads_reduced_at(const mega_grads *g) {
  double t = 0;
  for (int b = 0; b < g->nbuckets; b++) {
    const mega_grads_timing *k = &g->timing[b];
    double done = k->done > 0 ? k->done : k->waited;
    if (k->launched && done > t) t = done;
  }
  return t;
}

void mega_grads_on_launch(mega_grads *g, void (*fn)(void *arg, int bucket), void *arg) {
  g->on_launch = fn;
  g->on_launch_arg = arg;
}

double mega_grads_loss_scale_factor(const mega_grads *g) {
  return g->o.average_in_collective ? (double)g->o.dp_size : 1.0;
}

mega_status mega_grads_sumsq(mega_grads *g, double *out, mega_err *err) {
  /* Over the ranges the optimizer steps: each element this rank owns once,
   * padding never, the tied copy and other TP ranks' replicas left out;
   * added in range order, whenever each was taken, so the bits do not
   * depend on when the buckets finished. Gradients still zero (no
   * backward wrote them) have none to read. */
  if (g->still_zero) {
    *out = 0;
    return MEGA_OK;
  }
  size_t k = 0;
  for (size_t i = 0; i < g->own.n; i++)
    if (!g->own.skip[i] && (g->own.late[i] || !g->normed[g->own.bucket[i]]))
      queue_range(g, i, &k);
  mega_status st = mega_sum_squares_post(g->be, g->norm_post, k, err);
  /* every slot back in one copy: the step's one wait for the norm */
  if (st == MEGA_OK && g->own.n)
    st = g->be->ops->memcpy(g->be, g->own.sumsq, g->norm_slots, g->own.n * sizeof(double),
                            MEGA_COPY_D2H, err);
  if (st != MEGA_OK) return st;
  double sum = 0;
  for (size_t i = 0; i < g->own.n; i++)
    if (!g->own.skip[i]) sum += g->own.sumsq[i];
  *out = sum;
  return MEGA_OK;
}

const mega_optim_range *mega_grads_ranges(const mega_grads *g, size_t *n) {
  *n = g->own.n;
  return g->own.ranges;
}

const mega_grads_piece *mega_grads_pieces(const mega_grads *g, size_t *n) {
  *n = g->own.n;
  return g->own.piece;
}

/* One parameter gather is over, well or not. */
static void gathered(mega_grads *g, mega_status st) {
  if (g->gathers_pending > 0) g->gathers_pending--;
  if (st != MEGA_OK) g->gather_failed = true;
}

bool mega_grads_params_whole(const mega_grads *g) {
  return g->gathers_pending == 0 && !g->gather_failed;
}

void mega_grads_quiesce(mega_grads *g) {
  mega_grads__tied_quiesce(g);
  for (int b = 0; b < g->nbuckets; b++) {
    if (g->req[b]) {
      mega_req_wait(g->req[b], 0, NULL);
      mega_req_free(g->req[b]);
      g->req[b] = NULL;
    }
    if (g->preq[b]) {
      mega_status st = mega_req_wait(g->preq[b], 0, NULL);
      mega_req_free(g->preq[b]);
      g->preq[b] = NULL;
      gathered(g, st);
    }
  }
}

mega_status mega_grads_gather_params(mega_grads *g, bool async, mega_err *err) {
  if (!g->o.distributed || !g->comm) return MEGA_OK;
  /* Forward needs the end of each chunk's buffer (the embedding, the first
   * blocks) first: gather the buckets back to front. */
  mega_status st = MEGA_OK;
  for (int v = 0; v < g->vp && st == MEGA_OK; v++) {
    chunk *c = &g->chunks[v];
    for (int b = c->b0 + c->nb - 1; b >= c->b0 && st == MEGA_OK; b--) {
      if (g->preq[b])
        return mega_fail(err, MEGA_ERR_INTERNAL, "bucket %d's parameter gather is in flight", b);
      g->gathers_pending++; /* counted before the launch: a failed one may have sent part */
      st = mega_grads__gather_bucket(g, g->comm, b, c->params, &g->preq[b], err);
      if (st != MEGA_OK) g->gather_failed = true;
    }
  }
  if (st == MEGA_OK && !async) st = mega_grads_wait_params(g, -1, err);
  if (st != MEGA_OK) mega_err_prefix(err, "gathering the updated parameters");
  return st;
}

void mega_grads_need(mega_grads *g, int ci, int first, int count) {
  chunk *c = &g->chunks[ci];
  for (int i = first; i < first + count; i++) {
    int b = c->bucket_of[i];
    if (!g->preq[b]) continue;
    mega_status st = mega_req_wait(g->preq[b], 0, &g->fail_err);
    mega_req_free(g->preq[b]);
    g->preq[b] = NULL;
    gathered(g, st);
    if (st != MEGA_OK && g->failed == MEGA_OK) g->failed = st;
  }
}

mega_status mega_grads_wait_params(mega_grads *g, int ci, mega_err *err) {
  mega_status st = sticky(g, err);
  for (int v = 0; v < g->vp; v++) {
    if (ci >= 0 && v != ci) continue;
    chunk *c = &g->chunks[v];
    for (int b = c->b0 + c->nb - 1; b >= c->b0; b--) {
      if (!g->preq[b]) continue;
      mega_status w = st == MEGA_OK ? mega_req_wait(g->preq[b], 0, err) : MEGA_ERR_CANCELLED;
      if (st == MEGA_OK) st = w;
      mega_req_free(g->preq[b]);
      g->preq[b] = NULL;
      gathered(g, w);
    }
  }
  return st;
}

size_t mega_grads_param_bytes(const mega_grads *g) {
  size_t n = 0;
  for (int v = 0; v < g->vp; v++) n += g->chunks[v].numel;
  return n * sizeof(float);
}

size_t mega_grads_grad_bytes(const mega_grads *g) { return mega_grads_param_bytes(g); }
