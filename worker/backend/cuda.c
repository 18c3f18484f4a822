/* The cuda backend: backend.h's ops on one device, in order on one compute
 * stream. Memory is cudaMalloc'd; GEMMs are cuBLAS (fp32; with --bf16 the
 * matmuls' are cublasGemmEx on bf16 copies of their inputs, the forward's
 * cuBLASLt with the bias and residual in its epilogue: cuda_lt.c) on the
 * same stream; the other ops are the kernels of kernels/gpt_kernels.cu.
 * Attention is cuda_attn.c's; AdamW and the norm's posted sums are
 * cuda_optim.c's; what the op files share is cuda_shared.c's (the sticky
 * failure, scratch, the bf16 copies). Under --bf16 the rounded copies of GEMM
 * inputs are kept while their sources are unchanged (cuda_b16.h), so every
 * op first says what it writes; an op writing a GEMM's whole input writes
 * its copy too (produced).
 * Compute ops cannot report errors (backend.h), so the first failure is kept and returned by the next op that can fail (memcpy,
 * synchronize, the reductions), as NCCL reports asynchronous errors.
 *
 * Built into the shared module libmega_cuda.so (worker/backend/cuda_module.c)
 * and never linked into megaw itself. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/launch.h"
#include "worker/backend/attn_gemm.h"
#include "worker/backend/cuda_b16.h"
#include "worker/backend/cuda_impl.h"
#include "worker/backend/cuda_lt.h"

#define S(be) ((mega_cu_stream)impl_of(be)->stream)
#define note mega_cu__note /* cuda_shared.c's, by their short names */
#define take_sticky mega_cu__take_sticky
#define check mega_cu__check
#define wrote mega_cu__wrote
#define produced mega_cu__produced
#define filled mega_cu__filled
#define dev_malloc mega_cu__dev_malloc
#define grow mega_cu__grow
#define bf16_copy mega_cu__bf16_copy

static void note_blas(mega_backend *be, cublasStatus_t st, const char *what) {
  cuda_impl *c = impl_of(be);
  if (st == CUBLAS_STATUS_SUCCESS || c->sticky != MEGA_OK) return;
  c->sticky = MEGA_ERR_INTERNAL;
  snprintf(c->why, sizeof c->why, "cuda backend: cuBLAS %s failed (status %d)", what, (int)st);
}

/* ---- memory ---- */

static mega_status cu_alloc(mega_backend *be, size_t bytes, void **out, mega_err *err) {
  void *p = NULL;
  cudaError_t e = dev_malloc(be, &p, bytes);
  if (e != cudaSuccess)
    return mega_fail(err, MEGA_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes on device %d: %s",
                     bytes, impl_of(be)->device, cudaGetErrorString(e));
  /* backend.h: fresh memory reads as zeros, as the cpu backend's does */
  e = cudaMemsetAsync(p, 0, bytes ? bytes : 64, impl_of(be)->stream);
  if (e != cudaSuccess) {
    cudaFree(p);
    return check(be, e, "zeroing an allocation", err);
  }
  *out = p;
  return MEGA_OK;
}

static void cu_free(mega_backend *be, void *p) {
  if (!p) return;
  mega_cu_b16_clear(impl_of(be)->b16); /* its size is unknown here: every copy goes */
  /* the stream may still use p */
  note(be, cudaStreamSynchronize(impl_of(be)->stream), "free");
  note(be, cudaFree(p), "free");
}

static void cu_memset0(mega_backend *be, void *p, size_t bytes) {
  mega_cu_b16_wrote(impl_of(be)->b16, p, bytes);
  if (bytes) note(be, cudaMemsetAsync(p, 0, bytes, impl_of(be)->stream), "memset");
}

static mega_status cu_memcpy(mega_backend *be, void *dst, const void *src, size_t bytes,
                             mega_copy_kind kind, mega_err *err) {
  static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                              cudaMemcpyDeviceToDevice};
  if (kind != MEGA_COPY_H2D && kind != MEGA_COPY_D2H && kind != MEGA_COPY_D2D)
    return mega_fail(err, MEGA_ERR_INVALID, "cuda backend: bad copy kind %d", (int)kind);
  if (!bytes || dst == src) return take_sticky(be, err);
  if (kind != MEGA_COPY_D2H) mega_cu_b16_wrote(impl_of(be)->b16, dst, bytes);
  cudaStream_t s = impl_of(be)->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind], s);
  /* host-visible results are complete on return (backend.h); a pageable
   * host source is also free to reuse only after the copy */
  if (e == cudaSuccess && kind != MEGA_COPY_D2D) e = cudaStreamSynchronize(s);
  return check(be, e, "memcpy", err);
}

static mega_status cu_synchronize(mega_backend *be, mega_err *err) {
  return check(be, cudaStreamSynchronize(impl_of(be)->stream), "synchronize", err);
}

static mega_status cu_set_threads(mega_backend *be, int n, mega_err *err) {
  (void)be;
  if (n < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "cuda backend: threads must be at least 1, got %d", n);
  return MEGA_OK; /* host threads do not matter to the device */
}

/* ---- GEMM: row-major through column-major cuBLAS (C^T = B^T A^T) ---- */

static void cu_gemm(mega_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C,
                    int ldc) {
  if (M <= 0 || N <= 0) return;
  wrote(be, C, (size_t)(M - 1) * ldc + N);
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  note_blas(be, cublasSgemm(impl_of(be)->blas, opb, opa, N, M, K, &alpha, B, ldb, A, lda, &beta,
                            C, ldc),
            "sgemm");
}

static void cu_gemm_batched(mega_backend *be, bool ta, bool tb, int M, int N, int K,
                            float alpha, const float *A, int lda, int64_t sa, const float *B,
                            int ldb, int64_t sb, float beta, float *C, int ldc, int64_t sc,
                            int batch) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  wrote(be, C, (size_t)(batch - 1) * sc + (size_t)(M - 1) * ldc + N);
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  note_blas(be, cublasSgemmStridedBatched(impl_of(be)->blas, opb, opa, N, M, K, &alpha, B, ldb,
                                          sb, A, lda, sa, &beta, C, ldc, sc, batch),
            "sgemm (strided batched)");
}

/* ---- --bf16: the matmuls' GEMMs on bf16 copies of their inputs ---- */

static mega_status cu_set_bf16(mega_backend *be, bool on, mega_err *err) {
  impl_of(be)->bf16 = on;
  mega_cu_b16_clear(impl_of(be)->b16);
  return take_sticky(be, err);
}




/* C = op(A) op(B) + beta C on bf16 A and B, fp32 C, CUBLAS_COMPUTE_32F
 * (fp32 accumulation), row-major through column-major as cu_gemm does. */
static void gemm16(mega_backend *be, bool ta, bool tb, int M, int N, int K, const uint16_t *a,
                   int lda, const uint16_t *b, int ldb, float beta, float *C, int ldc) {
  float alpha = 1.0f;
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  note_blas(be, cublasGemmEx(impl_of(be)->blas, opb, opa, N, M, K, &alpha, b, CUDA_R_16BF, ldb, a,
                             CUDA_R_16BF, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
            "bf16 GEMM (cublasGemmEx)");
}

/* A matmul's GEMM (alpha 1): cu_gemm, or under --bf16 gemm16 on bf16
 * copies of A (na floats) and B (nb floats). */
static void mm_gemm(mega_backend *be, bool ta, bool tb, int M, int N, int K, const float *A,
                    int lda, size_t na, const float *B, int ldb, size_t nb, float beta, float *C,
                    int ldc) {
  cuda_impl *c = impl_of(be);
  if (!c->bf16) {
    cu_gemm(be, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M <= 0 || N <= 0) return;
  wrote(be, C, (size_t)(M - 1) * ldc + N);
  const uint16_t *a = bf16_copy(be, 0, A, na), *b = bf16_copy(be, 1, B, nb);
  if (a && b) gemm16(be, ta, tb, M, N, K, a, lda, b, ldb, beta, C, ldc);
}

/* out = inp W + bias + residual. Under --bf16 the bias and the residual
 * ride on cuBLASLt's epilogue (cuda_lt.h), one GEMM and no fill pass;
 * shapes cuBLASLt declines, and fp32, prefill out and let the GEMM add. */
static void cu_matmul_forward(mega_backend *be, float *out, const float *inp, const float *w,
                              const float *bias, const float *residual, int N, int C, int OC,
                              mega_wlayout lay) {
  cuda_impl *c = impl_of(be);
  bool tb = lay == MEGA_W_OUT_IN;
  size_t nx = (size_t)N * C, nw = (size_t)C * OC;
  int ldw = tb ? C : OC;
  const uint16_t *a = NULL, *b = NULL;
  wrote(be, out, (size_t)N * OC);
  if (c->bf16 && N > 0 && OC > 0) {
    a = bf16_copy(be, 0, inp, nx);
    b = bf16_copy(be, 1, w, nw);
    if (!a || !b) return;
    /* column-major: out^T [OC, N] = op(W)^T inp^T */
    if (mega_cu_lt_gemm(c->lt, tb, false, OC, N, C, b, ldw, a, C, bias, residual, out, OC) ==
        CUBLAS_STATUS_SUCCESS)
      return;
  }
  float beta = 0.0f;
  if (bias || residual) {
    note(be, mega_cu_bias_fill(S(be), out, bias, residual, (int64_t)N * OC, OC), "bias fill");
    beta = 1.0f;
  }
  if (a)
    gemm16(be, false, tb, N, OC, C, a, C, b, ldw, beta, out, OC);
  else
    mm_gemm(be, false, tb, N, OC, C, inp, C, nx, w, ldw, nw, beta, out, OC);
}

static void cu_matmul_backward_input(mega_backend *be, float *dinp, const float *dout,
                                     const float *w, int N, int C, int OC, mega_wlayout lay,
                                     bool accumulate) {
  bool tb = lay == MEGA_W_IN_OUT;
  size_t ndy = (size_t)N * OC, nw = (size_t)C * OC;
  mm_gemm(be, false, tb, N, C, OC, dout, OC, ndy, w, lay == MEGA_W_IN_OUT ? OC : C, nw,
          accumulate ? 1.0f : 0.0f, dinp, C);
}

/* Scratch for a column sum over rows x cols (kernels/launch.h); NULL when
 * it needs none, or after a failure (noted: the op then does nothing). */
static void *columns_scratch(mega_backend *be, int64_t rows, int64_t cols, bool *ok) {
  size_t bytes = mega_cu_columns_scratch(rows, cols);
  cuda_impl *c = impl_of(be);
  *ok = true;
  if (!bytes) return NULL;
  void *p = grow(be, &c->cols_buf, &c->cols_cap, bytes, "the column sums' scratch");
  *ok = p != NULL;
  return p;
}

/* Under --bf16 with a bias, one cuBLASLt GEMM (cuda_lt.h's bgrad) gives
 * the weight gradient and the bias gradient of the bf16 dout it reads, the
 * latter into scratch and then added on (dbias accumulates over micro
 * batches; the epilogue overwrites). Where cuBLASLt declines, the same
 * copies go to cublasGemmEx and the column sums add dout rounded: the same
 * values either way. Returns false when this is not the path (fp32, no
 * bias, no cuBLASLt). */
static bool bf16_backward_weight(mega_backend *be, float *dw, float *dbias, const float *dout,
                                 const float *inp, int N, int C, int OC, mega_wlayout lay) {
  cuda_impl *c = impl_of(be);
  if (!c->bf16 || !c->lt || !dbias || N <= 0 || C <= 0 || OC <= 0) return false;
  const uint16_t *a = bf16_copy(be, 0, inp, (size_t)N * C);
  const uint16_t *d = a ? bf16_copy(be, 1, dout, (size_t)N * OC) : NULL;
  float *part = d ? grow(be, &c->bgrad_buf, &c->bgrad_cap, (size_t)OC * sizeof(float),
                         "the bias gradient's scratch")
                  : NULL;
  if (!part) return true; /* noted; the op does nothing more */
  /* column-major: (in, out) dW^T [OC, C] = dout^T [OC, N] inp [N, C], the
   * bias over A's rows; (out, in) dW^T [C, OC] = inp^T [C, N] dout [N, OC],
   * over B's columns */
  bool io = lay == MEGA_W_IN_OUT;
  cublasStatus_t st =
      io ? mega_cu_lt_gemm_bgrad(c->lt, true, false, true, OC, C, N, d, OC, a, C, part, dw, OC)
         : mega_cu_lt_gemm_bgrad(c->lt, false, false, true, C, OC, N, a, C, d, OC, part, dw, C);
  if (st == CUBLAS_STATUS_SUCCESS) {
    note(be, mega_cu_add(S(be), dbias, dbias, part, NULL, OC, OC), "bias gradient add");
    return true;
  }
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
    note_blas(be, st, "bf16 weight and bias gradient (cuBLASLt)");
    return true;
  }
  if (io)
    gemm16(be, true, false, C, OC, N, a, C, d, OC, 1.0f, dw, OC);
  else
    gemm16(be, true, false, OC, C, N, d, OC, a, C, 1.0f, dw, C);
  bool ok;
  void *scratch = columns_scratch(be, N, OC, &ok);
  if (ok) note(be, mega_cu_bias_grad(S(be), dbias, dout, N, OC, 1, scratch), "bias grad");
  return true;
}

static void cu_matmul_backward_weight(mega_backend *be, float *dw, float *dbias,
                                      const float *dout, const float *inp, int N, int C, int OC,
                                      mega_wlayout lay) {
  size_t nx = (size_t)N * C, ndy = (size_t)N * OC;
  wrote(be, dw, (size_t)C * OC);
  if (dbias) wrote(be, dbias, (size_t)OC);
  if (bf16_backward_weight(be, dw, dbias, dout, inp, N, C, OC, lay)) return;
  if (lay == MEGA_W_IN_OUT)
    mm_gemm(be, true, false, C, OC, N, inp, C, nx, dout, OC, ndy, 1.0f, dw, OC);
  else
    mm_gemm(be, true, false, OC, C, N, dout, OC, ndy, inp, C, nx, 1.0f, dw, C);
  if (dbias) {
    bool ok;
    void *scratch = columns_scratch(be, N, OC, &ok);
    if (ok)
      note(be, mega_cu_bias_grad(S(be), dbias, dout, N, OC, impl_of(be)->bf16, scratch),
           "bias grad");
  }
}

/* ---- the kernels ---- */

static void cu_encoder_forward(mega_backend *be, float *out, const int32_t *tok,
                               const float *wte, int v0, int vn, const float *wpe, int B, int T,
                               int C) {
  wrote(be, out, (size_t)B * T * C);
  note(be, mega_cu_encoder_fwd(S(be), out, tok, wte, v0, vn, wpe, B * T, T, C), "encoder");
}

static void cu_encoder_backward(mega_backend *be, float *dwte, int v0, int vn, float *dwpe,
                                const float *dout, const int32_t *tok, int B, int T, int C) {
  wrote(be, dwte, (size_t)vn * C);
  wrote(be, dwpe, (size_t)T * C);
  void *scratch = grow(be, &impl_of(be)->sort_buf, &impl_of(be)->sort_cap,
                       mega_cu_encoder_bwd_scratch(B * T), "the embedding gradient's sort");
  if (scratch)
    note(be, mega_cu_encoder_bwd(S(be), dwte, v0, vn, dwpe, dout, tok, B * T, T, C, scratch),
         "encoder backward");
}

static void cu_layernorm_forward(mega_backend *be, float *out, float *mean, float *rstd,
                                 const float *inp, const float *w, const float *b, int N, int C,
                                 float eps) {
  wrote(be, mean, (size_t)N);
  wrote(be, rstd, (size_t)N);
  uint16_t *out16 = produced(be, out, (size_t)N * C); /* the next matmul's input */
  filled(be, mega_cu_layernorm_fwd(S(be), out, out16, mean, rstd, inp, w, b, N, C, eps),
         "layernorm", out, NULL, (size_t)N * C);
}

static void cu_layernorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                        const float *dout, const float *inp, const float *w,
                                        const float *mean, const float *rstd, int N, int C) {
  uint16_t *d16 = produced(be, dinp, (size_t)N * C); /* the projections' output gradient */
  filled(be, mega_cu_layernorm_bwd_in(S(be), dinp, d16, dres, dout, inp, w, mean, rstd, N, C),
         "layernorm backward", dinp, NULL, (size_t)N * C);
}

static void cu_layernorm_backward_weight(mega_backend *be, float *dw, float *db,
                                         const float *dout, const float *inp, const float *mean,
                                         const float *rstd, int N, int C) {
  wrote(be, dw, (size_t)C);
  wrote(be, db, (size_t)C);
  bool ok;
  void *scratch = columns_scratch(be, N, C, &ok);
  if (ok)
    note(be, mega_cu_layernorm_bwd_w(S(be), dw, db, dout, inp, mean, rstd, N, C, scratch),
         "layernorm weight gradient");
}

static void gelu_fwd(mega_backend *be, float *out, const float *inp, size_t n, bool erf) {
  uint16_t *out16 = produced(be, out, n); /* the MLP's projection's input */
  filled(be, mega_cu_gelu_fwd(S(be), out, out16, inp, (int64_t)n, erf),
         erf ? "gelu (erf)" : "gelu", out, NULL, n);
}

static void gelu_bwd(mega_backend *be, float *dinp, const float *inp, const float *dout,
                     size_t n, bool erf) {
  uint16_t *dinp16 = produced(be, dinp, n); /* the fc matmul's output gradient */
  filled(be, mega_cu_gelu_bwd(S(be), dinp, dinp16, inp, dout, (int64_t)n, erf),
         erf ? "gelu (erf) backward" : "gelu backward", dinp, NULL, n);
}

static void cu_gelu_forward(mega_backend *be, float *out, const float *inp, size_t n) {
  gelu_fwd(be, out, inp, n, false);
}

static void cu_gelu_backward(mega_backend *be, float *dinp, const float *inp, const float *dout,
                             size_t n) {
  gelu_bwd(be, dinp, inp, dout, n, false);
}

static void cu_gelu_erf_forward(mega_backend *be, float *out, const float *inp, size_t n) {
  gelu_fwd(be, out, inp, n, true);
}

static void cu_gelu_erf_backward(mega_backend *be, float *dinp, const float *inp,
                                 const float *dout, size_t n) {
  gelu_bwd(be, dinp, inp, dout, n, true);
}

static void cu_residual_forward(mega_backend *be, float *out, const float *a, const float *b,
                                size_t n) {
  wrote(be, out, n);
  note(be, mega_cu_add(S(be), out, a, b, NULL, (int64_t)n, 1), "residual");
}

static void cu_bias_residual_forward(mega_backend *be, float *out, const float *a,
                                     const float *b, const float *bias, int N, int C) {
  wrote(be, out, (size_t)N * C);
  note(be, mega_cu_add(S(be), out, a, b, bias, (int64_t)N * C, C), "bias and residual");
}

static void cu_bias_dropout_add(mega_backend *be, float *out, const float *res, const float *y,
                                const float *bias, int rows, int C, const mega_dropout *d) {
  wrote(be, out, (size_t)rows * C);
  note(be, mega_cu_bias_dropout_add(S(be), out, res, y, bias, (int64_t)rows * C, C, d),
       "bias, dropout and residual");
}

static void cu_rmsnorm_forward(mega_backend *be, float *out, float *rstd, const float *inp,
                               const float *w, int N, int C, float eps) {
  wrote(be, rstd, (size_t)N);
  uint16_t *out16 = produced(be, out, (size_t)N * C); /* the next matmul's input */
  filled(be, mega_cu_rmsnorm_fwd(S(be), out, out16, rstd, inp, w, N, C, eps), "rmsnorm", out,
         NULL, (size_t)N * C);
}

static void cu_rmsnorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                      const float *dout, const float *inp, const float *w,
                                      const float *rstd, int N, int C) {
  uint16_t *d16 = produced(be, dinp, (size_t)N * C); /* the projections' output gradient */
  filled(be, mega_cu_rmsnorm_bwd_in(S(be), dinp, d16, dres, dout, inp, w, rstd, N, C),
         "rmsnorm backward", dinp, NULL, (size_t)N * C);
}

static void cu_rmsnorm_backward_weight(mega_backend *be, float *dw, const float *dout,
                                       const float *inp, const float *rstd, int N, int C) {
  wrote(be, dw, (size_t)C);
  bool ok;
  void *scratch = columns_scratch(be, N, C, &ok);
  if (ok)
    note(be, mega_cu_rmsnorm_bwd_w(S(be), dw, dout, inp, rstd, N, C, scratch),
         "rmsnorm weight gradient");
}

static void cu_swiglu_forward(mega_backend *be, float *out, const float *gate, const float *up,
                              size_t n) {
  uint16_t *out16 = produced(be, out, n); /* the MLP's projection's input */
  filled(be, mega_cu_swiglu_fwd(S(be), out, out16, gate, up, (int64_t)n), "swiglu", out, NULL,
         n);
}

static void cu_swiglu_backward(mega_backend *be, float *dgate, float *dup, const float *dout,
                               const float *gate, const float *up, size_t n) {
  /* the gate's and up's matmuls' output gradients */
  uint16_t *dgate16 = produced(be, dgate, n), *dup16 = produced(be, dup, n);
  filled(be, mega_cu_swiglu_bwd(S(be), dgate, dgate16, dup, dup16, dout, gate, up, (int64_t)n),
         "swiglu backward", dgate, dup, n);
}

static void cu_rope_forward(mega_backend *be, float *x, const float *cs, int B, int T, int heads,
                            int hs, int ld, int rot) {
  wrote(be, x, (size_t)(B * T - 1) * ld + (size_t)heads * hs);
  note(be, mega_cu_rope(S(be), x, cs, B * T, T, heads, hs, ld, rot, 1.0f), "rope");
}

static void cu_rope_backward(mega_backend *be, float *dx, const float *cs, int B, int T,
                             int heads, int hs, int ld, int rot) {
  wrote(be, dx, (size_t)(B * T - 1) * ld + (size_t)heads * hs);
  note(be, mega_cu_rope(S(be), dx, cs, B * T, T, heads, hs, ld, rot, -1.0f), "rope backward");
}

/* In place: the forward writes the logits (the probabilities), so their
 * kept bf16 copies go. */
static void cu_crossentropy_forward(mega_backend *be, float *losses, float *logits,
                                    const int32_t *targets, int N, int V) {
  wrote(be, losses, (size_t)N);
  wrote(be, logits, (size_t)N * V);
  note(be, mega_cu_xent_fwd(S(be), losses, logits, targets, N, V), "cross-entropy");
}

static void cu_crossentropy_backward(mega_backend *be, float *probs, const int32_t *targets,
                                     int v0, float scale, int N, int V) {
  uint16_t *d16 = produced(be, probs, (size_t)N * V); /* the head's output gradient */
  filled(be, mega_cu_xent_bwd(S(be), probs, d16, targets, v0, scale, N, V),
         "cross-entropy backward", probs, NULL, (size_t)N * V);
}

/* The fused classifier: its dlogits are the head's output gradient. */
static void cu_crossentropy_forward_grad(mega_backend *be, float *losses, float *logits,
                                         const int32_t *targets, float scale, int N, int V) {
  wrote(be, losses, (size_t)N);
  uint16_t *d16 = produced(be, logits, (size_t)N * V);
  filled(be, mega_cu_xent_fwd_grad(S(be), losses, logits, d16, targets, scale, N, V),
         "cross-entropy with its gradient", logits, NULL, (size_t)N * V);
}

static void cu_crossentropy_finish_grad(mega_backend *be, float *losses, float *logits,
                                        const float *rowmax, const float *sums,
                                        const int32_t *targets, int v0, float scale, int N,
                                        int V) {
  wrote(be, losses, (size_t)N);
  uint16_t *d16 = produced(be, logits, (size_t)N * V);
  filled(be,
         mega_cu_xent_finish_grad(S(be), losses, logits, d16, rowmax, sums, targets, v0, scale,
                                  N, V),
         "cross-entropy with its gradient", logits, NULL, (size_t)N * V);
}

static void cu_crossentropy_rowmax(mega_backend *be, float *rowmax, const float *logits, int N,
                                   int V) {
  wrote(be, rowmax, (size_t)N);
  note(be, mega_cu_xent_rowmax(S(be), rowmax, logits, N, V), "cross-entropy row max");
}

static void cu_crossentropy_sums(mega_backend *be, float *sums, const float *logits,
                                 const float *rowmax, const int32_t *targets, int v0, int N,
                                 int V) {
  wrote(be, sums, 2 * (size_t)N);
  note(be, mega_cu_xent_sums(S(be), sums, logits, rowmax, targets, v0, N, V),
       "cross-entropy sums");
}

static void cu_crossentropy_finish(mega_backend *be, float *losses, float *logits,
                                   const float *rowmax, const float *sums, int N, int V) {
  wrote(be, losses, (size_t)N);
  wrote(be, logits, (size_t)N * V);
  note(be, mega_cu_xent_finish(S(be), losses, logits, rowmax, sums, N, V), "cross-entropy");
}

static mega_status sum_any(mega_backend *be, const float *x, size_t n, int squares, double *out,
                           mega_err *err) {
  cuda_impl *c = impl_of(be);
  double part[MEGA_CU_SUM_BLOCKS];
  note(be, mega_cu_sum(S(be), c->partials, x, (int64_t)n, squares), "sum");
  mega_status st = cu_memcpy(be, part, c->partials, sizeof part, MEGA_COPY_D2H, err);
  if (st != MEGA_OK) return st;
  double total = 0.0;
  for (int i = 0; i < MEGA_CU_SUM_BLOCKS; i++) total += part[i];
  *out = total;
  return MEGA_OK;
}

static mega_status cu_sum(mega_backend *be, const float *x, size_t n, double *out,
                          mega_err *err) {
  return sum_any(be, x, n, 0, out, err);
}

static mega_status cu_sum_squares(mega_backend *be, const float *x, size_t n, double *out,
                                  mega_err *err) {
  return sum_any(be, x, n, 1, out, err);
}

static void cu_scale(mega_backend *be, float *x, size_t n, float s) {
  wrote(be, x, n);
  note(be, mega_cu_scale(S(be), x, (int64_t)n, s), "scale");
}

static void cu_init_normal(mega_backend *be, float *dst, size_t n, uint64_t key, double std,
                           size_t w, size_t stride, size_t off) {
  wrote(be, dst, n);
  note(be, mega_cu_init_normal(S(be), dst, (int64_t)n, key, std, (int64_t)w, (int64_t)stride,
                               (int64_t)off),
       "initialising parameters");
}

static void cu_destroy(mega_backend *be) {
  cuda_impl *c = impl_of(be);
  cudaStreamSynchronize(c->stream);
  mega_cu__optim_destroy(be);
  mega_cu__sdpa_destroy(be);
  if (c->partials) cudaFree(c->partials);
  for (int k = 0; k < 2; k++)
    if (c->bf16_buf[k]) cudaFree(c->bf16_buf[k]);
  if (c->sort_buf) cudaFree(c->sort_buf);
  if (c->cols_buf) cudaFree(c->cols_buf);
  if (c->bgrad_buf) cudaFree(c->bgrad_buf);
  mega_cu_lt_destroy(c->lt);
  mega_cu_b16_destroy(c->b16);
  if (c->attn_buf) cudaFree(c->attn_buf);
  if (c->blas) cublasDestroy(c->blas);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
  free(be);
}

static const mega_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .memset0 = cu_memset0,
    .memcpy = cu_memcpy,
    .set_bf16 = cu_set_bf16,
    .synchronize = cu_synchronize,
    .set_threads = cu_set_threads,
    .gemm = cu_gemm,
    .gemm_batched = cu_gemm_batched,
    .encoder_forward = cu_encoder_forward,
    .encoder_backward = cu_encoder_backward,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward_input = cu_layernorm_backward_input,
    .layernorm_backward_weight = cu_layernorm_backward_weight,
    .matmul_forward = cu_matmul_forward,
    .matmul_backward_input = cu_matmul_backward_input,
    .matmul_backward_weight = cu_matmul_backward_weight,
    .attention_sizes = mega_cu__attention_sizes,
    .attention_forward = mega_cu__attention_forward,
    .attention_backward = mega_cu__attention_backward,
    .rmsnorm_forward = cu_rmsnorm_forward,
    .rmsnorm_backward_input = cu_rmsnorm_backward_input,
    .rmsnorm_backward_weight = cu_rmsnorm_backward_weight,
    .swiglu_forward = cu_swiglu_forward,
    .swiglu_backward = cu_swiglu_backward,
    .rope_forward = cu_rope_forward,
    .rope_backward = cu_rope_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .gelu_erf_forward = cu_gelu_erf_forward,
    .gelu_erf_backward = cu_gelu_erf_backward,
    .matmul_gelu_forward = mega_cu__matmul_gelu_forward,
    .matmul_gelu_backward_input = mega_cu__matmul_gelu_backward_input,
    .residual_forward = cu_residual_forward,
    .bias_residual_forward = cu_bias_residual_forward,
    .bias_dropout_add = cu_bias_dropout_add,
    .crossentropy_forward = cu_crossentropy_forward,
    .crossentropy_backward = cu_crossentropy_backward,
    .crossentropy_rowmax = cu_crossentropy_rowmax,
    .crossentropy_sums = cu_crossentropy_sums,
    .crossentropy_finish = cu_crossentropy_finish,
    .crossentropy_forward_grad = cu_crossentropy_forward_grad,
    .crossentropy_finish_grad = cu_crossentropy_finish_grad,
    .adamw = mega_cu__adamw,
    .adamw_ranges = mega_cu__adamw_ranges,
    .sum = cu_sum,
    .sum_squares = cu_sum_squares,
    .sum_squares_post = mega_cu__sum_squares_post,
    .scale = cu_scale,
    .init_normal = cu_init_normal,
};

cudaStream_t mega_cuda_backend_stream(mega_backend *be) {
  return be && be->ops == &cuda_ops ? impl_of(be)->stream : NULL;
}

void mega_cuda_backend_wrote(mega_backend *be, const void *p, size_t bytes) {
  if (be && be->ops == &cuda_ops && p) mega_cu_b16_wrote(impl_of(be)->b16, p, bytes);
}

/* What --bf16's kept copies may hold: a quarter of the free memory, at
 * most 8 GiB (a GPT-2 step keeps about 3.5; cu_alloc empties it when the
 * model needs the room). */
static size_t b16_budget(void) {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  size_t cap = (size_t)8 << 30;
  return free_b / 4 < cap ? free_b / 4 : cap;
}

mega_status mega_cuda_backend_create(int device, mega_backend **out, mega_err *err) {
  *out = NULL;
  int count = 0; /* left unwritten without a driver */
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "no CUDA device: %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
  if (device < 0 || device >= count)
    return mega_fail(err, MEGA_ERR_INVALID, "no CUDA device %d: this machine has %d", device,
                     count);
  if ((e = cudaSetDevice(device)) != cudaSuccess)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "CUDA device %d: %s", device,
                     cudaGetErrorString(e));
  mega_backend *be = calloc(1, sizeof *be);
  cuda_impl *c = calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    return mega_fail(err, MEGA_ERR_NOMEM, "cuda backend: out of memory");
  }
  c->device = device;
  be->ops = &cuda_ops;
  be->impl = c;
  mega_status st = MEGA_OK;
  cublasStatus_t bs;
  if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaMalloc((void **)&c->partials, MEGA_CU_SUM_RANGES * MEGA_CU_SUM_BLOCKS *
                                                   sizeof(double))) != cudaSuccess)
    st = mega_fail(err, MEGA_ERR_INTERNAL, "cuda backend on device %d: %s", device,
                   cudaGetErrorString(e));
  else if ((bs = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS ||
           (bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS)
    st = mega_fail(err, MEGA_ERR_INTERNAL, "cuda backend on device %d: cuBLAS status %d", device,
                   (int)bs);
  /* fp32 GEMMs stay fp32: no TF32 unless asked (numbers match the cpu) */
  if (st == MEGA_OK) cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  /* MEGA_CUBLASLT=off: cublasGemmEx and the separate passes, to compare
   * (the kit's tests, a suspected epilogue) */
  const char *lt_env = getenv("MEGA_CUBLASLT");
  if (st == MEGA_OK && lt_env && *lt_env && strcmp(lt_env, "off") && strcmp(lt_env, "auto"))
    st = mega_fail(err, MEGA_ERR_INVALID, "MEGA_CUBLASLT=%.40s: use auto or off", lt_env);
  if (st == MEGA_OK && !(lt_env && !strcmp(lt_env, "off")))
    c->lt = mega_cu_lt_create(c->stream);
  if (st == MEGA_OK) c->b16 = mega_cu_b16_create(device, c->stream, b16_budget());
  if (st != MEGA_OK) {
    cu_destroy(be);
    return st;
  }
  *out = be;
  return MEGA_OK;
}
