/* The data order: windows, samples, DP ranks, microbatches, wraparound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/data.h"

static char path[64];

/* A file whose byte at offset i is i % 251, so every window is recognisable. */
static void write_file(size_t n) {
  strcpy(path, "/tmp/mega-test-data-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  for (size_t i = 0; i < n; i++) {
    uint8_t b = (uint8_t)(i % 251);
    assert_int_equal(write(fd, &b, 1), 1);
  }
  close(fd);
}

static void test_windows(void **state) {
  (void)state;
  write_file(41); /* T=8: K = floor(40/8) = 5 */
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open(path, 8, &d, &err), MEGA_OK);
  assert_int_equal(mega_data_size(d), 41);
  assert_int_equal(mega_data_windows(d), 5);
  long long sz;
  assert_int_equal(mega_data_file_size(path, &sz, &err), MEGA_OK);
  assert_int_equal(sz, 41);
  mega_data_close(d);
  unlink(path);

  write_file(40); /* 39/8 = 4: the last byte has no target */
  assert_int_equal(mega_data_open(path, 8, &d, &err), MEGA_OK);
  assert_int_equal(mega_data_windows(d), 4);
  mega_data_close(d);
  unlink(path);
}

static void test_samples_dp_micro_wrap(void **state) {
  (void)state;
  write_file(41); /* T=8, K=5 */
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open(path, 8, &d, &err), MEGA_OK);
  mega_batch_plan p;
  /* G=4, micro 1, DP 2: each rank has 2 microbatches of 1 sample. */
  assert_int_equal(mega_batch_plan_init(&p, 4, 1, 2, &err), MEGA_OK);
  assert_int_equal(p.num_micro, 2);

  /* iteration i sample j -> window (4i + j) mod 5 */
  assert_int_equal(mega_data_sample_window(d, 0, 4, 3), 3);
  assert_int_equal(mega_data_sample_window(d, 1, 4, 0), 4);
  assert_int_equal(mega_data_sample_window(d, 1, 4, 1), 0); /* wraps */
  assert_int_equal(mega_data_sample_window(d, 2, 4, 3), 1); /* 11 mod 5 */
  assert_int_equal(mega_data_sample_window(d, 1000000007LL, 4, 2), (4000000028LL + 2) % 5);

  int32_t tok[8], tgt[8];
  /* iteration 1, DP rank 0, micro 1 -> sample 1 -> window 0 (wrapped) */
  assert_int_equal(mega_data_microbatch(d, &p, 1, 0, 1, tok, tgt, &err), MEGA_OK);
  for (int t = 0; t < 8; t++) {
    assert_int_equal(tok[t], t);
    assert_int_equal(tgt[t], t + 1);
  }
  /* iteration 1, DP rank 1, micro 0 -> sample 2 -> window 1 */
  assert_int_equal(mega_data_microbatch(d, &p, 1, 1, 0, tok, tgt, &err), MEGA_OK);
  for (int t = 0; t < 8; t++) {
    assert_int_equal(tok[t], 8 + t);
    assert_int_equal(tgt[t], 9 + t);
  }
  /* window 4 is the last: its last target is byte 40 */
  assert_int_equal(mega_data_microbatch(d, &p, 1, 0, 0, tok, tgt, &err), MEGA_OK);
  assert_int_equal(tok[0], 32);
  assert_int_equal(tgt[7], 40);

  /* out of range */
  assert_int_equal(mega_data_microbatch(d, &p, 0, 2, 0, tok, tgt, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_data_microbatch(d, &p, 0, 0, 2, tok, tgt, &err), MEGA_ERR_INVALID);
  mega_data_close(d);
  unlink(path);
}

static void test_microbatch_rows(void **state) {
  (void)state;
  write_file(1 + 4 * 10); /* T=4, K=10 */
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open(path, 4, &d, &err), MEGA_OK);
  mega_batch_plan p;
  /* G=12, micro 2, DP 3: rank d has samples [4d, 4d+4), 2 microbatches. */
  assert_int_equal(mega_batch_plan_init(&p, 12, 2, 3, &err), MEGA_OK);
  assert_int_equal(p.num_micro, 2);
  assert_int_equal(mega_batch_first_sample(&p, 2, 1), 10);
  int32_t tok[8], tgt[8];
  /* iteration 3, rank 2, micro 1: samples 10, 11 -> windows 46%10=6, 7 */
  assert_int_equal(mega_data_microbatch(d, &p, 3, 2, 1, tok, tgt, &err), MEGA_OK);
  assert_int_equal(tok[0], 24);
  assert_int_equal(tok[3], 27);
  assert_int_equal(tgt[3], 28);
  assert_int_equal(tok[4], 28);
  assert_int_equal(tgt[7], 32);

  /* The union over ranks and microbatches is the whole batch, in order. */
  mega_batch_plan one;
  assert_int_equal(mega_batch_plan_init(&one, 12, 12, 1, &err), MEGA_OK);
  int32_t all[48], allt[48];
  assert_int_equal(mega_data_microbatch(d, &one, 3, 0, 0, all, allt, &err), MEGA_OK);
  for (int r = 0; r < 3; r++)
    for (int m = 0; m < 2; m++) {
      assert_int_equal(mega_data_microbatch(d, &p, 3, r, m, tok, tgt, &err), MEGA_OK);
      int s0 = mega_batch_first_sample(&p, r, m);
      assert_memory_equal(tok, all + s0 * 4, sizeof tok);
      assert_memory_equal(tgt, allt + s0 * 4, sizeof tgt);
    }
  mega_data_close(d);
  unlink(path);
}

/* A rampup plan (worker/data/data.h): from iteration iter0 on, iteration
 * i's first sample is sample0 + (i - iter0) G, so a batch that grows keeps
 * the samples in order: no sample is skipped or read twice. */
static void test_plan_after_rampup(void **state) {
  (void)state;
  write_file(1 + 4 * 10); /* T=4, K=10 */
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open(path, 4, &d, &err), MEGA_OK);
  /* iterations 0..2 took 2 samples each (6 in all); from iteration 3 on, 4 */
  mega_batch_plan p;
  assert_int_equal(mega_batch_plan_init(&p, 4, 2, 2, &err), MEGA_OK);
  p.iter0 = 3;
  p.sample0 = 6;
  assert_int_equal(mega_batch_plan_start(&p, 3), 6);
  assert_int_equal(mega_batch_plan_start(&p, 5), 14);
  int32_t tok[8], tgt[8];
  /* iteration 4, DP rank 1: samples 10 + 2, 10 + 3 -> windows 2, 3 */
  assert_int_equal(mega_data_microbatch(d, &p, 4, 1, 0, tok, tgt, &err), MEGA_OK);
  assert_int_equal(tok[0], 8);
  assert_int_equal(tgt[3], 12);
  assert_int_equal(tok[4], 12);
  /* --variable-seq-lengths counts microbatches from the iteration's first
   * sample: (sample0 + (i - iter0) G) / b + k */
  assert_int_equal(mega_data_variable_seq_len(16, &p, 4, 2), 16 - ((10 / 2 + 1) % 4) * 2);
  mega_data_close(d);
  unlink(path);
}

static void test_errors(void **state) {
  (void)state;
  mega_err err = {0};
  mega_batch_plan p;
  assert_int_equal(mega_batch_plan_init(&p, 10, 4, 1, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "multiple"));
  assert_int_equal(mega_batch_plan_init(&p, 8, 2, 3, &err), MEGA_ERR_INVALID);

  mega_data *d = NULL;
  assert_int_equal(mega_data_open("/nonexistent/mega-data", 8, &d, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/mega-data"));
  assert_null(d);
  write_file(8); /* one window of 8 needs 9 bytes */
  assert_int_equal(mega_data_open(path, 8, &d, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "fewer than one window"));
  assert_int_equal(mega_data_open(path, 7, &d, &err), MEGA_OK);
  assert_int_equal(mega_data_windows(d), 1);
  mega_data_close(d);
  unlink(path);
  write_file(0);
  assert_int_equal(mega_data_open(path, 1, &d, &err), MEGA_ERR_INVALID);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_windows),
      cmocka_unit_test(test_samples_dp_micro_wrap),
      cmocka_unit_test(test_microbatch_rows),
      cmocka_unit_test(test_plan_after_rampup),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
