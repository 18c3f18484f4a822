/* cuDNN's attention graphs (worker/backend/cudnn_sdpa.h) as far as they go
 * without a device: libcudnn.so.9 loads, every tensor and operation of
 * the forward and the backward graph finalizes (cuDNN checks each
 * operation's shapes then, a matmul's inner sizes among them), for
 * GPT-2's layout and others; a bad shape fails with a message, not
 * cuDNN's crash; a handle without a device fails with cuDNN's reason.
 * Whether an engine takes the graph, and its numbers, are
 * test_cuda_backend's (suite gpu). Skipped (77) without cuDNN 9. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "worker/backend/cudnn_sdpa.h"

static const mega_cudnn *api;

/* The fused [N, 3C] qkv of GPT-2 (and its bf16 gradient copy), separate
 * q, k, v, a head size of 128, T not a multiple of the tiles. */
static const mega_sdpa_shape shapes[] = {
    {.B = 8, .T = 1024, .NH = 12, .G = 12, .hs = 64, .ldq = 2304, .ldkv = 2304, .ldo = 768,
     .ldg = 2304},
    {.B = 2, .T = 200, .NH = 4, .G = 4, .hs = 64, .ldq = 256, .ldkv = 256, .ldo = 256,
     .ldg = 768},
    {.B = 1, .T = 130, .NH = 2, .G = 2, .hs = 128, .ldq = 768, .ldkv = 768, .ldo = 256,
     .ldg = 768},
    /* grouped-query: Llama's 8 query heads over 2 K/V heads, fused and not */
    {.B = 2, .T = 256, .NH = 8, .G = 2, .hs = 64, .ldq = 768, .ldkv = 768, .ldo = 512,
     .ldg = 768},
    {.B = 2, .T = 200, .NH = 4, .G = 2, .hs = 64, .ldq = 256, .ldkv = 128, .ldo = 256,
     .ldg = 512},
};

static void test_graphs_build(void **state) {
  (void)state;
  char why[400];
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    mega_sdpa_shape s = shapes[i];
    s.scale = 1.0f / 8.0f;
    mega_sdpa *f = mega_sdpa_build(api, &s, false, why, sizeof why);
    if (!f) fail_msg("forward, shape %zu: %s", i, why);
    /* Q K^T, scale, the mask's four, softmax's seven, P V */
    assert_int_equal(mega_sdpa_op_count(f), 14);
    mega_sdpa *b = mega_sdpa_build(api, &s, true, why, sizeof why);
    if (!b && s.T % 128 && mega_cudnn_version(api) <= 91500) { /* test_versions_refused */
      assert_non_null(strstr(why, "multiple of 128"));
      mega_sdpa_free(f);
      continue;
    }
    if (!b) fail_msg("backward, shape %zu: %s", i, why);
    /* D's three, Q K^T, scale, statistics, the mask's four, exp, P^T,
     * dV, dP, three for dS, dS^T, dK, K, dQ and its bf16 copy; with
     * fewer K/V heads, two sums over a group's heads */
    assert_int_equal(mega_sdpa_op_count(b), s.G == s.NH ? 22 : 24);
    mega_sdpa_free(f);
    mega_sdpa_free(b);
  }
}

/* Refused before cuDNN sees them: cuDNN 9.19 divides by zero (SIGFPE)
 * finalizing a reduction over T = 0. */
static void test_bad_shape_says_why(void **state) {
  (void)state;
  mega_sdpa_shape bad[6] = {shapes[0], shapes[0], shapes[0], shapes[0], shapes[0], shapes[0]};
  bad[0].T = 0, bad[1].hs = 0, bad[2].B = -1, bad[3].ldq = 700, bad[4].G = 5, bad[5].G = 0;
  for (int i = 0; i < 6; i++)
    for (int backward = 0; backward < 2; backward++) {
      char why[400] = "";
      assert_null(mega_sdpa_build(api, &bad[i], backward, why, sizeof why));
      assert_non_null(strstr(why, "need to be at least 1, G to divide NH"));
    }
}

/* cudnn-frontend's version rules: 9.10.0 and 9.10.1 refused both ways;
 * through 9.15 a backward over T not a multiple of 128 (frontend pads it
 * with a mask these graphs lack), from 9.16 any T. */
static void test_versions_refused(void **state) {
  (void)state;
  char why[400] = "";
  assert_false(mega_sdpa_version_takes(90900, 0, false, why, sizeof why));
  assert_false(mega_sdpa_version_takes(91001, 256, false, why, sizeof why));
  assert_non_null(strstr(why, "9.10.2"));
  assert_true(mega_sdpa_version_takes(91002, 200, false, why, sizeof why));
  assert_true(mega_sdpa_version_takes(91002, 256, true, why, sizeof why));
  assert_false(mega_sdpa_version_takes(91500, 200, true, why, sizeof why));
  assert_non_null(strstr(why, "multiple of 128"));
  assert_true(mega_sdpa_version_takes(91500, 1024, true, why, sizeof why));
  assert_false(mega_sdpa_version_takes(91501, 200, true, why, sizeof why)); /* a 9.15 patch */
  assert_true(mega_sdpa_version_takes(91600, 200, true, why, sizeof why));
  /* the library here passes; a refused one would have failed to load */
  assert_true(mega_sdpa_version_takes(mega_cudnn_version(api), 200, true, why, sizeof why) ==
              (mega_cudnn_version(api) >= 91600));
}

static void test_handle_needs_a_device(void **state) {
  (void)state;
  char why[400] = "";
  void *h = mega_cudnn_handle(api, NULL, why, sizeof why);
  if (h) { /* a machine with a device: test_cuda_backend's part */
    mega_cudnn_handle_free(api, h);
    skip();
  }
  assert_non_null(strstr(why, "creating a handle"));
}

int main(void) {
  char why[400];
  if (!(api = mega_cudnn_load(why, sizeof why))) {
    printf("skipped: %s\n", why);
    return 77;
  }
  size_t v = mega_cudnn_version(api);
  printf("# cuDNN %zu.%zu.%zu\n", v / 10000, v / 100 % 100, v % 100);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_graphs_build),
      cmocka_unit_test(test_bad_shape_says_why),
      cmocka_unit_test(test_versions_refused),
      cmocka_unit_test(test_handle_needs_a_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
