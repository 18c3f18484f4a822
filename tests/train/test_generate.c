/* megaw generate: greedy decoding is the argmax of one forward pass over
 * the prompt and what it wrote, the same every time; sampling follows its
 * seed; the program prints what the library computes.
 *
 *   test_generate MEGAW */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiny_model.h"
#include "worker/generate.h"

static const char *megaw;
static char dir[64];
static tu_model tm;

/* A tiny model (max_seq_len 8, byte vocabulary) saved as a checkpoint. */
static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/mega-test-generate-XXXXXX");
  if (!mkdtemp(dir) || !tu_model_make(&tm, 7, 2, 0.1)) return -1;
  mega_ckpt_state s = {.iteration = 1, .consumed_samples = 8, .optimizer_steps = 1};
  mega_err err = {0};
  if (mega_ckpt_save(dir, tm.be, &tm.cfg, NULL, &s, tm.cp, tm.n, NULL, &err) != MEGA_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_model_free(&tm);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static int argmax(const float *row, int n) {
  int best = 0;
  for (int v = 1; v < n; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

static void test_greedy_is_argmax_of_a_forward(void **state) {
  (void)state;
  mega_gen_model m;
  mega_err err = {0};
  assert_int_equal(mega_gen_load(dir, tm.be, &m, &err), MEGA_OK);
  assert_int_equal(m.tokenizer, MEGA_TOKENIZER_BYTES);
  assert_int_equal(m.vocab, 256);
  const int32_t prompt[3] = {'a', 'b', 'c'};
  mega_gen_opts o = {.max_new_tokens = 6};
  int32_t out[6], again[6];
  int n, n2;
  assert_int_equal(mega_gen_run(&m, prompt, 3, &o, out, &n, &err), MEGA_OK);
  assert_int_equal(n, 6);
  assert_int_equal(mega_gen_run(&m, prompt, 3, &o, again, &n2, &err), MEGA_OK);
  assert_memory_equal(out, again, sizeof out); /* deterministic */

  /* one forward over prompt + output[0..4]: 8 tokens, the whole context of
   * every step; position 2 + k predicts output[k] */
  int32_t seq[8];
  memcpy(seq, prompt, sizeof prompt);
  memcpy(seq + 3, out, 5 * sizeof *out);
  mega_gpt_acts *a;
  assert_int_equal(mega_gpt_acts_create(m.stage, 1, 8, &a, &err), MEGA_OK);
  assert_int_equal(mega_gpt_forward(m.stage, a, seq, NULL, NULL, NULL, NULL, &err), MEGA_OK);
  const float *logits = mega_gpt_acts_logits(a);
  for (int k = 0; k < 6; k++)
    assert_int_equal(out[k], argmax(logits + (size_t)(2 + k) * m.cfg.vocab_size, 256));
  mega_gpt_acts_destroy(a);

  /* past max_seq_len the context slides: still the argmax of its window */
  o.max_new_tokens = 9;
  int32_t longer[9];
  assert_int_equal(mega_gen_run(&m, prompt, 3, &o, longer, &n, &err), MEGA_OK);
  assert_memory_equal(longer, out, sizeof out);
  memcpy(seq, prompt + 2, sizeof *prompt);
  memcpy(seq + 1, longer, 7 * sizeof *longer);
  assert_int_equal(mega_gpt_acts_create(m.stage, 1, 8, &a, &err), MEGA_OK);
  assert_int_equal(mega_gpt_forward(m.stage, a, seq, NULL, NULL, NULL, NULL, &err), MEGA_OK);
  assert_int_equal(longer[8], argmax(mega_gpt_acts_logits(a) + 7 * (size_t)m.cfg.vocab_size, 256));
  mega_gpt_acts_destroy(a);

  /* bad prompts */
  const int32_t big[1] = {256};
  assert_int_equal(mega_gen_run(&m, big, 1, &o, out, &n, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "prompt token 0 is 256, outside the ids 0..255"));
  assert_int_equal(mega_gen_run(&m, prompt, 0, &o, out, &n, &err), MEGA_ERR_INVALID);

  /* a weight that is not finite: an error, not tokens picked from NaNs */
  float *p = mega_gpt_param_data(m.stage), nan = NAN; /* the cpu backend's: host memory */
  memcpy(p, &nan, sizeof nan);
  assert_int_equal(mega_gen_run(&m, prompt, 3, &o, out, &n, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "NaN logit") && !strstr(err.msg, "infinite logit")) fail_msg("%s", err.msg);
  assert_int_equal(n, 0);
  mega_gen_free(&m);
}

static void test_sampling(void **state) {
  (void)state;
  float logits[5] = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f};
  mega_gen_opts greedy = {0}, s = {.temperature = 1.0, .seed = 42};
  assert_int_equal(mega_gen_pick(logits, 5, &greedy, 0), 1);
  s.top_k = 1; /* only the likeliest is left */
  for (uint64_t k = 0; k < 20; k++) assert_int_equal(mega_gen_pick(logits, 5, &s, k), 1);
  s.top_k = 2; /* 1 or 2, both over many draws, never the rest */
  int seen[5] = {0};
  for (uint64_t k = 0; k < 200; k++) seen[mega_gen_pick(logits, 5, &s, k)]++;
  assert_true(seen[1] > 50 && seen[2] > 50 && seen[0] + seen[3] + seen[4] == 0);
  /* the same seed and step give the same draw */
  s.top_k = 0;
  for (uint64_t k = 0; k < 50; k++)
    assert_int_equal(mega_gen_pick(logits, 5, &s, k), mega_gen_pick(logits, 5, &s, k));
  /* a low temperature is nearly greedy */
  s.temperature = 0.01;
  for (uint64_t k = 0; k < 50; k++) assert_int_equal(mega_gen_pick(logits, 5, &s, k), 1);
}

/* megaw generate prints the prompt and the library's greedy continuation. */
static void test_program(void **state) {
  (void)state;
  mega_gen_model m;
  mega_err err = {0};
  /* a --load that is not there is named so, not as one without checkpoints */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/not-there", dir);
  assert_int_equal(mega_gen_load(missing, tm.be, &m, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "not-there: No such file or directory"));
  memset(&err, 0, sizeof err);
  assert_int_equal(mega_gen_load(dir, tm.be, &m, &err), MEGA_OK);
  const int32_t prompt[2] = {'h', 'i'};
  mega_gen_opts o = {.max_new_tokens = 5};
  int32_t out[5];
  int n;
  assert_int_equal(mega_gen_run(&m, prompt, 2, &o, out, &n, &err), MEGA_OK);
  mega_gen_free(&m);
  char want[16] = "hi";
  for (int k = 0; k < 5; k++) want[2 + k] = (char)out[k];
  want[7] = '\n';

  char cmd[256];
  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --max-new-tokens 5", megaw, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char got[16] = {0};
  size_t len = fread(got, 1, sizeof got, p);
  assert_int_equal(pclose(p), 0);
  assert_int_equal(len, 8);
  assert_memory_equal(got, want, 8);

  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --top-k x 2>&1", megaw, dir);
  p = popen(cmd, "r");
  char line[256] = {0};
  assert_non_null(fgets(line, sizeof line, p));
  assert_int_equal(WEXITSTATUS(pclose(p)), 2);
  assert_non_null(strstr(line, "megaw generate: --top-k: 'x' is not a whole number from 0 to"));
  /* a whole number past the range is refused with the range, not as "not a whole number" */
  snprintf(cmd, sizeof cmd,
           "%s generate --load %s --prompt hi --temperature 1 --seed 18446744073709551615 2>&1",
           megaw, dir);
  p = popen(cmd, "r");
  assert_non_null(fgets(line, sizeof line, p));
  assert_int_equal(WEXITSTATUS(pclose(p)), 2);
  assert_non_null(strstr(line, "'18446744073709551615' is not a whole number from 0 to 2^53"));
  /* greedy: a k or a seed would change nothing, so they are refused */
  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --top-k 5 2>&1", megaw, dir);
  p = popen(cmd, "r");
  assert_non_null(fgets(line, sizeof line, p));
  assert_int_equal(WEXITSTATUS(pclose(p)), 2);
  assert_non_null(strstr(line, "--top-k samples, so it needs --temperature above 0"));
  /* the text that cannot be written is a failure, not exit 0 */
  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --max-new-tokens 5 2>&1 >/dev/full",
           megaw, dir);
  p = popen(cmd, "r");
  assert_non_null(fgets(line, sizeof line, p));
  assert_int_equal(WEXITSTATUS(pclose(p)), 1);
  assert_non_null(strstr(line, "megaw generate: cannot write the text to stdout: No space left"));
}

/* A checkpoint whose optimizer.safetensors was deleted by hand (the
 * manifest still lists it) generates: only the weights are needed, and
 * megaw generate says the optimizer state is gone. Runs last: it deletes. */
static void test_without_optimizer_state(void **state) {
  (void)state;
  char cmd[512], want[16] = {0}, got[16] = {0};
  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --max-new-tokens 5", megaw, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t wlen = fread(want, 1, sizeof want, p);
  assert_int_equal(pclose(p), 0);
  char opt[128];
  snprintf(opt, sizeof opt, "%s/iter_0000001/optimizer.safetensors", dir);
  assert_int_equal(unlink(opt), 0);
  mega_gen_model m;
  mega_err err = {0};
  if (mega_gen_load(dir, tm.be, &m, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_non_null(m.notice);
  assert_non_null(strstr(m.notice, "optimizer.safetensors is missing"));
  assert_non_null(strstr(m.notice, "its weights load alone"));
  mega_gen_free(&m);
  snprintf(cmd, sizeof cmd, "%s generate --load %s --prompt hi --max-new-tokens 5 2>%s/err",
           megaw, dir, dir);
  p = popen(cmd, "r");
  assert_non_null(p);
  size_t len = fread(got, 1, sizeof got, p);
  assert_int_equal(pclose(p), 0);
  assert_int_equal(len, wlen);
  assert_memory_equal(got, want, len);
  snprintf(cmd, sizeof cmd, "grep -q 'megaw generate: .*no usable optimizer state' %s/err", dir);
  assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_generate MEGAW\n");
    return 2;
  }
  megaw = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_is_argmax_of_a_forward),
      cmocka_unit_test(test_sampling),
      cmocka_unit_test(test_program),
      cmocka_unit_test(test_without_optimizer_state),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
