/* --bf16's numerics on the cpu backend: the shared rounding to bf16
 * (kernels/elementwise.h: to nearest, ties to even), the kernel body the
 * cuda backend's conversion runs, and the matmuls under set_bf16, which
 * must equal fp32 matmuls of rounded inputs exactly (a product of two bf16
 * values is exact in fp32, so only the inputs change). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/gpt_bodies.h"
#include "worker/backend/backend.h"

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static void test_rounding(void **state) {
  (void)state;
  /* exact values stay */
  assert_int_equal(mega_bf16_bits(1.0f), 0x3f80);
  assert_int_equal(mega_bf16_bits(-2.0f), 0xc000);
  assert_int_equal(mega_bf16_bits(0.0f), 0x0000);
  assert_int_equal(mega_bf16_bits(-0.0f), 0x8000);
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (down) */
  assert_int_equal(mega_bf16_bits(from_bits(0x3f808000u)), 0x3f80);
  /* 1 + 3*2^-8 is halfway between 0x3f81 (odd) and 0x3f82: to even (up) */
  assert_int_equal(mega_bf16_bits(from_bits(0x3f818000u)), 0x3f82);
  /* just above and below halfway */
  assert_int_equal(mega_bf16_bits(from_bits(0x3f808001u)), 0x3f81);
  assert_int_equal(mega_bf16_bits(from_bits(0x3f807fffu)), 0x3f80);
  assert_int_equal(mega_bf16_bits(from_bits(0xbf808001u)), 0xbf81); /* negative: magnitude */
  /* a carry into the exponent: 0x3fffffff rounds up to 2.0 */
  assert_int_equal(mega_bf16_bits(from_bits(0x3fffffffu)), 0x4000);
  /* overflow rounds to infinity; infinities and NaNs stay */
  assert_int_equal(mega_bf16_bits(FLT_MAX), 0x7f80);
  assert_int_equal(mega_bf16_bits(INFINITY), 0x7f80);
  assert_int_equal(mega_bf16_bits(-INFINITY), 0xff80);
  uint16_t nan = mega_bf16_bits(NAN);
  assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
  /* a NaN whose payload is only in the low bits must not become infinity */
  uint16_t low = mega_bf16_bits(from_bits(0x7f800001u));
  assert_true((low & 0x7f80) == 0x7f80 && (low & 0x7f) != 0);
  /* subnormals round like any other value */
  assert_int_equal(mega_bf16_bits(from_bits(0x00008000u)), 0x0000); /* tie, to even 0 */
  assert_int_equal(mega_bf16_bits(from_bits(0x00018000u)), 0x0002);
  /* back to float, and the round trip */
  assert_true(mega_bf16_to_float(0x3f82) == 1.015625f);
  assert_true(mega_bf16_round(1.01f) == 1.0078125f);
  /* every rounding is within half a bf16 ulp: 2^-8 of the value at most */
  uint32_t seed = 1;
  for (int i = 0; i < 100000; i++) {
    seed = seed * 1664525u + 1013904223u;
    float x = from_bits((seed & 0x807fffffu) | 0x3f000000u) * 37.0f; /* [~18, ~37] */
    float r = mega_bf16_round(x);
    assert_true(fabsf(r - x) <= fabsf(x) * 0x1p-8f);
    assert_int_equal(bits_of(r) & 0xffffu, 0);
  }
}

static void test_kernel_body(void **state) {
  (void)state;
  float in[5] = {1.0f, from_bits(0x3f808000u), from_bits(0x3f818000u), -3.14159f, NAN};
  uint16_t out[5];
  for (int64_t i = 0; i < 5; i++) mega_kb_to_bf16(i, out, in);
  for (int i = 0; i < 5; i++) assert_int_equal(out[i], mega_bf16_bits(in[i]));
  /* and back, a 3 x 4 block between row strides (cuDNN attention's
   * gradients, 3 columns of 7, into rows of 5): the padding is not touched */
  uint16_t src[3 * 7], copy[3 * 5];
  float dst[3 * 5];
  for (int i = 0; i < 3 * 7; i++) src[i] = (uint16_t)(0x3f80 + 3 * i);
  for (int i = 0; i < 3 * 5; i++) dst[i] = -9.0f, copy[i] = 0xdead;
  for (int64_t i = 0; i < 3 * 4; i++) mega_kb_from_bf16(i, dst, copy, 5, src, 7, 4);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 5; c++) {
      assert_true(dst[r * 5 + c] == (c < 4 ? mega_bf16_to_float(src[r * 7 + c]) : -9.0f));
      /* the copy for the next GEMM: the very bits read, laid out as dst */
      assert_int_equal(copy[r * 5 + c], c < 4 ? src[r * 7 + c] : 0xdead);
    }
  for (int64_t i = 0; i < 3 * 4; i++) mega_kb_from_bf16(i, dst, NULL, 5, src, 7, 4);
}

static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 2.0f;
  }
}

static float *rounded(const float *x, size_t n) {
  float *r = malloc(n * sizeof *r);
  for (size_t i = 0; i < n; i++) r[i] = mega_bf16_round(x[i]);
  return r;
}

/* Under set_bf16, each matmul equals the fp32 matmul of rounded inputs bit
 * for bit, and differs from the fp32 matmul of the inputs themselves. */
static void test_matmuls(void **state) {
  (void)state;
  enum { N = 37, C = 24, OC = 40 };
  mega_backend *be;
  mega_err err = {0};
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  float x[N * C], w[C * OC], dy[N * OC], bias[OC];
  fill(x, N * C, 1);
  fill(w, C * OC, 2);
  fill(dy, N * OC, 3);
  fill(bias, OC, 4);
  float *xr = rounded(x, N * C), *wr = rounded(w, C * OC), *dyr = rounded(dy, N * OC);
  for (int lay = 0; lay < 2; lay++) {
    float a[N * OC], b[N * OC], c[N * OC];
    assert_int_equal(be->ops->set_bf16(be, true, &err), MEGA_OK);
    be->ops->matmul_forward(be, a, x, w, bias, NULL, N, C, OC, lay);
    assert_int_equal(be->ops->set_bf16(be, false, &err), MEGA_OK);
    be->ops->matmul_forward(be, b, xr, wr, bias, NULL, N, C, OC, lay);
    be->ops->matmul_forward(be, c, x, w, bias, NULL, N, C, OC, lay);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);

    float da[N * C], db[N * C];
    assert_int_equal(be->ops->set_bf16(be, true, &err), MEGA_OK);
    be->ops->matmul_backward_input(be, da, dy, w, N, C, OC, lay, false);
    assert_int_equal(be->ops->set_bf16(be, false, &err), MEGA_OK);
    be->ops->matmul_backward_input(be, db, dyr, wr, N, C, OC, lay, false);
    assert_memory_equal(da, db, sizeof da);

    float dwa[C * OC], dwb[C * OC], dba[OC], dbb[OC];
    for (int i = 0; i < C * OC; i++) dwa[i] = dwb[i] = 0.5f; /* they accumulate */
    memset(dba, 0, sizeof dba);
    memset(dbb, 0, sizeof dbb);
    assert_int_equal(be->ops->set_bf16(be, true, &err), MEGA_OK);
    be->ops->matmul_backward_weight(be, dwa, dba, dy, x, N, C, OC, lay);
    assert_int_equal(be->ops->set_bf16(be, false, &err), MEGA_OK);
    be->ops->matmul_backward_weight(be, dwb, NULL, dyr, xr, N, C, OC, lay);
    assert_memory_equal(dwa, dwb, sizeof dwa);
    /* the bias gradient sums the gradient the GEMM read, rounded (as
     * cuBLASLt's bias-gradient epilogue does), not the fp32 one */
    float dbc[OC];
    memset(dbc, 0, sizeof dbc);
    be->ops->matmul_backward_weight(be, dwb, dbb, dyr, xr, N, C, OC, lay);
    assert_memory_equal(dba, dbb, sizeof dba);
    be->ops->matmul_backward_weight(be, dwb, dbc, dy, x, N, C, OC, lay);
    assert_memory_not_equal(dba, dbc, sizeof dba);
  }
  assert_int_equal(be->ops->synchronize(be, &err), MEGA_OK);
  free(xr);
  free(wr);
  free(dyr);
  mega_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_kernel_body),
      cmocka_unit_test(test_matmuls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
