/* Per-thread bodies of the cuda backend's simple kernels: each computes
 * one output item (an element, a row, or a column) from its index, with the
 * same math as the cpu backend (kernels/elementwise.h). kernels/gpt_kernels.cu wraps
 * each in a grid-stride __global__; tests/gpu/test_kernel_bodies.c runs the
 * same bodies over every index on the CPU against the cpu backend. That is
 * how the indexing is tested on machines without a GPU.
 *
 * Row bodies (mega_kr_) run in lanes that share a row and column bodies
 * (mega_kc_) in row lanes that share a column, combined in a fixed order:
 * deterministic (no atomics). Shapes follow backend.h. */
#ifndef MEGA_KERNELS_GPT_BODIES_H
#define MEGA_KERNELS_GPT_BODIES_H

#include <stdint.h>

#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/launch.h"

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

static inline MEGA_HD void mega_kb_gelu_erf_fwd(int64_t i, float *out, const float *inp) {
  out[i] = mega_gelu_erf(inp[i]);
}

static inline MEGA_HD void mega_kb_gelu_erf_bwd(int64_t i, float *dinp, const float *inp,
                                                 const float *dout) {
  dinp[i] = mega_gelu_erf_grad(inp[i]) * dout[i];
}

/* out = a + b (+ bias[i % C] when bias). */
static inline MEGA_HD void mega_kb_add(int64_t i, float *out, const float *a, const float *b,
                                        const float *bias, int C) {
  out[i] = a[i] + b[i] + (bias ? bias[i % C] : 0.0f);
}

/* out[i] of [rows,C] = res + dropout(y + bias) (res, bias may be NULL;
 * backend.h's bias_dropout_add): each element draws its own row key. */
static inline MEGA_HD void mega_kb_bias_dropout_add(int64_t i, float *out, const float *res,
                                                     const float *y, const float *bias, int C,
                                                     mega_dropout d) {
  int64_t c = i % C;
  float v = mega_dropout_apply(&d, mega_dropout_row(&d, i / C), c,
                               y[i] + (bias ? bias[c] : 0.0f));
  out[i] = res ? res[i] + v : v;
}

/* Before a GEMM that adds into out: out[n,j] = bias[j] + residual[n,j]
 * (either may be NULL; residual may be out itself). */
static inline MEGA_HD void mega_kb_bias_fill(int64_t i, float *out, const float *bias,
                                              const float *residual, int OC) {
  float r = residual ? residual[i] : 0.0f;
  out[i] = r + (bias ? bias[i % OC] : 0.0f);
}

static inline MEGA_HD void mega_kb_adamw(int64_t i, float *p, const float *g, float *m,
                                          float *v, float lr, float b1, float b2, float eps,
                                          float wd, float gs, float bc1, float bc2) {
  mega_adamw_elem(&p[i], &m[i], &v[i], g[i] * gs, lr, b1, b2, eps, wd, bc1, bc2);
}

/* The range holding item i of t's count ranges laid end to end (by start,
 * none empty). */
static inline MEGA_HD int mega_kb_range_of(const mega_cu_adamw_range *t, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (t[mid].start <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Item i of AdamW over many ranges: mega_kb_adamw in its range, with that
 * range's decay. *r is the range of the thread's previous item (-1 before
 * its first): a grid-stride thread's items only grow, so after one search
 * it steps forward. */
static inline MEGA_HD void mega_kb_adamw_ranges(int64_t i, const mega_cu_adamw_range *t,
                                                 int count, int *r, float lr, float b1,
                                                 float b2, float eps, float gs, float bc1,
                                                 float bc2) {
  if (*r < 0) *r = mega_kb_range_of(t, count, i);
  while (i >= t[*r].start + t[*r].n) ++*r;
  const mega_cu_adamw_range *x = &t[*r];
  mega_kb_adamw(i - x->start, x->p, x->g, x->m, x->v, lr, b1, b2, eps, x->wd, gs, bc1, bc2);
}

static inline MEGA_HD void mega_kb_scale(int64_t i, float *x, float s) { x[i] *= s; }

/* out = silu(gate) * up (Llama's MLP). */
static inline MEGA_HD void mega_kb_swiglu_fwd(int64_t i, float *out, const float *gate,
                                               const float *up) {
  out[i] = mega_silu(gate[i]) * up[i];
}

/* dgate (may alias dout) and dup from dout. */
static inline MEGA_HD void mega_kb_swiglu_bwd(int64_t i, float *dgate, float *dup,
                                               const float *dout, const float *gate,
                                               const float *up) {
  mega_swiglu_grad(gate[i], up[i], dout[i], &dgate[i], &dup[i]);
}

/* Rotary pair i of [N rows, heads, rot/2] in x (rows of stride ld): row n
 * is token n % T of its sequence; sign -1 rotates back (the backward). */
static inline MEGA_HD void mega_kb_rope(int64_t i, float *x, const float *cs, int T, int heads,
                                         int hs, int ld, int rot, float sign) {
  int half = rot / 2;
  int64_t n = i / ((int64_t)heads * half);
  int h = (int)(i / half % heads), j = (int)(i % half);
  const float *c = cs + (n % T) * rot;
  float *p = x + n * ld + (int64_t)h * hs;
  mega_rope_pair(&p[j], &p[j + half], c[j], sign * c[half + j]);
}

/* --bf16: a GEMM input's element as bf16 bits (cuBLAS's CUDA_R_16BF). */
static inline MEGA_HD void mega_kb_to_bf16(int64_t i, uint16_t *out, const float *in) {
  out[i] = mega_bf16_bits(in[i]);
}

/* bf16 back to fp32, item i of a [rows, cols] block: row i / cols of in
 * (row stride ldi) to out (ldo), and with out16 the stored float's bf16
 * bits at the same place (--bf16's copy for the next GEMM). cuDNN's
 * attention output and gradients. */
static inline MEGA_HD void mega_kb_from_bf16(int64_t i, float *out, uint16_t *out16,
                                             int64_t ldo, const uint16_t *in, int64_t ldi,
                                             int64_t cols) {
  int64_t r = i / cols, c = i % cols;
  float y = mega_bf16_to_float(in[r * ldi + c]);
  out[r * ldo + c] = y;
  if (out16) out16[r * ldo + c] = mega_bf16_bits(y);
}

/* ---- row bodies, in lanes: n < N ----
 * L lanes share a row: lane l takes items l, l + L, l + 2L, ... (adjacent
 * lanes read adjacent floats). A row op is phases: each lane's partial
 * (a sum or a max), combined over the row's lanes (warp shuffles on the GPU,
 * a loop in tests/gpu/test_kernel_bodies.c), then the next phase or the
 * lanes' writes. Lane 0 writes a row's scalars. */

static inline MEGA_HD float mega_kr_sum(const float *x, int n, int l, int L) {
  float s = 0.0f;
  for (int i = l; i < n; i += L) s += x[i];
  return s;
}

static inline MEGA_HD float mega_kr_max(const float *x, int n, int l, int L) {
  float m = -INFINITY;
  for (int i = l; i < n; i += L) m = x[i] > m ? x[i] : m;
  return m;
}

/* sum (x - m)^2 */
static inline MEGA_HD float mega_kr_sqdev(const float *x, int n, float m, int l, int L) {
  float s = 0.0f;
  for (int i = l; i < n; i += L) s += (x[i] - m) * (x[i] - m);
  return s;
}

/* sum e^(x - mx); with store, x[i] becomes e^(x[i] - mx) (in place). */
static inline MEGA_HD float mega_kr_sumexp(float *store, const float *x, int n, float mx, int l,
                                           int L) {
  float s = 0.0f;
  for (int i = l; i < n; i += L) {
    float e = mega_expf(x[i] - mx);
    if (store) store[i] = e;
    s += e;
  }
  return s;
}

/* sum a * b */
static inline MEGA_HD float mega_kr_dot(const float *a, const float *b, int n, int l, int L) {
  float s = 0.0f;
  for (int i = l; i < n; i += L) s += a[i] * b[i];
  return s;
}

/* layernorm: mean = sum(x) / C, then rstd from sum((x - mean)^2), then this;
 * with out16, out's bf16 bits too (--bf16's copy for the next GEMM). */
static inline MEGA_HD void mega_kr_layernorm_fwd(int64_t n, int l, int L, float *out,
                                                 uint16_t *out16, float *mean, float *rstd,
                                                 const float *inp, const float *w,
                                                 const float *b, int C, float m, float r) {
  const float *x = inp + n * C;
  float *o = out + n * C;
  for (int i = l; i < C; i += L) {
    float y = (x[i] - m) * r * w[i] + b[i];
    o[i] = y;
    if (out16) out16[n * C + i] = mega_bf16_bits(y);
  }
  if (l == 0) mean[n] = m, rstd[n] = r;
}

/* layernorm backward: the partials of s1 = sum(dout w) and s2 = sum(dout w
 * xhat) over row n, then the write with s1 / C and s2 / C; with dinp16,
 * the bf16 bits too (the residual stream's gradient, which the projection
 * GEMMs take as their output gradient under --bf16). */
static inline MEGA_HD void mega_kr_layernorm_bwd_dots(int64_t n, int l, int L, float *s1,
                                                      float *s2, const float *dout,
                                                      const float *inp, const float *w,
                                                      const float *mean, const float *rstd,
                                                      int C) {
  const float *x = inp + n * C, *d = dout + n * C;
  float m = mean[n], r = rstd[n], a = 0.0f, b = 0.0f;
  for (int i = l; i < C; i += L) {
    float dn = d[i] * w[i];
    a += dn;
    b += dn * (x[i] - m) * r;
  }
  *s1 = a;
  *s2 = b;
}

static inline MEGA_HD void mega_kr_layernorm_bwd_in(int64_t n, int l, int L, float *dinp,
                                                    uint16_t *dinp16, const float *dres,
                                                    const float *dout, const float *inp,
                                                    const float *w, const float *mean,
                                                    const float *rstd, int C, float s1,
                                                    float s2) {
  const float *x = inp + n * C, *d = dout + n * C;
  float m = mean[n], r = rstd[n], *di = dinp + n * C;
  for (int i = l; i < C; i += L) {
    float g = (d[i] * w[i] - s1 - (x[i] - m) * r * s2) * r;
    float y = dres ? dres[n * C + i] + g : g;
    di[i] = y;
    if (dinp16) dinp16[n * C + i] = mega_bf16_bits(y);
  }
}

/* RMSNorm: rstd r from the row's sum of squares (mega_kr_dot(x, x)), then
 * this. */
static inline MEGA_HD void mega_kr_rmsnorm_fwd(int64_t n, int l, int L, float *out,
                                               uint16_t *out16, float *rstd, const float *inp,
                                               const float *w, int C, float r) {
  const float *x = inp + n * C;
  float *o = out + n * C;
  for (int i = l; i < C; i += L) {
    float y = x[i] * r * w[i];
    o[i] = y;
    if (out16) out16[n * C + i] = mega_bf16_bits(y);
  }
  if (l == 0) rstd[n] = r;
}

/* RMSNorm backward: the partial of s = sum(dout w xhat) over row n, then
 * the write with s / C. */
static inline MEGA_HD float mega_kr_rmsnorm_bwd_dot(int64_t n, int l, int L, const float *dout,
                                                    const float *inp, const float *w,
                                                    const float *rstd, int C) {
  const float *x = inp + n * C, *d = dout + n * C;
  float r = rstd[n], a = 0.0f;
  for (int i = l; i < C; i += L) a += d[i] * w[i] * x[i] * r;
  return a;
}

static inline MEGA_HD void mega_kr_rmsnorm_bwd_in(int64_t n, int l, int L, float *dinp,
                                                  uint16_t *dinp16, const float *dres,
                                                  const float *dout, const float *inp,
                                                  const float *w, const float *rstd, int C,
                                                  float s) {
  const float *x = inp + n * C, *d = dout + n * C;
  float r = rstd[n], *di = dinp + n * C;
  for (int i = l; i < C; i += L) {
    float g = (d[i] * w[i] - x[i] * r * s) * r;
    float y = dres ? dres[n * C + i] + g : g;
    di[i] = y;
    if (dinp16) dinp16[n * C + i] = mega_bf16_bits(y);
  }
}

/* ---- the classifier: softmax cross-entropy in place over [N,V] rows ----
 * A row is read twice and written once: one pass for the lane's running
 * max and sum of e^(x - max), combined over the row's lanes, then one that
 * writes the probabilities over the logits (the loss needs the target's
 * logit, read before that pass). The backward turns them into dlogits in
 * one more read and write. Each lane takes w items at a time (w = 4 where
 * the rows start on 16 bytes: one 128-bit load on the GPU, mega_ldw), chunks
 * l, l + L, ..., then the tail past the last whole chunk one item at a time.
 * The vocabulary-parallel passes share them: sums[n] and sums[N + n] (the
 * target's logit in this slice, 0 outside) come from lane 0 of
 * mega_kr_xent_sums. */

static inline MEGA_HD void mega_ldw(const float *p, int w, float *v) {
#ifdef __CUDA_ARCH__
  if (w == 4) {
    float4 f = *(const float4 *)p;
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    return;
  }
#endif
  for (int k = 0; k < w; k++) v[k] = p[k];
}

static inline MEGA_HD void mega_stw(float *p, int w, const float *v) {
#ifdef __CUDA_ARCH__
  if (w == 4) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#endif
  for (int k = 0; k < w; k++) p[k] = v[k];
}

/* v's bf16 bits at p (8 bytes on the GPU when w is 4: p on 8 bytes). */
static inline MEGA_HD void mega_stw16(uint16_t *p, int w, const float *v) {
#ifdef __CUDA_ARCH__
  if (w == 4) {
    *(uint2 *)p = make_uint2(mega_bf16_bits(v[0]) | (uint32_t)mega_bf16_bits(v[1]) << 16,
                             mega_bf16_bits(v[2]) | (uint32_t)mega_bf16_bits(v[3]) << 16);
    return;
  }
#endif
  for (int k = 0; k < w; k++) p[k] = mega_bf16_bits(v[k]);
}

/* The lane's running max *m and sum *s of e^(x - *m) over its items: the
 * sum rescales when the max grows (once per chunk, not per item). An empty
 * lane gives -inf and 0, which the combine below ignores. */
static inline MEGA_HD void mega_kr_xent_maxsum(const float *x, int n, int w, int l, int L,
                                               float *m, float *s) {
  float mx = -INFINITY, sum = 0.0f, v[4];
  int whole = n / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(x + i, w, v);
    float cm = v[0];
    for (int k = 1; k < w; k++) cm = v[k] > cm ? v[k] : cm;
    if (cm > mx) {
      sum *= mega_expf(mx - cm);
      mx = cm;
    }
    for (int k = 0; k < w; k++) sum += mega_expf(v[k] - mx);
  }
  for (int i = whole + l; i < n; i += L) {
    if (x[i] > mx) {
      sum *= mega_expf(mx - x[i]);
      mx = x[i];
    }
    sum += mega_expf(x[i] - mx);
  }
  *m = mx;
  *s = sum;
}

/* A lane's sum from mega_kr_xent_maxsum, moved to the row's max M (the max
 * of the lanes' maxima) before the lanes' sums are added. */
static inline MEGA_HD float mega_kr_xent_rescale(float m, float s, float M) {
  return s > 0.0f ? s * mega_expf(m - M) : 0.0f;
}

/* The vocabulary-parallel passes: the row max, then sum e^(x - mx) with the
 * group's max. */
static inline MEGA_HD float mega_kr_xent_max(const float *x, int n, int w, int l, int L) {
  float mx = -INFINITY, v[4];
  int whole = n / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(x + i, w, v);
    for (int k = 0; k < w; k++) mx = v[k] > mx ? v[k] : mx;
  }
  for (int i = whole + l; i < n; i += L) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

static inline MEGA_HD float mega_kr_xent_sumexp(const float *x, int n, int w, float mx, int l,
                                                int L) {
  float sum = 0.0f, v[4];
  int whole = n / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(x + i, w, v);
    for (int k = 0; k < w; k++) sum += mega_expf(v[k] - mx);
  }
  for (int i = whole + l; i < n; i += L) sum += mega_expf(x[i] - mx);
  return sum;
}

/* Row n of logits becomes e^(x - mx) / sum in place; lane 0 writes the loss
 * log(sum) + mx - (the target's logit). */
static inline MEGA_HD void mega_kr_xent_write(int64_t n, int l, int L, int w, float *losses,
                                              float *logits, int V, float mx, float sum,
                                              float target_logit) {
  float *x = logits + n * V, inv = 1.0f / sum, v[4];
  int whole = V / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(x + i, w, v);
    for (int k = 0; k < w; k++) v[k] = mega_expf(v[k] - mx) * inv;
    mega_stw(x + i, w, v);
  }
  for (int i = whole + l; i < V; i += L) x[i] = mega_expf(x[i] - mx) * inv;
  if (l == 0) losses[n] = logf(sum) + mx - target_logit;
}

/* A probability's gradient: p * scale, minus scale at the target, each
 * step rounded on its own on the GPU (never one fused multiply-add), so the
 * fused classifier and the backward's pass keep the same bits whatever the
 * compiler would fuse, and the cpu backend's. */
static inline MEGA_HD float mega_xent_grad(float p, float scale, int target) {
#ifdef __CUDA_ARCH__
  float d = __fmul_rn(p, scale);
  return target ? __fsub_rn(d, scale) : d;
#else
  float d = p * scale;
  return target ? d - scale : d;
#endif
}

/* The fused classifier (llm.c's): row n of logits becomes dlogits in the
 * same pass, e^(x - mx) / sum and then the backward's expression
 * (mega_kr_xent_bwd, so the bits are those of the two passes) for the
 * row's target t (outside [0, V): none); with d16, the bf16 bits too. The
 * probabilities are never stored. Lane 0 writes the loss. */
static inline MEGA_HD void mega_kr_xent_write_grad(int64_t n, int l, int L, int w,
                                                   float *losses, float *logits, uint16_t *d16,
                                                   int V, float mx, float sum,
                                                   float target_logit, int64_t t, float scale) {
  float *x = logits + n * V, inv = 1.0f / sum, v[4];
  uint16_t *x16 = d16 ? d16 + n * V : NULL;
  int whole = V / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(x + i, w, v);
    for (int k = 0; k < w; k++)
      v[k] = mega_xent_grad(mega_expf(v[k] - mx) * inv, scale, i + k == t);
    mega_stw(x + i, w, v);
    if (x16) mega_stw16(x16 + i, w, v);
  }
  for (int i = whole + l; i < V; i += L) {
    float d = mega_xent_grad(mega_expf(x[i] - mx) * inv, scale, i == t);
    x[i] = d;
    if (x16) x16[i] = mega_bf16_bits(d);
  }
  if (l == 0) losses[n] = logf(sum) + mx - target_logit;
}

static inline MEGA_HD void mega_kr_xent_sums(int64_t n, float *sums, const float *logits,
                                             const int32_t *targets, int v0, int N, int V,
                                             float sum) {
  int64_t t = (int64_t)targets[n] - v0;
  sums[n] = sum;
  sums[N + n] = t >= 0 && t < V ? logits[n * V + t] : 0.0f;
}

/* The backward of row n, in place: p * scale, then minus scale at the
 * target if it is in the slice [v0, v0 + V) (the cpu backend's expression,
 * so the bits match); with probs16, their bf16 bits too (--bf16's copy). */
static inline MEGA_HD void mega_kr_xent_bwd(int64_t n, int l, int L, int w, float *probs,
                                            uint16_t *probs16, const int32_t *targets, int v0,
                                            float scale, int V) {
  float *p = probs + n * V, v[4];
  uint16_t *p16 = probs16 ? probs16 + n * V : NULL;
  int64_t t = (int64_t)targets[n] - v0;
  int whole = V / w * w;
  for (int i = l * w; i < whole; i += L * w) {
    mega_ldw(p + i, w, v);
    for (int k = 0; k < w; k++) v[k] = mega_xent_grad(v[k], scale, i + k == t);
    mega_stw(p + i, w, v);
    if (p16) mega_stw16(p16 + i, w, v);
  }
  for (int i = whole + l; i < V; i += L) {
    float d = mega_xent_grad(p[i], scale, i == t);
    p[i] = d;
    if (p16) p16[i] = mega_bf16_bits(d);
  }
}

/* causal softmax of row r = (bh, t) of scores [BH, T, T] (already scaled):
 * mx over columns 0..t, then the sum of e^(x - mx) stored in place, then
 * this: scale by 1 / sum, zeros after t. */
static inline MEGA_HD void mega_kr_causal_softmax_scale(int64_t r, int l, int L, float *att,
                                                        int T, float sum) {
  int t = (int)(r % T);
  float *row = att + r * T, inv = 1.0f / sum;
  for (int j = l; j < T; j += L) row[j] = j <= t ? row[j] * inv : 0.0f;
}

/* In place: dpre = scale * a * (da - dot) over columns 0..t, zeros after,
 * where dot = sum a * da over 0..t. */
static inline MEGA_HD void mega_kr_causal_softmax_bwd(int64_t r, int l, int L, float *da,
                                                      const float *att, int T, float scale,
                                                      float dot) {
  int t = (int)(r % T);
  float *d = da + r * T;
  const float *a = att + r * T;
  for (int j = l; j < T; j += L) d[j] = j <= t ? scale * a[j] * (d[j] - dot) : 0.0f;
}

/* Attention dropout of element i of probabilities [B, NH, T, T] (row
 * r = (b * NH + h) * T + t, column s): src[i] times its mask bit and scale
 * (kernels/dropout.h, the bits the cpu attention draws) at and below the
 * diagonal, zero above it. dst may be src. */
static inline MEGA_HD void mega_kb_attn_dropout(int64_t i, float *dst, const float *src, int NH,
                                                int T, mega_attn_dropout d) {
  int64_t r = i / T, s = i % T, bh = r / T;
  int t = (int)(r % T);
  dst[i] = s <= t ? mega_attn_dropout_apply(
                        &d, mega_attn_dropout_row(&d, bh / NH, (int)(bh % NH), t), s, src[i])
                  : 0.0f;
}

/* ---- column bodies: c < C ---- */

/* The embedding's gradient from the tokens sorted by id, stably (ids[i],
 * pos[i]: the i-th smallest id and its position): item i * C + c where i
 * starts a run of one id sums the run's rows of column c in position
 * order, then adds to the id's row (ids outside the slice [v0, v0+vn) add
 * nothing). Every row has one writer, so no atomics, and the order does not
 * depend on timing. */
static inline MEGA_HD void mega_kb_wte_bwd(int64_t item, float *dwte, int v0, int vn,
                                           const float *dout, const int32_t *ids,
                                           const int32_t *pos, int N, int C) {
  int64_t i = item / C, c = item % C;
  int32_t id = ids[i];
  int64_t r = (int64_t)id - v0;
  if ((i > 0 && ids[i - 1] == id) || r < 0 || r >= vn) return;
  float s = 0.0f;
  for (int64_t j = i; j < N && ids[j] == id; j++) s += dout[(int64_t)pos[j] * C + c];
  dwte[r * C + c] += s;
}

/* dwpe[i] (i = t * C + c) += the B rows of position t, in order. */
static inline MEGA_HD void mega_kb_wpe_bwd(int64_t i, float *dwpe, const float *dout, int B,
                                           int T, int C) {
  float s = 0.0f;
  for (int64_t b = 0; b < B; b++) s += dout[b * T * C + i];
  dwpe[i] += s;
}

/* Column sums' geometry (kernels/gpt_kernels.cu): a block holds
 * MEGA_KC_TILE adjacent columns (a warp reads 128 contiguous bytes of a
 * row) x MEGA_KC_ROWS row lanes, and the rows are cut into slices, one
 * block each, so that a 768-column bias gradient still fills the GPU
 * (about MEGA_KC_BLOCKS blocks) while each lane keeps MEGA_KC_MIN_ROWS rows
 * or more. Lane l of slice s sums rows s * MEGA_KC_ROWS + l, stepping by
 * slices * MEGA_KC_ROWS. The slices' partials go to scratch and are added
 * in slice order by a second pass. A function of the shape alone, so the
 * sums are the same on every GPU. */
enum { MEGA_KC_TILE = 32, MEGA_KC_ROWS = 16, MEGA_KC_BLOCKS = 512, MEGA_KC_MIN_ROWS = 8 };

static inline int mega_kc_slices(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 1;
  int64_t tiles = (cols + MEGA_KC_TILE - 1) / MEGA_KC_TILE;
  int64_t want = (MEGA_KC_BLOCKS + tiles - 1) / tiles;
  int64_t most = rows / ((int64_t)MEGA_KC_ROWS * MEGA_KC_MIN_ROWS);
  if (want > most) want = most;
  return want < 1 ? 1 : (int)want;
}

/* The weight and bias gradients are column sums over N rows: R row lanes
 * each sum rows r0, r0 + R, ... of column c (threads of adjacent columns
 * read adjacent floats), and the R partials are combined in a fixed order
 * (deterministic, no atomics) before dw[c] += . */
static inline MEGA_HD void mega_kc_layernorm_bwd_w(int64_t c, int r0, int R, float *sw,
                                                   float *sb, const float *dout,
                                                   const float *inp, const float *mean,
                                                   const float *rstd, int N, int C) {
  float a = 0.0f, b = 0.0f;
  for (int64_t n = r0; n < N; n += R) {
    float d = dout[n * C + c];
    a += d * (inp[n * C + c] - mean[n]) * rstd[n];
    b += d;
  }
  *sw = a;
  *sb = b;
}

/* RMSNorm's weight gradient: the partial of column c over rows r0, r0 + R, ... */
static inline MEGA_HD float mega_kc_rmsnorm_bwd_w(int64_t c, int r0, int R, const float *dout,
                                                  const float *inp, const float *rstd, int N,
                                                  int C) {
  float a = 0.0f;
  for (int64_t n = r0; n < N; n += R) a += dout[n * C + c] * inp[n * C + c] * rstd[n];
  return a;
}

/* sum over rows r0, r0 + R, ... of dout[n, j]; with round16 (--bf16), of
 * dout rounded to bf16: the values the weight gradient's GEMM reads, and
 * what cuBLASLt's bias-gradient epilogue sums */
static inline MEGA_HD float mega_kc_bias_grad(int64_t j, int r0, int R, const float *dout, int N,
                                              int OC, int round16) {
  float s = 0.0f;
  if (round16)
    for (int64_t n = r0; n < N; n += R) s += mega_bf16_round(dout[n * OC + j]);
  else
    for (int64_t n = r0; n < N; n += R) s += dout[n * OC + j];
  return s;
}

#endif
