/* Per-thread bodies of the cuda backend's simple kernels: each computes
 * one output item (an element, a row, or a column) from its index, with the
 * same math as the cpu backend (kernels/elementwise.h). kernels/gpt_kernels.cu wraps
 * each in a grid-stride __global__; tests/gpu/test_kernel_bodies.c runs the
 * same bodies over every index on the CPU against the cpu backend. That is
 * how the indexing is tested on machines without a GPU.
 *
 * Row and column bodies loop over their row or column in one thread:
 * correct first, and deterministic (no atomics), at the cost of speed on
 * wide rows. Shapes follow backend.h. */
#ifndef MEGA_KERNELS_GPT_BODIES_H
#define MEGA_KERNELS_GPT_BODIES_H

#include <stdint.h>

#include "kernels/elementwise.h"

/* ---- element bodies: i < n ---- */

/* out[i] of [N,C]: wte[tok-v0] (ids of the slice) + wpe[t]. */
static inline MEGA_HD void mega_kb_encoder_fwd(int64_t i, float *out, const int32_t *tok,
                                                const float *wte, int v0, int vn,
                                                const float *wpe, int T, int C) {
  int64_t n = i / C, c = i % C, id = (int64_t)tok[n] - v0;
  float e = id >= 0 && id < vn ? wte[id * C + c] : 0.0f;
  out[i] = e + (wpe ? wpe[(n % T) * C + c] : 0.0f);
}

static inline MEGA_HD void mega_kb_gelu_fwd(int64_t i, float *out, const float *inp) {
  out[i] = mega_gelu(inp[i]);
}

static inline MEGA_HD void mega_kb_gelu_bwd(int64_t i, float *dinp, const float *inp,
                                             const float *dout) {
  dinp[i] = mega_gelu_grad(inp[i]) * dout[i];
}

/* out = a + b (+ bias[i % C] when bias). */
static inline MEGA_HD void mega_kb_add(int64_t i, float *out, const float *a, const float *b,
                                        const float *bias, int C) {
  out[i] = a[i] + b[i] + (bias ? bias[i % C] : 0.0f);
}

/* Before a GEMM that adds into out: out[n,j] = bias[j] + residual[n,j]
 * (either may be NULL; residual may be out itself). */
static inline MEGA_HD void mega_kb_bias_fill(int64_t i, float *out, const float *bias,
                                              const float *residual, int OC) {
  float r = residual ? residual[i] : 0.0f;
  out[i] = r + (bias ? bias[i % OC] : 0.0f);
}

/* dlogits[n,j] = (probs[n,j] - [targets[n] - v0 == j]) * scale over [N,V]. */
static inline MEGA_HD void mega_kb_xent_bwd(int64_t i, float *dlogits, const float *probs,
                                             const int32_t *targets, int v0, float scale,
                                             int V) {
  int64_t n = i / V, j = i % V;
  float d = probs[i] * scale;
  if ((int64_t)targets[n] - v0 == j) d -= scale;
  dlogits[i] = d;
}

static inline MEGA_HD void mega_kb_adamw(int64_t i, float *p, const float *g, float *m,
                                          float *v, float lr, float b1, float b2, float eps,
                                          float wd, float gs, float bc1, float bc2) {
  mega_adamw_elem(&p[i], &m[i], &v[i], g[i] * gs, lr, b1, b2, eps, wd, bc1, bc2);
}

static inline MEGA_HD void mega_kb_scale(int64_t i, float *x, float s) { x[i] *= s; }

/* --bf16: a GEMM input's element as bf16 bits (cuBLAS's CUDA_R_16BF). */
static inline MEGA_HD void mega_kb_to_bf16(int64_t i, uint16_t *out, const float *in) {
  out[i] = mega_bf16_bits(in[i]);
}

/* ---- row bodies: n < N ---- */

static inline MEGA_HD void mega_kb_layernorm_fwd(int64_t n, float *out, float *mean, float *rstd,
                                                  const float *inp, const float *w,
                                                  const float *b, int C, float eps) {
  const float *x = inp + n * C;
  float s = 0.0f;
  for (int i = 0; i < C; i++) s += x[i];
  float m = s / C, v = 0.0f;
  for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
  float r = 1.0f / sqrtf(v / C + eps);
  float *o = out + n * C;
  for (int i = 0; i < C; i++) o[i] = (x[i] - m) * r * w[i] + b[i];
  mean[n] = m;
  rstd[n] = r;
}

static inline MEGA_HD void mega_kb_layernorm_bwd_in(int64_t n, float *dinp, const float *dres,
                                                     const float *dout, const float *inp,
                                                     const float *w, const float *mean,
                                                     const float *rstd, int C) {
  const float *x = inp + n * C, *d = dout + n * C;
  float m = mean[n], r = rstd[n], s1 = 0.0f, s2 = 0.0f;
  for (int i = 0; i < C; i++) {
    float dn = d[i] * w[i];
    s1 += dn;
    s2 += dn * (x[i] - m) * r;
  }
  s1 /= C;
  s2 /= C;
  float *di = dinp + n * C;
  for (int i = 0; i < C; i++) {
    float xhat = (x[i] - m) * r;
    float g = (d[i] * w[i] - s1 - xhat * s2) * r;
    di[i] = dres ? dres[n * C + i] + g : g;
  }
}

/* Row n's softmax over V classes and its loss (the fused forward). */
static inline MEGA_HD void mega_kb_xent_fwd(int64_t n, float *losses, float *probs,
                                             const float *logits, const int32_t *targets,
                                             int V) {
  const float *l = logits + n * V;
  float *p = probs + n * V;
  float mx = -INFINITY, s = 0.0f;
  for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
  for (int i = 0; i < V; i++) {
    p[i] = mega_expf(l[i] - mx);
    s += p[i];
  }
  float inv = 1.0f / s;
  for (int i = 0; i < V; i++) p[i] *= inv;
  losses[n] = logf(s) + mx - l[targets[n]];
}

/* The vocabulary-parallel passes (backend.h). */
static inline MEGA_HD void mega_kb_xent_rowmax(int64_t n, float *rowmax, const float *logits,
                                                int V) {
  const float *l = logits + n * V;
  float mx = -INFINITY;
  for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
  rowmax[n] = mx;
}

static inline MEGA_HD void mega_kb_xent_sums(int64_t n, float *sums, const float *logits,
                                              const float *rowmax, const int32_t *targets,
                                              int v0, int N, int V) {
  const float *l = logits + n * V;
  float s = 0.0f;
  for (int i = 0; i < V; i++) s += mega_expf(l[i] - rowmax[n]);
  int64_t t = (int64_t)targets[n] - v0;
  sums[n] = s;
  sums[N + n] = t >= 0 && t < V ? l[t] : 0.0f;
}

static inline MEGA_HD void mega_kb_xent_finish(int64_t n, float *losses, float *probs,
                                                const float *logits, const float *rowmax,
                                                const float *sums, int N, int V) {
  const float *l = logits + n * V;
  float *p = probs + n * V, inv = 1.0f / sums[n];
  for (int i = 0; i < V; i++) p[i] = mega_expf(l[i] - rowmax[n]) * inv;
  losses[n] = logf(sums[n]) + rowmax[n] - sums[N + n];
}

/* Row r = (bh, t) of scores [BH, T, T] (already scaled): softmax over
 * columns 0..t, zeros after. */
static inline MEGA_HD void mega_kb_causal_softmax(int64_t r, float *att, int T) {
  int t = (int)(r % T);
  float *row = att + r * T;
  float mx = -INFINITY, s = 0.0f;
  for (int j = 0; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
  for (int j = 0; j <= t; j++) {
    row[j] = mega_expf(row[j] - mx);
    s += row[j];
  }
  float inv = 1.0f / s;
  for (int j = 0; j <= t; j++) row[j] *= inv;
  for (int j = t + 1; j < T; j++) row[j] = 0.0f;
}

/* In place: dpre = scale * a * (da - sum_j a*da) over columns 0..t, zeros
 * after. */
static inline MEGA_HD void mega_kb_causal_softmax_bwd(int64_t r, float *da, const float *att,
                                                       int T, float scale) {
  int t = (int)(r % T);
  float *d = da + r * T;
  const float *a = att + r * T;
  float dot = 0.0f;
  for (int j = 0; j <= t; j++) dot += a[j] * d[j];
  for (int j = 0; j <= t; j++) d[j] = scale * a[j] * (d[j] - dot);
  for (int j = t + 1; j < T; j++) d[j] = 0.0f;
}

/* ---- column bodies: c < C ---- */

/* The embedding's gradients for channel c over all N = B*T rows. */
static inline MEGA_HD void mega_kb_encoder_bwd(int64_t c, float *dwte, int v0, int vn,
                                                float *dwpe, const float *dout,
                                                const int32_t *tok, int N, int T, int C) {
  for (int64_t n = 0; n < N; n++) {
    float d = dout[n * C + c];
    int64_t id = (int64_t)tok[n] - v0;
    if (dwte && id >= 0 && id < vn) dwte[id * C + c] += d;
    if (dwpe) dwpe[(n % T) * C + c] += d;
  }
}

static inline MEGA_HD void mega_kb_layernorm_bwd_w(int64_t c, float *dw, float *db,
                                                    const float *dout, const float *inp,
                                                    const float *mean, const float *rstd,
                                                    int N, int C) {
  float sw = 0.0f, sb = 0.0f;
  for (int64_t n = 0; n < N; n++) {
    float d = dout[n * C + c];
    sw += d * (inp[n * C + c] - mean[n]) * rstd[n];
    sb += d;
  }
  dw[c] += sw;
  db[c] += sb;
}

/* dbias[j] += sum_n dout[n, j]. */
static inline MEGA_HD void mega_kb_bias_grad(int64_t j, float *dbias, const float *dout, int N,
                                              int OC) {
  float s = 0.0f;
  for (int64_t n = 0; n < N; n++) s += dout[n * OC + j];
  dbias[j] += s;
}

#endif
