/* The cuda backend against the cpu backend, op by op, on random inputs:
 * GEMMs in every transpose case (and batched), the matmuls, every kernel
 * forward and backward (Llama's too; the element ops aligned and not),
 * attention (grouped-query too), AdamW and the reductions (AdamW over
 * many ranges in one launch and the posted sums too, bit for bit against
 * the per-range ops), and under --bf16 the flash attention and cuDNN's
 * fused attention. The classifier and the column sums are
 * test_cuda_sums.c's, the other --bf16 checks test_cuda_bf16.c's,
 * attention dropout test_cuda_dropout.c's; one program runs them all.
 * Needs a GPU: without one (or without the module) it says why and exits
 * 77, which meson counts as skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "tests/gpu/cuda_check.h"
#include "worker/backend/cuda_module.h"

mega_backend *cpu, *gpu, *raw;
int failures;

float *vec(size_t n, unsigned seed, float scale) {
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    v[i] = ((float)((seed >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f) * scale;
  }
  return v;
}

/* A device copy of n host floats (or ints). */
void *up(const void *host, size_t bytes) {
  void *d = NULL;
  mega_err err = {0};
  if (gpu->ops->alloc(gpu, bytes, &d, &err) ||
      gpu->ops->memcpy(gpu, d, host, bytes, MEGA_COPY_H2D, &err)) {
    fprintf(stderr, "upload: %s\n", err.msg);
    exit(1);
  }
  return d;
}

void *dev_zero(size_t bytes) {
  float *z = calloc(1, bytes);
  void *d = up(z, bytes);
  free(z);
  return d;
}

/* A host copy of bytes of device memory, the caller's to free. */
void *down(const void *dev, size_t bytes) {
  void *h = malloc(bytes);
  mega_err err = {0};
  if (gpu->ops->memcpy(gpu, h, dev, bytes, MEGA_COPY_D2H, &err)) {
    fprintf(stderr, "download: %s\n", err.msg);
    exit(1);
  }
  return h;
}

/* Two device buffers hold the same bits. */
void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
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
void same(const char *what, const float *dev, const float *want, size_t n, double tol) {
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
  enum { M = 37, Ng = 29, K = 41 };
  float *A = vec(M * K, 1, 1), *B = vec(K * Ng, 2, 1), *C0 = vec(M * Ng, 3, 1);
  float *dA = up(A, sizeof(float) * M * K), *dB = up(B, sizeof(float) * K * Ng);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      float *Cc = malloc(sizeof(float) * M * Ng);
      memcpy(Cc, C0, sizeof(float) * M * Ng);
      float *dC = up(C0, sizeof(float) * M * Ng);
      int lda = ta ? M : K, ldb = tb ? K : Ng;
      cpu->ops->gemm(cpu, ta, tb, M, Ng, K, 0.5f, A, lda, B, ldb, 1.0f, Cc, Ng);
      gpu->ops->gemm(gpu, ta, tb, M, Ng, K, 0.5f, dA, lda, dB, ldb, 1.0f, dC, Ng);
      char what[32];
      snprintf(what, sizeof what, "gemm ta=%d tb=%d", ta, tb);
      same(what, dC, Cc, M * Ng, 1e-4);
      gpu->ops->free(gpu, dC);
      free(Cc);
    }
  gpu->ops->free(gpu, dA);
  gpu->ops->free(gpu, dB);
  free(A), free(B), free(C0);
}

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
  /* hidden dropout: residual + masked (x + bias) from row 3, and its
   * backward (no residual, no bias) in place; the mask is the same bits */
  mega_dropout drop = mega_dropout_of(0.3, mega_dropout_key(5, 1, MEGA_DROP_MLP), 9, 3, 4);
  cpu->ops->bias_dropout_add(cpu, o, d, x, b, N, C, &drop);
  gpu->ops->bias_dropout_add(gpu, go, dd, dx, db, N, C, &drop);
  same("bias dropout add", go, o, N * C, 1e-6);
  cpu->ops->bias_dropout_add(cpu, o, NULL, o, NULL, N, C, &drop);
  gpu->ops->bias_dropout_add(gpu, go, NULL, go, NULL, N, C, &drop);
  same("dropout backward, in place", go, o, N * C, 1e-6);
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

/* init_normal on the device against the cpu backend's (the host's libm):
 * a whole tensor and a tensor-parallel slice, every float within two ulps
 * of the host's and at most one in a hundred not its bits (the double log
 * and cos may round their last bit apart; a float-precision or fast-math
 * draw would be thousands of ulps off). How many differ is logged. */
static void test_init_normal(void) {
  enum { R = 301, K = 96, W = K / 2 };
  size_t n = (size_t)R * K;
  uint64_t key = 0x5eedULL;
  float *h = malloc(n * 4), *g = dev_zero(n * 4);
  for (int slice = 0; slice < 2; slice++) {
    size_t m = slice ? n / 2 : n, w = slice ? W : n, stride = slice ? K : n, off = slice ? W : 0;
    cpu->ops->init_normal(cpu, h, m, key, 0.02, w, stride, off);
    gpu->ops->init_normal(gpu, g, m, key, 0.02, w, stride, off);
    float *got = down(g, m * 4);
    size_t differ = 0, far = 0;
    for (size_t i = 0; i < m; i++) {
      int32_t a, b;
      memcpy(&a, &got[i], 4), memcpy(&b, &h[i], 4);
      int64_t ulps = (int64_t)a - b;
      differ += ulps != 0;
      far += (a ^ b) < 0 || ulps > 2 || ulps < -2; /* a sign apart, or more than two ulps */
    }
    printf("%s init_normal%s: %zu of %zu floats not the host's bits, %zu more than two ulps "
           "off\n", far || differ > m / 100 ? "FAIL" : "ok  ", slice ? ", a slice" : "", differ,
           m, far);
    failures += far || differ > m / 100;
    free(got);
  }
  gpu->ops->free(gpu, g);
  free(h);
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
    cpu->ops->gelu_erf_forward(cpu, o + off, x + off, n - off);
    gpu->ops->gelu_erf_forward(gpu, go + off, gx + off, n - off);
    snprintf(what, sizeof what, "gelu (erf)%s", at);
    same(what, go + off, o + off, n - off, 1e-6);
    memcpy(o + off, y + off, sizeof(float) * (n - off)); /* in place over dout */
    mega_err err = {0};
    if (gpu->ops->memcpy(gpu, go + off, y + off, sizeof(float) * (n - off), MEGA_COPY_H2D,
                         &err)) {
      printf("FAIL gelu (erf) backward's dout to the device: %s\n", err.msg);
      failures++;
    }
    cpu->ops->gelu_erf_backward(cpu, o + off, x + off, o + off, n - off);
    gpu->ops->gelu_erf_backward(gpu, go + off, gx + off, go + off, n - off);
    snprintf(what, sizeof what, "gelu (erf) backward, in place%s", at);
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
/* be's work done before same() reads through gpu's stream, and a failure
 * that stuck to be (cuDNN's path under require) reported as one: false
 * then, and the results are not compared (they are not cuDNN's). */
static bool settle(mega_backend *be, const char *what) {
  mega_err err = {0};
  if (!be->ops->synchronize(be, &err)) return true;
  printf("FAIL %s: %s\n", what, err.msg);
  failures++;
  return false;
}

static void flash_case(mega_backend *be, const char *path, int B_, int T_, int NH_, int G_,
                       int hs, bool fused) {
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
  if (be->ops->set_bf16(be, true, &err)) {
    printf("FAIL %s attention set_bf16: %s\n", path, err.msg);
    failures++;
    free(x), free(dy), free(att), free(scr), free(y), free(g);
    return;
  }
  /* att and scratch exactly as large as the backend asks (flash: the
   * statistics, the output's copy and D), so an overrun shows in memcheck */
  be->ops->attention_sizes(be, &ad, &ad.att_cap, &ad.scratch_cap);
  if (ad.att_cap != B_ * NH_ * T_ + nq || ad.scratch_cap != (size_t)B_ * NH_ * T_) {
    printf("FAIL %s attention sizes: att %zu, scratch %zu\n", path, ad.att_cap, ad.scratch_cap);
    failures++;
  }
  float *gx = up(x, nall * 4), *gdy = up(dy, nq * 4), *gatt = dev_zero(ad.att_cap * 4);
  float *gscr = dev_zero(ad.scratch_cap * 4), *gy = dev_zero(nq * 4), *gg = dev_zero(nall * 4);
  size_t ko = (size_t)(k - x), vo = (size_t)(v - x);
  cpu->ops->attention_forward(cpu, y, att, scr, q, k, v, &ad);
  be->ops->attention_forward(be, gy, gatt, gscr, gx, gx + ko, gx + vo, &ad);
  char what[96];
  snprintf(what, sizeof what, "%s attention B%d T%d NH%d G%d hs%d%s", path, B_, T_, NH_, G_, hs,
           fused ? " fused qkv" : "");
  bool ran = settle(be, what);
  if (ran) same(what, gy, y, nq, 1e-2);
  cpu->ops->attention_backward(cpu, g, g + ko, g + vo, scr, dy, q, k, v, att, &ad);
  be->ops->attention_backward(be, gg, gg + ko, gg + vo, gscr, gdy, gx, gx + ko, gx + vo, gatt,
                               &ad);
  strcat(what, " backward");
  ran = ran && settle(be, what);
  if (ran) same(what, gg, g, nall, 2e-2);
  if (ran && be != gpu) { /* cuDNN's (flash puts neither): what the projection and the qkv
                            * GEMM's backward read */
    char label[48];
    snprintf(label, sizeof label, "%s attention output", path);
    produced_check(be, label, gy, (int)N_, NH_ * hs);
    snprintf(label, sizeof label, "%s attention fused qkv gradient", path);
    if (fused) produced_check(be, label, gg, (int)N_, ldq);
  }
  cpu->ops->set_bf16(cpu, true, &err);
  cpu->ops->attention_forward(cpu, y, att, scr, q, k, v, &ad);
  cpu->ops->attention_backward(cpu, g, g + ko, g + vo, scr, dy, q, k, v, att, &ad);
  cpu->ops->set_bf16(cpu, false, &err);
  snprintf(what, sizeof what, "%s attention B%d T%d NH%d G%d hs%d%s vs cpu --bf16", path, B_,
           T_, NH_, G_, hs, fused ? " fused qkv" : "");
  if (ran) same(what, gy, y, nq, 1e-2);
  strcat(what, " backward");
  if (ran) same(what, gg, g, nall, 2e-2);
  be->ops->set_bf16(be, false, &err);
  free(x), free(dy), free(att), free(scr), free(y), free(g);
}

/* Buffers sized for flash attention under --bf16, then a call the batched
 * GEMMs must run: --bf16 turned off, or with drop dims that carry attention
 * dropout's mask. The GEMMs would overrun them, so the op refuses and the
 * next synchronize says why, want in its words (on a backend of its own:
 * the failure sticks). */
void attention_sizes_guard(const mega_cuda_module *m, bool drop, const char *want) {
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
  if (drop)
    ad.drop = mega_attn_dropout_of(0.1, mega_dropout_key(5, 0, MEGA_DROP_ATTN_PROBS), 0, 0);
  else
    be->ops->set_bf16(be, false, &err);
  size_t nq = (size_t)ad.T * 128;
  float *q = NULL, *o = NULL, *att = NULL, *scr = NULL;
  if (be->ops->alloc(be, nq * 4, (void **)&q, &err) ||
      be->ops->alloc(be, nq * 4, (void **)&o, &err) ||
      be->ops->alloc(be, ad.att_cap * 4, (void **)&att, &err) ||
      be->ops->alloc(be, ad.scratch_cap * 4, (void **)&scr, &err)) {
    printf("FAIL alloc: %s\n", err.msg);
    failures++;
    mega_backend_destroy(be);
    return;
  }
  be->ops->attention_forward(be, o, att, scr, q, q, q, &ad);
  mega_status st = be->ops->synchronize(be, &err);
  const char *what = drop ? "with a mask" : "without --bf16";
  if (full_att != (size_t)ad.T * ad.T * 2 || ad.att_cap >= full_att || st == MEGA_OK ||
      !strstr(err.msg, want)) {
    printf("FAIL attention sizes guard %s: full %zu, flash %zu, status %d: %s\n", what,
           full_att, ad.att_cap, (int)st, err.msg);
    failures++;
  } else {
    printf("ok   attention %s refuses buffers sized for flash attention\n", what);
  }
  mega_backend_destroy(be);
}

static void test_flash_attention(void) {
  flash_case(gpu, "flash", 2, 200, 4, 2, 64, false);
  flash_case(gpu, "flash", 1, 130, 2, 2, 128, true);
  flash_case(gpu, "flash", 2, 64 * 3, 12, 12, 64, true);
  flash_case(gpu, "flash", 1, 65, 1, 1, 64, false); /* the output copy off 8 bytes */
}

/* The same through cuDNN's fused attention (worker/backend/cuda_sdpa.c) on
 * a backend of its own under MEGA_CUDNN_ATTENTION=require, so a shape
 * cuDNN declines fails the check with its reason instead of quietly taking
 * the flash kernels. Grouped-query too; GPT-2 124M's own shape last. */
static void test_cudnn_attention(const mega_cuda_module *m) {
  mega_err err = {0};
  mega_backend *dnn;
  if (!strstr(m->versions(), ", cuDNN 9.")) { /* else ", no cuDNN (why)" */
    printf("skipped cuDNN attention: %s\n", m->versions());
    return;
  }
  /* the markers tell the device kit whether a crash was inside these */
  printf("# cuDNN attention cases\n");
  setenv("MEGA_CUDNN_ATTENTION", "require", 1);
  if (m->backend_create(0, &dnn, &err)) {
    printf("FAIL cuDNN attention: creating its backend: %s\n", err.msg);
    failures++;
  } else {
    /* through cuDNN 9.15 a T that is not a multiple of 128 is declined
     * (mega_sdpa_version_takes): the flash kernels' cases cover it, and
     * under require the decline would stick to this backend */
    int minor = atoi(strstr(m->versions(), ", cuDNN 9.") + strlen(", cuDNN 9."));
    static const int cases[][6] = {{2, 200, 4, 2, 64, 0},  {1, 130, 4, 2, 128, 1},
                                   {2, 200, 4, 4, 64, 0},  {2, 64 * 3, 12, 12, 64, 1},
                                   {2, 256, 4, 2, 64, 0},  {1, 1024, 12, 12, 64, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const int *c = cases[i];
      if (minor <= 15 && c[1] % 128)
        printf("skipped cuDNN attention T%d: cuDNN 9.%d's backward takes T a multiple of 128\n",
               c[1], minor);
      else
        flash_case(dnn, "cuDNN", c[0], c[1], c[2], c[3], c[4], c[5]);
    }
    mega_backend_destroy(dnn); /* its plans, handle and buffers freed on a GPU too */
  }
  setenv("MEGA_CUDNN_ATTENTION", "off", 1);
  printf("# cuDNN attention cases done\n");
}

int main(void) {
  mega_err err = {0};
  const mega_cuda_module *m;
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach the kit's pipe even if a check crashes */
  if (mega_cuda_module_load(&m, &err) != MEGA_OK || m->device_count(&err) < 1) {
    printf("skipped: %s\n", err.msg);
    return 77;
  }
  printf("# %s\n", m->versions());
  setenv("MEGA_CUDNN_ATTENTION", "off", 1); /* gpu: the flash kernels (test_cudnn_attention) */
  if (mega_backend_cpu_create(NULL, &cpu, &err) || m->backend_create(0, &gpu, &err) ||
      m->backend_create(0, &raw, &err)) {
    printf("FAIL creating the backends: %s\n", err.msg);
    return 1;
  }
  test_gemms();
  test_encoder();
  test_model_ops();
  test_element_ops();
  test_init_normal();
  test_adamw_ranges();
  test_posted_sums();
  test_column_sums();
  test_classifier();
  test_llama_ops();
  test_bf16_matmuls();
  test_bf16_kept_copies();
  test_bf16_producers();
  test_matmul_gelu();
  test_bias_grad_epilogue(m);
  test_flash_attention();
  test_cudnn_attention(m);
  attention_sizes_guard(m, false, "size them with attention_sizes after set_bf16");
  test_attention_dropout(m);
  printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
  /* buffers are left to the process's end: the device goes with it */
  return failures ? 1 : 0;
}
