/* The flag table: every flag a job takes, Megatron's names and ours, with
 * its field, group, bounds, default and help (jobspec.h's mega_jobflag).
 * jobspec.c parses and sets by it; jobspec_json.c and megactl's help read
 * it. */
#include <math.h>
#include <stddef.h>

#include "core/jobspec_internal.h"
#include "core/schedule.h"

static const char *const lr_styles[] = {"constant", "linear", "cosine", "inverse-square-root",
                                        "WSD", NULL};
static const char *const wsd_styles[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};
static const char *const recomputes[] = {"full", "selective", NULL};
static const char *const data_orders[] = {"file", "megatron", NULL};
static const char *const tokenizers[] = {"NullTokenizer", "GPT2BPETokenizer", NULL};
static const char *const recompute_methods[] = {"uniform", "block", NULL};
static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const pos_embs[] = {"learned_absolute", "rope", NULL};
static const char *const norms[] = {"LayerNorm", "RMSNorm", NULL};
static const char *const transformer_impls[] = {"local", "transformer_engine", NULL};
/* Index i is mega_sched_kind i. */
static const char *const schedules[] = {"no-pipelining", "gpipe", "1f1b", "interleaved", "zb-h1",
                                        NULL};
_Static_assert(MEGA_SCHED_NO_PIPELINING == 0 && MEGA_SCHED_GPIPE == 1 && MEGA_SCHED_1F1B == 2 &&
                   MEGA_SCHED_INTERLEAVED == 3 && MEGA_SCHED_ZB_H1 == 4,
               "--schedule's choices index mega_sched_kind");
_Static_assert(MEGA_LR_LINEAR == 1 && MEGA_RECOMPUTE_SELECTIVE == 1 &&
                   MEGA_RECOMPUTE_BLOCK == 1 && MEGA_JOB_BACKEND_CUDA == 2 &&
                   MEGA_TOKENIZER_NULL == 0 && MEGA_TOKENIZER_GPT2BPE == 1 &&
                   MEGA_LR_INVERSE_SQRT == 3 && MEGA_LR_WSD == 4 && MEGA_WSD_MINUS_SQRT == 3 &&
                   MEGA_POS_ROPE == 1 && MEGA_NORM_RMSNORM == 1 && MEGA_TRANSFORMER_ENGINE == 1 &&
                   MEGA_DATA_ORDER_MEGATRON == 1,
               "enum choices order");

#define OFF(f) offsetof(mega_jobspec, f)
#define FLAG(nm, f, grp, ty, meta, dtext, hlp, ch, req, mn, mx, mnx, mxx, idf, fdf) \
  {{nm, #f, grp, ty, meta, dtext, hlp, ch, req, mn, mx, mnx, mxx}, OFF(f), idf, fdf}
#define INT(nm, f, grp, meta, idf, dtext, req, mn, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_INT, meta, dtext, hlp, NULL, req, mn, NAN, false, false, idf, 0)
#define FLT(nm, f, grp, fdf, dtext, req, mn, mx, mnx, mxx, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_FLOAT, "F", dtext, hlp, NULL, req, mn, mx, mnx, mxx, 0, fdf)
#define STR(nm, f, grp, meta, req, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_STRING, meta, req ? "required" : "none", hlp, NULL, req, NAN, \
       NAN, false, false, 0, 0)
#define LIST(nm, f, grp, meta, req, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_LIST, meta, req ? "required" : "none", hlp, NULL, req, NAN, \
       NAN, false, false, 0, 0)
#define BOOL(nm, f, grp, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_BOOL, NULL, "off", hlp, NULL, false, NAN, NAN, false, false, 0, 0)
#define ENUM(nm, f, grp, meta, ch, idf, dtext, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_ENUM, meta, dtext, hlp, ch, false, NAN, NAN, false, false, idf, 0)

const flagdef mega_jf_table[] = {
    INT("--num-layers", num_layers, "model", "N", 0, "required", true, 1,
        "Number of transformer decoder layers."),
    INT("--hidden-size", hidden_size, "model", "N", 0, "required", true, 1,
        "Width of the model."),
    INT("--num-attention-heads", num_attention_heads, "model", "N", 0, "required", true, 1,
        "Attention heads per layer; must divide --hidden-size unless --kv-channels is given."),
    INT("--seq-length", seq_length, "model", "N", 0, "required", true, 1,
        "Tokens per sample."),
    INT("--max-position-embeddings", max_position_embeddings, "model", "N", -1, "seq-length",
        false, 1, "The longest sequence: rows of GPT-2's position embedding, or the positions "
        "RoPE covers; at least --seq-length."),
    FLT("--init-method-std", init_method_std, "model", 0.02, "0.02", false, 0, 1e30, true, false,
        "Standard deviation of the normal weight initialization."),
    INT("--seed", seed, "model", "N", 1234, "1234", false, 0,
        "Random seed for the initial weights, and with --data-order megatron for the data "
        "order (Megatron's RandomState seed)."),
    ENUM("--position-embedding-type", position_embedding_type, "model", "learned_absolute|rope",
         pos_embs, MEGA_POS_LEARNED_ABSOLUTE, "learned_absolute",
         "Positions: GPT-2's learned embedding, or rotary embeddings on q and k (Llama; with "
         "--normalization RMSNorm and --swiglu)."),
    INT("--rotary-base", rotary_base, "model", "N", 10000, "10000", false, 2,
        "RoPE's base (theta): position t turns channel pair i by t x base^(-2i/rotated)."),
    FLT("--rotary-percent", rotary_percent, "model", 1.0, "1", false, 0, 1, true, false,
        "Share of each head's channels RoPE rotates, in (0, 1]; the rest pass unrotated."),
    ENUM("--normalization", normalization, "model", "LayerNorm|RMSNorm", norms,
         MEGA_NORM_LAYERNORM, "LayerNorm",
         "The norms before attention, before the MLP and at the end: GPT-2's LayerNorm or "
         "Llama's RMSNorm (no mean, no bias)."),
    FLT("--norm-epsilon", norm_epsilon, "model", 1e-5, "1e-05", false, 1e-30, 1e30, false, false,
        "Epsilon of every LayerNorm or RMSNorm."),
    BOOL("--swiglu", swiglu, "model",
         "The MLP is SwiGLU, down(silu(gate(x)) x up(x)), instead of GELU (Llama)."),
    INT("--ffn-hidden-size", ffn_hidden_size, "model", "N", -1,
        "4 x hidden; with --swiglu int(4 x hidden x 2/3 / 64) x 64", false, 1,
        "Width of the MLP (each of SwiGLU's gate and up)."),
    BOOL("--group-query-attention", group_query_attention, "model",
         "Grouped-query attention: --num-query-groups key/value heads, each shared by "
         "--num-attention-heads / G query heads (Llama)."),
    INT("--num-query-groups", num_query_groups, "model", "N", -1, "1", false, 1,
        "With --group-query-attention: the key/value heads G; must divide the heads."),
    BOOL("--untie-embeddings-and-output-weights", untie_embeddings_and_output_weights, "model",
         "The output layer is its own weight (lm_head) instead of the word embedding."),
    BOOL("--disable-bias-linear", disable_bias_linear, "model",
         "No biases in the linear layers (Llama; Hugging Face's GPT-2 always has them). As in "
         "Megatron, it turns the bias-GELU fusion off, so a GELU MLP would be the exact (erf) "
         "one."),
    BOOL("--openai-gelu", openai_gelu, "model",
         "GPT-2's GELU is the tanh approximation (Hugging Face's \"gelu_new\") even with "
         "--no-bias-gelu-fusion; without either flag it is that already (Megatron's bias-GELU "
         "fusion computes it). Llama's SwiGLU is unaffected."),
    INT("--kv-channels", kv_channels, "model", "N", -1, "hidden / heads", false, 1,
        "Channels per attention head (Llama may differ from hidden / heads)."),
    FLT("--attention-dropout", attention_dropout, "model", 0.0, "0", false, 0, 1, false, true,
        "The probability, in [0, 1), that training drops each softmax probability of causal "
        "self-attention before it multiplies V, kept ones scaled by 1/(1-P): Megatron's "
        "site. Evaluation and generation run without. The mask is a function of --seed, the "
        "sample's place in the training order, the layer, the head, the query and the key "
        "position, so it is the same under every parallel layout, after a resume and on "
        "either backend (on cuda it runs attention as batched GEMMs, not flash attention, "
        "even under --bf16). Megatron's default is 0.1 (a script that leaves it out trains "
        "with it there, without here)."),
    FLT("--hidden-dropout", hidden_dropout, "model", 0.0, "0", false, 0, 1, false, true,
        "The probability, in [0, 1), that training drops an element of the embeddings' output "
        "and of each attention and MLP output (with its bias, before the residual add), kept "
        "ones scaled by 1/(1-P): Megatron's sites. Evaluation and generation run without. The "
        "mask is a function of --seed, the sample's place in the training order, the layer, "
        "the position and the channel, so it is the same under every parallel layout and "
        "after a resume. Megatron's default is 0.1 (a script that leaves it out trains with "
        "dropout there, without here)."),
    BOOL("--use-mcore-models", use_mcore_models, "model",
         "Accepted and changes nothing: mega has one model implementation, with Megatron "
         "Core's semantics."),
    ENUM("--transformer-impl", transformer_impl, "model", "local|transformer_engine",
         transformer_impls, MEGA_TRANSFORMER_LOCAL, "local",
         "Accepted as local only: mega runs its own kernels, not Transformer Engine's."),
    INT("--micro-batch-size", micro_batch_size, "batch", "N", 0, "required", true, 1,
        "Samples per microbatch."),
    INT("--global-batch-size", global_batch_size, "batch", "N", 0, "required", true, 1,
        "Samples per iteration over all data-parallel replicas."),
    /* required unless --train-samples is given (check_batch) */
    INT("--train-iters", train_iters, "batch", "N", -1, "required, or --train-samples", false, 1,
        "Number of training iterations."),
    /* issue 24: sample-based training and the rampup */
    INT("--train-samples", train_samples, "batch", "N", -1, "none", false, 1,
        "Instead of --train-iters: samples to train on (Megatron's sample-based training; "
        "the LR flags are then counted in samples)."),
    LIST("--rampup-batch-size", rampup_batch_size, "batch", "START INCR SAMPLES", false,
         "With --train-samples: the global batch starts at START and grows by INCR, evenly "
         "over SAMPLES samples, up to --global-batch-size (Megatron's rampup)."),
    /* required unless --train-data-path is given (check_data) */
    FLAG("--data-path", data_path, "data", MEGA_JOBFLAG_LIST, "FILE|PREFIX|W1 P1 W2 P2...",
         "required, or --train-data-path",
         "Training data: a FILE read as bytes (the byte tokenizer); a PREFIX naming "
         "Megatron's indexed dataset PREFIX.bin and PREFIX.idx; or a blend of weighted "
         "datasets W1 P1 W2 P2 ..., each P a FILE or a PREFIX.",
         NULL, false, NAN, NAN, false, false, 0, 0),
    LIST("--train-data-path", train_data_path, "data", "FILE|PREFIX|W1 P1...", false,
         "Instead of --data-path: the training data alone, in --data-path's forms."),
    LIST("--valid-data-path", valid_data_path, "data", "FILE|PREFIX|W1 P1...", false,
         "With --train-data-path: the data evaluation reads (every --eval-interval "
         "iterations, and after training even without it), in --data-path's forms."),
    STR("--split", split, "data", "A,B,C", false,
        "Train, valid and test shares of each dataset's documents (e.g. 969,30,1); "
        "evaluation then reads the valid split."),
    ENUM("--data-order", data_order, "data", "file|megatron", data_orders, MEGA_DATA_ORDER_FILE,
         "file",
         "mega's own flag. file: samples are consecutive windows of the token stream, in "
         "file order; megatron: exactly Megatron-LM's GPTDataset order (documents and "
         "samples shuffled with numpy's RandomState(--seed)), for indexed datasets, with "
         "--split when --data-path is given."),
    STR("--data-cache-path", data_cache_path, "data", "DIR", false,
        "With --data-order megatron: the directory Megatron's order's sample index is "
        "cached in; the first rank to start builds and writes it, the others and later "
        "starts map it, and a file built for other data or flags is never used."),
    ENUM("--tokenizer-type", tokenizer_type, "data", "NullTokenizer|GPT2BPETokenizer", tokenizers,
         MEGA_TOKENIZER_BYTES, "bytes",
         "NullTokenizer: the data is token ids 0..--vocab-size (the last is end of "
         "document); GPT2BPETokenizer: GPT-2 ids, the vocabulary --vocab-file's entries "
         "(the default when --vocab-file is given, as in Megatron's pretrain_gpt.py); "
         "without either, the byte tokenizer (256 tokens)."),
    INT("--vocab-size", vocab_size, "data", "N", -1, "none", false, 1,
        "NullTokenizer's vocabulary size, without its end-of-document id."),
    /* issue 24: GPT-2's BPE as a training flag */
    STR("--vocab-file", vocab_file, "data", "FILE", false,
        "GPT2BPETokenizer's vocab.json: its entries are the vocabulary (GPT-2's: 50,257); "
        "megaw generate reads and writes text with it."),
    STR("--merge-file", merge_file, "data", "FILE", false, "GPT2BPETokenizer's merges.txt."),
    INT("--make-vocab-size-divisible-by", make_vocab_size_divisible_by, "data", "N", 128, "128",
        false, 1, "Pad the model's vocabulary to a multiple of N x TP, as Megatron does."),
    FLT("--lr", lr, "optimizer", NAN, "required", true, 0, NAN, false, false,
        "Peak learning rate."),
    FLT("--min-lr", min_lr, "optimizer", 0, "0", false, 0, NAN, false, false,
        "Learning rate at the end of the decay."),
    INT("--lr-warmup-iters", lr_warmup_iters, "optimizer", "N", 0, "0", false, 0,
        "Iterations of linear warmup from --lr-warmup-init to --lr."),
    INT("--lr-decay-iters", lr_decay_iters, "optimizer", "N", -1, "train-iters", false, 1,
        "Iteration at which the decay reaches --min-lr."),
    ENUM("--lr-decay-style", lr_decay_style, "optimizer",
         "constant|linear|cosine|inverse-square-root|WSD", lr_styles, MEGA_LR_LINEAR, "linear",
         "Shape of the learning-rate decay (Megatron's formulas; WSD holds --lr until its "
         "last --lr-wsd-decay-iters, then anneals)."),
    /* issue 24: Megatron's other LR flags */
    FLT("--lr-warmup-fraction", lr_warmup_fraction, "optimizer", NAN, "none", false, 0, 1, false,
        true, "Warmup as a fraction of the decay (--lr-decay-iters or --lr-decay-samples), "
        "instead of --lr-warmup-iters or --lr-warmup-samples."),
    INT("--lr-warmup-samples", lr_warmup_samples, "optimizer", "N", 0, "0", false, 0,
        "With --train-samples: samples of linear warmup."),
    INT("--lr-decay-samples", lr_decay_samples, "optimizer", "N", -1, "train-samples", false, 1,
        "With --train-samples: the sample at which the decay reaches --min-lr."),
    FLT("--lr-warmup-init", lr_warmup_init, "optimizer", 0, "0", false, 0, NAN, false, false,
        "The learning rate warmup starts from."),
    ENUM("--lr-wsd-decay-style", lr_wsd_decay_style, "optimizer",
         "exponential|linear|cosine|minus_sqrt", wsd_styles, MEGA_WSD_EXPONENTIAL, "exponential",
         "With --lr-decay-style WSD: the shape of the final anneal."),
    INT("--lr-wsd-decay-iters", lr_wsd_decay_iters, "optimizer", "N", -1, "none", false, 1,
        "With --lr-decay-style WSD: iterations of the final anneal."),
    INT("--lr-wsd-decay-samples", lr_wsd_decay_samples, "optimizer", "N", -1, "none", false, 1,
        "With --lr-decay-style WSD and --train-samples: samples of the final anneal."),
    FLT("--weight-decay", weight_decay, "optimizer", 0.01, "0.01", false, 0, NAN, false, false,
        "Decoupled (AdamW) weight decay."),
    FLT("--adam-beta1", adam_beta1, "optimizer", 0.9, "0.9", false, 0, 1, false, true,
        "Adam's first-moment decay."),
    FLT("--adam-beta2", adam_beta2, "optimizer", 0.999, "0.999", false, 0, 1, false, true,
        "Adam's second-moment decay."),
    FLT("--adam-eps", adam_eps, "optimizer", 1e-8, "1e-08", false, 0, NAN, true, false,
        "Adam's denominator term."),
    FLT("--clip-grad", clip_grad, "optimizer", 1.0, "1", false, 0, NAN, false, false,
        "Global gradient-norm clipping threshold; 0 disables clipping."),
    STR("--save", save, "checkpoints", "DIR", false, "Directory to save checkpoints in."),
    INT("--save-interval", save_interval, "checkpoints", "N", 0, "0", false, 0,
        "Save every N iterations; 0 saves only at the end."),
    BOOL("--save-initial", save_initial, "checkpoints", "Also save before the first iteration."),
    STR("--load", load, "checkpoints", "DIR", false,
        "Directory to resume from: its latest complete checkpoint (a checkpoint whose files "
        "fail the manifest's sizes or checksums is passed over, with a message)."),
    BOOL("--no-replica-recovery", no_replica_recovery, "checkpoints",
         "Under megad, restart a failed attempt from the newest checkpoint even when the "
         "surviving data-parallel replicas hold a newer state."),
    BOOL("--async-save", async_save, "checkpoints",
         "Write checkpoints on a background thread: the step waits only for the copy to host "
         "memory."),
    BOOL("--finetune", finetune, "checkpoints",
         "With --load: load the weights only, and start at iteration 0 with fresh optimizer "
         "state, the data from its start and this job's LR schedule."),
    BOOL("--no-load-optim", no_load_optim, "checkpoints",
         "With --load: do not load the optimizer state; Adam's moments and step count start "
         "fresh, and, as in Megatron, the LR schedule is this job's (the checkpoint's is not "
         "loaded). Weights, iteration and data position load."),
    BOOL("--no-load-rng", no_load_rng, "checkpoints",
         "Accepted for Megatron compatibility and changes nothing: mega's training has no "
         "random state to load (counter-based dropout masks and initialization, data order "
         "from the flags)."),
    BOOL("--exit-on-missing-checkpoint", exit_on_missing_checkpoint, "checkpoints",
         "With --load: stop with an error when --load holds no checkpoint (a typo, a "
         "directory moved or not mounted) instead of starting from fresh weights. megad "
         "sets it when it restarts or resumes a job from a checkpoint it saw committed."),
    BOOL("--override-opt_param-scheduler", override_opt_param_scheduler, "checkpoints",
         "With --load: use this job's LR schedule (--lr, --min-lr, --lr-warmup-iters, "
         "--lr-decay-iters, --lr-decay-style) where the checkpoint's differs."),
    BOOL("--use-checkpoint-opt_param-scheduler", use_checkpoint_opt_param_scheduler,
         "checkpoints",
         "With --load: use the checkpoint's LR schedule instead of this job's LR flags."),
    BOOL("--exit-signal-handler", exit_signal_handler, "checkpoints",
         "On SIGTERM, save a checkpoint (with --save) at the next iteration boundary and "
         "stop; under megad the job ends STOPPED, resumable from it (a scheduler's warning "
         "before a time limit: deploy/slurm)."),
    INT("--exit-interval", exit_interval, "checkpoints", "N", 0, "0", false, 0,
        "Save a checkpoint (with --save) and stop after the first iteration divisible by N; "
        "0 never does."),
    INT("--exit-duration-in-mins", exit_duration_in_mins, "checkpoints", "N", 0, "0", false, 0,
        "Save a checkpoint (with --save) and stop at the first iteration boundary after N "
        "minutes of the job's run (its setup included); 0 never does."),
    INT("--eval-interval", eval_interval, "evaluation", "N", 0, "0", false, 0,
        "Evaluate every N iterations; 0 never evaluates."),
    INT("--eval-iters", eval_iters, "evaluation", "N", 100, "100", false, 0,
        "Iterations per evaluation (Megatron's default); 0 turns evaluation off, as in "
        "Megatron."),
    INT("--tensor-model-parallel-size", tensor_model_parallel_size, "parallelism", "N", 1, "1",
        false, 1, "Tensor-parallel size (TP): each layer's weights split over TP ranks of "
        "one node (Megatron's column- and row-parallel linears, vocabulary-parallel "
        "embedding and loss)."),
    INT("--context-parallel-size", context_parallel_size, "parallelism", "N", 1, "1", false, 1,
        "Accepted at 1 only: mega has no context parallelism."),
    BOOL("--sequence-parallel", sequence_parallel, "parallelism",
         "With TP > 1, split the layernorm regions along the sequence over the TP ranks "
         "(all-gather before and reduce-scatter after the parallel linears); as in "
         "Megatron, nothing changes at TP 1."),
    INT("--pipeline-model-parallel-size", pipeline_model_parallel_size, "parallelism", "N", 1,
        "1", false, 1, "Pipeline-parallel size (PP)."),
    INT("--virtual-pipeline-model-parallel-size", virtual_pipeline_model_parallel_size,
        "parallelism", "N", -1, "1", false, 1,
        "Model chunks per pipeline rank (VP) for the interleaved schedule."),
    INT("--num-layers-per-virtual-pipeline-stage", num_layers_per_virtual_pipeline_stage,
        "parallelism", "N", -1, "none", false, 1,
        "Decoder layers per model chunk; sets VP from --num-layers and PP."),
    INT("--microbatch-group-size-per-vp-stage", microbatch_group_size_per_vp_stage,
        "parallelism", "N", -1, "pipeline size", false, 1,
        "Microbatches run per model chunk before the next chunk (interleaved schedule)."),
    STR("--pipeline-model-parallel-layout", pipeline_model_parallel_layout, "parallelism", "STR",
        false, "Layers per stage, e.g. \"Et*3|(tt|)*29,m|L\"; sets VP from the stage count."),
    INT("--decoder-first-pipeline-num-layers", decoder_first_pipeline_num_layers, "parallelism",
        "N", -1, "none", false, 0, "Decoder layers on the first pipeline rank."),
    INT("--decoder-last-pipeline-num-layers", decoder_last_pipeline_num_layers, "parallelism",
        "N", -1, "none", false, 0, "Decoder layers on the last pipeline rank."),
    ENUM("--schedule", schedule, "parallelism", "no-pipelining|gpipe|1f1b|interleaved|zb-h1",
         schedules, MEGA_JOB_SCHEDULE_AUTO, "auto",
         "Pipeline schedule; by default chosen from PP and VP."),
    BOOL("--batch-p2p-comm", batch_p2p_comm, "p2p and memory",
         "Post a step's sends and receives as one batch instead of in even/odd order."),
    BOOL("--overlap-p2p-comm", overlap_p2p_comm, "p2p and memory",
         "Overlap pipeline sends and receives with compute (interleaved schedule)."),
    BOOL("--overlap-p2p-comm-warmup-flush", overlap_p2p_comm_warmup_flush, "p2p and memory",
         "Also overlap P2P in the warmup and flush phases."),
    BOOL("--variable-seq-lengths", variable_seq_lengths, "p2p and memory",
         "Send each activation's shape before it, for varying sequence lengths."),
    BOOL("--deallocate-pipeline-outputs", deallocate_pipeline_outputs, "p2p and memory",
         "Free a stage's output as soon as it is sent, keeping only what backward needs."),
    ENUM("--recompute-granularity", recompute_granularity, "p2p and memory", "full|selective", recomputes,
         MEGA_RECOMPUTE_NONE, "none",
         "Recompute activations in backward instead of storing them: full recomputes whole "
         "layers (with --recompute-method), selective only the attention core."),
    ENUM("--recompute-method", recompute_method, "p2p and memory", "uniform|block",
         recompute_methods, MEGA_RECOMPUTE_METHOD_NONE, "none",
         "With --recompute-granularity full: uniform splits each model chunk's layers into "
         "groups of --recompute-num-layers and keeps only each group's input; block recomputes "
         "only the first --recompute-num-layers layers of each model chunk."),
    INT("--recompute-num-layers", recompute_num_layers, "p2p and memory", "N", -1, "none", false,
        1, "With --recompute-granularity full: layers per recomputed group (uniform), or "
        "recomputed layers per model chunk (block)."),
    BOOL("--overlap-grad-reduce", overlap_grad_reduce, "data parallel",
         "Reduce gradient buckets while backward still runs."),
    BOOL("--align-grad-reduce", align_grad_reduce, "data parallel",
         "Launch every pipeline stage's gradient reduce together."),
    INT("--bucket-size", bucket_size, "data parallel", "N", -1, "max(40M, 1M x DP)", false, 1,
        "Gradient bucket size in elements (with --overlap-grad-reduce)."),
    BOOL("--use-distributed-optimizer", use_distributed_optimizer, "data parallel",
         "Shard optimizer state over data-parallel ranks (reduce-scatter, all-gather)."),
    BOOL("--no-optimizer-shard-copy", no_optimizer_shard_copy, "data parallel",
         "Keep no copy of each rank's optimizer shard on its data-parallel neighbour (saves "
         "two moments of a shard and a step's shard exchange; a lost rank's shard then exists "
         "nowhere else, so recovery goes back to the newest checkpoint)."),
    BOOL("--overlap-param-gather", overlap_param_gather, "data parallel",
         "Gather updated parameters while the next forward runs (distributed optimizer)."),
    BOOL("--average-in-collective", average_in_collective, "data parallel",
         "Divide gradients by DP inside the reduction instead of before it."),
    INT("--blas-threads", blas_threads, "worker", "N", 1, "1", false, 1,
        "BLAS threads per CPU worker."),
    ENUM("--backend", backend, "worker", "auto|cpu|cuda", backends, MEGA_JOB_BACKEND_AUTO,
         "auto",
         "The math backend: cuda (the cuda module on the rank's GPU, NCCL between ranks), "
         "cpu, or auto (cuda for a single rank on a machine with a GPU and the module, else "
         "cpu)."),
    BOOL("--bf16", bf16, "worker",
         "The linear layers' GEMMs take bf16 inputs (rounded to nearest even) and accumulate "
         "in fp32 (cuBLAS bf16 GEMMs on cuda, the same rounding before OpenBLAS on cpu); "
         "attention with heads of 64 or 128 is bf16 flash attention on cuda, rounded at the "
         "same places on cpu (not with --attention-dropout: fp32 batched GEMMs, keeping [B, "
         "heads, T, T] probabilities a layer); weights, gradients and optimizer state stay "
         "fp32."),
    BOOL("--no-bias-gelu-fusion", no_bias_gelu_fusion, "worker",
         "Megatron's: turn the bias-GELU fusion off. GPT-2's GELU is then the exact one, "
         "0.5 x (1 + erf(x / sqrt 2)) (torch's F.gelu, Hugging Face's \"gelu\"), unless "
         "--openai-gelu; by default it is the tanh approximation (\"gelu_new\"), which the "
         "cuda backend fuses with c_fc's GEMM under --bf16 (cuBLASLt's GELU epilogue, and its "
         "derivative in the backward)."),
    INT("--trace-iteration", trace_iteration, "worker", "N", 0, "0", false, 0,
        "Record a Chrome trace of iteration N (1-based); 0 records none."),
    STR("--simulate-compute", simulate_compute, "worker", "F_MS:B_MS[:W_MS]", false,
        "Sleep these milliseconds instead of computing forward, backward (and weight grad)."),
    INT("--log-interval", log_interval, "worker", "N", 100, "100", false, 1,
        "Print a line every N iterations (Megatron's default) and at the last, Megatron's: its "
        "loss and time are the means over those iterations (--json prints every iteration)."),
    /* issue 24 */
    BOOL("--log-throughput", log_throughput, "worker",
         "Add Megatron's throughput per GPU (TFLOP/s/GPU, its FLOPs formula) to the line."),
};

const int mega_jf_nflags = sizeof mega_jf_table / sizeof mega_jf_table[0];
