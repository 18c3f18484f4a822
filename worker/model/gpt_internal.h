/* Shared between gpt.c (stage, params), gpt_acts.c (the activations'
 * layout) and gpt_pass.c (forward, backward), the last two through
 * gpt_acts.h; not a public header. */
#ifndef MEGA_WORKER_GPT_INTERNAL_H
#define MEGA_WORKER_GPT_INTERNAL_H

#include "worker/model/gpt.h"

/* What each parameter is, whatever the architecture names it. */
typedef enum gpt_role {
  R_WTE, R_WPE,
  /* a block's: the first norm, the attention's input projections (GPT-2's
   * fused c_attn, or Llama's q, k and v), its output projection, the second
   * norm, the MLP's input projections (c_fc, or gate and up) and its output
   * projection */
  R_LN1W, R_LN1B, R_QKVW, R_QKVB, R_QW, R_QB, R_KW, R_KB, R_VW, R_VB, R_PROJW, R_PROJB,
  R_LN2W, R_LN2B, R_FCW, R_FCB, R_UPW, R_UPB, R_FCPROJW, R_FCPROJB,
  R_LNFW, R_LNFB, R_HEAD,
} gpt_role;

/* Float offsets of one block's tensors in the flat buffers (GPT_NO_OFF for
 * those its architecture lacks); fcw is Llama's gate. */
typedef struct gpt_layer_off {
  size_t ln1w, ln1b, qkvw, qkvb, qw, qb, kw, kb, vw, vb, projw, projb, ln2w, ln2b, fcw, fcb, upw,
      upb, fcprojw, fcprojb;
} gpt_layer_off;

#define GPT_NO_OFF ((size_t)-1)

struct mega_gpt_stage {
  mega_backend *be;
  mega_gpt_config cfg;
  mega_gpt_stage_desc desc;
  mega_param_info *params;
  int nparams;
  size_t numel;
  float *param, *grad;
  /* GPT_NO_OFF when the stage lacks them; head is wte's offset on a stage
   * that is both embedding and loss. */
  size_t wte, wpe, lnfw, lnfb, head;
  gpt_layer_off *layers; /* desc.num_layers */
  gpt_role *role;        /* per param */
  int *role_layer;       /* per param: its block within the stage, or -1 */
  mega_wlayout lay;      /* the projections': Conv1D (GPT-2) or nn.Linear (Llama) */
  /* Llama: RoPE's cos and sin [max_seq_len, rot] (backend.h's rope_forward),
   * backend memory the stage owns; NULL for GPT-2. */
  float *rope_cs;
  bool borrowed;         /* param and grad are the caller's (mega_gpt_rebind) */
  mega_gpt_unit *units;  /* backward order */
  int nunits;
  mega_gpt_grads_done_fn grads_done, params_needed;
  void *grads_done_arg, *params_needed_arg;
  /* Recomputation's scratch (laid out and grown in gpt_acts.c, rerun into
   * by gpt_pass.c), shared by all the stage's acts, since one backward runs
   * at a time: the blocks of the group being rerun (full) or the attention
   * probabilities (selective). It grows to the largest acts; rc_gen counts
   * its moves, so acts know to re-point.
   * rc_holder's group starting at block rc_held (full), or its block
   * rc_held's probabilities (selective), are what it holds now. */
  void *rc_buf;
  size_t rc_bytes;
  unsigned rc_gen;
  const struct mega_gpt_acts *rc_holder;
  int rc_held;
};

static inline bool gpt_llama(const mega_gpt_stage *s) {
  return s->cfg.arch == MEGA_GPT_ARCH_LLAMA;
}

/* The parameter at off (NULL when the stage has none: a bias under
 * no_bias), and its gradient. */
static inline const float *gpt_p(const mega_gpt_stage *s, size_t off) {
  return off == GPT_NO_OFF ? NULL : s->param + off;
}
static inline float *gpt_g(const mega_gpt_stage *s, size_t off) {
  return off == GPT_NO_OFF ? NULL : s->grad + off;
}

/* Calls the stage's params-needed callback for unit u, if any. */
static inline void gpt_unit_needed(mega_gpt_stage *s, int u) {
  if (s->params_needed)
    s->params_needed(s->params_needed_arg, s->units[u].first, s->units[u].count);
}

/* Calls the stage's grads-done callback for unit u, if any. */
static inline void gpt_unit_done(mega_gpt_stage *s, int u) {
  if (s->grads_done) s->grads_done(s->grads_done_arg, s->units[u].first, s->units[u].count);
}

#endif
