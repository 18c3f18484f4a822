/* A Megatron user's flags (issue 24): the nearest flag for a typo, the
 * table of Megatron's flags mega knows (refused with a reason and a
 * replacement, or accepted where they restate mega), GPT-2's GELU and the
 * Llama scripts' flags, --split's quotes, --eval-iters 0, the evaluation
 * note and the note on attention dropout under --bf16 on cuda.
 * Sample-based training and the rampup are in test_jobspec_samples.c, the
 * files a job names in test_jobspec_files.c, the log line in
 * test_logline.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

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
  /* attention dropout's mask takes the unfused attention even under --bf16 */
  refused(ARGV("--use-flash-attn"), "unless --attention-dropout asks for a mask",
          "but not with --attention-dropout");
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
  assert_non_null(strstr(help, "(not with --attention-dropout: fp32 batched GEMMs")); /* --bf16 */
  free(help);
}

/* Megatron's spellings of mega's own flags, and the flags of the GPT
 * model configs in Megatron's tests/functional_tests (long lists real users
 * copy): each is taken with Megatron's meaning, accepted where it restates
 * mega, or refused with what to write. */
static void test_megatron_test_configs(void **state) {
  (void)state;
  mega_jobspec s, m;
  make_spec(&s, ARGV("--ddp-average-in-collective", "--ddp-bucket-size", "1000",
                     "--num-virtual-stages-per-pipeline-rank", "2",
                     "--microbatch-group-size-per-virtual-pipeline-stage=3",
                     "--overlap-p2p-communication-warmup-flush"));
  make_spec(&m, ARGV("--average-in-collective", "--bucket-size", "1000",
                     "--virtual-pipeline-model-parallel-size", "2",
                     "--microbatch-group-size-per-vp-stage", "3",
                     "--overlap-p2p-comm-warmup-flush"));
  assert_true(mega_jobspec_equal(&s, &m));
  assert_int_equal(s.bucket_size, 1000);
  assert_int_equal(s.virtual_pipeline_model_parallel_size, 2);
  mega_jobspec_free(&s);
  mega_jobspec_free(&m);
  /* Megatron's adam is torch's AdamW; its gradients in fp32 are mega's */
  char *help = mega_jobspec_help_text();
  assert_non_null(strstr(help, "--ddp-bucket-size (--bucket-size)"));
  assert_non_null(strstr(help, "--optimizer adam"));
  free(help);
  accepted(ARGV("--optimizer", "adam"));
  accepted(ARGV("--optimizer=adam"));
  accepted(ARGV("--accumulate-allreduce-grads-in-fp32"));
  accepted(ARGV("--no-overlap-p2p-communication"));
  /* it is not a no-op beside mega's --overlap-p2p-comm: the later one wins */
  mega_jobspec o;
  mega_jobspec_defaults(&o);
  char *on_off[] = {"--overlap-p2p-comm", "--no-overlap-p2p-communication"};
  char *off_on[] = {"--no-overlap-p2p-communication", "--overlap-p2p-comm"};
  mega_err err = {0};
  assert_int_equal(mega_jobspec_parse(&o, 2, on_off, &err), MEGA_OK);
  assert_false(o.overlap_p2p_comm);
  assert_int_equal(mega_jobspec_parse(&o, 2, off_on, &err), MEGA_OK);
  assert_true(o.overlap_p2p_comm);
  mega_jobspec_free(&o);
  refused(ARGV("--optimizer", "sgd"), "(it takes adam)", "drop it");
  refused(ARGV("--log-num-zeros-in-grad"), "no count of zero gradients", "megaw --json");
  refused(ARGV("--log-params-norm"), "no norm of the parameters", "megaw --json");
  refused(ARGV("--timing-log-level", "0"), "no Megatron timers", "--trace-iteration K");
  refused(ARGV("--timing-log-option", "minmax"), "no Megatron timers", "--trace-iteration K");
  refused(ARGV("--deterministic-mode"), "no deterministic mode to switch on", "drop it");
  refused(ARGV("--dist-ckpt-strictness", "log_all"), "Hugging Face safetensors", "drop it");
  refused(ARGV("--ckpt-step", "100"), "newest complete checkpoint in --load", "drop it, or");
  refused(ARGV("--ckpt-fully-parallel-load"), "Hugging Face safetensors", "drop it");
  refused(ARGV("--no-ckpt-fully-parallel-save"), "Hugging Face safetensors", "drop it");
  refused(ARGV("--auto-detect-ckpt-format"), "Hugging Face safetensors", "drop it");
  refused(ARGV("--async-strategy", "mcore"), "Hugging Face safetensors", "drop it");
  refused(ARGV("--use-persistent-ckpt-worker"), "background thread", "--async-save");
  refused(ARGV("--save-retain-interval", "5000"), "keeps every checkpoint", "drop it");
  refused(ARGV("--eval-global-batch-size", "32"), "at --global-batch-size", "drop it");
  refused(ARGV("--overlap-param-gather-with-optimizer-step"), "the next forward",
          "--overlap-param-gather");
  refused(ARGV("--tp-comm-overlap"), "Transformer Engine", "drop it");
  refused(ARGV("--squared-relu"), "GELU or Llama's SwiGLU", "drop it");
  refused(ARGV("--expert-tensor-parallel-size", "4"), "no mixture of experts", "drop it");
  refused(ARGV("--account-for-embedding-in-pipeline-split"), "decoder layers alone",
          "--pipeline-model-parallel-layout");
  refused(ARGV("--account-for-loss-in-pipeline-split"), "decoder layers alone",
          "--decoder-last-pipeline-num-layers");
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

/* --attention-dropout with --bf16 takes away cuda's flash attention for
 * heads flash takes: the rank's note says so, and what each layer keeps.
 * Base: 4 heads, micro-batch 2. */
static void cuda_attention_note(char *const *extra, int n, const char *want) {
  mega_jobspec s;
  char note[512] = "";
  make_spec(&s, extra, n);
  bool said = mega_jobspec_cuda_attention_note(&s, note, sizeof note);
  if (want ? !said || !strstr(note, want) : said) fail_msg("want %s, note: %s", want, note);
  mega_jobspec_free(&s);
}

static void test_cuda_attention_note(void **state) {
  (void)state;
  /* heads of 64 at T 1024: [2, 4, 1024, 1024] floats, 32 MiB a layer,
   * against flash's log-sum-exp and output copy, 2 x 4 x 1024 x 65 */
  cuda_attention_note(ARGV("--hidden-size", "256", "--seq-length", "1024", "--bf16",
                           "--attention-dropout", "0.1"),
                      "--attention-dropout 0.1 with --bf16: on cuda attention runs unfused, as "
                      "fp32 batched GEMMs");
  cuda_attention_note(ARGV("--hidden-size", "256", "--seq-length", "1024", "--bf16",
                           "--attention-dropout", "0.1"),
                      "keeps its [2, 4, 1024, 1024] probabilities: 32.0 MiB a layer for each "
                      "microbatch in flight, where flash attention keeps 2.0 MiB");
  /* a rank holds its tensor-parallel share of the heads; heads of 128 */
  cuda_attention_note(ARGV("--hidden-size", "512", "--seq-length", "256", "--bf16",
                           "--attention-dropout", "0.2", "--tensor-model-parallel-size", "2"),
                      "[2, 2, 256, 256] probabilities: 1.0 MiB");
  /* flash would not run anyway, or nothing takes it away: no note */
  cuda_attention_note(ARGV("--hidden-size", "256", "--seq-length", "1024", "--bf16"), NULL);
  cuda_attention_note(ARGV("--hidden-size", "256", "--seq-length", "1024",
                           "--attention-dropout", "0.1"), NULL);
  cuda_attention_note(ARGV("--seq-length", "1024", "--bf16", "--attention-dropout", "0.1"),
                      NULL); /* heads of 16 */
  cuda_attention_note(ARGV("--hidden-size", "256", "--seq-length", "64", "--bf16",
                           "--attention-dropout", "0.1"), NULL); /* T not above the heads */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nearest_flag),
      cmocka_unit_test(test_megatron_table),
      cmocka_unit_test(test_megatron_test_configs),
      cmocka_unit_test(test_megatron_llama_flags),
      cmocka_unit_test(test_gelu_form),
      cmocka_unit_test(test_split_quotes),
      cmocka_unit_test(test_eval_iters_zero),
      cmocka_unit_test(test_eval_note),
      cmocka_unit_test(test_cuda_attention_note),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
