/* cuBLASLt for the cuda backend's --bf16 linear layers: one GEMM that also
 * adds the bias (CUBLASLT_EPILOGUE_BIAS) and the residual (as C, with D the
 * output), so matmul_forward needs no fill pass before it; and GPT-2's c_fc
 * with its GELU, forward and backward, so neither needs a pass of its own;
 * and the weight gradient with its bias gradient. The algorithm is
 * chosen once per shape by cuBLASLt's heuristic and cached; a shape it
 * offers none for is remembered too, and the caller takes its other path.
 * Inside the cuda module only. */
#ifndef MEGA_WORKER_CUDA_LT_H
#define MEGA_WORKER_CUDA_LT_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct mega_cu_lt mega_cu_lt;

/* NULL when cuBLASLt or its workspace cannot be had (the caller keeps to
 * cublasGemmEx). */
mega_cu_lt *mega_cu_lt_create(cudaStream_t stream);
void mega_cu_lt_destroy(mega_cu_lt *lt);

/* Column-major, as cuBLAS: D[m, n] = op(A)[m, k] op(B)[k, n] (A, B bf16)
 * + bias[m] (fp32, or NULL) + C (fp32 [m, n] with D's ld, or NULL; may be
 * D itself). Returns CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_NOT_SUPPORTED
 * when cuBLASLt has no algorithm for the shape (nothing was launched), or
 * the error of the launch. */
cublasStatus_t mega_cu_lt_gemm(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                               const uint16_t *A, int lda, const uint16_t *B, int ldb,
                               const float *bias, const float *C, float *D, int ldd);

/* D = GELU(op(A) op(B) + bias) (bias may be NULL), and pre = the GELU's
 * input, laid out as D (ldd must divide by 8): CUBLASLT_EPILOGUE_GELU_AUX
 * (_BIAS). test_cuda_backend checks that cuBLASLt's GELU is the tanh
 * approximation GPT-2 uses (the cpu backend's). */
cublasStatus_t mega_cu_lt_gemm_gelu(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                                    const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                    const float *bias, float *pre, float *D, int ldd);
/* D = (op(A) op(B)) * GELU'(pre), pre laid out as D: CUBLASLT_EPILOGUE_DGELU. */
cublasStatus_t mega_cu_lt_gemm_dgelu(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                                     const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                     const float *pre, float *D, int ldd);

/* D = op(A) op(B) + D (accumulated, as a weight gradient is), and dbias
 * (m floats, overwritten) = the sums over k of op(A)'s rows (of_a:
 * CUBLASLT_EPILOGUE_BGRADA) or (n floats) of op(B)'s columns (BGRADB):
 * a bias gradient from the very bf16 values the GEMM reads. dbias on 16
 * bytes. */
cublasStatus_t mega_cu_lt_gemm_bgrad(mega_cu_lt *lt, bool of_a, bool ta, bool tb, int m, int n,
                                     int k, const uint16_t *A, int lda, const uint16_t *B,
                                     int ldb, float *dbias, float *D, int ldd);

#endif
