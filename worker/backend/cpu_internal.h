/* Shared between the cpu backend's files; not a public header. */
#ifndef MEGA_WORKER_BACKEND_CPU_INTERNAL_H
#define MEGA_WORKER_BACKEND_CPU_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "worker/backend/backend.h"

/* Hot loops get an AVX-512 and an AVX2 clone picked at load time, so a
 * generic build still runs them at the machine's width. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MEGA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MEGA_CPU_CLONES
#endif

/* Worker threads for the ops' own loops (OpenBLAS has its own). */
typedef struct mega_cpu_pool mega_cpu_pool;
typedef void (*mega_cpu_task)(void *ctx, int64_t begin, int64_t end);
/* threads <= 1 gives *out = NULL, which every pool function accepts. */
mega_status mega_cpu_pool_create(int threads, mega_cpu_pool **out, mega_err *err);
void mega_cpu_pool_destroy(mega_cpu_pool *p);
int mega_cpu_pool_threads(const mega_cpu_pool *p);
/* Runs fn over [0, n) split in contiguous chunks of at least grain items
 * (a few per thread, claimed by whichever thread is free); returns when all
 * are done. */
void mega_cpu_parallel_for(mega_cpu_pool *p, int64_t n, int64_t grain, mega_cpu_task fn,
                           void *ctx);

typedef struct mega_cpu_block {
  void *p;
  size_t bytes;
} mega_cpu_block;

/* --bf16's rounded copies: slots 0 and 1 a matmul's two GEMM inputs,
 * MEGA_CPU_B16_Q.. attention's (cpu_attention.c). */
enum { MEGA_CPU_B16_Q = 2, MEGA_CPU_B16_K, MEGA_CPU_B16_V, MEGA_CPU_B16_DOUT,
       MEGA_CPU_B16_SLOTS };

typedef struct mega_cpu_impl {
  int threads;
  mega_cpu_pool *pool;
  bool track; /* opts.track_memory: live allocations in tracked[] (under track_mu) */
  pthread_mutex_t track_mu;
  mega_cpu_block *tracked;
  size_t ntracked, track_cap;
  bool bf16;            /* set_bf16: GEMM and attention inputs rounded into bf16_buf */
  float *bf16_buf[MEGA_CPU_B16_SLOTS];
  size_t bf16_cap[MEGA_CPU_B16_SLOTS]; /* floats */
  bool failed;          /* a compute op's failure, for synchronize */
  char why[160];
} mega_cpu_impl;

static inline mega_cpu_pool *mega_cpu_pool_of(mega_backend *be) {
  return ((mega_cpu_impl *)be->impl)->pool;
}

/* x (n floats) rounded to bf16 into copy slot k (cpu_ops.c); x itself when bf16 is
 * off; NULL when the slot cannot grow (kept for synchronize: the caller
 * skips its work). */
const float *mega_cpu_bf16_copy(mega_backend *be, int k, const float *x, size_t n);

/* Row reductions keep MEGA_LANES independent partial sums (or maxima), one
 * per vector lane: an in-order float sum cannot be vectorised (GCC keeps
 * its order without -ffast-math), lanes can. */
#define MEGA_LANES 16

static inline float mega_lanes_sum(const float *acc) {
  float s = 0.0f;
  for (int k = 0; k < MEGA_LANES; k++) s += acc[k];
  return s;
}

static inline float mega_lanes_max(const float *acc) {
  float m = acc[0];
  for (int k = 1; k < MEGA_LANES; k++) m = acc[k] > m ? acc[k] : m;
  return m;
}

/* Items per chunk below which splitting costs more than it saves. */
#define MEGA_CPU_GRAIN_ELEMS 16384

/* Small row-major products for attention (cpu_tile.c):
 * nn: C[M x N] = alpha * A[M x K] B[K x N]; tn: the same with A^T, A [K x M];
 * tn_acc adds into C instead (grouped-query attention's key and value
 * gradients, summed over their query heads). */
void mega_cpu_tile_nn(int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc);
void mega_cpu_tile_tn(int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc);
void mega_cpu_tile_tn_acc(int M, int N, int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float *C, int ldc);

void mega_cpu_encoder_forward(mega_backend *be, float *out, const int32_t *tok,
                              const float *wte, int v0, int vn, const float *wpe, int B, int T,
                              int C);
void mega_cpu_encoder_backward(mega_backend *be, float *dwte, int v0, int vn, float *dwpe,
                               const float *dout, const int32_t *tok, int B, int T, int C);
void mega_cpu_layernorm_forward(mega_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *w, const float *b, int N,
                                int C, float eps);
void mega_cpu_layernorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                       const float *dout,
                                       const float *inp, const float *w,
                                       const float *mean, const float *rstd, int N, int C);
void mega_cpu_layernorm_backward_weight(mega_backend *be, float *dw, float *db,
                                        const float *dout, const float *inp,
                                        const float *mean, const float *rstd, int N,
                                        int C);
void mega_cpu_gelu_forward(mega_backend *be, float *out, const float *inp, size_t n);
void mega_cpu_gelu_backward(mega_backend *be, float *dinp, const float *inp,
                            const float *dout, size_t n);
void mega_cpu_gelu_erf_forward(mega_backend *be, float *out, const float *inp, size_t n);
void mega_cpu_gelu_erf_backward(mega_backend *be, float *dinp, const float *inp,
                                const float *dout, size_t n);
void mega_cpu_residual_forward(mega_backend *be, float *out, const float *a,
                               const float *b, size_t n);
void mega_cpu_crossentropy_forward(mega_backend *be, float *losses, float *logits,
                                   const int32_t *targets, int N, int V);
void mega_cpu_crossentropy_backward(mega_backend *be, float *probs, const int32_t *targets,
                                    int v0, float scale, int N, int V);
void mega_cpu_crossentropy_forward_grad(mega_backend *be, float *losses, float *logits,
                                        const int32_t *targets, float scale, int N, int V);
/* Row d of probabilities becomes dlogits: d * scale, then minus scale at
 * the target t when it is in the row (the backward's expression, whose bits
 * the tests keep; the fused ops run it on a row the forward just wrote). */
static inline void mega_cpu_xent_grad_row(float *d, int V, int64_t t, float scale) {
  for (int i = 0; i < V; i++) d[i] *= scale;
  if (t >= 0 && t < V) d[t] -= scale;
}
void mega_cpu_bias_residual_forward(mega_backend *be, float *out, const float *a,
                                    const float *b, const float *bias, int N, int C);
void mega_cpu_bias_dropout_add(mega_backend *be, float *out, const float *res, const float *y,
                               const float *bias, int rows, int C, const mega_dropout *d);
/* cpu_vocab.c: vocabulary-parallel cross-entropy */
void mega_cpu_crossentropy_rowmax(mega_backend *be, float *rowmax, const float *logits, int N,
                                  int V);
void mega_cpu_crossentropy_sums(mega_backend *be, float *sums, const float *logits,
                                const float *rowmax, const int32_t *targets, int v0, int N,
                                int V);
void mega_cpu_crossentropy_finish(mega_backend *be, float *losses, float *logits,
                                  const float *rowmax, const float *sums, int N, int V);
void mega_cpu_crossentropy_finish_grad(mega_backend *be, float *losses, float *logits,
                                       const float *rowmax, const float *sums,
                                       const int32_t *targets, int v0, float scale, int N,
                                       int V);
void mega_cpu_attention_forward(mega_backend *be, float *out, float *att, float *scratch,
                                const float *q, const float *k, const float *v,
                                const mega_attn_dims *d);
void mega_cpu_attention_backward(mega_backend *be, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *att,
                                 const mega_attn_dims *d);
/* cpu_llama.c: RMSNorm, SwiGLU, RoPE */
void mega_cpu_rmsnorm_forward(mega_backend *be, float *out, float *rstd, const float *inp,
                              const float *w, int N, int C, float eps);
void mega_cpu_rmsnorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                     const float *dout, const float *inp, const float *w,
                                     const float *rstd, int N, int C);
void mega_cpu_rmsnorm_backward_weight(mega_backend *be, float *dw, const float *dout,
                                      const float *inp, const float *rstd, int N, int C);
void mega_cpu_swiglu_forward(mega_backend *be, float *out, const float *gate, const float *up,
                             size_t n);
void mega_cpu_swiglu_backward(mega_backend *be, float *dgate, float *dup, const float *dout,
                              const float *gate, const float *up, size_t n);
void mega_cpu_rope_forward(mega_backend *be, float *x, const float *cs, int B, int T,
                           int heads, int hs, int ld, int rot);
void mega_cpu_rope_backward(mega_backend *be, float *dx, const float *cs, int B, int T,
                            int heads, int hs, int ld, int rot);

#endif
