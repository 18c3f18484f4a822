/* A decoder-only transformer, GPT-2's or Llama's, built per pipeline stage.
 *
 * GPT-2 (Hugging Face's GPT2LMHeadModel): learned token and position
 * embeddings; pre-LN blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) with
 * causal self-attention (fused QKV [C,3C], output projection [C,C]) and an
 * MLP of F = 4C (or ffn_hidden) with GELU, the tanh approximation ("gelu_new")
 * or with gelu_erf the exact one ("gelu"); a final layernorm ln_f; the
 * LM head tied to wte (or, untied, lm_head.weight). Weights are HF Conv1D
 * [in, out].
 *
 * Llama (Hugging Face's LlamaForCausalLM, Megatron's --position-embedding-
 * type rope --normalization RMSNorm --swiglu): a token embedding
 * (model.embed_tokens) and no position embedding; RMSNorm before attention
 * (input_layernorm) and MLP (post_attention_layernorm); grouped-query
 * attention, NH query heads over G key/value heads of head_dim channels
 * (q_proj [NH*hd, C], k_proj and v_proj [G*hd, C], o_proj [C, NH*hd]), q
 * and k rotated by RoPE after their projections; a SwiGLU MLP,
 * down_proj(silu(gate_proj(x)) * up_proj(x)) of width F; a final RMSNorm
 * (model.norm); the head lm_head [V, C], or tied to embed_tokens. Weights
 * are nn.Linear [out, in]; biases only without no_bias (HF's attention_bias
 * and mlp_bias).
 *
 * RoPE convention: Hugging Face's rotate-half (Megatron's default, not
 * interleaved) on the projections exactly as saved: in each head, channel i
 * < rot/2 pairs with channel i + rot/2 and the pair turns by t * theta^(-2i
 * / rot) at position t, rot = head_dim * rotary_percent (channels past rot
 * are not rotated). So a checkpoint's q_proj and k_proj load into HF's
 * LlamaForCausalLM as they are, with no permutation of their rows.
 *
 * Hidden dropout (Megatron's --hidden-dropout, HF GPT-2's resid_pdrop and
 * embd_pdrop) on the embeddings' output and on each attention and MLP
 * output (with its bias) before its residual add, in training forwards
 * only (those given their samples: mega_gpt_acts_set_samples). Its mask is
 * counter-based (kernels/dropout.h): a function of the seed, the sample's
 * place in the training order, the layer, the site, the position and the
 * channel, so every layout draws the same one and backward and
 * recomputation regenerate it. Attention dropout (Megatron's
 * --attention-dropout, HF GPT-2's attn_pdrop) on the softmax probabilities
 * before they multiply V, also in training forwards only, its mask a
 * function of the seed, the sample, the layer, the head (in the model's
 * numbering, so a TP head split draws the same), the query and the key
 * position; the same mask on both backends (the cuda backend's batched
 * GEMMs, not flash attention, run it). Weights use Hugging Face names and
 * layouts, so a checkpoint is a plain copy.
 *
 * A stage holds a contiguous run of layers, plus the embedding (wte, and
 * wpe for GPT-2; its input is tokens) and/or the loss (the final norm and
 * the head; its output is the loss). With the head tied, a loss stage that
 * is not also the embedding stage holds its own copy of the embedding
 * (mega_param_info.tied_copy); it starts equal to the embedding stage's,
 * and keeping the two equal (summing their gradients across the embedding
 * group) is the engine's job. An untied head is the loss stage's own.
 *
 * Parameters live in one flat buffer and gradients in another of the same
 * size (backend memory), in forward order: the embedding (wte, wpe), then
 * per layer the first norm, the attention's input projections (c_attn, or
 * q, k, v), its output projection, the second norm, the MLP's input
 * projections (c_fc, or gate and up) and its output projection (each weight
 * before its bias), then the final norm, then the head (an untied head, or
 * a loss-only stage's tied copy).
 *
 * Initialisation never depends on the parallel layout: element i of the
 * full tensor named n is a function of (seed, n, i) alone (kernels/rng.h),
 * so a stage's tensors equal the single-stage ones. Weights (embeddings,
 * projections, the head) ~ N(0, init_std); the residual output projections
 * (attn.c_proj and mlp.c_proj, o_proj and down_proj) ~ N(0,
 * init_std/sqrt(2*num_layers)); biases 0; norm weights 1. GPT-2 and
 * Megatron use init_std 0.02.
 *
 * Activations of one microbatch in flight are a mega_gpt_acts: the pipeline
 * keeps several alive, and microbatches may differ in length T.
 *
 * Backward comes in two halves so the zero-bubble schedule can call them
 * apart: backward_input computes the input gradient and keeps in the acts
 * what the weight half needs (each linear's and norm's output gradient);
 * backward_weight adds (+=) every parameter gradient of the stage (linears,
 * biases, norms, the embeddings, the head) into the grad buffer. A plain
 * backward calls both, in that order, once per forward, or
 * mega_gpt_backward, which interleaves them block by block.
 *
 * Pointer kinds: tokens, targets and loss_sum are host memory; input,
 * output, doutput, dinput, the param and grad buffers and the logits are
 * backend memory (the same as host on the cpu backend).
 *
 * Ownership: a stage borrows its backend (which must outlive it) and owns
 * its buffers; acts borrow their stage (destroy acts first) and own theirs.
 * Pointers returned by accessors live as long as their object. A stage, its
 * acts and its backend are used from one thread at a time. */
#ifndef MEGA_WORKER_GPT_H
#define MEGA_WORKER_GPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/model/safetensors.h"
#include "worker/model/tp_split.h"

typedef enum mega_gpt_arch {
  MEGA_GPT_ARCH_GPT2,  /* Hugging Face's GPT2LMHeadModel */
  MEGA_GPT_ARCH_LLAMA, /* Hugging Face's LlamaForCausalLM */
} mega_gpt_arch;

typedef struct mega_gpt_config {
  int vocab_size;  /* 256: byte-level */
  int max_seq_len; /* GPT-2: rows of wpe; Llama: positions RoPE covers */
  int num_layers;  /* of the whole model */
  int num_heads;   /* query heads */
  int channels;    /* C, the hidden size */
  float init_std;  /* 0.02 */
  float ln_eps;    /* 1e-5: the layernorm's, or RMSNorm's, epsilon */
  uint64_t seed;
  mega_gpt_arch arch;   /* GPT-2 */
  int num_kv_heads;     /* G, key/value heads (Llama's query groups); 0: num_heads */
  int head_dim;         /* 0: channels / num_heads (GPT-2's only choice) */
  int ffn_hidden;       /* F, the MLP's width; 0: 4 * channels */
  bool untied;          /* the head is lm_head.weight, not the embedding */
  bool no_bias;         /* Llama: linear layers without biases */
  bool gelu_erf;        /* GPT-2: the exact GELU (erf; HF's "gelu"), not tanh's "gelu_new" */
  float rope_theta;     /* Llama: RoPE's base, 10000 */
  double rotary_percent; /* Llama: the share of head_dim that RoPE turns, (0, 1]; 1 */
  double hidden_dropout; /* the probability an element is dropped, [0, 1); 0 */
  double attention_dropout; /* the probability an attention probability is dropped; 0 */
} mega_gpt_config;

/* vocab 256, max_seq_len 1024, 12 layers, 12 heads, 768 channels,
 * init_std 0.02, ln_eps 1e-5, seed 1337; GPT-2 (G = NH, head_dim C/NH, F
 * 4C, tied, biases), rope_theta 10000, rotary_percent 1. */
void mega_gpt_config_default(mega_gpt_config *cfg);
/* Checks sizes, divisibility and what each architecture allows; the
 * message names the bad field. */
mega_status mega_gpt_config_check(const mega_gpt_config *cfg, mega_err *err);
/* The derived sizes (of a checked config): G, head_dim, F, and RoPE's
 * rotated channels per head (even; 0 for GPT-2). */
int mega_gpt_kv_heads(const mega_gpt_config *cfg);
int mega_gpt_head_dim(const mega_gpt_config *cfg);
int mega_gpt_ffn(const mega_gpt_config *cfg);
int mega_gpt_rot_dim(const mega_gpt_config *cfg);

/* Tensor parallelism (Megatron's, seed 004 section 3). The TP ranks of a
 * stage hold slices: column-parallel c_attn (this rank's heads' q, k and v;
 * tp_split.h) and c_fc, row-parallel attn.c_proj and mlp.c_proj, and a
 * contiguous slice of the vocabulary of wte and the head. Llama's q_proj,
 * k_proj and v_proj are column-parallel by query group (rank r holds groups
 * [r G/tp, (r+1) G/tp) and their query heads, so G must divide by tp),
 * gate_proj and up_proj by the same rows (matching columns of SwiGLU's two
 * halves), o_proj and down_proj row-parallel. Norms, wpe and the
 * row-parallel biases are replicated. The model reaches its group
 * through these ops, which the caller implements over its communicator (and
 * times); every TP rank of a stage issues the same calls in the same order.
 * Buffers are backend memory. */
typedef struct mega_gpt_tp_ops {
  /* buf[n] = its sum (resp. maximum) over the group, in place. */
  mega_status (*all_reduce)(void *ctx, float *buf, size_t n, mega_err *err);
  mega_status (*all_reduce_max)(void *ctx, float *buf, size_t n, mega_err *err);
  /* out[size*n] = every rank's in[n], rank by rank. */
  mega_status (*all_gather)(void *ctx, const float *in, float *out, size_t n, mega_err *err);
  /* out[n] = this rank's part of in[size*n] summed over the group. */
  mega_status (*reduce_scatter)(void *ctx, const float *in, float *out, size_t n,
                                mega_err *err);
} mega_gpt_tp_ops;

/* With sequence_parallel, the residual stream between blocks (and so a
 * stage's input and output) is split along the rows: rank r holds rows
 * [r*N/tp, (r+1)*N/tp) of [N = B*T, C]; the layernorms run on those rows,
 * an all-gather precedes each column-parallel GEMM and a reduce-scatter
 * follows each row-parallel one. Without it the stream is whole on every
 * rank and the row-parallel outputs are all-reduced. */
typedef struct mega_gpt_tp {
  int size, rank; /* 1, 0: no tensor parallelism (ops may then be NULL) */
  bool sequence_parallel;
  const mega_gpt_tp_ops *ops;
  void *ctx; /* borrowed; must outlive the stage */
} mega_gpt_tp;

/* Activation recomputation, as Megatron's --recompute-granularity and
 * --recompute-method define it. Full recomputation keeps only a recomputed
 * group's input through forward and reruns the group's forward just before
 * its backward; its blocks' activations live in the stage's scratch (one
 * set for the group being rerun, shared by all the stage's acts) instead of
 * one set per block. Selective keeps every block's activations but the
 * attention probabilities [B,NHl,T,T] (one scratch buffer for all blocks),
 * which backward recomputes from the kept qkv.
 * Losses and gradients are bit-identical to MEGA_GPT_RECOMPUTE_NONE: the
 * same operations run on the same inputs. */
typedef enum mega_gpt_recompute {
  MEGA_GPT_RECOMPUTE_NONE,
  MEGA_GPT_RECOMPUTE_UNIFORM,   /* full: groups of recompute_layers blocks from the first */
  MEGA_GPT_RECOMPUTE_BLOCK,     /* full: only the first recompute_layers blocks, each alone */
  MEGA_GPT_RECOMPUTE_SELECTIVE, /* the attention core of every block */
} mega_gpt_recompute;

typedef struct mega_gpt_stage_desc {
  bool embedding;  /* holds wte, wpe; its input is tokens */
  bool loss;       /* holds ln_f and the tied head; its output is the loss */
  int first_layer; /* global id of its first block */
  int num_layers;  /* may be 0 for an embedding-only or loss-only stage */
  mega_gpt_tp tp;  /* zero means {1, 0}: no tensor parallelism */
  mega_gpt_recompute recompute; /* zero: none */
  int recompute_layers;         /* N >= 1 for UNIFORM and BLOCK (may exceed num_layers) */
  /* The caller runs backward_input and backward_weight apart (zero-bubble):
   * then a rerun block keeps its output gradients in the acts from one to
   * the other; else they live in the scratch, and with full recomputation
   * only mega_gpt_backward may run the stage's backward. */
  bool split_backward;
  /* The caller overwrites every parameter before the first use (a rank
   * that takes its state from replicas): create leaves them zero and skips
   * the initialisation, which costs seconds on a large stage. */
  bool no_init;
  /* GPT-2's c_fc and GELU as two ops even where the backend fuses them
   * (matmul_gelu_*): Megatron's --no-bias-gelu-fusion. (The fusion is
   * tanh's only: a gelu_erf model runs the two ops regardless.) */
  bool no_gelu_fusion;
} mega_gpt_stage_desc;

typedef struct mega_param_info {
  char name[64]; /* HF name: "transformer.h.3.attn.c_attn.weight"; the head
                    copy of a loss-only stage is the embedding's name */
  int ndim;      /* 1 or 2 */
  int shape[2];
  size_t offset, numel; /* in floats, into the flat param and grad buffers */
  bool decay;           /* 2-D weights decay; biases and LN params don't */
  bool tied_copy;       /* the loss-only stage's copy of the embedding */
  /* The word embedding shared with the head (tied): on the embedding stage
   * and as the loss stage's copy. Its gradient is summed across the
   * embedding group. Never set with an untied head. */
  bool tied_embedding;
  /* Tensor parallelism: shape is this rank's slice; the whole tensor is
   * full_shape (full_numel floats) and splits as tp says. */
  mega_tp_split tp;
  int full_shape[2];
  size_t full_numel;
  /* With --sequence-parallel this rank's gradient covers its rows only (the
   * layernorms): the caller sums it over the TP group before the step. */
  bool sp_partial;
} mega_param_info;

typedef struct mega_gpt_stage mega_gpt_stage;
typedef struct mega_gpt_acts mega_gpt_acts;

/* Allocates the flat param and grad buffers, initialises the params (zero
 * with desc->no_init) and zeroes the grads. cfg and desc are copied. */
mega_status mega_gpt_stage_create(mega_backend *be, const mega_gpt_config *cfg,
                                  const mega_gpt_stage_desc *desc,
                                  mega_gpt_stage **out, mega_err *err);
void mega_gpt_stage_destroy(mega_gpt_stage *s); /* NULL is fine */

const mega_gpt_config *mega_gpt_stage_config(const mega_gpt_stage *s);
const mega_gpt_stage_desc *mega_gpt_stage_desc_get(const mega_gpt_stage *s);
mega_backend *mega_gpt_stage_backend(const mega_gpt_stage *s);

const mega_param_info *mega_gpt_params(const mega_gpt_stage *s, int *count);
const mega_param_info *mega_gpt_param_find(const mega_gpt_stage *s, const char *name);
float *mega_gpt_param_data(mega_gpt_stage *s); /* flat, backend memory */
float *mega_gpt_grad_data(mega_gpt_stage *s);  /* flat, backend memory */
size_t mega_gpt_num_params(const mega_gpt_stage *s); /* floats in each buffer */
void mega_gpt_zero_grad(mega_gpt_stage *s);
/* Re-runs the initialisation (create already did). */
mega_status mega_gpt_init_params(mega_gpt_stage *s, mega_err *err);

/* Units: the groups of parameters whose gradients one step of backward
 * completes together (the weight-gradient GEMMs of one input with their
 * biases, or one norm), in the order backward completes them: the head (an
 * untied head, or a loss-only stage's copy of the embedding) and the final
 * norm; then block by block from the last, each block's MLP output
 * projection, MLP input projections (c_fc, or gate and up), second norm,
 * attention output projection, attention input projections (c_attn, or q, k
 * and v), first norm; then the embedding (wte, wpe). On a stage that is
 * both embedding and loss a tied head is wte itself, which is complete only
 * with the embedding unit. Each
 * unit is a run [first, first+count) of mega_gpt_params, numel its
 * elements; layer is the block's index within the stage (-1 for the loss
 * and embedding units). Megatron learns the same from autograd's
 * per-parameter hooks. */
typedef struct mega_gpt_unit {
  int first, count;
  size_t numel;
  int layer;
} mega_gpt_unit;
const mega_gpt_unit *mega_gpt_units(const mega_gpt_stage *s, int *count);

/* Backward tells its caller, unit by unit in that order, that it has added
 * this microbatch's gradients of params [first, first+count): called from
 * backward_weight and mega_gpt_backward as each unit finishes, on the
 * calling thread. The model knows nothing of microbatches or buckets; the
 * caller decides what a finished unit means. fn NULL unregisters. */
typedef void (*mega_gpt_grads_done_fn)(void *arg, int first, int count);
void mega_gpt_on_grads_done(mega_gpt_stage *s, mega_gpt_grads_done_fn fn, void *arg);
/* Forward tells its caller, unit by unit in forward order (the reverse of
 * the above), just before the part of forward that first reads the unit's
 * parameters (a block asks for all its units before it starts), so that
 * parameters still arriving (a distributed optimizer's all-gather) are
 * waited for only then. fn NULL unregisters. */
void mega_gpt_on_params_needed(mega_gpt_stage *s, mega_gpt_grads_done_fn fn, void *arg);

/* Moves the stage's parameters and gradients into the caller's buffers of
 * numel floats each (backend memory): param i (mega_gpt_params order) lives
 * at params + offset[i] and its gradient at grads + offset[i], every range
 * inside numel and none overlapping. The current parameter values are
 * copied over; the gradients are not (zero grads first). The stage frees
 * its own buffers and from now on borrows these, which must outlive it;
 * mega_param_info.offset, mega_gpt_param_data, mega_gpt_grad_data and
 * mega_gpt_num_params describe the new buffers (floats between the
 * tensors are the caller's padding). */
mega_status mega_gpt_rebind(mega_gpt_stage *s, float *params, float *grads, size_t numel,
                            const size_t *offset, mega_err *err);

/* Loads every param of the stage by its HF name from whichever of the files
 * holds it (a tied head copy also accepts "lm_head.weight"); shapes must
 * match the whole tensor's, and a TP rank keeps its slice. Fails, naming the
 * tensor, when one is missing. */
mega_status mega_gpt_load_safetensors(mega_gpt_stage *s,
                                      const mega_st_file *const *files,
                                      size_t nfiles, mega_err *err);
/* Writes every param of the stage (tied copy included) to one file; a TP
 * stage is refused (its tensors are slices). */
mega_status mega_gpt_save_safetensors(mega_gpt_stage *s, const char *path,
                                      mega_err *err);

/* The stage's tensor parallelism (size 1 when it has none). */
const mega_gpt_tp *mega_gpt_stage_tp(const mega_gpt_stage *s);
/* Rows of the residual stream this rank holds for a microbatch of B*T
 * tokens: B*T/tp with sequence parallelism, else B*T. A stage's input and
 * output are [rows, C]. */
int mega_gpt_stream_rows(const mega_gpt_stage *s, int B, int T);

/* Activations for one microbatch of B sequences of T tokens (T <=
 * max_seq_len), laid out for the stage's recomputation (desc.recompute). */
mega_status mega_gpt_acts_create(mega_gpt_stage *s, int B, int T, mega_gpt_acts **out,
                                 mega_err *err);
/* Bytes the acts own: with full recomputation they hold only each
 * recomputed group's input, not its blocks' activations. */
size_t mega_gpt_acts_bytes(const mega_gpt_acts *a);
/* Bytes of the stage's recomputation scratch, shared by all its acts (0
 * without recomputation): full recomputation's largest group of blocks, or
 * selective's attention probabilities of one block. Count it once per stage
 * beside the acts. */
size_t mega_gpt_scratch_bytes(const mega_gpt_stage *s);
void mega_gpt_acts_dims(const mega_gpt_acts *a, int *B, int *T);
/* Loss stage: logits [B,T,V/tp] of the last forward (backend memory):
 * this rank's slice of the vocabulary. NULL after a forward with targets:
 * the loss writes its probabilities over them (one buffer, not two), so
 * generation and evaluation of logits run the forward without targets. */
const float *mega_gpt_acts_logits(const mega_gpt_acts *a);
/* Loss stage: the loss_scale the backward of the next forwards will be
 * given, known before them (the engine knows it per iteration). The
 * forward then writes d(loss)/d(logits) in the classifier's one pass per
 * row, the probabilities never stored (backend.h's
 * crossentropy_forward_grad), and a backward given another scale fails.
 * Kept for later forwards on these acts; 0 (the default) turns it off: the
 * forward writes the probabilities and the backward applies its scale. The
 * gradients are the same bits either way. */
void mega_gpt_acts_set_loss_scale(mega_gpt_acts *a, float loss_scale);
/* Training with hidden dropout: the next forwards on these acts hold
 * samples first_sample + b (b < B) of the training order (a microbatch's
 * samples are consecutive: data.h), whose numbers pick the mask with the
 * seed, layer, site, position and channel. Negative (the default):
 * evaluation or generation, no dropout. A forward keeps the value it ran
 * with for its own backward and recomputation. Without cfg.hidden_dropout
 * or cfg.attention_dropout nothing changes. */
void mega_gpt_acts_set_samples(mega_gpt_acts *a, int64_t first_sample);
void mega_gpt_acts_destroy(mega_gpt_acts *a); /* NULL is fine */

/* Forward one microbatch.
 * tokens  [B,T] host, embedding stage (else NULL); each in [0, V).
 * input   [rows,C] backend, other stages (else NULL); copied into acts, the
 *         caller may free it after.
 * targets [B,T] host, loss stage; may be NULL for logits only (then no
 *         backward), each in [0, V).
 * output  [rows,C] backend, non-loss stages (else NULL); not referenced
 *         after return.
 * loss_sum (host) loss stage with targets: the sum of the B*T per-token
 *         cross-entropies (the same on every TP rank).
 * rows is mega_gpt_stream_rows(s, B, T). */
mega_status mega_gpt_forward(mega_gpt_stage *s, mega_gpt_acts *a, const int32_t *tokens,
                             const float *input, const int32_t *targets, float *output,
                             double *loss_sum, mega_err *err);

/* Input half of the backward of the acts' last forward.
 * doutput [rows,C] backend, non-loss stages (else NULL): d(total loss)/d(output).
 * loss_scale: loss stage, d(total loss)/d(each token's loss), e.g. 1/(G*B*T).
 * dinput [rows,C] backend, non-embedding stages (else NULL), overwritten. */
mega_status mega_gpt_backward_input(mega_gpt_stage *s, mega_gpt_acts *a,
                                    const float *doutput, float loss_scale,
                                    float *dinput, mega_err *err);
/* Weight half: grads += this microbatch's parameter gradients. Requires
 * backward_input on the same acts first. */
mega_status mega_gpt_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a,
                                     mega_err *err);

/* Both halves, unit by unit: each block's weight gradients right after its
 * input gradient, as autograd would, so a unit's gradients are complete
 * (and reported) as early as possible. Bit-identical to backward_input
 * then backward_weight. */
mega_status mega_gpt_backward(mega_gpt_stage *s, mega_gpt_acts *a, const float *doutput,
                              float loss_scale, float *dinput, mega_err *err);

#endif
