/* The cuda backend's optimizer ops (backend.h): AdamW on one range, and on
 * many in one launch over a table of them kept on the device; the norm's
 * sums of squares posted into device slots, so a step reads them all back
 * with one copy instead of waiting once per range. Inside the cuda module
 * only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/launch.h"
#include "worker/backend/cuda_impl.h"

#define S(be) ((mega_cu_stream)impl_of(be)->stream)

/* Bias corrections, computed one way for both AdamW ops so their bits
 * agree. */
static void bias_corr(const mega_adamw_params *hp, float *bc1, float *bc2) {
  *bc1 = 1.0f - powf(hp->beta1, (float)hp->step);
  *bc2 = 1.0f - powf(hp->beta2, (float)hp->step);
}

void mega_cu__adamw(mega_backend *be, float *params, const float *grads, float *m, float *v,
                    size_t n, const mega_adamw_params *hp) {
  mega_cu__wrote(be, params, n);
  mega_cu__wrote(be, m, n);
  mega_cu__wrote(be, v, n);
  float bc1, bc2;
  bias_corr(hp, &bc1, &bc2);
  mega_cu__note(be, mega_cu_adamw(S(be), params, grads, m, v, (int64_t)n, hp->lr, hp->beta1,
                                  hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale, bc1,
                                  bc2),
                "adamw");
}

/* A device copy of host's table, kept by content. An optimizer's ranges
 * are the same every step (a rank steps two optimizers, its own and the
 * shard copy's: a slot each), so a table is uploaded once and later steps
 * only compare it. The upload waits for its copy (a pageable source may
 * be read after cudaMemcpyAsync returns, and the slot's host side is
 * rewritten by the next miss), which happens once per table, not per
 * step. A miss takes the least recently used slot: its device side is
 * rewritten in stream order, after the kernels queued on the old table. */
static const void *table_on_device(mega_backend *be, const void *host, size_t bytes) {
  cuda_impl *c = impl_of(be);
  mega_cu_table *t = &c->tables[0];
  for (int k = 0; k < MEGA_CU_TABLES; k++) {
    mega_cu_table *s = &c->tables[k];
    if (s->dev && s->bytes == bytes && memcmp(s->host, host, bytes) == 0) {
      s->used = ++c->table_clock;
      return s->dev;
    }
    if (s->used < t->used) t = s;
  }
  t->bytes = 0; /* matches nothing until the upload is done */
  void *h = realloc(t->host, bytes);
  if (!h) {
    mega_cu__note(be, (int)cudaErrorMemoryAllocation, "the AdamW table on the host");
    return NULL;
  }
  t->host = h;
  if (!mega_cu__grow(be, &t->dev, &t->cap, bytes, "the AdamW table")) return NULL;
  memcpy(t->host, host, bytes);
  cudaError_t e = cudaMemcpyAsync(t->dev, t->host, bytes, cudaMemcpyHostToDevice, c->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    mega_cu__note(be, (int)e, "uploading the AdamW table");
    return NULL;
  }
  t->bytes = bytes;
  t->used = ++c->table_clock;
  return t->dev;
}

/* The non-empty ranges laid end to end, in c->adamw_host; their count. */
static int lay_out(mega_backend *be, const mega_adamw_range *r, size_t count, int64_t *total) {
  cuda_impl *c = impl_of(be);
  if (count > c->adamw_cap) {
    mega_cu_adamw_range *h = realloc(c->adamw_host, count * sizeof *h);
    if (!h) {
      mega_cu__note(be, (int)cudaErrorMemoryAllocation, "the AdamW table on the host");
      return -1;
    }
    c->adamw_host = h;
    c->adamw_cap = count;
  }
  int n = 0;
  *total = 0;
  for (size_t i = 0; i < count; i++) {
    if (r[i].n == 0) continue;
    mega_cu_adamw_range *t = &c->adamw_host[n++];
    memset(t, 0, sizeof *t); /* the padding too: the table is compared as bytes */
    t->p = r[i].params;
    t->g = r[i].grads;
    t->m = r[i].m;
    t->v = r[i].v;
    t->start = *total;
    t->n = (int64_t)r[i].n;
    t->wd = r[i].weight_decay;
    *total += (int64_t)r[i].n;
  }
  return n;
}

void mega_cu__adamw_ranges(mega_backend *be, const mega_adamw_range *r, size_t count,
                           const mega_adamw_params *hp) {
  for (size_t i = 0; i < count; i++) {
    mega_cu__wrote(be, r[i].params, r[i].n);
    mega_cu__wrote(be, r[i].m, r[i].n);
    mega_cu__wrote(be, r[i].v, r[i].n);
  }
  int64_t total;
  int n = lay_out(be, r, count, &total);
  if (n <= 0) return;
  cuda_impl *c = impl_of(be);
  const mega_cu_adamw_range *table =
      table_on_device(be, c->adamw_host, (size_t)n * sizeof *c->adamw_host);
  if (!table) return;
  float bc1, bc2;
  bias_corr(hp, &bc1, &bc2);
  mega_cu__note(be, mega_cu_adamw_ranges(S(be), table, n, total, hp->lr, hp->beta1, hp->beta2,
                                         hp->eps, hp->grad_scale, bc1, bc2),
                "adamw over ranges");
}

/* Batches of MEGA_CU_SUM_RANGES ranges go by value as the kernels'
 * argument: no table to upload and nothing to keep alive. */
void mega_cu__sum_squares_post(mega_backend *be, const mega_sumsq_range *r, size_t count) {
  cuda_impl *c = impl_of(be);
  for (size_t k0 = 0; k0 < count; k0 += MEGA_CU_SUM_RANGES) {
    mega_cu_sum_ranges b = {.count = 0};
    for (size_t k = k0; k < count && b.count < MEGA_CU_SUM_RANGES; k++, b.count++) {
      mega_cu_b16_wrote(c->b16, r[k].out, sizeof *r[k].out);
      b.x[b.count] = r[k].x;
      b.n[b.count] = (int64_t)r[k].n;
      b.out[b.count] = r[k].out;
    }
    mega_cu__note(be, mega_cu_sumsq_ranges(S(be), c->partials, &b), "sum of squares");
  }
}

void mega_cu__optim_destroy(mega_backend *be) {
  cuda_impl *c = impl_of(be);
  for (int k = 0; k < MEGA_CU_TABLES; k++) {
    if (c->tables[k].dev) cudaFree(c->tables[k].dev);
    free(c->tables[k].host);
  }
  free(c->adamw_host);
}
