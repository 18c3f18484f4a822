/* Megatron's flags that mega knows without taking them as its own: values
 * that only restate what mega does are accepted (and change nothing); the
 * others are refused with the reason and what to use instead. A launch
 * script then runs, or says exactly what to change, instead of stopping at
 * "unknown flag". The model flags (--position-embedding-type, dropout,
 * --context-parallel-size, ...) belong to the model's own table. */
#include "core/jobspec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"

typedef struct compat {
  const char *name;  /* "--fp16"; ending in '*', a prefix: "--moe-*" */
  bool value;        /* takes one value */
  /* accepted values, NULL-terminated; for a flag without a value, a non-NULL
   * list (any) means the flag is accepted. NULL: always refused */
  const char *const *ok;
  const char *why;     /* what mega does instead, a clause */
  const char *instead; /* what to write: "use --bf16", "drop it" */
} compat;

static const char *const yes[] = {NULL};
static const char *const nccl[] = {"nccl", NULL};
static const char *const mmap_only[] = {"mmap", NULL};
/* only auto: unfused and local would be untrue under --bf16 (flash) */
static const char *const auto_only[] = {"auto", NULL};
static const char *const one[] = {"1", NULL};
static const char *const zero[] = {"0", NULL};
static const char *const no_shard[] = {"no_shard", NULL};
static const char *const none_only[] = {"none", NULL};
static const char *const constant[] = {"constant", NULL};
static const char *const adam[] = {"adam", NULL};

#define NO_FUSION "mega runs no such fused kernel, so this restates what it does"
#define ATTENTION                                                                           \
  "mega chooses the attention itself: on cuda under --bf16, heads of 64 or 128 run causal "  \
  "flash attention (no [B, heads, T, T] probabilities kept) unless --attention-dropout asks " \
  "for a mask it does not draw; otherwise the unfused one, QK^T, a causal softmax and the "  \
  "product with V, in fp32 with the probabilities kept for backward"
#define NO_TB                                                                              \
  "mega writes no TensorBoard or Weights & Biases logs; every iteration's metrics are in " \
  "megaw --json and megad run --json (one JSON object a line), megactl watch JOB --json, "  \
  "the web view (megad serve --metrics-listen ADDR: loss and eval curves, bubbles, the "    \
  "timeline) and its /metrics for Prometheus"
#define NO_MOE "mega's GPT has dense MLPs: there is no mixture of experts"
#define NO_PROFILER                                                                        \
  "mega has no PyTorch or Nsight profiler hooks; it records its own Chrome trace of one " \
  "iteration, every rank's measured actions"
#define TRACE \
  "use --trace-iteration K (megactl trace JOB fetches it; megaw prints it with --json)"
#define ONE_LR "mega trains every parameter at one learning rate, --lr decaying to --min-lr"
#define NO_FSDP                                                                            \
  "mega has no FSDP: its data parallelism keeps whole weights on every replica and, with "  \
  "--use-distributed-optimizer, shards the optimizer state (ZeRO-1)"
#define ZERO1 "use --use-distributed-optimizer (ZeRO-1: sharded optimizer state)"
#define ZERO1_SHORT "--use-distributed-optimizer shards the optimizer state"
#define NO_LOSS_SCALE \
  "mega has no fp16 mixed precision, so no loss scaling: it trains in fp32, with bf16 GEMM " \
  "inputs under --bf16"
#define DIST_CKPT                                                                          \
  "mega writes one checkpoint format, Hugging Face safetensors (whole tensors, sharded by " \
  "size), with no torch_dist options to set"
#define NO_TIMERS                                                                           \
  "mega has no Megatron timers; it records its own Chrome trace of one iteration, every " \
  "rank's measured actions"
#define PP_SPLIT                                                                            \
  "mega's pipeline stages split the decoder layers alone (evenly, or as a layout or the " \
  "first and last stage's counts say)"
#define PP_LAYOUT                                                                          \
  "give --pipeline-model-parallel-layout (E and L place the embedding and the loss), or " \
  "--decoder-first-pipeline-num-layers N / --decoder-last-pipeline-num-layers N"
#define ONE_WD                                                                              \
  "mega's weight decay is --weight-decay at every step (Megatron's --weight-decay-incr-style " \
  "constant)"

static const compat table[] = {
    {"--fp16", false, NULL,
     "mega has no fp16 mixed precision (no loss scaling): it trains in fp32, with the linear "
     "layers' GEMM inputs in bf16 under --bf16",
     "use --bf16"},
    {"--fp16-lm-cross-entropy", false, NULL,
     "mega computes the cross-entropy in fp32 (there is no fp16 mode)", "drop it"},
    {"--fp8-*", true, NULL, "mega has no fp8 GEMMs", "use --bf16"},
    {"--use-flash-attn", false, NULL, ATTENTION,
     "drop it (--bf16 on cuda is flash attention, but not with --attention-dropout; elsewhere "
     "--recompute-granularity selective recomputes the probabilities instead of keeping them)"},
    {"--attention-backend", true, auto_only, ATTENTION,
     "give --attention-backend auto, or drop the flag"},
    {"--num-experts", true, NULL, NO_MOE, "drop it (and the --moe-* flags)"},
    {"--moe-*", true, NULL, NO_MOE, "drop it"},
    {"--expert-model-parallel-size", true, one, NO_MOE,
     "drop it (1, no expert parallelism, is accepted)"},
    {"--tensorboard-dir", true, NULL, NO_TB, "drop it"},
    {"--tensorboard-*", true, NULL, NO_TB, "drop it"},
    {"--log-timers-to-tensorboard", false, NULL, NO_TB, "drop it"},
    {"--log-validation-ppl-to-tensorboard", false, NULL, NO_TB, "drop it"},
    {"--log-memory-to-tensorboard", false, NULL, NO_TB, "drop it"},
    {"--wandb-*", true, NULL, NO_TB, "drop it"},
    {"--distributed-backend", true, nccl,
     "mega chooses the communicators itself: NCCL between cuda ranks for device memory, Gloo "
     "for host memory and between cpu ranks",
     "drop it (nccl is accepted; --backend cpu trains over Gloo)"},
    {"--data-impl", true, mmap_only,
     "mega memory-maps Megatron's indexed datasets (MMIDIDX), the only format it reads",
     "drop it (mmap is accepted)"},
    {"--no-masked-softmax-fusion", false, yes, NO_FUSION, ""},
    {"--no-bias-dropout-fusion", false, yes, NO_FUSION, ""},
    {"--no-bias-swiglu-fusion", false, yes, NO_FUSION, ""},
    {"--no-gradient-accumulation-fusion", false, yes, NO_FUSION, ""},
    {"--no-rope-fusion", false, yes, NO_FUSION, ""},
    {"--no-persist-layer-norm", false, yes, NO_FUSION, ""},
    {"--checkpoint-activations", false, NULL,
     "Megatron replaced it with --recompute-activations; what it did, recomputing every layer "
     "from its input, is",
     "use --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"},
    {"--recompute-activations", false, NULL,
     "in Megatron it means selective recomputation, which mega spells out",
     "use --recompute-granularity selective"},
    {"--step-batch-size-schedule", true, NULL,
     "mega has no step-wise batch schedule: its only ramp is Megatron's older linear "
     "--rampup-batch-size rule",
     "drop it to train at --global-batch-size throughout, or ramp with --rampup-batch-size "
     "START INCR SAMPLES and --train-samples N (keeping --global-batch-size, the batch after "
     "the ramp)"},
    {"--decrease-batch-size-if-needed", false, NULL,
     "mega never shrinks the global batch: it must divide by --micro-batch-size x DP",
     "drop it and choose a --global-batch-size that divides"},
    {"--ckpt-format", true, NULL,
     "mega writes one format: Hugging Face safetensors, whole tensors, sharded by size, "
     "loadable at any parallel layout",
     "drop it"},
    {"--use-torch-fsdp2", false, NULL, "mega has no FSDP",
     "use --use-distributed-optimizer (ZeRO-1: sharded optimizer state)"},
    /* Llama's flags from Megatron's scripts and docs/llama_mistral.md */
    {"--attention-softmax-in-fp32", false, yes,
     "mega's attention softmax is in fp32, so this restates what it does", ""},
    {"--no-query-key-layer-scaling", false, yes,
     "mega scales attention scores by 1/sqrt(head width) only, so this restates what it does",
     ""},
    {"--calculate-per-token-loss", false, yes,
     "mega's loss is the mean over every target token of the global batch, so this restates "
     "what it does",
     ""},
    {"--use-rotary-position-embeddings", false, NULL,
     "it is Megatron's deprecated spelling of --position-embedding-type rope",
     "use --position-embedding-type rope (with --normalization RMSNorm --swiglu for Llama)"},
    {"--no-position-embedding", false, NULL,
     "it is Megatron's deprecated flag, which only restates that rotary embeddings replace the "
     "learned ones; mega has no model without position embeddings",
     "drop it and give --position-embedding-type rope"},
    {"--apply-layernorm-1p", false, NULL,
     "mega's norms scale by their weight, initialized to 1, as Hugging Face's LlamaRMSNorm does "
     "(so a checkpoint loads into transformers as saved), not by 1 + a weight initialized to 0 "
     "(Megatron's zero-centered gamma)",
     "drop it"},
    {"--rotary-interleaved", false, NULL,
     "mega's RoPE rotates the two halves of each head's rotated channels against each other "
     "(Megatron's default and Hugging Face's rotate_half), not interleaved pairs",
     "drop it"},
    {"--rotary-seq-len-interpolation-factor", true, NULL,
     "mega's RoPE has no position interpolation", "drop it"},
    {"--use-rope-scaling", false, NULL,
     "mega's RoPE has no Llama 3.1 frequency scaling (its config.json says rope_scaling null)",
     "drop it (and --rope-scaling-factor)"},
    {"--rope-scaling-factor", true, NULL,
     "mega's RoPE has no Llama 3.1 frequency scaling (its config.json says rope_scaling null)",
     "drop it"},
    {"--qk-layernorm", false, NULL,
     "mega's Llama has no norms on q and k: Hugging Face's LlamaForCausalLM cannot hold them",
     "drop it"},
    {"--add-qkv-bias", false, NULL,
     "mega's linear layers have biases all together or none (Hugging Face's LlamaConfig "
     "attention_bias covers q, k, v and o alike)",
     "drop it (without --disable-bias-linear every linear layer has biases)"},
    {"--apply-query-key-layer-scaling", false, NULL,
     "it exists for fp16 softmax, and mega's attention softmax is in fp32", "drop it"},
    {"--cross-entropy-loss-fusion", false, NULL,
     "mega runs no fused cross-entropy kernel (its vocabulary-parallel cross-entropy gives the "
     "same loss)",
     "drop it"},
    {"--tokenizer-model", true, NULL,
     "mega reads text with GPT-2's BPE only (--vocab-file, --merge-file); data that Megatron's "
     "tools/preprocess_data.py tokenized with this model trains as its ids",
     "drop it and give --tokenizer-type NullTokenizer --vocab-size N, N the tokenizer's "
     "vocabulary size less one"},
    /* the rest of examples/llama/train_llama3_8b_h100_fp8.sh */
    {"--manual-gc", false, yes,
     "mega has no Python garbage collector to drive, so this restates what it does", ""},
    {"--no-create-attention-mask-in-dataloader", false, yes,
     "mega's attention is causal without a mask tensor, so this restates what it does", ""},
    {"--empty-unused-memory-level", true, zero,
     "mega's memory is not PyTorch's caching allocator: there is no cache to empty",
     "drop it (0 is accepted)"},
    {"--decoupled-lr", true, NULL, ONE_LR, "drop it (and --decoupled-min-lr)"},
    {"--decoupled-min-lr", true, NULL, ONE_LR, "drop it"},
    {"--grad-reduce-in-bf16", false, NULL,
     "mega reduces gradients in fp32, under --bf16 too", "drop it"},
    {"--mock-data", false, NULL,
     "mega trains on data only (--data-path FILE reads any file as bytes)",
     "give --data-path FILE or PREFIX"},
    {"--tiktoken-pattern", true, NULL,
     "mega reads text with GPT-2's BPE only; data that Megatron's tools/preprocess_data.py "
     "tokenized with tiktoken trains as its ids",
     "drop it and give --tokenizer-type NullTokenizer --vocab-size N, N the tokenizer's "
     "vocabulary size less one"},
    {"--no-mmap-bin-files", false, NULL,
     "mega memory-maps the indexed dataset's .bin (the tokens are the same either way)",
     "drop it"},
    {"--num-workers", true, NULL,
     "mega's ranks read their samples themselves, without data-loader workers", "drop it"},
    {"--profile", false, NULL, NO_PROFILER, TRACE},
    {"--profile-step-start", true, NULL, NO_PROFILER, TRACE},
    {"--profile-step-end", true, NULL, NO_PROFILER, TRACE},
    {"--profile-ranks", true, NULL, NO_PROFILER, TRACE},
    {"--use-pytorch-profiler", false, NULL, NO_PROFILER, TRACE},
    {"--distributed-timeout-minutes", true, NULL,
     "mega bounds every wait itself, and megad's hang check (megactl submit --step-timeout) "
     "ends a stuck step",
     "drop it"},
    /* examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh */
    {"--use-megatron-fsdp", false, NULL, NO_FSDP, ZERO1},
    {"--data-parallel-sharding-strategy", true, no_shard, NO_FSDP,
     "drop it (no_shard is accepted; " ZERO1_SHORT ")"},
    {"--outer-dp-sharding-strategy", true, no_shard, NO_FSDP, "drop it (no_shard is accepted)"},
    {"--fsdp-*", false, NULL, NO_FSDP, "drop it"},
    {"--megatron-fsdp-*", true, NULL, NO_FSDP, "drop it"},
    {"--init-model-with-meta-device", false, NULL,
     "mega builds each rank's own weights in place; there is no meta device (it serves "
     "Megatron FSDP)",
     "drop it"},
    {"--use-nccl-ub", false, NULL, "mega registers no NCCL user buffers", "drop it"},
    {"--num-distributed-optimizer-instances", true, one,
     "mega's distributed optimizer shards over the whole data-parallel group, as one instance",
     "drop it (1 is accepted)"},
    {"--use-precision-aware-optimizer", false, NULL,
     "mega keeps the weights, gradients and Adam's moments in fp32", "drop it"},
    {"--no-check-for-nan-in-loss-and-grad", false, NULL,
     "mega always stops at a gradient norm that is not finite, before a NaN reaches the "
     "weights (Megatron's default check)",
     "drop it"},
    {"--cuda-graph-impl", true, none_only, "mega captures no CUDA graphs",
     "drop it (none is accepted)"},
    {"--logging-level", true, NULL,
     "mega's messages have no levels: refusals and notes go to stderr, Megatron's log line to "
     "stdout",
     "drop it"},
    {"--record-memory-history", false, NULL, NO_PROFILER, TRACE},
    {"--memory-snapshot-path", true, NULL, NO_PROFILER, TRACE},
    /* fp16's loss scaling (the sc21 scripts) */
    {"--loss-scale", true, NULL, NO_LOSS_SCALE, "use --bf16"},
    {"--initial-loss-scale", true, NULL, NO_LOSS_SCALE, "use --bf16"},
    {"--min-loss-scale", true, NULL, NO_LOSS_SCALE, "use --bf16"},
    {"--loss-scale-window", true, NULL, NO_LOSS_SCALE, "use --bf16"},
    {"--hysteresis", true, NULL, NO_LOSS_SCALE, "use --bf16"},
    /* Megatron's weight-decay schedule: constant is --weight-decay throughout */
    {"--weight-decay-incr-style", true, constant, ONE_WD, "drop it (constant is accepted)"},
    {"--start-weight-decay", true, NULL, ONE_WD, "give --weight-decay W"},
    {"--end-weight-decay", true, NULL, ONE_WD, "give --weight-decay W"},
    /* the GPT model configs of Megatron's tests/functional_tests */
    {"--optimizer", true, adam,
     "mega's optimizer is Adam with decoupled weight decay (Megatron's adam, torch's AdamW)",
     "drop it (adam is accepted)"},
    {"--accumulate-allreduce-grads-in-fp32", false, yes,
     "mega accumulates and reduces gradients in fp32, so this restates what it does", ""},
    {"--log-num-zeros-in-grad", false, NULL,
     "mega's log line has no count of zero gradients (its grad norm is Megatron's)",
     "drop it (megaw --json has every iteration's metrics)"},
    {"--log-params-norm", false, NULL,
     "mega's log line has no norm of the parameters (its grad norm is Megatron's)",
     "drop it (megaw --json has every iteration's metrics)"},
    {"--timing-log-level", true, NULL, NO_TIMERS, TRACE},
    {"--timing-log-option", true, NULL, NO_TIMERS, TRACE},
    {"--deterministic-mode", false, NULL,
     "mega has no deterministic mode to switch on: it chooses its kernels and its NCCL and "
     "Gloo settings itself",
     "drop it"},
    {"--ckpt-step", true, NULL,
     "mega resumes from the newest complete checkpoint in --load, not a chosen iteration",
     "drop it, or give --load a directory whose newest checkpoint is that iteration's"},
    {"--ckpt-*", true, NULL, DIST_CKPT, "drop it"},
    {"--dist-ckpt-*", true, NULL, DIST_CKPT, "drop it"},
    {"--no-ckpt-fully-parallel-save", false, NULL, DIST_CKPT, "drop it"},
    {"--auto-detect-ckpt-format", false, NULL, DIST_CKPT, "drop it"},
    {"--async-strategy", true, NULL, DIST_CKPT, "drop it"},
    {"--use-persistent-ckpt-worker", false, NULL,
     "mega's asynchronous save writes on a background thread of each rank, not a worker "
     "process",
     "drop it (--async-save is mega's asynchronous save)"},
    {"--save-retain-interval", true, NULL,
     "mega keeps every checkpoint it saves in --save (it deletes none)", "drop it"},
    {"--eval-global-batch-size", true, NULL,
     "mega evaluates at --global-batch-size, as Megatron does without this flag", "drop it"},
    {"--overlap-param-gather-with-optimizer-step", false, NULL,
     "mega gathers the updated parameters after the whole optimizer step, overlapped with "
     "the next forward",
     "drop it (--overlap-param-gather is that overlap)"},
    {"--tp-comm-overlap", false, NULL,
     "mega has no Transformer Engine userbuffers to overlap tensor-parallel communication "
     "with its GEMMs",
     "drop it (and --tp-comm-overlap-cfg)"},
    {"--tp-comm-overlap-cfg", true, NULL,
     "mega has no Transformer Engine userbuffers to overlap tensor-parallel communication "
     "with its GEMMs",
     "drop it"},
    {"--squared-relu", false, NULL, "mega's MLP is GPT-2's GELU or Llama's SwiGLU (--swiglu)",
     "drop it"},
    {"--expert-tensor-parallel-size", true, NULL, NO_MOE, "drop it"},
    {"--account-for-embedding-in-pipeline-split", false, NULL, PP_SPLIT, PP_LAYOUT},
    {"--account-for-loss-in-pipeline-split", false, NULL, PP_SPLIT, PP_LAYOUT},
    {"--use-checkpoint-args", false, NULL,
     "mega does not read the model's flags from a checkpoint; a load checks config.json's "
     "architecture and every size against the flags given",
     "drop it and give the model's flags"},
};

#define NCOMPAT ((int)(sizeof table / sizeof table[0]))

static bool matches(const compat *c, const char *arg, size_t n) {
  size_t len = strlen(c->name);
  if (c->name[len - 1] == '*') return n >= len - 1 && !memcmp(arg, c->name, len - 1);
  return n == len && !memcmp(arg, c->name, n);
}

int mega_jf_compat_count(void) { return NCOMPAT; }

const char *mega_jf_compat_name(int k) {
  return k >= 0 && k < NCOMPAT && !strchr(table[k].name, '*') ? table[k].name : NULL;
}

mega_status mega_jf_compat_parse(int argc, char *const *argv, int *i, size_t n, mega_err *err) {
  const char *arg = argv[*i];
  const compat *c = NULL;
  for (int k = 0; k < NCOMPAT && !c; k++)
    if (matches(&table[k], arg, n)) c = &table[k];
  if (!c) return MEGA_ERR_NOT_FOUND;
  char name[96];
  snprintf(name, sizeof name, "%.*s", (int)(n < 95 ? n : 95), arg);
  const char *eq = arg[n] == '=' ? arg + n + 1 : NULL;
  const char *v = NULL;
  if (c->value)
    v = eq ? eq : *i + 1 < argc && strncmp(argv[*i + 1], "--", 2) ? argv[*i + 1] : NULL;
  else if (eq)
    return mega_fail(err, MEGA_ERR_INVALID, "%s takes no value (got '%s')", name, arg);
  if (c->value && !v && c->ok)
    return mega_fail(err, MEGA_ERR_INVALID, "%s needs a value (%s %s)", name, name, c->ok[0]);
  bool ok = c->ok && (!c->value || v);
  for (int k = 0; ok && c->value && c->ok[k]; k++)
    if (!strcmp(v, c->ok[k])) {
      *i += eq ? 1 : 2;
      return MEGA_OK;
    }
  if (ok && !c->value) {
    *i += 1;
    return MEGA_OK;
  }
  char given[160] = "";
  if (v) snprintf(given, sizeof given, " %s", v);
  /* the accepted values, said where there are some */
  char okv[128] = "";
  for (int k = 0; c->value && c->ok && c->ok[k]; k++) {
    size_t len = strlen(okv);
    snprintf(okv + len, sizeof okv - len, "%s%s", k ? ", " : "", c->ok[k]);
  }
  return mega_fail(err, MEGA_ERR_INVALID, "%s%s is Megatron's, and mega does not take it%s%s%s: "
                   "%s; %s", name, given, okv[0] ? " (it takes " : "", okv,
                   okv[0] ? ")" : "", c->why, c->instead);
}

/* Megatron's spellings of mega's own flags: the same meaning under another
 * name (Megatron's argparse_meta arg_names and its ddp_ prefix), or, off,
 * its store_false of the same setting (the later of the two wins). */
static const struct {
  const char *megatron, *mega;
  bool off;
} aliases[] = {
    {"--ddp-average-in-collective", "--average-in-collective"},
    {"--ddp-bucket-size", "--bucket-size"},
    {"--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size"},
    {"--microbatch-group-size-per-virtual-pipeline-stage", "--microbatch-group-size-per-vp-stage"},
    {"--overlap-p2p-communication-warmup-flush", "--overlap-p2p-comm-warmup-flush"},
    {"--no-overlap-p2p-communication", "--overlap-p2p-comm", true},
};

const char *mega_jf_compat_alias(const char *arg, size_t n, bool *off) {
  for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++)
    if (strlen(aliases[k].megatron) == n && !memcmp(arg, aliases[k].megatron, n)) {
      *off = aliases[k].off;
      return aliases[k].mega;
    }
  return NULL;
}

/* Megatron's other values of mega's enum flags. */
static const struct {
  const char *name, *hint;
} enum_hints[] = {
    {"--tokenizer-type",
     "mega reads text with GPT-2's BPE only; data that Megatron's tools/preprocess_data.py "
     "tokenized with another tokenizer (Llama's SentencePiece or tiktoken, a Hugging Face one) "
     "trains as its ids: give --tokenizer-type NullTokenizer --vocab-size N, N the tokenizer's "
     "vocabulary size less one"},
    {"--position-embedding-type",
     "mega trains GPT-2's learned positions or Llama's rotary ones (no YaRN, multimodal or "
     "relative positions, and no model without positions)"},
};

const char *mega_jf_compat_enum_hint(const char *name) {
  for (size_t k = 0; k < sizeof enum_hints / sizeof enum_hints[0]; k++)
    if (!strcmp(name, enum_hints[k].name)) return enum_hints[k].hint;
  return NULL;
}

char *mega_jf_compat_help(void) {
  size_t cap = 4096, len = 0, col = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  len += (size_t)snprintf(out, cap, "\nMegatron flags accepted because they restate what mega "
                                    "does:\n ");
  col = 1;
  for (int k = 0; k < NCOMPAT; k++) {
    const compat *c = &table[k];
    if (!c->ok) continue;
    char item[96];
    if (c->value) snprintf(item, sizeof item, " %s %s", c->name, c->ok[0]);
    else snprintf(item, sizeof item, " %s", c->name);
    /* grow rather than cut the list short: room for the item, a line break and the tail */
    if (len + strlen(item) + 256 >= cap) {
      char *bigger = realloc(out, cap * 2);
      if (!bigger) {
        free(out);
        return NULL;
      }
      out = bigger;
      cap *= 2;
    }
    if (col + strlen(item) > 88) {
      len += (size_t)snprintf(out + len, cap - len, "\n ");
      col = 1;
    }
    len += (size_t)snprintf(out + len, cap - len, "%s", item);
    col += strlen(item);
  }
  /* room for Megatron's spellings and the tail */
  char *bigger = realloc(out, cap + 2048);
  if (!bigger) {
    free(out);
    return NULL;
  }
  out = bigger;
  cap += 2048;
  len += (size_t)snprintf(out + len, cap - len, "\nMegatron's spellings of mega's flags:");
  for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++)
    len += (size_t)snprintf(out + len, cap - len, "\n  %s (%s%s)", aliases[k].megatron,
                            aliases[k].mega, aliases[k].off ? " off" : "");
  snprintf(out + len, cap - len,
           "\nOther Megatron flags mega knows but does not take (--fp16, --use-flash-attn,\n"
           "--tensorboard-dir, ...) are refused with the reason and what to use instead.\n");
  return out;
}
