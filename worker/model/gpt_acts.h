/* One microbatch's activations: their layout (gpt_acts.c, with the stage's
 * recomputation scratch) and the passes over them (gpt_pass.c). Not a
 * public header.
 *
 * Shapes, with N = B*T tokens, R the stream's rows on this rank (N/tp with
 * sequence parallelism, else N), and Vl = V/tp, NHl = NH/tp, Gl = G/tp,
 * Ql = NHl * head_dim, KVl = Gl * head_dim, Fl = F/tp this rank's
 * vocabulary, query and key/value heads, query and key/value widths and
 * MLP width: the residual stream, norm statistics and their gradients are
 * [R,..]; the column-parallel GEMMs' inputs (ln1, ln2, lnf) are whole
 * [N,C], and their outputs, the attention and the MLP inside are [N, local
 * width]. The attention's q, k and v: GPT-2's fused rows [N, 3Ql] (q | k |
 * v in each row), or Llama's three blocks q [N,Ql], k [N,KVl], v [N,KVl]
 * one after the other (gpt_qkv). */
#ifndef MEGA_WORKER_GPT_ACTS_H
#define MEGA_WORKER_GPT_ACTS_H

#include "worker/model/gpt_internal.h"

/* One block's saved activations and (after backward_input) the output
 * gradients its weight half needs. */
typedef struct layer_acts {
  float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [R], [R] (RMSNorm: no mean) */
  float *qkv;                       /* N*(Ql + 2KVl): q, k, v (Llama's rotated) */
  float *atty;                      /* [N,Ql] attention output */
  float *att;                       /* att_floats: [B,NHl,T,T] probabilities, or
                                       what the backend keeps instead */
  float *x2;                        /* [R,C] residual after attention */
  float *ln2, *ln2_mean, *ln2_rstd; /* [N,C], [R], [R] */
  float *fch, *fcu, *fch_gelu;      /* [N,Fl]: c_fc's output (Llama: gate's, and up's)
                                       and the activation (gelu, or silu(gate) * up) */
  /* gradients */
  float *dx2;        /* [R,C] d(x2): attn.c_proj's output gradient */
  float *dfch, *dfcu; /* [N,Fl] d(fch) (c_fc's or gate's output gradient), d(fcu) */
  float *dln2;       /* [R,C] */
  float *dqkv;       /* laid out as qkv */
  float *dln1;       /* [R,C] */
  /* the whole [N,C] output gradients of the row-parallel GEMMs: gathered
   * with sequence parallelism, times the dropout mask with dropout, else
   * dresid[l+1] and dx2 themselves */
  float *dy_all, *dx2_all;
} layer_acts;

typedef enum { ST_EMPTY, ST_FORWARD, ST_BACKWARD_INPUT } acts_state;

struct mega_gpt_acts {
  mega_gpt_stage *s;
  int B, T;
  int R; /* the stream's rows on this rank */
  size_t bytes;
  void *block; /* the one backend allocation everything below points into */
  acts_state state;
  bool have_targets;
  float fused_scale; /* mega_gpt_acts_set_loss_scale's; 0: off */
  /* mega_gpt_acts_set_samples's first sample, and the one the last forward
   * ran with (its backward's); negative: no dropout */
  int64_t next_sample, fwd_sample;
  float grad_scale;  /* the scale the last forward's dlogits carry; 0: they are probabilities */
  int32_t *tokens, *targets; /* [N] */
  /* resid[l]: input of local block l; resid[L] is the loss stage's ln_f
   * input. dresid[l] is its gradient. [R,C] each. */
  float **resid, **dresid;
  /* Blocks that full recomputation reruns point into the stage's scratch
   * (one set for the group being rerun), and with selective recomputation
   * every block's att does; gen is the scratch's rc_gen they point into. */
  layer_acts *layers;
  unsigned gen;
  float *sink; /* [R,C] scratch: where a rerun group's output goes (the real one is kept) */
  float *lnf, *lnf_mean, *lnf_rstd; /* loss stage: [N,C], [R], [R] */
  /* [N,Vl]: the logits; with targets the loss overwrites them with the
   * probabilities and the backward those with dlogits (one buffer), or
   * with fused_scale the loss writes dlogits itself. losses [N]. */
  float *logits, *losses;
  float *dlogits, *dlnf;            /* [N,Vl] (the logits, overwritten), [R,C] */
  float *rowmax, *ce_sums;          /* TP loss: [N], [2N] */
  float *datty;                     /* [N,Ql] scratch: attention output grad */
  float *att_scratch;               /* att_scratch_floats */
  /* what attention needs in att and att_scratch (mega_attention_sizes,
   * asked once the backend's --bf16 is set, with attention dropout's mask
   * when the model trains with it) */
  size_t att_floats, att_scratch_floats;
  float *partial;                   /* [N,C] scratch: a row-parallel result
                                       before its reduce-scatter (sequence
                                       parallelism) */
};


/* This rank's widths of a stage's attention and MLP (gpt_acts.h). */
typedef struct gpt_widths {
  int NHl, Gl, hd, Ql, KVl, Fl;
} gpt_widths;
gpt_widths gpt_local_widths(const mega_gpt_stage *s);

/* q, k and v (or their gradients) in a block's qkv buffer of N rows, and
 * attention's shape over them. */
void gpt_qkv(const mega_gpt_stage *s, int N, float *base, float **q, float **k, float **v);
mega_attn_dims gpt_attn_dims(const mega_gpt_stage *s, int B, int T);
/* Block l's attention call on a's activations: gpt_attn_dims with a's
 * buffer sizes and, when a's last forward trains with attention dropout,
 * its mask. */
mega_attn_dims gpt_acts_attn_dims(const mega_gpt_stage *s, const mega_gpt_acts *a, int l);

/* Full recomputation's groups: block l is rerun with the blocks
 * [*first, *end), from the input of *first, or false when l keeps its
 * activations. Megatron's methods: uniform cuts the chunk into groups of N
 * from its first block; block reruns each of the first N blocks alone. */
bool gpt_rc_group(const mega_gpt_stage *s, int l, int *first, int *end);

/* Points the acts' recomputed buffers into the stage's scratch again after
 * it moved (a larger acts grew it); a no-op when it did not. */
void gpt_acts_bind(mega_gpt_acts *a);

#endif
