/* The cpu backend: memory, GEMM (OpenBLAS at one thread, split over the
 * backend's threads), matmuls, reductions, AdamW and the ops table. The row
 * and element kernels are in cpu_ops.c (Llama's in cpu_llama.c), attention
 * in cpu_attention.c (on the tiles of cpu_tile.c), the threads in
 * cpu_pool.c. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "kernels/rng.h"
#include "worker/backend/cpu_internal.h"

/* --- opts.track_memory: the live allocations, so that a test can tell
 * backend memory from host memory (mega_backend_cpu_owns) --- */

static bool track_add(mega_cpu_impl *impl, void *p, size_t bytes) {
  pthread_mutex_lock(&impl->track_mu);
  bool ok = true;
  if (impl->ntracked == impl->track_cap) {
    size_t cap = impl->track_cap ? 2 * impl->track_cap : 64;
    mega_cpu_block *b = realloc(impl->tracked, cap * sizeof *b);
    if (b) {
      impl->tracked = b;
      impl->track_cap = cap;
    } else {
      ok = false;
    }
  }
  if (ok) impl->tracked[impl->ntracked++] = (mega_cpu_block){.p = p, .bytes = bytes};
  pthread_mutex_unlock(&impl->track_mu);
  return ok;
}

static void track_remove(mega_cpu_impl *impl, void *p) {
  pthread_mutex_lock(&impl->track_mu);
  for (size_t i = 0; i < impl->ntracked; i++)
    if (impl->tracked[i].p == p) {
      impl->tracked[i] = impl->tracked[--impl->ntracked];
      break;
    }
  pthread_mutex_unlock(&impl->track_mu);
}

bool mega_backend_cpu_owns(mega_backend *be, const void *p, size_t bytes) {
  mega_cpu_impl *impl = be->impl;
  if (!impl->track) return false;
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&impl->track_mu);
  bool in = false;
  for (size_t i = 0; i < impl->ntracked && !in; i++) {
    uintptr_t b = (uintptr_t)impl->tracked[i].p;
    in = a >= b && a - b <= impl->tracked[i].bytes && bytes <= impl->tracked[i].bytes - (a - b);
  }
  pthread_mutex_unlock(&impl->track_mu);
  return in;
}

static mega_status cpu_alloc(mega_backend *be, size_t bytes, void **out, mega_err *err) {
  mega_cpu_impl *impl = be->impl;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void *p = aligned_alloc(64, rounded);
  if (!p) {
    bool gib = bytes >= (size_t)1 << 30;
    return mega_fail(err, MEGA_ERR_NOMEM,
                     "cpu backend: cannot allocate %.1f %s (%zu bytes): out of memory",
                     (double)bytes / (gib ? 1 << 30 : 1 << 20), gib ? "GiB" : "MiB", bytes);
  }
  memset(p, 0, rounded);
  if (impl->track && !track_add(impl, p, bytes)) {
    free(p);
    return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: out of memory tracking allocations");
  }
  *out = p;
  return MEGA_OK;
}

static void cpu_free(mega_backend *be, void *p) {
  mega_cpu_impl *impl = be->impl;
  if (p && impl->track) track_remove(impl, p);
  free(p);
}

static void cpu_memset0(mega_backend *be, void *p, size_t bytes) {
  (void)be;
  if (bytes) memset(p, 0, bytes);
}

static mega_status cpu_memcpy(mega_backend *be, void *dst, const void *src, size_t bytes,
                              mega_copy_kind kind, mega_err *err) {
  (void)be;
  if (kind != MEGA_COPY_H2D && kind != MEGA_COPY_D2H && kind != MEGA_COPY_D2D)
    return mega_fail(err, MEGA_ERR_INVALID, "cpu backend: bad copy kind %d", (int)kind);
  if (bytes && dst != src) memmove(dst, src, bytes);
  return MEGA_OK;
}

/* A compute op's failure (--bf16's scratch memory), kept for the next
 * synchronize, as the cuda backend keeps its errors. */
static mega_status cpu_synchronize(mega_backend *be, mega_err *err) {
  mega_cpu_impl *impl = be->impl;
  if (!impl->failed) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_NOMEM, "%s", impl->why);
}

static mega_status cpu_set_bf16(mega_backend *be, bool on, mega_err *err) {
  (void)err;
  ((mega_cpu_impl *)be->impl)->bf16 = on;
  return MEGA_OK;
}

static mega_status cpu_set_threads(mega_backend *be, int n, mega_err *err) {
  mega_cpu_impl *impl = be->impl;
  if (n < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "cpu backend: threads must be at least 1, got %d",
                     n);
  if (n == impl->threads) return MEGA_OK;
  mega_cpu_pool *pool;
  mega_status st = mega_cpu_pool_create(n, &pool, err);
  if (st) return st;
  mega_cpu_pool_destroy(impl->pool);
  impl->pool = pool;
  impl->threads = n;
  return MEGA_OK;
}

typedef struct bias_ctx {
  float *rows, *bias;
  const float *cbias, *crows;
  int N, OC;
} bias_ctx;

/* out[n, :] = bias (+ residual[n, :]), before a GEMM that adds into it
 * (beta = 1): the pass that replaces the GEMM's own zeroing of out. */
MEGA_CPU_CLONES
static void fill_bias_rows(void *vc, int64_t n0, int64_t n1) {
  const bias_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    float *o = c->rows + n * c->OC;
    const float *r = c->crows ? c->crows + n * c->OC : NULL;
    if (r && c->cbias)
      for (int j = 0; j < c->OC; j++) o[j] = r[j] + c->cbias[j];
    else if (r)
      memmove(o, r, c->OC * sizeof(float));
    else
      memcpy(o, c->cbias, c->OC * sizeof(float));
  }
}

/* One sgemm split into row blocks (or column blocks, when C is wider than
 * tall) over the backend's threads, OpenBLAS itself running one thread:
 * its idle threads spin, which on shared cores costs more than they give. */
typedef struct gemm_ctx {
  bool ta, tb, split_cols;
  int M, N, K, lda, ldb, ldc;
  float alpha, beta;
  const float *A, *B;
  float *C;
  const bias_ctx *fill; /* matmul_forward: prefill C's rows first */
} gemm_ctx;

static void gemm_part(void *vc, int64_t p0, int64_t p1) {
  const gemm_ctx *g = vc;
  int n = (int)(p1 - p0);
  CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
  if (g->split_cols) {
    const float *B = g->tb ? g->B + p0 * g->ldb : g->B + p0;
    cblas_sgemm(CblasRowMajor, ta, tb, g->M, n, g->K, g->alpha, g->A, g->lda, B, g->ldb,
                g->beta, g->C + p0, g->ldc);
  } else {
    if (g->fill) fill_bias_rows((void *)g->fill, p0, p1);
    const float *A = g->ta ? g->A + p0 : g->A + p0 * g->lda;
    cblas_sgemm(CblasRowMajor, ta, tb, n, g->N, g->K, g->alpha, A, g->lda, g->B, g->ldb,
                g->beta, g->C + p0 * g->ldc, g->ldc);
  }
}

static void par_gemm(mega_backend *be, gemm_ctx *g) {
  if (g->M <= 0 || g->N <= 0) return;
  g->split_cols = !g->fill && g->N > g->M;
  mega_cpu_pool *pool = mega_cpu_pool_of(be);
  int64_t n = g->split_cols ? g->N : g->M;
  /* two blocks per thread: each block packs the other operand again */
  int64_t grain = n / (2 * mega_cpu_pool_threads(pool));
  mega_cpu_parallel_for(pool, n, grain > 64 ? grain : 64, gemm_part, g);
}

static void cpu_gemm(mega_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc) {
  gemm_ctx g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .A = A,
                .lda = lda, .B = B, .ldb = ldb, .beta = beta, .C = C, .ldc = ldc};
  par_gemm(be, &g);
}

static void cpu_gemm_batched(mega_backend *be, bool ta, bool tb, int M, int N, int K,
                             float alpha, const float *A, int lda, int64_t sa,
                             const float *B, int ldb, int64_t sb, float beta, float *C,
                             int ldc, int64_t sc, int batch) {
  for (int i = 0; i < batch; i++)
    cpu_gemm(be, ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc,
             ldc);
}

/* dbias[j] += sum_n dout[n, j], threads owning column ranges. */
MEGA_CPU_CLONES
static void sum_rows_cols(void *vc, int64_t j0, int64_t j1) {
  const bias_ctx *c = vc;
  for (int n = 0; n < c->N; n++) {
    const float *d = c->crows + (size_t)n * c->OC;
    for (int64_t j = j0; j < j1; j++) c->bias[j] += d[j];
  }
}

static void cpu_matmul_forward(mega_backend *be, float *out, const float *inp,
                               const float *w, const float *bias, const float *residual,
                               int N, int C, int OC, mega_wlayout lay) {
  bias_ctx fill = {.rows = out, .cbias = bias, .crows = residual, .N = N, .OC = OC};
  inp = mega_cpu_bf16_copy(be, 0, inp, (size_t)N * C);
  w = mega_cpu_bf16_copy(be, 1, w, (size_t)C * OC);
  if (!inp || !w) return;
  gemm_ctx g = {.tb = lay == MEGA_W_OUT_IN, .M = N, .N = OC, .K = C, .alpha = 1.0f,
                .A = inp, .lda = C, .B = w, .ldb = lay == MEGA_W_IN_OUT ? OC : C,
                .C = out, .ldc = OC};
  if (bias || residual) g.beta = 1.0f;
  if (bias || (residual && residual != out)) g.fill = &fill;
  par_gemm(be, &g);
}

static void cpu_matmul_backward_input(mega_backend *be, float *dinp, const float *dout,
                                      const float *w, int N, int C, int OC,
                                      mega_wlayout lay, bool accumulate) {
  dout = mega_cpu_bf16_copy(be, 0, dout, (size_t)N * OC);
  w = mega_cpu_bf16_copy(be, 1, w, (size_t)C * OC);
  if (!dout || !w) return;
  gemm_ctx g = {.tb = lay == MEGA_W_IN_OUT, .M = N, .N = C, .K = OC, .alpha = 1.0f,
                .A = dout, .lda = OC, .B = w, .ldb = lay == MEGA_W_IN_OUT ? OC : C,
                .beta = accumulate ? 1.0f : 0.0f, .C = dinp, .ldc = C};
  par_gemm(be, &g);
}

static void cpu_matmul_backward_weight(mega_backend *be, float *dw, float *dbias,
                                       const float *dout, const float *inp, int N, int C,
                                       int OC, mega_wlayout lay) {
  gemm_ctx g = {.ta = true, .alpha = 1.0f, .beta = 1.0f, .C = dw};
  const float *din = mega_cpu_bf16_copy(be, 0, inp, (size_t)N * C);
  const float *dh = mega_cpu_bf16_copy(be, 1, dout, (size_t)N * OC);
  if (lay == MEGA_W_IN_OUT)
    g.M = C, g.N = OC, g.K = N, g.A = din, g.lda = C, g.B = dh, g.ldb = OC, g.ldc = OC;
  else
    g.M = OC, g.N = C, g.K = N, g.A = dh, g.lda = OC, g.B = din, g.ldb = C, g.ldc = C;
  if (!din || !dh) return;
  par_gemm(be, &g);
  if (dbias) { /* from the gradient the GEMM read: under --bf16, rounded */
    bias_ctx c = {.bias = dbias, .crows = dh, .N = N, .OC = OC};
    mega_cpu_parallel_for(mega_cpu_pool_of(be), OC, 64, sum_rows_cols, &c);
  }
}

typedef struct adamw_ctx {
  float *p, *m, *v;
  const float *g;
  float lr, b1, b2, eps, wd, gs, bc1, bc2, s;
  double partial[64]; /* per block, for the reductions */
  int64_t chunk, n;
  int squares;
} adamw_ctx;

MEGA_CPU_CLONES
static void adamw_range(void *vc, int64_t i0, int64_t i1) {
  const adamw_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++)
    mega_adamw_elem(&c->p[i], &c->m[i], &c->v[i], c->g[i] * c->gs, c->lr, c->b1, c->b2,
                    c->eps, c->wd, c->bc1, c->bc2);
}

static void cpu_adamw(mega_backend *be, float *params, const float *grads, float *m,
                      float *v, size_t n, const mega_adamw_params *hp) {
  adamw_ctx c = {.p = params, .g = grads, .m = m, .v = v, .lr = hp->lr, .b1 = hp->beta1,
                 .b2 = hp->beta2, .eps = hp->eps, .wd = hp->weight_decay,
                 .gs = hp->grad_scale, .bc1 = 1.0f - powf(hp->beta1, (float)hp->step),
                 .bc2 = 1.0f - powf(hp->beta2, (float)hp->step)};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, adamw_range,
                        &c);
}

/* Blocks of 256 floats summed in float by 8 lanes, blocks added in double:
 * vectorised, and accurate far past what a float sum would be. */
MEGA_CPU_CLONES
static double sum_impl(const float *x, size_t n, int squares) {
  double total = 0.0;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    float acc[8] = {0};
    for (int j = 0; j < 256; j += 8)
      for (int k = 0; k < 8; k++) {
        float e = x[i + j + k];
        acc[k] += squares ? e * e : e;
      }
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += acc[k];
    total += s;
  }
  for (; i < n; i++) total += squares ? (double)x[i] * x[i] : x[i];
  return total;
}

/* Over block indices k0..k1 of c->chunk floats each (c->p holds n). */
static void sum_blocks(void *vc, int64_t k0, int64_t k1) {
  adamw_ctx *c = vc;
  for (int64_t k = k0; k < k1; k++) {
    int64_t b = k * c->chunk, e = b + c->chunk < c->n ? b + c->chunk : c->n;
    c->partial[k] = sum_impl(c->g + b, (size_t)(e - b), c->squares);
  }
}

/* Blocks fixed by n alone, added in order: the result does not depend on
 * the thread count. */
static double sum_any(mega_backend *be, const float *x, size_t n, int squares) {
  adamw_ctx c = {.g = x, .squares = squares, .n = (int64_t)n};
  c.chunk = ((int64_t)n + 63) / 64;
  if (c.chunk < (1 << 16)) c.chunk = 1 << 16;
  int64_t chunks = ((int64_t)n + c.chunk - 1) / c.chunk;
  mega_cpu_parallel_for(mega_cpu_pool_of(be), chunks, 1, sum_blocks, &c);
  double total = 0.0;
  for (int64_t k = 0; k < chunks; k++) total += c.partial[k];
  return total;
}

static mega_status cpu_sum(mega_backend *be, const float *x, size_t n, double *out,
                           mega_err *err) {
  (void)err;
  *out = sum_any(be, x, n, 0);
  return MEGA_OK;
}

static mega_status cpu_sum_squares(mega_backend *be, const float *x, size_t n, double *out,
                                   mega_err *err) {
  (void)err;
  *out = sum_any(be, x, n, 1);
  return MEGA_OK;
}

MEGA_CPU_CLONES
static void scale_range(void *vc, int64_t i0, int64_t i1) {
  const adamw_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) c->p[i] *= c->s;
}

static void cpu_scale(mega_backend *be, float *x, size_t n, float s) {
  adamw_ctx c = {.p = x, .s = s};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, scale_range,
                        &c);
}

typedef struct init_ctx {
  float *dst;
  uint64_t key;
  double std;
  int64_t w, stride, off;
} init_ctx;

static void init_range(void *vc, int64_t i0, int64_t i1) {
  const init_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) mega_rng_init_normal(i, c->dst, c->key, c->std, c->w,
                                                         c->stride, c->off);
}

/* About 60 ns an element (log, cos, four mixes): GPT-2 124M took 7.8 s on
 * one thread, so the pool shares it. */
static void cpu_init_normal(mega_backend *be, float *dst, size_t n, uint64_t key, double std,
                            size_t w, size_t stride, size_t off) {
  init_ctx c = {.dst = dst, .key = key, .std = std, .w = (int64_t)w, .stride = (int64_t)stride,
                .off = (int64_t)off};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, 1 << 14, init_range, &c);
}

static void cpu_destroy(mega_backend *be) {
  mega_cpu_impl *impl = be->impl;
  mega_cpu_pool_destroy(impl->pool);
  pthread_mutex_destroy(&impl->track_mu);
  free(impl->tracked);
  for (int k = 0; k < MEGA_CPU_B16_SLOTS; k++) free(impl->bf16_buf[k]);
  free(impl);
  free(be);
}

static const mega_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .memcpy = cpu_memcpy,
    .synchronize = cpu_synchronize,
    .set_threads = cpu_set_threads,
    .set_bf16 = cpu_set_bf16,
    .gemm = cpu_gemm,
    .gemm_batched = cpu_gemm_batched,
    .encoder_forward = mega_cpu_encoder_forward,
    .encoder_backward = mega_cpu_encoder_backward,
    .layernorm_forward = mega_cpu_layernorm_forward,
    .layernorm_backward_input = mega_cpu_layernorm_backward_input,
    .layernorm_backward_weight = mega_cpu_layernorm_backward_weight,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward_input = cpu_matmul_backward_input,
    .matmul_backward_weight = cpu_matmul_backward_weight,
    .attention_forward = mega_cpu_attention_forward,
    .attention_backward = mega_cpu_attention_backward,
    .rmsnorm_forward = mega_cpu_rmsnorm_forward,
    .rmsnorm_backward_input = mega_cpu_rmsnorm_backward_input,
    .rmsnorm_backward_weight = mega_cpu_rmsnorm_backward_weight,
    .swiglu_forward = mega_cpu_swiglu_forward,
    .swiglu_backward = mega_cpu_swiglu_backward,
    .rope_forward = mega_cpu_rope_forward,
    .rope_backward = mega_cpu_rope_backward,
    .gelu_forward = mega_cpu_gelu_forward,
    .gelu_backward = mega_cpu_gelu_backward,
    .gelu_erf_forward = mega_cpu_gelu_erf_forward,
    .gelu_erf_backward = mega_cpu_gelu_erf_backward,
    .residual_forward = mega_cpu_residual_forward,
    .bias_residual_forward = mega_cpu_bias_residual_forward,
    .bias_dropout_add = mega_cpu_bias_dropout_add,
    .crossentropy_forward = mega_cpu_crossentropy_forward,
    .crossentropy_backward = mega_cpu_crossentropy_backward,
    .crossentropy_rowmax = mega_cpu_crossentropy_rowmax,
    .crossentropy_sums = mega_cpu_crossentropy_sums,
    .crossentropy_finish = mega_cpu_crossentropy_finish,
    .crossentropy_forward_grad = mega_cpu_crossentropy_forward_grad,
    .crossentropy_finish_grad = mega_cpu_crossentropy_finish_grad,
    .adamw = cpu_adamw,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .init_normal = cpu_init_normal,
};

const char *mega_backend_cpu_blas_core(void) { return openblas_get_corename(); }

mega_status mega_backend_cpu_create(const mega_backend_cpu_opts *opts, mega_backend **out,
                                    mega_err *err) {
  int threads = opts && opts->threads ? opts->threads : 1;
  if (threads < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cpu backend: BLAS threads must be at least 1, got %d", threads);
  mega_backend *be = calloc(1, sizeof *be);
  mega_cpu_impl *impl = calloc(1, sizeof *impl);
  if (!be || !impl) {
    free(be);
    free(impl);
    return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: out of memory");
  }
  mega_status st = mega_cpu_pool_create(threads, &impl->pool, err);
  if (st) {
    free(be);
    free(impl);
    return st;
  }
  impl->threads = threads;
  impl->track = opts && opts->track_memory;
  pthread_mutex_init(&impl->track_mu, NULL);
  be->ops = &cpu_ops;
  be->impl = impl;
  openblas_set_num_threads(1); /* the backend's threads split the GEMMs */
  *out = be;
  return MEGA_OK;
}
