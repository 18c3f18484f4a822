/* The cuda backend's kernel launchers (kernels/gpt_kernels.cu and
 * kernels/flash_mma.cu), callable
 * from C. Each runs its per-thread body (kernels/gpt_bodies.h) over n items
 * on stream s and returns the launch's cudaError_t (0: launched; errors of
 * the kernel itself surface at the next synchronization). */
#ifndef MEGA_KERNELS_LAUNCH_H
#define MEGA_KERNELS_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dropout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *mega_cu_stream;

int mega_cu_encoder_fwd(mega_cu_stream s, float *out, const int32_t *tok, const float *wte,
                        int v0, int vn, const float *wpe, int N, int T, int C);
/* scratch: mega_cu_encoder_bwd_scratch(N) bytes of device memory. */
size_t mega_cu_encoder_bwd_scratch(int N);
int mega_cu_encoder_bwd(mega_cu_stream s, float *dwte, int v0, int vn, float *dwpe,
                        const float *dout, const int32_t *tok, int N, int T, int C,
                        void *scratch);
/* out16, where not NULL (here and in rmsnorm, swiglu, gelu, xent_bwd, and
 * dinp16 of the norms' backward):
 * the bf16 bits of
 * every float written to out, as mega_cu_to_bf16 would round them
 * (--bf16's copy for the next GEMM, worker/backend/cuda_b16.h); on 8 bytes
 * for the four-wide paths. */
int mega_cu_layernorm_fwd(mega_cu_stream s, float *out, uint16_t *out16, float *mean,
                          float *rstd, const float *inp, const float *w, const float *b, int N,
                          int C, float eps);
int mega_cu_layernorm_bwd_in(mega_cu_stream s, float *dinp, uint16_t *dinp16,
                             const float *dres, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N,
                             int C);
/* The column sums (layernorm_bwd_w, rmsnorm_bwd_w, bias_grad) take
 * scratch: mega_cu_columns_scratch(N, C) bytes of device memory (0: NULL
 * will do), for their row slices' partials (gpt_bodies.h's
 * mega_kc_slices). */
size_t mega_cu_columns_scratch(int64_t rows, int64_t cols);
int mega_cu_layernorm_bwd_w(mega_cu_stream s, float *dw, float *db, const float *dout,
                            const float *inp, const float *mean, const float *rstd, int N,
                            int C, void *scratch);
int mega_cu_rmsnorm_fwd(mega_cu_stream s, float *out, uint16_t *out16, float *rstd,
                        const float *inp, const float *w, int N, int C, float eps);
int mega_cu_rmsnorm_bwd_in(mega_cu_stream s, float *dinp, uint16_t *dinp16, const float *dres,
                           const float *dout, const float *inp, const float *w,
                           const float *rstd, int N, int C);
int mega_cu_rmsnorm_bwd_w(mega_cu_stream s, float *dw, const float *dout, const float *inp,
                          const float *rstd, int N, int C, void *scratch);
int mega_cu_swiglu_fwd(mega_cu_stream s, float *out, uint16_t *out16, const float *gate,
                       const float *up, int64_t n);
int mega_cu_swiglu_bwd(mega_cu_stream s, float *dgate, uint16_t *dgate16, float *dup,
                       uint16_t *dup16, const float *dout, const float *gate, const float *up,
                       int64_t n);
/* sign 1: rotate (forward); -1: rotate back (backward). */
int mega_cu_rope(mega_cu_stream s, float *x, const float *cs, int N, int T, int heads, int hs,
                 int ld, int rot, float sign);
/* GELU: erf, the exact form (kernels/elementwise.h's mega_gelu_erf); else
 * the tanh approximation (mega_gelu). */
int mega_cu_gelu_fwd(mega_cu_stream s, float *out, uint16_t *out16, const float *inp, int64_t n,
                     bool erf);
int mega_cu_gelu_bwd(mega_cu_stream s, float *dinp, uint16_t *dinp16, const float *inp,
                     const float *dout, int64_t n, bool erf);
int mega_cu_add(mega_cu_stream s, float *out, const float *a, const float *b,
                const float *bias, int64_t n, int C);
/* backend.h's bias_dropout_add over n = rows * C floats. */
int mega_cu_bias_dropout_add(mega_cu_stream s, float *out, const float *res, const float *y,
                             const float *bias, int64_t n, int C, const mega_dropout *d);
int mega_cu_bias_fill(mega_cu_stream s, float *out, const float *bias, const float *residual,
                      int64_t n, int OC);
/* dbias += the column sums of dout (round16: of dout rounded to bf16). */
int mega_cu_bias_grad(mega_cu_stream s, float *dbias, const float *dout, int N, int OC,
                      int round16, void *scratch);
/* The classifier, in place over the logits (backend.h's crossentropy ops). */
int mega_cu_xent_fwd(mega_cu_stream s, float *losses, float *logits, const int32_t *targets,
                     int N, int V);
int mega_cu_xent_bwd(mega_cu_stream s, float *probs, uint16_t *probs16, const int32_t *targets,
                     int v0, float scale, int N, int V);
/* The fused classifier (backend.h's crossentropy_forward_grad and
 * finish_grad): dlogits over the logits, and their bf16 bits in d16 when
 * not NULL. */
int mega_cu_xent_fwd_grad(mega_cu_stream s, float *losses, float *logits, uint16_t *d16,
                          const int32_t *targets, float scale, int N, int V);
int mega_cu_xent_finish_grad(mega_cu_stream s, float *losses, float *logits, uint16_t *d16,
                             const float *rowmax, const float *sums, const int32_t *targets,
                             int v0, float scale, int N, int V);
int mega_cu_xent_rowmax(mega_cu_stream s, float *rowmax, const float *logits, int N, int V);
int mega_cu_xent_sums(mega_cu_stream s, float *sums, const float *logits, const float *rowmax,
                      const int32_t *targets, int v0, int N, int V);
int mega_cu_xent_finish(mega_cu_stream s, float *losses, float *logits, const float *rowmax,
                        const float *sums, int N, int V);
int mega_cu_causal_softmax(mega_cu_stream s, float *att, int64_t rows, int T);
int mega_cu_causal_softmax_bwd(mega_cu_stream s, float *da, const float *att, int64_t rows,
                               int T, float scale);
/* dst = attention dropout of src, [rows, T] probabilities of NH heads a
 * sample (mega_kb_attn_dropout); dst may be src. */
int mega_cu_attn_dropout(mega_cu_stream s, float *dst, const float *src, int64_t rows, int NH,
                         int T, const mega_attn_dropout *d);
int mega_cu_adamw(mega_cu_stream s, float *p, const float *g, float *m, float *v, int64_t n,
                  float lr, float b1, float b2, float eps, float wd, float gs, float bc1,
                  float bc2);
int mega_cu_scale(mega_cu_stream s, float *x, int64_t n, float a);
/* A tensor's initial values (kernels/rng.h's mega_rng_init_normal). */
int mega_cu_init_normal(mega_cu_stream s, float *dst, int64_t n, uint64_t key, double std,
                        int64_t w, int64_t stride, int64_t off);
/* out[i] = in[i] as bf16 bits, rounded to nearest even (--bf16's GEMM inputs). */
int mega_cu_to_bf16(mega_cu_stream s, uint16_t *out, const float *in, int64_t n);
/* out (fp32, row stride ldo) = in (bf16 bits, ldi), rows x cols; out16
 * (ldo), where not NULL, the bf16 bits of every float written. */
int mega_cu_from_bf16(mega_cu_stream s, float *out, uint16_t *out16, int64_t ldo,
                      const uint16_t *in, int64_t ldi, int64_t rows, int64_t cols);
/* Causal flash attention under --bf16 (kernels/flash_mma.cu), for head
 * sizes it supports (64, 128). Shapes and strides as backend.h's
 * attention, q, k, v (and dout16) being bf16 copies with the same strides,
 * which must be multiples of 8, starting on 16 bytes; out, dout and ocopy
 * are fp32 [B*T, NH*hs], lse [B*NH, T]. The forward writes out, its copy
 * ocopy and the rows' log-sum-exp; the backward reads them and overwrites
 * dq, dk and dv (fp32), with D ([B*NH*T]) its scratch. */
int mega_cu_flash_supported(int hs);
int mega_cu_flash_fwd(mega_cu_stream s, float *out, float *lse, float *ocopy, const uint16_t *q,
                      const uint16_t *k, const uint16_t *v, int B, int T, int NH, int G, int hs,
                      int ldq, int ldkv);
int mega_cu_flash_bwd(mega_cu_stream s, float *dq, float *dk, float *dv, float *D,
                      const float *dout, const uint16_t *dout16, const float *ocopy,
                      const float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                      int B, int T, int NH, int G, int hs, int ldq, int ldkv);
/* partials[MEGA_CU_SUM_BLOCKS] (device) = block sums of x (or of x^2), in
 * double, in a fixed order: the host adds them, so results are
 * deterministic. */
#define MEGA_CU_SUM_BLOCKS 256
int mega_cu_sum(mega_cu_stream s, double *partials, const float *x, int64_t n, int squares);

/* Up to MEGA_CU_SUM_RANGES ranges whose sums of squares go to *out[k]
 * (device), passed by value so there is no table to upload. */
#define MEGA_CU_SUM_RANGES 32
typedef struct mega_cu_sum_ranges {
  const float *x[MEGA_CU_SUM_RANGES];
  int64_t n[MEGA_CU_SUM_RANGES];
  double *out[MEGA_CU_SUM_RANGES];
  int count;
} mega_cu_sum_ranges;
/* Each range's squares as mega_cu_sum's partials, into partials[k *
 * MEGA_CU_SUM_BLOCKS + b] (device, MEGA_CU_SUM_RANGES * MEGA_CU_SUM_BLOCKS
 * doubles); then one thread per range adds its partials in index order
 * into *out[k]: the bits of mega_cu_sum's partials added in order on the
 * host. Two launches; nothing waits. */
int mega_cu_sumsq_ranges(mega_cu_stream s, double *partials, const mega_cu_sum_ranges *r);

/* One range of mega_cu_adamw_ranges (a table in device memory): items
 * [start, start + n) of the ranges laid end to end, and its weight decay. */
typedef struct mega_cu_adamw_range {
  float *p;
  const float *g;
  float *m, *v;
  int64_t start, n;
  float wd;
} mega_cu_adamw_range;
/* AdamW over the count ranges of table (by start, none empty; total items
 * in all) in one launch, each item the body mega_cu_adamw runs
 * (mega_kb_adamw_ranges), so the bits are the same. */
int mega_cu_adamw_ranges(mega_cu_stream s, const mega_cu_adamw_range *table, int count,
                         int64_t total, float lr, float b1, float b2, float eps, float gs,
                         float bc1, float bc2);

#ifdef __cplusplus
}
#endif

#endif
