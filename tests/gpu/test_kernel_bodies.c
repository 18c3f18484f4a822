/* The cuda backend's kernels without a GPU: every body of
 * kernels/gpt_bodies.h (GPT-2's and Llama's) run over every index on the CPU as
 * kernels/gpt_kernels.cu composes it on the device (row bodies in lanes,
 * column bodies in row lanes, their partials combined between phases; here
 * with lane counts that do and do not divide the row), each against the
 * cpu backend's op on the same random inputs (attention's composition is
 * test_attn_bodies.c's). This checks the indexing and the math; the launch
 * configuration is checked only where a GPU is (tests/gpu/, suite gpu). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/gpt_bodies.h"
#include "tests/gpu/bodies_check.h"
#include "worker/backend/backend.h"

static mega_backend *be;

/* A producer's --bf16 copy: every float's bits rounded, as
 * mega_cu_to_bf16 would make it from the fp32 written. */
static void bf16_of(const uint16_t *got, const float *x, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != mega_bf16_bits(x[i])) fail_msg("%s[%zu]: %#x, want %#x", what, i, got[i],
                                                 mega_bf16_bits(x[i]));
}

static float *copy(const float *x, size_t n) {
  float *v = malloc(n * sizeof *v);
  memcpy(v, x, n * sizeof *v);
  return v;
}

enum { B = 2, T = 7, C = 12, NH = 3, N = B * T, V = 10 };

static void layernorm_rows(int L, float *o, uint16_t *o16, float *m, float *r, const float *x,
                           const float *w, const float *b, float eps) {
  for (int64_t n = 0; n < N; n++) {
    const float *row = x + n * C;
    float mean = LANES_SUM(L, mega_kr_sum(row, C, l, L)) / C;
    float rs = 1.0f / sqrtf(LANES_SUM(L, mega_kr_sqdev(row, C, mean, l, L)) / C + eps);
    for (int l = 0; l < L; l++) mega_kr_layernorm_fwd(n, l, L, o, o16, m, r, x, w, b, C, mean, rs);
  }
}

static void layernorm_bwd_rows(int L, float *dinp, uint16_t *dinp16, const float *dres,
                               const float *dout, const float *x, const float *w, const float *m,
                               const float *r) {
  for (int64_t n = 0; n < N; n++) {
    float s1 = 0.0f, s2 = 0.0f;
    for (int l = 0; l < L; l++) {
      float a, b;
      mega_kr_layernorm_bwd_dots(n, l, L, &a, &b, dout, x, w, m, r, C);
      s1 += a;
      s2 += b;
    }
    for (int l = 0; l < L; l++)
      mega_kr_layernorm_bwd_in(n, l, L, dinp, dinp16, dres, dout, x, w, m, r, C, s1 / C, s2 / C);
  }
}

static void test_encoder(void **state) {
  (void)state;
  int32_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V;
  float *wte = vec(V * C, 1, 1), *wpe = vec(T * C, 2, 1), *dout = vec(N * C, 3, 1);
  float want[N * C], got[N * C];
  for (int v0 = 0; v0 < V; v0 += 5) { /* two slices of 5 ids */
    be->ops->encoder_forward(be, want, tok, wte + v0 * C, v0, 5, v0 ? NULL : wpe, B, T, C);
    for (int64_t i = 0; i < N * C; i++)
      mega_kb_encoder_fwd(i, got, tok, wte + v0 * C, v0, 5, v0 ? NULL : wpe, T, C);
    near(got, want, N * C, 0, "encoder forward");
    float dw1[5 * C], dw2[5 * C], dp1[T * C], dp2[T * C];
    memset(dw1, 0, sizeof dw1), memset(dw2, 0, sizeof dw2);
    memset(dp1, 0, sizeof dp1), memset(dp2, 0, sizeof dp2);
    be->ops->encoder_backward(be, dw1, v0, 5, dp1, dout, tok, B, T, C);
    int32_t ids[N], pos[N]; /* a stable sort of (id, position), as cub's radix sort */
    for (int i = 0; i < N; i++) {
      int j = i;
      for (; j > 0 && ids[j - 1] > tok[i]; j--) ids[j] = ids[j - 1], pos[j] = pos[j - 1];
      ids[j] = tok[i], pos[j] = i;
    }
    for (int64_t i = 0; i < N * C; i++) mega_kb_wte_bwd(i, dw2, v0, 5, dout, ids, pos, N, C);
    for (int64_t i = 0; i < T * C; i++) mega_kb_wpe_bwd(i, dp2, dout, B, T, C);
    near(dw2, dw1, 5 * C, 1e-6, "encoder backward wte");
    near(dp2, dp1, T * C, 1e-6, "encoder backward wpe");
  }
  free(wte), free(wpe), free(dout);
}

static void test_layernorm(void **state) {
  (void)state;
  float *x = vec(N * C, 4, 2), *w = vec(C, 5, 1), *b = vec(C, 6, 1), *d = vec(N * C, 7, 1);
  float *res = vec(N * C, 8, 1);
  float o1[N * C], o2[N * C], m1[N], m2[N], r1[N], r2[N];
  be->ops->layernorm_forward(be, o1, m1, r1, x, w, b, N, C, 1e-5f);
  FOR_LANES(L) {
    uint16_t o16[N * C];
    layernorm_rows(L, o2, o16, m2, r2, x, w, b, 1e-5f);
    near(o2, o1, N * C, 1e-5, "layernorm");
    bf16_of(o16, o2, N * C, "layernorm's bf16 copy");
    near(m2, m1, N, 1e-5, "layernorm mean");
    near(r2, r1, N, 1e-5, "layernorm rstd");
    for (int with_res = 0; with_res < 2; with_res++) {
      float d1[N * C], d2[N * C];
      uint16_t d16[N * C];
      be->ops->layernorm_backward_input(be, d1, with_res ? res : NULL, d, x, w, m1, r1, N, C);
      layernorm_bwd_rows(L, d2, d16, with_res ? res : NULL, d, x, w, m1, r1);
      near(d2, d1, N * C, 1e-5, "layernorm backward");
      bf16_of(d16, d2, N * C, "layernorm backward's bf16 copy");
    }
    float dw1[C], db1[C], dw2[C], db2[C]; /* they add: start from the same values */
    for (int c = 0; c < C; c++) dw1[c] = dw2[c] = 0.5f, db1[c] = db2[c] = -0.25f;
    be->ops->layernorm_backward_weight(be, dw1, db1, d, x, m1, r1, N, C);
    for (int64_t c = 0; c < C; c++) {
      float sw = 0.0f, sb = 0.0f;
      for (int r0 = 0; r0 < L; r0++) {
        float a, bb;
        mega_kc_layernorm_bwd_w(c, r0, L, &a, &bb, d, x, m1, r1, N, C);
        sw += a, sb += bb;
      }
      dw2[c] += sw, db2[c] += sb;
    }
    near(dw2, dw1, C, 1e-5, "layernorm dw");
    near(db2, db1, C, 1e-5, "layernorm db");
  }
  free(x), free(w), free(b), free(d), free(res);
}

static void test_elementwise(void **state) {
  (void)state;
  const int n = N * C;
  float *x = vec(n, 9, 4), *y = vec(n, 10, 1), *bias = vec(C, 11, 1);
  float a[N * C], g[N * C];
  /* GELU's two forms: the tanh approximation and the exact (erf) one */
  for (int erf = 0; erf < 2; erf++) {
    (erf ? be->ops->gelu_erf_forward : be->ops->gelu_forward)(be, a, x, n);
    for (int64_t i = 0; i < n; i++) (erf ? mega_kb_gelu_erf_fwd : mega_kb_gelu_fwd)(i, g, x);
    near(g, a, n, 0, erf ? "gelu (erf)" : "gelu");
    (erf ? be->ops->gelu_erf_backward : be->ops->gelu_backward)(be, a, x, y, n);
    for (int64_t i = 0; i < n; i++) (erf ? mega_kb_gelu_erf_bwd : mega_kb_gelu_bwd)(i, g, x, y);
    near(g, a, n, 0, erf ? "gelu (erf) backward" : "gelu backward");
  }
  be->ops->bias_residual_forward(be, a, x, y, bias, N, C);
  for (int64_t i = 0; i < n; i++) mega_kb_add(i, g, x, y, bias, C);
  near(g, a, n, 1e-7, "bias and residual");
  /* hidden dropout from a sequence-parallel rank's row 5, with and
   * without the residual and bias (its backward), the same bits */
  mega_dropout drop = mega_dropout_of(0.25, mega_dropout_key(3, 2, MEGA_DROP_ATTENTION), 40, 5, T);
  be->ops->bias_dropout_add(be, a, x, y, bias, N, C, &drop);
  for (int64_t i = 0; i < n; i++) mega_kb_bias_dropout_add(i, g, x, y, bias, C, drop);
  near(g, a, n, 0, "bias, dropout and residual");
  be->ops->bias_dropout_add(be, a, NULL, y, NULL, N, C, &drop);
  for (int64_t i = 0; i < n; i++) mega_kb_bias_dropout_add(i, g, NULL, y, NULL, C, drop);
  near(g, a, n, 0, "dropout backward");
  size_t zeros = 0;
  for (int64_t i = 0; i < n; i++) zeros += g[i] == 0.0f;
  assert_true(zeros > 0 && zeros < (size_t)n / 2); /* about a quarter */
  /* matmul_forward's bias and residual: the prefill, then the GEMM */
  float *w = vec(C * C, 12, 1);
  be->ops->matmul_forward(be, a, x, w, bias, y, N, C, C, MEGA_W_IN_OUT);
  for (int64_t i = 0; i < n; i++) mega_kb_bias_fill(i, g, bias, y, C);
  be->ops->gemm(be, false, false, N, C, C, 1.0f, x, C, w, C, 1.0f, g, C);
  near(g, a, n, 1e-5, "matmul with bias and residual");
  FOR_LANES(L) {
    float dw[C * C] = {0}, db1[C], db2[C];
    for (int j = 0; j < C; j++) db1[j] = db2[j] = 0.75f;
    be->ops->matmul_backward_weight(be, dw, db1, y, x, N, C, C, MEGA_W_IN_OUT);
    for (int64_t j = 0; j < C; j++)
      db2[j] += LANES_SUM(L, mega_kc_bias_grad(j, l, L, y, N, C, 0));
    near(db2, db1, C, 1e-5, "bias gradient");
  }
  float *p1 = vec(n, 13, 1), *m1 = vec(n, 14, 0.1f), *v1 = vec(n, 15, 0.1f);
  for (int i = 0; i < n; i++) v1[i] = fabsf(v1[i]);
  float *p2 = copy(p1, n), *m2 = copy(m1, n), *v2 = copy(v1, n);
  mega_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 3};
  be->ops->adamw(be, p1, y, m1, v1, n, &hp);
  float bc1 = 1.0f - powf(0.9f, 3.0f), bc2 = 1.0f - powf(0.95f, 3.0f);
  for (int64_t i = 0; i < n; i++)
    mega_kb_adamw(i, p2, y, m2, v2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, bc1, bc2);
  near(p2, p1, n, 0, "adamw params");
  near(m2, m1, n, 0, "adamw m");
  be->ops->scale(be, p1, n, 0.25f);
  for (int64_t i = 0; i < n; i++) mega_kb_scale(i, p2, 0.25f);
  near(p2, p1, n, 0, "scale");
  free(x), free(y), free(bias), free(w), free(p1), free(m1), free(v1), free(p2), free(m2), free(v2);
}

/* AdamW over many ranges in one launch (mega_kb_adamw_ranges), as the
 * kernel's grid-stride threads walk it: one thread, a few, and more
 * threads than items, each with its own cursor over ranges of odd sizes
 * and decays; against the cpu backend's adamw range by range, bit for
 * bit. */
static void test_adamw_ranges(void **state) {
  (void)state;
  enum { K = 5, TOTAL = 13 + 1 + 64 + 7 + 200 };
  const int64_t n[K] = {13, 1, 64, 7, 200};
  const float wd[K] = {0.1f, 0.0f, 0.1f, 0.0f, 0.02f};
  float *g = vec(TOTAL, 16, 1), *p0 = vec(TOTAL, 17, 1), *m0 = vec(TOTAL, 18, 0.1f);
  float *v0 = vec(TOTAL, 19, 0.1f);
  for (int i = 0; i < TOTAL; i++) v0[i] = fabsf(v0[i]);
  float *p = copy(p0, TOTAL), *m = copy(m0, TOTAL), *v = copy(v0, TOTAL);
  mega_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .grad_scale = 0.5f, .step = 3};
  for (int k = 0, off = 0; k < K; off += (int)n[k], k++) {
    hp.weight_decay = wd[k];
    be->ops->adamw(be, p + off, g + off, m + off, v + off, (size_t)n[k], &hp);
  }
  float bc1 = 1.0f - powf(0.9f, 3.0f), bc2 = 1.0f - powf(0.95f, 3.0f);
  const int threads[] = {1, 3, 64, TOTAL + 5};
  for (int ti = 0; ti < 4; ti++) {
    float *p2 = copy(p0, TOTAL), *m2 = copy(m0, TOTAL), *v2 = copy(v0, TOTAL);
    mega_cu_adamw_range t[K];
    for (int k = 0, off = 0; k < K; off += (int)n[k], k++)
      t[k] = (mega_cu_adamw_range){.p = p2 + off, .g = g + off, .m = m2 + off, .v = v2 + off,
                                   .start = off, .n = n[k], .wd = wd[k]};
    for (int th = 0; th < threads[ti]; th++) {
      int r = -1;
      for (int64_t i = th; i < TOTAL; i += threads[ti])
        mega_kb_adamw_ranges(i, t, K, &r, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, bc1, bc2);
    }
    near(p2, p, TOTAL, 0, "adamw over ranges params");
    near(m2, m, TOTAL, 0, "adamw over ranges m");
    near(v2, v, TOTAL, 0, "adamw over ranges v");
    free(p2), free(m2), free(v2);
  }
  /* the first item's search alone: every item's range */
  mega_cu_adamw_range lay[K];
  for (int k = 0, off = 0; k < K; off += (int)n[k], k++)
    lay[k] = (mega_cu_adamw_range){.start = off, .n = n[k]};
  for (int k = 0; k < K; k++)
    for (int64_t i = lay[k].start; i < lay[k].start + n[k]; i++)
      assert_int_equal(mega_kb_range_of(lay, K, i), k);
  free(g), free(p0), free(m0), free(v0), free(p), free(m), free(v);
}

/* ---- the classifier, in place ---- */

/* Rows of [rows, nv] as mega_cu_xent_fwd composes them: the target's logit
 * first, the lanes' (max, sum) pairs combined, then every lane's writes over
 * the logits. */
static void row_maxsum(int L, int w, const float *row, int nv, float *M, float *S) {
  float m[32], s[32];
  *M = -INFINITY, *S = 0.0f;
  for (int l = 0; l < L; l++) {
    mega_kr_xent_maxsum(row, nv, w, l, L, &m[l], &s[l]);
    *M = m[l] > *M ? m[l] : *M;
  }
  for (int l = 0; l < L; l++) *S += mega_kr_xent_rescale(m[l], s[l], *M);
}

static void xent_rows(int L, int w, float *losses, float *x, const int32_t *tg, int rows,
                      int nv) {
  for (int64_t n = 0; n < rows; n++) {
    float target = x[n * nv + tg[n]], M, S;
    row_maxsum(L, w, x + n * nv, nv, &M, &S);
    for (int l = 0; l < L; l++) mega_kr_xent_write(n, l, L, w, losses, x, nv, M, S, target);
  }
}

/* xent_rows with the backward in the write (mega_cu_xent_fwd_grad). */
static void xent_grad_rows(int L, int w, float *losses, float *x, uint16_t *d16,
                           const int32_t *tg, float scale, int rows, int nv) {
  for (int64_t n = 0; n < rows; n++) {
    float target = x[n * nv + tg[n]], M, S;
    row_maxsum(L, w, x + n * nv, nv, &M, &S);
    for (int l = 0; l < L; l++)
      mega_kr_xent_write_grad(n, l, L, w, losses, x, d16, nv, M, S, target, tg[n], scale);
  }
}

static void xent_bwd_rows(int L, int w, float *p, uint16_t *p16, const int32_t *tg, int v0,
                          float scale, int rows, int nv) {
  for (int64_t n = 0; n < rows; n++)
    for (int l = 0; l < L; l++) mega_kr_xent_bwd(n, l, L, w, p, p16, tg, v0, scale, nv);
}

/* The straightforward reference, in double over whole rows: the losses and
 * (softmax - onehot) * scale. */
static void xent_reference(const float *x, const int32_t *tg, int rows, int nv, double scale,
                           double *loss, double *d) {
  for (int n = 0; n < rows; n++) {
    const float *row = x + (size_t)n * nv;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < nv; j++) mx = fmax(mx, row[j]);
    for (int j = 0; j < nv; j++) sum += exp(row[j] - mx);
    loss[n] = log(sum) + mx - row[tg[n]];
    for (int j = 0; j < nv; j++) d[n * nv + j] = (exp(row[j] - mx) / sum - (j == tg[n])) * scale;
  }
}

static void near_ref(const float *got, const double *want, size_t n, double tol,
                     const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i]))))
      fail_msg("%s[%zu]: body %.9g, reference %.9g", what, i, (double)got[i], want[i]);
}

/* Whole rows: the bodies against the cpu backend's ops (its backward's bits
 * exactly) and the reference, one and four items a load, with a tail (V 10)
 * and without. */
static void test_cross_entropy(void **state) {
  (void)state;
  float *logits = vec(N * V, 16, 5);
  int32_t tg[N];
  for (int i = 0; i < N; i++) tg[i] = (i * 3) % V;
  float l1[N], l2[N], p1[N * V], p2[N * V];
  double rl[N], rd[N * V];
  xent_reference(logits, tg, N, V, 0.3f, rl, rd); /* not a power of two: products round */
  memcpy(p1, logits, sizeof p1);
  be->ops->crossentropy_forward(be, l1, p1, tg, N, V);
  be->ops->crossentropy_backward(be, p1, tg, 0, 0.3f, N, V);
  near_ref(l1, rl, N, 1e-6, "cpu backend loss");
  near_ref(p1, rd, N * V, 1e-6, "cpu backend dlogits");
  FOR_LANES(L) {
    for (int w = 1; w <= 4; w += 3) {
      memcpy(p2, logits, sizeof p2);
      xent_rows(L, w, l2, p2, tg, N, V);
      near(l2, l1, N, 1e-5, "cross-entropy loss");
      near_ref(l2, rl, N, 1e-6, "cross-entropy loss");
      float probs[N * V];
      memcpy(probs, p2, sizeof probs);
      uint16_t p16[N * V];
      xent_bwd_rows(L, w, p2, p16, tg, 0, 0.3f, N, V);
      near_ref(p2, rd, N * V, 1e-6, "cross-entropy dlogits");
      bf16_of(p16, p2, N * V, "cross-entropy dlogits' bf16 copy");
      /* the cpu backend's backward on the same probabilities: its bits */
      be->ops->crossentropy_backward(be, probs, tg, 0, 0.3f, N, V);
      near(p2, probs, N * V, 0, "cross-entropy backward");
      /* fused: the two passes' losses and dlogits, bit for bit */
      float fl[N], f2[N * V];
      uint16_t f16[N * V];
      memcpy(f2, logits, sizeof f2);
      xent_grad_rows(L, w, fl, f2, f16, tg, 0.3f, N, V);
      assert_memory_equal(fl, l2, sizeof fl);
      assert_memory_equal(f2, p2, sizeof f2);
      bf16_of(f16, f2, N * V, "fused dlogits' bf16 copy");
    }
  }
  free(logits);
}

/* The vocabulary-parallel passes over two slices of a vocabulary of 17
 * padded to 20 (padded ids 17..19 take part in the softmax and are never
 * targets), with targets on both sides of the slices' boundary and at the
 * last real id: each slice's bodies, reduced over the slices as the model
 * does, against the reference over whole rows and the cpu backend's ops. */
static void test_cross_entropy_slices(void **state) {
  (void)state;
  enum { VP = 20, TPs = 2, VLs = VP / TPs };
  const int32_t tg[N] = {0, 9, 10, 16, 1, 8, 11, 15, 5, 12, 3, 14, 7, 13};
  float *logits = vec(N * VP, 17, 6);
  double rl[N], rd[N * VP];
  xent_reference(logits, tg, N, VP, 0.3f, rl, rd);
  FOR_LANES(L) {
    for (int w = 1; w <= 4; w += 3) {
      float sl[TPs][N * VLs], sc[TPs][N * VLs], mx[N], sums[2 * N], ll[N], cl[N];
      float cmx[TPs][N], csums[TPs][2 * N];
      for (int n = 0; n < N; n++) {
        mx[n] = -INFINITY;
        for (int r = 0; r < TPs; r++)
          memcpy(sl[r] + n * VLs, logits + n * VP + r * VLs, VLs * sizeof(float));
      }
      memcpy(sc, sl, sizeof sc);
      for (int r = 0; r < TPs; r++)
        for (int64_t n = 0; n < N; n++) {
          float m = LANES_MAX(L, mega_kr_xent_max(sl[r] + n * VLs, VLs, w, l, L));
          mx[n] = m > mx[n] ? m : mx[n];
        }
      float cm[N];
      for (int r = 0; r < TPs; r++) be->ops->crossentropy_rowmax(be, cmx[r], sc[r], N, VLs);
      for (int n = 0; n < N; n++) cm[n] = fmaxf(cmx[0][n], cmx[1][n]);
      near(mx, cm, N, 0, "row max over the slices");
      memset(sums, 0, sizeof sums);
      for (int r = 0; r < TPs; r++) {
        float part[2 * N];
        for (int64_t n = 0; n < N; n++) {
          float sum = LANES_SUM(L, mega_kr_xent_sumexp(sl[r] + n * VLs, VLs, w, mx[n], l, L));
          mega_kr_xent_sums(n, part, sl[r], tg, r * VLs, N, VLs, sum);
        }
        be->ops->crossentropy_sums(be, csums[r], sc[r], mx, tg, r * VLs, N, VLs);
        near(part, csums[r], 2 * N, 1e-6, "slice exp sums and target logits");
        for (int i = 0; i < 2 * N; i++) sums[i] += part[i];
      }
      for (int r = 0; r < TPs; r++) {
        float fs[N * VLs], fl[N]; /* fused: finish and backward in one write */
        memcpy(fs, sl[r], sizeof fs);
        for (int64_t n = 0; n < N; n++)
          for (int l = 0; l < L; l++)
            mega_kr_xent_write_grad(n, l, L, w, fl, fs, NULL, VLs, mx[n], sums[n], sums[N + n],
                                    (int64_t)tg[n] - r * VLs, 0.3f);
        for (int64_t n = 0; n < N; n++)
          for (int l = 0; l < L; l++)
            mega_kr_xent_write(n, l, L, w, ll, sl[r], VLs, mx[n], sums[n], sums[N + n]);
        near_ref(ll, rl, N, 1e-6, "slice losses");
        be->ops->crossentropy_finish(be, cl, sc[r], mx, sums, N, VLs);
        near(ll, cl, N, 1e-6, "slice losses, cpu backend");
        near(sl[r], sc[r], N * VLs, 1e-6, "slice probabilities, cpu backend");
        xent_bwd_rows(L, w, sl[r], NULL, tg, r * VLs, 0.3f, N, VLs);
        be->ops->crossentropy_backward(be, sc[r], tg, r * VLs, 0.3f, N, VLs);
        assert_memory_equal(fl, ll, sizeof fl);
        assert_memory_equal(fs, sl[r], sizeof fs);
        for (int n = 0; n < N; n++) {
          double want[VLs];
          for (int j = 0; j < VLs; j++) want[j] = rd[n * VP + r * VLs + j];
          near_ref(sl[r] + n * VLs, want, VLs, 1e-6, "slice dlogits");
        }
        near(sl[r], sc[r], N * VLs, 1e-6, "slice dlogits, cpu backend");
      }
    }
  }
  free(logits);
}

/* RMSNorm's row and column bodies, SwiGLU's and RoPE's element bodies. */
static void test_llama_bodies(void **state) {
  (void)state;
  float *x = vec(N * C, 21, 2), *w = vec(C, 22, 1), *d = vec(N * C, 23, 1);
  float *res = vec(N * C, 24, 1);
  float o1[N * C], o2[N * C], r1[N], r2[N];
  uint16_t o16[N * C];
  be->ops->rmsnorm_forward(be, o1, r1, x, w, N, C, 1e-5f);
  FOR_LANES(L) {
    for (int64_t n = 0; n < N; n++) {
      const float *row = x + n * C;
      float r = 1.0f / sqrtf(LANES_SUM(L, mega_kr_dot(row, row, C, l, L)) / C + 1e-5f);
      for (int l = 0; l < L; l++) mega_kr_rmsnorm_fwd(n, l, L, o2, o16, r2, x, w, C, r);
    }
    near(o2, o1, N * C, 1e-5, "rmsnorm");
    bf16_of(o16, o2, N * C, "rmsnorm's bf16 copy");
    near(r2, r1, N, 1e-5, "rmsnorm rstd");
    for (int with_res = 0; with_res < 2; with_res++) {
      float d1[N * C], d2[N * C];
      uint16_t d16[N * C];
      const float *dres = with_res ? res : NULL;
      be->ops->rmsnorm_backward_input(be, d1, dres, d, x, w, r1, N, C);
      for (int64_t n = 0; n < N; n++) {
        float sd = LANES_SUM(L, mega_kr_rmsnorm_bwd_dot(n, l, L, d, x, w, r1, C)) / C;
        for (int l = 0; l < L; l++)
          mega_kr_rmsnorm_bwd_in(n, l, L, d2, d16, dres, d, x, w, r1, C, sd);
      }
      near(d2, d1, N * C, 1e-5, "rmsnorm backward");
      bf16_of(d16, d2, N * C, "rmsnorm backward's bf16 copy");
    }
    float dw1[C], dw2[C]; /* they add: start from the same values */
    for (int c = 0; c < C; c++) dw1[c] = dw2[c] = 0.5f;
    be->ops->rmsnorm_backward_weight(be, dw1, d, x, r1, N, C);
    for (int64_t c = 0; c < C; c++)
      dw2[c] += LANES_SUM(L, mega_kc_rmsnorm_bwd_w(c, l, L, d, x, r1, N, C));
    near(dw2, dw1, C, 1e-5, "rmsnorm dw");
  }
  /* SwiGLU, its backward in place (dgate over dout) as the model runs it */
  const int n = N * C;
  float g1[N * C], g2[N * C], u1[N * C], u2[N * C];
  be->ops->swiglu_forward(be, o1, x, res, n);
  for (int64_t i = 0; i < n; i++) mega_kb_swiglu_fwd(i, o2, x, res);
  near(o2, o1, n, 0, "swiglu");
  memcpy(g1, d, sizeof g1);
  memcpy(g2, d, sizeof g2);
  be->ops->swiglu_backward(be, g1, u1, g1, x, res, n);
  for (int64_t i = 0; i < n; i++) mega_kb_swiglu_bwd(i, g2, u2, g2, x, res);
  near(g2, g1, n, 0, "swiglu dgate");
  near(u2, u1, n, 0, "swiglu dup");
  /* RoPE on 2 heads of 6 (4 rotated) in rows of 14, forward then back */
  enum { HEADS = 2, HS = 6, ROT = 4, LD = 14 };
  float cs[T * ROT];
  for (int t = 0; t < T; t++)
    for (int i = 0; i < ROT / 2; i++) {
      cs[t * ROT + i] = cosf(0.3f * t * (i + 1));
      cs[t * ROT + ROT / 2 + i] = sinf(0.3f * t * (i + 1));
    }
  float *q1 = vec(N * LD, 25, 1), *q2 = copy(q1, N * LD);
  be->ops->rope_forward(be, q1, cs, B, T, HEADS, HS, LD, ROT);
  for (int64_t i = 0; i < N * HEADS * ROT / 2; i++)
    mega_kb_rope(i, q2, cs, T, HEADS, HS, LD, ROT, 1.0f);
  near(q2, q1, N * LD, 0, "rope");
  be->ops->rope_backward(be, q1, cs, B, T, HEADS, HS, LD, ROT);
  for (int64_t i = 0; i < N * HEADS * ROT / 2; i++)
    mega_kb_rope(i, q2, cs, T, HEADS, HS, LD, ROT, -1.0f);
  near(q2, q1, N * LD, 0, "rope backward");
  free(x), free(w), free(d), free(res), free(q1), free(q2);
}

static int setup(void **state) {
  (void)state;
  return mega_backend_cpu_create(NULL, &be, NULL) == MEGA_OK ? 0 : -1;
}

/* The column sums as gpt_kernels.cu launches them: mega_kc_slices' slices
 * of MEGA_KC_ROWS lanes, each block's lanes added in its tree, the slices
 * in order. Every row is read once, and the slices fill the GPU without
 * leaving a lane fewer than MEGA_KC_MIN_ROWS rows. */
static float bias_grad_as_launched(int64_t j, const float *dy, int rows, int cols, int round16) {
  int S = mega_kc_slices(rows, cols), R = S * MEGA_KC_ROWS;
  float total = 0.0f;
  for (int s = 0; s < S; s++) {
    float acc[MEGA_KC_ROWS];
    for (int l = 0; l < MEGA_KC_ROWS; l++)
      acc[l] = mega_kc_bias_grad(j, s * MEGA_KC_ROWS + l, R, dy, rows, cols, round16);
    for (int k = MEGA_KC_ROWS / 2; k > 0; k >>= 1)
      for (int l = 0; l < k; l++) acc[l] += acc[l + k];
    total = s ? total + acc[0] : acc[0];
  }
  return total;
}

static void test_column_geometry(void **state) {
  (void)state;
  static const int shapes[][2] = {{8192, 768}, {8192, 3072}, {8192, 2304}, {8192, 50304},
                                  {14, 12},    {300, 70},    {2048, 40},   {1, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int rows = shapes[i][0], cols = shapes[i][1], S = mega_kc_slices(rows, cols);
    int64_t tiles = (cols + MEGA_KC_TILE - 1) / MEGA_KC_TILE;
    int64_t most = rows / (MEGA_KC_ROWS * MEGA_KC_MIN_ROWS);
    assert_true(S >= 1);
    if (S > 1) assert_true(rows / (S * MEGA_KC_ROWS) >= MEGA_KC_MIN_ROWS);
    /* enough blocks, or as many slices as the rows allow */
    assert_true(tiles * S >= MEGA_KC_BLOCKS || S == (most > 1 ? most : 1));
  }
  assert_int_equal(mega_kc_slices(8192, 768), 22); /* 528 blocks of GPT-2's proj bias */
  assert_int_equal(mega_kc_slices(0, 768), 1);
  /* the launched order against the cpu backend, with one slice and many */
  static const int sums[][2] = {{300, 70}, {2048, 40}, {14, 12}};
  for (size_t i = 0; i < sizeof sums / sizeof sums[0]; i++) {
    int rows = sums[i][0], cols = sums[i][1];
    float *dy = vec((size_t)rows * cols, 31 + (unsigned)i, 1);
    float *x = vec((size_t)rows * cols, 7, 1), *dw = calloc((size_t)cols * cols, sizeof *dw);
    float *db1 = calloc((size_t)cols, sizeof *db1), *db2 = calloc((size_t)cols, sizeof *db2);
    be->ops->matmul_backward_weight(be, dw, db1, dy, x, rows, cols, cols, MEGA_W_IN_OUT);
    for (int64_t j = 0; j < cols; j++) db2[j] = bias_grad_as_launched(j, dy, rows, cols, 0);
    near(db2, db1, (size_t)cols, 1e-5, "bias gradient in slices");
    /* --bf16: both sum the gradient rounded to bf16, as the GEMM reads it */
    mega_err err = {0};
    float *db3 = calloc((size_t)cols, sizeof *db3);
    assert_int_equal(be->ops->set_bf16(be, true, &err), MEGA_OK);
    be->ops->matmul_backward_weight(be, dw, db3, dy, x, rows, cols, cols, MEGA_W_IN_OUT);
    assert_int_equal(be->ops->set_bf16(be, false, &err), MEGA_OK);
    for (int64_t j = 0; j < cols; j++) db2[j] = bias_grad_as_launched(j, dy, rows, cols, 1);
    near(db2, db3, (size_t)cols, 1e-5, "bf16 bias gradient in slices");
    assert_memory_not_equal(db1, db3, (size_t)cols * sizeof *db1);
    free(dy), free(x), free(dw), free(db1), free(db2), free(db3);
  }
}

static int teardown(void **state) {
  (void)state;
  mega_backend_destroy(be);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder),         cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_elementwise),     cmocka_unit_test(test_adamw_ranges),
      cmocka_unit_test(test_cross_entropy),   cmocka_unit_test(test_cross_entropy_slices),
      cmocka_unit_test(test_llama_bodies),    cmocka_unit_test(test_column_geometry),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
