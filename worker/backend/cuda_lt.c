/* cuBLASLt GEMMs with the bias and residual epilogue, GELU's, or the bias
 * gradient's (cuda_lt.h). Each shape, epilogue and pointer alignment (which the
 * heuristic depends on) gets its descriptors and algorithm once; later
 * calls only set the bias and aux pointers and launch. */
#include "worker/backend/cuda_lt.h"

#include <stdlib.h>
#include <string.h>

#define LT_WORKSPACE (32u << 20)
#define LT_SHAPES 64

/* the epilogue besides the bias; the BGRADs write the bias pointer */
enum { LT_PLAIN, LT_GELU, LT_DGELU, LT_BGRADA, LT_BGRADB };

static bool has_aux(int epi) { return epi == LT_GELU || epi == LT_DGELU; }

typedef struct lt_key {
  int ta, tb, m, n, k, lda, ldb, ldd, bias, c, align, epi;
  int bias_align, aux_align; /* the heuristic reads these pointers' alignment too */
} lt_key;

typedef struct lt_shape {
  lt_key key;
  bool supported;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulAlgo_t algo;
} lt_shape;

struct mega_cu_lt {
  cublasLtHandle_t h;
  cudaStream_t stream;
  void *workspace;
  lt_shape shapes[LT_SHAPES];
  int nshapes;
};

mega_cu_lt *mega_cu_lt_create(cudaStream_t stream) {
  mega_cu_lt *lt = calloc(1, sizeof *lt);
  if (!lt) return NULL;
  lt->stream = stream;
  if (cublasLtCreate(&lt->h) != CUBLAS_STATUS_SUCCESS) {
    free(lt);
    return NULL;
  }
  if (cudaMalloc(&lt->workspace, LT_WORKSPACE) != cudaSuccess) {
    cublasLtDestroy(lt->h);
    free(lt);
    return NULL;
  }
  return lt;
}

static void shape_free(lt_shape *s) {
  if (s->op) cublasLtMatmulDescDestroy(s->op);
  if (s->a) cublasLtMatrixLayoutDestroy(s->a);
  if (s->b) cublasLtMatrixLayoutDestroy(s->b);
  if (s->d) cublasLtMatrixLayoutDestroy(s->d);
  memset(s, 0, sizeof *s);
}

void mega_cu_lt_destroy(mega_cu_lt *lt) {
  if (!lt) return;
  for (int i = 0; i < lt->nshapes; i++) shape_free(&lt->shapes[i]);
  cudaFree(lt->workspace);
  cublasLtDestroy(lt->h);
  free(lt);
}

/* The largest power of two, up to 256, that divides every address. */
static int alignment(const void *const *p, int n) {
  uintptr_t bits = 256;
  for (int i = 0; i < n; i++)
    if (p[i]) bits |= (uintptr_t)p[i];
  return (int)(bits & -bits);
}

/* The heuristic reads the bias and aux pointers' values for their
 * alignment (cublasLt.h), so the first call's are set before it. */
static bool shape_init(mega_cu_lt *lt, lt_shape *s, const lt_key *key, const float *bias,
                       const float *aux) {
  s->key = *key;
  cublasOperation_t ta = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtEpilogue_t epi = key->epi == LT_DGELU    ? CUBLASLT_EPILOGUE_DGELU
                           : key->epi == LT_BGRADA ? CUBLASLT_EPILOGUE_BGRADA
                           : key->epi == LT_BGRADB ? CUBLASLT_EPILOGUE_BGRADB
                           : key->epi == LT_GELU   ? (key->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                : CUBLASLT_EPILOGUE_GELU_AUX)
                           : key->bias             ? CUBLASLT_EPILOGUE_BIAS
                                                   : CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t bias_type = CUDA_R_32F;
  int64_t aux_ld = key->ldd; /* the GELU input is laid out as D */
  uint64_t ws = LT_WORKSPACE;
  uint32_t al = (uint32_t)key->align;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  bool ok =
      cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
      cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
      cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == 0 &&
      (!key->bias || cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_type, sizeof bias_type) == 0) &&
      (!key->bias || cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias) == 0) &&
      (!has_aux(key->epi) ||
       (cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                       sizeof aux_ld) == 0 &&
        cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                       sizeof aux) == 0)) &&
      /* stored shapes: op(X) is X or X^T of what is in memory */
      cublasLtMatrixLayoutCreate(&s->a, CUDA_R_16BF, key->ta ? key->k : key->m,
                                 key->ta ? key->m : key->k, key->lda) == 0 &&
      cublasLtMatrixLayoutCreate(&s->b, CUDA_R_16BF, key->tb ? key->n : key->k,
                                 key->tb ? key->k : key->n, key->ldb) == 0 &&
      cublasLtMatrixLayoutCreate(&s->d, CUDA_R_32F, key->m, key->n, key->ldd) == 0 &&
      cublasLtMatmulPreferenceCreate(&pref) == 0 &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof ws) == 0 &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                           sizeof al) == 0 &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                           sizeof al) == 0 &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                           sizeof al) == 0 &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                           sizeof al) == 0 &&
      cublasLtMatmulAlgoGetHeuristic(lt->h, s->op, s->a, s->b, s->d, s->d, pref, 1, &res,
                                     &found) == CUBLAS_STATUS_SUCCESS &&
      found > 0;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ok) s->algo = res.algo;
  s->supported = ok;
  return ok;
}

static cublasStatus_t lt_gemm(mega_cu_lt *lt, int epi, bool ta, bool tb, int m, int n, int k,
                              const uint16_t *A, int lda, const uint16_t *B, int ldb,
                              const float *bias, const float *C, const float *aux, float *D,
                              int ldd) {
  if (!lt) return CUBLAS_STATUS_NOT_SUPPORTED;
  const void *ptrs[] = {A, B, C, D, aux};
  const void *bp[] = {bias}, *xp[] = {aux};
  lt_key key = {ta,         tb,    m,   n,      k, lda, ldb, ldd, bias != NULL, C != NULL,
                alignment(ptrs, 5), epi, bias ? alignment(bp, 1) : 0, aux ? alignment(xp, 1) : 0};
  /* the GELU input's leading dimension must divide by 8 */
  if (has_aux(epi) && (ldd % 8 || !aux)) return CUBLAS_STATUS_NOT_SUPPORTED;
  /* the bias epilogue reads 16 bytes at a time */
  if (bias && ((uintptr_t)bias & 15)) return CUBLAS_STATUS_NOT_SUPPORTED;
  lt_shape *s = NULL;
  for (int i = 0; i < lt->nshapes && !s; i++)
    if (!memcmp(&lt->shapes[i].key, &key, sizeof key)) s = &lt->shapes[i];
  if (!s) {
    if (lt->nshapes == LT_SHAPES) return CUBLAS_STATUS_NOT_SUPPORTED; /* cache full */
    s = &lt->shapes[lt->nshapes++];
    if (!shape_init(lt, s, &key, bias, aux)) {
      lt_key keep = s->key; /* remembered as unsupported, without descriptors */
      shape_free(s);
      s->key = keep;
      s->supported = false;
    }
  }
  if (!s->supported) return CUBLAS_STATUS_NOT_SUPPORTED;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  if (bias)
    st = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                        sizeof bias);
  if (st == CUBLAS_STATUS_SUCCESS && aux)
    st = cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                        sizeof aux);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  float alpha = 1.0f, beta = C ? 1.0f : 0.0f;
  return cublasLtMatmul(lt->h, s->op, &alpha, A, s->a, B, s->b, &beta, C ? (const void *)C : D,
                        s->d, D, s->d, &s->algo, lt->workspace, LT_WORKSPACE, lt->stream);
}

cublasStatus_t mega_cu_lt_gemm(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                               const uint16_t *A, int lda, const uint16_t *B, int ldb,
                               const float *bias, const float *C, float *D, int ldd) {
  return lt_gemm(lt, LT_PLAIN, ta, tb, m, n, k, A, lda, B, ldb, bias, C, NULL, D, ldd);
}

cublasStatus_t mega_cu_lt_gemm_gelu(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                                    const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                    const float *bias, float *pre, float *D, int ldd) {
  return lt_gemm(lt, LT_GELU, ta, tb, m, n, k, A, lda, B, ldb, bias, NULL, pre, D, ldd);
}

cublasStatus_t mega_cu_lt_gemm_dgelu(mega_cu_lt *lt, bool ta, bool tb, int m, int n, int k,
                                     const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                     const float *pre, float *D, int ldd) {
  return lt_gemm(lt, LT_DGELU, ta, tb, m, n, k, A, lda, B, ldb, NULL, NULL, pre, D, ldd);
}

cublasStatus_t mega_cu_lt_gemm_bgrad(mega_cu_lt *lt, bool of_a, bool ta, bool tb, int m, int n,
                                     int k, const uint16_t *A, int lda, const uint16_t *B,
                                     int ldb, float *dbias, float *D, int ldd) {
  if (!dbias) return CUBLAS_STATUS_NOT_SUPPORTED;
  return lt_gemm(lt, of_a ? LT_BGRADA : LT_BGRADB, ta, tb, m, n, k, A, lda, B, ldb, dbias, D,
                 NULL, D, ldd);
}
