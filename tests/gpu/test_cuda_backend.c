/* The cuda backend against the cpu backend, op by op, on random inputs:
 * GEMMs in every transpose case (and batched), the matmuls, every kernel
 * forward and backward (Llama's too; the element ops aligned and not),
 * attention (grouped-query too), AdamW and the reductions (AdamW over
 * many ranges in one launch and the posted sums too, bit for bit against
 * the per-range ops), and under --bf16 the flash attention, the kept
 * bf16 copies and those the ops producing a GEMM's input write. Needs a GPU: without one (or without the module) it says
 * why and exits 77, which meson counts as skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cuda_module.h"

static mega_backend *cpu, *gpu;
static int failures;

static float *vec(size_t n, unsigned seed, float scale) {
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    v[i] = ((float)((seed >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f) * scale;
  }
  return v;
}

/* A device copy of n host floats (or ints). */
static void *up(const void *host, size_t bytes) {
  void *d = NULL;
  mega_err err = {0};
  if (gpu->ops->alloc(gpu, bytes, &d, &err) ||
      gpu->ops->memcpy(gpu, d, host, bytes, MEGA_COPY_H2D, &err)) {
    fprintf(stderr, "upload: %s\n", err.msg);
    exit(1);
  }
  return d;
}

static void *dev_zero(size_t bytes) {
  float *z = calloc(1, bytes);
  void *d = up(z, bytes);
  free(z);
  return d;
}

/* A host copy of bytes of device memory, the caller's to free. */
static void *down(const void *dev, size_t bytes) {
  void *h = malloc(bytes);
  mega_err err = {0};
  if (gpu->ops->memcpy(gpu, h, dev, bytes, MEGA_COPY_D2H, &err)) {
    fprintf(stderr, "download: %s\n", err.msg);
    exit(1);
  }
  return h;
}

/* Two device buffers hold the same bits. */
static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
  void *x = down(a, bytes), *y = down(b, bytes);
  if (memcmp(x, y, bytes)) {
    printf("FAIL %s: not the same bits\n", what);
    failures++;
  } else {
    printf("ok   %s\n", what);
  }
  free(x), free(y);
}

/* Compares device floats with the cpu backend's host result. */
static void same(const char *what, const float *dev, const float *want, size_t n, double tol) {
  float *got = malloc(n * sizeof *got);
  mega_err err = {0};
  if (gpu->ops->memcpy(gpu, got, dev, n * sizeof *got, MEGA_COPY_D2H, &err)) {
    fprintf(stderr, "%s: %s\n", what, err.msg);
    exit(1);
  }
  double worst = 0; /* in units of the tolerance's scale, for the log */
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]) / (1.0 + fabs((double)want[i]));
    if (!(e <= tol)) {
      printf("FAIL %s[%zu]: cuda %.9g, cpu %.9g\n", what, i, (double)got[i], (double)want[i]);
      failures++;
      free(got);
      return;
    }
    if (e > worst) worst = e;
  }
  printf("ok   %s (largest error %.2g, allowed %.2g)\n", what, worst, tol);
  free(got);
}

static void test_gemms(void) {
  enum { M = 37, N = 29, K = 41 };
  float *A = vec(M * K, 1, 1), *B = vec(K * N, 2, 1), *C0 = vec(M * N, 3, 1);
  float *dA = up(A, sizeof(float) * M * K), *dB = up(B, sizeof(float) * K * N);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      float *Cc = malloc(sizeof(float) * M * N);
      memcpy(Cc, C0, sizeof(float) * M * N);
      float *dC = up(C0, sizeof(float) * M * N);
      int lda = ta ? M : K, ldb = tb ? K : N;
      cpu->ops->gemm(cpu, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, Cc, N);
      gpu->ops->gemm(gpu, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 1.0f, dC, N);
      char what[32];
      snprintf(what, sizeof what, "gemm ta=%d tb=%d", ta, tb);
      same(what, dC, Cc, M * N, 1e-4);
      gpu->ops->free(gpu, dC);
      free(Cc);
    }
  gpu->ops->free(gpu, dA);
  gpu->ops->free(gpu, dB);
  free(A), free(B), free(C0);
}

enum { Bt = 2, T = 33, C = 48, NH = 4, N = Bt * T, V = 70 };
/* The cpu backend sums 32 floats' squares per lane in float before it goes
 * to double (cpu.c sum_impl); cuda adds every square in double. */
#define SUM_TOL 2e-6

/* The embedding and its gradient (sorted runs of one id on the device),
 * with repeated ids and a vocabulary slice [3, 3 + 40) of V. */
static void test_encoder(void) {
  int32_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V;
  float *wte = vec(V * C, 51, 1), *wpe = vec(T * C, 52, 1), *d = vec(N * C, 53, 1);
  float *o = malloc(sizeof(float) * N * C), *go = dev_zero(sizeof(float) * N * C);
  int32_t *gtok = up(tok, sizeof tok);
  float *gwte = up(wte, sizeof(float) * V * C), *gwpe = up(wpe, sizeof(float) * T * C);
  float *gd = up(d, sizeof(float) * N * C);
  cpu->ops->encoder_forward(cpu, o, tok, wte + 3 * C, 3, 40, wpe, Bt, T, C);
  gpu->ops->encoder_forward(gpu, go, gtok, gwte + 3 * C, 3, 40, gwpe, Bt, T, C);
  same("encoder", go, o, N * C, 0);
  /* gradients added onto the weights themselves (backend.h: +=) */
  cpu->ops->encoder_backward(cpu, wte + 3 * C, 3, 40, wpe, d, tok, Bt, T, C);
  gpu->ops->encoder_backward(gpu, gwte + 3 * C, 3, 40, gwpe, gd, gtok, Bt, T, C);
  same("encoder backward wte", gwte, wte, V * C, 1e-6);
  same("encoder backward wpe", gwpe, wpe, T * C, 1e-6);
  free(wte), free(wpe), free(d), free(o);
}

static void test_model_ops(void) {
  mega_err err = {0};
  float *x = vec(N * C, 4, 2), *w = vec(C, 5, 1), *b = vec(C, 6, 1), *d = vec(N * C, 7, 1);
  float *dx = up(x, sizeof(float) * N * C), *dw = up(w, sizeof(float) * C);
  float *db = up(b, sizeof(float) * C), *dd = up(d, sizeof(float) * N * C);
  /* layernorm */
  float o[N * C], m[N], r[N];
  float *go = dev_zero(sizeof o), *gm = dev_zero(sizeof m), *gr = dev_zero(sizeof r);
  cpu->ops->layernorm_forward(cpu, o, m, r, x, w, b, N, C, 1e-5f);
  gpu->ops->layernorm_forward(gpu, go, gm, gr, dx, dw, db, N, C, 1e-5f);
  same("layernorm", go, o, N * C, 1e-5);
  cpu->ops->layernorm_backward_input(cpu, o, x, d, x, w, m, r, N, C);
  gpu->ops->layernorm_backward_input(gpu, go, dx, dd, dx, dw, gm, gr, N, C);
  same("layernorm backward", go, o, N * C, 1e-4);
  float lw[C] = {0}, lb[C] = {0};
  float *glw = dev_zero(sizeof lw), *glb = dev_zero(sizeof lb);
  cpu->ops->layernorm_backward_weight(cpu, lw, lb, d, x, m, r, N, C);
  gpu->ops->layernorm_backward_weight(gpu, glw, glb, dd, dx, gm, gr, N, C);
  same("layernorm dw", glw, lw, C, 1e-4);
  /* matmuls in both weight layouts */
  float *W = vec(C * 3 * C, 8, 0.2f), *bias = vec(3 * C, 9, 1);
  float *dW = up(W, sizeof(float) * C * 3 * C), *dbias = up(bias, sizeof(float) * 3 * C);
  float *y = malloc(sizeof(float) * N * 3 * C), *gy = dev_zero(sizeof(float) * N * 3 * C);
  for (int lay = 0; lay < 2; lay++) {
    cpu->ops->matmul_forward(cpu, y, x, W, bias, NULL, N, C, 3 * C, (mega_wlayout)lay);
    gpu->ops->matmul_forward(gpu, gy, dx, dW, dbias, NULL, N, C, 3 * C, (mega_wlayout)lay);
    same(lay ? "matmul forward (out, in)" : "matmul forward (in, out)", gy, y, N * 3 * C, 1e-4);
    for (int acc = 0; acc < 2; acc++) {
      cpu->ops->matmul_backward_input(cpu, o, y, W, N, C, 3 * C, (mega_wlayout)lay, acc);
      gpu->ops->matmul_backward_input(gpu, go, gy, dW, N, C, 3 * C, (mega_wlayout)lay, acc);
      same(acc ? "matmul backward input (added)" : "matmul backward input", go, o, N * C, 1e-3);
    }
  }
  /* attention */
  size_t tt = (size_t)Bt * NH * T * T, sn = tt + (size_t)N * C;
  float *att = calloc(tt, 4), *scr = calloc(sn, 4), *gatt = dev_zero(tt * 4), *gscr = dev_zero(sn * 4);
  mega_attn_dims ad = {.B = Bt, .T = T, .NH = NH, .G = NH, .hs = C / NH, .ldq = 3 * C,
                       .ldkv = 3 * C};
  cpu->ops->attention_forward(cpu, o, att, scr, y, y + C, y + 2 * C, &ad);
  gpu->ops->attention_forward(gpu, go, gatt, gscr, gy, gy + C, gy + 2 * C, &ad);
  same("attention", go, o, N * C, 1e-4);
  float *dq = calloc((size_t)N * 3 * C, 4), *gdq = dev_zero(sizeof(float) * N * 3 * C);
  cpu->ops->attention_backward(cpu, dq, dq + C, dq + 2 * C, scr, d, y, y + C, y + 2 * C, att,
                               &ad);
  gpu->ops->attention_backward(gpu, gdq, gdq + C, gdq + 2 * C, gscr, dd, gy, gy + C, gy + 2 * C,
                               gatt, &ad);
  same("attention backward", gdq, dq, N * 3 * C, 1e-3);
  /* reductions */
  double s1, s2;
  cpu->ops->sum_squares(cpu, x, N * C, &s1, &err);
  if (gpu->ops->sum_squares(gpu, dx, N * C, &s2, &err) || fabs(s1 - s2) > SUM_TOL * fabs(s1)) {
    printf("FAIL sum of squares: cuda %.17g, cpu %.17g %s\n", s2, s1, err.msg);
    failures++;
  } else {
    printf("ok   sum of squares\n");
  }
  if (gpu->ops->synchronize(gpu, &err)) {
    printf("FAIL synchronize: %s\n", err.msg);
    failures++;
  }
}

/* The classifier in place over the logits, against the cpu backend: rows of
 * 70 (one float a load), of 1,028 and 4,100 (four a load, 512 lanes with
 * none, one or several chunks each), and of 1,028 from one float past 16
 * bytes (one a load again); then the vocabulary-parallel passes over two
 * slices of 516 of a vocabulary of 1,030 padded to 1,032, with targets on
 * both sides of the boundary and at the last real id. */
static void classifier_rows(int nv, int off) {
  enum { R = 19 };
  int32_t tg[R];
  for (int i = 0; i < R; i++) tg[i] = (i * 131 + 7) % nv;
  tg[0] = 0, tg[1] = nv - 1;
  size_t n = (size_t)R * nv;
  float *lg = vec(n + off, 60 + nv, 6), loss[R];
  float *glg = up(lg, sizeof(float) * (n + off)), *gl = dev_zero(sizeof loss);
  int32_t *gtg = up(tg, sizeof tg);
  char what[80];
  cpu->ops->crossentropy_forward(cpu, loss, lg + off, tg, R, nv);
  gpu->ops->crossentropy_forward(gpu, gl, glg + off, gtg, R, nv);
  snprintf(what, sizeof what, "cross-entropy losses, rows of %d%s", nv, off ? " off 16" : "");
  same(what, gl, loss, R, 1e-5);
  snprintf(what, sizeof what, "cross-entropy probabilities in place, rows of %d", nv);
  same(what, glg + off, lg + off, n, 2e-6);
  cpu->ops->crossentropy_backward(cpu, lg + off, tg, 0, 0.1f, R, nv);
  gpu->ops->crossentropy_backward(gpu, glg + off, gtg, 0, 0.1f, R, nv);
  snprintf(what, sizeof what, "cross-entropy backward in place, rows of %d", nv);
  same(what, glg + off, lg + off, n, 2e-6);
  free(lg);
}

static void classifier_slices(void) {
  enum { R = 19, VP = 1032, VL = VP / 2 };
  int32_t tg[R];
  for (int i = 0; i < R; i++) tg[i] = (i * 97 + 5) % (VP - 2); /* ids 1030, 1031 padded */
  tg[0] = VL - 1, tg[1] = VL, tg[2] = VP - 3, tg[3] = 0;
  float *lg = vec((size_t)R * VP, 71, 6), sl[2][R * VL], mx[2][R], gmax[R];
  float sums[2][2 * R], gsums[2 * R], loss[R];
  float *gsl[2], *gmx = dev_zero(sizeof gmax), *gs = dev_zero(sizeof gsums);
  float *gpart = dev_zero(sizeof gsums), *gl = dev_zero(sizeof loss);
  int32_t *gtg = up(tg, sizeof tg);
  mega_err err = {0};
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < R; i++) memcpy(sl[r] + i * VL, lg + i * VP + r * VL, VL * 4);
    gsl[r] = up(sl[r], sizeof sl[r]);
    cpu->ops->crossentropy_rowmax(cpu, mx[r], sl[r], R, VL);
    gpu->ops->crossentropy_rowmax(gpu, gmx, gsl[r], R, VL);
    same("vocabulary-parallel row max", gmx, mx[r], R, 0);
  }
  for (int i = 0; i < R; i++) gmax[i] = fmaxf(mx[0][i], mx[1][i]); /* the group's */
  gpu->ops->memcpy(gpu, gmx, gmax, sizeof gmax, MEGA_COPY_H2D, &err);
  for (int r = 0; r < 2; r++) {
    cpu->ops->crossentropy_sums(cpu, sums[r], sl[r], gmax, tg, r * VL, R, VL);
    gpu->ops->crossentropy_sums(gpu, gpart, gsl[r], gmx, gtg, r * VL, R, VL);
    same("vocabulary-parallel exp sums and target logits", gpart, sums[r], 2 * R, 1e-5);
  }
  for (int i = 0; i < 2 * R; i++) gsums[i] = sums[0][i] + sums[1][i];
  gpu->ops->memcpy(gpu, gs, gsums, sizeof gsums, MEGA_COPY_H2D, &err);
  for (int r = 0; r < 2; r++) {
    cpu->ops->crossentropy_finish(cpu, loss, sl[r], gmax, gsums, R, VL);
    gpu->ops->crossentropy_finish(gpu, gl, gsl[r], gmx, gs, R, VL);
    same("vocabulary-parallel losses", gl, loss, R, 1e-5);
    same("vocabulary-parallel probabilities in place", gsl[r], sl[r], R * VL, 2e-6);
    cpu->ops->crossentropy_backward(cpu, sl[r], tg, r * VL, 0.1f, R, VL);
    gpu->ops->crossentropy_backward(gpu, gsl[r], gtg, r * VL, 0.1f, R, VL);
    same("vocabulary-parallel backward in place", gsl[r], sl[r], R * VL, 2e-6);
  }
  free(lg);
}

static void test_classifier(void) {
  classifier_rows(V, 0);
  classifier_rows(1028, 0);
  classifier_rows(4100, 0);
  classifier_rows(1028, 1);
  classifier_slices();
}

/* The element ops take four items per thread where every array starts on
 * 16 bytes and one per thread elsewhere: an odd count (a tail of three)
 * from an aligned start and from one float in, for each. */
static void test_element_ops(void) {
  enum { n = 4 * 301 + 3 };
  float *x = vec(n + 1, 31, 3), *y = vec(n + 1, 32, 1);
  float *gx = up(x, sizeof(float) * (n + 1)), *gy = up(y, sizeof(float) * (n + 1));
  float *o = malloc(sizeof(float) * (n + 1)), *go = dev_zero(sizeof(float) * (n + 1));
  for (int off = 0; off < 2; off++) {
    const char *at = off ? " (off 16 bytes)" : "";
    char what[64];
    cpu->ops->gelu_forward(cpu, o + off, x + off, n - off);
    gpu->ops->gelu_forward(gpu, go + off, gx + off, n - off);
    snprintf(what, sizeof what, "gelu%s", at);
    same(what, go + off, o + off, n - off, 1e-6);
    cpu->ops->gelu_backward(cpu, o + off, x + off, y + off, n - off);
    gpu->ops->gelu_backward(gpu, go + off, gx + off, gy + off, n - off);
    snprintf(what, sizeof what, "gelu backward%s", at);
    same(what, go + off, o + off, n - off, 1e-6);
    cpu->ops->residual_forward(cpu, o + off, x + off, y + off, n - off);
    gpu->ops->residual_forward(gpu, go + off, gx + off, gy + off, n - off);
    snprintf(what, sizeof what, "residual%s", at);
    same(what, go + off, o + off, n - off, 1e-7);
  }
  free(x);
  free(y);
  free(o);
}

/* AdamW over many ranges in one launch (adamw_ranges) against the
 * per-range op, bit for bit, and the cpu backend: ranges of odd sizes, one
 * empty, one longer than a grid's stride (8192 blocks of 256), decay on
 * and off, gradients scaled. Slot 0: the per-range op; 1: the one launch;
 * 2: the cpu (host). Two steps on one table (the second finds it kept),
 * then more tables than the backend keeps (misses, evictions). */
enum { AK = 6 };
typedef struct adamw_case {
  size_t off[AK + 1];
  float wd[AK];
  float *p[3], *m[3], *v[3], *g[2]; /* g: device, host */
} adamw_case;

static void adamw_steps(adamw_case *c, int step, int first, int last) {
  mega_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.5f /* not read */, .grad_scale = 0.7f, .step = step};
  mega_adamw_range r[2][AK];
  for (int k = first; k < last; k++) {
    size_t o = c->off[k], n = c->off[k + 1] - o;
    mega_adamw_params one = hp;
    one.weight_decay = c->wd[k];
    if (n) gpu->ops->adamw(gpu, c->p[0] + o, c->g[0] + o, c->m[0] + o, c->v[0] + o, n, &one);
    for (int d = 0; d < 2; d++)
      r[d][k - first] = (mega_adamw_range){.params = c->p[d + 1] + o, .grads = c->g[d] + o,
                                           .m = c->m[d + 1] + o, .v = c->v[d + 1] + o, .n = n,
                                           .weight_decay = c->wd[k]};
  }
  gpu->ops->adamw_ranges(gpu, r[0], (size_t)(last - first), &hp);
  mega_adamw_ranges(cpu, r[1], (size_t)(last - first), &hp);
}

static void test_adamw_ranges(void) {
  if (!gpu->ops->adamw_ranges) {
    printf("FAIL the cuda backend has no adamw_ranges\n");
    failures++;
    return;
  }
  const size_t n[AK] = {37, 0, 1, 3000001, 4099, 768};
  const float wd[AK] = {0.1f, 0.1f, 0.0f, 0.1f, 0.0f, 0.05f};
  adamw_case c = {0};
  for (int k = 0; k < AK; k++) {
    c.off[k + 1] = c.off[k] + n[k];
    c.wd[k] = wd[k];
  }
  size_t total = c.off[AK], bytes = total * sizeof(float);
  c.p[2] = vec(total, 61, 1), c.m[2] = vec(total, 63, 0.1f), c.v[2] = vec(total, 64, 0.1f);
  for (size_t i = 0; i < total; i++) c.v[2][i] = fabsf(c.v[2][i]);
  c.g[1] = vec(total, 62, 1);
  c.g[0] = up(c.g[1], bytes);
  for (int d = 0; d < 2; d++)
    c.p[d] = up(c.p[2], bytes), c.m[d] = up(c.m[2], bytes), c.v[d] = up(c.v[2], bytes);
  adamw_steps(&c, 1, 0, AK);
  adamw_steps(&c, 2, 0, AK);
  for (int j = 0; j < AK; j++) { /* 12 tables: suffixes and prefixes */
    adamw_steps(&c, 3 + 2 * j, j, AK);
    adamw_steps(&c, 4 + 2 * j, 0, j + 1);
  }
  same_bits("adamw over ranges: params as per range", c.p[1], c.p[0], bytes);
  same_bits("adamw over ranges: m as per range", c.m[1], c.m[0], bytes);
  same_bits("adamw over ranges: v as per range", c.v[1], c.v[0], bytes);
  same("adamw over ranges: params", c.p[1], c.p[2], total, 1e-5);
  same("adamw over ranges: v", c.v[1], c.v[2], total, 1e-5);
  for (int d = 0; d < 2; d++) {
    gpu->ops->free(gpu, c.p[d]), gpu->ops->free(gpu, c.m[d]), gpu->ops->free(gpu, c.v[d]);
  }
  gpu->ops->free(gpu, c.g[0]);
  free(c.p[2]), free(c.m[2]), free(c.v[2]), free(c.g[1]);
}

/* The norm's posted sums (sum_squares_post): more ranges than one launch
 * takes (MEGA_CU_SUM_RANGES, 32), of odd sizes, one empty and one of
 * millions, read back with one copy: the bits of sum_squares range by
 * range, and the cpu's sums within its float rounding (SUM_TOL). */
static void test_posted_sums(void) {
  enum { R = 40 };
  if (!gpu->ops->sum_squares_post) {
    printf("FAIL the cuda backend has no sum_squares_post\n");
    failures++;
    return;
  }
  size_t n[R], off[R + 1] = {0};
  for (int k = 0; k < R; k++) {
    n[k] = k == 3 ? 0 : (size_t)(k * 7919 % 5003) + (k == 5 ? 3000000 : 1);
    off[k + 1] = off[k] + n[k];
  }
  float *x = vec(off[R], 71, 1), *dx = up(x, off[R] * sizeof(float));
  double *slots = dev_zero(R * sizeof(double)), got[R];
  mega_sumsq_range r[R];
  for (int k = 0; k < R; k++)
    r[k] = (mega_sumsq_range){.x = dx + off[k], .n = n[k], .out = &slots[k]};
  gpu->ops->sum_squares_post(gpu, r, R);
  mega_err err = {0};
  if (gpu->ops->memcpy(gpu, got, slots, sizeof got, MEGA_COPY_D2H, &err)) {
    printf("FAIL posted sums: %s\n", err.msg);
    failures++;
    return;
  }
  int bad = 0;
  for (int k = 0; k < R && !bad; k++) {
    double one = -1, host = -1;
    gpu->ops->sum_squares(gpu, dx + off[k], n[k], &one, &err);
    cpu->ops->sum_squares(cpu, x + off[k], n[k], &host, &err);
    if (memcmp(&got[k], &one, sizeof one) || !(fabs(got[k] - host) <= SUM_TOL * fabs(host))) {
      printf("FAIL posted sum %d of %zu: %.17g, sum_squares %.17g, cpu %.17g\n", k, n[k],
             got[k], one, host);
      failures++, bad = 1;
    }
  }
  if (!bad) printf("ok   posted sums of squares (%d ranges, one copy)\n", R);
  gpu->ops->free(gpu, dx);
  gpu->ops->free(gpu, slots);
  free(x);
}

/* --bf16: cublasGemmEx on bf16 copies against the cpu backend's rounding
 * before OpenBLAS. Both round the same fp32 inputs the same way and the
 * products are exact in fp32, so only the order of the sums differs. */
static void test_bf16_matmuls(void) {
  mega_err err = {0};
  if (cpu->ops->set_bf16(cpu, true, &err) || gpu->ops->set_bf16(gpu, true, &err)) {
    printf("FAIL set_bf16: %s\n", err.msg);
    failures++;
    return;
  }
  float *x = vec(N * C, 21, 2), *W = vec(C * 3 * C, 22, 0.2f), *bias = vec(3 * C + 1, 23, 1);
  float *dy = vec(N * 3 * C, 24, 1), *res = vec(N * 3 * C, 25, 1);
  float *gx = up(x, sizeof(float) * N * C), *gW = up(W, sizeof(float) * C * 3 * C);
  float *gb = up(bias, sizeof(float) * (3 * C + 1)), *gdy = up(dy, sizeof(float) * N * 3 * C);
  float *gres = up(res, sizeof(float) * N * 3 * C);
  float *y = malloc(sizeof(float) * N * 3 * C), *gy = dev_zero(sizeof(float) * N * 3 * C);
  float *dx = malloc(sizeof(float) * N * C), *gdx = dev_zero(sizeof(float) * N * C);
  for (int lay = 0; lay < 2; lay++) {
    mega_wlayout l = (mega_wlayout)lay;
    cpu->ops->matmul_forward(cpu, y, x, W, bias, NULL, N, C, 3 * C, l);
    gpu->ops->matmul_forward(gpu, gy, gx, gW, gb, NULL, N, C, 3 * C, l);
    same(lay ? "bf16 matmul forward (out, in)" : "bf16 matmul forward (in, out)", gy, y,
         N * 3 * C, 1e-4);
    /* the epilogue's cases: a residual apart, one in place (out += x W),
     * and a bias off 16 bytes (cuBLASLt declines it: the fill path) */
    cpu->ops->matmul_forward(cpu, y, x, W, bias, res, N, C, 3 * C, l);
    gpu->ops->matmul_forward(gpu, gy, gx, gW, gb, gres, N, C, 3 * C, l);
    same("bf16 matmul forward + bias + residual", gy, y, N * 3 * C, 1e-4);
    cpu->ops->matmul_forward(cpu, y, x, W, NULL, y, N, C, 3 * C, l);
    gpu->ops->matmul_forward(gpu, gy, gx, gW, NULL, gy, N, C, 3 * C, l);
    same("bf16 matmul forward += in place", gy, y, N * 3 * C, 1e-4);
    cpu->ops->matmul_forward(cpu, y, x, W, bias + 1, NULL, N, C, 3 * C, l);
    gpu->ops->matmul_forward(gpu, gy, gx, gW, gb + 1, NULL, N, C, 3 * C, l);
    same("bf16 matmul forward, bias off 16 bytes", gy, y, N * 3 * C, 1e-4);
    /* an input off 16 bytes, rounded to bf16 one item per thread */
    cpu->ops->matmul_forward(cpu, y, x + 1, W, NULL, NULL, N - 1, C, 3 * C, l);
    gpu->ops->matmul_forward(gpu, gy, gx + 1, gW, NULL, NULL, N - 1, C, 3 * C, l);
    same("bf16 matmul forward, input off 16 bytes", gy, y, (N - 1) * 3 * C, 1e-4);
    cpu->ops->matmul_backward_input(cpu, dx, dy, W, N, C, 3 * C, l, false);
    gpu->ops->matmul_backward_input(gpu, gdx, gdy, gW, N, C, 3 * C, l, false);
    same("bf16 matmul backward input", gdx, dx, N * C, 1e-3);
    float *dW = calloc((size_t)C * 3 * C, 4), *gdW = dev_zero(sizeof(float) * C * 3 * C);
    float *db = calloc(3 * C, 4), *gdb = dev_zero(sizeof(float) * 3 * C);
    cpu->ops->matmul_backward_weight(cpu, dW, db, dy, x, N, C, 3 * C, l);
    gpu->ops->matmul_backward_weight(gpu, gdW, gdb, gdy, gx, N, C, 3 * C, l);
    same("bf16 matmul weight gradient", gdW, dW, C * 3 * C, 1e-3);
    same("bf16 matmul bias gradient (fp32)", gdb, db, 3 * C, 1e-4);
  }
  cpu->ops->set_bf16(cpu, false, &err);
  gpu->ops->set_bf16(gpu, false, &err);
}

/* --bf16 keeps the rounded copies of GEMM inputs while their source is
 * unchanged (worker/backend/cuda_b16.h). Each kind of writer changes a
 * matmul's weight or input, and the matmul runs again: it must see the
 * new values, as the cpu backend (which keeps nothing) does. */
static float *kc_x, *kc_w, *kc_gx, *kc_gw, *kc_y, *kc_gy;
enum { KO = 2 * C };

static void kept_check(const char *what) {
  cpu->ops->matmul_forward(cpu, kc_y, kc_x, kc_w, NULL, NULL, N, C, KO, MEGA_W_IN_OUT);
  gpu->ops->matmul_forward(gpu, kc_gy, kc_gx, kc_gw, NULL, NULL, N, C, KO, MEGA_W_IN_OUT);
  char label[96];
  snprintf(label, sizeof label, "bf16 copies renewed after %s", what);
  same(label, kc_gy, kc_y, (size_t)N * KO, 1e-4);
}

static void test_bf16_kept_copies(void) {
  mega_err err = {0};
  cpu->ops->set_bf16(cpu, true, &err);
  gpu->ops->set_bf16(gpu, true, &err);
  size_t nw = (size_t)C * KO, nx = (size_t)N * C;
  kc_x = vec(nx, 51, 2), kc_w = vec(nw, 52, 0.3f), kc_y = malloc(sizeof(float) * N * KO);
  kc_gx = up(kc_x, nx * 4), kc_gw = up(kc_w, nw * 4), kc_gy = dev_zero(sizeof(float) * N * KO);
  kept_check("nothing (the first copies)");
  kept_check("nothing (kept copies)");
  float *w2 = vec(nw, 53, 0.3f), *g = vec(nw, 54, 1), *gg = up(g, nw * 4), *gw2 = up(w2, nw * 4);
  memcpy(kc_w, w2, nw * 4);
  gpu->ops->memcpy(gpu, kc_gw, w2, nw * 4, MEGA_COPY_H2D, &err);
  kept_check("a copy from the host");
  cpu->ops->scale(cpu, kc_w, nw, 0.5f);
  gpu->ops->scale(gpu, kc_gw, nw, 0.5f);
  kept_check("scale");
  float *m = calloc(nw, 4), *v = calloc(nw, 4), *gm = dev_zero(nw * 4), *gv = dev_zero(nw * 4);
  mega_adamw_params hp = {.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .grad_scale = 1.0f, .step = 1};
  cpu->ops->adamw(cpu, kc_w, g, m, v, nw, &hp);
  gpu->ops->adamw(gpu, kc_gw, gg, gm, gv, nw, &hp);
  kept_check("an AdamW step");
  /* AdamW over many ranges in one launch: the weight is the second */
  enum { OTHER = 97 };
  float *o = vec(OTHER, 55, 1), *om = calloc(OTHER, 4), *ov = calloc(OTHER, 4);
  float *go = up(o, OTHER * 4), *gom = dev_zero(OTHER * 4), *gov = dev_zero(OTHER * 4);
  mega_adamw_range rc[2] = {
      {.params = o, .grads = g, .m = om, .v = ov, .n = OTHER},
      {.params = kc_w, .grads = g, .m = m, .v = v, .n = nw, .weight_decay = 0.1f}};
  mega_adamw_range rg[2] = {
      {.params = go, .grads = gg, .m = gom, .v = gov, .n = OTHER},
      {.params = kc_gw, .grads = gg, .m = gm, .v = gv, .n = nw, .weight_decay = 0.1f}};
  hp.step = 2;
  mega_adamw_ranges(cpu, rc, 2, &hp);
  mega_adamw_ranges(gpu, rg, 2, &hp);
  kept_check("AdamW over many ranges");
  free(o), free(om), free(ov);
  cpu->ops->memset0(cpu, kc_w + nw / 2, nw / 2 * 4);
  gpu->ops->memset0(gpu, kc_gw + nw / 2, nw / 2 * 4);
  kept_check("zeroing half the weight");
  cpu->ops->gelu_forward(cpu, kc_w, g, nw);
  gpu->ops->gelu_forward(gpu, kc_gw, gg, nw);
  kept_check("an op writing the weight");
  cpu->ops->layernorm_forward(cpu, kc_x, kc_y, kc_y + N, w2, g, g + C, N, C, 1e-5f);
  gpu->ops->layernorm_forward(gpu, kc_gx, kc_gy, kc_gy + N, gw2, gg, gg + C, N, C, 1e-5f);
  kept_check("an op writing the input");
  /* the classifier writes its logits (here the matmul's input) in place */
  int32_t kt[N];
  for (int i = 0; i < N; i++) kt[i] = (i * 5) % C;
  int32_t *gkt = up(kt, sizeof kt);
  cpu->ops->crossentropy_forward(cpu, kc_y, kc_x, kt, N, C);
  gpu->ops->crossentropy_forward(gpu, kc_gy, kc_gx, gkt, N, C);
  kept_check("the classifier's forward");
  cpu->ops->crossentropy_backward(cpu, kc_x, kt, 0, 2.0f, N, C);
  gpu->ops->crossentropy_backward(gpu, kc_gx, gkt, 0, 2.0f, N, C);
  kept_check("the classifier's backward");
  memcpy(kc_x, w2, nx * 4); /* logits again, for the vocabulary-parallel finish */
  gpu->ops->memcpy(gpu, kc_gx, w2, nx * 4, MEGA_COPY_H2D, &err);
  kept_check("a copy from the host (logits again)");
  float *mx = malloc(sizeof(float) * 3 * N), *gmx = dev_zero(sizeof(float) * 3 * N);
  cpu->ops->crossentropy_rowmax(cpu, mx, kc_x, N, C);
  cpu->ops->crossentropy_sums(cpu, mx + N, kc_x, mx, kt, 0, N, C);
  gpu->ops->crossentropy_rowmax(gpu, gmx, kc_gx, N, C);
  gpu->ops->crossentropy_sums(gpu, gmx + N, kc_gx, gmx, gkt, 0, N, C);
  cpu->ops->crossentropy_finish(cpu, kc_y, kc_x, mx, mx + N, N, C);
  gpu->ops->crossentropy_finish(gpu, kc_gy, kc_gx, gmx, gmx + N, N, C);
  kept_check("the vocabulary-parallel finish");
  free(mx);
  /* the weight as a GEMM's output: only its second half (a write into
   * the middle of a kept copy's source) */
  cpu->ops->gemm(cpu, false, false, C / 2, KO, C, 1.0f, kc_x, C, w2, KO, 0.0f,
                 kc_w + nw / 2, KO);
  gpu->ops->gemm(gpu, false, false, C / 2, KO, C, 1.0f, kc_gx, C, gw2, KO, 0.0f,
                 kc_gw + nw / 2, KO);
  kept_check("a GEMM writing half the weight");
  cpu->ops->set_bf16(cpu, false, &err);
  gpu->ops->set_bf16(gpu, false, &err);
  free(kc_x), free(kc_w), free(kc_y), free(w2), free(g), free(m), free(v);
}

/* --bf16: an op whose whole output a matmul reads next writes that
 * matmul's bf16 copy in its own kernel (cuda_b16.h). src (rows x cols),
 * just written so: a matmul by the identity reads the copy back exactly
 * (one product per sum), which must be src's floats rounded, and gives the
 * same bits again once src is rewritten and its copy rounded afresh. */
static void produced_check(const char *what, float *src, int rows, int cols) {
  size_t n = (size_t)rows * cols;
  float *eye = calloc((size_t)cols * cols, 4);
  for (int i = 0; i < cols; i++) eye[(size_t)i * cols + i] = 1.0f;
  float *geye = up(eye, (size_t)cols * cols * 4), *gy = dev_zero(n * 4), *gy2 = dev_zero(n * 4);
  float *tmp = dev_zero(n * 4);
  gpu->ops->matmul_forward(gpu, gy, src, geye, NULL, NULL, rows, cols, cols, MEGA_W_IN_OUT);
  float *want = down(src, n * 4);
  for (size_t i = 0; i < n; i++) want[i] = mega_bf16_round(want[i]);
  char label[96];
  snprintf(label, sizeof label, "%s: the next matmul's bf16 copy is its output rounded", what);
  same(label, gy, want, n, 0);
  mega_err err = {0};
  if (gpu->ops->memcpy(gpu, tmp, src, n * 4, MEGA_COPY_D2D, &err) ||
      gpu->ops->memcpy(gpu, src, tmp, n * 4, MEGA_COPY_D2D, &err)) {
    fprintf(stderr, "%s: %s\n", what, err.msg);
    exit(1);
  }
  gpu->ops->matmul_forward(gpu, gy2, src, geye, NULL, NULL, rows, cols, cols, MEGA_W_IN_OUT);
  snprintf(label, sizeof label, "%s: the matmul as on a fresh rounding", what);
  same_bits(label, gy2, gy, n * 4);
  gpu->ops->free(gpu, geye), gpu->ops->free(gpu, gy), gpu->ops->free(gpu, gy2);
  gpu->ops->free(gpu, tmp);
  free(eye), free(want);
}

static void bf16_on(bool on) {
  mega_err err = {0};
  if (gpu->ops->set_bf16(gpu, on, &err)) {
    fprintf(stderr, "set_bf16: %s\n", err.msg);
    exit(1);
  }
}

/* Each producer (GPT-2's and Llama's) without --bf16 (the reference), then
 * with it: the same fp32 bits, and the copy produced_check wants. GELU also
 * off 16 bytes
 * (one item a thread, its copy from the floats read back), the classifier
 * one float a load (V) and four (VW). */
static void test_bf16_producers(void) {
  enum { F = 4 * C, VW = 72 };
  size_t nf = (size_t)N * F + 1;
  float *x = vec(N * C, 61, 2), *w = vec(C, 62, 1), *b = vec(C, 63, 1);
  float *pre = vec(nf, 64, 3), *dh = vec(nf, 65, 1), *logits = vec(N * VW, 66, 4);
  float *gx = up(x, N * C * 4), *gw = up(w, C * 4), *gb = up(b, C * 4), *gpre = up(pre, nf * 4);
  float *gm = dev_zero(N * 4), *gr = dev_zero(N * 4), *go[2], *gh[2], *gd[2], *gl[2];
  int32_t tg[N];
  for (int i = 0; i < N; i++) tg[i] = (i * 5) % V;
  int32_t *gtg = up(tg, sizeof tg);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    go[on] = dev_zero(N * C * 4);
    gpu->ops->layernorm_forward(gpu, go[on], gm, gr, gx, gw, gb, N, C, 1e-5f);
  }
  same_bits("layernorm under --bf16", go[1], go[0], N * C * 4);
  produced_check("layernorm", go[1], N, C);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    go[on] = dev_zero(N * C * 4);
    gpu->ops->rmsnorm_forward(gpu, go[on], gr, gx, gw, N, C, 1e-5f);
  }
  same_bits("rmsnorm under --bf16", go[1], go[0], N * C * 4);
  produced_check("rmsnorm", go[1], N, C);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    gh[on] = dev_zero(nf * 4);
    gpu->ops->swiglu_forward(gpu, gh[on], gpre, gpre + 1, (size_t)N * F);
  }
  same_bits("swiglu under --bf16", gh[1], gh[0], (size_t)N * F * 4);
  produced_check("swiglu", gh[1], N, F);
  for (int on = 0; on < 2; on++) { /* dgate in place over dout, as the model runs it */
    bf16_on(on);
    gd[on] = up(dh, nf * 4);
    gh[on] = dev_zero(nf * 4);
    gpu->ops->swiglu_backward(gpu, gd[on], gh[on], gd[on], gpre, gpre + 1, (size_t)N * F);
  }
  same_bits("swiglu dgate under --bf16", gd[1], gd[0], (size_t)N * F * 4);
  same_bits("swiglu dup under --bf16", gh[1], gh[0], (size_t)N * F * 4);
  produced_check("swiglu dgate", gd[1], N, F);
  produced_check("swiglu dup", gh[1], N, F);
  for (int off = 0; off < 2; off++) {
    for (int on = 0; on < 2; on++) {
      bf16_on(on);
      gh[on] = dev_zero(nf * 4);
      gpu->ops->gelu_forward(gpu, gh[on] + off, gpre + off, (size_t)N * F);
    }
    same_bits(off ? "gelu under --bf16, off 16 bytes" : "gelu under --bf16", gh[1] + off,
              gh[0] + off, (size_t)N * F * 4);
    produced_check(off ? "gelu off 16 bytes" : "gelu", gh[1] + off, N, F);
    for (int on = 0; on < 2; on++) { /* in place, as the model runs it */
      bf16_on(on);
      gd[on] = up(dh, nf * 4);
      gpu->ops->gelu_backward(gpu, gd[on] + off, gpre + off, gd[on] + off, (size_t)N * F);
    }
    same_bits(off ? "gelu backward under --bf16, off 16 bytes" : "gelu backward under --bf16",
              gd[1] + off, gd[0] + off, (size_t)N * F * 4);
    produced_check(off ? "gelu backward off 16 bytes" : "gelu backward", gd[1] + off, N, F);
  }
  for (int vv = V; vv <= VW; vv += VW - V) {
    for (int on = 0; on < 2; on++) {
      bf16_on(on);
      gl[on] = up(logits, (size_t)N * vv * 4);
      gpu->ops->crossentropy_forward(gpu, gm, gl[on], gtg, N, vv);
      gpu->ops->crossentropy_backward(gpu, gl[on], gtg, 0, 0.5f, N, vv);
    }
    same_bits(vv == V ? "classifier backward under --bf16" :
                        "classifier backward under --bf16, four a load",
              gl[1], gl[0], (size_t)N * vv * 4);
    produced_check(vv == V ? "classifier backward" : "classifier backward, four a load", gl[1],
                   N, vv);
  }
  bf16_on(false);
  free(x), free(w), free(b), free(pre), free(dh), free(logits);
}

/* GPT-2's c_fc with its GELU fused (matmul_gelu_*: cuBLASLt's epilogues
 * under --bf16) against the cpu backend's two ops, in both layouts; and,
 * logged, how far the epilogue's GELU is from the tanh approximation the
 * model uses and from erf's, on inputs the GEMM passes exactly. The ops
 * fall back to the two ops where cuBLASLt declines, with results within
 * the same bounds, so the fused ones must also differ from the gpu's own two
 * ops somewhere: the same bits everywhere means the fusion never ran. */
static bool differs(const float *a, const float *b, size_t n) {
  float *x = down(a, n * 4), *y = down(b, n * 4);
  bool d = memcmp(x, y, n * 4) != 0;
  free(x), free(y);
  return d;
}

static void test_matmul_gelu(void) {
  enum { F = 4 * C }; /* the GELU input's leading dimension divides by 8 */
  if (!gpu->ops->matmul_gelu_forward || !gpu->ops->matmul_gelu_backward_input) {
    printf("FAIL the cuda backend has no fused c_fc + GELU\n");
    failures++;
    return;
  }
  mega_err err = {0};
  cpu->ops->set_bf16(cpu, true, &err);
  bf16_on(true);
  float *x = vec(N * C, 31, 2), *W = vec(C * F, 32, 0.2f), *bias = vec(F, 33, 1);
  float *W2 = vec(F * C, 34, 0.2f), *dy = vec(N * C, 35, 1);
  float *gx = up(x, 4 * N * C), *gW = up(W, 4 * C * F), *gb = up(bias, 4 * F);
  float *gW2 = up(W2, 4 * F * C), *gdy = up(dy, 4 * N * C);
  float *pre = malloc(4 * N * F), *out = malloc(4 * N * F), *dpre = malloc(4 * N * F);
  float *gpre = dev_zero(4 * N * F), *gout = dev_zero(4 * N * F), *gdpre = dev_zero(4 * N * F);
  for (int lay = 0; lay < 2; lay++) {
    mega_wlayout l = (mega_wlayout)lay;
    cpu->ops->matmul_forward(cpu, pre, x, W, bias, NULL, N, C, F, l);
    cpu->ops->gelu_forward(cpu, out, pre, (size_t)N * F);
    gpu->ops->matmul_gelu_forward(gpu, gout, gpre, gx, gW, gb, N, C, F, l);
    same("fused c_fc + GELU: the GELU's input", gpre, pre, (size_t)N * F, 1e-4);
    same("fused c_fc + GELU: its output", gout, out, (size_t)N * F, 1e-3);
    cpu->ops->matmul_backward_input(cpu, dpre, dy, W2, N, F, C, l, false);
    cpu->ops->gelu_backward(cpu, dpre, pre, dpre, (size_t)N * F);
    gpu->ops->matmul_gelu_backward_input(gpu, gdpre, gdy, gW2, gpre, N, F, C, l);
    same("fused c_proj input gradient times GELU'", gdpre, dpre, (size_t)N * F, 1e-3);
    float *upre = dev_zero(4 * N * F), *uout = dev_zero(4 * N * F);
    gpu->ops->matmul_forward(gpu, upre, gx, gW, gb, NULL, N, C, F, l);
    gpu->ops->gelu_forward(gpu, uout, upre, (size_t)N * F);
    bool fwd = differs(gout, uout, (size_t)N * F);
    gpu->ops->matmul_backward_input(gpu, uout, gdy, gW2, N, F, C, l, false);
    gpu->ops->gelu_backward(gpu, uout, gpre, uout, (size_t)N * F);
    bool bwd = differs(gdpre, uout, (size_t)N * F);
    if (!fwd || !bwd) {
      printf("FAIL fused c_fc + GELU (%s): the %s bits are the two ops' own: cuBLASLt declined "
             "the epilogue, so the fusion never ran\n", lay ? "out, in" : "in, out",
             !fwd ? "forward's" : "backward's");
      failures++;
    } else {
      printf("ok   fused c_fc + GELU (%s) ran as one GEMM each way\n", lay ? "out, in" : "in, out");
    }
    gpu->ops->free(gpu, upre), gpu->ops->free(gpu, uout);
  }
  /* x in sixteenths over [-4, 4) through the identity: exact in bf16 */
  float *eye = calloc((size_t)C * C, 4), *ex = malloc(4 * N * C);
  for (int i = 0; i < C; i++) eye[i * C + i] = 1.0f;
  for (int i = 0; i < N * C; i++) ex[i] = (float)(i % 128 - 64) / 16.0f;
  float *geye = up(eye, 4 * C * C), *gex = up(ex, 4 * N * C);
  gpu->ops->matmul_gelu_forward(gpu, gout, gpre, gex, geye, NULL, N, C, C, MEGA_W_IN_OUT);
  float *g = down(gout, 4 * N * C);
  double to_tanh = 0, to_erf = 0;
  for (int i = 0; i < N * C; i++) {
    double v = ex[i], t = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    double e = 0.5 * v * (1 + erf(v / sqrt(2.0)));
    to_tanh = fmax(to_tanh, fabs(g[i] - t)), to_erf = fmax(to_erf, fabs(g[i] - e));
  }
  printf("note cuBLASLt's GELU on [-4, 4): largest difference %.2g from the tanh approximation, "
         "%.2g from erf's\n", to_tanh, to_erf);
  cpu->ops->set_bf16(cpu, false, &err);
  bf16_on(false);
  float *gfree[] = {gx, gW, gb, gW2, gdy, gpre, gout, gdpre, geye, gex};
  for (size_t i = 0; i < sizeof gfree / sizeof *gfree; i++) gpu->ops->free(gpu, gfree[i]);
  free(x), free(W), free(bias), free(W2), free(dy), free(pre), free(out), free(dpre);
  free(eye), free(ex), free(g);
}

/* RMSNorm, SwiGLU, RoPE and grouped-query attention (8 query heads over 2
 * key/value heads of 6, on separate q, k and v). */
static void test_llama_ops(void) {
  float *x = vec(N * C, 31, 2), *w = vec(C, 32, 1), *d = vec(N * C, 33, 1);
  float *gx = up(x, sizeof(float) * N * C), *gw = up(w, sizeof(float) * C);
  float *gd = up(d, sizeof(float) * N * C);
  float *o = malloc(sizeof(float) * N * C), r[N], *go = dev_zero(sizeof(float) * N * C);
  float *gr = dev_zero(sizeof r);
  cpu->ops->rmsnorm_forward(cpu, o, r, x, w, N, C, 1e-5f);
  gpu->ops->rmsnorm_forward(gpu, go, gr, gx, gw, N, C, 1e-5f);
  same("rmsnorm", go, o, N * C, 1e-5);
  cpu->ops->rmsnorm_backward_input(cpu, o, x, d, x, w, r, N, C);
  gpu->ops->rmsnorm_backward_input(gpu, go, gx, gd, gx, gw, gr, N, C);
  same("rmsnorm backward", go, o, N * C, 1e-4);
  float dw[C] = {0}, *gdw = dev_zero(sizeof dw);
  cpu->ops->rmsnorm_backward_weight(cpu, dw, d, x, r, N, C);
  gpu->ops->rmsnorm_backward_weight(gpu, gdw, gd, gx, gr, N, C);
  same("rmsnorm dw", gdw, dw, C, 1e-4);
  float *u = malloc(sizeof(float) * N * C), *gu = dev_zero(sizeof(float) * N * C);
  cpu->ops->swiglu_forward(cpu, o, x, d, (size_t)N * C);
  gpu->ops->swiglu_forward(gpu, go, gx, gd, (size_t)N * C);
  same("swiglu", go, o, N * C, 1e-5);
  cpu->ops->swiglu_backward(cpu, o, u, x, d, x, (size_t)N * C);
  gpu->ops->swiglu_backward(gpu, go, gu, gx, gd, gx, (size_t)N * C);
  same("swiglu dgate", go, o, N * C, 1e-5);
  same("swiglu dup", gu, u, N * C, 1e-5);
  enum { Q = 8, KV = 2, HS = 6, ROT = 4 };
  float cs[T * ROT];
  for (int t = 0; t < T; t++)
    for (int i = 0; i < ROT / 2; i++) {
      cs[t * ROT + i] = cosf(0.1f * t * (i + 1));
      cs[t * ROT + ROT / 2 + i] = sinf(0.1f * t * (i + 1));
    }
  float *gcs = up(cs, sizeof cs);
  size_t nq = (size_t)N * Q * HS, nk = (size_t)N * KV * HS;
  float *q = vec(nq + 2 * nk, 34, 1), *gq = up(q, sizeof(float) * (nq + 2 * nk));
  cpu->ops->rope_forward(cpu, q, cs, Bt, T, Q, HS, Q * HS, ROT);
  gpu->ops->rope_forward(gpu, gq, gcs, Bt, T, Q, HS, Q * HS, ROT);
  same("rope", gq, q, nq, 1e-5);
  cpu->ops->rope_backward(cpu, q, cs, Bt, T, Q, HS, Q * HS, ROT);
  gpu->ops->rope_backward(gpu, gq, gcs, Bt, T, Q, HS, Q * HS, ROT);
  same("rope backward", gq, q, nq, 1e-5);
  mega_attn_dims ad = {.B = Bt, .T = T, .NH = Q, .G = KV, .hs = HS, .ldq = Q * HS,
                       .ldkv = KV * HS};
  size_t tt = (size_t)Bt * Q * T * T, sn = tt + nq;
  float *att = calloc(tt, 4), *scr = calloc(sn, 4), *gatt = dev_zero(tt * 4);
  float *gscr = dev_zero(sn * 4), *dy = vec(nq, 35, 1), *gdy = up(dy, sizeof(float) * nq);
  float *y = malloc(sizeof(float) * nq), *gy = dev_zero(sizeof(float) * nq);
  cpu->ops->attention_forward(cpu, y, att, scr, q, q + nq, q + nq + nk, &ad);
  gpu->ops->attention_forward(gpu, gy, gatt, gscr, gq, gq + nq, gq + nq + nk, &ad);
  same("grouped-query attention", gy, y, nq, 1e-4);
  float *g = calloc(nq + 2 * nk, 4), *gg = dev_zero(sizeof(float) * (nq + 2 * nk));
  cpu->ops->attention_backward(cpu, g, g + nq, g + nq + nk, scr, dy, q, q + nq, q + nq + nk,
                               att, &ad);
  gpu->ops->attention_backward(gpu, gg, gg + nq, gg + nq + nk, gscr, gdy, gq, gq + nq,
                               gq + nq + nk, gatt, &ad);
  same("grouped-query attention backward", gg, g, nq + 2 * nk, 1e-3);
}

/* --bf16's flash attention (kernels/flash_mma.cu) against the cpu
 * backend's fp32 attention on q, k, v (and dout) rounded to bf16: what is
 * left is the probabilities' and dS's rounding to bf16 inside the kernels.
 * Then against the cpu backend's own --bf16 attention, which rounds those
 * too (cpu_attention.c): the log's largest errors say how much closer it
 * comes. T is not a multiple of the 64-row tiles; grouped-query and
 * fused-qkv strides both. */
static void flash_case(int B_, int T_, int NH_, int G_, int hs, bool fused) {
  mega_err err = {0};
  size_t N_ = (size_t)B_ * T_, nq = N_ * NH_ * hs, nk = N_ * G_ * hs;
  int ldq = fused ? NH_ * hs + 2 * G_ * hs : NH_ * hs, ldkv = fused ? ldq : G_ * hs;
  size_t nall = fused ? N_ * ldq : nq + 2 * nk;
  float *x = vec(nall, 41 + hs, 1), *dy = vec(nq, 43, 1);
  for (size_t i = 0; i < nall; i++) x[i] = mega_bf16_round(x[i]);
  for (size_t i = 0; i < nq; i++) dy[i] = mega_bf16_round(dy[i]);
  const float *q = x, *k = fused ? x + NH_ * hs : x + nq;
  const float *v = fused ? x + (NH_ + G_) * hs : x + nq + nk;
  mega_attn_dims ad = {.B = B_, .T = T_, .NH = NH_, .G = G_, .hs = hs, .ldq = ldq, .ldkv = ldkv};
  size_t tt = (size_t)B_ * NH_ * T_ * T_, sn = tt + nq;
  float *att = calloc(tt, 4), *scr = calloc(sn, 4), *y = calloc(nq, 4), *g = calloc(nall, 4);
  if (gpu->ops->set_bf16(gpu, true, &err)) {
    printf("FAIL set_bf16: %s\n", err.msg);
    failures++;
    return;
  }
  /* att and scratch exactly as large as the backend asks (flash: the
   * statistics, the output's copy and D), so an overrun shows in memcheck */
  gpu->ops->attention_sizes(gpu, &ad, &ad.att_cap, &ad.scratch_cap);
  if (ad.att_cap != B_ * NH_ * T_ + nq || ad.scratch_cap != (size_t)B_ * NH_ * T_) {
    printf("FAIL flash attention sizes: att %zu, scratch %zu\n", ad.att_cap, ad.scratch_cap);
    failures++;
  }
  float *gx = up(x, nall * 4), *gdy = up(dy, nq * 4), *gatt = dev_zero(ad.att_cap * 4);
  float *gscr = dev_zero(ad.scratch_cap * 4), *gy = dev_zero(nq * 4), *gg = dev_zero(nall * 4);
  size_t ko = (size_t)(k - x), vo = (size_t)(v - x);
  cpu->ops->attention_forward(cpu, y, att, scr, q, k, v, &ad);
  gpu->ops->attention_forward(gpu, gy, gatt, gscr, gx, gx + ko, gx + vo, &ad);
  char what[96];
  snprintf(what, sizeof what, "flash attention B%d T%d NH%d G%d hs%d%s", B_, T_, NH_, G_, hs,
           fused ? " fused qkv" : "");
  same(what, gy, y, nq, 1e-2);
  cpu->ops->attention_backward(cpu, g, g + ko, g + vo, scr, dy, q, k, v, att, &ad);
  gpu->ops->attention_backward(gpu, gg, gg + ko, gg + vo, gscr, gdy, gx, gx + ko, gx + vo, gatt,
                               &ad);
  strcat(what, " backward");
  same(what, gg, g, nall, 2e-2);
  cpu->ops->set_bf16(cpu, true, &err);
  cpu->ops->attention_forward(cpu, y, att, scr, q, k, v, &ad);
  cpu->ops->attention_backward(cpu, g, g + ko, g + vo, scr, dy, q, k, v, att, &ad);
  cpu->ops->set_bf16(cpu, false, &err);
  snprintf(what, sizeof what, "flash attention B%d T%d NH%d G%d hs%d%s vs cpu --bf16", B_, T_,
           NH_, G_, hs, fused ? " fused qkv" : "");
  same(what, gy, y, nq, 1e-2);
  strcat(what, " backward");
  same(what, gg, g, nall, 2e-2);
  gpu->ops->set_bf16(gpu, false, &err);
  free(x), free(dy), free(att), free(scr), free(y), free(g);
}

/* Buffers sized for flash attention, then --bf16 turned off: the batched
 * GEMMs would overrun them, so the op refuses and the next synchronize
 * says why (on a backend of its own: the failure sticks). */
static void test_attention_sizes_guard(const mega_cuda_module *m) {
  mega_err err = {0};
  mega_backend *be;
  if (m->backend_create(0, &be, &err)) {
    printf("FAIL creating a second backend: %s\n", err.msg);
    failures++;
    return;
  }
  mega_attn_dims ad = {.B = 1, .T = 128, .NH = 2, .G = 2, .hs = 64, .ldq = 128, .ldkv = 128};
  size_t full_att, full_scr;
  be->ops->attention_sizes(be, &ad, &full_att, &full_scr);
  be->ops->set_bf16(be, true, &err);
  be->ops->attention_sizes(be, &ad, &ad.att_cap, &ad.scratch_cap);
  be->ops->set_bf16(be, false, &err);
  size_t nq = (size_t)ad.T * 128;
  float *q = NULL, *o = NULL, *att = NULL, *scr = NULL;
  if (be->ops->alloc(be, nq * 4, (void **)&q, &err) ||
      be->ops->alloc(be, nq * 4, (void **)&o, &err) ||
      be->ops->alloc(be, ad.att_cap * 4, (void **)&att, &err) ||
      be->ops->alloc(be, ad.scratch_cap * 4, (void **)&scr, &err)) {
    printf("FAIL alloc: %s\n", err.msg);
    failures++;
    return;
  }
  be->ops->attention_forward(be, o, att, scr, q, q, q, &ad);
  mega_status st = be->ops->synchronize(be, &err);
  if (full_att != (size_t)ad.T * ad.T * 2 || ad.att_cap >= full_att || st == MEGA_OK ||
      !strstr(err.msg, "attention_sizes")) {
    printf("FAIL attention sizes guard: full %zu, flash %zu, status %d: %s\n", full_att,
           ad.att_cap, (int)st, err.msg);
    failures++;
  } else {
    printf("ok   attention refuses buffers sized for flash attention\n");
  }
  mega_backend_destroy(be);
}

static void test_flash_attention(void) {
  flash_case(2, 200, 4, 2, 64, false);
  flash_case(1, 130, 2, 2, 128, true);
  flash_case(2, 64 * 3, 12, 12, 64, true);
  flash_case(1, 65, 1, 1, 64, false); /* the output copy off 8 bytes: scalar stores */
}

int main(void) {
  mega_err err = {0};
  const mega_cuda_module *m;
  if (mega_cuda_module_load(&m, &err) != MEGA_OK || m->device_count(&err) < 1) {
    printf("skipped: %s\n", err.msg);
    return 77;
  }
  printf("# %s\n", m->versions());
  if (mega_backend_cpu_create(NULL, &cpu, &err) || m->backend_create(0, &gpu, &err)) {
    printf("FAIL creating the backends: %s\n", err.msg);
    return 1;
  }
  test_gemms();
  test_encoder();
  test_model_ops();
  test_element_ops();
  test_adamw_ranges();
  test_posted_sums();
  test_classifier();
  test_llama_ops();
  test_bf16_matmuls();
  test_bf16_kept_copies();
  test_bf16_producers();
  test_matmul_gelu();
  test_flash_attention();
  test_attention_sizes_guard(m);
  printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
  /* buffers are left to the process's end: the device goes with it */
  return failures ? 1 : 0;
}
