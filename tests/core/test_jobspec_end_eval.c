/* The evaluation after training as the job spec sees it: which data it
 * reads (--split's shares, --valid-data-path), what it needs, and what
 * the start-up note promises. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jobspec_fixture.h"

/* the base job, its --data-path swapped for training and valid paths */
static void make_split_paths(mega_jobspec *s, char *const *extra, int n) {
  make_spec(s, NULL, 0);
  for (int k = 0; k < s->data_path.n; k++) free(s->data_path.v[k]);
  free(s->data_path.v);
  s->data_path = (mega_strlist){0};
  mega_err err = {0};
  if (mega_jobspec_parse(s, PARSE_ARGS("--train-data-path", "t", "--valid-data-path", "v"),
                         &err) != MEGA_OK ||
      (n && mega_jobspec_parse(s, n, extra, &err) != MEGA_OK))
    fail_msg("%s", err.msg);
}

/* Megatron evaluates a --valid-data-path after training with no
 * --eval-interval (do_valid: a valid dataloader and --eval-iters > 0), as
 * mega does a --split's valid share. */
static void test_valid_path_without_interval(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  char note[512];
  make_split_paths(&s, ARGV("--eval-iters", "3"));
  if (mega_jobspec_check(&s, 1, -1, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_false(mega_jobspec_evaluates(&s));
  assert_true(mega_jobspec_evaluates_at_end(&s));
  assert_false(mega_jobspec_tests_at_end(&s)); /* no --split, no test share */
  assert_int_equal(mega_jobspec_eval_batches(&s), 3);
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  if (!strstr(note, "only the end of training evaluates") || !strstr(note, "--valid-data-path"))
    fail_msg("note: %s", note);
  mega_jobspec_free(&s);
  /* --eval-iters 0 turns all evaluation off: --valid-data-path would do
   * nothing, which mega refuses, saying both ways to use it */
  make_split_paths(&s, ARGV("--eval-iters", "0"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--eval-iters N (0 turns evaluation off)");
  expect_msg(&err, "or --eval-iters N alone for the evaluation after training only");
  mega_jobspec_free(&s);
}

/* base + extra flags give a note holding want (or, want NULL, none
 * holding "test share") */
static void expect_note(char *const *extra, int n, const char *want) {
  mega_jobspec s;
  char note[512];
  make_spec(&s, extra, n);
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  if (want ? !strstr(note, want) : strstr(note, "test share") != NULL)
    fail_msg("note: %s", note);
  mega_jobspec_free(&s);
}

/* The note is written before the data is read: a test share too short
 * for one window gives no test set, so it promises the test evaluation
 * only on that condition, and says who tells. */
static void test_note_on_a_short_test_share(void **state) {
  (void)state;
  expect_note(ARGV("--eval-interval", "5", "--split", "949,50,1"),
              "the test share is evaluated once, after the last iteration, unless it holds "
              "fewer than --seq-length 32 + 1 tokens in a dataset (rank 0 then says it skips "
              "it)");
  expect_note(ARGV("--split", "8,1,1", "--eval-iters", "3"),
              "and then on the test share of --split 8,1,1 unless it holds fewer than "
              "--seq-length 32 + 1 tokens");
  expect_note(ARGV("--split", "9,1,0", "--eval-iters", "3"), NULL); /* no test share */
  expect_note(ARGV("--split", "9,1,0", "--eval-interval", "5"), NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_path_without_interval),
      cmocka_unit_test(test_note_on_a_short_test_share),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
