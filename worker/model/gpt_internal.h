/* Shared between gpt.c (stage, params), gpt_acts.c (the activations'
 * layout) and gpt_pass.c (forward, backward), the last two through
 * gpt_acts.h; not a public header. */
#ifndef MEGA_WORKER_GPT_INTERNAL_H
#define MEGA_WORKER_GPT_INTERNAL_H

#include "worker/model/gpt.h"

/* Float offsets of one block's tensors in the flat buffers. */
typedef struct gpt_layer_off {
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
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
