/* Causal self-attention on the cpu: per (batch, head), QK^T, att.V and
 * their backward are sgemm calls on strided views of the fused qkv. Rows are
 * taken in blocks of ABLK so each block multiplies only the columns at or
 * below the diagonal: about half the work of the full T x T products. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

#define ABLK 64

static inline int imin(int a, int b) { return a < b ? a : b; }

/* Row t of a (T wide): softmax of cols 0..t (already scaled), zeros after. */
MEGA_CPU_CLONES
static void causal_softmax_rows(float *a, int r0, int r1, int T) {
  for (int t = r0; t < r1; t++) {
    float *row = a + (size_t)t * T;
    float mx = -INFINITY;
    for (int s = 0; s <= t; s++) mx = row[s] > mx ? row[s] : mx;
    float sum = 0.0f;
    for (int s = 0; s <= t; s++) {
      row[s] = mega_expf(row[s] - mx);
      sum += row[s];
    }
    float inv = 1.0f / sum;
    for (int s = 0; s <= t; s++) row[s] *= inv;
    for (int s = t + 1; s < T; s++) row[s] = 0.0f;
  }
}

void mega_cpu_attention_forward(mega_backend *be, float *out, float *att,
                                const float *qkv, int B, int T, int C, int NH) {
  (void)be;
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
      float *a = att + ((size_t)b * NH + h) * T * T;
      float *o = out + (size_t)b * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += ABLK) {
        int r1 = imin(r0 + ABLK, T), rb = r1 - r0;
        /* a[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, scale,
                    q + (size_t)r0 * C3, C3, k, C3, 0.0f, a + (size_t)r0 * T, T);
        causal_softmax_rows(a, r0, r1, T);
        /* o[r0:r1] = a[r0:r1, 0:r1] v[0:r1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f,
                    a + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C);
      }
    }
}

/* In place over da's causal part: dpre = scale * a * (da - sum_s a*da). */
MEGA_CPU_CLONES
static void softmax_backward_rows(float *da, const float *a, int r0, int r1, int T,
                                  float scale) {
  for (int t = r0; t < r1; t++) {
    float *d = da + (size_t)t * T;
    const float *p = a + (size_t)t * T;
    float dot = 0.0f;
    for (int s = 0; s <= t; s++) dot += p[s] * d[s];
    for (int s = 0; s <= t; s++) d[s] = scale * p[s] * (d[s] - dot);
    for (int s = t + 1; s < r1; s++) d[s] = 0.0f;
  }
}

void mega_cpu_attention_backward(mega_backend *be, float *dqkv, float *scratch,
                                 const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH) {
  (void)be;
  int hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  float *da = scratch; /* one T x T tile, reused: it stays in cache */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      size_t qoff = (size_t)b * T * C3 + h * hs;
      const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      const float *dy = dout + (size_t)b * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += ABLK) {
        int r1 = imin(r0 + ABLK, T), rb = r1 - r0;
        /* da[r0:r1, 0:r1] = dy[r0:r1] v[0:r1]^T, then through the softmax */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, 1.0f,
                    dy + (size_t)r0 * C, C, v, C3, 0.0f, da + (size_t)r0 * T, T);
        softmax_backward_rows(da, a, r0, r1, T, scale);
        /* dq[r0:r1] = dpre[r0:r1, 0:r1] k[0:r1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f,
                    da + (size_t)r0 * T, T, k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
      }
      for (int c0 = 0; c0 < T; c0 += ABLK) {
        int c1 = imin(c0 + ABLK, T), cb = c1 - c0;
        /* Columns c0:c1 get contributions from rows c0..T-1 only. */
        /* dv[c0:c1] = a[c0:T, c0:c1]^T dy[c0:T] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cb, hs, T - c0, 1.0f,
                    a + (size_t)c0 * T + c0, T, dy + (size_t)c0 * C, C, 0.0f,
                    dv + (size_t)c0 * C3, C3);
        /* dk[c0:c1] = dpre[c0:T, c0:c1]^T q[c0:T] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cb, hs, T - c0, 1.0f,
                    da + (size_t)c0 * T + c0, T, q + (size_t)c0 * C3, C3, 0.0f,
                    dk + (size_t)c0 * C3, C3);
      }
    }
}
