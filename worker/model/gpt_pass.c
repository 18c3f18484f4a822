/* The forward and split backward passes of a stage over one microbatch's
 * activations (see gpt.h; the activations' shapes are in gpt_acts.h), for
 * GPT-2 and Llama, tensor-parallel when the stage is (the TP group's
 * exchanges around the linears, and dropout, are in gpt_tp.c), recomputing
 * when it does. */
#include "worker/model/gpt_tp.h"

#define LAYER_UNITS 6 /* a block's units (gpt.h) */

static mega_status copy_ids(mega_gpt_acts *a, int32_t *dst, const int32_t *src,
                            const char *what, mega_err *err) {
  int V = a->s->cfg.vocab_size, n = a->B * a->T;
  for (int i = 0; i < n; i++)
    if (src[i] < 0 || src[i] >= V)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "gpt: %s[%d][%d] = %d is outside the vocabulary [0, %d)", what,
                       i / a->T, i % a->T, (int)src[i], V);
  mega_backend *be = a->s->be;
  return be->ops->memcpy(be, dst, src, (size_t)n * sizeof *dst, MEGA_COPY_H2D, err);
}

/* Checks that exactly the pointers the stage's role needs are given. */
static mega_status need(mega_err *err, const char *fn, const char *what, bool want,
                        const void *p) {
  if (want && !p)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: %s on this stage needs %s", fn, what);
  if (!want && p)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: %s on this stage takes no %s (pass NULL)", fn, what);
  return MEGA_OK;
}

/* ---- norms: GPT-2's layernorm or Llama's RMSNorm (no mean, no bias) ---- */

static void norm_forward(mega_gpt_stage *s, float *out, float *mean, float *rstd,
                         const float *x, size_t w, size_t b, int rows) {
  const mega_backend_ops *o = s->be->ops;
  int C = s->cfg.channels;
  if (gpt_llama(s))
    o->rmsnorm_forward(s->be, out, rstd, x, s->param + w, rows, C, s->cfg.ln_eps);
  else
    o->layernorm_forward(s->be, out, mean, rstd, x, s->param + w, s->param + b, rows, C,
                         s->cfg.ln_eps);
}

static void norm_backward_input(mega_gpt_stage *s, float *dinp, const float *dres,
                                const float *dout, const float *x, size_t w, const float *mean,
                                const float *rstd, int rows) {
  const mega_backend_ops *o = s->be->ops;
  int C = s->cfg.channels;
  if (gpt_llama(s))
    o->rmsnorm_backward_input(s->be, dinp, dres, dout, x, s->param + w, rstd, rows, C);
  else
    o->layernorm_backward_input(s->be, dinp, dres, dout, x, s->param + w, mean, rstd, rows, C);
}

static void norm_backward_weight(mega_gpt_stage *s, size_t w, size_t b, const float *dout,
                                 const float *x, const float *mean, const float *rstd,
                                 int rows) {
  const mega_backend_ops *o = s->be->ops;
  int C = s->cfg.channels;
  if (gpt_llama(s))
    o->rmsnorm_backward_weight(s->be, s->grad + w, dout, x, rstd, rows, C);
  else
    o->layernorm_backward_weight(s->be, s->grad + w, s->grad + b, dout, x, mean, rstd, rows, C);
}

/* A norm over this rank's rows of the stream, its output made whole. */
static mega_status norm_whole(mega_gpt_stage *s, mega_gpt_acts *a, float *whole, float *mean,
                              float *rstd, const float *x, size_t w, size_t b, mega_err *err) {
  norm_forward(s, gpt_my_rows(s, a, whole), mean, rstd, x, w, b, a->R);
  return gpt_gather_rows(s, a, whole, err);
}

/* Whether the stage's recomputation scratch holds a's group or block k. */
static bool holds(const mega_gpt_stage *s, const mega_gpt_acts *a, int k) {
  return s->rc_holder == a && s->rc_held == k;
}

static void hold(mega_gpt_stage *s, const mega_gpt_acts *a, int k) {
  s->rc_holder = a;
  s->rc_held = k;
}

/* The attention's input projections of block l: GPT-2's fused c_attn, or
 * Llama's q, k and v, then RoPE on q and k. */
static void qkv_forward(mega_gpt_stage *s, mega_gpt_acts *a, int l) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  gpt_widths wd = gpt_local_widths(s);
  int N = a->B * a->T, C = s->cfg.channels;
  if (!gpt_llama(s)) {
    o->matmul_forward(be, la->qkv, la->ln1, s->param + w->qkvw, gpt_p(s, w->qkvb), NULL, N, C,
                      3 * wd.Ql, s->lay);
    return;
  }
  float *q, *k, *v;
  gpt_qkv(s, N, la->qkv, &q, &k, &v);
  o->matmul_forward(be, q, la->ln1, s->param + w->qw, gpt_p(s, w->qb), NULL, N, C, wd.Ql, s->lay);
  o->matmul_forward(be, k, la->ln1, s->param + w->kw, gpt_p(s, w->kb), NULL, N, C, wd.KVl,
                    s->lay);
  o->matmul_forward(be, v, la->ln1, s->param + w->vw, gpt_p(s, w->vb), NULL, N, C, wd.KVl,
                    s->lay);
  int rot = mega_gpt_rot_dim(&s->cfg);
  o->rope_forward(be, q, s->rope_cs, a->B, a->T, wd.NHl, wd.hd, wd.Ql, rot);
  o->rope_forward(be, k, s->rope_cs, a->B, a->T, wd.Gl, wd.hd, wd.KVl, rot);
}

/* The attention core of block l: its output into out, its probabilities
 * into la->att (undropped: the backend drops what multiplies v). */
static void attention(mega_gpt_stage *s, mega_gpt_acts *a, int l, float *out) {
  layer_acts *la = &a->layers[l];
  float *q, *k, *v;
  gpt_qkv(s, a->B * a->T, la->qkv, &q, &k, &v);
  mega_attn_dims d = gpt_acts_attn_dims(s, a, l);
  s->be->ops->attention_forward(s->be, out, la->att, a->att_scratch, q, k, v, &d);
}

/* Whether GPT-2's c_fc and GELU run as the backend's one fused op (has):
 * the tanh form only, and not under --no-bias-gelu-fusion. */
static bool gelu_fused(const mega_gpt_stage *s, bool has) {
  return has && !s->cfg.gelu_erf && !s->desc.no_gelu_fusion;
}

/* The MLP's input projections and activation: GPT-2's c_fc and GELU (the
 * tanh form, fused with c_fc where the backend can; or the exact erf form,
 * never fused: cuBLASLt's epilogue is tanh's), or Llama's gate and up and
 * SwiGLU. */
static void mlp_in_forward(mega_gpt_stage *s, mega_gpt_acts *a, int l) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  int N = a->B * a->T, C = s->cfg.channels, Fl = gpt_local_widths(s).Fl;
  if (!gpt_llama(s)) {
    if (gelu_fused(s, o->matmul_gelu_forward != NULL)) {
      o->matmul_gelu_forward(be, la->fch_gelu, la->fch, la->ln2, s->param + w->fcw,
                             gpt_p(s, w->fcb), N, C, Fl, s->lay);
      return;
    }
    o->matmul_forward(be, la->fch, la->ln2, s->param + w->fcw, gpt_p(s, w->fcb), NULL, N, C,
                      Fl, s->lay);
    (s->cfg.gelu_erf ? o->gelu_erf_forward : o->gelu_forward)(be, la->fch_gelu, la->fch,
                                                                (size_t)N * Fl);
    return;
  }
  o->matmul_forward(be, la->fch, la->ln2, s->param + w->fcw, gpt_p(s, w->fcb), NULL, N, C, Fl,
                    s->lay);
  o->matmul_forward(be, la->fcu, la->ln2, s->param + w->upw, gpt_p(s, w->upb), NULL, N, C, Fl,
                    s->lay);
  o->swiglu_forward(be, la->fch_gelu, la->fch, la->fcu, (size_t)N * Fl);
}

static mega_status block_forward(mega_gpt_stage *s, mega_gpt_acts *a, int l, const float *x,
                                 float *y, mega_err *err) {
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  gpt_widths wd = gpt_local_widths(s);
  mega_status st = norm_whole(s, a, la->ln1, la->ln1_mean, la->ln1_rstd, x, w->ln1w, w->ln1b,
                              err);
  if (st) return st;
  qkv_forward(s, a, l);
  attention(s, a, l, la->atty);
  if ((st = gpt_row_parallel_forward(s, a, la->x2, la->atty, s->param + w->projw,
                                     gpt_p(s, w->projb), x, wd.Ql, l, MEGA_DROP_ATTENTION,
                                     err)) ||
      (st = norm_whole(s, a, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, w->ln2w, w->ln2b,
                       err)))
    return st;
  mlp_in_forward(s, a, l);
  return gpt_row_parallel_forward(s, a, y, la->fch_gelu, s->param + w->fcprojw,
                                  gpt_p(s, w->fcprojb), la->x2, wd.Fl, l, MEGA_DROP_MLP, err);
}

/* resid[0] = dropout(wte[tokens] + wpe): with a vocabulary slice, rows of
 * other ranks' ids are zero here and the sum over the group fills them (wpe
 * added by rank 0 alone, so once); dropout on this rank's rows after. */
static mega_status embedding_forward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_gpt_tp *tp = &s->desc.tp;
  int Vl = s->cfg.vocab_size / tp->size;
  const float *wpe = tp->rank == 0 ? gpt_p(s, s->wpe) : NULL;
  s->be->ops->encoder_forward(s->be, gpt_partial_for(s, a, a->resid[0]), a->tokens,
                              s->param + s->wte, tp->rank * Vl, Vl, wpe, a->B, a->T,
                              s->cfg.channels);
  mega_status st = gpt_reduce_rows(s, a, a->resid[0], err);
  if (st == MEGA_OK && gpt_drop_on(s, a)) {
    mega_dropout d = gpt_drop_of(s, a, -1, MEGA_DROP_EMBEDDING, gpt_stream_row0(s, a));
    s->be->ops->bias_dropout_add(s->be, a->resid[0], NULL, a->resid[0], NULL, a->R,
                                 s->cfg.channels, &d);
  }
  return st;
}

/* The loss, in place: the logits become the probabilities, which the
 * backward turns into dlogits (it is given loss_scale), or, with the scale
 * set before (fused_scale), dlogits in the same pass. Vocabulary-parallel:
 * the row max, then the sums of exp and the target's logit, each reduced
 * over the group; never the whole logits. */
static mega_status loss_forward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_backend_ops *o = s->be->ops;
  const mega_gpt_tp *tp = &s->desc.tp;
  int N = a->B * a->T, Vl = s->cfg.vocab_size / tp->size;
  float g = a->grad_scale = a->fused_scale;
  if (!gpt_tp_on(s)) {
    if (g != 0.0f)
      o->crossentropy_forward_grad(s->be, a->losses, a->logits, a->targets, g, N, Vl);
    else
      o->crossentropy_forward(s->be, a->losses, a->logits, a->targets, N, Vl);
    return MEGA_OK;
  }
  o->crossentropy_rowmax(s->be, a->rowmax, a->logits, N, Vl);
  mega_status st = tp->ops->all_reduce_max(tp->ctx, a->rowmax, (size_t)N, err);
  if (st) return st;
  o->crossentropy_sums(s->be, a->ce_sums, a->logits, a->rowmax, a->targets, tp->rank * Vl, N,
                       Vl);
  if ((st = tp->ops->all_reduce(tp->ctx, a->ce_sums, 2 * (size_t)N, err))) return st;
  if (g != 0.0f)
    o->crossentropy_finish_grad(s->be, a->losses, a->logits, a->rowmax, a->ce_sums, a->targets,
                                tp->rank * Vl, g, N, Vl);
  else
    o->crossentropy_finish(s->be, a->losses, a->logits, a->rowmax, a->ce_sums, N, Vl);
  return MEGA_OK;
}

mega_status mega_gpt_forward(mega_gpt_stage *s, mega_gpt_acts *a, const int32_t *tokens,
                             const float *input, const int32_t *targets, float *output,
                             double *loss_sum, mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int N = a->B * a->T, C = s->cfg.channels, Vl = s->cfg.vocab_size / d->tp.size;
  int L = d->num_layers;
  size_t RC = (size_t)a->R * C;
  mega_status st;
  if (a->s != s)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: activations belong to another stage");
  if ((st = need(err, "forward", "tokens", d->embedding, tokens)) ||
      (st = need(err, "forward", "an input", !d->embedding, input)) ||
      (st = need(err, "forward", "an output", !d->loss, output)))
    return st;
  if (!d->loss && targets)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: forward on a non-loss stage takes no targets");
  if (targets && !loss_sum)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: forward with targets needs loss_sum");
  a->state = ST_EMPTY;
  a->fwd_sample = a->next_sample;
  gpt_acts_bind(a);
  int u = s->nunits; /* units in forward order: from the last */
  if (d->embedding) {
    if ((st = copy_ids(a, a->tokens, tokens, "tokens", err))) return st;
    gpt_unit_needed(s, --u);
    if ((st = embedding_forward(s, a, err))) return st;
  } else if ((st = o->memcpy(be, a->resid[0], input, RC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = 0; l < L; l++) {
    float *y = (l == L - 1 && !d->loss) ? output : a->resid[l + 1];
    for (int k = 0; k < LAYER_UNITS; k++) gpt_unit_needed(s, --u);
    if ((st = block_forward(s, a, l, a->resid[l], y, err))) return st;
    int first, end;
    if (gpt_rc_group(s, l, &first, &end)) hold(s, a, first);
    if (d->recompute == MEGA_GPT_RECOMPUTE_SELECTIVE) hold(s, a, l);
  }
  if (!d->loss) {
    a->state = ST_FORWARD;
    if (L == 0)
      return o->memcpy(be, output, a->resid[0], RC * sizeof(float), MEGA_COPY_D2D, err);
    return MEGA_OK;
  }
  while (u > 0) gpt_unit_needed(s, --u); /* ln_f, and the head copy */
  if ((st = norm_whole(s, a, a->lnf, a->lnf_mean, a->lnf_rstd, a->resid[L], s->lnfw, s->lnfb,
                       err)))
    return st;
  o->matmul_forward(be, a->logits, a->lnf, s->param + s->head, NULL, NULL, N, C, Vl,
                    MEGA_W_OUT_IN);
  a->have_targets = targets != NULL;
  if (targets) {
    if ((st = copy_ids(a, a->targets, targets, "targets", err)) ||
        (st = loss_forward(s, a, err)) ||
        (st = o->sum(be, a->losses, (size_t)N, loss_sum, err)))
      return st;
  }
  a->state = ST_FORWARD;
  return MEGA_OK;
}

/* dresid[l] = d(block l input), from dresid[l+1]; keeps what the weight half
 * needs in la. */
static mega_status block_backward_input(mega_gpt_stage *s, mega_gpt_acts *a, int l,
                                        mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  gpt_widths wd = gpt_local_widths(s);
  int B = a->B, T = a->T, N = B * T, R = a->R, C = s->cfg.channels;
  bool llama = gpt_llama(s);
  const float *dy = a->dresid[l + 1];
  const float *x = a->resid[l];
  mega_status st = gpt_out_grad(s, a, dy, la->dy_all, l, MEGA_DROP_MLP, err);
  if (st) return st;
  /* the MLP: d(activation), then through GELU or SwiGLU (in place) */
  if (!llama && gelu_fused(s, o->matmul_gelu_backward_input != NULL)) {
    o->matmul_gelu_backward_input(be, la->dfch, la->dy_all, s->param + w->fcprojw, la->fch, N,
                                  wd.Fl, C, s->lay);
  } else {
    o->matmul_backward_input(be, la->dfch, la->dy_all, s->param + w->fcprojw, N, wd.Fl, C,
                             s->lay, false);
    if (llama)
      o->swiglu_backward(be, la->dfch, la->dfcu, la->dfch, la->fch, la->fcu,
                         (size_t)N * wd.Fl);
    else
      (s->cfg.gelu_erf ? o->gelu_erf_backward : o->gelu_backward)(be, la->dfch, la->fch,
                                                                  la->dfch, (size_t)N * wd.Fl);
  }
  gpt_col_grad mlp[2] = {{la->dfch, w->fcw, wd.Fl}, {la->dfcu, w->upw, wd.Fl}};
  if ((st = gpt_column_parallel_backward(s, a, la->dln2, mlp, llama ? 2 : 1, err))) return st;
  norm_backward_input(s, la->dx2, dy, la->dln2, la->x2, w->ln2w, la->ln2_mean, la->ln2_rstd, R);
  if ((st = gpt_out_grad(s, a, la->dx2, la->dx2_all, l, MEGA_DROP_ATTENTION, err))) return st;
  if (s->desc.recompute == MEGA_GPT_RECOMPUTE_SELECTIVE && !holds(s, a, l)) {
    /* selective recomputation: the probabilities, from the kept q, k and v
     * (the output, which datty's GEMM overwrites next, is not needed) */
    attention(s, a, l, a->datty);
    hold(s, a, l);
  }
  o->matmul_backward_input(be, a->datty, la->dx2_all, s->param + w->projw, N, wd.Ql, C, s->lay,
                           false);
  float *q, *k, *v, *dq, *dk, *dv;
  gpt_qkv(s, N, la->qkv, &q, &k, &v);
  gpt_qkv(s, N, la->dqkv, &dq, &dk, &dv);
  mega_attn_dims ad = gpt_acts_attn_dims(s, a, l);
  o->attention_backward(be, dq, dk, dv, a->att_scratch, a->datty, q, k, v, la->att, &ad);
  if (llama) { /* q and k were rotated after their projections */
    int rot = mega_gpt_rot_dim(&s->cfg);
    o->rope_backward(be, dq, s->rope_cs, B, T, wd.NHl, wd.hd, wd.Ql, rot);
    o->rope_backward(be, dk, s->rope_cs, B, T, wd.Gl, wd.hd, wd.KVl, rot);
  }
  gpt_col_grad fused[1] = {{la->dqkv, w->qkvw, 3 * wd.Ql}};
  gpt_col_grad sep[3] = {{dq, w->qw, wd.Ql}, {dk, w->kw, wd.KVl}, {dv, w->vw, wd.KVl}};
  if ((st = gpt_column_parallel_backward(s, a, la->dln1, llama ? sep : fused, llama ? 3 : 1,
                                         err)))
    return st;
  norm_backward_input(s, a->dresid[l], la->dx2, la->dln1, x, w->ln1w, la->ln1_mean, la->ln1_rstd,
                      R);
  return MEGA_OK;
}

/* Full recomputation: before block l's backward, reruns its group's forward
 * from the kept input into the scratch set, unless the scratch holds that
 * group already (the last group forward ran, or the one backward_input left).
 * The group's output goes to the sink: the kept one is the next group's
 * input. Asks for no parameters: forward already had them. With TP every
 * rank of the stage reruns the same groups, so the collectives match. */
static mega_status rematerialize(mega_gpt_stage *s, mega_gpt_acts *a, int l, mega_err *err) {
  int first, end;
  if (!gpt_rc_group(s, l, &first, &end) || holds(s, a, first)) return MEGA_OK;
  s->rc_holder = NULL; /* until the whole group is back */
  for (int k = first; k < end; k++) {
    mega_status st =
        block_forward(s, a, k, a->resid[k], k + 1 < end ? a->resid[k + 1] : a->sink, err);
    if (st) return st;
  }
  hold(s, a, first);
  return MEGA_OK;
}

static mega_status backward_check(mega_gpt_stage *s, mega_gpt_acts *a, const float *doutput,
                                  const float *dinput, mega_err *err) {
  const mega_gpt_stage_desc *d = &s->desc;
  mega_status st;
  if (a->s != s)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: activations belong to another stage");
  if (a->state != ST_FORWARD)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: backward_input needs a forward first (once per forward)");
  if ((st = need(err, "backward_input", "doutput", !d->loss, doutput)) ||
      (st = need(err, "backward_input", "dinput", !d->embedding, dinput)))
    return st;
  if (d->loss && !a->have_targets)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: backward needs a forward that was given targets");
  gpt_acts_bind(a);
  return MEGA_OK;
}

/* The loss stage's input half: dresid[L] from the targets. */
static mega_status loss_backward_input(mega_gpt_stage *s, mega_gpt_acts *a, float loss_scale,
                                       mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_tp *tp = &s->desc.tp;
  int C = s->cfg.channels, Vl = s->cfg.vocab_size / tp->size, N = a->B * a->T;
  int L = s->desc.num_layers;
  if (a->grad_scale == 0.0f)
    o->crossentropy_backward(be, a->dlogits, a->targets, tp->rank * Vl, loss_scale, N, Vl);
  else if (a->grad_scale != loss_scale)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: the backward's loss_scale %.9g is not the %.9g its forward wrote "
                     "dlogits with; give mega_gpt_acts_set_loss_scale the backward's scale, "
                     "or 0",
                     (double)loss_scale, (double)a->grad_scale);
  o->matmul_backward_input(be, gpt_partial_for(s, a, a->dlnf), a->dlogits, s->param + s->head,
                           N, C, Vl, MEGA_W_OUT_IN, false);
  mega_status st = gpt_reduce_rows(s, a, a->dlnf, err);
  if (st) return st;
  norm_backward_input(s, a->dresid[L], NULL, a->dlnf, a->resid[L], s->lnfw, a->lnf_mean,
                      a->lnf_rstd, a->R);
  return MEGA_OK;
}

/* The loss stage's weight half: the head (a unit of its own when untied
 * or on a loss-only stage; a tied head on a stage with the embedding is
 * wte, complete only after the embedding's backward), then the final norm. */
static void loss_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, int *u) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  int C = s->cfg.channels, Vl = s->cfg.vocab_size / s->desc.tp.size, N = a->B * a->T;
  int L = s->desc.num_layers;
  o->matmul_backward_weight(be, s->grad + s->head, NULL, a->dlogits, a->lnf, N, C, Vl,
                            MEGA_W_OUT_IN);
  if (s->head != s->wte) gpt_unit_done(s, (*u)++);
  norm_backward_weight(s, s->lnfw, s->lnfb, a->dlnf, a->resid[L], a->lnf_mean, a->lnf_rstd,
                       a->R);
  gpt_unit_done(s, (*u)++);
}

/* The embedding's gradients, from the whole dresid[0] (times the dropout
 * mask, in place: nothing else reads it on the embedding stage; gathered
 * with sequence parallelism; every rank then has all of wpe's). */
static mega_status embedding_backward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_gpt_tp *tp = &s->desc.tp;
  int Vl = s->cfg.vocab_size / tp->size;
  if (gpt_drop_on(s, a)) {
    mega_dropout d = gpt_drop_of(s, a, -1, MEGA_DROP_EMBEDDING, gpt_stream_row0(s, a));
    s->be->ops->bias_dropout_add(s->be, a->dresid[0], NULL, a->dresid[0], NULL, a->R,
                                 s->cfg.channels, &d);
  }
  float *dall = gpt_sp_on(s) ? a->partial : a->dresid[0];
  mega_status st = gpt_gather_into(s, a, a->dresid[0], dall, err);
  if (st) return st;
  s->be->ops->encoder_backward(s->be, s->grad + s->wte, tp->rank * Vl, Vl, gpt_g(s, s->wpe),
                               dall, a->tokens, a->B, a->T, s->cfg.channels);
  return MEGA_OK;
}

mega_status mega_gpt_backward_input(mega_gpt_stage *s, mega_gpt_acts *a,
                                    const float *doutput, float loss_scale, float *dinput,
                                    mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int L = d->num_layers;
  size_t RC = (size_t)a->R * s->cfg.channels;
  mega_status st = backward_check(s, a, doutput, dinput, err);
  if (st) return st;
  int first, end;
  if (!d->split_backward && L > 0 && gpt_rc_group(s, 0, &first, &end))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: backward_input on a stage whose recomputed blocks keep their output "
                     "gradients only through mega_gpt_backward; create the stage with "
                     "split_backward to run the halves apart");
  if (d->loss) {
    if ((st = loss_backward_input(s, a, loss_scale, err))) return st;
  } else if ((st = o->memcpy(be, a->dresid[L], doutput, RC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = L - 1; l >= 0; l--)
    if ((st = rematerialize(s, a, l, err)) || (st = block_backward_input(s, a, l, err)))
      return st;
  if (!d->embedding &&
      (st = o->memcpy(be, dinput, a->dresid[0], RC * sizeof(float), MEGA_COPY_D2D, err)))
    return st;
  a->state = ST_BACKWARD_INPUT;
  return MEGA_OK;
}

/* Block l's weight gradients, one unit after another (gpt.h's order), each
 * reported as it is complete; *u is the next unit's index. */
static void block_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, int l, int *u) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  gpt_widths wd = gpt_local_widths(s);
  int N = a->B * a->T, R = a->R, C = s->cfg.channels;
  mega_wlayout lay = s->lay;
  float *G = s->grad;
  o->matmul_backward_weight(be, G + w->fcprojw, gpt_g(s, w->fcprojb), la->dy_all, la->fch_gelu,
                            N, wd.Fl, C, lay);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->fcw, gpt_g(s, w->fcb), la->dfch, la->ln2, N, C, wd.Fl,
                            lay);
  if (gpt_llama(s))
    o->matmul_backward_weight(be, G + w->upw, gpt_g(s, w->upb), la->dfcu, la->ln2, N, C, wd.Fl,
                              lay);
  gpt_unit_done(s, (*u)++);
  norm_backward_weight(s, w->ln2w, w->ln2b, la->dln2, la->x2, la->ln2_mean, la->ln2_rstd, R);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->projw, gpt_g(s, w->projb), la->dx2_all, la->atty, N,
                            wd.Ql, C, lay);
  gpt_unit_done(s, (*u)++);
  if (gpt_llama(s)) {
    float *dq, *dk, *dv;
    gpt_qkv(s, N, la->dqkv, &dq, &dk, &dv);
    o->matmul_backward_weight(be, G + w->qw, gpt_g(s, w->qb), dq, la->ln1, N, C, wd.Ql, lay);
    o->matmul_backward_weight(be, G + w->kw, gpt_g(s, w->kb), dk, la->ln1, N, C, wd.KVl, lay);
    o->matmul_backward_weight(be, G + w->vw, gpt_g(s, w->vb), dv, la->ln1, N, C, wd.KVl, lay);
  } else {
    o->matmul_backward_weight(be, G + w->qkvw, gpt_g(s, w->qkvb), la->dqkv, la->ln1, N, C,
                              3 * wd.Ql, lay);
  }
  gpt_unit_done(s, (*u)++);
  norm_backward_weight(s, w->ln1w, w->ln1b, la->dln1, a->resid[l], la->ln1_mean, la->ln1_rstd,
                       R);
  gpt_unit_done(s, (*u)++);
}

mega_status mega_gpt_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_gpt_stage_desc *d = &s->desc;
  int L = d->num_layers;
  if (a->s != s)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: activations belong to another stage");
  if (a->state != ST_BACKWARD_INPUT)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: backward_weight needs backward_input first (once per forward)");
  gpt_acts_bind(a);
  int u = 0;
  if (d->loss) loss_backward_weight(s, a, &u);
  for (int l = L - 1; l >= 0; l--) {
    /* zero-bubble: another backward_input may have used the scratch since */
    mega_status st = rematerialize(s, a, l, err);
    if (st) return st;
    block_backward_weight(s, a, l, &u);
  }
  if (d->embedding) {
    mega_status st = embedding_backward(s, a, err);
    if (st) return st;
    gpt_unit_done(s, u++);
  }
  a->state = ST_EMPTY;
  return MEGA_OK;
}

mega_status mega_gpt_backward(mega_gpt_stage *s, mega_gpt_acts *a, const float *doutput,
                              float loss_scale, float *dinput, mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int L = d->num_layers;
  size_t RC = (size_t)a->R * s->cfg.channels;
  mega_status st = backward_check(s, a, doutput, dinput, err);
  if (st) return st;
  int u = 0;
  if (d->loss) {
    if ((st = loss_backward_input(s, a, loss_scale, err))) return st;
    loss_backward_weight(s, a, &u);
  } else if ((st = o->memcpy(be, a->dresid[L], doutput, RC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = L - 1; l >= 0; l--) {
    if ((st = rematerialize(s, a, l, err)) || (st = block_backward_input(s, a, l, err)))
      return st;
    block_backward_weight(s, a, l, &u);
  }
  if (!d->embedding &&
      (st = o->memcpy(be, dinput, a->dresid[0], RC * sizeof(float), MEGA_COPY_D2D, err)))
    return st;
  if (d->embedding) {
    if ((st = embedding_backward(s, a, err))) return st;
    gpt_unit_done(s, u++);
  }
  a->state = ST_EMPTY;
  return MEGA_OK;
}
