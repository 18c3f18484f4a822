/* GPT activations of one microbatch, and the forward and split backward
 * passes of a stage (see gpt.h). */
#include <stdlib.h>
#include <string.h>

#include "worker/model/gpt_internal.h"

#define LAYER_UNITS 6 /* a block's units (gpt.h) */

/* One block's saved activations and (after backward_input) the output
 * gradients its weight half needs. */
typedef struct layer_acts {
  float *ln1, *ln1_mean, *ln1_rstd; /* [BT,C], [BT], [BT] */
  float *qkv;                       /* [BT,3C] */
  float *atty;                      /* [BT,C] attention output */
  float *att;                       /* [B,NH,T,T] probabilities */
  float *x2;                        /* [BT,C] residual after attention */
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch, *fch_gelu; /* [BT,4C] */
  /* gradients */
  float *dx2;  /* [BT,C] d(x2): attn.c_proj's output gradient */
  float *dfch; /* [BT,4C] d(fch): c_fc's output gradient */
  float *dln2; /* [BT,C] */
  float *dqkv; /* [BT,3C] */
  float *dln1; /* [BT,C] */
} layer_acts;

typedef enum { ST_EMPTY, ST_FORWARD, ST_BACKWARD_INPUT } acts_state;

struct mega_gpt_acts {
  mega_gpt_stage *s;
  int B, T;
  size_t bytes;
  void *block; /* the one backend allocation everything below points into */
  acts_state state;
  bool have_targets;
  int32_t *tokens, *targets; /* [BT] */
  /* resid[l]: input of local block l; resid[L] is the loss stage's ln_f
   * input. dresid[l] is its gradient. */
  float **resid, **dresid;
  /* Blocks that full recomputation reruns point into the stage's scratch
   * (one set for the group being rerun), and with selective recomputation
   * every block's att does; gen is the scratch's rc_gen they point into. */
  layer_acts *layers;
  unsigned gen;
  float *sink; /* [BT,C] scratch: where a rerun group's output goes (the real one is kept) */
  float *lnf, *lnf_mean, *lnf_rstd; /* loss stage */
  float *logits, *probs, *losses;   /* [BT,V], [BT,V], [BT] */
  float *dlogits, *dlnf;            /* [BT,V], [BT,C] */
  float *datty;                     /* [BT,C] scratch: attention output grad */
  float *att_scratch;               /* B*NH*T*T + B*T*C floats */
};

typedef struct carver {
  char *base;
  size_t off;
} carver;

/* Lays buffers out in one allocation: a first pass with base NULL sizes it. */
static void *carve(carver *c, size_t floats) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += (floats * sizeof(float) + 63) / 64 * 64;
  return p;
}

/* Full recomputation's groups: block l is rerun with the blocks
 * [*first, *end), from the input of *first, or false when l keeps its
 * activations. Megatron's methods: uniform cuts the chunk into groups of N
 * from its first block; block reruns each of the first N blocks alone. */
static bool rc_group(const mega_gpt_stage *s, int l, int *first, int *end) {
  int L = s->desc.num_layers, N = s->desc.recompute_layers;
  if (s->desc.recompute == MEGA_GPT_RECOMPUTE_UNIFORM) {
    *first = l / N * N;
    *end = *first + N < L ? *first + N : L;
    return true;
  }
  if (s->desc.recompute == MEGA_GPT_RECOMPUTE_BLOCK && l < N) {
    *first = l;
    *end = l + 1;
    return true;
  }
  return false;
}

/* A block's forward activations; att: carve none, use this shared one. */
static void carve_forward(carver *cv, layer_acts *la, size_t BT, size_t C, size_t TT,
                          bool shared_att, float *att) {
  la->ln1 = carve(cv, BT * C);
  la->ln1_mean = carve(cv, BT);
  la->ln1_rstd = carve(cv, BT);
  la->qkv = carve(cv, BT * 3 * C);
  la->atty = carve(cv, BT * C);
  la->att = shared_att ? att : carve(cv, TT);
  la->x2 = carve(cv, BT * C);
  la->ln2 = carve(cv, BT * C);
  la->ln2_mean = carve(cv, BT);
  la->ln2_rstd = carve(cv, BT);
  la->fch = carve(cv, BT * 4 * C);
  la->fch_gelu = carve(cv, BT * 4 * C);
}

/* Carves the acts' own buffers from cv and the ones in the stage's
 * recomputation scratch from sc. */
static void layout(mega_gpt_acts *a, carver *cv, carver *sc) {
  const mega_gpt_stage *s = a->s;
  const mega_gpt_config *c = &s->cfg;
  size_t BT = (size_t)a->B * a->T, C = c->channels, V = c->vocab_size;
  size_t TT = (size_t)a->B * c->num_heads * a->T * a->T;
  int L = s->desc.num_layers, first, end;
  a->tokens = carve(cv, BT); /* int32 and float have the same size */
  a->targets = carve(cv, BT);
  /* The scratch set of full recomputation: the largest group's blocks and
   * their inputs but the first (which is kept). */
  int G = 0;
  for (int l = 0; l < L; l++)
    if (rc_group(s, l, &first, &end) && end - first > G) G = end - first;
  layer_acts scratch[G > 0 ? G : 1];
  float *scratch_in[G > 0 ? G : 1];
  for (int g = 0; g < G; g++) {
    carve_forward(sc, &scratch[g], BT, C, TT, false, NULL);
    scratch_in[g] = g > 0 ? carve(sc, BT * C) : NULL;
  }
  a->sink = G > 0 ? carve(sc, BT * C) : NULL;
  bool selective = s->desc.recompute == MEGA_GPT_RECOMPUTE_SELECTIVE && L > 0;
  float *att = selective ? carve(sc, TT) : NULL;
  for (int l = 0; l <= L; l++) {
    bool rerun = l < L && rc_group(s, l, &first, &end);
    if (rerun && l > first)
      a->resid[l] = scratch_in[l - first];
    else /* A non-loss stage writes its last block's output to the caller. */
      a->resid[l] = (l < L || L == 0 || s->desc.loss) ? carve(cv, BT * C) : NULL;
    a->dresid[l] = carve(cv, BT * C);
  }
  for (int l = 0; l < L; l++) {
    layer_acts *la = &a->layers[l];
    if (rc_group(s, l, &first, &end))
      *la = scratch[l - first];
    else
      carve_forward(cv, la, BT, C, TT, selective, att);
    la->dx2 = carve(cv, BT * C);
    la->dfch = carve(cv, BT * 4 * C);
    la->dln2 = carve(cv, BT * C);
    la->dqkv = carve(cv, BT * 3 * C);
    la->dln1 = carve(cv, BT * C);
  }
  if (L > 0) {
    a->datty = carve(cv, BT * C);
    a->att_scratch = carve(cv, TT + BT * C);
  }
  if (s->desc.loss) {
    a->lnf = carve(cv, BT * C);
    a->lnf_mean = carve(cv, BT);
    a->lnf_rstd = carve(cv, BT);
    a->logits = carve(cv, BT * V);
    a->probs = carve(cv, BT * V);
    a->losses = carve(cv, BT);
    a->dlogits = carve(cv, BT * V);
    a->dlnf = carve(cv, BT * C);
  }
}

mega_status mega_gpt_acts_create(mega_gpt_stage *s, int B, int T, mega_gpt_acts **out,
                                 mega_err *err) {
  if (B < 1 || T < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: microbatch size and sequence length must be >= 1 (got B=%d, T=%d)",
                     B, T);
  if (T > s->cfg.max_seq_len)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: sequence length %d exceeds max_seq_len %d; raise "
                     "--max-position-embeddings or shorten the sequences",
                     T, s->cfg.max_seq_len);
  if ((int64_t)B * T > (1 << 24) ||
      (int64_t)B * s->cfg.num_heads * T * (int64_t)T > ((int64_t)1 << 40))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: microbatch B=%d T=%d is too large", B, T);
  int L = s->desc.num_layers;
  mega_gpt_acts *a = calloc(1, sizeof *a);
  if (a) {
    a->resid = calloc((size_t)L + 1, sizeof *a->resid);
    a->dresid = calloc((size_t)L + 1, sizeof *a->dresid);
    a->layers = calloc((size_t)L + 1, sizeof *a->layers);
  }
  if (!a || !a->resid || !a->dresid || !a->layers) {
    mega_gpt_acts_destroy(a);
    return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for activations");
  }
  a->s = s;
  a->B = B;
  a->T = T;
  carver cv = {0}, sc = {0};
  layout(a, &cv, &sc);
  a->bytes = cv.off;
  mega_status st = s->be->ops->alloc(s->be, a->bytes, &a->block, err);
  if (st == MEGA_OK && sc.off > s->rc_bytes) { /* the scratch grows to the largest acts */
    void *p;
    st = s->be->ops->alloc(s->be, sc.off, &p, err);
    if (st == MEGA_OK) {
      if (s->rc_buf) s->be->ops->free(s->be, s->rc_buf);
      s->rc_buf = p;
      s->rc_bytes = sc.off;
      s->rc_gen++; /* every acts re-points before it next uses the scratch */
      s->rc_holder = NULL;
    }
  }
  if (st) {
    mega_err_prefix(err, "gpt: activations for B=%d T=%d", B, T);
    mega_gpt_acts_destroy(a);
    return st;
  }
  cv = (carver){.base = a->block};
  sc = (carver){.base = s->rc_buf};
  layout(a, &cv, &sc);
  a->gen = s->rc_gen;
  *out = a;
  return MEGA_OK;
}

/* Points the acts' recomputed buffers into the stage's scratch again after
 * it moved (a larger acts grew it). */
static void bind(mega_gpt_acts *a) {
  if (a->gen == a->s->rc_gen) return;
  carver cv = {.base = a->block}, sc = {.base = a->s->rc_buf};
  layout(a, &cv, &sc);
  a->gen = a->s->rc_gen;
}

size_t mega_gpt_acts_bytes(const mega_gpt_acts *a) { return a->bytes; }

size_t mega_gpt_scratch_bytes(const mega_gpt_stage *s) { return s->rc_bytes; }

void mega_gpt_acts_dims(const mega_gpt_acts *a, int *B, int *T) {
  *B = a->B;
  *T = a->T;
}

const float *mega_gpt_acts_logits(const mega_gpt_acts *a) { return a->logits; }

void mega_gpt_acts_destroy(mega_gpt_acts *a) {
  if (!a) return;
  if (a->s && a->s->rc_holder == a) a->s->rc_holder = NULL;
  if (a->block) a->s->be->ops->free(a->s->be, a->block);
  free(a->resid);
  free(a->dresid);
  free(a->layers);
  free(a);
}

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

/* Whether the stage's recomputation scratch holds a's group or block k. */
static bool holds(const mega_gpt_stage *s, const mega_gpt_acts *a, int k) {
  return s->rc_holder == a && s->rc_held == k;
}

static void hold(mega_gpt_stage *s, const mega_gpt_acts *a, int k) {
  s->rc_holder = a;
  s->rc_held = k;
}

static void block_forward(mega_gpt_stage *s, mega_gpt_acts *a, int l, const float *x,
                          float *y) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  const float *P = s->param;
  int B = a->B, T = a->T, C = s->cfg.channels, NH = s->cfg.num_heads, N = B * T;
  o->layernorm_forward(be, la->ln1, la->ln1_mean, la->ln1_rstd, x, P + w->ln1w,
                       P + w->ln1b, N, C, s->cfg.ln_eps);
  o->matmul_forward(be, la->qkv, la->ln1, P + w->qkvw, P + w->qkvb, NULL, N, C, 3 * C,
                    MEGA_W_IN_OUT);
  o->attention_forward(be, la->atty, la->att, a->att_scratch, la->qkv, B, T, C, NH);
  o->matmul_forward(be, la->x2, la->atty, P + w->projw, P + w->projb, x, N, C, C,
                    MEGA_W_IN_OUT);
  o->layernorm_forward(be, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, P + w->ln2w,
                       P + w->ln2b, N, C, s->cfg.ln_eps);
  o->matmul_forward(be, la->fch, la->ln2, P + w->fcw, P + w->fcb, NULL, N, C, 4 * C,
                    MEGA_W_IN_OUT);
  o->gelu_forward(be, la->fch_gelu, la->fch, (size_t)N * 4 * C);
  o->matmul_forward(be, y, la->fch_gelu, P + w->fcprojw, P + w->fcprojb, la->x2, N, 4 * C,
                    C, MEGA_W_IN_OUT);
}

mega_status mega_gpt_forward(mega_gpt_stage *s, mega_gpt_acts *a, const int32_t *tokens,
                             const float *input, const int32_t *targets, float *output,
                             double *loss_sum, mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int B = a->B, T = a->T, C = s->cfg.channels, V = s->cfg.vocab_size, N = B * T;
  int L = d->num_layers;
  size_t NC = (size_t)N * C;
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
  bind(a);
  int u = s->nunits; /* units in forward order: from the last */
  if (d->embedding) {
    if ((st = copy_ids(a, a->tokens, tokens, "tokens", err))) return st;
    gpt_unit_needed(s, --u);
    o->encoder_forward(be, a->resid[0], a->tokens, s->param + s->wte, s->param + s->wpe, B,
                       T, C);
  } else if ((st = o->memcpy(be, a->resid[0], input, NC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = 0; l < L; l++) {
    float *y = (l == L - 1 && !d->loss) ? output : a->resid[l + 1];
    for (int k = 0; k < LAYER_UNITS; k++) gpt_unit_needed(s, --u);
    block_forward(s, a, l, a->resid[l], y);
    int first, end;
    if (rc_group(s, l, &first, &end)) hold(s, a, first);
    if (s->desc.recompute == MEGA_GPT_RECOMPUTE_SELECTIVE) hold(s, a, l);
  }
  if (!d->loss) {
    a->state = ST_FORWARD;
    if (L == 0)
      return o->memcpy(be, output, a->resid[0], NC * sizeof(float), MEGA_COPY_D2D, err);
    return MEGA_OK;
  }
  while (u > 0) gpt_unit_needed(s, --u); /* ln_f, and the head copy */
  o->layernorm_forward(be, a->lnf, a->lnf_mean, a->lnf_rstd, a->resid[L],
                       s->param + s->lnfw, s->param + s->lnfb, N, C, s->cfg.ln_eps);
  o->matmul_forward(be, a->logits, a->lnf, s->param + s->head, NULL, NULL, N, C, V,
                    MEGA_W_OUT_IN);
  a->have_targets = targets != NULL;
  if (targets) {
    if ((st = copy_ids(a, a->targets, targets, "targets", err))) return st;
    o->crossentropy_forward(be, a->losses, a->probs, a->logits, a->targets, N, V);
    if ((st = o->sum(be, a->losses, (size_t)N, loss_sum, err))) return st;
  }
  a->state = ST_FORWARD;
  return MEGA_OK;
}

/* dresid[l] = d(block l input), from dresid[l+1]; keeps what the weight half
 * needs in la. */
static void block_backward_input(mega_gpt_stage *s, mega_gpt_acts *a, int l) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  const float *P = s->param;
  int B = a->B, T = a->T, C = s->cfg.channels, NH = s->cfg.num_heads, N = B * T;
  const float *dy = a->dresid[l + 1];
  const float *x = a->resid[l];
  o->matmul_backward_input(be, la->dfch, dy, P + w->fcprojw, N, 4 * C, C, MEGA_W_IN_OUT);
  o->gelu_backward(be, la->dfch, la->fch, la->dfch, (size_t)N * 4 * C);
  o->matmul_backward_input(be, la->dln2, la->dfch, P + w->fcw, N, C, 4 * C, MEGA_W_IN_OUT);
  o->layernorm_backward_input(be, la->dx2, dy, la->dln2, la->x2, P + w->ln2w, la->ln2_mean,
                              la->ln2_rstd, N, C);
  if (s->desc.recompute == MEGA_GPT_RECOMPUTE_SELECTIVE && !holds(s, a, l)) {
    /* selective recomputation: the probabilities, from the kept qkv (the
     * output, which datty's GEMM overwrites next, is not needed) */
    o->attention_forward(be, a->datty, la->att, a->att_scratch, la->qkv, B, T, C, NH);
    hold(s, a, l);
  }
  o->matmul_backward_input(be, a->datty, la->dx2, P + w->projw, N, C, C, MEGA_W_IN_OUT);
  o->attention_backward(be, la->dqkv, a->att_scratch, a->datty, la->qkv, la->att, B, T, C,
                        NH);
  o->matmul_backward_input(be, la->dln1, la->dqkv, P + w->qkvw, N, C, 3 * C, MEGA_W_IN_OUT);
  o->layernorm_backward_input(be, a->dresid[l], la->dx2, la->dln1, x, P + w->ln1w,
                              la->ln1_mean, la->ln1_rstd, N, C);
}

/* Full recomputation: before block l's backward, reruns its group's forward
 * from the kept input into the scratch set, unless the scratch holds that
 * group already (the last group forward ran, or the one backward_input left).
 * The group's output goes to the sink: the kept one is the next group's
 * input. Asks for no parameters: forward already had them. */
static void rematerialize(mega_gpt_stage *s, mega_gpt_acts *a, int l) {
  int first, end;
  if (!rc_group(s, l, &first, &end) || holds(s, a, first)) return;
  for (int k = first; k < end; k++)
    block_forward(s, a, k, a->resid[k], k + 1 < end ? a->resid[k + 1] : a->sink);
  hold(s, a, first);
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
  bind(a);
  return MEGA_OK;
}

/* The loss stage's input half: dresid[L] from the targets. */
static void loss_backward_input(mega_gpt_stage *s, mega_gpt_acts *a, float loss_scale) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  int C = s->cfg.channels, V = s->cfg.vocab_size, N = a->B * a->T, L = s->desc.num_layers;
  o->crossentropy_backward(be, a->dlogits, a->probs, a->targets, loss_scale, N, V);
  o->matmul_backward_input(be, a->dlnf, a->dlogits, s->param + s->head, N, C, V, MEGA_W_OUT_IN);
  o->layernorm_backward_input(be, a->dresid[L], NULL, a->dlnf, a->resid[L], s->param + s->lnfw,
                              a->lnf_mean, a->lnf_rstd, N, C);
}

/* The loss stage's weight half: the head (a unit of its own on a
 * loss-only stage; on a stage with the embedding it is wte, complete only
 * after the embedding's backward), then ln_f. */
static void loss_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, int *u) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  int C = s->cfg.channels, V = s->cfg.vocab_size, N = a->B * a->T, L = s->desc.num_layers;
  float *G = s->grad;
  o->matmul_backward_weight(be, G + s->head, NULL, a->dlogits, a->lnf, N, C, V, MEGA_W_OUT_IN);
  if (!s->desc.embedding) gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + s->lnfw, G + s->lnfb, a->dlnf, a->resid[L], a->lnf_mean,
                               a->lnf_rstd, N, C);
  gpt_unit_done(s, (*u)++);
}

mega_status mega_gpt_backward_input(mega_gpt_stage *s, mega_gpt_acts *a,
                                    const float *doutput, float loss_scale, float *dinput,
                                    mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int C = s->cfg.channels, N = a->B * a->T;
  int L = d->num_layers;
  size_t NC = (size_t)N * C;
  mega_status st = backward_check(s, a, doutput, dinput, err);
  if (st) return st;
  if (d->loss) {
    loss_backward_input(s, a, loss_scale);
  } else if ((st = o->memcpy(be, a->dresid[L], doutput, NC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = L - 1; l >= 0; l--) {
    rematerialize(s, a, l);
    block_backward_input(s, a, l);
  }
  if (!d->embedding &&
      (st = o->memcpy(be, dinput, a->dresid[0], NC * sizeof(float), MEGA_COPY_D2D, err)))
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
  float *G = s->grad;
  int C = s->cfg.channels, N = a->B * a->T;
  o->matmul_backward_weight(be, G + w->fcprojw, G + w->fcprojb, a->dresid[l + 1],
                            la->fch_gelu, N, 4 * C, C, MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->fcw, G + w->fcb, la->dfch, la->ln2, N, C, 4 * C,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + w->ln2w, G + w->ln2b, la->dln2, la->x2,
                               la->ln2_mean, la->ln2_rstd, N, C);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->projw, G + w->projb, la->dx2, la->atty, N, C, C,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->qkvw, G + w->qkvb, la->dqkv, la->ln1, N, C, 3 * C,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + w->ln1w, G + w->ln1b, la->dln1, a->resid[l],
                               la->ln1_mean, la->ln1_rstd, N, C);
  gpt_unit_done(s, (*u)++);
}

mega_status mega_gpt_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const mega_gpt_stage_desc *d = &s->desc;
  int C = s->cfg.channels;
  int L = d->num_layers;
  float *G = s->grad;
  if (a->s != s)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: activations belong to another stage");
  if (a->state != ST_BACKWARD_INPUT)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: backward_weight needs backward_input first (once per forward)");
  bind(a);
  int u = 0;
  if (d->loss) loss_backward_weight(s, a, &u);
  for (int l = L - 1; l >= 0; l--) {
    rematerialize(s, a, l); /* zero-bubble: backward_input may have used the scratch since */
    block_backward_weight(s, a, l, &u);
  }
  if (d->embedding) {
    o->encoder_backward(be, G + s->wte, G + s->wpe, a->dresid[0], a->tokens, a->B, a->T, C);
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
  int C = s->cfg.channels, N = a->B * a->T;
  int L = d->num_layers;
  size_t NC = (size_t)N * C;
  mega_status st = backward_check(s, a, doutput, dinput, err);
  if (st) return st;
  int u = 0;
  if (d->loss) {
    loss_backward_input(s, a, loss_scale);
    loss_backward_weight(s, a, &u);
  } else if ((st = o->memcpy(be, a->dresid[L], doutput, NC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = L - 1; l >= 0; l--) {
    rematerialize(s, a, l);
    block_backward_input(s, a, l);
    block_backward_weight(s, a, l, &u);
  }
  if (!d->embedding &&
      (st = o->memcpy(be, dinput, a->dresid[0], NC * sizeof(float), MEGA_COPY_D2D, err)))
    return st;
  if (d->embedding) {
    o->encoder_backward(be, s->grad + s->wte, s->grad + s->wpe, a->dresid[0], a->tokens, a->B,
                        a->T, C);
    gpt_unit_done(s, u++);
  }
  a->state = ST_EMPTY;
  return MEGA_OK;
}
