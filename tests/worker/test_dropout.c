/* Hidden dropout (kernels/dropout.h, backend.h's bias_dropout_add, the
 * model's three sites): the mask's statistics and determinism, its
 * independence across keys and samples, its invariance under the row
 * splits that sequence parallelism and microbatching make, and that a
 * forward without samples (evaluation, generation) is a model without
 * dropout while one with samples is not, for attention dropout too. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "kernels/dropout.h"

enum { ROWS = 4096, C = 64, N = ROWS * C };

static mega_backend *be;

static int setup(void **state) {
  (void)state;
  mega_backend_cpu_opts o = {.threads = 3}; /* the pool's uneven splits too */
  return mega_backend_cpu_create(&o, &be, NULL) == MEGA_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  mega_backend_destroy(be);
  return 0;
}

static float *ones(void) {
  float *x = malloc(N * sizeof *x);
  assert_non_null(x);
  for (int i = 0; i < N; i++) x[i] = 1.0f;
  return x;
}

/* The mask of d over ROWS rows of C ones: kept elements are the scale. */
static void mask_of(float *out, const mega_dropout *d) {
  float *x = ones();
  be->ops->bias_dropout_add(be, out, NULL, x, NULL, ROWS, C, d);
  free(x);
}

static double dropped(const float *m) {
  size_t z = 0;
  for (int i = 0; i < N; i++) z += m[i] == 0.0f;
  return (double)z / N;
}

/* Dropped fraction within 0.005 of p (over 262144 elements its standard
 * deviation is under 0.001), kept values exactly 1/(1-p), the same bits
 * every time. */
static void statistics(void **state) {
  (void)state;
  static const double ps[] = {0.1, 0.5, 0.9};
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  for (int k = 0; k < 3; k++) {
    mega_dropout d = mega_dropout_of(ps[k], mega_dropout_key(7, 3, MEGA_DROP_MLP), 100, 0, 16);
    mask_of(a, &d);
    double f = dropped(a);
    printf("# p %.1f: dropped %.5f\n", ps[k], f);
    if (fabs(f - ps[k]) > 0.005) fail_msg("p %g: dropped fraction %.5f", ps[k], f);
    float scale = (float)(1.0 / (1.0 - ps[k]));
    for (int i = 0; i < N; i++)
      if (a[i] != 0.0f && a[i] != scale) fail_msg("element %d is %.9g, not 0 or %.9g", i, a[i], scale);
    mask_of(b, &d);
    assert_memory_equal(a, b, N * sizeof *a);
  }
  /* the body itself, at the bit level: threshold round(p 2^32) */
  assert_int_equal(mega_dropout_threshold(0.0), 0);
  assert_int_equal(mega_dropout_threshold(0.5), 2147483648u);
  free(a);
  free(b);
}

/* Masks of other seeds, layers, sites and samples agree on about
 * 1 - 2p(1-p) of the elements (0.82 at p 0.1), as independent ones do. */
static void independence(void **state) {
  (void)state;
  const double p = 0.1, want = 1 - 2 * p * (1 - p);
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  mega_dropout base = mega_dropout_of(p, mega_dropout_key(7, 3, MEGA_DROP_MLP), 100, 0, 16);
  mega_dropout other[5] = {base, base, base, base, base};
  other[0].key = mega_dropout_key(8, 3, MEGA_DROP_MLP);       /* seed */
  other[1].key = mega_dropout_key(7, 4, MEGA_DROP_MLP);       /* layer */
  other[2].key = mega_dropout_key(7, 3, MEGA_DROP_ATTENTION); /* site */
  other[3].key = mega_dropout_key(7, -1, MEGA_DROP_EMBEDDING);
  other[4].sample0 = 100 + ROWS / 16;                         /* the next samples */
  mask_of(a, &base);
  for (int k = 0; k < 5; k++) {
    mask_of(b, &other[k]);
    size_t same = 0;
    for (int i = 0; i < N; i++) same += (a[i] == 0.0f) == (b[i] == 0.0f);
    double f = (double)same / N;
    if (fabs(f - want) > 0.01) fail_msg("key %d: masks agree on %.4f, want ~%.4f", k, f, want);
  }
  free(a);
  free(b);
}

/* A sequence-parallel rank's rows (row0) and a smaller microbatch (its
 * first sample) draw exactly the whole microbatch's elements; bias and
 * residual fold in as res + drop(y + bias), in place too. */
static void layout_invariance(void **state) {
  (void)state;
  const int T = 16, Bm = ROWS / T;
  float *y = malloc(N * sizeof *y), *res = malloc(N * sizeof *res), *bias = malloc(C * 4);
  float *whole = malloc(N * sizeof *whole), *part = malloc(N * sizeof *part);
  fx_normals(y, N, 1.0f, 1);
  fx_normals(res, N, 1.0f, 2);
  fx_normals(bias, C, 1.0f, 3);
  uint64_t key = mega_dropout_key(42, 0, MEGA_DROP_ATTENTION);
  mega_dropout d = mega_dropout_of(0.3, key, 64, 0, T);
  be->ops->bias_dropout_add(be, whole, res, y, bias, ROWS, C, &d);
  for (int i = 0; i < N; i++) {
    float v = y[i] + bias[i % C];
    if (whole[i] != res[i] && whole[i] != res[i] + v * d.scale)
      fail_msg("element %d: %.9g is neither res nor res + scaled (y + bias)", i, whole[i]);
  }
  /* four sequence-parallel ranks of the same microbatch */
  for (int r = 0; r < 4; r++) {
    size_t off = (size_t)r * (ROWS / 4) * C;
    mega_dropout dr = mega_dropout_of(0.3, key, 64, r * (ROWS / 4), T);
    be->ops->bias_dropout_add(be, part + off, res + off, y + off, bias, ROWS / 4, C, &dr);
  }
  assert_memory_equal(whole, part, N * sizeof *whole);
  /* the microbatch as two of half the samples, in place over y */
  memcpy(part, y, N * sizeof *part);
  for (int h = 0; h < 2; h++) {
    size_t off = (size_t)h * (ROWS / 2) * C;
    mega_dropout dh = mega_dropout_of(0.3, key, 64 + h * Bm / 2, 0, T);
    be->ops->bias_dropout_add(be, part + off, res + off, part + off, bias, ROWS / 2, C, &dh);
  }
  assert_memory_equal(whole, part, N * sizeof *whole);
  free(y);
  free(res);
  free(bias);
  free(whole);
  free(part);
}

/* The loss of a 2-layer GPT-2 (or Llama) with hidden_dropout p (with
 * attention_dropout p when attn), on one microbatch given first_sample
 * (negative: none). */
static double model_loss(fx_model m, bool attn, double p, int64_t first_sample) {
  mega_gpt_config cfg;
  fx_model_config(&cfg, 0.2f, m);
  *(attn ? &cfg.attention_dropout : &cfg.hidden_dropout) = p;
  mega_err err = {0};
  mega_gpt_stage *s;
  mega_gpt_stage_desc desc = {.embedding = true, .loss = true, .num_layers = 2};
  if (mega_gpt_stage_create(be, &cfg, &desc, &s, &err) != MEGA_OK) fail_msg("%s", err.msg);
  fx_probe pr;
  fx_probe_init(&pr, s, 2, 8, 5);
  if (first_sample >= 0) {
    /* set, then taken back for the forward: the last value counts */
    mega_gpt_acts_set_samples(pr.a, 99);
    mega_gpt_acts_set_samples(pr.a, first_sample);
  }
  double loss;
  fx_probe_forward(&pr, &loss);
  fx_probe_free(&pr);
  mega_gpt_stage_destroy(s);
  return loss;
}

/* Without samples (evaluation, megaw generate) a model with dropout is the
 * model without it, to the bit; with them its loss moves, with other
 * samples to another value, and a model of p 0 ignores them. */
static void training_only(void **state) {
  (void)state;
  for (int attn = 0; attn < 2; attn++)
    for (fx_model m = FX_GPT2; m <= FX_LLAMA; m++) {
      double none = model_loss(m, attn, 0.0, -1);
      assert_true(model_loss(m, attn, 0.3, -1) == none);
      assert_true(model_loss(m, attn, 0.0, 4) == none);
      double a = model_loss(m, attn, 0.3, 4), b = model_loss(m, attn, 0.3, 6);
      printf("# %s, %s dropout: loss %.6f without, %.6f and %.6f with\n",
             m == FX_GPT2 ? "gpt-2" : "llama", attn ? "attention" : "hidden", none, a, b);
      assert_true(a != none && b != none && a != b);
      assert_true(model_loss(m, attn, 0.3, 4) == a);
    }
  mega_gpt_config cfg;
  fx_config(&cfg, 0.2f);
  mega_err err = {0};
  cfg.hidden_dropout = 1.0;
  assert_int_equal(mega_gpt_config_check(&cfg, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "hidden_dropout must be in [0, 1)"));
  cfg.hidden_dropout = 0;
  cfg.attention_dropout = 1.0;
  assert_int_equal(mega_gpt_config_check(&cfg, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "attention_dropout must be in [0, 1)"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(statistics),
      cmocka_unit_test(independence),
      cmocka_unit_test(layout_invariance),
      cmocka_unit_test(training_only),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
