/* The cpu backend: memory, GEMM (OpenBLAS), matmuls, reductions, AdamW and
 * the ops table. The GPT kernels are in cpu_ops.c and cpu_attention.c. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

static mega_status cpu_alloc(mega_backend *be, size_t bytes, void **out, mega_err *err) {
  (void)be;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void *p = aligned_alloc(64, rounded);
  if (!p)
    return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
  memset(p, 0, rounded);
  *out = p;
  return MEGA_OK;
}

static void cpu_free(mega_backend *be, void *p) {
  (void)be;
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

static mega_status cpu_synchronize(mega_backend *be, mega_err *err) {
  (void)be;
  (void)err;
  return MEGA_OK;
}

static mega_status cpu_set_threads(mega_backend *be, int n, mega_err *err) {
  (void)be;
  if (n < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cpu backend: BLAS threads must be at least 1, got %d", n);
  openblas_set_num_threads(n);
  return MEGA_OK;
}

static void cpu_gemm(mega_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc) {
  (void)be;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_gemm_batched(mega_backend *be, bool ta, bool tb, int M, int N, int K,
                             float alpha, const float *A, int lda, int64_t sa,
                             const float *B, int ldb, int64_t sb, float beta, float *C,
                             int ldc, int64_t sc, int batch) {
  for (int i = 0; i < batch; i++)
    cpu_gemm(be, ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc,
             ldc);
}

MEGA_CPU_CLONES
static void add_bias_rows(float *out, const float *bias, int N, int OC) {
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * OC;
    for (int j = 0; j < OC; j++) o[j] += bias[j];
  }
}

MEGA_CPU_CLONES
static void sum_rows_into(float *dbias, const float *dout, int N, int OC) {
  for (int n = 0; n < N; n++) {
    const float *d = dout + (size_t)n * OC;
    for (int j = 0; j < OC; j++) dbias[j] += d[j];
  }
}

static void cpu_matmul_forward(mega_backend *be, float *out, const float *inp,
                               const float *w, const float *bias, int N, int C, int OC,
                               mega_wlayout lay) {
  (void)be;
  if (lay == MEGA_W_IN_OUT)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC,
                0.0f, out, OC);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C,
                0.0f, out, OC);
  if (bias) add_bias_rows(out, bias, N, OC);
}

static void cpu_matmul_backward_input(mega_backend *be, float *dinp, const float *dout,
                                      const float *w, int N, int C, int OC,
                                      mega_wlayout lay) {
  (void)be;
  if (lay == MEGA_W_IN_OUT)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC,
                0.0f, dinp, C);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                0.0f, dinp, C);
}

static void cpu_matmul_backward_weight(mega_backend *be, float *dw, float *dbias,
                                       const float *dout, const float *inp, int N, int C,
                                       int OC, mega_wlayout lay) {
  (void)be;
  if (lay == MEGA_W_IN_OUT)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC,
                1.0f, dw, OC);
  else
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                1.0f, dw, C);
  if (dbias) sum_rows_into(dbias, dout, N, OC);
}

MEGA_CPU_CLONES
static void adamw_range(float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float b1, float b2, float eps, float wd, float gs, float bc1,
                        float bc2) {
  for (size_t i = 0; i < n; i++)
    mega_adamw_elem(&p[i], &m[i], &v[i], g[i] * gs, lr, b1, b2, eps, wd, bc1, bc2);
}

static void cpu_adamw(mega_backend *be, float *params, const float *grads, float *m,
                      float *v, size_t n, const mega_adamw_params *hp) {
  (void)be;
  float bc1 = 1.0f - powf(hp->beta1, (float)hp->step);
  float bc2 = 1.0f - powf(hp->beta2, (float)hp->step);
  adamw_range(params, grads, m, v, n, hp->lr, hp->beta1, hp->beta2, hp->eps,
              hp->weight_decay, hp->grad_scale, bc1, bc2);
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

static mega_status cpu_sum(mega_backend *be, const float *x, size_t n, double *out,
                           mega_err *err) {
  (void)be;
  (void)err;
  *out = sum_impl(x, n, 0);
  return MEGA_OK;
}

static mega_status cpu_sum_squares(mega_backend *be, const float *x, size_t n, double *out,
                                   mega_err *err) {
  (void)be;
  (void)err;
  *out = sum_impl(x, n, 1);
  return MEGA_OK;
}

MEGA_CPU_CLONES
static void cpu_scale(mega_backend *be, float *x, size_t n, float s) {
  (void)be;
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_destroy(mega_backend *be) { free(be); }

static const mega_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .memcpy = cpu_memcpy,
    .synchronize = cpu_synchronize,
    .set_threads = cpu_set_threads,
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
    .gelu_forward = mega_cpu_gelu_forward,
    .gelu_backward = mega_cpu_gelu_backward,
    .residual_forward = mega_cpu_residual_forward,
    .add_inplace = mega_cpu_add_inplace,
    .crossentropy_forward = mega_cpu_crossentropy_forward,
    .crossentropy_backward = mega_cpu_crossentropy_backward,
    .adamw = cpu_adamw,
    .sum = cpu_sum,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
};

mega_status mega_backend_cpu_create(const mega_backend_cpu_opts *opts, mega_backend **out,
                                    mega_err *err) {
  int threads = opts && opts->threads ? opts->threads : 1;
  if (threads < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cpu backend: BLAS threads must be at least 1, got %d", threads);
  mega_backend *be = calloc(1, sizeof *be);
  if (!be) return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: out of memory");
  be->ops = &cpu_ops;
  openblas_set_num_threads(threads);
  *out = be;
  return MEGA_OK;
}
