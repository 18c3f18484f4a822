/* Causal self-attention on the cpu, per (batch, key/value head) with its
 * query heads (grouped-query attention; one each without it), in groups of
 * 8 query rows: each group multiplies only the key columns up to its own
 * end, so the work is the causal half plus a sliver, and the products are
 * the register-tiled kernels of cpu_tile.c (no BLAS: at head size they beat
 * sgemm). K (forward) and V (backward) are transposed once per key/value
 * head into scratch so every product streams contiguous rows.
 *
 * Under --bf16, shapes the cuda backend runs as flash attention
 * (mega_attn_flash_shape) round where its kernels do: q, k, v and dout to
 * bf16 once; the probabilities before they multiply v (forward) or dout
 * (dv); the scores' gradient before it multiplies k (dq) and q (dk). The
 * products accumulate in fp32, the softmax and its gradient stay fp32.
 * The flash forward rounds each probability relative to a running
 * maximum, before it divides by the row's sum; here the rounding follows
 * the division: the same relative error, not the same bits. (So does the
 * softmax gradient's row sum: sum a*da here, dout.out in flash's.)
 *
 * Attention dropout (d->drop): the probabilities that multiply v are
 * a * mask * scale (kernels/dropout.h), a itself stays undropped in att
 * for the backward, which draws the same mask for dv and for the
 * probabilities' gradient. The cuda backend runs it as fp32 batched GEMMs
 * (attn_gemm.c) with the same bits, so under --bf16 it stays fp32 here too
 * (mega_attn_flash_shape). */
#include <math.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

#define GROUP 8 /* query rows per step; the tiles' row count */

static inline int imin(int a, int b) { return a < b ? a : b; }

/* Rows r0..r1 of a (T wide): softmax of cols 0..t (already scaled), zeros
 * after it up to the group's end r1, the only columns the products read. */
MEGA_CPU_CLONES
static void causal_softmax_rows(float *a, int r0, int r1, int T) {
  for (int t = r0; t < r1; t++) {
    float *row = a + (size_t)t * T;
    int n = t + 1, n16 = n / MEGA_LANES * MEGA_LANES;
    float acc[MEGA_LANES];
    for (int k = 0; k < MEGA_LANES; k++) acc[k] = -INFINITY;
    for (int s = 0; s < n16; s += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] = row[s + k] > acc[k] ? row[s + k] : acc[k];
    float mx = mega_lanes_max(acc);
    for (int s = n16; s < n; s++) mx = row[s] > mx ? row[s] : mx;
    for (int k = 0; k < MEGA_LANES; k++) acc[k] = 0.0f;
    for (int s = 0; s < n16; s += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) {
        row[s + k] = mega_expf(row[s + k] - mx);
        acc[k] += row[s + k];
      }
    float sum = mega_lanes_sum(acc);
    for (int s = n16; s < n; s++) {
      row[s] = mega_expf(row[s] - mx);
      sum += row[s];
    }
    float inv = 1.0f / sum;
    for (int s = 0; s < n; s++) row[s] *= inv;
    for (int s = n; s < r1; s++) row[s] = 0.0f;
  }
}

/* In place over da's causal part: dpre = scale * a * (da - sum_s a*da). */
MEGA_CPU_CLONES
static void softmax_backward_rows(float *da, const float *a, int r0, int r1, int T,
                                  float scale) {
  for (int t = r0; t < r1; t++) {
    float *d = da + (size_t)t * T;
    const float *p = a + (size_t)t * T;
    int n = t + 1, n16 = n / MEGA_LANES * MEGA_LANES;
    float acc[MEGA_LANES] = {0};
    for (int s = 0; s < n16; s += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] += p[s + k] * d[s + k];
    float dot = mega_lanes_sum(acc);
    for (int s = n16; s < n; s++) dot += p[s] * d[s];
    for (int s = 0; s < n; s++) d[s] = scale * p[s] * (d[s] - dot);
    for (int s = n; s < r1; s++) d[s] = 0.0f;
  }
}

/* dst[i][t] = src[t][i] for a [T x hs] view with row stride ld. */
static void transpose_scalar(float *dst, const float *src, int t0, int t1, int i0, int i1,
                             int T, int ld) {
  for (int i = i0; i < i1; i++)
    for (int t = t0; t < t1; t++) dst[(size_t)i * T + t] = src[(size_t)t * ld + i];
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 8 x 8 blocks through AVX registers; the ragged edges go scalar. */
__attribute__((target("avx"))) static void transpose_avx(float *dst, const float *src, int T,
                                                         int hs, int ld) {
  int T8 = T / 8 * 8, h8 = hs / 8 * 8;
  for (int t = 0; t < T8; t += 8)
    for (int i = 0; i < h8; i += 8) {
      const float *s = src + (size_t)t * ld + i;
      __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ld),
             r2 = _mm256_loadu_ps(s + 2 * (size_t)ld), r3 = _mm256_loadu_ps(s + 3 * (size_t)ld),
             r4 = _mm256_loadu_ps(s + 4 * (size_t)ld), r5 = _mm256_loadu_ps(s + 5 * (size_t)ld),
             r6 = _mm256_loadu_ps(s + 6 * (size_t)ld), r7 = _mm256_loadu_ps(s + 7 * (size_t)ld);
      __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1),
             u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3),
             u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5),
             u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
      __m256 v0 = _mm256_shuffle_ps(u0, u2, 0x44), v1 = _mm256_shuffle_ps(u0, u2, 0xEE),
             v2 = _mm256_shuffle_ps(u1, u3, 0x44), v3 = _mm256_shuffle_ps(u1, u3, 0xEE),
             v4 = _mm256_shuffle_ps(u4, u6, 0x44), v5 = _mm256_shuffle_ps(u4, u6, 0xEE),
             v6 = _mm256_shuffle_ps(u5, u7, 0x44), v7 = _mm256_shuffle_ps(u5, u7, 0xEE);
      float *d = dst + (size_t)i * T + t;
      _mm256_storeu_ps(d, _mm256_permute2f128_ps(v0, v4, 0x20));
      _mm256_storeu_ps(d + T, _mm256_permute2f128_ps(v1, v5, 0x20));
      _mm256_storeu_ps(d + 2 * (size_t)T, _mm256_permute2f128_ps(v2, v6, 0x20));
      _mm256_storeu_ps(d + 3 * (size_t)T, _mm256_permute2f128_ps(v3, v7, 0x20));
      _mm256_storeu_ps(d + 4 * (size_t)T, _mm256_permute2f128_ps(v0, v4, 0x31));
      _mm256_storeu_ps(d + 5 * (size_t)T, _mm256_permute2f128_ps(v1, v5, 0x31));
      _mm256_storeu_ps(d + 6 * (size_t)T, _mm256_permute2f128_ps(v2, v6, 0x31));
      _mm256_storeu_ps(d + 7 * (size_t)T, _mm256_permute2f128_ps(v3, v7, 0x31));
    }
  transpose_scalar(dst, src, 0, T8, h8, hs, T, ld);
  transpose_scalar(dst, src, T8, T, 0, hs, T, ld);
}
#endif

static void transpose(float *dst, const float *src, int T, int hs, int ld) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx")) {
    transpose_avx(dst, src, T, hs, ld);
    return;
  }
#endif
  transpose_scalar(dst, src, 0, T, 0, hs, T, ld);
}

/* Columns a group of rows ending at g1 computes: g1 rounded up to whole
 * 32-wide tiles. The extra columns lie above the diagonal, past anything
 * the products read (see the backward's note). */
static inline int tile_cols(int g1, int T) { return imin((g1 + 31) / 32 * 32, T); }

typedef struct attn_ctx {
  float *out, *att, *dq, *dk, *dv, *scratch;
  const float *q, *k, *v, *catt, *dout;
  mega_attn_dims d;
  bool round; /* --bf16 with a flash shape: the inputs are rounded copies */
} attn_ctx;

/* Rows r0..r1 of a (T wide) of head h of batch element b, columns 0..r1
 * (what the products read: the causal part and the group's zeros), into
 * dst (which may be a): times attention dropout's mask and scale when drop
 * and d->drop has one, then rounded to bf16 when round. */
static void mask_rows(const attn_ctx *c, float *dst, const float *a, int r0, int r1, int b,
                      int h, bool drop, bool round) {
  const mega_attn_dropout *dr = &c->d.drop;
  int T = c->d.T;
  drop = drop && dr->scale != 0.0f;
  for (int t = r0; t < r1; t++) {
    const float *src = a + (size_t)t * T;
    float *o = dst + (size_t)t * T;
    uint64_t key = drop ? mega_attn_dropout_row(dr, b, h, t) : 0;
    for (int s = 0; s < r1; s++) {
      float v = drop ? mega_attn_dropout_apply(dr, key, s, src[s]) : src[s];
      o[s] = round ? mega_bf16_round(v) : v;
    }
  }
}

/* c's q, k, v (and dout when given) replaced by rounded copies, when --bf16
 * rounds this shape; one copy when they are views of one fused buffer, as
 * GPT-2's qkv. False when a copy could not be made (the backend keeps the
 * error for synchronize; the op does nothing). */
static bool round_inputs(mega_backend *be, attn_ctx *c, bool dout) {
  const mega_attn_dims *d = &c->d;
  if (!((mega_cpu_impl *)be->impl)->bf16 || !mega_attn_flash_shape(d)) return true;
  c->round = true;
  size_t hq = (size_t)d->NH * d->hs, hk = (size_t)d->G * d->hs;
  if (mega_attn_fused_qkv(c->q, c->k, c->v, d)) {
    const float *r =
        mega_cpu_bf16_copy(be, MEGA_CPU_B16_Q, c->q, mega_attn_span(d, d->ldq, d->NH + 2 * d->G));
    if (!r) return false;
    c->q = r;
    c->k = r + hq;
    c->v = r + hq + hk;
  } else {
    c->q = mega_cpu_bf16_copy(be, MEGA_CPU_B16_Q, c->q, mega_attn_span(d, d->ldq, d->NH));
    c->k = mega_cpu_bf16_copy(be, MEGA_CPU_B16_K, c->k, mega_attn_span(d, d->ldkv, d->G));
    c->v = mega_cpu_bf16_copy(be, MEGA_CPU_B16_V, c->v, mega_attn_span(d, d->ldkv, d->G));
    if (!c->q || !c->k || !c->v) return false;
  }
  if (dout)
    c->dout = mega_cpu_bf16_copy(be, MEGA_CPU_B16_DOUT, c->dout,
                                 mega_attn_span(d, d->NH * d->hs, d->NH));
  return !dout || c->dout;
}

/* Key/value heads bg0..bg1 (bg = b * G + g), each with its NH/G query
 * heads: k (forward) or v (backward) is transposed once for all of them. */
static void attn_fwd_heads(void *vc, int64_t bg0, int64_t bg1) {
  const attn_ctx *c = vc;
  const mega_attn_dims *d = &c->d;
  bool dropping = d->drop.scale != 0.0f;
  int T = d->T, hs = d->hs, NH = d->NH, G = d->G, rep = NH / G, ldq = d->ldq, ldkv = d->ldkv;
  int ldo = NH * hs;
  float scale = 1.0f / sqrtf((float)hs);
  float *kT = c->scratch + (size_t)bg0 * hs * T; /* this chunk's slot */
  for (int64_t bg = bg0; bg < bg1; bg++) {
    int b = (int)(bg / G), g = (int)(bg % G);
    size_t koff = (size_t)b * T * ldkv + g * hs;
    const float *k = c->k + koff, *v = c->v + koff;
    transpose(kT, k, T, hs, ldkv);
    for (int r = 0; r < rep; r++) {
      int h = g * rep + r;
      const float *q = c->q + (size_t)b * T * ldq + h * hs;
      float *a = c->att + ((size_t)b * NH + h) * T * T;
      float *o = c->out + (size_t)b * T * ldo + h * hs;
      for (int g0 = 0; g0 < T; g0 += GROUP) {
        int g1 = imin(g0 + GROUP, T), rows = g1 - g0;
        /* a[g0:g1, 0:g1] = scale * q[g0:g1] k[0:g1]^T */
        mega_cpu_tile_nn(rows, tile_cols(g1, T), hs, scale, q + (size_t)g0 * ldq, ldq, kT, T,
                         a + (size_t)g0 * T, T);
        causal_softmax_rows(a, g0, g1, T);
        /* o[g0:g1] = a[g0:g1, 0:g1] v[0:g1], a dropped and rounded in the
         * backward's tile slot (free in the forward): a keeps the
         * probabilities the backward's softmax gradient needs */
        const float *pa = a;
        if (c->round || dropping) {
          float *rt = c->scratch + (size_t)d->B * T * ldo + (size_t)bg0 * T * T;
          mask_rows(c, rt, a, g0, g1, b, h, true, c->round);
          pa = rt;
        }
        mega_cpu_tile_nn(rows, hs, g1, 1.0f, pa + (size_t)g0 * T, T, v, ldkv,
                         o + (size_t)g0 * ldo, ldo);
      }
    }
  }
}

void mega_cpu_attention_forward(mega_backend *be, float *out, float *att, float *scratch,
                                const float *q, const float *k, const float *v,
                                const mega_attn_dims *d) {
  attn_ctx c = {.out = out, .att = att, .scratch = scratch, .q = q, .k = k, .v = v, .d = *d};
  if (!round_inputs(be, &c, false)) return;
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)d->B * d->G, 1, attn_fwd_heads, &c);
}

/* C[s0:s1] = (or += with acc) P[s0:T, s0:s1]^T X[s0:T] for each group of
 * keys s0:s1: they get contributions from queries s0..T-1 only, and read P
 * only at rows >= s0 and columns < s1, at or below the diagonal or above
 * it within the row's own group, where the softmax wrote zeros. */
static void by_key_groups(bool acc, int T, int hs, const float *P, const float *X, int ldx,
                          float *C, int ldc) {
  for (int s0 = 0; s0 < T; s0 += GROUP) {
    int s1 = imin(s0 + GROUP, T), rows = s1 - s0;
    (acc ? mega_cpu_tile_tn_acc : mega_cpu_tile_tn)(rows, hs, T - s0, 1.0f,
                                                     P + (size_t)s0 * T + s0, T,
                                                     X + (size_t)s0 * ldx, ldx,
                                                     C + (size_t)s0 * ldc, ldc);
  }
}

static void attn_bwd_heads(void *vc, int64_t bg0, int64_t bg1) {
  const attn_ctx *c = vc;
  const mega_attn_dims *d = &c->d;
  bool dropping = d->drop.scale != 0.0f;
  int T = d->T, hs = d->hs, NH = d->NH, G = d->G, rep = NH / G, ldq = d->ldq, ldkv = d->ldkv;
  int ldo = NH * hs;
  float scale = 1.0f / sqrtf((float)hs);
  /* this chunk's slots: V^T, and one T x T tile reused so it stays in cache */
  float *vT = c->scratch + (size_t)bg0 * hs * T;
  float *da = c->scratch + (size_t)d->B * T * ldo + (size_t)bg0 * T * T;
  for (int64_t bg = bg0; bg < bg1; bg++) {
    int b = (int)(bg / G), g = (int)(bg % G);
    size_t koff = (size_t)b * T * ldkv + g * hs;
    const float *k = c->k + koff, *v = c->v + koff;
    float *dk = c->dk + koff, *dv = c->dv + koff;
    transpose(vT, v, T, hs, ldkv);
    for (int r = 0; r < rep; r++) {
      int h = g * rep + r;
      size_t qoff = (size_t)b * T * ldq + h * hs;
      const float *q = c->q + qoff;
      float *dq = c->dq + qoff;
      const float *a = c->catt + ((size_t)b * NH + h) * T * T;
      const float *dy = c->dout + (size_t)b * T * ldo + h * hs;
      for (int g0 = 0; g0 < T; g0 += GROUP) {
        int g1 = imin(g0 + GROUP, T), rows = g1 - g0;
        /* da[g0:g1, 0:g1] = dy[g0:g1] v[0:g1]^T, the gradient of the
         * dropped probabilities: times the mask and scale it is the
         * probabilities' (the softmax gradient's row sum, sum a*da, is
         * then dout.out, out having been made of the dropped ones) */
        mega_cpu_tile_nn(rows, tile_cols(g1, T), hs, 1.0f, dy + (size_t)g0 * ldo, ldo, vT, T,
                         da + (size_t)g0 * T, T);
        if (dropping) mask_rows(c, da, da, g0, g1, b, h, true, false);
        softmax_backward_rows(da, a, g0, g1, T, scale);
        if (c->round) mask_rows(c, da, da, g0, g1, b, h, false, true);
        /* dq[g0:g1] = dpre[g0:g1, 0:g1] k[0:g1] */
        mega_cpu_tile_nn(rows, hs, g1, 1.0f, da + (size_t)g0 * T, T, k, ldkv,
                         dq + (size_t)g0 * ldq, ldq);
      }
      /* dk = dpre^T q, then dv = a^T dy with a as the forward multiplied v
       * (dropped, and rounded under --bf16) in da, dpre's tile, no longer
       * needed. The group's first query head writes dk and dv, the others
       * add to them. */
      by_key_groups(r > 0, T, hs, da, q, ldq, dk, ldkv);
      const float *pa = a;
      if (c->round || dropping) {
        for (int g0 = 0; g0 < T; g0 += GROUP)
          mask_rows(c, da, a, g0, imin(g0 + GROUP, T), b, h, true, c->round);
        pa = da;
      }
      by_key_groups(r > 0, T, hs, pa, dy, ldo, dv, ldkv);
    }
  }
}

void mega_cpu_attention_backward(mega_backend *be, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *att,
                                 const mega_attn_dims *d) {
  attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .scratch = scratch, .dout = dout, .q = q,
                .k = k, .v = v, .catt = att, .d = *d};
  if (!round_inputs(be, &c, true)) return;
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)d->B * d->G, 1, attn_bwd_heads, &c);
}
