/* The cpu backend's ops against plain double-precision loops, at sizes that
 * exercise the tiled and edge paths (Llama's kernels, the layernorm, GELU,
 * cross-entropy and encoder, GEMMs), and the shared element math against
 * libm; at one and three threads. Attention is in test_cpu_attention.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cpu_ops_fixture.h"
#include "gpt_fixture.h"
#include "kernels/elementwise.h"
#include "kernels/rng.h"

static void element_math_matches_libm(void **state) {
  (void)state;
  double worst_exp = 0, worst_gelu = 0, worst_grad = 0;
  for (int i = -200000; i <= 200000; i++) {
    float x = i * 4.35e-4f; /* [-87, 87]; below -87 the result is clamped */
    double e = exp((double)x);
    worst_exp = fmax(worst_exp, fabs(mega_expf(x) - e) / e);
    double u = i * 1e-4f; /* [-20, 20] */
    double c = 0.7978845608028654 * (u + 0.044715 * u * u * u), th = tanh(c);
    double g = 0.5 * u * (1 + th);
    double dg = 0.5 * (1 + th) +
                0.5 * u * (1 - th * th) * 0.7978845608028654 * (1 + 3 * 0.044715 * u * u);
    worst_gelu = fmax(worst_gelu, fabs(mega_gelu((float)u) - g) / fmax(1.0, fabs(g)));
    worst_grad = fmax(worst_grad, fabs(mega_gelu_grad((float)u) - dg));
  }
  printf("# worst: expf rel %.2g, gelu %.2g, gelu' %.2g\n", worst_exp, worst_gelu, worst_grad);
  assert_true(worst_exp < 5e-7);
  assert_true(worst_gelu < 5e-7);
  assert_true(worst_grad < 1e-6);
  assert_true(isnan(mega_expf(NAN)));
  assert_true(mega_expf(-1000.0f) < 1e-37f && mega_expf(-1000.0f) >= 0.0f);
  assert_true(fabsf(mega_gelu(-100.0f)) < 1e-30f && mega_gelu(100.0f) == 100.0f);
  assert_true(fabsf(mega_gelu_grad(-100.0f)) < 1e-20f && mega_gelu_grad(100.0f) == 1.0f);
}

/* The exact GELU, x Phi(x), against libm's erfc in double: relative to
 * max(1, |gelu|), and, in the left tail (down to -12, where Phi is 2e-33),
 * relative to the value itself; the derivative Phi(x) + x phi(x) absolutely
 * (it is at most 1.13). */
static void gelu_erf_matches_libm(void **state) {
  (void)state;
  double worst = 0, worst_tail = 0, worst_grad = 0;
  for (int i = -200000; i <= 200000; i++) {
    double u = i * 1e-4f; /* [-20, 20] */
    double g = 0.5 * u * erfc(-u / sqrt(2.0));
    double dg = 0.5 * erfc(-u / sqrt(2.0)) + u * exp(-0.5 * u * u) / sqrt(2.0 * M_PI);
    double got = mega_gelu_erf((float)u);
    worst = fmax(worst, fabs(got - g) / fmax(1.0, fabs(g)));
    if (u < 0 && u > -12) worst_tail = fmax(worst_tail, fabs(got - g) / fabs(g));
    worst_grad = fmax(worst_grad, fabs(mega_gelu_erf_grad((float)u) - dg));
  }
  printf("# worst: gelu (erf) %.2g, in the left tail %.2g, its derivative %.2g\n", worst,
         worst_tail, worst_grad);
  assert_true(worst < 3e-7);
  assert_true(worst_tail < 2e-5);
  assert_true(worst_grad < 5e-7);
  /* the tanh form differs from it by up to about 4.4e-4 (near x = 2.5):
   * the two are told apart */
  assert_true(fabsf(mega_gelu_erf(2.5f) - mega_gelu(2.5f)) > 4e-4f);
  /* no denormals or NaNs in the tails, and exact far right */
  assert_true(mega_gelu_erf(-100.0f) <= 0.0f && mega_gelu_erf(-100.0f) > -1e-30f);
  assert_true(fpclassify(mega_gelu_erf(-100.0f)) == FP_NORMAL);
  assert_true(mega_gelu_erf(100.0f) == 100.0f && mega_gelu_erf(0.0f) == 0.0f);
  assert_true(fabsf(mega_gelu_erf_grad(-100.0f)) < 1e-20f);
  assert_true(fpclassify(mega_gelu_erf_grad(-100.0f)) == FP_NORMAL);
  assert_true(mega_gelu_erf_grad(100.0f) == 1.0f && mega_gelu_erf_grad(0.0f) == 0.5f);
}

static void rng_is_a_function_of_key_and_index(void **state) {
  (void)state;
  uint64_t k1 = mega_rng_key(1, "transformer.wte.weight"),
           k2 = mega_rng_key(1, "transformer.wpe.weight"), k3 = mega_rng_key(2, "transformer.wte.weight");
  assert_true(k1 != k2 && k1 != k3);
  assert_true(mega_rng_normal(k1, 12345) == mega_rng_normal(k1, 12345));
  double s = 0, s2 = 0;
  int n = 200000;
  for (int i = 0; i < n; i++) {
    double z = mega_rng_normal(k1, (uint64_t)i);
    s += z;
    s2 += z * z;
  }
  printf("# normal: mean %.4f var %.4f\n", s / n, s2 / n);
  assert_true(fabs(s / n) < 0.01 && fabs(s2 / n - 1) < 0.02);
}

/* init_normal, whole and as tensor-parallel slices (a fused QKV [C, 3C]
 * over TP 2: each third's columns cut), is the draw at tp_split.h's full
 * index, bit for bit, on however many threads the backend has. */
static void init_normal_is_the_draw_at_the_full_index(void **state) {
  (void)state;
  enum { Cq = 192, TPn = 2 }; /* 110,592 floats: several of the pool's chunks */
  uint64_t key = mega_rng_key(7, "h.0.attn.c_attn.weight");
  const mega_tp_split sp = {.parts = 3, .outer = Cq, .inner = Cq};
  size_t full = (size_t)Cq * 3 * Cq, local = full / TPn;
  float *whole = malloc(full * sizeof *whole), *part = malloc(local * sizeof *part);
  cpu_be->ops->init_normal(cpu_be, whole, full, key, 0.02, full, full, 0);
  for (size_t i = 0; i < full; i++)
    if (whole[i] != (float)(0.02 * mega_rng_normal(key, i))) fail_msg("element %zu", i);
  for (int r = 0; r < TPn; r++) {
    size_t w = sp.inner / TPn;
    cpu_be->ops->init_normal(cpu_be, part, local, key, 0.02, w, sp.inner, (size_t)r * w);
    for (size_t i = 0; i < local; i++)
      if (part[i] != whole[mega_tp_full_index(&sp, TPn, r, i)])
        fail_msg("rank %d, element %zu: not the whole tensor's", r, i);
  }
  free(whole), free(part);
}

static void adamw_matches_reference(void **state) {
  (void)state;
  size_t n = 100000;
  float *p = vec(n, 1, 1), *g = vec(n, 1, 2), *m = vec(n, 0.1f, 3), *v = vec(n, 0.1f, 4);
  double *rp = malloc(n * sizeof *rp);
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  mega_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 3};
  for (size_t i = 0; i < n; i++) {
    double gi = g[i] * 0.5, mi = 0.9 * m[i] + 0.1 * gi, vi = 0.95 * v[i] + 0.05 * gi * gi;
    double mh = mi / (1 - pow(0.9, 3)), vh = vi / (1 - pow(0.95, 3));
    rp[i] = p[i] - 1e-3 * (mh / (sqrt(vh) + 1e-8) + 0.1 * p[i]);
  }
  cpu_be->ops->adamw(cpu_be, p, g, m, v, n, &hp);
  near(p, rp, n, 1e-6, "adamw params");
  double ss = 0, s = 0, got;
  for (size_t i = 0; i < n; i++) {
    ss += (double)g[i] * g[i];
    s += g[i];
  }
  assert_int_equal(cpu_be->ops->sum_squares(cpu_be, g, n, &got, NULL), MEGA_OK);
  assert_true(fabs(got - ss) <= 1e-6 * ss);
  assert_int_equal(cpu_be->ops->sum(cpu_be, g, n, &got, NULL), MEGA_OK);
  assert_true(fabs(got - s) <= 1e-5 * fmax(1, fabs(s)) + 1e-4);
  cpu_be->ops->scale(cpu_be, g, n, 2.0f);
  assert_int_equal(cpu_be->ops->sum(cpu_be, g, n, &got, NULL), MEGA_OK);
  assert_true(fabs(got - 2 * s) <= 1e-5 * fmax(1, fabs(s)) + 1e-4);
  free(p);
  free(g);
  free(m);
  free(v);
  free(rp);
}

/* backend.c's many-range ops on a backend without them (the cpu's):
 * AdamW over ranges of odd sizes (one empty), each with its own decay
 * (hp's is not read), gives the bits of adamw range by range; each
 * posted sum of squares, the bits of sum_squares (one range spans several
 * of the cpu's blocks). */
static void many_ranges_match_one_by_one(void **state) {
  (void)state;
  enum { K = 6 };
  const size_t n[K] = {37, 0, 1, 140001, 1000, 4097};
  const float wd[K] = {0.1f, 0.1f, 0.0f, 0.1f, 0.0f, 0.05f};
  size_t total = 0;
  for (int k = 0; k < K; k++) total += n[k];
  float *p = vec(total, 1, 11), *g = vec(total, 1, 12), *m = vec(total, 0.1f, 13);
  float *v = vec(total, 0.1f, 14);
  for (size_t i = 0; i < total; i++) v[i] = fabsf(v[i]);
  float *p2 = malloc(total * 4), *m2 = malloc(total * 4), *v2 = malloc(total * 4);
  memcpy(p2, p, total * 4), memcpy(m2, m, total * 4), memcpy(v2, v, total * 4);
  mega_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.5f, .grad_scale = 0.7f, .step = 5};
  mega_adamw_range r[K];
  mega_sumsq_range s[K];
  double *slots;
  assert_int_equal(cpu_be->ops->alloc(cpu_be, K * sizeof *slots, (void **)&slots, NULL), MEGA_OK);
  for (size_t k = 0, off = 0; k < K; off += n[k], k++) {
    mega_adamw_params one = hp;
    one.weight_decay = wd[k];
    cpu_be->ops->adamw(cpu_be, p + off, g + off, m + off, v + off, n[k], &one);
    r[k] = (mega_adamw_range){.params = p2 + off, .grads = g + off, .m = m2 + off,
                              .v = v2 + off, .n = n[k], .weight_decay = wd[k]};
    s[k] = (mega_sumsq_range){.x = g + off, .n = n[k], .out = &slots[k]};
  }
  mega_adamw_ranges(cpu_be, r, K, &hp);
  assert_memory_equal(p2, p, total * 4);
  assert_memory_equal(m2, m, total * 4);
  assert_memory_equal(v2, v, total * 4);
  assert_int_equal(mega_sum_squares_post(cpu_be, s, K, NULL), MEGA_OK);
  double got[K];
  assert_int_equal(cpu_be->ops->memcpy(cpu_be, got, slots, sizeof got, MEGA_COPY_D2H, NULL),
                   MEGA_OK);
  for (size_t k = 0, off = 0; k < K; off += n[k], k++) {
    double want;
    assert_int_equal(cpu_be->ops->sum_squares(cpu_be, g + off, n[k], &want, NULL), MEGA_OK);
    assert_memory_equal(&got[k], &want, sizeof want);
  }
  assert_true(got[3] > 1e5 && got[1] == 0.0);
  cpu_be->ops->free(cpu_be, slots);
  free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

static void matmul_both_layouts(void **state) {
  (void)state;
  int N = 200, C = 24, OC = 200; /* big enough to split across threads */
  float *x = vec((size_t)N * C, 1, 1), *w = vec((size_t)C * OC, 1, 2), *b = vec(OC, 1, 3);
  float *dy = vec((size_t)N * OC, 1, 4), *out = malloc(sizeof(float) * N * OC);
  float *dx = malloc(sizeof(float) * N * C), *dw = vec((size_t)C * OC, 1, 5),
        *db = vec(OC, 1, 6);
  double *r = malloc(sizeof(double) * N * OC * 2);
  for (int lay = 0; lay < 2; lay++) {
    /* W(c, o) in the layout under test */
#define W(c, o) (lay == MEGA_W_IN_OUT ? w[(size_t)(c) * OC + (o)] : w[(size_t)(o) * C + (c)])
    cpu_be->ops->matmul_forward(cpu_be, out, x, w, b, NULL, N, C, OC, (mega_wlayout)lay);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) {
        double s = b[o];
        for (int c = 0; c < C; c++) s += (double)x[n * C + c] * W(c, o);
        r[n * OC + o] = s;
      }
    near(out, r, (size_t)N * OC, 1e-5, "matmul_forward");
    /* with a residual: out of place, in place, and without a bias */
    float *res = vec((size_t)N * OC, 1, 7), *out2 = malloc(sizeof(float) * N * OC);
    cpu_be->ops->matmul_forward(cpu_be, out2, x, w, b, res, N, C, OC, (mega_wlayout)lay);
    for (int i = 0; i < N * OC; i++) r[i] += res[i];
    near(out2, r, (size_t)N * OC, 1e-5, "matmul_forward + residual");
    memcpy(out2, res, sizeof(float) * N * OC);
    cpu_be->ops->matmul_forward(cpu_be, out2, x, w, b, out2, N, C, OC, (mega_wlayout)lay);
    near(out2, r, (size_t)N * OC, 1e-5, "matmul_forward += (residual is out)");
    memcpy(out2, res, sizeof(float) * N * OC);
    cpu_be->ops->matmul_forward(cpu_be, out2, x, w, NULL, out2, N, C, OC, (mega_wlayout)lay);
    for (int o = 0; o < OC; o++)
      for (int n = 0; n < N; n++) r[n * OC + o] -= b[o];
    near(out2, r, (size_t)N * OC, 1e-5, "matmul_forward += without bias");
    cpu_be->ops->matmul_forward(cpu_be, out2, x, w, NULL, res, N, C, OC, (mega_wlayout)lay);
    near(out2, r, (size_t)N * OC, 1e-5, "matmul_forward + residual without bias");
    free(res);
    free(out2);
    cpu_be->ops->matmul_backward_input(cpu_be, dx, dy, w, N, C, OC, (mega_wlayout)lay, false);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        double s = 0;
        for (int o = 0; o < OC; o++) s += (double)dy[n * OC + o] * W(c, o);
        r[n * C + c] = s;
      }
    near(dx, r, (size_t)N * C, 1e-5, "matmul_backward_input");
    cpu_be->ops->matmul_backward_input(cpu_be, dx, dy, w, N, C, OC, (mega_wlayout)lay, true);
    for (int i = 0; i < N * C; i++) r[i] *= 2;
    near(dx, r, (size_t)N * C, 1e-5, "matmul_backward_input (accumulate)");
    for (int c = 0; c < C; c++)
      for (int o = 0; o < OC; o++) {
        double s = lay == MEGA_W_IN_OUT ? dw[c * OC + o] : dw[o * C + c];
        for (int n = 0; n < N; n++) s += (double)x[n * C + c] * dy[n * OC + o];
        r[lay == MEGA_W_IN_OUT ? c * OC + o : o * C + c] = s;
      }
    for (int o = 0; o < OC; o++) {
      double s = db[o];
      for (int n = 0; n < N; n++) s += dy[n * OC + o];
      r[C * OC + o] = s;
    }
    cpu_be->ops->matmul_backward_weight(cpu_be, dw, db, dy, x, N, C, OC, (mega_wlayout)lay);
    near(dw, r, (size_t)C * OC, 1e-5, "matmul_backward_weight dW");
    near(db, r + C * OC, OC, 1e-5, "matmul_backward_weight dbias");
#undef W
  }
  free(x), free(w), free(b), free(dy), free(out), free(dx), free(dw), free(db), free(r);
}
/* RMSNorm, SwiGLU and RoPE against double loops. */
static void llama_kernels(void **state) {
  (void)state;
  int N = 300, C = 96, B = 3, T = 100; /* split across threads */
  size_t nc = (size_t)N * C;
  float *x = vec(nc, 2, 31), *w = vec(C, 1, 32), *dy = vec(nc, 1, 33), *res = vec(nc, 1, 34);
  float *out = malloc(nc * 4), *rstd = malloc(N * 4), *dx = malloc(nc * 4), *dw = vec(C, 1, 35);
  double *r = malloc(nc * 8), *rdx = malloc(nc * 8), *rdw = malloc(C * 8);
  for (int c = 0; c < C; c++) rdw[c] = dw[c];
  for (int n = 0; n < N; n++) {
    double ss = 0, s = 0;
    for (int c = 0; c < C; c++) ss += (double)x[n * C + c] * x[n * C + c];
    double rs = 1 / sqrt(ss / C + 1e-6);
    for (int c = 0; c < C; c++) {
      double xh = x[n * C + c] * rs;
      r[n * C + c] = xh * w[c];
      rdw[c] += dy[n * C + c] * xh;
      s += dy[n * C + c] * w[c] * xh;
    }
    for (int c = 0; c < C; c++)
      rdx[n * C + c] = res[n * C + c] + rs * (dy[n * C + c] * w[c] - x[n * C + c] * rs * s / C);
  }
  cpu_be->ops->rmsnorm_forward(cpu_be, out, rstd, x, w, N, C, 1e-6f);
  near(out, r, nc, 1e-5, "rmsnorm_forward");
  cpu_be->ops->rmsnorm_backward_input(cpu_be, dx, res, dy, x, w, rstd, N, C);
  near(dx, rdx, nc, 1e-5, "rmsnorm_backward_input (residual)");
  memcpy(dx, res, nc * 4);
  cpu_be->ops->rmsnorm_backward_input(cpu_be, dx, dx, dy, x, w, rstd, N, C);
  near(dx, rdx, nc, 1e-5, "rmsnorm_backward_input (residual in place)");
  cpu_be->ops->rmsnorm_backward_weight(cpu_be, dw, dy, x, rstd, N, C);
  near(dw, rdw, C, 1e-5, "rmsnorm dweight (+=)");

  /* SwiGLU over a wide range of gates; backward in place over dout */
  float *up = vec(nc, 1, 36);
  cpu_be->ops->swiglu_forward(cpu_be, out, x, up, nc);
  for (size_t i = 0; i < nc; i++) r[i] = x[i] / (1 + exp(-(double)x[i])) * up[i];
  near(out, r, nc, 1e-6, "swiglu_forward");
  float *dup = malloc(nc * 4);
  memcpy(dx, dy, nc * 4);
  cpu_be->ops->swiglu_backward(cpu_be, dx, dup, dx, x, up, nc);
  for (size_t i = 0; i < nc; i++) {
    double g = x[i], sg = 1 / (1 + exp(-g));
    r[i] = dy[i] * up[i] * (sg + g * sg * (1 - sg));
    rdx[i] = dy[i] * g * sg;
  }
  near(dx, r, nc, 1e-6, "swiglu dgate");
  near(dup, rdx, nc, 1e-6, "swiglu dup");

  /* RoPE: 3 heads of 16 with the first 12 channels rotated, rows of 50 */
  int H = 3, HS = 16, ROT = 12, LD = 50;
  float *cs = malloc(sizeof(float) * T * ROT), *q = vec((size_t)N * LD, 1, 37);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < ROT / 2; i++) {
      double ang = t * pow(10000.0, -2.0 * i / ROT);
      cs[t * ROT + i] = (float)cos(ang);
      cs[t * ROT + ROT / 2 + i] = (float)sin(ang);
    }
  double *rq = malloc(sizeof(double) * N * LD);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < LD; j++) {
      int h = j / HS, i = j % HS, t = n % T;
      double v = q[n * LD + j];
      if (h < H && i < ROT) { /* x cos + rotate_half(x) sin */
        int p = i < ROT / 2 ? i + ROT / 2 : i - ROT / 2, f = i % (ROT / 2);
        double c = cs[t * ROT + f], sn = cs[t * ROT + ROT / 2 + f];
        double other = q[n * LD + h * HS + p];
        v = v * c + (i < ROT / 2 ? -other : other) * sn;
      }
      rq[n * LD + j] = v;
    }
  float *q0 = malloc(sizeof(float) * N * LD);
  memcpy(q0, q, sizeof(float) * N * LD);
  cpu_be->ops->rope_forward(cpu_be, q, cs, B, T, H, HS, LD, ROT);
  near(q, rq, (size_t)N * LD, 1e-6, "rope_forward");
  /* a rotation: back to the start */
  cpu_be->ops->rope_backward(cpu_be, q, cs, B, T, H, HS, LD, ROT);
  for (int i = 0; i < N * LD; i++) rq[i] = q0[i];
  near(q, rq, (size_t)N * LD, 1e-6, "rope_backward");
  free(x), free(w), free(dy), free(res), free(out), free(rstd), free(dx), free(dw), free(r);
  free(rdx), free(rdw), free(up), free(dup), free(cs), free(q), free(rq), free(q0);
}

static void layernorm_gelu_crossentropy_encoder(void **state) {
  (void)state;
  int N = 400, C = 160, V = 96, T = 50, B = 8; /* split across threads */
  float *x = vec((size_t)N * C, 2, 1), *w = vec(C, 1, 2), *b = vec(C, 1, 3);
  float *dy = vec((size_t)N * C, 1, 4), *out = malloc(sizeof(float) * N * C);
  float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
  float *dx = vec((size_t)N * C, 1, 5), *dw = vec(C, 1, 6), *db = vec(C, 1, 7);
  double *r = malloc(sizeof(double) * N * C), *rdw = malloc(sizeof(double) * C * 2);
  cpu_be->ops->layernorm_forward(cpu_be, out, mean, rstd, x, w, b, N, C, 1e-5f);
  for (int c = 0; c < C; c++) rdw[c] = dw[c], rdw[C + c] = db[c];
  double *rdx = malloc(sizeof(double) * N * C);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    double rs = 1 / sqrt(v / C + 1e-5), s1 = 0, s2 = 0;
    for (int c = 0; c < C; c++) {
      double xh = (x[n * C + c] - m) * rs;
      r[n * C + c] = xh * w[c] + b[c];
      rdw[c] += dy[n * C + c] * xh;
      rdw[C + c] += dy[n * C + c];
      s1 += dy[n * C + c] * w[c];
      s2 += dy[n * C + c] * w[c] * xh;
    }
    for (int c = 0; c < C; c++) {
      double xh = (x[n * C + c] - m) * rs;
      rdx[n * C + c] = dx[n * C + c] + rs * (dy[n * C + c] * w[c] - s1 / C - xh * s2 / C);
    }
  }
  near(out, r, (size_t)N * C, 1e-5, "layernorm_forward");
  /* three ways: into a fresh buffer (dres NULL), out of place, in place */
  size_t nc = (size_t)N * C;
  float *old = malloc(nc * sizeof *old), *d1 = malloc(nc * sizeof *d1),
        *d2 = malloc(nc * sizeof *d2);
  double *rln = malloc(nc * sizeof *rln);
  memcpy(old, dx, nc * sizeof *old);
  for (size_t i = 0; i < nc; i++) rln[i] = rdx[i] - old[i];
  cpu_be->ops->layernorm_backward_input(cpu_be, d1, NULL, dy, x, w, mean, rstd, N, C);
  near(d1, rln, nc, 1e-5, "layernorm_backward_input (no residual)");
  cpu_be->ops->layernorm_backward_input(cpu_be, d2, old, dy, x, w, mean, rstd, N, C);
  near(d2, rdx, nc, 1e-5, "layernorm_backward_input (residual out of place)");
  cpu_be->ops->layernorm_backward_input(cpu_be, dx, dx, dy, x, w, mean, rstd, N, C);
  near(dx, rdx, nc, 1e-5, "layernorm_backward_input (residual in place)");
  free(old), free(d1), free(d2), free(rln);
  cpu_be->ops->layernorm_backward_weight(cpu_be, dw, db, dy, x, mean, rstd, N, C);
  near(dw, rdw, C, 1e-5, "layernorm dweight (+=)");
  near(db, rdw + C, C, 1e-5, "layernorm dbias (+=)");

  /* GELU over a wide range, in place backward */
  size_t n = (size_t)N * C;
  cpu_be->ops->gelu_forward(cpu_be, out, x, n);
  for (size_t i = 0; i < n; i++) {
    double u = x[i];
    r[i] = 0.5 * u * (1 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
  }
  near(out, r, n, 1e-6, "gelu_forward");
  memcpy(out, dy, n * sizeof *out);
  cpu_be->ops->gelu_backward(cpu_be, out, x, out, n);
  for (size_t i = 0; i < n; i++) r[i] = mega_gelu_grad(x[i]) * (double)dy[i];
  near(out, r, n, 1e-6, "gelu_backward");
  /* the exact (erf) GELU, against libm's erfc in double */
  cpu_be->ops->gelu_erf_forward(cpu_be, out, x, n);
  for (size_t i = 0; i < n; i++) r[i] = 0.5 * x[i] * erfc(-(double)x[i] / sqrt(2.0));
  near(out, r, n, 1e-6, "gelu_erf_forward");
  memcpy(out, dy, n * sizeof *out);
  cpu_be->ops->gelu_erf_backward(cpu_be, out, x, out, n);
  for (size_t i = 0; i < n; i++) {
    double u = x[i];
    r[i] = (0.5 * erfc(-u / sqrt(2.0)) + u * exp(-0.5 * u * u) / sqrt(2.0 * M_PI)) * dy[i];
  }
  near(out, r, n, 1e-6, "gelu_erf_backward");

  /* softmax cross-entropy, with logits large enough to need the max shift,
   * in place over a copy of the logits: probabilities, then dlogits */
  float *logits = vec((size_t)N * V, 30, 8), *dl = malloc(sizeof(float) * N * V),
        *losses = malloc(sizeof(float) * N), *probs = malloc(sizeof(float) * N * V);
  int32_t *tg = malloc(sizeof(int32_t) * N);
  fx_ids(tg, N, V, 9);
  memcpy(dl, logits, sizeof(float) * N * V);
  cpu_be->ops->crossentropy_forward(cpu_be, losses, dl, tg, N, V);
  memcpy(probs, dl, sizeof(float) * N * V);
  cpu_be->ops->crossentropy_backward(cpu_be, dl, tg, 0, 0.25f, N, V);
  double *rl = malloc(sizeof(double) * N), *rd = malloc(sizeof(double) * N * V),
         *rp = malloc(sizeof(double) * N * V);
  for (int i = 0; i < N; i++) {
    double mx = -INFINITY, s = 0;
    for (int k = 0; k < V; k++) mx = fmax(mx, logits[i * V + k]);
    for (int k = 0; k < V; k++) s += exp(logits[i * V + k] - mx);
    rl[i] = log(s) + mx - logits[i * V + tg[i]];
    for (int k = 0; k < V; k++) {
      rp[i * V + k] = exp(logits[i * V + k] - mx) / s;
      rd[i * V + k] = 0.25 * (rp[i * V + k] - (k == tg[i]));
    }
  }
  near(probs, rp, (size_t)N * V, 1e-6, "crossentropy probabilities");
  /* the backward's expression exactly: p * scale, then - scale at the target */
  for (int i = 0; i < N * V; i++) {
    float d = probs[i] * 0.25f;
    if (i % V == tg[i / V]) d -= 0.25f;
    assert_true(dl[i] == d);
  }
  near(losses, rl, N, 1e-5, "crossentropy losses");
  near(dl, rd, (size_t)N * V, 1e-6, "crossentropy dlogits");

  /* encoder */
  float *wte = vec((size_t)V * C, 1, 10), *wpe = vec((size_t)T * C, 1, 11);
  float *dwte = calloc((size_t)V * C, 4), *dwpe = calloc((size_t)T * C, 4);
  int32_t *tok = malloc(sizeof(int32_t) * B * T);
  fx_ids(tok, (size_t)B * T, V, 12);
  float *enc = malloc(sizeof(float) * B * T * C), *denc = vec((size_t)B * T * C, 1, 13);
  cpu_be->ops->encoder_forward(cpu_be, enc, tok, wte, 0, V, wpe, B, T, C);
  cpu_be->ops->encoder_backward(cpu_be, dwte, 0, V, dwpe, denc, tok, B, T, C);
  double *rw = calloc((size_t)V * C + (size_t)T * C, 8);
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) {
      assert_true(enc[i * C + c] == wte[tok[i] * C + c] + wpe[(i % T) * C + c]);
      rw[tok[i] * C + c] += denc[i * C + c];
      rw[V * C + (i % T) * C + c] += denc[i * C + c];
    }
  near(dwte, rw, (size_t)V * C, 1e-6, "encoder dwte");
  near(dwpe, rw + V * C, (size_t)T * C, 1e-6, "encoder dwpe");

  free(x), free(w), free(b), free(dy), free(out), free(mean), free(rstd), free(dx);
  free(dw), free(db), free(r), free(rdw), free(rdx), free(logits), free(probs), free(losses);
  free(rp), free(dl), free(tg), free(rl), free(rd), free(wte), free(wpe), free(dwte), free(dwpe);
  free(tok), free(enc), free(denc), free(rw);
}

static void gemm_and_memory(void **state) {
  (void)state;
  void *p = NULL;
  mega_err err = {0};
  assert_int_equal(cpu_be->ops->alloc(cpu_be, 1000, &p, &err), MEGA_OK);
  assert_int_equal((uintptr_t)p % 64, 0);
  for (int i = 0; i < 1000; i++) assert_int_equal(((unsigned char *)p)[i], 0);
  float host[4] = {1, 2, 3, 4}, back[4];
  assert_int_equal(cpu_be->ops->memcpy(cpu_be, p, host, sizeof host, MEGA_COPY_H2D, &err),
                   MEGA_OK);
  assert_int_equal(cpu_be->ops->memcpy(cpu_be, back, p, sizeof back, MEGA_COPY_D2H, &err),
                   MEGA_OK);
  assert_memory_equal(host, back, sizeof host);
  cpu_be->ops->memset0(cpu_be, p, 8);
  assert_true(((float *)p)[0] == 0 && ((float *)p)[2] == 3);
  cpu_be->ops->free(cpu_be, p);
  assert_int_equal(cpu_be->ops->synchronize(cpu_be, &err), MEGA_OK);
  assert_int_equal(cpu_be->ops->set_threads(cpu_be, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(cpu_be->ops->set_threads(cpu_be, 1, &err), MEGA_OK);
  /* two batched 2x3 @ 3x2 with a transposed B */
  float A[12] = {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0}, Bt[12] = {1, 0, 1, 0, 1, 0,
                                                                  2, 2, 2, 1, 1, 1};
  float Cm[8];
  cpu_be->ops->gemm_batched(cpu_be, false, true, 2, 2, 3, 1.0f, A, 3, 6, Bt, 3, 6, 0.0f, Cm, 2, 4,
                            2);
  float want[8] = {4, 2, 10, 5, 2, 1, 2, 1};
  assert_memory_equal(Cm, want, sizeof want);
  /* C = 2 * A^T B + C with A stored 3x2 (so op(A) is 2x3), B 3x2 */
  float At[6] = {1, 4, 2, 5, 3, 6}, Bm[6] = {1, 0, 0, 1, 1, 1}, C2[4] = {1, 1, 1, 1};
  cpu_be->ops->gemm(cpu_be, true, false, 2, 2, 3, 2.0f, At, 2, Bm, 2, 1.0f, C2, 2);
  float want2[4] = {9, 11, 21, 23};
  assert_memory_equal(C2, want2, sizeof want2);
  /* residual add, out of place and in place, over enough floats to split */
  size_t n = 100000;
  float *a = vec(n, 1, 21), *b = vec(n, 1, 22), *o = malloc(n * sizeof *o);
  cpu_be->ops->residual_forward(cpu_be, o, a, b, n);
  for (size_t i = 0; i < n; i++) assert_true(o[i] == a[i] + b[i]);
  cpu_be->ops->residual_forward(cpu_be, a, a, b, n);
  assert_memory_equal(a, o, n * sizeof *o);
  free(a), free(b), free(o);
}

/* Thousands of back-to-back split jobs: helpers that wake late or not at
 * all must never run a chunk twice, skip one, or touch the next job. */
static void many_small_jobs(void **state) {
  (void)state;
  size_t n = 50000;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *o = malloc(n * sizeof *o);
  for (size_t i = 0; i < n; i++) a[i] = (float)i, b[i] = 1.0f;
  for (int it = 0; it < 1500; it++) {
    size_t m = n - (size_t)(it % 7) * 1000; /* lengths vary, so do the chunks */
    cpu_be->ops->residual_forward(cpu_be, o, a, b, m);
    if (o[0] != 1.0f || o[m / 2] != (float)(m / 2) + 1.0f || o[m - 1] != (float)(m - 1) + 1.0f)
      fail_msg("job %d: wrong sums", it);
    cpu_be->ops->scale(cpu_be, o, m, 0.0f);
    for (size_t i = 0; i < m; i += 997)
      if (o[i] != 0.0f) fail_msg("job %d: element %zu not scaled", it, i);
  }
  free(a), free(b), free(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(element_math_matches_libm),
      cmocka_unit_test(gelu_erf_matches_libm),
      cmocka_unit_test(rng_is_a_function_of_key_and_index),
      cmocka_unit_test(init_normal_is_the_draw_at_the_full_index),
      cmocka_unit_test(adamw_matches_reference),
      cmocka_unit_test(many_ranges_match_one_by_one),
      cmocka_unit_test(matmul_both_layouts),
      cmocka_unit_test(llama_kernels),
      cmocka_unit_test(layernorm_gelu_crossentropy_encoder),
      cmocka_unit_test(many_small_jobs),
      cmocka_unit_test(gemm_and_memory),
  };
  return CPU_OPS_RUN(tests);
}
