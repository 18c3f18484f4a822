/* The cuda backend's attention without a GPU: the composition of
 * worker/backend/attn_gemm.c (batched GEMMs around the softmax and
 * attention dropout passes) on the cpu backend's GEMMs, with the kernel
 * bodies of kernels/gpt_bodies.h in those passes as gpt_kernels.cu runs
 * them, against the cpu backend's own attention; and the dropout body's
 * mask against the very bits the cpu attention multiplied by. cuBLAS's
 * column-major calls are checked only where a GPU is (test_cuda_backend). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/gpt_bodies.h"
#include "tests/gpu/bodies_check.h"
#include "worker/backend/attn_gemm.h"
#include "worker/backend/backend.h"

static mega_backend *be;

enum { B = 2, T = 7, C = 12, NH = 3, N = B * T };

/* The bodies' softmax passes, as the cuda backend runs them, here on the
 * CPU: attn_gemm.c's GEMM strides against the cpu backend's attention. */
static int softmax_lanes = 1;

static void body_softmax(mega_backend *b, float *att, int64_t rows, int seq_len) {
  (void)b;
  int L = softmax_lanes;
  for (int64_t r = 0; r < rows; r++) {
    float *row = att + r * seq_len;
    int n = (int)(r % seq_len) + 1;
    float mx = LANES_MAX(L, mega_kr_max(row, n, l, L));
    float sum = LANES_SUM(L, mega_kr_sumexp(row, row, n, mx, l, L));
    for (int l = 0; l < L; l++) mega_kr_causal_softmax_scale(r, l, L, att, seq_len, sum);
  }
}

static void body_softmax_bwd(mega_backend *b, float *da, const float *att, int64_t rows,
                             int seq_len, float scale) {
  (void)b;
  int L = softmax_lanes;
  for (int64_t r = 0; r < rows; r++) {
    float dot = LANES_SUM(L, mega_kr_dot(att + r * seq_len, da + r * seq_len,
                                         (int)(r % seq_len) + 1, l, L));
    for (int l = 0; l < L; l++) mega_kr_causal_softmax_bwd(r, l, L, da, att, seq_len, scale, dot);
  }
}

/* mega_cu_attn_dropout's kernel: the body over every element. */
static void body_dropout(mega_backend *b, float *dst, const float *src, const mega_attn_dims *d) {
  (void)b;
  for (int64_t i = 0; i < (int64_t)d->B * d->NH * d->T * d->T; i++)
    mega_kb_attn_dropout(i, dst, src, d->NH, d->T, d->drop);
}

static const mega_attn_softmax body_sm = {
    .forward = body_softmax, .backward = body_softmax_bwd, .dropout = body_dropout};

/* One attention shape: q [N, ldq] and k, v [N, ldkv] at the given
 * pointers into qkv (and dq, dk, dv at the same offsets into a gradient
 * buffer of the same size), NHq query and G key/value heads of hs; with
 * attention dropout p (0: none), the mask of samples from 11 and heads
 * from 2, which must then change the output. */
static void attention_case(int NHq, int G, int hs, size_t qkv_n, size_t qo, size_t ko,
                           size_t vo, int ldq, int ldkv, double p) {
  mega_attn_dims d = {.B = B, .T = T, .NH = NHq, .G = G, .hs = hs, .ldq = ldq, .ldkv = ldkv};
  if (p > 0) d.drop = mega_attn_dropout_of(p, mega_dropout_key(9, 4, MEGA_DROP_ATTN_PROBS), 11, 2);
  size_t nout = (size_t)N * NHq * hs, tt = (size_t)B * NHq * T * T, scratch_n = tt + nout;
  float *qkv = vec(qkv_n, 17, 1), *dy = vec(nout, 18, 1);
  float *o1 = calloc(nout, 4), *o2 = calloc(nout, 4), *a1 = calloc(tt, 4), *a2 = calloc(tt, 4);
  float *s1 = calloc(scratch_n, 4), *s2 = calloc(scratch_n, 4);
  float *g1 = calloc(qkv_n, 4), *g2 = calloc(qkv_n, 4);
  be->ops->attention_forward(be, o1, a1, s1, qkv + qo, qkv + ko, qkv + vo, &d);
  be->ops->attention_backward(be, g1 + qo, g1 + ko, g1 + vo, s1, dy, qkv + qo, qkv + ko,
                              qkv + vo, a1, &d);
  if (p > 0) { /* the mask is live: without it the output differs */
    mega_attn_dims plain = d;
    plain.drop = (mega_attn_dropout){0};
    be->ops->attention_forward(be, o2, a2, s2, qkv + qo, qkv + ko, qkv + vo, &plain);
    assert_memory_not_equal(o1, o2, nout * sizeof *o1);
  }
  FOR_LANES(L) {
    softmax_lanes = L;
    mega_attn_gemm_forward(be, &body_sm, o2, a2, s2, qkv + qo, qkv + ko, qkv + vo, &d);
    near(o2, o1, nout, 1e-5, "attention output");
    for (size_t r = 0; r < (size_t)B * NHq * T; r++) { /* at and below the diagonal; zeros above */
      near(a2 + r * T, a1 + r * T, r % T + 1, 1e-5, "attention probabilities");
      for (size_t j = r % T + 1; j < T; j++)
        if (a2[r * T + j] != 0.0f) fail_msg("attention probability above the diagonal");
    }
    mega_attn_gemm_backward(be, &body_sm, g2 + qo, g2 + ko, g2 + vo, s2, dy, qkv + qo, qkv + ko,
                            qkv + vo, a2, &d);
    near(g2, g1, qkv_n, 1e-5, "attention dq, dk, dv");
  }
  free(qkv), free(dy), free(o1), free(o2), free(a1), free(a2), free(s1), free(s2), free(g1),
      free(g2);
}

/* GPT-2's fused qkv [N, 3C], and grouped-query attention (4 query heads
 * over 2 key/value heads) on Llama's separate q, k and v; each without and
 * with attention dropout. */
static void test_attention_composition(void **state) {
  (void)state;
  enum { Q = 4, KV = 2, HS = 5 };
  size_t nq = (size_t)N * Q * HS, nk = (size_t)N * KV * HS;
  for (int drop = 0; drop < 2; drop++) {
    double p = drop ? 0.3 : 0;
    attention_case(NH, NH, C / NH, (size_t)N * 3 * C, 0, C, 2 * C, 3 * C, 3 * C, p);
    attention_case(Q, KV, HS, nq + 2 * nk, 0, nq, nq + nk, Q * HS, KV * HS, p);
  }
}

/* The dropout body's bits are the cpu attention's: with v one-hot in the
 * key position (v[s, i] = 1 when i = s) the cpu's out[t, s] is the
 * probability (t, s) as it multiplied v, and with dout one-hot in the query
 * position its dv[s, t] is the one its backward drew for dv; both must equal
 * the body applied to the cpu's undropped probabilities, bit for bit. */
static void test_attention_dropout_bits(void **state) {
  (void)state;
  enum { HS = 8, LD = NH * HS }; /* HS >= T: a column for each position */
  mega_attn_dims d = {.B = B, .T = T, .NH = NH, .G = NH, .hs = HS, .ldq = LD, .ldkv = LD};
  d.drop = mega_attn_dropout_of(0.3, mega_dropout_key(9, 4, MEGA_DROP_ATTN_PROBS), 11, 2);
  size_t n = (size_t)N * LD, tt = (size_t)B * NH * T * T;
  float *q = vec(n, 41, 1), *k = vec(n, 42, 1), *v = calloc(n, 4), *dy = calloc(n, 4);
  for (int r = 0; r < N; r++)
    for (int h = 0; h < NH; h++) {
      v[(size_t)r * LD + h * HS + r % T] = 1.0f;
      dy[(size_t)r * LD + h * HS + r % T] = 1.0f;
    }
  float *out = calloc(n, 4), *att = calloc(tt, 4), *scr = calloc(tt + n, 4);
  float *dq = calloc(n, 4), *dk = calloc(n, 4), *dv = calloc(n, 4), *ad = calloc(tt, 4);
  be->ops->attention_forward(be, out, att, scr, q, k, v, &d);
  be->ops->attention_backward(be, dq, dk, dv, scr, dy, q, k, v, att, &d);
  body_dropout(be, ad, att, &d);
  int dropped = 0, kept = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int s = 0; s < T; s++) {
          float want = ad[(((size_t)b * NH + h) * T + t) * T + s];
          float fwd = out[((size_t)b * T + t) * LD + h * HS + s];
          float bwd = dv[((size_t)b * T + s) * LD + h * HS + t];
          if (fwd != want || bwd != want)
            fail_msg("b %d h %d t %d s %d: body %.9g, cpu forward %.9g, backward %.9g", b, h, t,
                     s, (double)want, (double)fwd, (double)bwd);
          if (s <= t) *(want == 0.0f ? &dropped : &kept) += 1;
        }
  /* p 0.3 of 168 causal probabilities (softmax's are never 0): some of each */
  assert_true(dropped > 20 && kept > 80);
  free(q), free(k), free(v), free(dy), free(out), free(att), free(scr), free(dq), free(dk),
      free(dv), free(ad);
}

static int setup(void **state) {
  (void)state;
  return mega_backend_cpu_create(NULL, &be, NULL) == MEGA_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  mega_backend_destroy(be);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_composition),
      cmocka_unit_test(test_attention_dropout_bits),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
