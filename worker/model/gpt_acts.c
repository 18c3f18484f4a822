/* The activations of one microbatch laid out in one allocation, and the
 * stage's recomputation scratch they share (see gpt_acts.h, gpt.h). */
#include <stdlib.h>

#include "worker/model/gpt_acts.h"

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

gpt_widths gpt_local_widths(const mega_gpt_stage *s) {
  const mega_gpt_config *c = &s->cfg;
  int tp = s->desc.tp.size, hd = mega_gpt_head_dim(c);
  gpt_widths w = {.NHl = c->num_heads / tp, .Gl = mega_gpt_kv_heads(c) / tp, .hd = hd,
                  .Fl = mega_gpt_ffn(c) / tp};
  w.Ql = w.NHl * hd;
  w.KVl = w.Gl * hd;
  return w;
}

void gpt_qkv(const mega_gpt_stage *s, int N, float *base, float **q, float **k, float **v) {
  gpt_widths w = gpt_local_widths(s);
  *q = base;
  if (gpt_llama(s)) {
    *k = base + (size_t)N * w.Ql;
    *v = *k + (size_t)N * w.KVl;
  } else {
    *k = base + w.Ql;
    *v = base + 2 * w.Ql;
  }
}

mega_attn_dims gpt_attn_dims(const mega_gpt_stage *s, int B, int T) {
  gpt_widths w = gpt_local_widths(s);
  bool fused = !gpt_llama(s);
  return (mega_attn_dims){.B = B, .T = T, .NH = w.NHl, .G = w.Gl, .hs = w.hd,
                          .ldq = fused ? 3 * w.Ql : w.Ql, .ldkv = fused ? 3 * w.Ql : w.KVl};
}

/* Block l's attention shape for the acts, with attention dropout's mask
 * when the last forward trains with it: its heads are this rank's, from
 * rank * NHl in the model's numbering. */
mega_attn_dims gpt_acts_attn_dims(const mega_gpt_stage *s, const mega_gpt_acts *a, int l) {
  mega_attn_dims d = gpt_attn_dims(s, a->B, a->T);
  d.att_cap = a->att_floats;
  d.scratch_cap = a->att_scratch_floats;
  if (s->cfg.attention_dropout > 0 && a->fwd_sample >= 0) {
    uint64_t key = mega_dropout_key(s->cfg.seed, s->desc.first_layer + l, MEGA_DROP_ATTN_PROBS);
    d.drop = mega_attn_dropout_of(s->cfg.attention_dropout, key, a->fwd_sample,
                                  s->desc.tp.rank * d.NH);
  }
  return d;
}

bool gpt_rc_group(const mega_gpt_stage *s, int l, int *first, int *end) {
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

/* A block's forward activations; shared_att: carve no att, use this one. */
static void carve_forward(carver *cv, const mega_gpt_acts *a, layer_acts *la, bool shared_att,
                          float *att) {
  const mega_gpt_stage *s = a->s;
  gpt_widths w = gpt_local_widths(s);
  size_t N = (size_t)a->B * a->T, C = s->cfg.channels, RC = (size_t)a->R * C;
  la->ln1 = carve(cv, N * C);
  la->ln1_mean = carve(cv, a->R);
  la->ln1_rstd = carve(cv, a->R);
  la->qkv = carve(cv, N * (w.Ql + 2 * (size_t)w.KVl));
  la->atty = carve(cv, N * w.Ql);
  la->att = shared_att ? att : carve(cv, a->att_floats);
  la->x2 = carve(cv, RC);
  la->ln2 = carve(cv, N * C);
  la->ln2_mean = carve(cv, a->R);
  la->ln2_rstd = carve(cv, a->R);
  la->fch = carve(cv, N * w.Fl);
  la->fcu = gpt_llama(s) ? carve(cv, N * w.Fl) : NULL;
  la->fch_gelu = carve(cv, N * w.Fl);
}

/* A block's output gradients (backward_input writes them, backward_weight
 * reads them); without sequence parallelism and dropout the whole ones are
 * aliases the caller sets. */
static void carve_grads(carver *cv, const mega_gpt_acts *a, layer_acts *la) {
  const mega_gpt_stage *s = a->s;
  gpt_widths w = gpt_local_widths(s);
  size_t N = (size_t)a->B * a->T, C = s->cfg.channels, RC = (size_t)a->R * C;
  bool own = s->desc.tp.sequence_parallel || s->cfg.hidden_dropout > 0;
  la->dx2 = carve(cv, RC);
  la->dfch = carve(cv, N * w.Fl);
  la->dfcu = gpt_llama(s) ? carve(cv, N * w.Fl) : NULL;
  la->dln2 = carve(cv, RC);
  la->dqkv = carve(cv, N * (w.Ql + 2 * (size_t)w.KVl));
  la->dln1 = carve(cv, RC);
  la->dy_all = own ? carve(cv, N * C) : NULL;
  la->dx2_all = own ? carve(cv, N * C) : NULL;
}

/* Carves the acts' own buffers from cv and the ones in the stage's
 * recomputation scratch from sc. A rerun block's output gradients are in
 * the scratch too unless the stage's backward is split (zero-bubble's W
 * reads them after other microbatches' backward_input). */
static void layout(mega_gpt_acts *a, carver *cv, carver *sc) {
  const mega_gpt_stage *s = a->s;
  const mega_gpt_config *c = &s->cfg;
  const mega_gpt_tp *tp = &s->desc.tp;
  bool sp = tp->sequence_parallel;
  gpt_widths w = gpt_local_widths(s);
  size_t N = (size_t)a->B * a->T, RC = (size_t)a->R * c->channels, C = c->channels;
  size_t Vl = (size_t)c->vocab_size / tp->size;
  int L = s->desc.num_layers, first, end;
  a->tokens = carve(cv, N); /* int32 and float have the same size */
  a->targets = carve(cv, N);
  /* The scratch set of full recomputation: the largest group's blocks and
   * their inputs but the first (which is kept). */
  int G = 0;
  for (int l = 0; l < L; l++)
    if (gpt_rc_group(s, l, &first, &end) && end - first > G) G = end - first;
  layer_acts scratch[G > 0 ? G : 1];
  float *scratch_in[G > 0 ? G : 1];
  bool split = s->desc.split_backward;
  for (int g = 0; g < G; g++) {
    carve_forward(sc, a, &scratch[g], false, NULL);
    if (!split) carve_grads(sc, a, &scratch[g]);
    scratch_in[g] = g > 0 ? carve(sc, RC) : NULL;
  }
  a->sink = G > 0 ? carve(sc, RC) : NULL;
  bool selective = s->desc.recompute == MEGA_GPT_RECOMPUTE_SELECTIVE && L > 0;
  float *att = selective ? carve(sc, a->att_floats) : NULL;
  for (int l = 0; l <= L; l++) {
    if (l < L && gpt_rc_group(s, l, &first, &end) && l > first)
      a->resid[l] = scratch_in[l - first];
    else /* A non-loss stage writes its last block's output to the caller. */
      a->resid[l] = (l < L || L == 0 || s->desc.loss) ? carve(cv, RC) : NULL;
    a->dresid[l] = carve(cv, RC);
  }
  for (int l = 0; l < L; l++) {
    layer_acts *la = &a->layers[l];
    bool rerun = gpt_rc_group(s, l, &first, &end);
    if (rerun)
      *la = scratch[l - first];
    else
      carve_forward(cv, a, la, selective, att);
    if (!rerun || split) carve_grads(cv, a, la);
    if (!sp && !(c->hidden_dropout > 0)) {
      la->dy_all = a->dresid[l + 1];
      la->dx2_all = la->dx2;
    }
  }
  /* a non-loss stage's last block: dy is the caller's doutput, copied to
   * dresid[L] */
  if (L > 0) {
    a->datty = carve(cv, N * w.Ql);
    a->att_scratch = carve(cv, a->att_scratch_floats);
  }
  if (sp) a->partial = carve(cv, N * C);
  if (s->desc.loss) {
    a->lnf = carve(cv, N * C);
    a->lnf_mean = carve(cv, a->R);
    a->lnf_rstd = carve(cv, a->R);
    a->logits = carve(cv, N * Vl);
    a->losses = carve(cv, N);
    a->dlogits = a->logits; /* the loss writes in place (backend.h) */
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
  a->next_sample = a->fwd_sample = -1;
  a->B = B;
  a->T = T;
  a->R = mega_gpt_stream_rows(s, B, T);
  mega_attn_dims ad = gpt_attn_dims(s, B, T);
  /* a training forward's dims carry attention dropout's mask, which takes
   * the cuda backend's batched GEMMs even under --bf16: size for those
   * (evaluation, without the mask, never needs more) */
  if (s->cfg.attention_dropout > 0)
    ad.drop = mega_attn_dropout_of(s->cfg.attention_dropout, 0, 0, 0);
  mega_attention_sizes(s->be, &ad, &a->att_floats, &a->att_scratch_floats);
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

void gpt_acts_bind(mega_gpt_acts *a) {
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

const float *mega_gpt_acts_logits(const mega_gpt_acts *a) {
  return a->have_targets ? NULL : a->logits; /* the loss wrote over them */
}

void mega_gpt_acts_set_samples(mega_gpt_acts *a, int64_t first_sample) {
  a->next_sample = first_sample < 0 ? -1 : first_sample;
}

void mega_gpt_acts_set_loss_scale(mega_gpt_acts *a, float loss_scale) {
  a->fused_scale = loss_scale;
}

void mega_gpt_acts_destroy(mega_gpt_acts *a) {
  if (!a) return;
  if (a->s && a->s->rc_holder == a) a->s->rc_holder = NULL;
  if (a->block) a->s->be->ops->free(a->s->be, a->block);
  free(a->resid);
  free(a->dresid);
  free(a->layers);
  free(a);
}

