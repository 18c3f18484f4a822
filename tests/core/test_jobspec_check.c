/* mega_jobspec_check: the combinations it accepts, the fields it needs,
 * and every refusal's message. */
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

static void test_check_ok(void **state) {
  (void)state;
  expect_check_ok(NULL, 0, 1, -1);
  expect_check_ok(NULL, 0, 0, 33);
  expect_check_ok(ARGV("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"),
                  8, 1 << 20);
  expect_check_ok(ARGV("--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
                       "2", "--overlap-p2p-comm", "--overlap-p2p-comm-warmup-flush"),
                  2, -1);
  expect_check_ok(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                       "Et|t|t|tL"),
                  2, -1);
  expect_check_ok(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                       "Et|t|t|tL", "--virtual-pipeline-model-parallel-size", "2"),
                  2, -1);
  expect_check_ok(ARGV("--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers",
                       "0", "--decoder-last-pipeline-num-layers", "2"),
                  3, -1);
  expect_check_ok(ARGV("--simulate-compute", "1.5:3:0", "--trace-iteration", "10", "--schedule",
                       "gpipe"),
                  1, -1);
  expect_check_ok(ARGV("--save", "/c", "--save-interval", "5", "--save-initial"), 1, -1);
  expect_check_ok(ARGV("--max-position-embeddings", "32", "--lr-warmup-iters", "9"), 1, -1);
  expect_check_ok(ARGV("--overlap-grad-reduce", "--align-grad-reduce", "--bucket-size", "1000",
                       "--use-distributed-optimizer", "--overlap-param-gather",
                       "--average-in-collective"),
                  2, -1);
}

static void test_check_required(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "invalid job: --num-layers is required");
  mega_jobspec_free(&s);

  /* drop each required flag from the base job in turn */
  for (int k = 0; k < BASE_ARGC; k += 2) {
    char *argv[BASE_ARGC];
    int n = 0;
    for (int j = 0; j < BASE_ARGC; j += 2)
      if (j != k) argv[n++] = (char *)base_argv[j], argv[n++] = (char *)base_argv[j + 1];
    mega_jobspec_defaults(&s);
    assert_int_equal(mega_jobspec_parse(&s, n, argv, &err), MEGA_OK);
    assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof want, "invalid job: %s is required", base_argv[k]);
    assert_true(!strncmp(err.msg, want, strlen(want))); /* "(or --train-samples)" may follow */
    /* Megatron defaults it to micro x DP: a script leaving it out hears the value to give */
    if (!strcmp(base_argv[k], "--global-batch-size"))
      expect_msg(&err, "Megatron's default, --micro-batch-size × data-parallel size, is not "
                       "mega's: give --global-batch-size N");
    mega_jobspec_free(&s);
  }
}

/* Values that parse refuses can still arrive in a struct built by code. */
static void test_check_fields(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, NULL, 0);
  s.hidden_size = -5;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "invalid job: --hidden-size must be at least 1 (got -5)");
  s.hidden_size = 64;
  s.tensor_model_parallel_size = 0;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "invalid job: --tensor-model-parallel-size must be at least 1 (got 0)");
  s.tensor_model_parallel_size = 1;
  s.lr = -1;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "invalid job: --lr must be at least 0 (got -1)");
  s.lr = INFINITY;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--lr must be a finite number");
  s.lr = 0.001;
  s.lr_decay_style = 7;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg,
                      "invalid job: --lr-decay-style has no choice number 7; it takes "
                      "constant|linear|cosine|inverse-square-root|WSD");
  s.lr_decay_style = MEGA_LR_COSINE;
  s.schedule = -2;
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--schedule has no choice number -2");
  s.schedule = MEGA_JOB_SCHEDULE_AUTO;
  s.save = strdup("");
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "invalid job: --save is empty");
  assert_int_equal(mega_jobspec_check(&s, -1, -1, NULL), MEGA_ERR_INVALID); /* NULL err is fine */
  mega_jobspec_free(&s);
}

static void test_check_errors(void **state) {
  (void)state;
  expect_check_error(NULL, 0, -1, -1, "world size must be at least 1 (got -1)");
  expect_check_error(ARGV("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"),
                     6, -1, "invalid job: world size 6 is not divisible by TP·PP = 4");
  expect_check_error(ARGV("--num-attention-heads", "6"), 1, -1,
                     "--hidden-size 64 is not divisible by --num-attention-heads 6");
  expect_check_error(ARGV("--tensor-model-parallel-size", "8", "--hidden-size", "64"), 8, -1,
                     "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 8");
  expect_check_error(ARGV("--max-position-embeddings", "16"), 1, -1,
                     "--seq-length 32 is longer than --max-position-embeddings 16");
  expect_check_error(NULL, 0, 1, 32,
                     "the data file /tmp/x has 32 bytes, fewer than one window of --seq-length + 1 = 33 bytes");
  expect_check_error(NULL, 0, 1, 0, "has 0 bytes");
  expect_check_error(ARGV("--global-batch-size", "6"), 2, -1,
                     "--global-batch-size 6 is not divisible by --micro-batch-size 2 × data-parallel size 2 = 4");
  expect_check_error(ARGV("--global-batch-size", "7"), 0, -1,
                     "--global-batch-size 7 is not divisible by --micro-batch-size 2");
  expect_check_error(ARGV("--min-lr", "0.01"), 1, -1, "--min-lr 0.01 is larger than --lr 0.001");
  expect_check_error(ARGV("--lr-warmup-iters", "10"), 1, -1,
                     "--lr-warmup-iters 10 must be less than the decay iterations 10");
  expect_check_error(ARGV("--lr-warmup-iters", "10", "--lr-decay-iters", "5"), 1, -1,
                     "--lr-warmup-iters 10 must be less than the decay iterations 5");
  expect_check_error(ARGV("--tokenizer-type", "NullTokenizer", "--vocab-size", "20000000"), 1, -1,
                     "--vocab-size 20000000 pads to 20000128 rows, more than the 16777216");
  expect_check_error(ARGV("--normalization", "RMSNorm", "--swiglu", "--position-embedding-type",
                          "rope", "--kv-channels", "4096", "--num-attention-heads", "2048",
                          "--hidden-size", "4096"),
                     1, -1, "--kv-channels 4096 x --num-attention-heads 2048 is larger than");
  expect_check_error(ARGV("--save-interval", "5"), 1, -1, "--save-interval needs --save DIR");
  expect_check_error(ARGV("--save-initial"), 1, -1, "--save-initial needs --save DIR");
  expect_check_error(ARGV("--async-save"), 1, -1, "--async-save needs --save DIR");
  /* Megatron's load flags */
  static const char *const load_flags[] = {"--finetune", "--no-load-optim", "--no-load-rng",
                                           "--override-opt_param-scheduler",
                                           "--use-checkpoint-opt_param-scheduler",
                                           "--exit-on-missing-checkpoint"};
  for (size_t i = 0; i < sizeof load_flags / sizeof load_flags[0]; i++) {
    char want[96];
    snprintf(want, sizeof want, "%s needs --load DIR", load_flags[i]);
    char *flag = (char *)load_flags[i];
    expect_check_error(ARGV(flag), 1, -1, want);
    expect_check_ok(ARGV(flag, "--load", "/l"), 1, -1);
  }
  expect_check_error(ARGV("--load", "/l", "--override-opt_param-scheduler",
                          "--use-checkpoint-opt_param-scheduler"),
                     1, -1, "exclude each other");
  expect_check_error(ARGV("--load", "/l", "--finetune", "--use-checkpoint-opt_param-scheduler"),
                     1, -1, "cannot be used with --finetune");
  expect_check_error(ARGV("--load", "/l", "--no-load-optim",
                          "--use-checkpoint-opt_param-scheduler"),
                     1, -1, "cannot be used with --no-load-optim");
  expect_check_ok(ARGV("--load", "/l", "--no-load-optim", "--override-opt_param-scheduler",
                       "--no-load-rng"), 1, -1);
  expect_check_ok(ARGV("--save", "/s", "--async-save"), 1, -1);
  expect_check_error(ARGV("--trace-iteration", "11"), 1, -1,
                     "--trace-iteration 11 is past the last iteration, 10");

  /* virtual pipeline and layouts */
  expect_check_error(ARGV("--virtual-pipeline-model-parallel-size", "2"), 1, -1,
                     "a virtual pipeline (VP = 2) needs --pipeline-model-parallel-size > 1");
  expect_check_error(ARGV("--num-layers-per-virtual-pipeline-stage", "2"), 1, -1,
                     "a virtual pipeline (VP = 2) needs --pipeline-model-parallel-size > 1");
  expect_check_error(ARGV("--pipeline-model-parallel-layout", "Et|tttL"), 1, -1,
                     "the layout's 2 stages at PP = 1 make a virtual pipeline (VP = 2)");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Etx|L"),
                     2, -1, "invalid job: --pipeline-model-parallel-layout: column 3: unknown letter 'x'");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Et|t|tL"),
                     2, -1, "--pipeline-model-parallel-layout: the layout has 3 stages, which is not a multiple");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Ett|tttL"),
                     2, -1, "--pipeline-model-parallel-layout has 5 decoder layers ('t') but --num-layers is 4");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Et|t|t|tL", "--virtual-pipeline-model-parallel-size", "3"),
                     2, -1,
                     "--virtual-pipeline-model-parallel-size 3 disagrees with the layout, whose 4 stages at PP = 2 mean VP = 2");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Ett|ttmL"),
                     2, -1, "has 1 multi-token prediction layer ('m')");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Ett|ttL", "--decoder-first-pipeline-num-layers", "2"),
                     2, -1,
                     "--pipeline-model-parallel-layout cannot be combined with --decoder-first-pipeline-num-layers");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                          "Ett|ttL", "--num-layers-per-virtual-pipeline-stage", "1"),
                     2, -1,
                     "--pipeline-model-parallel-layout cannot be combined with --num-layers-per-virtual-pipeline-stage");
  /* a stage with nothing to build is refused at submit, not by the ranks at
   * start (Megatron's functional test uneven_pipeline, scaled to 4 layers) */
  expect_check_error(ARGV("--pipeline-model-parallel-size", "4",
                          "--decoder-first-pipeline-num-layers", "2",
                          "--decoder-last-pipeline-num-layers", "2"),
                     4, -1,
                     "pipeline rank 1 would build nothing (no decoder layer, embedding or loss) in "
                     "the layout Ett|||ttL: give more --num-layers, a smaller "
                     "--pipeline-model-parallel-size, or fewer "
                     "--decoder-first/last-pipeline-num-layers");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout",
                          "Ett|tt||L"),
                     4, -1, "pipeline rank 2 would build nothing");
  /* data-parallel flags that only mean something together */
  expect_check_error(ARGV("--align-grad-reduce"), 2, -1,
                     "--align-grad-reduce needs --overlap-grad-reduce");
  expect_check_error(ARGV("--bucket-size", "1000"), 2, -1, "--bucket-size needs --overlap-grad-reduce");
  expect_check_error(ARGV("--overlap-param-gather", "--overlap-grad-reduce"), 2, -1,
                     "--overlap-param-gather needs --use-distributed-optimizer");
  expect_check_error(ARGV("--overlap-param-gather", "--use-distributed-optimizer"), 2, -1,
                     "--overlap-param-gather needs --overlap-grad-reduce");
  expect_check_error(ARGV("--no-optimizer-shard-copy"), 2, -1,
                     "--no-optimizer-shard-copy needs --use-distributed-optimizer");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "3"), 3, -1,
                     "invalid job: --num-layers 4 is not divisible by the pipeline size PP = 3");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size",
                          "4"),
                     2, -1, "pipeline rank 0's 2 layers are not divisible by the virtual pipeline size VP = 4");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "3", "--num-layers", "5",
                          "--decoder-first-pipeline-num-layers", "2"),
                     3, -1, "leaves 3 layers, which are not divisible by the 2 other pipeline ranks");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--num-layers", "8",
                          "--num-layers-per-virtual-pipeline-stage", "3"),
                     2, -1,
                     "the 4 layers per pipeline rank (--num-layers 8 / PP 2) are not divisible by --num-layers-per-virtual-pipeline-stage 3");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--num-layers", "7",
                          "--num-layers-per-virtual-pipeline-stage", "1"),
                     2, -1, "--num-layers 7 is not divisible by --pipeline-model-parallel-size 2");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--num-layers", "8",
                          "--num-layers-per-virtual-pipeline-stage", "2",
                          "--virtual-pipeline-model-parallel-size", "4"),
                     2, -1,
                     "--virtual-pipeline-model-parallel-size 4 disagrees with --num-layers-per-virtual-pipeline-stage 2, which gives VP = 2");
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                          "1", "--decoder-last-pipeline-num-layers", "2"),
                     2, -1,
                     "--num-layers-per-virtual-pipeline-stage cannot be combined with --decoder-last-pipeline-num-layers");

  /* a flag of the interleaved schedule, refused without its virtual pipeline */
  expect_check_error(ARGV("--pipeline-model-parallel-size", "2",
                          "--microbatch-group-size-per-vp-stage", "2"),
                     2, -1, "--microbatch-group-size-per-vp-stage groups the microbatches of the "
                            "interleaved schedule's model chunks, which needs a virtual pipeline");
  expect_check_ok(ARGV("--pipeline-model-parallel-size", "2", "--num-layers", "4",
                       "--num-layers-per-virtual-pipeline-stage", "1",
                       "--microbatch-group-size-per-vp-stage", "2"), 2, -1);

  /* P2P rules */
  expect_check_error(ARGV("--overlap-p2p-comm-warmup-flush"), 1, -1,
                     "--overlap-p2p-comm-warmup-flush needs --overlap-p2p-comm");
  expect_check_error(ARGV("--overlap-p2p-comm-warmup-flush", "--overlap-p2p-comm", "--batch-p2p-comm"),
                     1, -1, "--overlap-p2p-comm-warmup-flush cannot be used with --batch-p2p-comm");
  expect_check_error(ARGV("--overlap-p2p-comm", "--batch-p2p-comm"), 1, -1,
                     "--overlap-p2p-comm cannot be used with --batch-p2p-comm");

  /* --simulate-compute */
  expect_check_error(ARGV("--simulate-compute", "1:x"), 1, -1,
                     "invalid job: --simulate-compute B_MS: 'x' is not a number");
  expect_check_error(ARGV("--simulate-compute", "1:2", "--save", "/c"), 1, -1,
                     "invalid job: --simulate-compute trains nothing, so there is nothing to "
                     "--save; drop one of them");
  expect_check_error(ARGV("--simulate-compute", "1"), 1, -1,
                     "--simulate-compute '1': expected F_MS:B_MS or F_MS:B_MS:W_MS");
  expect_check_error(ARGV("--simulate-compute", "1:2:3:4"), 1, -1, "expected F_MS:B_MS or F_MS:B_MS:W_MS");
  expect_check_error(ARGV("--simulate-compute", "-1:2"), 1, -1,
                     "--simulate-compute F_MS must be at least 0 ms (got -1)");
  expect_check_error(ARGV("--simulate-compute", "1::2"), 1, -1, "--simulate-compute B_MS: '' is not a number");
  expect_check_error(ARGV("--simulate-compute", "1:2:1e999"), 1, -1, "W_MS: '1e999' is too large");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_ok),
      cmocka_unit_test(test_check_required),
      cmocka_unit_test(test_check_fields),
      cmocka_unit_test(test_check_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
