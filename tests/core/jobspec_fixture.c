/* The job-spec tests' shared pieces (jobspec_fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "jobspec_fixture.h"

/* A small valid job: 4 layers, 8 samples per iteration in microbatches of 2. */
const char *const jf_base_argv[] = {
    "--num-layers",       "4",  "--hidden-size",       "64",     "--num-attention-heads", "4",
    "--seq-length",       "32", "--micro-batch-size",  "2",      "--global-batch-size",   "8",
    "--train-iters",      "10", "--data-path",         "/tmp/x", "--lr",                  "0.001",
};
const int jf_base_argc = sizeof jf_base_argv / sizeof jf_base_argv[0];

void expect_msg(const mega_err *err, const char *want) {
  if (!strstr(err->msg, want)) fail_msg("message '%s' lacks '%s'", err->msg, want);
}

/* base, then extra flags on top; fails the test when parsing fails */
void make_spec(mega_jobspec *s, char *const *extra, int n) {
  mega_err err = {0};
  mega_jobspec_defaults(s);
  if (mega_jobspec_parse(s, jf_base_argc, (char *const *)jf_base_argv, &err) != MEGA_OK)
    fail_msg("base: %s", err.msg);
  if (n && mega_jobspec_parse(s, n, extra, &err) != MEGA_OK) fail_msg("extra: %s", err.msg);
}

void expect_parse_error(char *const *argv, int argc, mega_status want_st, const char *want) {
  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  assert_int_equal(mega_jobspec_parse(&s, argc, argv, &err), want_st);
  assert_int_equal(err.status, want_st);
  expect_msg(&err, want);
  mega_jobspec_free(&s);
}

/* check with base + extra flags, at the given world size and data size */
void expect_check_error(char *const *extra, int n, int world, long long bytes,
                               const char *want) {
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, extra, n);
  if (mega_jobspec_check(&s, world, bytes, &err) != MEGA_ERR_INVALID)
    fail_msg("the check passed; want '%s'", want);
  assert_int_equal(err.status, MEGA_ERR_INVALID);
  expect_msg(&err, "invalid job: ");
  expect_msg(&err, want);
  mega_jobspec_free(&s);
}

void expect_check_ok(char *const *extra, int n, int world, long long bytes) {
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, extra, n);
  if (mega_jobspec_check(&s, world, bytes, &err) != MEGA_OK) fail_msg("%s", err.msg);
  mega_jobspec_free(&s);
}

/* A spec with every flag away from its default. */
void make_full(mega_jobspec *s) {
  make_spec(s, ARGV("--max-position-embeddings", "64", "--init-method-std", "0.006",
                    "--seed", "0", "--position-embedding-type", "rope", "--rotary-base",
                    "500000", "--rotary-percent", "0.5", "--normalization", "RMSNorm",
                    "--norm-epsilon", "1e-6", "--swiglu", "--ffn-hidden-size", "96",
                    "--group-query-attention", "--num-query-groups", "2",
                    "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                    "--openai-gelu",
                    "--kv-channels", "8", "--attention-dropout", "0.1", "--hidden-dropout",
                    "0.1", "--use-mcore-models", "--transformer-impl", "transformer_engine",
                    "--context-parallel-size", "2",
                    "--lr", "0.30000000000000004", "--min-lr", "1e-300",
                    "--lr-warmup-iters", "2", "--lr-decay-iters", "9", "--lr-decay-style",
                    "constant", "--weight-decay", "0", "--adam-beta1", "0.8", "--adam-beta2",
                    "0.95", "--adam-eps", "1e-6", "--clip-grad", "0", "--save", "/s",
                    "--save-interval", "3", "--save-initial", "--load", "-weird dir",
                    "--async-save", "--no-replica-recovery",
                    "--finetune", "--no-load-optim", "--no-load-rng", "--exit-on-missing-checkpoint",
                    "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler",
                    "--exit-signal-handler", "--exit-interval", "7",
                    "--exit-duration-in-mins", "30", "--eval-interval", "5", "--eval-iters", "2",
                    "--tensor-model-parallel-size", "2", "--sequence-parallel",
                    "--pipeline-model-parallel-size", "4",
                    "--virtual-pipeline-model-parallel-size", "2",
                    "--num-layers-per-virtual-pipeline-stage", "1",
                    "--microbatch-group-size-per-vp-stage", "5",
                    "--pipeline-model-parallel-layout", "Et|t*3",
                    "--decoder-first-pipeline-num-layers", "0",
                    "--decoder-last-pipeline-num-layers", "0", "--schedule", "interleaved",
                    "--batch-p2p-comm", "--overlap-p2p-comm", "--overlap-p2p-comm-warmup-flush",
                    "--variable-seq-lengths", "--deallocate-pipeline-outputs",
                    "--recompute-granularity", "full", "--recompute-method", "block",
                    "--recompute-num-layers", "2", "--overlap-grad-reduce",
                    "--align-grad-reduce", "--bucket-size", "1000", "--use-distributed-optimizer",
                    "--no-optimizer-shard-copy",
                    "--overlap-param-gather", "--average-in-collective",
                    "--blas-threads", "4", "--backend", "cpu", "--bf16", "--no-bias-gelu-fusion",
                    "--trace-iteration", "3",
                    "--simulate-compute", "1:2:3", "--log-interval", "2", "--data-path", "0.3", "a b", "0.7", "-c",
                    "--split", "969,30,1", "--data-order", "megatron", "--data-cache-path", "c d",
                    "--train-data-path", "t",
                    "--valid-data-path",
                    "0.5", "v", "0.5", "w", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                    "50257", "--make-vocab-size-divisible-by", "64",
                    /* issue 24 */
                    "--train-samples", "100", "--rampup-batch-size", "8", "8", "1000",
                    "--vocab-file", "v.json", "--merge-file", "m.txt",
                    "--lr-warmup-fraction", "0.1", "--lr-warmup-samples", "3",
                    "--lr-decay-samples", "90", "--lr-warmup-init", "1e-9",
                    "--lr-wsd-decay-style", "linear", "--lr-wsd-decay-iters", "3",
                    "--lr-wsd-decay-samples", "30", "--log-throughput"));
}
