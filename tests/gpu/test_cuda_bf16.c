/* test_cuda_backend's checks under --bf16 (its main runs them): the
 * matmuls on bf16 copies, the kept copies renewed after every kind of
 * write, the copies the producing ops write (the erf GELU's among them),
 * and GPT-2's c_fc fused with its GELU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "tests/gpu/cuda_check.h"

/* --bf16: cublasGemmEx on bf16 copies against the cpu backend's rounding
 * before OpenBLAS. Both round the same fp32 inputs the same way and the
 * products are exact in fp32, so only the order of the sums differs. */
void test_bf16_matmuls(void) {
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
    same("bf16 matmul bias gradient (of the rounded gradient)", gdb, db, 3 * C, 1e-4);
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

void test_bf16_kept_copies(void) {
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
 * just written so by an op of be, its work done: src's memory is zeroed
 * behind be's cache (by the backend raw), so a matmul by the identity on
 * be gives src's floats rounded only if the op put the copy (a copy made
 * now would round the zeros); src restored, the matmul gives the same bits
 * again once src is rewritten through be and its copy rounded afresh. The
 * buffers are left to the process's end: a free drops every copy of the
 * backend (cu_free), the next check's too. */
void produced_check(mega_backend *be, const char *what, float *src, int rows, int cols) {
  size_t n = (size_t)rows * cols;
  mega_err err = {0};
  float *eye = calloc((size_t)cols * cols, 4), *zeros = calloc(n, 4);
  for (int i = 0; i < cols; i++) eye[(size_t)i * cols + i] = 1.0f;
  float *geye = up(eye, (size_t)cols * cols * 4), *gy = dev_zero(n * 4), *gy2 = dev_zero(n * 4);
  float *keep = dev_zero(n * 4);
  float *want = down(src, n * 4);
  for (size_t i = 0; i < n; i++) want[i] = mega_bf16_round(want[i]);
  if (raw->ops->memcpy(raw, keep, src, n * 4, MEGA_COPY_D2D, &err) ||
      raw->ops->memcpy(raw, src, zeros, n * 4, MEGA_COPY_H2D, &err)) {
    fprintf(stderr, "%s: %s\n", what, err.msg);
    exit(1);
  }
  be->ops->matmul_forward(be, gy, src, geye, NULL, NULL, rows, cols, cols, MEGA_W_IN_OUT);
  if (be->ops->synchronize(be, &err)) { /* before gpu's stream reads (be may be another) */
    printf("FAIL %s: %s\n", what, err.msg);
    failures++;
    return;
  }
  char label[96];
  snprintf(label, sizeof label, "%s: the op put the next matmul's bf16 copy, its output rounded",
           what);
  same(label, gy, want, n, 0);
  if (raw->ops->memcpy(raw, src, keep, n * 4, MEGA_COPY_D2D, &err) ||
      raw->ops->synchronize(raw, &err) ||
      be->ops->memcpy(be, src, keep, n * 4, MEGA_COPY_D2D, &err)) { /* be's copy dropped */
    fprintf(stderr, "%s: %s\n", what, err.msg);
    exit(1);
  }
  be->ops->matmul_forward(be, gy2, src, geye, NULL, NULL, rows, cols, cols, MEGA_W_IN_OUT);
  if (be->ops->synchronize(be, &err)) {
    printf("FAIL %s: %s\n", what, err.msg);
    failures++;
    return;
  }
  snprintf(label, sizeof label, "%s: the matmul as on a fresh rounding", what);
  same_bits(label, gy2, gy, n * 4);
  free(eye), free(zeros), free(want);
}

static void bf16_on(bool on) {
  mega_err err = {0};
  if (gpu->ops->set_bf16(gpu, on, &err)) {
    fprintf(stderr, "set_bf16: %s\n", err.msg);
    exit(1);
  }
}

/* Each producer (GPT-2's and Llama's, the norms' backward and the fused
 * classifier too) without --bf16 (the reference), then with it: the same
 * fp32 bits, and the copy produced_check wants. GELU also
 * off 16 bytes
 * (one item a thread, its copy from the floats read back), the classifier
 * one float a load (V) and four (VW). */
void test_bf16_producers(void) {
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
  produced_check(gpu, "layernorm", go[1], N, C);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    go[on] = dev_zero(N * C * 4);
    gpu->ops->rmsnorm_forward(gpu, go[on], gr, gx, gw, N, C, 1e-5f);
  }
  same_bits("rmsnorm under --bf16", go[1], go[0], N * C * 4);
  produced_check(gpu, "rmsnorm", go[1], N, C);
  float *gdy = up(pre, N * C * 4); /* the norms' backward: the residual's gradient added */
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    go[on] = up(dh, N * C * 4);
    gpu->ops->layernorm_backward_input(gpu, go[on], go[on], gdy, gx, gw, gm, gr, N, C);
  }
  same_bits("layernorm backward under --bf16", go[1], go[0], N * C * 4);
  produced_check(gpu, "layernorm backward", go[1], N, C);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    go[on] = up(dh, N * C * 4);
    gpu->ops->rmsnorm_backward_input(gpu, go[on], go[on], gdy, gx, gw, gr, N, C);
  }
  same_bits("rmsnorm backward under --bf16", go[1], go[0], N * C * 4);
  produced_check(gpu, "rmsnorm backward", go[1], N, C);
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    gh[on] = dev_zero(nf * 4);
    gpu->ops->swiglu_forward(gpu, gh[on], gpre, gpre + 1, (size_t)N * F);
  }
  same_bits("swiglu under --bf16", gh[1], gh[0], (size_t)N * F * 4);
  produced_check(gpu, "swiglu", gh[1], N, F);
  for (int on = 0; on < 2; on++) { /* dgate in place over dout, as the model runs it */
    bf16_on(on);
    gd[on] = up(dh, nf * 4);
    gh[on] = dev_zero(nf * 4);
    gpu->ops->swiglu_backward(gpu, gd[on], gh[on], gd[on], gpre, gpre + 1, (size_t)N * F);
  }
  same_bits("swiglu dgate under --bf16", gd[1], gd[0], (size_t)N * F * 4);
  same_bits("swiglu dup under --bf16", gh[1], gh[0], (size_t)N * F * 4);
  produced_check(gpu, "swiglu dgate", gd[1], N, F);
  produced_check(gpu, "swiglu dup", gh[1], N, F);
  for (int off = 0; off < 2; off++) {
    for (int on = 0; on < 2; on++) {
      bf16_on(on);
      gh[on] = dev_zero(nf * 4);
      gpu->ops->gelu_forward(gpu, gh[on] + off, gpre + off, (size_t)N * F);
    }
    same_bits(off ? "gelu under --bf16, off 16 bytes" : "gelu under --bf16", gh[1] + off,
              gh[0] + off, (size_t)N * F * 4);
    produced_check(gpu, off ? "gelu off 16 bytes" : "gelu", gh[1] + off, N, F);
    for (int on = 0; on < 2; on++) { /* in place, as the model runs it */
      bf16_on(on);
      gd[on] = up(dh, nf * 4);
      gpu->ops->gelu_backward(gpu, gd[on] + off, gpre + off, gd[on] + off, (size_t)N * F);
    }
    same_bits(off ? "gelu backward under --bf16, off 16 bytes" : "gelu backward under --bf16",
              gd[1] + off, gd[0] + off, (size_t)N * F * 4);
    produced_check(gpu, off ? "gelu backward off 16 bytes" : "gelu backward", gd[1] + off, N, F);
  }
  /* the exact (erf) GELU's kernels write the same copies */
  for (int on = 0; on < 2; on++) {
    bf16_on(on);
    gh[on] = dev_zero(nf * 4);
    gpu->ops->gelu_erf_forward(gpu, gh[on] + 1, gpre + 1, (size_t)N * F);
  }
  same_bits("gelu (erf) under --bf16", gh[1] + 1, gh[0] + 1, (size_t)N * F * 4);
  produced_check(gpu, "gelu (erf)", gh[1] + 1, N, F);
  for (int on = 0; on < 2; on++) { /* in place, as the model runs it */
    bf16_on(on);
    gd[on] = up(dh, nf * 4);
    gpu->ops->gelu_erf_backward(gpu, gd[on], gpre, gd[on], (size_t)N * F);
  }
  same_bits("gelu (erf) backward under --bf16", gd[1], gd[0], (size_t)N * F * 4);
  produced_check(gpu, "gelu (erf) backward", gd[1], N, F);
  for (int vv = V; vv <= VW; vv += VW - V) {
    for (int on = 0; on < 2; on++) {
      bf16_on(on);
      gl[on] = up(logits, (size_t)N * vv * 4);
      gpu->ops->crossentropy_forward(gpu, gm, gl[on], gtg, N, vv);
      gpu->ops->crossentropy_backward(gpu, gl[on], gtg, 0, 0.1f, N, vv);
    }
    same_bits(vv == V ? "classifier backward under --bf16" :
                        "classifier backward under --bf16, four a load",
              gl[1], gl[0], (size_t)N * vv * 4);
    produced_check(gpu, vv == V ? "classifier backward" : "classifier backward, four a load", gl[1],
                   N, vv);
    for (int on = 0; on < 2; on++) { /* fused: the two ops' bits, and the copy */
      bf16_on(on);
      gd[on] = up(logits, (size_t)N * vv * 4);
      gpu->ops->crossentropy_forward_grad(gpu, gm, gd[on], gtg, 0.1f, N, vv);
    }
    same_bits(vv == V ? "fused classifier, the two ops' bits" :
                        "fused classifier, the two ops' bits, four a load",
              gd[0], gl[0], (size_t)N * vv * 4);
    same_bits("fused classifier under --bf16", gd[1], gl[0], (size_t)N * vv * 4);
    produced_check(gpu, vv == V ? "fused classifier" : "fused classifier, four a load", gd[1], N, vv);
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

void test_matmul_gelu(void) {
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
  /* The GELU input (cuBLASLt's aux, whose pointer the heuristic reads)
   * first on 256 bytes, then one float off, with out one float off both
   * times so that the other pointers' alignment is the same: the second
   * must get an algorithm of its own (cuda_lt.c's key), not the first's. */
  float *gpre2 = dev_zero(4 * (N * F + 1)), *gout2 = dev_zero(4 * (N * F + 1));
  cpu->ops->matmul_forward(cpu, pre, x, W, bias, NULL, N, C, F, MEGA_W_IN_OUT);
  cpu->ops->gelu_forward(cpu, out, pre, (size_t)N * F);
  for (int off = 0; off < 2; off++) {
    gpu->ops->matmul_gelu_forward(gpu, gout2 + 1, gpre2 + off, gx, gW, gb, N, C, F,
                                  MEGA_W_IN_OUT);
    same(off ? "fused c_fc + GELU, its input one float off" : "fused c_fc + GELU, out off",
         gout2 + 1, out, (size_t)N * F, 1e-3);
    same("fused c_fc + GELU: the GELU's input, off", gpre2 + off, pre, (size_t)N * F, 1e-4);
  }
  gpu->ops->free(gpu, gpre2), gpu->ops->free(gpu, gout2);
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

/* The weight gradient and its bias gradient in one cuBLASLt GEMM
 * (CUBLASLT_EPILOGUE_BGRADA for (in, out), BGRADB for (out, in)), against
 * the cpu backend, which sums the same rounded gradient; and against a
 * cuda backend without cuBLASLt (MEGA_CUBLASLT=off: the GEMM, then the
 * column sums): over this many rows the sums' order shows in the bits,
 * so equal bits mean cuBLASLt declined the epilogue. */
void test_bias_grad_epilogue(const mega_cuda_module *m) {
  enum { R = 2048, K = 64, OC = 192 };
  mega_err err = {0};
  mega_backend *plain = NULL;
  const char *outer = getenv("MEGA_CUBLASLT");
  char *keep = outer ? strdup(outer) : NULL;
  setenv("MEGA_CUBLASLT", "off", 1);
  mega_status st = m->backend_create(0, &plain, &err);
  if (keep) setenv("MEGA_CUBLASLT", keep, 1);
  else unsetenv("MEGA_CUBLASLT");
  free(keep);
  if (st != MEGA_OK || plain->ops->set_bf16(plain, true, &err) ||
      cpu->ops->set_bf16(cpu, true, &err)) {
    printf("FAIL a cuda backend with MEGA_CUBLASLT=off: %s\n", err.msg);
    failures++;
    if (st == MEGA_OK) mega_backend_destroy(plain);
    return;
  }
  bf16_on(true);
  /* not multiples of a power of two: dyadic values would sum exactly in
   * any order, and the bits could not tell the paths apart */
  float *x = vec((size_t)R * K, 41, 2), *dy = vec((size_t)R * OC, 42, 0.7f);
  float *b0 = vec(OC, 43, 1), *w0 = vec((size_t)K * OC, 44, 0.5f);
  float *gx = up(x, 4 * R * K), *gdy = up(dy, 4 * R * OC);
  for (int lay = 0; lay < 2; lay++) {
    mega_wlayout l = (mega_wlayout)lay;
    const char *name = lay ? "out, in" : "in, out";
    float *dw = malloc(4 * K * OC), *db = malloc(4 * OC);
    memcpy(dw, w0, 4 * K * OC); /* both accumulate onto what is there */
    memcpy(db, b0, 4 * OC);
    float *gdw = up(w0, 4 * K * OC), *gdb = up(b0, 4 * OC);
    float *pdw = up(w0, 4 * K * OC), *pdb = up(b0, 4 * OC);
    cpu->ops->matmul_backward_weight(cpu, dw, db, dy, x, R, K, OC, l);
    gpu->ops->matmul_backward_weight(gpu, gdw, gdb, gdy, gx, R, K, OC, l);
    plain->ops->matmul_backward_weight(plain, pdw, pdb, gdy, gx, R, K, OC, l);
    if (plain->ops->synchronize(plain, &err)) {
      printf("FAIL MEGA_CUBLASLT=off backend: %s\n", err.msg);
      failures++;
    }
    char what[96];
    snprintf(what, sizeof what, "bf16 weight gradient with its bias's (%s)", name);
    same(what, gdw, dw, (size_t)K * OC, 1e-3);
    snprintf(what, sizeof what, "bf16 bias gradient over %d rows (%s)", R, name);
    same(what, gdb, db, OC, 1e-4);
    snprintf(what, sizeof what, "bf16 bias gradient, column sums (%s)", name);
    same(what, pdb, db, OC, 1e-4);
    if (!differs(gdb, pdb, OC)) {
      printf("FAIL bias gradient (%s): the bits are the column sums' own: cuBLASLt declined the "
             "BGRAD epilogue (correct, one pass slower)\n", name);
      failures++;
    } else {
      printf("ok   bias gradient (%s) came from the weight gradient's GEMM\n", name);
    }
    free(dw), free(db);
    void *dev[] = {gdw, gdb, pdw, pdb};
    for (size_t k = 0; k < 4; k++) gpu->ops->free(gpu, dev[k]);
  }
  gpu->ops->free(gpu, gx), gpu->ops->free(gpu, gdy);
  free(x), free(dy), free(b0), free(w0);
  cpu->ops->set_bf16(cpu, false, &err);
  bf16_on(false);
  mega_backend_destroy(plain);
}
