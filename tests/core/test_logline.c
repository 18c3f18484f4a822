/* Megatron's log line (core/logline.h): when it is due, its fields and
 * throughput, the validation block, and --log-throughput's FLOPs for GPT-2
 * and Llama against Megatron's formula. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "core/logline.h"
#include "jobspec_fixture.h"

static void test_logline(void **state) {
  (void)state;
  mega_jobspec s;
  /* GPT-2 124M as Megatron counts it: 6 x T x (L (2 h 4h + 3h^2 + h T + h^2) + h V) a sample */
  make_spec(&s, ARGV("--num-layers", "12", "--hidden-size", "768", "--num-attention-heads",
                     "12", "--seq-length", "1024", "--tokenizer-type", "NullTokenizer",
                     "--vocab-size", "50256", "--log-throughput", "--log-interval", "2"));
  double h = 768, T = 1024, L = 12, V = 50304;
  double want = 8 * 6 * T * (L * (8 * h * h + 3 * h * h + h * T + h * h) + h * V);
  assert_true(fabs(mega_jobspec_flops(&s, 8) - want) <= 1e-9 * want);
  assert_false(mega_logline_due(&s, 1));
  assert_true(mega_logline_due(&s, 2));
  assert_true(mega_logline_due(&s, 10)); /* the last iteration */
  mega_logline l = {0};
  /* 200 tokens an iteration at 0.5, 1.5 and 1 s: 600 tokens in 3 s, 200 a
   * second (the mean of the rates, 400, 133 and 200, would say 244) */
  mega_logline_add(&l, true, 3.0, false, 0.5, 400);
  mega_logline_add(&l, true, 5.0, false, 1.5, 200 / 1.5);
  mega_logline_add(&l, true, NAN, true, 1.0, 200);
  char line[1024];
  mega_logline_step st = {.iteration = 2, .world = 4, .global_batch = 8, .lr = 1.5e-4,
                          .grad_norm = 1.23456, .has_grad_norm = true};
  mega_logline_format(&l, &s, &st, line, sizeof line);
  char thr[64];
  snprintf(thr, sizeof thr, "throughput per GPU (TFLOP/s/GPU): %.1f |", want / (1.0 * 1e12 * 4));
  assert_non_null(strstr(line, "] iteration        2/      10 | consumed samples:           16 "
                               "| elapsed time per iteration (ms): 1000.0 | "));
  assert_non_null(strstr(line, thr));
  assert_non_null(strstr(line, " learning rate: 1.500000E-04 | global batch size:     8 | lm "
                               "loss: 4.000000E+00 | loss scale: 1.0 | grad norm: 1.235 | "
                               "number of skipped iterations:   1 | number of nan "
                               "iterations:   1 | tokens per second: 200 |\n"));
  assert_int_equal(l.iters, 0); /* restarted */
  char block[512];
  mega_logline_eval(100, 2.0, block, sizeof block);
  assert_non_null(strstr(block, "\n validation loss at iteration 100 | lm loss value: "
                                "2.000000E+00 | lm loss PPL: 7.389056E+00 | \n-"));
  assert_true(block[0] == '-');
  mega_jobspec_free(&s);
}

/* Megatron's num_floating_point_operations in its own arrangement, 12 B T L h^2
 * ((1 + G/H + T/2h) q/h + ffn/h x glu + V/2Lh), q = kv-channels x heads; the
 * implementation sums the GEMMs one by one. */
static double megatron_flops(double B, double T, double L, double h, double H, double G,
                             double kv, double ffn, bool swiglu, double V) {
  double q = kv * H, glu = swiglu ? 1.5 : 1.0;
  return 12 * B * T * L * h * h *
         ((1 + G / H + T / h / 2) * (q / h) + ffn / h * glu + V / (2 * L * h));
}

/* --log-throughput's FLOPs for Llama configurations: SwiGLU's three GEMMs,
 * grouped-query attention's smaller k and v, --ffn-hidden-size and
 * --kv-channels all count, as in Megatron. */
static void test_flops_llama(void **state) {
  (void)state;
  mega_jobspec s;
  /* Llama-3 8B's shape: 8 query groups, ffn 14336, untied; NullTokenizer's
   * 128256 tokens and its end of document padded to 128384 */
  make_spec(&s, ARGV("--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads",
                     "32", "--seq-length", "8192", "--position-embedding-type", "rope",
                     "--normalization", "RMSNorm", "--swiglu", "--group-query-attention",
                     "--num-query-groups", "8", "--ffn-hidden-size", "14336",
                     "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                     "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256"));
  double want = megatron_flops(16, 8192, 32, 4096, 32, 8, 128, 14336, true, 128384);
  assert_true(fabs(mega_jobspec_flops(&s, 16) - want) <= 1e-9 * want);
  mega_jobspec_free(&s);
  /* SwiGLU's default width (int(8h/3 / 64) x 64 = 5440 at 2048), heads of 128
   * channels over a 2048-wide model (--kv-channels), one query group */
  make_spec(&s, ARGV("--num-layers", "4", "--hidden-size", "2048", "--num-attention-heads",
                     "8", "--kv-channels", "128", "--seq-length", "1024",
                     "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                     "--swiglu", "--group-query-attention", "--tokenizer-type",
                     "NullTokenizer", "--vocab-size", "1000"));
  want = megatron_flops(4, 1024, 4, 2048, 8, 1, 128, 5440, true, 1024);
  assert_true(fabs(mega_jobspec_flops(&s, 4) - want) <= 1e-9 * want);
  mega_jobspec_free(&s);
  /* GPT-2 is the same formula with G = H, q = h, ffn = 4h */
  make_spec(&s, ARGV("--num-layers", "12", "--hidden-size", "768", "--num-attention-heads",
                     "12", "--seq-length", "1024", "--tokenizer-type", "NullTokenizer",
                     "--vocab-size", "50256"));
  want = megatron_flops(8, 1024, 12, 768, 12, 12, 64, 3072, false, 50304);
  assert_true(fabs(mega_jobspec_flops(&s, 8) - want) <= 1e-9 * want);
  mega_jobspec_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logline),
      cmocka_unit_test(test_flops_llama),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
