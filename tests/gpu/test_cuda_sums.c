/* test_cuda_backend's reductions along rows and columns: the classifier
 * (in place, vocabulary-parallel and fused with its backward) and the
 * column sums (bias and norm weight gradients) in row slices, against the
 * cpu backend and, where the fused ops promise it, bit for bit against
 * the two passes on the GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/cuda_check.h"

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
  float *fl = vec(n + off, 60 + nv, 6), *gfl = up(fl, sizeof(float) * (n + off));
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
  /* fused: the cpu's, and the gpu's two passes bit for bit */
  cpu->ops->crossentropy_forward_grad(cpu, loss, fl + off, tg, 0.1f, R, nv);
  gpu->ops->crossentropy_forward_grad(gpu, gl, gfl + off, gtg, 0.1f, R, nv);
  snprintf(what, sizeof what, "fused cross-entropy losses, rows of %d", nv);
  same(what, gl, loss, R, 1e-5);
  snprintf(what, sizeof what, "fused cross-entropy dlogits, rows of %d%s", nv,
           off ? " off 16" : "");
  same(what, gfl + off, fl + off, n, 2e-6);
  same_bits(what, gfl + off, glg + off, n * sizeof(float));
  gpu->ops->free(gpu, gfl);
  free(lg), free(fl);
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
    float *gf = dev_zero(sizeof sl[r]); /* the fused finish on the slice's logits */
    gpu->ops->memcpy(gpu, gf, gsl[r], sizeof sl[r], MEGA_COPY_D2D, &err);
    gpu->ops->crossentropy_finish_grad(gpu, gl, gf, gmx, gs, gtg, r * VL, 0.1f, R, VL);
    cpu->ops->crossentropy_finish(cpu, loss, sl[r], gmax, gsums, R, VL);
    same("vocabulary-parallel fused losses", gl, loss, R, 1e-5);
    gpu->ops->crossentropy_finish(gpu, gl, gsl[r], gmx, gs, R, VL);
    same("vocabulary-parallel losses", gl, loss, R, 1e-5);
    same("vocabulary-parallel probabilities in place", gsl[r], sl[r], R * VL, 2e-6);
    cpu->ops->crossentropy_backward(cpu, sl[r], tg, r * VL, 0.1f, R, VL);
    gpu->ops->crossentropy_backward(gpu, gsl[r], gtg, r * VL, 0.1f, R, VL);
    same("vocabulary-parallel backward in place", gsl[r], sl[r], R * VL, 2e-6);
    same_bits("vocabulary-parallel fused, the two passes' bits", gf, gsl[r], sizeof sl[r]);
    gpu->ops->free(gpu, gf);
  }
  free(lg);
}

void test_classifier(void) {
  classifier_rows(V, 0);
  classifier_rows(1028, 0);
  classifier_rows(4100, 0);
  classifier_rows(1028, 1);
  classifier_slices();
}

/* The column sums (bias and norm weight gradients) over enough rows that
 * the kernels cut them into slices (kernels/gpt_bodies.h mega_kc_slices),
 * one slice too, each added onto non-zero gradients. */
void test_column_sums(void) {
  static const int shapes[][2] = {{4096, 768}, {2048, 40}, {300, 70}, {14, 12}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int R = shapes[i][0], K = shapes[i][1];
    size_t n = (size_t)R * K;
    float *x = vec(n, 81, 2), *d = vec(n, 82, 1), *w = vec((size_t)K, 83, 1);
    float *g = vec((size_t)K, 84, 1), *h = vec((size_t)K, 85, 1);
    float *m = calloc(R, sizeof *m), *r = calloc(R, sizeof *r), *o = malloc(n * sizeof *o);
    float *dW = calloc((size_t)K * K, sizeof *dW), *ddW = dev_zero((size_t)K * K * 4);
    float *dx = up(x, n * 4), *dd = up(d, n * 4), *dg = up(g, K * 4), *dh = up(h, K * 4);
    float *dm = up(m, R * 4), *dr = up(r, R * 4);
    char what[64];
    cpu->ops->matmul_backward_weight(cpu, dW, g, d, x, R, K, K, MEGA_W_IN_OUT);
    gpu->ops->matmul_backward_weight(gpu, ddW, dg, dd, dx, R, K, K, MEGA_W_IN_OUT);
    snprintf(what, sizeof what, "bias gradient over %d rows of %d", R, K);
    same(what, dg, g, K, 1e-4);
    cpu->ops->layernorm_forward(cpu, o, m, r, x, w, h, R, K, 1e-5f);
    gpu->ops->memcpy(gpu, dm, m, R * 4, MEGA_COPY_H2D, &(mega_err){0});
    gpu->ops->memcpy(gpu, dr, r, R * 4, MEGA_COPY_H2D, &(mega_err){0});
    cpu->ops->layernorm_backward_weight(cpu, g, h, d, x, m, r, R, K);
    gpu->ops->layernorm_backward_weight(gpu, dg, dh, dd, dx, dm, dr, R, K);
    snprintf(what, sizeof what, "layernorm dw, db over %d rows of %d", R, K);
    same(what, dg, g, K, 1e-4);
    same(what, dh, h, K, 1e-4);
    cpu->ops->rmsnorm_forward(cpu, o, r, x, w, R, K, 1e-5f);
    gpu->ops->memcpy(gpu, dr, r, R * 4, MEGA_COPY_H2D, &(mega_err){0});
    cpu->ops->rmsnorm_backward_weight(cpu, g, d, x, r, R, K);
    gpu->ops->rmsnorm_backward_weight(gpu, dg, dd, dx, dr, R, K);
    snprintf(what, sizeof what, "rmsnorm dw over %d rows of %d", R, K);
    same(what, dg, g, K, 1e-4);
    void *dev[] = {ddW, dx, dd, dg, dh, dm, dr};
    for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++) gpu->ops->free(gpu, dev[k]);
    free(x), free(d), free(w), free(g), free(h), free(m), free(r), free(o), free(dW);
  }
}
