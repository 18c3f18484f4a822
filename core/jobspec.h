/* A job's flags, parsed and checked in one place.
 *
 * megactl, megad and megaw accept the same job flags (Megatron's names) and
 * must give the same errors, so all three go through this module. One static
 * table describes every flag (name, type, field, default, bounds, help);
 * parsing, help text, argv serialization and JSON all come from it.
 *
 * Typical use:
 *
 *   mega_jobspec s;
 *   mega_jobspec_defaults(&s);
 *   for (int i = 1; i < argc;) {
 *     mega_status st = mega_jobspec_parse_flag(&s, argc, argv, &i, &err);
 *     if (st == MEGA_ERR_NOT_FOUND) st = my_own_flag(argc, argv, &i, &err);
 *     if (st != MEGA_OK) { report(err.msg); break; }
 *   }
 *   mega_jobspec_check(&s, world_size, data_bytes, &err);
 *   ...
 *   mega_jobspec_free(&s);
 *
 * Two stages of errors: parse rejects a value that cannot be stored or is
 * below its flag's minimum ("--hidden-size: 'abc' is not an integer");
 * check rejects a combination ("invalid job: world size 6 is not divisible
 * by TP·PP = 4 (TP 2 × PP 2)"). check does not apply the schedule's own
 * microbatch rules: callers also run mega_sched_check_params (core/schedule.h)
 * on the parameters the helpers below give.
 *
 * "Absent" values: an optional int whose default is derived from other flags
 * holds -1 until given (the accessors below resolve it); an optional enum
 * holds -1; a string holds NULL; a list holds no words; --lr holds NAN
 * until given.
 *
 * Ownership: a mega_jobspec owns its strings (malloc'd); release them with
 * mega_jobspec_free. Flag descriptions (mega_jobflag) are static. Arrays and
 * JSON returned by the functions below are the caller's, as each says. */
#ifndef MEGA_CORE_JOBSPEC_H
#define MEGA_CORE_JOBSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/layout.h"
#include "core/status.h"

/* The byte tokenizer's vocabulary (the default): every byte value is a token. */
#define MEGA_VOCAB_SIZE 256

/* A flag that takes several words: --data-path W1 P1 W2 P2 ... The words
 * are malloc'd and owned by the spec; n 0 means absent. */
typedef struct mega_strlist {
  int n;
  char **v;
} mega_strlist;

/* --tokenizer-type (absent: the byte tokenizer). */
typedef enum mega_tokenizer {
  MEGA_TOKENIZER_BYTES = -1, /* flag absent */
  MEGA_TOKENIZER_NULL,       /* Megatron's NullTokenizer: ids given, --vocab-size N */
  MEGA_TOKENIZER_GPT2BPE,    /* GPT2BPETokenizer: --vocab-file and --merge-file */
} mega_tokenizer;

/* --data-order: the order training reads its samples in (README, "Data
 * order"). */
typedef enum mega_data_order {
  MEGA_DATA_ORDER_FILE,     /* windows in file order, a closed formula */
  MEGA_DATA_ORDER_MEGATRON, /* Megatron-LM core's GPTDataset: shuffled by --seed */
} mega_data_order;

typedef enum mega_lr_style {
  MEGA_LR_CONSTANT,
  MEGA_LR_LINEAR, /* Megatron's default */
  MEGA_LR_COSINE,
  MEGA_LR_INVERSE_SQRT, /* inverse-square-root */
  MEGA_LR_WSD,          /* warmup, stable, decay (--lr-wsd-decay-style) */
} mega_lr_style;

/* --lr-wsd-decay-style: the shape of WSD's final anneal. */
typedef enum mega_wsd_style {
  MEGA_WSD_EXPONENTIAL, /* Megatron's default */
  MEGA_WSD_LINEAR,
  MEGA_WSD_COSINE,
  MEGA_WSD_MINUS_SQRT,
} mega_wsd_style;

typedef enum mega_recompute {
  MEGA_RECOMPUTE_NONE = -1, /* flag absent */
  MEGA_RECOMPUTE_FULL,
  MEGA_RECOMPUTE_SELECTIVE,
} mega_recompute;

typedef enum mega_recompute_method {
  MEGA_RECOMPUTE_METHOD_NONE = -1, /* flag absent */
  MEGA_RECOMPUTE_UNIFORM,
  MEGA_RECOMPUTE_BLOCK,
} mega_recompute_method;

/* --schedule absent: the schedule is chosen automatically
 * (mega_sched_default_kind). Otherwise the field holds a mega_sched_kind:
 * no-pipelining, gpipe, 1f1b, interleaved or zb-h1. */
#define MEGA_JOB_SCHEDULE_AUTO (-1)

/* --position-embedding-type (Megatron's names). */
typedef enum mega_pos_emb {
  MEGA_POS_LEARNED_ABSOLUTE, /* GPT-2's wpe (the default) */
  MEGA_POS_ROPE,             /* rotary, Llama's */
} mega_pos_emb;

/* --normalization */
typedef enum mega_norm {
  MEGA_NORM_LAYERNORM, /* the default */
  MEGA_NORM_RMSNORM,
} mega_norm;

/* --transformer-impl: only mega's own is accepted (the flag restates it). */
typedef enum mega_transformer_impl {
  MEGA_TRANSFORMER_LOCAL,
  MEGA_TRANSFORMER_ENGINE, /* refused: mega has no Transformer Engine */
} mega_transformer_impl;

/* --backend: the worker's math backend. */
typedef enum mega_job_backend {
  MEGA_JOB_BACKEND_AUTO = 0, /* cuda where a GPU and the cuda module are, else cpu */
  MEGA_JOB_BACKEND_CPU,
  MEGA_JOB_BACKEND_CUDA,
} mega_job_backend;

typedef struct mega_jobspec {
  /* model */
  int num_layers;              /* --num-layers, required */
  int hidden_size;             /* --hidden-size, required */
  int num_attention_heads;     /* --num-attention-heads, required */
  int seq_length;              /* --seq-length, required */
  int max_position_embeddings; /* -1: seq-length */
  double init_method_std;      /* 0.02 */
  int seed;                    /* 1234 */
  /* the architecture: GPT-2 by default; Llama with rope, RMSNorm and
   * SwiGLU together (mega_jobspec_llama) */
  int position_embedding_type;  /* mega_pos_emb */
  int rotary_base;              /* 10000; with rope */
  double rotary_percent;        /* 1; with rope: the share of each head rotated */
  int normalization;            /* mega_norm */
  double norm_epsilon;          /* 1e-5 */
  bool swiglu;                  /* the MLP is SwiGLU (gate and up) */
  int ffn_hidden_size;          /* -1: see mega_jobspec_ffn_hidden_size */
  bool group_query_attention;   /* with --num-query-groups */
  int num_query_groups;         /* -1: 1 with --group-query-attention (Megatron's) */
  bool untie_embeddings_and_output_weights; /* the head is its own lm_head */
  bool disable_bias_linear;     /* Llama: no biases in the linear layers */
  bool openai_gelu;             /* GPT-2: the tanh GELU always (mega_jobspec_gelu_erf) */
  int kv_channels;              /* -1: hidden / heads */
  /* flags that restate what mega does: only these values are accepted */
  double attention_dropout;     /* 0 */
  double hidden_dropout;        /* 0 */
  bool use_mcore_models;        /* accepted: mega has one model implementation */
  int transformer_impl;         /* mega_transformer_impl: local only */
  /* batch */
  int micro_batch_size;  /* required */
  int global_batch_size; /* required */
  int train_iters;       /* -1: not given; this or --train-samples is required */
  /* issue 24: sample-based training and the batch-size rampup */
  int train_samples;               /* -1: not given; iterations from mega_jobspec_train_iters */
  mega_strlist rampup_batch_size;  /* START INCR SAMPLES, or no words */
  /* data */
  mega_strlist data_path; /* FILE (bytes), PREFIX (.bin/.idx), or W1 P1 W2 P2 ... */
  mega_strlist train_data_path; /* instead of --data-path: the training data alone */
  mega_strlist valid_data_path; /* with --train-data-path: what evaluation reads */
  char *split;            /* NULL: no split; else "969,30,1" (train, valid, test) */
  int data_order;         /* mega_data_order */
  char *data_cache_path;  /* Megatron's order's index cache (NULL: none) */
  int tokenizer_type;     /* mega_tokenizer */
  int vocab_size;         /* -1: not given (NullTokenizer needs it) */
  char *vocab_file;       /* GPT2BPETokenizer's vocab.json (NULL: not given) */
  char *merge_file;       /* GPT2BPETokenizer's merges.txt (NULL: not given) */
  int make_vocab_size_divisible_by; /* 128 */
  /* optimizer */
  double lr;           /* required (NAN until given) */
  double min_lr;       /* 0 */
  int lr_warmup_iters; /* 0 */
  int lr_decay_iters;  /* -1: train-iters */
  int lr_decay_style;  /* mega_lr_style, MEGA_LR_LINEAR */
  double weight_decay; /* 0.01 */
  double adam_beta1;   /* 0.9 */
  double adam_beta2;   /* 0.999 */
  double adam_eps;     /* 1e-8 */
  double clip_grad;    /* 1.0; 0 disables clipping */
  /* issue 24: Megatron's other LR flags (worker/optim/lr_sched.h has the formulas) */
  double lr_warmup_fraction; /* NAN: not given; else warmup = fraction x decay */
  int lr_warmup_samples;     /* 0 */
  int lr_decay_samples;      /* -1: --train-samples */
  double lr_warmup_init;     /* 0: warmup starts there */
  int lr_wsd_decay_style;    /* mega_wsd_style */
  int lr_wsd_decay_iters;    /* -1: not given; WSD needs this or the samples */
  int lr_wsd_decay_samples;  /* -1: not given */
  /* checkpoints */
  char *save;        /* NULL: no checkpoints */
  int save_interval; /* 0: save only at the end (when --save is given) */
  bool save_initial; /* also save before the first step */
  char *load;        /* NULL: start from fresh weights */
  bool async_save;   /* write checkpoints on a thread; the step waits for the host copy only */
  bool no_replica_recovery; /* megad: restarts go back to the checkpoint, never to replicas */
  bool finetune;     /* --load weights only; iteration 0, fresh optimizer and data order */
  bool no_load_optim; /* --load without the optimizer state (and so the LR scheduler's) */
  bool no_load_rng;  /* accepted; mega's training has no random state to load */
  bool exit_on_missing_checkpoint; /* --load holding no checkpoint is an error, not a fresh
                                      start (megad sets it when it resumes a commit) */
  bool override_opt_param_scheduler;       /* --load: this job's LR schedule wins */
  bool use_checkpoint_opt_param_scheduler; /* --load: the checkpoint's LR schedule wins */
  /* stopping early, as Megatron's training loop does: a checkpoint (with
   * --save) and a stop at an iteration boundary every rank agrees on */
  bool exit_signal_handler;  /* on SIGTERM */
  int exit_interval;         /* after an iteration divisible by it; 0: never */
  int exit_duration_in_mins; /* after this long; 0: never */
  /* evaluation */
  int eval_interval; /* 0: never */
  int eval_iters;    /* 100, Megatron's */
  /* parallelism */
  int tensor_model_parallel_size;            /* 1 */
  int context_parallel_size;                 /* 1 only: mega has no context parallelism */
  bool sequence_parallel;                    /* split the stream along the sequence over TP */
  int pipeline_model_parallel_size;          /* 1 */
  int virtual_pipeline_model_parallel_size;  /* -1: see mega_jobspec_vp */
  int num_layers_per_virtual_pipeline_stage; /* -1: not given */
  int microbatch_group_size_per_vp_stage;    /* -1: pipeline size */
  char *pipeline_model_parallel_layout;      /* NULL: uniform split */
  int decoder_first_pipeline_num_layers;     /* -1: not given */
  int decoder_last_pipeline_num_layers;      /* -1: not given */
  int schedule;                              /* MEGA_JOB_SCHEDULE_AUTO or a mega_sched_kind */
  /* P2P and memory */
  bool batch_p2p_comm;
  bool overlap_p2p_comm;
  bool overlap_p2p_comm_warmup_flush;
  bool variable_seq_lengths;
  bool deallocate_pipeline_outputs;
  int recompute_granularity; /* mega_recompute */
  int recompute_method;      /* mega_recompute_method; full needs it */
  int recompute_num_layers;  /* -1: not given; full needs it */
  /* data parallel */
  bool overlap_grad_reduce;
  bool align_grad_reduce;
  int bucket_size; /* elements; -1: Megatron's max(40M, 1M x DP) */
  bool use_distributed_optimizer;
  bool no_optimizer_shard_copy; /* distributed optimizer: no copy of each shard elsewhere */
  bool overlap_param_gather;  /* distributed optimizer: gather parameters while forward runs */
  bool average_in_collective; /* scale by 1/DP in the reduction, not before it */
  /* worker and measurement */
  int blas_threads;       /* 1 */
  int backend;            /* mega_job_backend */
  bool bf16;              /* the linear layers' GEMM inputs in bf16, fp32 accumulation */
  /* GPT-2's c_fc GEMM and GELU as two ops on every backend, and the GELU
   * then the exact (erf) one unless --openai-gelu (mega_jobspec_gelu_erf) */
  bool no_bias_gelu_fusion;
  int trace_iteration;    /* 0: none; else the iteration (1-based) to trace */
  char *simulate_compute; /* NULL, or "F_MS:B_MS[:W_MS]" */
  int log_interval;       /* 100, Megatron's */
  bool log_throughput;    /* the text line shows TFLOP/s per GPU */
  /* Not a flag: GPT2BPETokenizer's vocabulary size, vocab.json's entries,
   * set by mega_jobspec_load_vocab once the file is read (0: not read), and
   * the id of its "<|endoftext|>" (-1: it has none). */
  int file_vocab;
  int file_eod;
} mega_jobspec;

/* ---- the flag table ---- */

typedef enum mega_jobflag_type {
  MEGA_JOBFLAG_INT,    /* int field */
  MEGA_JOBFLAG_FLOAT,  /* double field */
  MEGA_JOBFLAG_STRING, /* char * field, owned by the spec */
  MEGA_JOBFLAG_BOOL,   /* bool field; the flag takes no value */
  MEGA_JOBFLAG_ENUM,   /* int field: index into choices, -1 when absent */
  MEGA_JOBFLAG_LIST,   /* mega_strlist field: every word up to the next --flag */
} mega_jobflag_type;

typedef struct mega_jobflag {
  const char *name;           /* "--hidden-size" */
  const char *key;            /* "hidden_size": JSON key (Megatron's args name) */
  const char *group;          /* "model", "batch", ...; the table keeps groups together */
  mega_jobflag_type type;
  const char *metavar;        /* "N", "F", "DIR", "constant|linear|cosine"; NULL for bool */
  const char *default_text;   /* "1234", "seq-length", "required", "none", "off" */
  const char *help;           /* one sentence */
  const char *const *choices; /* enum names, NULL-terminated; NULL for other types */
  bool required;
  double min, max;            /* bounds for int and float; NAN when unbounded */
  bool min_exclusive, max_exclusive;
} mega_jobflag;

int mega_jobspec_flag_count(void);
/* Flag i in table order, or NULL when i is out of range. */
const mega_jobflag *mega_jobspec_flag(int i);
/* By name, "--hidden-size"; NULL when no job flag has that name. */
const mega_jobflag *mega_jobspec_flag_find(const char *name);

/* ---- life cycle ---- */

/* Every field to its default. Does not free anything: use on a fresh struct. */
void mega_jobspec_defaults(mega_jobspec *s);
/* Frees the spec's strings and resets it to defaults. */
void mega_jobspec_free(mega_jobspec *s);
/* Deep copy into dst (which must not hold strings). On failure dst is left
 * at defaults. */
mega_status mega_jobspec_copy(mega_jobspec *dst, const mega_jobspec *src, mega_err *err);
/* Field-by-field equality (strings by content; NAN equals NAN). */
bool mega_jobspec_equal(const mega_jobspec *a, const mega_jobspec *b);

/* ---- parsing ---- */

/* Parses the flag at argv[*i], in "--flag value" or "--flag=value" form (a
 * bool flag takes no value), into s, and advances *i past it. A later value
 * for the same flag replaces an earlier one.
 * Returns MEGA_ERR_NOT_FOUND, with *i unchanged and err saying "unknown
 * flag", when argv[*i] is not a job flag, so the caller can try its own
 * flags; MEGA_ERR_INVALID for a missing or bad value (the field keeps its
 * old value) or when *i is not below argc; MEGA_ERR_NOMEM. */
mega_status mega_jobspec_parse_flag(mega_jobspec *s, int argc, char *const *argv, int *i,
                                    mega_err *err);

/* Parses argv[0..argc) (no program name), all of which must be job flags:
 * an unknown flag or a stray word is MEGA_ERR_INVALID. s must be initialized
 * (defaults or an earlier parse). On failure the flags before the bad one
 * have been applied; s stays valid to free. */
mega_status mega_jobspec_parse(mega_jobspec *s, int argc, char *const *argv, mega_err *err);

/* ---- checking ---- */

/* Checks the whole job. world_size is TP·PP·DP, or 0 when not known yet
 * (then the checks that need DP are skipped). data_bytes is the size of
 * the plain file mega_jobspec_data_single names (read as bytes), or -1 when
 * unknown or not a plain file. Every message starts "invalid job: ". */
mega_status mega_jobspec_check(const mega_jobspec *s, int world_size, long long data_bytes,
                               mega_err *err);

/* Tensor-parallel groups stay inside one node (their collectives sit on
 * the critical path): TP must divide the processes each node runs. */
mega_status mega_jobspec_check_node(const mega_jobspec *s, int nproc_per_node, mega_err *err);

/* ---- derived values (meaningful once check has passed) ---- */

/* world / (TP·PP). */
int mega_jobspec_dp(const mega_jobspec *s, int world_size);
/* The virtual pipeline size: from the layout string's stage count, else
 * from --num-layers-per-virtual-pipeline-stage, else the flag, else 1. */
int mega_jobspec_vp(const mega_jobspec *s);
/* --microbatch-group-size-per-vp-stage, or PP when absent. */
int mega_jobspec_group_size(const mega_jobspec *s);
/* Microbatches per pipeline per iteration: global / (micro × DP). */
int mega_jobspec_num_microbatches(const mega_jobspec *s, int world_size);
/* Tokens per iteration over all replicas: global batch × seq-length. */
long long mega_jobspec_tokens_per_iter(const mega_jobspec *s);
int mega_jobspec_max_position_embeddings(const mega_jobspec *s);
int mega_jobspec_lr_decay_iters(const mega_jobspec *s);
/* Whether the job trains Llama (--position-embedding-type rope
 * --normalization RMSNorm --swiglu) rather than GPT-2. */
bool mega_jobspec_llama(const mega_jobspec *s);
/* Whether GPT-2's GELU is the exact one, 0.5 x (1 + erf(x / sqrt 2)), as
 * Megatron picks it: its bias-GELU fusion (on by default, off with
 * --no-bias-gelu-fusion, and off with --disable-bias-linear) computes the
 * tanh approximation, and so does --openai-gelu; otherwise it runs
 * torch's F.gelu, the erf form. False for Llama (SwiGLU). */
bool mega_jobspec_gelu_erf(const mega_jobspec *s);
/* --ffn-hidden-size, else Megatron's default: 4 x hidden, or with --swiglu
 * int(4 x hidden x 2/3 / 64) x 64 (which is 0 below hidden 24). */
int mega_jobspec_ffn_hidden_size(const mega_jobspec *s);
/* --kv-channels, else hidden / heads. */
int mega_jobspec_kv_channels(const mega_jobspec *s);
/* Key/value heads: --num-query-groups (1 if absent) with
 * --group-query-attention, else one per attention head. */
int mega_jobspec_query_groups(const mega_jobspec *s);
/* Whether the job evaluates: --eval-interval > 0 and --eval-iters > 0. */
bool mega_jobspec_evaluates(const mega_jobspec *s);
/* Whether training that ends normally (not by an exit flag or signal)
 * evaluates once more on the validation set, as Megatron's pretrain does:
 * --eval-iters > 0, and --eval-interval > 0, --valid-data-path or a
 * --split with a valid share. */
bool mega_jobspec_evaluates_at_end(const mega_jobspec *s);
/* Whether it then evaluates the test set: --eval-iters > 0 and a --split
 * with a test share (Megatron's do_test). */
bool mega_jobspec_tests_at_end(const mega_jobspec *s);
/* Validation batches the whole run reads: every --eval-interval's and the
 * end's, --eval-iters each (Megatron's validation sample count over G). */
int64_t mega_jobspec_eval_batches(const mega_jobspec *s);
/* The note megaw and megad run print at start: which data evaluation reads
 * (the valid split, --valid-data-path, or without either the end of the
 * training stream), or that --eval-iters 0 turned it off. Written before
 * the data is read, it promises a test share's evaluation only if the
 * share holds a window (rank 0 says at setup when it does not). false (buf
 * untouched) when the job does not evaluate. */
bool mega_jobspec_eval_note(const mega_jobspec *s, char *buf, size_t n);
/* The note a rank on the cuda backend prints at start when --attention-dropout
 * takes away the flash attention --bf16 would run (heads of 64 or 128, T
 * above them): attention then runs unfused, as fp32 batched GEMMs, and each
 * layer keeps its [micro-batch, heads / TP, T, T] probabilities; it says
 * how much, against what flash attention keeps. false (buf untouched)
 * otherwise. */
bool mega_jobspec_cuda_attention_note(const mega_jobspec *s, char *buf, size_t n);

/* ---- issue 24: batches over time, sample-based training, LR lengths ---- */

/* --rampup-batch-size as START, INCR, SAMPLES; false when absent or bad. */
bool mega_jobspec_rampup(const mega_jobspec *s, int64_t out[3]);
/* The global batch after `consumed` samples: --global-batch-size, or while
 * ramping Megatron's START + INCR x floor(consumed / (SAMPLES / n)), n =
 * (G - START) / INCR, and G once consumed > SAMPLES. */
int mega_jobspec_batch_at(const mega_jobspec *s, int64_t consumed);
/* Samples consumed before iteration it (0-based): it x G without a ramp. */
int64_t mega_jobspec_samples_before(const mega_jobspec *s, int64_t it);
/* The global batch of iteration it (0-based). */
int mega_jobspec_batch_of(const mega_jobspec *s, int64_t it);
/* Iterations the job trains: --train-iters, or from --train-samples as
 * Megatron's update_train_iters counts them (the ramp's iterations, then
 * whole global batches; a partial last batch is dropped). */
int64_t mega_jobspec_train_iters(const mega_jobspec *s);
/* The LR schedule's lengths in samples (Megatron's scheduler counts
 * samples): iteration flags x --global-batch-size, sample flags as given,
 * --lr-warmup-fraction x the decay. wsd_decay 0 when not given. */
typedef struct mega_lr_samples {
  double warmup, decay, wsd_decay;
} mega_lr_samples;
void mega_jobspec_lr_samples(const mega_jobspec *s, mega_lr_samples *out);
/* A data path given as PREFIX.bin or PREFIX.idx where both files are here
 * (Megatron takes only the prefix): with rewrite, each such word becomes
 * PREFIX and note (n bytes, may be NULL) says so, a line each; without, it
 * is refused with the prefix to give. A PREFIX.idx without its PREFIX.bin
 * is refused either way (an index's bytes are never tokens); a PREFIX.bin
 * without an index is a plain file. Messages start "invalid job: ". */
mega_status mega_jobspec_fix_data_paths(mega_jobspec *s, bool rewrite, char *note, size_t n,
                                        mega_err *err);
/* The string fields of s that name a file or a directory: every STRING
 * flag of the table whose metavar is FILE or DIR (--vocab-file,
 * --merge-file, --save, --load, and any such flag added later), in table
 * order. Up to cap of them go into out, each the address of the field (it
 * may be NULL: not given), so a caller may replace the string (freeing the
 * old one); returns how many there are. The data lists (--data-path and
 * its kin) are not strings: see mega_jobspec_data_count. */
int mega_jobspec_path_fields(mega_jobspec *s, char **out[], int cap);
/* Every relative path of the job (the data lists' paths, not a blend's
 * weights, and each path field above) made absolute against the working
 * directory, so that the job means the same wherever it runs and its
 * checkpoints record where its files are (megactl submit, megad run, megaw
 * alone or by hand). */
mega_status mega_jobspec_absolute_paths(mega_jobspec *s, mega_err *err);
/* --save, --load and --data-cache-path resolved once (mega_nf_resolve), as
 * megad checked them: a link the user gave is followed here, and under them
 * the checkpoint and cache code follows none (core/nofollow.h), so a link
 * swapped in since is refused rather than written through. A path that
 * cannot be resolved is left for the code that uses it to report. */
mega_status mega_jobspec_resolve_dirs(mega_jobspec *s, mega_err *err);
/* GPT2BPETokenizer: reads --vocab-file and sets s->file_vocab to its
 * entries (their ids must be 0..entries-1, each once), and checks that
 * --merge-file reads as merges.txt, one "A B" a line (MEGA_OK and nothing
 * else for other tokenizers). */
mega_status mega_jobspec_load_vocab(mega_jobspec *s, mega_err *err);
/* The tokenizer (mega_tokenizer): --tokenizer-type, or GPT2BPETokenizer
 * when only --vocab-file/--merge-file are given (Megatron's pretrain_gpt.py
 * defaults to it). */
int mega_jobspec_tokenizer(const mega_jobspec *s);
/* The tokenizer's vocabulary: GPT2BPETokenizer's vocab.json entries (once
 * mega_jobspec_load_vocab has read them, else 0); 256 for the byte tokenizer; N + 1 for
 * NullTokenizer with --vocab-size N (ids 0..N, N the end-of-document id,
 * as Megatron's _NullTokenizer). Token ids in the data must be below it. */
int mega_jobspec_tokenizer_vocab(const mega_jobspec *s);
/* The tokenizer's special ids, -1 where it has none: NullTokenizer's
 * end-of-document N (no beginning id, as Megatron's _NullTokenizer);
 * GPT2BPETokenizer's "<|endoftext|>" as both, as GPT-2's tokenizer and
 * Hugging Face's GPT-2 config have it (-1 until mega_jobspec_load_vocab
 * has read --vocab-file, or when it lacks one); the byte tokenizer has
 * none. */
void mega_jobspec_special_ids(const mega_jobspec *s, int *bos, int *eos);
/* Megatron's padded vocabulary, the model's vocab_size (wte's rows): the
 * tokenizer's vocabulary rounded up to a multiple of
 * --make-vocab-size-divisible-by × TP. */
int mega_jobspec_padded_vocab(const mega_jobspec *s);
/* The datasets a data flag names (meaningful once check has passed): a
 * lone path is one dataset of weight 1; W1 P1 W2 P2 ... is a blend. 0
 * datasets for an absent flag. */
int mega_jobspec_blend_count(const mega_strlist *l);
const char *mega_jobspec_blend_prefix(const mega_strlist *l, int k);
double mega_jobspec_blend_weight(const mega_strlist *l, int k); /* as given, unnormalized */
/* The training data: --train-data-path when given, else --data-path. */
const mega_strlist *mega_jobspec_train_data(const mega_jobspec *s);
/* Every dataset path of the job (training, then --valid-data-path's), for
 * the checks that each can be read: path k, or NULL past the last; *flag
 * (may be NULL) gets the flag that named it. */
const char *mega_jobspec_data_file(const mega_jobspec *s, int k, const char **flag);
/* The training data's datasets, as above. */
int mega_jobspec_data_count(const mega_jobspec *s);
const char *mega_jobspec_data_prefix(const mega_jobspec *s, int k);
double mega_jobspec_data_weight(const mega_jobspec *s, int k);
/* The one plain path when the training data is a single dataset, else
 * NULL (callers stat it for mega_jobspec_check's data_bytes). */
const char *mega_jobspec_data_single(const mega_jobspec *s);
/* --split as Megatron normalizes it: up to three non-negative numbers
 * ("969,30,1", "90/5/5"), missing ones 0, divided by their sum. */
mega_status mega_jobspec_split(const mega_jobspec *s, double out[3], mega_err *err);
/* The layer layout: the layout string's, else the uniform split with
 * --decoder-first/last-pipeline-num-layers. out is the caller's to
 * mega_layout_free. */
mega_status mega_jobspec_layout(const mega_jobspec *s, mega_layout *out, mega_err *err);

/* --simulate-compute "F_MS:B_MS[:W_MS]": forward, backward and (optional)
 * weight-gradient milliseconds per microbatch and chunk, each finite and
 * >= 0. Without W, has_w is false, w_ms is 0 and B includes the weight
 * gradient. */
typedef struct mega_sim_compute {
  double f_ms, b_ms, w_ms;
  bool has_w;
} mega_sim_compute;
mega_status mega_jobspec_parse_simulate_compute(const char *str, mega_sim_compute *out,
                                                mega_err *err);

/* Every job flag as help text, grouped as the table groups them:
 * "\nmodel flags:\n  --num-layers N  Number of ... (default: required)\n...".
 * NULL when out of memory; the caller frees it. */
char *mega_jobspec_help_text(void);

/* The schedule parameters a job gives for a world of world_size ranks
 * (kind from --schedule or seed 000's decision tree). */
struct mega_sched_params;
void mega_jobspec_sched_params(const mega_jobspec *s, int world_size,
                               struct mega_sched_params *out);

/* The one check every program runs before a job starts: mega_jobspec_check,
 * then, when world_size is known (> 0), the schedule's own rules
 * (mega_sched_check_params), with the same "invalid job: " lead. megactl,
 * megad and megaw all call this, so they refuse a job in the same words. */
mega_status mega_jobspec_check_all(const mega_jobspec *s, int world_size, long long data_bytes,
                                   mega_err *err);

/* ---- serialization ---- */

/* The flags that differ from their defaults, as "--flag" ["value"] words in
 * table order; parsing them onto a default spec gives s back exactly. The
 * array is NULL-terminated, *argc gets its length; NULL when out of memory.
 * Free it with mega_jobspec_argv_free. */
char **mega_jobspec_to_argv(const mega_jobspec *s, int *argc);
void mega_jobspec_argv_free(char **argv);

/* Every field, keyed by mega_jobflag.key: ints and floats as numbers, bools
 * as booleans, enums as their names, lists as arrays of strings (a plain
 * string is read as a one-word list), absent values as null. A new
 * reference; NULL when out of memory. */
json_t *mega_jobspec_to_json(const mega_jobspec *s);
/* The reverse: each key present in obj overwrites s (which must be
 * initialized); null means the default. An unknown key, a value of the
 * wrong type or one out of its flag's bounds is MEGA_ERR_INVALID; s may then
 * hold some of obj's values and stays valid to free. */
mega_status mega_jobspec_from_json(mega_jobspec *s, const json_t *obj, mega_err *err);

#endif
