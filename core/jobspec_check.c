/* The checks of a whole job spec, and what the --data-path flags give
 * (jobspec_derived.c: the values derived from a spec, --split's shares and
 * the layout among them). */
#include "core/jobspec.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"
#include "core/schedule.h"
#include "core/topology.h"

/* ---- --data-path ---- */

/* A weight: a finite number; the check says more. */
static bool weight_text(const char *w, double *out) {
  char *end;
  errno = 0;
  double x = strtod(w, &end);
  if (end == w || *end || errno == ERANGE || !isfinite(x)) return false;
  if (out) *out = x;
  return true;
}

int mega_jobspec_blend_count(const mega_strlist *l) {
  return l->n == 1 ? 1 : l->n % 2 == 0 ? l->n / 2 : 0;
}

const char *mega_jobspec_blend_prefix(const mega_strlist *l, int k) {
  if (k < 0 || k >= mega_jobspec_blend_count(l)) return NULL;
  return l->n == 1 ? l->v[0] : l->v[2 * k + 1];
}

double mega_jobspec_blend_weight(const mega_strlist *l, int k) {
  double w = 1;
  if (l->n > 1 && k >= 0 && k < mega_jobspec_blend_count(l)) weight_text(l->v[2 * k], &w);
  return w;
}

const mega_strlist *mega_jobspec_train_data(const mega_jobspec *s) {
  return s->train_data_path.n ? &s->train_data_path : &s->data_path;
}

const char *mega_jobspec_data_file(const mega_jobspec *s, int k, const char **flag) {
  int n = mega_jobspec_data_count(s);
  if (flag)
    *flag = k >= n ? "--valid-data-path" : s->train_data_path.n ? "--train-data-path"
                                                                 : "--data-path";
  return k < n ? mega_jobspec_data_prefix(s, k)
               : mega_jobspec_blend_prefix(&s->valid_data_path, k - n);
}

int mega_jobspec_data_count(const mega_jobspec *s) {
  return mega_jobspec_blend_count(mega_jobspec_train_data(s));
}

const char *mega_jobspec_data_prefix(const mega_jobspec *s, int k) {
  return mega_jobspec_blend_prefix(mega_jobspec_train_data(s), k);
}

double mega_jobspec_data_weight(const mega_jobspec *s, int k) {
  return mega_jobspec_blend_weight(mega_jobspec_train_data(s), k);
}

const char *mega_jobspec_data_single(const mega_jobspec *s) {
  return mega_jobspec_data_count(s) == 1 ? mega_jobspec_data_prefix(s, 0) : NULL;
}

/* A data flag's words: FILE, PREFIX, or weighted pairs. */
static mega_status check_blend(const char *flag, const mega_strlist *d, mega_err *err) {
  if (d->n > 1) {
    if (d->n % 2)
      return BAD("%s has %d words; a blend is weighted pairs W1 P1 W2 P2 ... (an even count), "
                 "a single dataset one FILE or PREFIX",
                 flag, d->n);
    for (int k = 0; k < d->n; k += 2) {
      double w;
      if (!weight_text(d->v[k], &w))
        return BAD("%s: '%s' is not a weight; a blend is weighted pairs W1 P1 W2 P2 ..., e.g. "
                   "%s 0.3 web 0.7 books",
                   flag, d->v[k], flag);
      if (!(w > 0))
        return BAD("%s: the weight of %s is %s; weights must be greater than 0", flag,
                   d->v[k + 1], d->v[k]);
    }
  }
  return MEGA_OK;
}

/* The data flags: --data-path's three forms or the train and valid paths,
 * --split, the tokenizer. */
static mega_status check_data(const mega_jobspec *s, mega_err *err) {
  mega_status st;
  if ((st = check_blend("--data-path", &s->data_path, err)) != MEGA_OK ||
      (st = check_blend("--train-data-path", &s->train_data_path, err)) != MEGA_OK ||
      (st = check_blend("--valid-data-path", &s->valid_data_path, err)) != MEGA_OK)
    return st;
  if (!s->data_path.n && !s->train_data_path.n) return BAD("--data-path is required");
  if (s->data_path.n && s->train_data_path.n)
    return BAD("--data-path and --train-data-path exclude each other; give the training data "
               "once");
  if (s->valid_data_path.n && !s->train_data_path.n)
    return BAD("--valid-data-path needs --train-data-path (with --data-path, --split gives "
               "evaluation a valid split)");
  /* Megatron evaluates it after training even without --eval-interval
   * (do_valid); --eval-iters 0 leaves it nothing to do */
  if (s->valid_data_path.n && s->eval_iters == 0)
    return BAD("--valid-data-path is what evaluation reads; give --eval-interval N and "
               "--eval-iters N (0 turns evaluation off) too, or --eval-iters N alone for the "
               "evaluation after training only");
  if (s->split && s->train_data_path.n)
    return BAD("--split divides --data-path; with --train-data-path give evaluation's data as "
               "--valid-data-path");
  double split[3];
  mega_err sub = {0};
  if (mega_jobspec_split(s, split, &sub) != MEGA_OK) return BAD("%s", sub.msg);
  if (s->split && split[0] == 0)
    return BAD("--split '%s' leaves no documents for training", s->split);
  if (s->split && mega_jobspec_evaluates(s) && split[1] == 0)
    return BAD("--split '%s' has no valid share, which --eval-interval reads; give it one, "
               "e.g. 969,30,1",
               s->split);
  if (s->data_order == MEGA_DATA_ORDER_MEGATRON && s->data_path.n && !s->split)
    return BAD("--data-order megatron with --data-path needs --split: Megatron reads a missing "
               "--split as 969,30,1 (its legacy default), which would train on 96.9%% of the "
               "documents; give --split 969,30,1 for that, or --split 100,0,0 for all of them");
  if (s->data_cache_path && s->data_order != MEGA_DATA_ORDER_MEGATRON)
    return BAD("--data-cache-path caches Megatron's order's sample index, but file order "
               "(--data-order file) has none to cache: give --data-order megatron or drop "
               "--data-cache-path");
  if (s->data_order == MEGA_DATA_ORDER_MEGATRON && s->train_data_path.n &&
      !s->valid_data_path.n && mega_jobspec_evaluates(s))
    return BAD("--data-order megatron evaluates only on Megatron's validation data: give "
               "--valid-data-path, or drop --eval-interval (mega's evaluation from the end of "
               "the training stream is not Megatron's)");
  if (s->tokenizer_type == MEGA_TOKENIZER_NULL && s->vocab_size < 0)
    return BAD("--tokenizer-type NullTokenizer needs --vocab-size N (token ids 0..N)");
  int tok = mega_jobspec_tokenizer(s);
  if (tok == MEGA_TOKENIZER_GPT2BPE && s->vocab_size >= 0)
    return BAD("--vocab-size is NullTokenizer's; GPT2BPETokenizer's vocabulary is the entries "
               "of --vocab-file, so drop --vocab-size");
  if (s->tokenizer_type != MEGA_TOKENIZER_NULL && s->vocab_size >= 0)
    return BAD("--vocab-size needs --tokenizer-type NullTokenizer (the byte tokenizer has "
               "256 tokens)");
  if (tok == MEGA_TOKENIZER_GPT2BPE && (!s->vocab_file || !s->merge_file))
    return BAD("GPT2BPETokenizer needs --vocab-file (GPT-2's vocab.json) and --merge-file "
               "(its merges.txt)");
  if (tok != MEGA_TOKENIZER_GPT2BPE && (s->vocab_file || s->merge_file))
    return BAD("%s is GPT2BPETokenizer's, but --tokenizer-type is NullTokenizer; drop one of "
               "them", s->vocab_file ? "--vocab-file" : "--merge-file");
  if (s->tokenizer_type == MEGA_TOKENIZER_NULL && s->vocab_size >= INT_MAX / 2)
    return BAD("--vocab-size %d is too large", s->vocab_size);
  /* the model's bound (worker/model/gpt.c): every tensor indexes in int */
  if (s->tokenizer_type == MEGA_TOKENIZER_NULL && mega_jobspec_padded_vocab(s) > (1 << 24))
    return BAD("--vocab-size %d pads to %d rows, more than the %d a model may have",
               s->vocab_size, mega_jobspec_padded_vocab(s), 1 << 24);
  return MEGA_OK;
}

/* ---- checking ---- */

static mega_status check_flag(const mega_jobspec *s, const flagdef *f, mega_err *err) {
  const mega_jobflag *in = &f->info;
  switch (in->type) {
  case MEGA_JOBFLAG_INT: {
    int v = *CFIELD(s, f, int);
    /* Megatron's global batch defaults to micro x DP; mega's is always given */
    if (in->required && v == f->idef && f->off == offsetof(mega_jobspec, global_batch_size))
      return BAD("%s is required (Megatron's default, --micro-batch-size × data-parallel size, "
                 "is not mega's: give --global-batch-size N)", in->name);
    if (in->required && v == f->idef) return BAD("%s is required", in->name);
    if (v == f->idef) return MEGA_OK;
    return mega_jf_check_bounds(f, v, "invalid job: ", err);
  }
  case MEGA_JOBFLAG_FLOAT: {
    double v = *CFIELD(s, f, double);
    if (in->required && isnan(v)) return BAD("%s is required", in->name);
    if (isnan(v) && isnan(f->fdef)) return MEGA_OK; /* absent */
    return mega_jf_check_bounds(f, v, "invalid job: ", err);
  }
  case MEGA_JOBFLAG_STRING: {
    const char *v = *CFIELD(s, f, char *);
    if (in->required && !v) return BAD("%s is required", in->name);
    if (v && !*v) return BAD("%s is empty", in->name);
    return MEGA_OK;
  }
  case MEGA_JOBFLAG_ENUM: {
    int v = *CFIELD(s, f, int);
    if (v == f->idef || (v >= 0 && v < mega_jf_nchoices(f))) return MEGA_OK;
    return BAD("%s has no choice number %d; it takes %s", in->name, v, in->metavar);
  }
  case MEGA_JOBFLAG_LIST:
    if (in->required && !CFIELD(s, f, mega_strlist)->n) return BAD("%s is required", in->name);
    return MEGA_OK;
  case MEGA_JOBFLAG_BOOL: return MEGA_OK;
  }
  return MEGA_OK;
}

/* The data-parallel flags Megatron ties together. */
static mega_status check_data_parallel(const mega_jobspec *s, mega_err *err) {
  if (s->align_grad_reduce && !s->overlap_grad_reduce)
    return BAD("--align-grad-reduce needs --overlap-grad-reduce (without it the reduction "
               "follows the schedule on every stage)");
  if (s->bucket_size >= 0 && !s->overlap_grad_reduce)
    return BAD("--bucket-size needs --overlap-grad-reduce (without it the gradients form one "
               "bucket)");
  if (s->overlap_param_gather && !s->use_distributed_optimizer)
    return BAD("--overlap-param-gather needs --use-distributed-optimizer (only sharded "
               "parameters are gathered)");
  if (s->no_optimizer_shard_copy && !s->use_distributed_optimizer)
    return BAD("--no-optimizer-shard-copy needs --use-distributed-optimizer (only a sharded "
               "optimizer keeps copies of its shards)");
  if (s->overlap_param_gather && !s->overlap_grad_reduce)
    return BAD("--overlap-param-gather needs --overlap-grad-reduce, as in Megatron");
  return MEGA_OK;
}

/* Megatron's recomputation flags (TransformerConfig's checks): full needs a
 * method and a layer count of at most a model chunk's layers; selective
 * takes neither. max_chunk is the most decoder layers one chunk holds. */
static mega_status check_recompute(const mega_jobspec *s, int max_chunk, mega_err *err) {
  const char *given = s->recompute_method >= 0      ? "--recompute-method"
                      : s->recompute_num_layers > 0 ? "--recompute-num-layers"
                                                    : NULL;
  if (s->recompute_granularity == MEGA_RECOMPUTE_NONE) {
    if (given)
      return BAD("%s needs --recompute-granularity full (without it nothing is recomputed)",
                 given);
    return MEGA_OK;
  }
  if (s->simulate_compute)
    return BAD("--recompute-granularity with --simulate-compute recomputes nothing (simulated "
               "compute keeps no activations); drop one of them");
  if (s->recompute_granularity == MEGA_RECOMPUTE_SELECTIVE) {
    if (given)
      return BAD("%s is for --recompute-granularity full; selective recomputation always "
                 "recomputes the attention core of every layer, so drop %s",
                 given, given);
    return MEGA_OK;
  }
  if (s->recompute_method < 0)
    return BAD("--recompute-granularity full needs --recompute-method uniform|block "
               "(uniform: groups of N layers; block: the first N layers of each model chunk)");
  if (s->recompute_num_layers < 1)
    return BAD("--recompute-granularity full needs --recompute-num-layers N, between 1 and "
               "the %d decoder layers of the largest model chunk",
               max_chunk);
  if (s->recompute_num_layers > max_chunk)
    return BAD("--recompute-num-layers %d is more than the %d decoder layers of the largest "
               "model chunk; use 1 to %d",
               s->recompute_num_layers, max_chunk, max_chunk);
  return MEGA_OK;
}

static mega_status check_parallel(const mega_jobspec *s, mega_err *err) {
  mega_layout l;
  mega_status st = mega_jobspec_layout(s, &l, err);
  if (st != MEGA_OK) return st;
  int decoders = mega_layout_total(&l, MEGA_LAYER_DECODER);
  int mtp = mega_layout_total(&l, MEGA_LAYER_MTP);
  int max_chunk = 0, vp = l.vp;
  for (int p = 0; p < l.pp; p++)
    for (int v = 0; v < l.vp; v++) {
      int n = mega_layout_count(&l, p, v, MEGA_LAYER_DECODER);
      if (n > max_chunk) max_chunk = n;
    }
  mega_layout_free(&l);
  if ((st = check_recompute(s, max_chunk, err)) != MEGA_OK) return st;
  if (s->pipeline_model_parallel_layout) {
    if (decoders != s->num_layers)
      return BAD("--pipeline-model-parallel-layout has %d decoder layers ('t') but "
                 "--num-layers is %d",
                 decoders, s->num_layers);
    if (mtp > 0)
      return BAD("--pipeline-model-parallel-layout has %d multi-token prediction layer%s "
                 "('m'), which mega's GPT model does not have; remove them",
                 mtp, mtp == 1 ? "" : "s");
  }
  /* Megatron's interleaved schedule reads it; any other one would not */
  if (s->microbatch_group_size_per_vp_stage > 0 && vp < 2)
    return BAD("--microbatch-group-size-per-vp-stage groups the microbatches of the interleaved "
               "schedule's model chunks, which needs a virtual pipeline (VP > 1); without one "
               "it changes nothing: drop it, or give --virtual-pipeline-model-parallel-size or "
               "--num-layers-per-virtual-pipeline-stage");
  if (s->overlap_p2p_comm_warmup_flush && !s->overlap_p2p_comm)
    return BAD("--overlap-p2p-comm-warmup-flush needs --overlap-p2p-comm");
  if (s->overlap_p2p_comm_warmup_flush && s->batch_p2p_comm)
    return BAD("--overlap-p2p-comm-warmup-flush cannot be used with --batch-p2p-comm");
  if (s->overlap_p2p_comm && s->batch_p2p_comm)
    return BAD("--overlap-p2p-comm cannot be used with --batch-p2p-comm; pick one");
  int tp = s->tensor_model_parallel_size;
  if (s->sequence_parallel && tp > 1 && s->seq_length % tp)
    return BAD("--sequence-parallel splits the sequence over the tensor-parallel ranks: "
               "--seq-length %d is not divisible by --tensor-model-parallel-size %d",
               s->seq_length, tp);
  if (s->sequence_parallel && tp > 1 && s->variable_seq_lengths)
    return BAD("--sequence-parallel needs every sequence length divisible by "
               "--tensor-model-parallel-size, which --variable-seq-lengths does not keep; "
               "drop one of them");
  return check_data_parallel(s, err);
}

/* The flags that restate what mega does: any other value is refused with
 * the reason. */
static mega_status check_restated(const mega_jobspec *s, mega_err *err) {
  if (s->context_parallel_size != 1)
    return BAD("--context-parallel-size %d: mega has no context parallelism, so it takes only 1",
               s->context_parallel_size);
  if (s->transformer_impl == MEGA_TRANSFORMER_ENGINE)
    return BAD("--transformer-impl transformer_engine: mega runs its own kernels, not "
               "Transformer Engine's; use local or drop the flag");
  return MEGA_OK;
}

/* The architecture: GPT-2, or Llama with rope, RMSNorm and SwiGLU
 * together (the two Hugging Face classes a checkpoint is), and what each
 * allows. */
static mega_status check_arch(const mega_jobspec *s, mega_err *err) {
  bool rope = s->position_embedding_type == MEGA_POS_ROPE;
  bool rms = s->normalization == MEGA_NORM_RMSNORM;
  const char *given = rope ? "--position-embedding-type rope"
                      : rms ? "--normalization RMSNorm"
                      : s->swiglu ? "--swiglu" : NULL;
  const char *lacks = !rope ? "--position-embedding-type rope"
                      : !rms ? "--normalization RMSNorm" : "--swiglu";
  if (given && !mega_jobspec_llama(s))
    return BAD("%s without %s: mega trains GPT-2 (learned_absolute positions, LayerNorm, "
               "GELU) or Llama (--position-embedding-type rope --normalization RMSNorm "
               "--swiglu), the two Hugging Face architectures its checkpoints are; give all "
               "three for Llama, or none for GPT-2",
               given, lacks);
  if (!rope && (s->rotary_base != 10000 || s->rotary_percent != 1.0))
    return BAD("%s needs --position-embedding-type rope",
               s->rotary_base != 10000 ? "--rotary-base" : "--rotary-percent");
  if (!mega_jobspec_llama(s)) {
    const char *llama_only = s->group_query_attention ? "--group-query-attention"
                             : s->disable_bias_linear ? "--disable-bias-linear" : NULL;
    if (llama_only)
      return BAD("%s needs the Llama architecture (--position-embedding-type rope "
                 "--normalization RMSNorm --swiglu): Hugging Face's GPT-2 has %s",
                 llama_only, s->group_query_attention ? "no query groups" : "biases always");
    if (s->kv_channels > 0 && s->kv_channels * s->num_attention_heads != s->hidden_size)
      return BAD("--kv-channels %d: GPT-2's heads are --hidden-size / --num-attention-heads "
                 "wide; other widths need the Llama architecture",
                 s->kv_channels);
  }
  if (s->num_query_groups > 0 && !s->group_query_attention)
    return BAD("--num-query-groups needs --group-query-attention (without it every head is "
               "its own group)");
  return MEGA_OK;
}

/* Heads, query groups, head and MLP widths against each other and TP. */
static mega_status check_model_sizes(const mega_jobspec *s, mega_err *err) {
  int tp = s->tensor_model_parallel_size, heads = s->num_attention_heads;
  if (s->kv_channels < 0 && s->hidden_size % heads)
    return BAD("--hidden-size %d is not divisible by --num-attention-heads %d", s->hidden_size,
               heads);
  if (heads % tp)
    return BAD("--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d",
               heads, tp);
  int groups = mega_jobspec_query_groups(s);
  if (heads % groups)
    return BAD("--num-attention-heads %d is not divisible by --num-query-groups %d: each "
               "query group shares its key and value heads with the same number of query heads",
               heads, groups);
  if (groups % tp && s->num_query_groups < 0)
    return BAD("--group-query-attention without --num-query-groups is one key/value head for "
               "all query heads (Megatron's default --num-query-groups 1), which "
               "--tensor-model-parallel-size %d cannot split: each tensor-parallel rank holds "
               "whole query groups; give --num-query-groups G, a multiple of %d",
               tp, tp);
  if (groups % tp)
    return BAD("--num-query-groups %d is not divisible by --tensor-model-parallel-size %d: "
               "each tensor-parallel rank holds whole query groups",
               groups, tp);
  int ffn = mega_jobspec_ffn_hidden_size(s);
  if (ffn < 1)
    return BAD("--swiglu without --ffn-hidden-size takes Megatron's default "
               "int(4 x %d x 2/3 / 64) x 64 = 0 for --hidden-size %d; give --ffn-hidden-size N",
               s->hidden_size, s->hidden_size);
  if (ffn % tp)
    return BAD("the MLP's width %d (%s) is not divisible by --tensor-model-parallel-size %d",
               ffn, s->ffn_hidden_size > 0 ? "--ffn-hidden-size" : "its default", tp);
  if (s->position_embedding_type == MEGA_POS_ROPE) {
    int kv = mega_jobspec_kv_channels(s), rot = (int)(kv * s->rotary_percent); /* Megatron's, in double */
    if (rot < 2 || rot % 2)
      return BAD("--rotary-percent %g of %d channels per head rotates %d; RoPE turns pairs of "
                 "channels, so that must be even and at least 2",
                 s->rotary_percent, kv, rot);
  }
  return MEGA_OK;
}

/* Megatron's load flags: each needs --load, and the scheduler's choices
 * exclude each other. */
static mega_status check_load_flags(const mega_jobspec *s, mega_err *err) {
  static const struct {
    const char *flag;
    size_t off;
  } needs_load[] = {
      {"--finetune", offsetof(mega_jobspec, finetune)},
      {"--no-load-optim", offsetof(mega_jobspec, no_load_optim)},
      {"--no-load-rng", offsetof(mega_jobspec, no_load_rng)},
      {"--exit-on-missing-checkpoint", offsetof(mega_jobspec, exit_on_missing_checkpoint)},
      {"--override-opt_param-scheduler", offsetof(mega_jobspec, override_opt_param_scheduler)},
      {"--use-checkpoint-opt_param-scheduler",
       offsetof(mega_jobspec, use_checkpoint_opt_param_scheduler)},
  };
  for (size_t i = 0; i < sizeof needs_load / sizeof needs_load[0]; i++)
    if (*(const bool *)((const char *)s + needs_load[i].off) && !s->load)
      return BAD("%s needs --load DIR", needs_load[i].flag);
  if (s->override_opt_param_scheduler && s->use_checkpoint_opt_param_scheduler)
    return BAD("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler "
               "exclude each other; pick the job's LR schedule or the checkpoint's");
  if (s->use_checkpoint_opt_param_scheduler && (s->finetune || s->no_load_optim))
    return BAD("--use-checkpoint-opt_param-scheduler cannot be used with %s, which does not "
               "load the checkpoint's LR schedule (Megatron loads it with the optimizer)",
               s->finetune ? "--finetune" : "--no-load-optim");
  return MEGA_OK;
}

/* Upper bounds on what comes from outside, checked before any arithmetic
 * (products of these fit in 64 bits): a value past them is a typo or an
 * attack, never a model this program trains. */
static mega_status check_bounds(const mega_jobspec *s, mega_err *err) {
  static const struct {
    const char *flag;
    size_t off;
    int max;
  } b[] = {
#define B(f, field, max) {f, offsetof(mega_jobspec, field), max}
      B("--num-layers", num_layers, 4096),
      B("--hidden-size", hidden_size, 1 << 17),
      B("--num-attention-heads", num_attention_heads, 4096),
      B("--num-query-groups", num_query_groups, 4096),
      B("--kv-channels", kv_channels, 1 << 16),
      B("--ffn-hidden-size", ffn_hidden_size, 1 << 20),
      B("--context-parallel-size", context_parallel_size, 4096),
      B("--seq-length", seq_length, 1 << 20),
      B("--max-position-embeddings", max_position_embeddings, 1 << 20),
      B("--micro-batch-size", micro_batch_size, 1 << 16),
      B("--global-batch-size", global_batch_size, 1 << 24),
      B("--train-iters", train_iters, 1 << 30),
      B("--train-samples", train_samples, INT_MAX - (1 << 24)),
      B("--tensor-model-parallel-size", tensor_model_parallel_size, 4096),
      B("--pipeline-model-parallel-size", pipeline_model_parallel_size, 4096),
      B("--virtual-pipeline-model-parallel-size", virtual_pipeline_model_parallel_size, 4096),
      B("--eval-iters", eval_iters, 1 << 20),
      B("--blas-threads", blas_threads, 1024),
#undef B
  };
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    int v = *(const int *)(const void *)((const char *)s + b[i].off);
    if (v > b[i].max) return BAD("%s %d is larger than the %d allowed", b[i].flag, v, b[i].max);
  }
  /* the model's bound on attention's width (worker/model/gpt.c) */
  if (s->kv_channels > 0 && (int64_t)s->kv_channels * s->num_attention_heads > (1 << 22))
    return BAD("--kv-channels %d x --num-attention-heads %d is larger than the %d allowed",
               s->kv_channels, s->num_attention_heads, 1 << 22);
  const char *layout = s->pipeline_model_parallel_layout;
  if (layout && strlen(layout) > 4096)
    return BAD("--pipeline-model-parallel-layout is %zu characters, more than the 4096 allowed",
               strlen(layout));
  return MEGA_OK;
}

mega_status mega_jobspec_check(const mega_jobspec *s, int world_size, long long data_bytes,
                               mega_err *err) {
  mega_status st;
  for (int i = 0; i < NFLAGS; i++)
    if ((st = check_flag(s, &mega_jf_table[i], err)) != MEGA_OK) return st;
  if ((st = check_bounds(s, err)) != MEGA_OK) return st;

  int tp = s->tensor_model_parallel_size, pp = s->pipeline_model_parallel_size, dp = 0;
  if (world_size < 0) return BAD("world size must be at least 1 (got %d)", world_size);
  if (world_size > 0) {
    mega_topo t;
    mega_err sub = {0};
    if ((st = mega_topo_init(&t, world_size, tp, pp, &sub)) != MEGA_OK)
      return mega_fail(err, st, "invalid job: %s", sub.msg);
    dp = t.dp;
  }
  if ((st = mega_jobspec_check_batch(s, dp, err)) != MEGA_OK) return st;

  if ((st = check_restated(s, err)) != MEGA_OK || (st = check_arch(s, err)) != MEGA_OK ||
      (st = check_model_sizes(s, err)) != MEGA_OK)
    return st;
  int max_pos = mega_jobspec_max_position_embeddings(s);
  if (s->seq_length > max_pos)
    return BAD("--seq-length %d is longer than --max-position-embeddings %d", s->seq_length,
               max_pos);
  if ((st = check_data(s, err)) != MEGA_OK) return st;
  if (data_bytes >= 0 && mega_jobspec_data_single(s) && data_bytes < (long long)s->seq_length + 1)
    return BAD("the data file %s has %lld bytes, fewer than one window of --seq-length + 1 = "
               "%lld bytes",
               mega_jobspec_data_single(s), data_bytes, (long long)s->seq_length + 1);

  if (dp > 0) {
    long long per = (long long)s->micro_batch_size * dp;
    if (s->global_batch_size % per)
      return BAD("--global-batch-size %d is not divisible by --micro-batch-size %d × "
                 "data-parallel size %d = %lld",
                 s->global_batch_size, s->micro_batch_size, dp, per);
  } else if (s->global_batch_size % s->micro_batch_size) {
    return BAD("--global-batch-size %d is not divisible by --micro-batch-size %d",
               s->global_batch_size, s->micro_batch_size);
  }

  if ((st = mega_jobspec_check_lr(s, err)) != MEGA_OK) return st;

  if (!s->save && s->save_interval > 0) return BAD("--save-interval needs --save DIR");
  if (!s->save && s->save_initial) return BAD("--save-initial needs --save DIR");
  if (!s->save && s->async_save) return BAD("--async-save needs --save DIR");
  if ((st = check_load_flags(s, err)) != MEGA_OK) return st;
  if (s->trace_iteration > 0 && s->trace_iteration > mega_jobspec_train_iters(s))
    return BAD("--trace-iteration %d is past the last iteration, %lld", s->trace_iteration,
               (long long)mega_jobspec_train_iters(s));

  if ((st = check_parallel(s, err)) != MEGA_OK) return st;

  if (s->simulate_compute) {
    mega_err sub = {0};
    if ((st = mega_jobspec_parse_simulate_compute(s->simulate_compute, NULL, &sub)) != MEGA_OK)
      return mega_fail(err, st, "invalid job: %s", sub.msg);
    if (s->bf16)
      return BAD("--bf16 changes the GEMMs' inputs, and --simulate-compute runs no GEMMs; drop "
                 "one of them");
    /* its optimizer never steps: a checkpoint of it would not load */
    if (s->save)
      return BAD("--simulate-compute trains nothing, so there is nothing to --save; drop one "
                 "of them");
  }
  return MEGA_OK;
}

mega_status mega_jobspec_check_node(const mega_jobspec *s, int nproc_per_node, mega_err *err) {
  int tp = s->tensor_model_parallel_size;
  if (tp > nproc_per_node)
    return BAD("--tensor-model-parallel-size %d is larger than the %d process%s a node runs "
               "(--nproc-per-node, or the node's slots); a TP group stays inside one node",
               tp, nproc_per_node, nproc_per_node == 1 ? "" : "es");
  if (nproc_per_node % tp)
    return BAD("--tensor-model-parallel-size %d does not divide the %d processes a node runs "
               "(--nproc-per-node, or the node's slots); a TP group stays inside one node",
               tp, nproc_per_node);
  return MEGA_OK;
}

void mega_jobspec_sched_params(const mega_jobspec *s, int world_size, mega_sched_params *out) {
  int pp = s->pipeline_model_parallel_size, vp = mega_jobspec_vp(s);
  *out = (mega_sched_params){
      .kind = s->schedule >= 0 ? (mega_sched_kind)s->schedule : mega_sched_default_kind(pp, vp),
      .pp = pp, .vp = vp, .microbatches = mega_jobspec_num_microbatches(s, world_size),
      .group_size = vp > 1 ? mega_jobspec_group_size(s) : 0};
}

mega_status mega_jobspec_check_all(const mega_jobspec *s, int world_size, long long data_bytes,
                                   mega_err *err) {
  mega_status st = mega_jobspec_check(s, world_size, data_bytes, err);
  if (st != MEGA_OK || world_size <= 0) return st;
  mega_sched_params p;
  mega_jobspec_sched_params(s, world_size, &p);
  st = mega_sched_check_params(&p, err);
  /* a ramp runs the schedule at every batch it passes through */
  int64_t r[3];
  int dp = mega_jobspec_dp(s, world_size);
  for (int64_t b = 0; st == MEGA_OK && mega_jobspec_rampup(s, r) && b < s->global_batch_size;) {
    b = b ? b + r[1] : r[0];
    p.microbatches = (int)(b / ((int64_t)s->micro_batch_size * dp));
    st = mega_sched_check_params(&p, err);
    if (st != MEGA_OK) mega_err_prefix(err, "at the ramp's global batch %lld", (long long)b);
  }
  if (st != MEGA_OK) mega_err_prefix(err, "invalid job");
  return st;
}
