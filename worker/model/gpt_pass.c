/* GPT activations of one microbatch, and the forward and split backward
 * passes of a stage (see gpt.h), tensor-parallel when the stage is.
 *
 * Shapes, with N = B*T tokens, R the stream's rows on this rank (N/tp with
 * sequence parallelism, else N), and Cl = C/tp, Fl = 4C/tp, Vl = V/tp,
 * NHl = NH/tp this rank's channels, MLP width, vocabulary and heads:
 * the residual stream, layernorm statistics and their gradients are [R,..];
 * the column-parallel GEMMs' inputs (ln1, ln2, lnf) are whole [N,C], and
 * their outputs, the attention and the MLP inside are [N, local width]. */
#include <stdlib.h>
#include <string.h>

#include "worker/model/gpt_internal.h"

#define LAYER_UNITS 6 /* a block's units (gpt.h) */

/* One block's saved activations and (after backward_input) the output
 * gradients its weight half needs. */
typedef struct layer_acts {
  float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [R], [R] */
  float *qkv;                       /* [N,3Cl] */
  float *atty;                      /* [N,Cl] attention output */
  float *att;                       /* [B,NHl,T,T] probabilities */
  float *x2;                        /* [R,C] residual after attention */
  float *ln2, *ln2_mean, *ln2_rstd; /* [N,C], [R], [R] */
  float *fch, *fch_gelu;            /* [N,Fl] */
  /* gradients */
  float *dx2;  /* [R,C] d(x2): attn.c_proj's output gradient */
  float *dfch; /* [N,Fl] d(fch): c_fc's output gradient */
  float *dln2; /* [R,C] */
  float *dqkv; /* [N,3Cl] */
  float *dln1; /* [R,C] */
  /* the whole [N,C] output gradients of the row-parallel GEMMs: gathered
   * with sequence parallelism, else dresid[l+1] and dx2 themselves */
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
  int32_t *tokens, *targets; /* [N] */
  /* resid[l]: input of local block l; resid[L] is the loss stage's ln_f
   * input. dresid[l] is its gradient. [R,C] each. */
  float **resid, **dresid;
  layer_acts *layers;
  float *lnf, *lnf_mean, *lnf_rstd; /* loss stage: [N,C], [R], [R] */
  float *logits, *probs, *losses;   /* [N,Vl], [N,Vl], [N] */
  float *dlogits, *dlnf;            /* [N,Vl], [R,C] */
  float *rowmax, *ce_sums;          /* TP loss: [N], [2N] */
  float *datty;                     /* [N,Cl] scratch: attention output grad */
  float *att_scratch;               /* B*NHl*T*T + N*Cl floats */
  float *partial;                   /* [N,C] scratch: a row-parallel result
                                       before its reduce-scatter (sequence
                                       parallelism) */
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

static void layout(mega_gpt_acts *a, carver *cv) {
  const mega_gpt_stage *s = a->s;
  const mega_gpt_config *c = &s->cfg;
  const mega_gpt_tp *tp = &s->desc.tp;
  bool sp = tp->sequence_parallel;
  size_t N = (size_t)a->B * a->T, RC = (size_t)a->R * c->channels, C = c->channels;
  size_t Cl = C / tp->size, Fl = 4 * C / tp->size, Vl = (size_t)c->vocab_size / tp->size;
  size_t TT = (size_t)a->B * (c->num_heads / tp->size) * a->T * a->T;
  int L = s->desc.num_layers;
  a->tokens = carve(cv, N); /* int32 and float have the same size */
  a->targets = carve(cv, N);
  for (int l = 0; l <= L; l++) {
    /* A non-loss stage writes its last block's output to the caller. */
    a->resid[l] = (l < L || L == 0 || s->desc.loss) ? carve(cv, RC) : NULL;
    a->dresid[l] = carve(cv, RC);
  }
  for (int l = 0; l < L; l++) {
    layer_acts *la = &a->layers[l];
    la->ln1 = carve(cv, N * C);
    la->ln1_mean = carve(cv, a->R);
    la->ln1_rstd = carve(cv, a->R);
    la->qkv = carve(cv, N * 3 * Cl);
    la->atty = carve(cv, N * Cl);
    la->att = carve(cv, TT);
    la->x2 = carve(cv, RC);
    la->ln2 = carve(cv, N * C);
    la->ln2_mean = carve(cv, a->R);
    la->ln2_rstd = carve(cv, a->R);
    la->fch = carve(cv, N * Fl);
    la->fch_gelu = carve(cv, N * Fl);
    la->dx2 = carve(cv, RC);
    la->dfch = carve(cv, N * Fl);
    la->dln2 = carve(cv, RC);
    la->dqkv = carve(cv, N * 3 * Cl);
    la->dln1 = carve(cv, RC);
    la->dy_all = sp ? carve(cv, N * C) : a->dresid[l + 1];
    la->dx2_all = sp ? carve(cv, N * C) : la->dx2;
  }
  /* a non-loss stage's last block: dy is the caller's doutput, copied to
   * dresid[L] */
  if (L > 0) {
    a->datty = carve(cv, N * Cl);
    a->att_scratch = carve(cv, TT + N * Cl);
  }
  if (sp) a->partial = carve(cv, N * C);
  if (s->desc.loss) {
    a->lnf = carve(cv, N * C);
    a->lnf_mean = carve(cv, a->R);
    a->lnf_rstd = carve(cv, a->R);
    a->logits = carve(cv, N * Vl);
    a->probs = carve(cv, N * Vl);
    a->losses = carve(cv, N);
    a->dlogits = carve(cv, N * Vl);
    a->dlnf = carve(cv, RC);
    if (tp->size > 1) {
      a->rowmax = carve(cv, N);
      a->ce_sums = carve(cv, 2 * N);
    }
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
  if (s->desc.tp.sequence_parallel && (B * T) % s->desc.tp.size)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: sequence parallelism splits the %d tokens of a microbatch over %d "
                     "tensor-parallel ranks, which does not divide them; use a sequence "
                     "length divisible by --tensor-model-parallel-size",
                     B * T, s->desc.tp.size);
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
  a->R = mega_gpt_stream_rows(s, B, T);
  carver cv = {0};
  layout(a, &cv);
  a->bytes = cv.off;
  mega_status st = s->be->ops->alloc(s->be, a->bytes, &a->block, err);
  if (st) {
    mega_err_prefix(err, "gpt: activations for B=%d T=%d", B, T);
    mega_gpt_acts_destroy(a);
    return st;
  }
  cv = (carver){.base = a->block};
  layout(a, &cv);
  *out = a;
  return MEGA_OK;
}

size_t mega_gpt_acts_bytes(const mega_gpt_acts *a) { return a->bytes; }

void mega_gpt_acts_dims(const mega_gpt_acts *a, int *B, int *T) {
  *B = a->B;
  *T = a->T;
}

const float *mega_gpt_acts_logits(const mega_gpt_acts *a) { return a->logits; }

void mega_gpt_acts_destroy(mega_gpt_acts *a) {
  if (!a) return;
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

/* ---- the TP group (every helper is a no-op without tensor parallelism) ---- */

static bool tp_on(const mega_gpt_stage *s) { return s->desc.tp.size > 1; }
static bool sp_on(const mega_gpt_stage *s) { return s->desc.tp.sequence_parallel && tp_on(s); }

/* This rank's rows of a whole [N,C] tensor: where a layernorm writes
 * before gather_rows fills in the others. */
static float *my_rows(const mega_gpt_stage *s, const mega_gpt_acts *a, float *whole) {
  return sp_on(s) ? whole + (size_t)s->desc.tp.rank * a->R * s->cfg.channels : whole;
}

/* Sequence parallelism: the other ranks' rows of whole, in place. */
static mega_status gather_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *whole,
                               mega_err *err) {
  if (!sp_on(s)) return MEGA_OK;
  size_t n = (size_t)a->R * s->cfg.channels;
  return s->desc.tp.ops->all_gather(s->desc.tp.ctx, my_rows(s, a, whole), whole, n, err);
}

/* Sequence parallelism: whole [N,C] = every rank's rows [R,C]. */
static mega_status gather_into(mega_gpt_stage *s, mega_gpt_acts *a, const float *rows,
                               float *whole, mega_err *err) {
  if (!sp_on(s)) return MEGA_OK;
  size_t n = (size_t)a->R * s->cfg.channels;
  return s->desc.tp.ops->all_gather(s->desc.tp.ctx, rows, whole, n, err);
}

/* Where a row-parallel result of [N,C] is written before reduce_rows sums
 * it over the group into out [R,C]: out itself when the sum is an
 * all-reduce in place. */
static float *partial_for(const mega_gpt_stage *s, const mega_gpt_acts *a, float *out) {
  return sp_on(s) ? a->partial : out;
}

static mega_status reduce_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *out, mega_err *err) {
  if (!tp_on(s)) return MEGA_OK;
  size_t rc = (size_t)a->R * s->cfg.channels;
  if (sp_on(s)) return s->desc.tp.ops->reduce_scatter(s->desc.tp.ctx, a->partial, out, rc, err);
  return s->desc.tp.ops->all_reduce(s->desc.tp.ctx, out, rc, err);
}

/* out [R,C] = x + W(in) + bias for a row-parallel GEMM of K local inputs:
 * fused into the GEMM alone; with TP the residual and the bias come after
 * the reduction, so they count once. */
static mega_status row_parallel_forward(mega_gpt_stage *s, mega_gpt_acts *a, float *out,
                                        const float *in, const float *w, const float *bias,
                                        const float *x, int K, mega_err *err) {
  const mega_backend_ops *o = s->be->ops;
  int N = a->B * a->T, C = s->cfg.channels;
  if (!tp_on(s)) {
    o->matmul_forward(s->be, out, in, w, bias, x, N, K, C, MEGA_W_IN_OUT);
    return MEGA_OK;
  }
  o->matmul_forward(s->be, partial_for(s, a, out), in, w, NULL, NULL, N, K, C, MEGA_W_IN_OUT);
  mega_status st = reduce_rows(s, a, out, err);
  if (st == MEGA_OK) o->bias_residual_forward(s->be, out, x, out, bias, a->R, C);
  return st;
}

/* din [R,C] = the input gradient of a column-parallel GEMM of K local
 * outputs (W^T dout), summed over the group. */
static mega_status column_parallel_backward(mega_gpt_stage *s, mega_gpt_acts *a, float *din,
                                            const float *dout, const float *w, int K,
                                            mega_err *err) {
  int N = a->B * a->T, C = s->cfg.channels;
  s->be->ops->matmul_backward_input(s->be, partial_for(s, a, din), dout, w, N, C, K,
                                    MEGA_W_IN_OUT);
  return reduce_rows(s, a, din, err);
}

/* A layernorm over this rank's rows of the stream, its output made whole. */
static mega_status layernorm_whole(mega_gpt_stage *s, mega_gpt_acts *a, float *whole,
                                   float *mean, float *rstd, const float *x, size_t w,
                                   size_t b, mega_err *err) {
  s->be->ops->layernorm_forward(s->be, my_rows(s, a, whole), mean, rstd, x, s->param + w,
                                s->param + b, a->R, s->cfg.channels, s->cfg.ln_eps);
  return gather_rows(s, a, whole, err);
}

static mega_status block_forward(mega_gpt_stage *s, mega_gpt_acts *a, int l, const float *x,
                                 float *y, mega_err *err) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  const gpt_layer_off *w = &s->layers[l];
  layer_acts *la = &a->layers[l];
  const float *P = s->param;
  int tp = s->desc.tp.size, B = a->B, T = a->T, N = B * T;
  int C = s->cfg.channels, Cl = C / tp, Fl = 4 * C / tp, NHl = s->cfg.num_heads / tp;
  mega_status st = layernorm_whole(s, a, la->ln1, la->ln1_mean, la->ln1_rstd, x, w->ln1w,
                                   w->ln1b, err);
  if (st) return st;
  o->matmul_forward(be, la->qkv, la->ln1, P + w->qkvw, P + w->qkvb, NULL, N, C, 3 * Cl,
                    MEGA_W_IN_OUT);
  o->attention_forward(be, la->atty, la->att, a->att_scratch, la->qkv, B, T, Cl, NHl);
  if ((st = row_parallel_forward(s, a, la->x2, la->atty, P + w->projw, P + w->projb, x, Cl,
                                 err)) ||
      (st = layernorm_whole(s, a, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, w->ln2w,
                            w->ln2b, err)))
    return st;
  o->matmul_forward(be, la->fch, la->ln2, P + w->fcw, P + w->fcb, NULL, N, C, Fl,
                    MEGA_W_IN_OUT);
  o->gelu_forward(be, la->fch_gelu, la->fch, (size_t)N * Fl);
  return row_parallel_forward(s, a, y, la->fch_gelu, P + w->fcprojw, P + w->fcprojb, la->x2,
                              Fl, err);
}

/* resid[0] = wte[tokens] + wpe: with a vocabulary slice, rows of other
 * ranks' ids are zero here and the sum over the group fills them (wpe added
 * by rank 0 alone, so once). */
static mega_status embedding_forward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_gpt_tp *tp = &s->desc.tp;
  int Vl = s->cfg.vocab_size / tp->size;
  const float *wpe = tp->rank == 0 ? s->param + s->wpe : NULL;
  s->be->ops->encoder_forward(s->be, partial_for(s, a, a->resid[0]), a->tokens,
                              s->param + s->wte, tp->rank * Vl, Vl, wpe, a->B, a->T,
                              s->cfg.channels);
  return reduce_rows(s, a, a->resid[0], err);
}

/* Vocabulary-parallel cross-entropy: the row max, then the sums of exp and
 * the target's logit, each reduced over the group; never the whole logits. */
static mega_status loss_forward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_backend_ops *o = s->be->ops;
  const mega_gpt_tp *tp = &s->desc.tp;
  int N = a->B * a->T, Vl = s->cfg.vocab_size / tp->size;
  if (!tp_on(s)) {
    o->crossentropy_forward(s->be, a->losses, a->probs, a->logits, a->targets, N, Vl);
    return MEGA_OK;
  }
  o->crossentropy_rowmax(s->be, a->rowmax, a->logits, N, Vl);
  mega_status st = tp->ops->all_reduce_max(tp->ctx, a->rowmax, (size_t)N, err);
  if (st) return st;
  o->crossentropy_sums(s->be, a->ce_sums, a->logits, a->rowmax, a->targets, tp->rank * Vl, N,
                       Vl);
  if ((st = tp->ops->all_reduce(tp->ctx, a->ce_sums, 2 * (size_t)N, err))) return st;
  o->crossentropy_finish(s->be, a->losses, a->probs, a->logits, a->rowmax, a->ce_sums, N, Vl);
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
  }
  if (!d->loss) {
    a->state = ST_FORWARD;
    if (L == 0)
      return o->memcpy(be, output, a->resid[0], RC * sizeof(float), MEGA_COPY_D2D, err);
    return MEGA_OK;
  }
  while (u > 0) gpt_unit_needed(s, --u); /* ln_f, and the head copy */
  if ((st = layernorm_whole(s, a, a->lnf, a->lnf_mean, a->lnf_rstd, a->resid[L], s->lnfw,
                            s->lnfb, err)))
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
  const float *P = s->param;
  int tp = s->desc.tp.size, B = a->B, T = a->T, N = B * T, R = a->R;
  int C = s->cfg.channels, Cl = C / tp, Fl = 4 * C / tp, NHl = s->cfg.num_heads / tp;
  const float *dy = a->dresid[l + 1];
  const float *x = a->resid[l];
  mega_status st = gather_into(s, a, dy, la->dy_all, err);
  if (st) return st;
  o->matmul_backward_input(be, la->dfch, la->dy_all, P + w->fcprojw, N, Fl, C, MEGA_W_IN_OUT);
  o->gelu_backward(be, la->dfch, la->fch, la->dfch, (size_t)N * Fl);
  if ((st = column_parallel_backward(s, a, la->dln2, la->dfch, P + w->fcw, Fl, err)))
    return st;
  o->layernorm_backward_input(be, la->dx2, dy, la->dln2, la->x2, P + w->ln2w, la->ln2_mean,
                              la->ln2_rstd, R, C);
  if ((st = gather_into(s, a, la->dx2, la->dx2_all, err))) return st;
  o->matmul_backward_input(be, a->datty, la->dx2_all, P + w->projw, N, Cl, C, MEGA_W_IN_OUT);
  o->attention_backward(be, la->dqkv, a->att_scratch, a->datty, la->qkv, la->att, B, T, Cl,
                        NHl);
  if ((st = column_parallel_backward(s, a, la->dln1, la->dqkv, P + w->qkvw, 3 * Cl, err)))
    return st;
  o->layernorm_backward_input(be, a->dresid[l], la->dx2, la->dln1, x, P + w->ln1w,
                              la->ln1_mean, la->ln1_rstd, R, C);
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
  o->crossentropy_backward(be, a->dlogits, a->probs, a->targets, tp->rank * Vl, loss_scale, N,
                           Vl);
  o->matmul_backward_input(be, partial_for(s, a, a->dlnf), a->dlogits, s->param + s->head, N,
                           C, Vl, MEGA_W_OUT_IN);
  mega_status st = reduce_rows(s, a, a->dlnf, err);
  if (st) return st;
  o->layernorm_backward_input(be, a->dresid[L], NULL, a->dlnf, a->resid[L], s->param + s->lnfw,
                              a->lnf_mean, a->lnf_rstd, a->R, C);
  return MEGA_OK;
}

/* The loss stage's weight half: the head (a unit of its own on a
 * loss-only stage; on a stage with the embedding it is wte, complete only
 * after the embedding's backward), then ln_f. */
static void loss_backward_weight(mega_gpt_stage *s, mega_gpt_acts *a, int *u) {
  mega_backend *be = s->be;
  const mega_backend_ops *o = be->ops;
  int C = s->cfg.channels, Vl = s->cfg.vocab_size / s->desc.tp.size, N = a->B * a->T;
  int L = s->desc.num_layers;
  float *G = s->grad;
  o->matmul_backward_weight(be, G + s->head, NULL, a->dlogits, a->lnf, N, C, Vl,
                            MEGA_W_OUT_IN);
  if (!s->desc.embedding) gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + s->lnfw, G + s->lnfb, a->dlnf, a->resid[L], a->lnf_mean,
                               a->lnf_rstd, a->R, C);
  gpt_unit_done(s, (*u)++);
}

/* The embedding's gradients, from the whole dresid[0] (gathered with
 * sequence parallelism; every rank then has all of wpe's). */
static mega_status embedding_backward(mega_gpt_stage *s, mega_gpt_acts *a, mega_err *err) {
  const mega_gpt_tp *tp = &s->desc.tp;
  int Vl = s->cfg.vocab_size / tp->size;
  float *dall = sp_on(s) ? a->partial : a->dresid[0];
  mega_status st = gather_into(s, a, a->dresid[0], dall, err);
  if (st) return st;
  s->be->ops->encoder_backward(s->be, s->grad + s->wte, tp->rank * Vl, Vl, s->grad + s->wpe,
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
  if (d->loss) {
    if ((st = loss_backward_input(s, a, loss_scale, err))) return st;
  } else if ((st = o->memcpy(be, a->dresid[L], doutput, RC * sizeof(float), MEGA_COPY_D2D,
                             err))) {
    return st;
  }
  for (int l = L - 1; l >= 0; l--)
    if ((st = block_backward_input(s, a, l, err))) return st;
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
  float *G = s->grad;
  int tp = s->desc.tp.size, N = a->B * a->T, R = a->R;
  int C = s->cfg.channels, Cl = C / tp, Fl = 4 * C / tp;
  o->matmul_backward_weight(be, G + w->fcprojw, G + w->fcprojb, la->dy_all, la->fch_gelu, N,
                            Fl, C, MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->fcw, G + w->fcb, la->dfch, la->ln2, N, C, Fl,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + w->ln2w, G + w->ln2b, la->dln2, la->x2,
                               la->ln2_mean, la->ln2_rstd, R, C);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->projw, G + w->projb, la->dx2_all, la->atty, N, Cl, C,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->matmul_backward_weight(be, G + w->qkvw, G + w->qkvb, la->dqkv, la->ln1, N, C, 3 * Cl,
                            MEGA_W_IN_OUT);
  gpt_unit_done(s, (*u)++);
  o->layernorm_backward_weight(be, G + w->ln1w, G + w->ln1b, la->dln1, a->resid[l],
                               la->ln1_mean, la->ln1_rstd, R, C);
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
  int u = 0;
  if (d->loss) loss_backward_weight(s, a, &u);
  for (int l = L - 1; l >= 0; l--) block_backward_weight(s, a, l, &u);
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
    if ((st = block_backward_input(s, a, l, err))) return st;
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
