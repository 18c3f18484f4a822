/* The cpu backend's attention, forward and backward, against naive causal
 * grouped-query attention in double: GPT-2's fused qkv and Llama's separate
 * q, k and v, head sizes 8 and 64 at T = 150 and 75 (the tiled and edge
 * paths), with and without attention dropout; at one and three threads. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cpu_ops_fixture.h"

/* Naive causal grouped-query attention in double: out and att, then the
 * backward. q [B*T, ldq], k and v [B*T, ldkv]; the gradients at the same
 * offsets of buffers shaped as the inputs (dq, dk, dv zeroed by the caller).
 * With d->drop, out = (a m) v for m the mask times its scale, a undropped:
 * da = (dout v^T) m, dv = (a m)^T dout. */
static void attention_reference(const float *q, const float *k, const float *v,
                                const float *dout, const mega_attn_dims *d, double *out,
                                double *att, double *dq, double *dk, double *dv) {
  int B = d->B, T = d->T, NH = d->NH, hs = d->hs, rep = d->NH / d->G, ldo = NH * hs;
  double scale = 1.0 / sqrt(hs);
  double *datt = malloc(sizeof(double) * T), *m = malloc(sizeof(double) * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        size_t qo = ((size_t)b * T + t) * d->ldq + (size_t)h * hs;
        const float *qr = q + qo;
        double *a = att + (((size_t)b * NH + h) * T + t) * T, mx = -INFINITY, sum = 0;
#define KV(s) (((size_t)b * T + (s)) * d->ldkv + (size_t)(h / rep) * hs)
        for (int s = 0; s < T; s++) {
          a[s] = 0;
          if (s > t) continue;
          for (int i = 0; i < hs; i++) a[s] += (double)qr[i] * k[KV(s) + i];
          a[s] *= scale;
          mx = fmax(mx, a[s]);
        }
        for (int s = 0; s <= t; s++) sum += (a[s] = exp(a[s] - mx));
        for (int s = 0; s <= t; s++) a[s] /= sum;
        uint64_t key = mega_attn_dropout_row(&d->drop, b, h, t);
        for (int s = 0; s <= t; s++)
          m[s] = d->drop.scale == 0.0f ? 1.0 : mega_attn_dropout_apply(&d->drop, key, s, 1.0f);
        double *o = out + ((size_t)b * T + t) * ldo + h * hs;
        const float *dy = dout + ((size_t)b * T + t) * ldo + h * hs;
        for (int i = 0; i < hs; i++) {
          o[i] = 0;
          for (int s = 0; s <= t; s++) o[i] += a[s] * m[s] * v[KV(s) + i];
        }
        /* backward of this row */
        double dot = 0;
        for (int s = 0; s <= t; s++) {
          datt[s] = 0;
          for (int i = 0; i < hs; i++) datt[s] += dy[i] * (double)v[KV(s) + i];
          datt[s] *= m[s];
          dot += datt[s] * a[s];
        }
        for (int s = 0; s <= t; s++) {
          double dpre = a[s] * (datt[s] - dot) * scale;
          for (int i = 0; i < hs; i++) {
            dq[qo + i] += dpre * k[KV(s) + i];
            dk[KV(s) + i] += dpre * qr[i];
            dv[KV(s) + i] += a[s] * m[s] * dy[i];
          }
        }
#undef KV
      }
  free(datt);
  free(m);
}

/* q, k, v at offsets qo, ko, vo of one buffer of nbuf floats (the
 * gradients at the same offsets of another). */
static void attention_case(const mega_attn_dims *d, size_t nbuf, size_t qo, size_t ko,
                           size_t vo) {
  int B = d->B, T = d->T, NH = d->NH;
  size_t nc = (size_t)B * T * NH * d->hs, na = (size_t)B * NH * T * T;
  float *buf = vec(nbuf, 1.0f, 1), *dout = vec(nc, 1.0f, 2), *out = malloc(nc * 4),
        *att = malloc(na * 4), *g = malloc(nbuf * 4), *scratch = malloc((na + nc) * 4);
  double *rout = malloc(nc * 8), *ratt = malloc(na * 8), *rg = calloc(nbuf, 8);
  memset(att, 0xff, na * 4); /* NaN: every element used must be written */
  memset(scratch, 0xff, (na + nc) * 4);
  cpu_be->ops->attention_forward(cpu_be, out, att, scratch, buf + qo, buf + ko, buf + vo, d);
  attention_reference(buf + qo, buf + ko, buf + vo, dout, d, rout, ratt, rg + qo, rg + ko,
                      rg + vo);
  near(out, rout, nc, 1e-5, "attention out");
  float *lower = malloc(na * 4);
  for (size_t i = 0; i < na; i++) /* above the diagonal att is the backend's */
    lower[i] = (int)(i % T) <= (int)(i / T % T) ? att[i] : 0.0f;
  near(lower, ratt, na, 1e-6, "attention probabilities");
  free(lower);
  memset(scratch, 0xff, (na + nc) * 4);
  memset(g, 0, nbuf * 4); /* gaps between q, k and v stay zero */
  cpu_be->ops->attention_backward(cpu_be, g + qo, g + ko, g + vo, scratch, dout, buf + qo, buf + ko,
                              buf + vo, att, d);
  near(g, rg, nbuf, 1e-5, "attention dq, dk, dv");
  free(buf), free(dout), free(out), free(att), free(g), free(scratch);
  free(rout), free(ratt), free(rg);
}

/* GPT-2's fused qkv [B,T,3C] (strides 3C), with attention dropout p (0:
 * none) */
static void fused_case(int B, int T, int C, int NH, double p) {
  mega_attn_dims d = {.B = B, .T = T, .NH = NH, .G = NH, .hs = C / NH, .ldq = 3 * C,
                      .ldkv = 3 * C};
  if (p > 0) d.drop = mega_attn_dropout_of(p, 0x5eedull, 17, 3);
  attention_case(&d, (size_t)B * T * 3 * C, 0, C, 2 * C);
}

/* Llama's separate q [B*T, NH*hs], k and v [B*T, G*hs] */
static void grouped_case(int B, int T, int NH, int G, int hs, double p) {
  mega_attn_dims d = {.B = B, .T = T, .NH = NH, .G = G, .hs = hs, .ldq = NH * hs,
                      .ldkv = G * hs};
  if (p > 0) d.drop = mega_attn_dropout_of(p, 0xd20bull, 40, 8);
  size_t nq = (size_t)B * T * NH * hs, nk = (size_t)B * T * G * hs;
  attention_case(&d, nq + 2 * nk, 0, nq, nq + nk);
}

/* Head size 8 (edge tiles only) and 64 (full tiles), T not a multiple of
 * the 8-row groups or the 32-column tiles; grouped-query attention with 2
 * and 4 query heads per key/value head, and with one key/value head. */
static void attention_matches_naive(void **state) {
  (void)state;
  fused_case(2, 150, 32, 4, 0);
  fused_case(1, 75, 128, 2, 0);
  grouped_case(2, 75, 4, 2, 16, 0);
  grouped_case(1, 40, 8, 2, 64, 0);
  grouped_case(3, 9, 6, 1, 8, 0);
}

/* Attention dropout: the mask of (sample, head, query, key) on the
 * probabilities that multiply v, and the backward's through it. */
static void attention_dropout_matches_naive(void **state) {
  (void)state;
  fused_case(2, 150, 32, 4, 0.2);
  grouped_case(2, 75, 4, 2, 16, 0.5);
  grouped_case(3, 9, 6, 1, 8, 0.1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(attention_matches_naive),
      cmocka_unit_test(attention_dropout_matches_naive),
  };
  return CPU_OPS_RUN(tests);
}
