/* A Megatron user's flags (issue 24): the nearest flag for a typo, the
 * table of Megatron's flags mega knows (refused with a reason and a
 * replacement, or accepted where they restate mega), sample-based training
 * and the batch-size rampup against Megatron's rules restated here,
 * --split's quotes, --eval-iters 0, the evaluation note, PREFIX.bin and
 * the log line's FLOPs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/logline.h"
#include "jobspec_fixture.h"

/* ---- refusals that help ---- */

static void test_nearest_flag(void **state) {
  (void)state;
  /* a character off: the edit distance */
  expect_parse_error(ARGV("--num-layer", "3"), MEGA_ERR_INVALID,
                     "unknown flag '--num-layer'; did you mean --num-layers?");
  expect_parse_error(ARGV("--micro-batch", "3"), MEGA_ERR_INVALID,
                     "did you mean --micro-batch-size?");
  /* a word missing: the flag holding the given words, in order */
  expect_parse_error(ARGV("--pipeline-parallel-size", "2"), MEGA_ERR_INVALID,
                     "unknown flag '--pipeline-parallel-size'; did you mean "
                     "--pipeline-model-parallel-size?");
  expect_parse_error(ARGV("--tensor-parallel-size", "2"), MEGA_ERR_INVALID,
                     "did you mean --tensor-model-parallel-size?");
  expect_parse_error(ARGV("--virtual-pipeline-parallel-size", "2"), MEGA_ERR_INVALID,
                     "did you mean --virtual-pipeline-model-parallel-size?");
  /* nothing near: no guess */
  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  int i = 0;
  assert_int_equal(mega_jobspec_parse_flag(&s, PARSE_ARGS("--xyzzy", "1"), &i, &err),
                   MEGA_ERR_NOT_FOUND);
  assert_string_equal(err.msg, "unknown flag '--xyzzy'");
  mega_jobspec_free(&s);
}

/* Megatron's flag, refused: the message names it, says why and what to use. */
static void refused(char *const *argv, int argc, const char *why, const char *instead) {
  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  int i = 0;
  assert_int_equal(mega_jobspec_parse_flag(&s, argc, argv, &i, &err), MEGA_ERR_INVALID);
  assert_int_equal(i, 0);
  char lead[128];
  snprintf(lead, sizeof lead, "%s", argv[0]);
  lead[strcspn(lead, "=")] = '\0';
  expect_msg(&err, lead);
  expect_msg(&err, "is Megatron's, and mega does not take it");
  expect_msg(&err, why);
  expect_msg(&err, instead);
  mega_jobspec_free(&s);
}

/* Megatron's flag whose value restates mega: consumed, nothing stored. */
static void accepted(char *const *argv, int argc) {
  mega_jobspec s, d;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  mega_jobspec_defaults(&d);
  int i = 0;
  assert_int_equal(mega_jobspec_parse_flag(&s, argc, argv, &i, &err), MEGA_OK);
  assert_int_equal(i, argc);
  assert_true(mega_jobspec_equal(&s, &d));
  mega_jobspec_free(&s);
}

static void test_megatron_table(void **state) {
  (void)state;
  refused(ARGV("--fp16"), "no fp16 mixed precision", "use --bf16");
  refused(ARGV("--use-flash-attn"), "mega chooses the attention itself", "--bf16 on cuda is");
  refused(ARGV("--attention-backend", "flash"), "heads of 64 or 128 run causal flash attention",
          "give --attention-backend auto");
  refused(ARGV("--attention-backend=fused"), "(it takes auto)", "auto");
  /* unfused is what mega runs only without --bf16's flash attention */
  refused(ARGV("--attention-backend", "unfused"), "mega chooses the attention itself", "auto");
  refused(ARGV("--num-experts", "8"), "no mixture of experts", "drop it");
  refused(ARGV("--moe-router-topk", "2"), "no mixture of experts", "drop it");
  refused(ARGV("--expert-model-parallel-size", "2"), "no mixture of experts", "1, no expert");
  refused(ARGV("--tensorboard-dir", "/tb"), "no TensorBoard",
          "megactl watch JOB --json");
  refused(ARGV("--wandb-project", "p"), "the web view", "drop it");
  refused(ARGV("--log-timers-to-tensorboard"), "/metrics for Prometheus", "drop it");
  refused(ARGV("--distributed-backend", "gloo"), "NCCL between cuda ranks",
          "--backend cpu trains over Gloo");
  refused(ARGV("--checkpoint-activations"), "recomputing every layer",
          "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  refused(ARGV("--recompute-activations"), "selective recomputation",
          "--recompute-granularity selective");
  refused(ARGV("--step-batch-size-schedule", "0:16 2.4B:320"), "no step-wise batch schedule",
          "drop it to train at --global-batch-size throughout, or ramp with "
          "--rampup-batch-size START INCR SAMPLES and --train-samples N");
  /* examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh's */
  refused(ARGV("--use-megatron-fsdp"), "mega has no FSDP", "use --use-distributed-optimizer");
  refused(ARGV("--data-parallel-sharding-strategy", "optim_grads_params"), "(it takes no_shard)",
          "drop it (no_shard is accepted");
  refused(ARGV("--fsdp-double-buffer"), "mega has no FSDP", "drop it");
  refused(ARGV("--megatron-fsdp-main-params-dtype", "fp32"), "mega has no FSDP", "drop it");
  refused(ARGV("--init-model-with-meta-device"), "no meta device", "drop it");
  refused(ARGV("--use-nccl-ub"), "no NCCL user buffers", "drop it");
  refused(ARGV("--no-check-for-nan-in-loss-and-grad"), "gradient norm that is not finite",
          "drop it");
  refused(ARGV("--logging-level", "20"), "no levels", "drop it");
  refused(ARGV("--record-memory-history"), "profiler", "--trace-iteration K");
  refused(ARGV("--num-distributed-optimizer-instances", "2"), "as one instance",
          "1 is accepted");
  refused(ARGV("--use-precision-aware-optimizer"), "in fp32", "drop it");
  refused(ARGV("--cuda-graph-impl", "local"), "no CUDA graphs", "none is accepted");
  refused(ARGV("--loss-scale", "8192"), "no loss scaling", "use --bf16");
  refused(ARGV("--weight-decay-incr-style", "linear"), "--weight-decay at every step",
          "constant is accepted");
  refused(ARGV("--start-weight-decay", "0.01"), "--weight-decay at every step",
          "give --weight-decay W");
  refused(ARGV("--data-impl", "lazy"), "memory-maps", "mmap is accepted");
  /* a flag without a value given one */
  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  int i = 0;
  assert_int_equal(mega_jobspec_parse_flag(&s, PARSE_ARGS("--fp16=1"), &i, &err),
                   MEGA_ERR_INVALID);
  expect_msg(&err, "--fp16 takes no value");
  mega_jobspec_free(&s);

  accepted(ARGV("--distributed-backend", "nccl"));
  accepted(ARGV("--distributed-backend=nccl"));
  accepted(ARGV("--attention-backend", "auto"));
  accepted(ARGV("--data-impl", "mmap"));
  accepted(ARGV("--expert-model-parallel-size", "1"));
  accepted(ARGV("--no-masked-softmax-fusion"));
  accepted(ARGV("--no-bias-dropout-fusion"));
  accepted(ARGV("--no-gradient-accumulation-fusion"));
  accepted(ARGV("--no-persist-layer-norm"));
  accepted(ARGV("--data-parallel-sharding-strategy", "no_shard"));
  accepted(ARGV("--num-distributed-optimizer-instances", "1"));
  accepted(ARGV("--cuda-graph-impl", "none"));
  accepted(ARGV("--weight-decay-incr-style", "constant"));
  /* in a whole command line, between job flags */
  make_spec(&s, ARGV("--distributed-backend", "nccl", "--no-bias-gelu-fusion", "--seed", "7"));
  assert_int_equal(s.seed, 7);
  assert_true(s.no_bias_gelu_fusion); /* a flag of mega's own now: the cuda backend fuses */
  mega_jobspec_free(&s);
  /* the help lists what is accepted */
  char *help = mega_jobspec_help_text();
  assert_non_null(strstr(help, "Megatron flags accepted because they restate what mega does"));
  assert_non_null(strstr(help, "--distributed-backend nccl"));
  assert_non_null(strstr(help, "--no-masked-softmax-fusion"));
  free(help);
}

/* GPT-2's GELU as Megatron picks it: the tanh form through its bias-GELU
 * fusion (on by default; off with --no-bias-gelu-fusion or, the biases
 * gone, --disable-bias-linear) or with --openai-gelu; torch's exact erf
 * form otherwise. Llama has SwiGLU, so neither. */
static void test_gelu_form(void **state) {
  (void)state;
  mega_jobspec s;
  make_spec(&s, ARGV("--seed", "7"));
  assert_false(s.openai_gelu);
  assert_false(mega_jobspec_gelu_erf(&s));
  s.disable_bias_linear = true; /* (refused for GPT-2 by the checks, but the rule holds) */
  assert_true(mega_jobspec_gelu_erf(&s));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--no-bias-gelu-fusion"));
  assert_true(mega_jobspec_gelu_erf(&s));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--no-bias-gelu-fusion", "--openai-gelu"));
  assert_true(s.openai_gelu);
  assert_false(mega_jobspec_gelu_erf(&s));
  s.disable_bias_linear = true;
  assert_false(mega_jobspec_gelu_erf(&s));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--openai-gelu"));
  assert_false(mega_jobspec_gelu_erf(&s));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--position-embedding-type", "rope", "--normalization", "RMSNorm",
                     "--swiglu", "--disable-bias-linear", "--no-bias-gelu-fusion"));
  assert_true(mega_jobspec_llama(&s));
  assert_false(mega_jobspec_gelu_erf(&s));
  mega_jobspec_free(&s);
  /* the help says which form each flag gives */
  char *help = mega_jobspec_help_text();
  assert_non_null(strstr(help, "--openai-gelu"));
  assert_non_null(strstr(help, "0.5 x (1 + erf(x / sqrt 2))"));
  free(help);
}

/* Megatron's Llama scripts (examples/llama, docs/llama_mistral.md): every
 * flag of theirs that is not mega's own is accepted where it restates mega
 * or refused with the reason, never "unknown flag". */
static void test_megatron_llama_flags(void **state) {
  (void)state;
  refused(ARGV("--use-rotary-position-embeddings"), "deprecated spelling",
          "use --position-embedding-type rope");
  refused(ARGV("--no-position-embedding"), "rotary embeddings replace the learned ones",
          "drop it and give --position-embedding-type rope");
  refused(ARGV("--apply-layernorm-1p"), "not by 1 + a weight initialized to 0", "drop it");
  refused(ARGV("--rotary-interleaved"), "not interleaved pairs", "drop it");
  refused(ARGV("--rotary-seq-len-interpolation-factor", "2"), "no position interpolation",
          "drop it");
  refused(ARGV("--use-rope-scaling"), "no Llama 3.1 frequency scaling", "--rope-scaling-factor");
  refused(ARGV("--rope-scaling-factor", "8"), "rope_scaling null", "drop it");
  refused(ARGV("--qk-layernorm"), "no norms on q and k", "drop it");
  refused(ARGV("--add-qkv-bias"), "biases all together or none",
          "without --disable-bias-linear");
  refused(ARGV("--apply-query-key-layer-scaling"), "softmax is in fp32", "drop it");
  refused(ARGV("--cross-entropy-loss-fusion"), "no fused cross-entropy", "drop it");
  refused(ARGV("--use-checkpoint-args"), "checks config.json", "give the model's flags");
  refused(ARGV("--tokenizer-model", "tokenizer.model"), "GPT-2's BPE only",
          "--tokenizer-type NullTokenizer --vocab-size N");
  /* Megatron's other values of mega's own flags: the reason and the way */
  expect_parse_error(ARGV("--tokenizer-type", "Llama2Tokenizer"), MEGA_ERR_INVALID,
                     "--tokenizer-type: 'Llama2Tokenizer' is not one of NullTokenizer, "
                     "GPT2BPETokenizer: mega reads text with GPT-2's BPE only");
  expect_parse_error(ARGV("--tokenizer-type", "HuggingFaceTokenizer"), MEGA_ERR_INVALID,
                     "give --tokenizer-type NullTokenizer --vocab-size N, N the tokenizer's "
                     "vocabulary size less one");
  expect_parse_error(ARGV("--position-embedding-type", "yarn"), MEGA_ERR_INVALID,
                     "'yarn' is not one of learned_absolute, rope: mega trains GPT-2's learned "
                     "positions or Llama's rotary ones");
  /* the rest of examples/llama/train_llama3_8b_h100_fp8.sh */
  refused(ARGV("--decoupled-lr", "5.0e-4"), "one learning rate", "--decoupled-min-lr");
  refused(ARGV("--decoupled-min-lr", "4.5e-5"), "--lr decaying to --min-lr", "drop it");
  refused(ARGV("--grad-reduce-in-bf16"), "reduces gradients in fp32", "drop it");
  refused(ARGV("--empty-unused-memory-level", "1"), "no cache to empty", "0 is accepted");
  refused(ARGV("--mock-data"), "trains on data only", "give --data-path");
  refused(ARGV("--tiktoken-pattern", "v2"), "tokenized with tiktoken",
          "--tokenizer-type NullTokenizer --vocab-size N");
  refused(ARGV("--no-mmap-bin-files"), "memory-maps", "drop it");
  refused(ARGV("--num-workers", "1"), "without data-loader workers", "drop it");
  refused(ARGV("--profile"), "its own Chrome trace", "use --trace-iteration K");
  refused(ARGV("--profile-step-start", "4"), "Chrome trace", "--trace-iteration K");
  refused(ARGV("--distributed-timeout-minutes", "60"), "--step-timeout", "drop it");
  accepted(ARGV("--manual-gc"));
  accepted(ARGV("--no-create-attention-mask-in-dataloader"));
  accepted(ARGV("--empty-unused-memory-level", "0"));
  accepted(ARGV("--attention-softmax-in-fp32"));
  accepted(ARGV("--no-query-key-layer-scaling"));
  accepted(ARGV("--calculate-per-token-loss"));
  /* Megatron's Llama-2 flags as docs/llama_mistral.md writes them, with the
   * refusals' replacements: a Llama */
  mega_jobspec s;
  mega_err err = {0};
  make_spec(&s, ARGV("--position-embedding-type", "rope", "--normalization", "RMSNorm",
                     "--swiglu", "--untie-embeddings-and-output-weights",
                     "--no-masked-softmax-fusion", "--attention-softmax-in-fp32",
                     "--disable-bias-linear"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_true(mega_jobspec_llama(&s));
  mega_jobspec_free(&s);
  /* a default that differs from Megatron's says so */
  char *help = mega_jobspec_help_text();
  const char *drop = strstr(help, "--hidden-dropout");
  assert_non_null(drop);
  assert_non_null(strstr(drop, "Megatron's default is 0.1"));
  free(help);
}

/* ---- --split, --eval-iters 0, the note ---- */

static void test_split_quotes(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  double sh[3];
  /* as several of Megatron's scripts pass it: the quotes reach the program */
  make_spec(&s, ARGV("--split", "'99,1,0'"));
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(sh[0] == 0.99 && sh[1] == 0.01 && sh[2] == 0);
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--split", "\"949, 50, 1\""));
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(sh[0] == 0.949 && sh[1] == 0.05 && sh[2] == 0.001);
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--split", "98.5 1.5"));
  assert_int_equal(mega_jobspec_split(&s, sh, &err), MEGA_OK);
  assert_true(sh[0] == 0.985 && fabs(sh[1] - 0.015) < 1e-15 && sh[2] == 0);
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--split", "1,2,3,4"), 1, -1, "expected up to three");
  expect_check_error(ARGV("--split", "'-1,2'"), 1, -1, "expected up to three non-negative");
  expect_check_error(ARGV("--split", "''"), 1, -1, "expected up to three");
  expect_check_error(ARGV("--split", "1.2.3"), 1, -1, "expected up to three");
}

static void test_eval_iters_zero(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  char note[512];
  make_spec(&s, ARGV("--eval-interval", "5", "--eval-iters", "0", "--split", "1,0,0"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK); /* no valid share needed */
  assert_false(mega_jobspec_evaluates(&s));
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  assert_non_null(strstr(note, "--eval-iters 0: no evaluation"));
  mega_jobspec_free(&s);
  /* the base job less its --data-path, then training and evaluation's own */
  make_spec(&s, NULL, 0);
  for (int k = 0; k < s.data_path.n; k++) free(s.data_path.v[k]);
  free(s.data_path.v);
  s.data_path = (mega_strlist){0};
  assert_int_equal(mega_jobspec_parse(&s, PARSE_ARGS("--train-data-path", "t",
                                                     "--valid-data-path", "v", "--eval-interval",
                                                     "5", "--eval-iters", "0"),
                                      &err),
                   MEGA_OK);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--valid-data-path is what evaluation reads; give --eval-interval N and "
                   "--eval-iters N (0 turns evaluation off) too");
  mega_jobspec_free(&s);
  make_spec(&s, NULL, 0);
  assert_false(mega_jobspec_eval_note(&s, note, sizeof note)); /* no evaluation, no note */
  mega_jobspec_free(&s);
}

static void test_eval_note(void **state) {
  (void)state;
  mega_jobspec s;
  char note[512];
  make_spec(&s, ARGV("--eval-interval", "5"));
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  assert_non_null(strstr(note, "no --split: training reads all of the data, and evaluation "
                               "every 5 iterations and after the last reads windows counted "
                               "back from the end"));
  assert_non_null(strstr(note, "Megatron would take --split 969,30,1"));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--eval-interval", "5", "--split", "949,50,1"));
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  assert_non_null(strstr(note, "reads the valid share of --split 949,50,1: 5% of each"));
  assert_non_null(strstr(note, "the test share is evaluated once, after the last iteration"));
  assert_true(mega_jobspec_evaluates_at_end(&s) && mega_jobspec_tests_at_end(&s));
  assert_int_equal(mega_jobspec_eval_batches(&s), (mega_jobspec_train_iters(&s) / 5 + 1) * 100);
  mega_jobspec_free(&s);
  /* no --eval-interval: a held-out share is still evaluated after the last
   * iteration (Megatron's do_valid, do_test), and nothing else is */
  make_spec(&s, ARGV("--split", "8,1,1", "--eval-iters", "3"));
  assert_false(mega_jobspec_evaluates(&s));
  assert_true(mega_jobspec_evaluates_at_end(&s) && mega_jobspec_tests_at_end(&s));
  assert_int_equal(mega_jobspec_eval_batches(&s), 3);
  assert_true(mega_jobspec_eval_note(&s, note, sizeof note));
  assert_non_null(strstr(note, "only the end of training evaluates, as Megatron's does after "
                               "its last iteration, 3 batches of --global-batch-size on the "
                               "valid share and then on the test share of --split 8,1,1"));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--split", "9,0,1"));
  assert_false(mega_jobspec_evaluates_at_end(&s));
  assert_true(mega_jobspec_tests_at_end(&s));
  mega_jobspec_free(&s);
  make_spec(&s, ARGV("--split", "9,1,1", "--eval-iters", "0"));
  assert_false(mega_jobspec_evaluates_at_end(&s) || mega_jobspec_tests_at_end(&s));
  assert_false(mega_jobspec_eval_note(&s, note, sizeof note));
  mega_jobspec_free(&s);
}

/* ---- sample-based training ---- */

/* the base job by samples: --train-iters dropped */
static void make_samples(mega_jobspec *s, char *const *extra, int n) {
  make_spec(s, extra, n);
  s->train_iters = -1;
}

static void test_sample_flags(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--train-samples", "100", "--lr-decay-samples", "80",
                        "--lr-warmup-samples", "8"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_train_iters(&s), 12); /* 100 // 8: the partial batch dropped */
  mega_lr_samples l;
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.warmup == 8 && l.decay == 80 && l.wsd_decay == 0);
  s.lr_decay_samples = -1; /* the decay defaults to --train-samples */
  s.lr_warmup_samples = 0;
  s.lr_warmup_fraction = 0.25;
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.decay == 100 && l.warmup == 25);
  mega_jobspec_free(&s);
  /* by iterations, the bounds are iterations x the global batch */
  make_spec(&s, ARGV("--lr-decay-iters", "9", "--lr-warmup-fraction", "0.1"));
  mega_jobspec_lr_samples(&s, &l);
  assert_true(l.decay == 72 && fabs(l.warmup - 7.2) < 1e-12);
  mega_jobspec_free(&s);

  /* Megatron's asserts, as refusals that say what to give */
  make_samples(&s, NULL, 0);
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--train-iters is required (or --train-samples)");
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--train-samples", "80"), 1, -1,
                     "--train-iters and --train-samples exclude each other");
  expect_check_error(ARGV("--lr-decay-samples", "80"), 1, -1,
                     "--lr-decay-samples is for sample-based training (--train-samples); with "
                     "--train-iters give --lr-decay-iters");
  expect_check_error(ARGV("--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"), 1, -1,
                     "--lr-warmup-fraction and --lr-warmup-iters exclude each other");
  make_samples(&s, ARGV("--train-samples", "80", "--lr-decay-iters", "5"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--lr-decay-iters is for iteration-based training; with --train-samples "
                   "give --lr-decay-samples");
  mega_jobspec_free(&s);
  expect_check_error(ARGV("--lr-decay-style", "WSD"), 1, -1,
                     "--lr-decay-style WSD needs the length of its final anneal: "
                     "--lr-wsd-decay-iters N");
  expect_check_error(ARGV("--lr-wsd-decay-iters", "3"), 1, -1,
                     "--lr-wsd-decay-iters is for --lr-decay-style WSD");
  expect_check_error(ARGV("--lr-warmup-init", "1"), 1, -1,
                     "--lr-warmup-init 1 is larger than --lr 0.001");
  expect_parse_error(ARGV("--lr-warmup-fraction", "1"), MEGA_ERR_INVALID,
                     "--lr-warmup-fraction must be less than 1");
  expect_check_ok(ARGV("--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3",
                       "--lr-wsd-decay-style", "minus_sqrt"), 1, -1);
  expect_check_ok(ARGV("--lr-decay-style", "inverse-square-root", "--lr-warmup-iters", "2"), 1,
                  -1);
}

/* ---- the rampup against Megatron's rule, restated ---- */

/* RampupBatchsizeNumMicroBatchesCalculator.update: the global batch after
 * c consumed samples, with n = (G - start) / inc increments of S / n
 * samples each (Python's float division and int()). */
static int megatron_batch(int64_t c, int start, int inc, int64_t S, int G) {
  if (c > S) return G;
  int n = (G - start) / inc;
  double per = (double)S / n;
  return start + (int)((double)c / per) * inc;
}

/* training.py's update_train_iters with a rampup, one iteration at a time:
 * the ramp's iterations while at most S (and T) samples are consumed, then
 * whole global batches. */
static int64_t megatron_train_iters(int start, int inc, int64_t S, int G, int64_t T) {
  int64_t it = 0, c = 0;
  while (c <= S && c <= T) {
    c += megatron_batch(c, start, inc, S, G);
    it++;
  }
  if (T > c) it += (T - c) / G;
  return it;
}

static void test_rampup_small(void **state) {
  (void)state;
  mega_jobspec s;
  mega_err err = {0};
  /* 2 2 40 up to 8: three increments of 13.33 samples */
  make_samples(&s, ARGV("--global-batch-size", "8", "--rampup-batch-size", "2", "2", "40",
                        "--train-samples", "100"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  /* consumed 0, 2, ..., 12 take 2; 14, 18, 22, 26 take 4; 30, 36 take 6; then 8 */
  const int want[] = {2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 8, 8, 8};
  int64_t c = 0;
  for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++) {
    assert_int_equal(mega_jobspec_samples_before(&s, i), c);
    assert_int_equal(mega_jobspec_batch_of(&s, i), want[i]);
    c += want[i];
  }
  /* 13 iterations ramp to 42 samples, then (100 - 42) // 8 = 7 more */
  assert_int_equal(mega_jobspec_train_iters(&s), 20);
  assert_int_equal(megatron_train_iters(2, 2, 40, 8, 100), 20);
  mega_jobspec_free(&s);
}

static void test_rampup_gpt3(void **state) {
  (void)state;
  /* the 175B script's ramp: 16 16 5859375 up to 1536, 500000 x 1536 samples */
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--micro-batch-size", "1", "--global-batch-size", "1536",
                        "--rampup-batch-size", "16", "16", "5859375", "--train-samples",
                        "768000000"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_OK);
  int64_t c = 0, i = 0;
  for (; c <= 5859375 + 3 * 1536; i++) {
    int b = megatron_batch(c, 16, 16, 5859375, 1536);
    if (mega_jobspec_samples_before(&s, i) != c || mega_jobspec_batch_of(&s, i) != b)
      fail_msg("iteration %lld: samples %lld batch %d, Megatron's %lld and %d", (long long)i,
               (long long)mega_jobspec_samples_before(&s, i), mega_jobspec_batch_of(&s, i),
               (long long)c, b);
    c += b;
  }
  assert_int_equal(mega_jobspec_train_iters(&s),
                   megatron_train_iters(16, 16, 5859375, 1536, 768000000));
  s.train_samples = 3000000; /* ending inside the ramp */
  assert_int_equal(mega_jobspec_train_iters(&s),
                   megatron_train_iters(16, 16, 5859375, 1536, 3000000));
  mega_jobspec_free(&s);
}

static void test_rampup_checks(void **state) {
  (void)state;
  /* Megatron refuses a ramp with iteration-based training: the refusal
   * gives the sample counts to write instead */
  expect_check_error(ARGV("--rampup-batch-size", "2", "2", "40", "--lr-decay-iters", "9"), 1,
                     -1,
                     "--rampup-batch-size needs sample-based training, as in Megatron: give "
                     "--train-samples 80 instead of --train-iters 10 (10 iterations of "
                     "--global-batch-size 8), and --lr-decay-samples 72 for --lr-decay-iters 9");
  mega_jobspec s;
  mega_err err = {0};
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "4", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "--global-batch-size 8 minus START 2 is not divisible by INCR 4");
  mega_jobspec_free(&s);
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "8", "2", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "START 8 must be less than --global-batch-size 8");
  mega_jobspec_free(&s);
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "x", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "takes three whole numbers, START INCR SAMPLES");
  mega_jobspec_free(&s);
  /* bounds that keep the ramp's walk short */
  make_samples(&s, ARGV("--global-batch-size", "200000", "--train-samples", "800000",
                        "--rampup-batch-size", "2", "2", "40"));
  assert_int_equal(mega_jobspec_check(&s, 1, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "ramps in 99999 steps, more than the 65536 allowed");
  mega_jobspec_free(&s);
  /* every batch of the ramp divides by micro batch x DP (micro 2, DP 2 here) */
  make_samples(&s, ARGV("--train-samples", "80", "--rampup-batch-size", "2", "2", "40"));
  assert_int_equal(mega_jobspec_check_all(&s, 2, -1, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "every batch of the ramp must divide by --micro-batch-size 2 x "
                   "data-parallel size 2 = 4");
  assert_int_equal(mega_jobspec_check_all(&s, 1, -1, &err), MEGA_OK);
  mega_jobspec_free(&s);
}

/* ---- GPT-2's vocabulary, PREFIX.bin ---- */

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

/* ---- the log line ---- */

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
      cmocka_unit_test(test_nearest_flag),   cmocka_unit_test(test_megatron_table),
      cmocka_unit_test(test_megatron_llama_flags), cmocka_unit_test(test_gelu_form),
      cmocka_unit_test(test_split_quotes),   cmocka_unit_test(test_eval_iters_zero),
      cmocka_unit_test(test_eval_note),      cmocka_unit_test(test_sample_flags),
      cmocka_unit_test(test_rampup_small),   cmocka_unit_test(test_rampup_gpt3),
      cmocka_unit_test(test_rampup_checks),  cmocka_unit_test(test_vocab_file),
      cmocka_unit_test(test_bad_tokenizer_files),
      cmocka_unit_test(test_prefix_bin),     cmocka_unit_test(test_logline),
      cmocka_unit_test(test_flops_llama),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
