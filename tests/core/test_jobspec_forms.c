/* The job spec's forms: --data-path's three shapes and the other data
 * flags, argv round trips, copies and equality, and JSON (checkpoints and
 * the journal keep specs as JSON). The parse and check rules are in
 * test_jobspec.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/jobspec.h"
#include "core/schedule.h"
#include "jobspec_fixture.h"

/* --data-path's three forms, --split, the tokenizer and the padded vocabulary */
static void test_data_flags(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  /* Megatron's one-file blend */
  make_spec(&s, ARGV("--data-path", "1.0", "FILE", "--seed", "7"));
  assert_int_equal(s.seed, 7);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_data_count(&s), 1);
  assert_string_equal(mega_jobspec_data_prefix(&s, 0), "FILE");
  assert_true(mega_jobspec_data_weight(&s, 0) == 1.0);
  assert_string_equal(mega_jobspec_data_single(&s), "FILE");
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--data-path", "0.3", "web", "0.7", "books"));
  assert_int_equal(mega_jobspec_check(&s, 1, 5, &err), MEGA_OK); /* bytes: not one file */
  assert_int_equal(mega_jobspec_data_count(&s), 2);
  assert_string_equal(mega_jobspec_data_prefix(&s, 1), "books");
  assert_true(mega_jobspec_data_weight(&s, 1) == 0.7);
  assert_null(mega_jobspec_data_single(&s));
  assert_null(mega_jobspec_data_prefix(&s, 2));
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--data-path", "a", "b"), 1, -1, "'a' is not a weight");
  expect_check_error(ARGV("--data-path", "0.3", "a", "0.7"), 1, -1, "has 3 words");
  expect_check_error(ARGV("--data-path", "0", "a", "1", "b"), 1, -1,
                     "the weight of a is 0; weights must be greater than 0");
  expect_parse_error(ARGV("--data-path"), MEGA_ERR_INVALID, "--data-path needs a value");
  expect_parse_error(ARGV("--data-path", "--lr", "1"), MEGA_ERR_INVALID, "--data-path needs a value");

  /* the training and evaluation data apart */
  mega_jobspec_free(&s);
  mega_jobspec_defaults(&s);
  char *const tv[] = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                      "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
                      "--train-iters", "10", "--lr", "0.001", "--train-data-path", "0.5", "a",
                      "0.5", "b", "--valid-data-path", "c", "--eval-interval", "5"};
  assert_int_equal(mega_jobspec_parse(&s, (int)(sizeof tv / sizeof tv[0]), tv, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_data_count(&s), 2);
  assert_string_equal(mega_jobspec_data_prefix(&s, 1), "b");
  const char *flag;
  assert_string_equal(mega_jobspec_data_file(&s, 1, &flag), "b");
  assert_string_equal(flag, "--train-data-path");
  assert_string_equal(mega_jobspec_data_file(&s, 2, &flag), "c");
  assert_string_equal(flag, "--valid-data-path");
  assert_null(mega_jobspec_data_file(&s, 3, NULL));
  s.eval_interval = 0; /* evaluated after training only, as Megatron's do_valid */
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  s.eval_iters = 0; /* then it would read nothing */
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--valid-data-path is what evaluation reads; give --eval-interval N and "
                   "--eval-iters N");
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--train-data-path", "t"), 1, -1,
                     "--data-path and --train-data-path exclude each other");
  expect_check_error(ARGV("--valid-data-path", "v", "--eval-interval", "5"), 1, -1,
                     "--valid-data-path needs --train-data-path");
  expect_check_error(ARGV("--train-data-path", "1", "t", "--split", "9,1"), 1, -1,
                     "exclude each other"); /* base's --data-path comes first */
  expect_check_error(ARGV("--valid-data-path", "0.3", "v", "w"), 1, -1,
                     "--valid-data-path has 3 words");

  /* --split */
  make_spec(&s, ARGV("--split", "969, 30, 1"));
  double sh[3];
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(fabs(sh[0] - 0.969) < 1e-15 && fabs(sh[1] - 0.03) < 1e-15 && fabs(sh[2] - 0.001) < 1e-15);
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--split", "90/10"));
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(sh[0] == 0.9 && sh[1] == 0.1 && sh[2] == 0);
  mega_jobspec_free(&s);
  make_spec(&s, NULL, 0);
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(sh[0] == 1 && sh[1] == 0 && sh[2] == 0);
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--split", "1,2,3,4"), 1, -1, "expected up to three non-negative");
  expect_check_error(ARGV("--split", "a"), 1, -1, "expected up to three non-negative");
  expect_check_error(ARGV("--split", "-1,2"), 1, -1, "expected up to three non-negative");
  expect_check_error(ARGV("--split", "0,0"), 1, -1, "the shares add up to 0");
  expect_check_error(ARGV("--split", "0,1"), 1, -1, "leaves no documents for training");
  expect_check_error(ARGV("--split", "1,0,1", "--eval-interval", "5"), 1, -1,
                     "has no valid share, which --eval-interval reads");

  /* the tokenizer and Megatron's padding */
  expect_check_error(ARGV("--tokenizer-type", "NullTokenizer"), 1, -1, "needs --vocab-size N");
  expect_check_error(ARGV("--vocab-size", "100"), 1, -1, "--vocab-size needs --tokenizer-type");
  expect_parse_error(ARGV("--tokenizer-type", "GPT2"), MEGA_ERR_INVALID,
                     "--tokenizer-type: 'GPT2' is not one of NullTokenizer, GPT2BPETokenizer");
  make_spec(&s, NULL, 0);
  assert_int_equal(mega_jobspec_tokenizer_vocab(&s), 256);
  assert_int_equal(mega_jobspec_padded_vocab(&s), 256);
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--tokenizer-type", "NullTokenizer", "--vocab-size", "50257"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_tokenizer_vocab(&s), 50258); /* ids 0..50257, EOD last */
  assert_int_equal(mega_jobspec_padded_vocab(&s), 50304);
  s.tensor_model_parallel_size = 2;
  assert_int_equal(mega_jobspec_padded_vocab(&s), 50432); /* a multiple of 256 */
  s.tensor_model_parallel_size = 1;
  s.make_vocab_size_divisible_by = 1;
  assert_int_equal(mega_jobspec_padded_vocab(&s), 50258);
  mega_jobspec_free(&s);

  /* a blend travels as argv words and back */
  make_spec(&s, ARGV("--data-path", "0.3", "a b", "0.7", "-c"));
  int argc;
  char **argv = mega_jobspec_to_argv(&s, &argc);
  mega_jobspec back;
  mega_jobspec_defaults(&back);
  assert_int_equal(mega_jobspec_parse(&back, argc, argv, &err), MEGA_OK);
  assert_true(mega_jobspec_equal(&s, &back));
  assert_int_equal(back.data_path.n, 4);
  assert_string_equal(back.data_path.v[3], "-c");
  mega_jobspec_argv_free(argv);
  mega_jobspec_free(&back);
  mega_jobspec_free(&s);
}

/* --data-order: file by default; megatron parses, travels as argv and
 * JSON (with --data-cache-path), and is refused where Megatron's order
 * would not be what it says; --data-cache-path is refused without it. */
static void test_data_order(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, NULL, 0);
  assert_int_equal(s.data_order, MEGA_DATA_ORDER_FILE);
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--data-order", "megatron", "--split", "100,0,0", "--data-cache-path",
                     "/cache/dir"));
  assert_int_equal(s.data_order, MEGA_DATA_ORDER_MEGATRON);
  assert_string_equal(s.data_cache_path, "/cache/dir");
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  int argc;
  char **argv = mega_jobspec_to_argv(&s, &argc);
  mega_jobspec back;
  mega_jobspec_defaults(&back);
  assert_int_equal(mega_jobspec_parse(&back, argc, argv, &err), MEGA_OK);
  assert_int_equal(back.data_order, MEGA_DATA_ORDER_MEGATRON);
  assert_string_equal(back.data_cache_path, "/cache/dir");
  assert_true(mega_jobspec_equal(&s, &back));
  mega_jobspec_argv_free(argv);
  mega_jobspec_free(&back);
  mega_jobspec_free(&s);
  /* file order has no index to cache: the flag would change nothing */
  expect_check_error(ARGV("--data-cache-path", "/cache/dir"), 1, -1,
                     "--data-cache-path caches Megatron's order's sample index, but file order "
                     "(--data-order file) has none to cache: give --data-order megatron or drop "
                     "--data-cache-path");
  expect_parse_error(ARGV("--data-order", "shuffled"), MEGA_ERR_INVALID,
                     "--data-order: 'shuffled' is not one of file, megatron");
  expect_check_error(ARGV("--data-order", "megatron"), 1, -1,
                     "--data-order megatron with --data-path needs --split: Megatron reads a "
                     "missing --split as 969,30,1");
  /* evaluation needs Megatron's validation data */
  char *const tv[] = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                      "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
                      "--train-iters", "10", "--lr", "0.001", "--train-data-path", "t",
                      "--eval-interval", "5", "--data-order", "megatron"};
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_jobspec_parse(&s, (int)(sizeof tv / sizeof tv[0]), tv, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--data-order megatron evaluates only on Megatron's validation data: give "
                   "--valid-data-path, or drop --eval-interval");
  s.eval_interval = 0; /* no evaluation: fine */
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  s.data_order = MEGA_DATA_ORDER_FILE; /* mega's own evaluation from the stream's end */
  s.eval_interval = 5;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  mega_jobspec_free(&s);
}

static void test_argv_round_trip(void **state) {
  (void)state;
  mega_jobspec s, back;
  mega_err err = {0};

  /* defaults give no words at all */
  mega_jobspec_defaults(&s);
  int argc = -1;
  char **argv = mega_jobspec_to_argv(&s, &argc);
  assert_non_null(argv);
  assert_int_equal(argc, 0);
  assert_null(argv[0]);
  mega_jobspec_argv_free(argv);

  /* the base job gives back its own flags, in table order */
  make_spec(&s, NULL, 0);
  argv = mega_jobspec_to_argv(&s, &argc);
  assert_int_equal(argc, BASE_ARGC);
  for (int k = 0; k < BASE_ARGC; k++) assert_string_equal(argv[k], base_argv[k]);
  assert_null(argv[argc]);
  mega_jobspec_argv_free(argv);
  mega_jobspec_free(&s);

  make_full(&s);
  argv = mega_jobspec_to_argv(&s, &argc);
  assert_non_null(argv);
  mega_jobspec_defaults(&back);
  if (mega_jobspec_parse(&back, argc, argv, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_true(mega_jobspec_equal(&s, &back));
  assert_true(back.lr == 0.30000000000000004);
  assert_true(back.min_lr == 1e-300);
  assert_string_equal(back.load, "-weird dir");
  /* every non-required flag was emitted (each is away from its default) */
  int flags = 0;
  for (int k = 0; k < argc; k++) flags += strncmp(argv[k], "--", 2) == 0;
  assert_int_equal(flags, mega_jobspec_flag_count());
  mega_jobspec_argv_free(argv);

  /* a single change gives a single flag */
  back.blas_threads = 1;
  assert_false(mega_jobspec_equal(&s, &back));
  mega_jobspec_free(&back);
  mega_jobspec_defaults(&back);
  back.overlap_grad_reduce = true;
  back.lr = 0.1;
  argv = mega_jobspec_to_argv(&back, &argc);
  assert_int_equal(argc, 3);
  assert_string_equal(argv[0], "--lr");
  assert_string_equal(argv[1], "0.1");
  assert_string_equal(argv[2], "--overlap-grad-reduce");
  mega_jobspec_argv_free(argv);
  mega_jobspec_argv_free(NULL);
  mega_jobspec_free(&back);
  mega_jobspec_free(&s);
}

static void test_copy_equal(void **state) {
  (void)state;
  mega_jobspec s, c;
  mega_err err = {0};
  make_full(&s);
  assert_int_equal(mega_jobspec_copy(&c, &s, &err), MEGA_OK);
  assert_true(mega_jobspec_equal(&s, &c));
  assert_ptr_not_equal(c.data_path.v[0], s.data_path.v[0]);
  c.data_path.v[0][0] = 'X';
  assert_false(mega_jobspec_equal(&s, &c));
  mega_jobspec_free(&c);
  mega_jobspec_defaults(&c);
  mega_jobspec d;
  mega_jobspec_defaults(&d);
  assert_true(mega_jobspec_equal(&c, &d)); /* NAN lr equals NAN lr */
  mega_jobspec_free(&s);
  mega_jobspec_free(&s); /* free resets to defaults: a second free is harmless */
  mega_jobspec_free(NULL);
}

static void test_json(void **state) {
  (void)state;
  mega_jobspec s, back;
  mega_err err = {0};
  make_spec(&s, ARGV("--schedule", "1f1b", "--overlap-grad-reduce"));
  json_t *j = mega_jobspec_to_json(&s);
  assert_non_null(j);
  assert_int_equal(json_object_size(j), (size_t)mega_jobspec_flag_count());
  assert_int_equal(json_integer_value(json_object_get(j, "hidden_size")), 64);
  assert_true(json_real_value(json_object_get(j, "lr")) == 0.001);
  json_t *dp = json_object_get(j, "data_path");
  assert_int_equal(json_array_size(dp), 1);
  assert_string_equal(json_string_value(json_array_get(dp, 0)), "/tmp/x");
  assert_string_equal(json_string_value(json_object_get(j, "lr_decay_style")), "linear");
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "1f1b");
  assert_true(json_is_true(json_object_get(j, "overlap_grad_reduce")));
  assert_true(json_is_false(json_object_get(j, "save_initial")));
  assert_true(json_is_null(json_object_get(j, "max_position_embeddings")));
  assert_true(json_is_null(json_object_get(j, "recompute_granularity")));
  assert_true(json_is_null(json_object_get(j, "save")));
  assert_true(json_is_null(json_object_get(j, "bucket_size")));
  assert_int_equal(json_integer_value(json_object_get(j, "eval_interval")), 0);

  /* through text and back */
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  json_error_t jerr;
  j = json_loads(text, 0, &jerr);
  free(text);
  assert_non_null(j);
  mega_jobspec_defaults(&back);
  assert_int_equal(mega_jobspec_from_json(&back, j, &err), MEGA_OK);
  assert_true(mega_jobspec_equal(&s, &back));
  json_decref(j);
  mega_jobspec_free(&back);
  mega_jobspec_free(&s);

  make_full(&s);
  j = mega_jobspec_to_json(&s);
  mega_jobspec_defaults(&back);
  assert_int_equal(mega_jobspec_from_json(&back, j, &err), MEGA_OK);
  assert_true(mega_jobspec_equal(&s, &back));
  json_decref(j);
  mega_jobspec_free(&back);

  /* the defaults: required fields and absent values are null */
  mega_jobspec_defaults(&back);
  j = mega_jobspec_to_json(&back);
  assert_true(json_is_null(json_object_get(j, "num_layers")));
  assert_true(json_is_null(json_object_get(j, "lr")));
  assert_true(json_is_null(json_object_get(j, "data_path")));
  assert_int_equal(json_integer_value(json_object_get(j, "seed")), 1234);
  /* null resets a value to its default */
  assert_int_equal(mega_jobspec_from_json(&s, j, &err), MEGA_OK);
  assert_true(mega_jobspec_equal(&s, &back));
  json_decref(j);
  mega_jobspec_free(&s);
  mega_jobspec_free(&back);
}

static void expect_json_error(const char *text, const char *want) {
  mega_jobspec s;
  mega_err err = {0};
  json_error_t jerr;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
  assert_non_null(j);
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_jobspec_from_json(&s, j, &err), MEGA_ERR_INVALID);
  expect_msg(&err, want);
  json_decref(j);
  mega_jobspec_free(&s);
}

static void test_json_errors(void **state) {
  (void)state;
  expect_json_error("[1]", "a job spec in JSON must be an object");
  expect_json_error("{\"hidden_sise\": 64}", "unknown job spec key \"hidden_sise\"");
  expect_json_error("{\"hidden_size\": \"64\"}", "--hidden-size (JSON key \"hidden_size\") must be an integer");
  expect_json_error("{\"hidden_size\": 1.5}", "must be an integer");
  expect_json_error("{\"hidden_size\": 0}", "--hidden-size must be at least 1 (got 0)");
  expect_json_error("{\"hidden_size\": 4294967296}", "--hidden-size: 4294967296 is out of range");
  expect_json_error("{\"lr\": \"fast\"}", "--lr (JSON key \"lr\") must be a number");
  expect_json_error("{\"lr\": -1}", "--lr must be at least 0 (got -1)");
  expect_json_error("{\"save_initial\": 1}", "must be true or false");
  expect_json_error("{\"schedule\": \"fast\"}", "--schedule: 'fast' is not one of");
  expect_json_error("{\"schedule\": 2}", "--schedule (JSON key \"schedule\") must be a string");
  expect_json_error("{\"data_path\": \"\"}", "--data-path: the value is empty");
  expect_json_error("{\"data_path\": 3}", "must be an array of strings");
  expect_json_error("{\"data_path\": []}", "must be an array of strings");
  expect_json_error("{\"data_path\": [\"0.5\", 2]}", "must be an array of strings");
  expect_json_error("{\"data_path\": [\"0.5\", \"--x\"]}", "write a path like that as ./--x");

  /* Found by fuzzing (fuzz_jobspec): a --data-path that was not UTF-8 was
   * taken, then mega_jobspec_to_json failed (a checkpoint's trainer_state.json
   * could not be written). It is refused where it comes in. */
  mega_jobspec bad;
  mega_jobspec_defaults(&bad);
  char *argv[] = {"--data-path", "/tmp/\x82iny.txt"};
  mega_err e = {0};
  assert_int_equal(mega_jobspec_parse(&bad, 2, argv, &e), MEGA_ERR_INVALID);
  assert_non_null(strstr(e.msg, "--data-path: the value is not valid UTF-8"));
  char *ok[] = {"--data-path", "/tmp/caf\xc3\xa9.txt"};
  assert_int_equal(mega_jobspec_parse(&bad, 2, ok, &e), MEGA_OK);
  json_t *bj = mega_jobspec_to_json(&bad);
  assert_non_null(bj);
  json_decref(bj);
  mega_jobspec_free(&bad);

  /* ints are accepted for float fields */
  mega_jobspec s;
  mega_err err = {0};
  json_error_t jerr;
  json_t *j = json_loads("{\"lr\": 1, \"save\": null}", 0, &jerr);
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_jobspec_from_json(&s, j, &err), MEGA_OK);
  assert_true(s.lr == 1.0);
  assert_null(s.save);
  json_decref(j);
  mega_jobspec_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_data_flags),     cmocka_unit_test(test_data_order),
      cmocka_unit_test(test_argv_round_trip),
      cmocka_unit_test(test_copy_equal),     cmocka_unit_test(test_json),
      cmocka_unit_test(test_json_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
