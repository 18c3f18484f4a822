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

/* Rows r0..r1 of a (T wide): softmax of cols 0..t (already scaled), zeros
 * after it up to the block's end r1, the only columns the products read. */
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
    for (int s = t + 1; s < r1; s++) row[s] = 0.0f;
  }
}

typedef struct attn_ctx {
  float *out, *att, *dqkv, *scratch;
  const float *qkv, *catt, *dout;
  int B, T, C, NH;
} attn_ctx;

/* Heads bh0..bh1 (bh = b * NH + h). */
static void attn_fwd_heads(void *vc, int64_t bh0, int64_t bh1) {
  const attn_ctx *c = vc;
  int T = c->T, C = c->C, hs = C / c->NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t bh = bh0; bh < bh1; bh++) {
    int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
    const float *q = c->qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    float *a = c->att + (size_t)bh * T * T;
    float *o = c->out + (size_t)b * T * C + h * hs;
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

/* Runs fn over the B*NH heads on the pool, each thread calling a one-thread
 * sgemm (the products are small, and OpenBLAS's own threads would compete). */
static void over_heads(mega_backend *be, attn_ctx *c, mega_cpu_task fn) {
  mega_cpu_pool *pool = mega_cpu_pool_of(be);
  int threads = mega_cpu_pool_threads(pool);
  if (threads > 1) openblas_set_num_threads(1);
  mega_cpu_parallel_for(pool, (int64_t)c->B * c->NH, 1, fn, c);
  if (threads > 1) openblas_set_num_threads(threads);
}

void mega_cpu_attention_forward(mega_backend *be, float *out, float *att,
                                const float *qkv, int B, int T, int C, int NH) {
  attn_ctx c = {.out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH};
  over_heads(be, &c, attn_fwd_heads);
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

static void attn_bwd_heads(void *vc, int64_t bh0, int64_t bh1) {
  const attn_ctx *c = vc;
  int T = c->T, C = c->C, hs = C / c->NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  /* one T x T tile per chunk of heads, reused: it stays in cache */
  float *da = c->scratch + (size_t)bh0 * T * T;
  for (int64_t bh = bh0; bh < bh1; bh++) {
    int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
    size_t qoff = (size_t)b * T * C3 + h * hs;
    const float *q = c->qkv + qoff, *k = q + C, *v = q + 2 * C;
    float *dq = c->dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
    const float *a = c->catt + (size_t)bh * T * T;
    const float *dy = c->dout + (size_t)b * T * C + h * hs;
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

void mega_cpu_attention_backward(mega_backend *be, float *dqkv, float *scratch,
                                 const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH) {
  attn_ctx c = {.dqkv = dqkv, .scratch = scratch, .dout = dout, .qkv = qkv, .catt = att,
                .B = B, .T = T, .C = C, .NH = NH};
  over_heads(be, &c, attn_bwd_heads);
}
