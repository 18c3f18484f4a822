/* The files a job names: GPT-2's vocabulary and merges (--vocab-file,
 * --merge-file), checked where the job is, and --data-path PREFIX.bin read
 * as the indexed dataset PREFIX. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "jobspec_fixture.h"

static void test_vocab_file(void **state) {
  (void)state;
  char dir[] = "/tmp/mega-test-vocab-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char vocab[256], merges[256];
  snprintf(vocab, sizeof vocab, "%s/gpt2-vocab.json", dir);
  snprintf(merges, sizeof merges, "%s/gpt2-merges.txt", dir);
  FILE *f = fopen(vocab, "w");
  fputs("{", f);
  for (int k = 0; k < 50256; k++) fprintf(f, "\"t%d\": %d, ", k, k);
  fputs("\"<|endoftext|>\": 50256}", f);
  fclose(f);
  f = fopen(merges, "w");
  fputs("#version: 0.2\n", f);
  fclose(f);
  mega_jobspec s;
  mega_err err = {0};
  /* Megatron's pretrain_gpt.py takes --vocab-file alone as GPT2BPETokenizer */
  make_spec(&s, ARGV("--vocab-file", vocab, "--merge-file", merges));
  assert_int_equal(mega_jobspec_tokenizer(&s), MEGA_TOKENIZER_GPT2BPE);
  assert_int_equal(mega_jobspec_load_vocab(&s, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_tokenizer_vocab(&s), 50257);
  assert_int_equal(mega_jobspec_padded_vocab(&s), 50304);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab), 1,
                     -1, "GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json) and "
                         "--merge-file");
  expect_check_error(ARGV("--vocab-file", vocab, "--merge-file", merges, "--vocab-size", "9"),
                     1, -1, "--vocab-size is NullTokenizer's");
  make_spec(&s, ARGV("--vocab-file", merges, "--merge-file", merges));
  assert_int_equal(mega_jobspec_load_vocab(&s, &err), MEGA_ERR_IO);
  expect_msg(&err, "--vocab-file");
  mega_jobspec_free(&s);
  unlink(vocab);
  unlink(merges);
  rmdir(dir);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* load_vocab on these two files: MEGA_OK, or the error with want in it. */
static void expect_files(char *vocab, char *merges, mega_status want_st,
                         const char *want) {
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, ARGV("--vocab-file", vocab, "--merge-file", merges));
  assert_int_equal(mega_jobspec_load_vocab(&s, &err), want_st);
  if (want) expect_msg(&err, want);
  mega_jobspec_free(&s);
}

/* A tokenizer file that is not GPT-2's stops the job where it is checked,
 * not megaw generate after the training: vocab.json's ids are 0..n-1 once
 * each, merges.txt is there and one "A B" a line. */
static void test_bad_tokenizer_files(void **state) {
  (void)state;
  char dir[] = "/tmp/mega-test-tokfiles-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char vocab[256], bad[256], merges[256], other[256], missing[256];
  snprintf(vocab, sizeof vocab, "%s/vocab.json", dir);
  snprintf(bad, sizeof bad, "%s/bad-vocab.json", dir);
  snprintf(merges, sizeof merges, "%s/merges.txt", dir);
  snprintf(other, sizeof other, "%s/other.txt", dir);
  snprintf(missing, sizeof missing, "%s/no-such-merges.txt", dir);
  write_file(vocab, "{\"a\": 0, \"b\": 1, \"ab\": 2, \"<|endoftext|>\": 3}");
  write_file(merges, "#version: 0.2\na b\n\n");
  expect_files(vocab, merges, MEGA_OK, NULL);

  expect_files(vocab, missing, MEGA_ERR_IO, "cannot read --merge-file");
  write_file(other, "#version: 0.2\na b\nThis License applies to any program\n");
  expect_files(vocab, other, MEGA_ERR_INVALID, "line 3 is not a merge \"A B\"");
  expect_files(vocab, vocab, MEGA_ERR_INVALID, "line 1 is not a merge");
  write_file(other, "a\n");
  expect_files(vocab, other, MEGA_ERR_INVALID, "line 1 is not a merge");

  write_file(bad, "{\"a\": 0, \"b\": 0}");
  expect_files(bad, merges, MEGA_ERR_INVALID, "id 0 appears twice");
  write_file(bad, "{\"a\": 0, \"b\": 5}");
  expect_files(bad, merges, MEGA_ERR_INVALID, "\"b\" has no id from 0 to 1");
  write_file(bad, "{\"a\": \"x\"}");
  expect_files(bad, merges, MEGA_ERR_INVALID, "\"a\" has no id from 0 to 0");
  const char *files[] = {vocab, bad, merges, other};
  for (size_t k = 0; k < sizeof files / sizeof *files; k++) unlink(files[k]);
  rmdir(dir);
}

static void test_prefix_bin(void **state) {
  (void)state;
  char dir[] = "/tmp/mega-test-prefix-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char prefix[256], bin[300], idx[300], lone[300], note[1024];
  snprintf(prefix, sizeof prefix, "%s/corpus_text_document", dir);
  snprintf(bin, sizeof bin, "%s.bin", prefix);
  snprintf(idx, sizeof idx, "%s.idx", prefix);
  snprintf(lone, sizeof lone, "%s/other.idx", dir);
  write_file(bin, "x");
  write_file(idx, "x");
  write_file(lone, "x");
  mega_jobspec s;
  mega_err err = {0};
  /* the .bin (or .idx) of a pair reads as its prefix, and says so */
  make_spec(&s, ARGV("--data-path", bin));
  assert_int_equal(mega_jobspec_fix_data_paths(&s, true, note, sizeof note, &err), MEGA_OK);
  assert_string_equal(s.data_path.v[0], prefix);
  assert_non_null(strstr(note, "names one file of the indexed dataset"));
  assert_non_null(strstr(note, "give the prefix, as Megatron does"));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--data-path", "0.5", idx, "0.5", "plain.txt"));
  assert_int_equal(mega_jobspec_fix_data_paths(&s, true, note, sizeof note, &err), MEGA_OK);
  assert_string_equal(s.data_path.v[1], prefix);
  assert_string_equal(s.data_path.v[3], "plain.txt");
  mega_jobspec_free(&s);
  /* without rewriting (megad's admission): refused with the prefix */
  make_spec(&s, ARGV("--data-path", bin));
  assert_int_equal(mega_jobspec_fix_data_paths(&s, false, NULL, 0, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "give the prefix, --data-path ");
  expect_msg(&err, prefix);
  assert_string_equal(s.data_path.v[0], bin);
  mega_jobspec_free(&s);
  /* an index without its .bin would train on the index's bytes: refused */
  make_spec(&s, ARGV("--data-path", lone));
  assert_int_equal(mega_jobspec_fix_data_paths(&s, true, note, sizeof note, &err),
                   MEGA_ERR_INVALID);
  expect_msg(&err, "is the index of an indexed dataset, but ");
  expect_msg(&err, "other.bin is not there");
  mega_jobspec_free(&s);
  /* a .bin without an index is a plain file, read as bytes as before */
  unlink(idx);
  make_spec(&s, ARGV("--data-path", bin));
  assert_int_equal(mega_jobspec_fix_data_paths(&s, true, note, sizeof note, &err), MEGA_OK);
  assert_string_equal(s.data_path.v[0], bin);
  assert_string_equal(note, "");
  mega_jobspec_free(&s);
  unlink(bin);
  unlink(idx);
  unlink(lone);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vocab_file),
      cmocka_unit_test(test_bad_tokenizer_files),
      cmocka_unit_test(test_prefix_bin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
