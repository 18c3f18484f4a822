/* GPT stage: configuration checks, the parameter table, initialisation and
 * safetensors load/save. The passes are in gpt_pass.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "worker/model/gpt_internal.h"

void mega_gpt_config_default(mega_gpt_config *cfg) {
  *cfg = (mega_gpt_config){.vocab_size = 256,
                           .max_seq_len = 1024,
                           .num_layers = 12,
                           .num_heads = 12,
                           .channels = 768,
                           .init_std = 0.02f,
                           .ln_eps = 1e-5f,
                           .seed = 1337,
                           .rope_theta = 10000.0f,
                           .rotary_percent = 1.0};
}

int mega_gpt_kv_heads(const mega_gpt_config *c) {
  return c->num_kv_heads > 0 ? c->num_kv_heads : c->num_heads;
}

int mega_gpt_head_dim(const mega_gpt_config *c) {
  return c->head_dim > 0 ? c->head_dim : c->num_heads > 0 ? c->channels / c->num_heads : 0;
}

int mega_gpt_ffn(const mega_gpt_config *c) {
  return c->ffn_hidden > 0 ? c->ffn_hidden : 4 * c->channels;
}

/* Megatron's: int(kv_channels * rotary_percent), in double as Python's, so
 * that the channels rotated are Megatron's and HF's partial_rotary_factor's
 * (in float, 100 x 0.29 would be 29, not 28). */
int mega_gpt_rot_dim(const mega_gpt_config *c) {
  if (c->arch != MEGA_GPT_ARCH_LLAMA) return 0;
  return (int)((double)mega_gpt_head_dim(c) * c->rotary_percent);
}

/* What GPT-2 (Hugging Face's GPT2LMHeadModel) cannot hold. */
static mega_status check_gpt2(const mega_gpt_config *c, mega_err *err) {
  if (mega_gpt_kv_heads(c) != c->num_heads)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: GPT-2 has no grouped-query attention (num_kv_heads %d, num_heads "
                     "%d); use the Llama architecture",
                     c->num_kv_heads, c->num_heads);
  if (c->channels % c->num_heads != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_heads (%d) must divide channels (%d); pick a head count "
                     "that divides the hidden size",
                     c->num_heads, c->channels);
  if (mega_gpt_head_dim(c) != c->channels / c->num_heads)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: GPT-2's heads are channels / num_heads = %d wide, not head_dim %d",
                     c->channels / c->num_heads, c->head_dim);
  if (c->no_bias)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: GPT-2's linear layers always have biases (no_bias is Llama's)");
  return MEGA_OK;
}

static mega_status check_llama(const mega_gpt_config *c, mega_err *err) {
  int G = mega_gpt_kv_heads(c), rot = mega_gpt_rot_dim(c);
  if (c->gelu_erf)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: gelu_erf is GPT-2's; Llama's MLP is SwiGLU, with no GELU");
  if (G < 1 || c->num_heads % G)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_heads (%d) must be a multiple of num_kv_heads (%d)", c->num_heads,
                     G);
  if (mega_gpt_head_dim(c) < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: head_dim must be >= 1, got %d",
                     mega_gpt_head_dim(c));
  if (!(c->rotary_percent > 0.0 && c->rotary_percent <= 1.0))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: rotary_percent must be in (0, 1], got %g",
                     c->rotary_percent);
  if (rot < 2 || rot % 2)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: RoPE turns pairs of channels: head_dim %d x rotary_percent %g = %d "
                     "must be even and at least 2",
                     mega_gpt_head_dim(c), c->rotary_percent, rot);
  if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: rope_theta must be finite and > 1, got %g",
                     (double)c->rope_theta);
  return MEGA_OK;
}

mega_status mega_gpt_config_check(const mega_gpt_config *c, mega_err *err) {
  if (c->vocab_size < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: vocab_size must be >= 1, got %d",
                     c->vocab_size);
  if (c->max_seq_len < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: max_seq_len must be >= 1, got %d",
                     c->max_seq_len);
  /* at most 2^20: a stage counts its tensors (16 a layer) in an int */
  if (c->num_layers < 1 || c->num_layers > (1 << 20))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: num_layers must be in [1, 1048576], got %d",
                     c->num_layers);
  if (c->num_heads < 1 || c->channels < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_heads (%d) and channels (%d) must be >= 1", c->num_heads,
                     c->channels);
  if (c->num_kv_heads < 0 || c->head_dim < 0 || c->ffn_hidden < 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_kv_heads (%d), head_dim (%d) and ffn_hidden (%d) must be >= 0 "
                     "(0: derived)",
                     c->num_kv_heads, c->head_dim, c->ffn_hidden);
  /* Every tensor, activations included, must index in int and size_t. The
   * MLP's width in 64 bits: its default 4 x channels need not fit an int
   * before this check. */
  int64_t ffn = c->ffn_hidden > 0 ? c->ffn_hidden : 4 * (int64_t)c->channels;
  if ((int64_t)c->channels * 4 > (1 << 24) || (int64_t)c->vocab_size > (1 << 24) ||
      (int64_t)c->max_seq_len > (1 << 20) || ffn > (1 << 24) ||
      (int64_t)c->num_heads * mega_gpt_head_dim(c) > (1 << 22))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: sizes too large (channels %d, vocab %d, max_seq_len %d, ffn %lld, "
                     "heads %d x %d)",
                     c->channels, c->vocab_size, c->max_seq_len, (long long)ffn, c->num_heads,
                     mega_gpt_head_dim(c));
  if (!(c->hidden_dropout >= 0.0 && c->hidden_dropout < 1.0))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: hidden_dropout must be in [0, 1), got %g",
                     c->hidden_dropout);
  if (!(c->attention_dropout >= 0.0 && c->attention_dropout < 1.0))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: attention_dropout must be in [0, 1), got %g",
                     c->attention_dropout);
  if (!(c->init_std >= 0.0f) || !isfinite(c->init_std))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: init_std must be finite and >= 0, got %g",
                     (double)c->init_std);
  if (!(c->ln_eps > 0.0f) || !isfinite(c->ln_eps))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: ln_eps must be finite and > 0, got %g",
                     (double)c->ln_eps);
  if (c->arch == MEGA_GPT_ARCH_GPT2) return check_gpt2(c, err);
  if (c->arch == MEGA_GPT_ARCH_LLAMA) return check_llama(c, err);
  return mega_fail(err, MEGA_ERR_INVALID, "gpt: unknown architecture %d", (int)c->arch);
}

static mega_status check_desc(const mega_gpt_config *c, const mega_gpt_stage_desc *d,
                              mega_err *err) {
  if (d->first_layer < 0 || d->num_layers < 0 ||
      d->first_layer + d->num_layers > c->num_layers)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: stage layers %d..%d are outside the model's %d layers",
                     d->first_layer, d->first_layer + d->num_layers - 1, c->num_layers);
  if (!d->embedding && !d->loss && d->num_layers == 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: a stage needs the embedding, the loss or at least one layer");
  const mega_gpt_tp *tp = &d->tp;
  if (tp->size < 0 || (tp->size > 1 && (tp->rank < 0 || tp->rank >= tp->size)))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: tensor-parallel rank %d of size %d",
                     tp->rank, tp->size);
  if (tp->size > 1 && (!tp->ops || !tp->ops->all_reduce || !tp->ops->all_reduce_max ||
                       !tp->ops->all_gather || !tp->ops->reduce_scatter))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: tensor parallelism of size %d needs the group's four collectives",
                     tp->size);
  if (tp->size > 1 && (c->num_heads % tp->size || c->vocab_size % tp->size))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: tensor-parallel size %d must divide the heads (%d) and the "
                     "vocabulary (%d; pad it to a multiple of --make-vocab-size-divisible-by "
                     "x TP)",
                     tp->size, c->num_heads, c->vocab_size);
  if (tp->size > 1 && (mega_gpt_kv_heads(c) % tp->size || mega_gpt_ffn(c) % tp->size))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: tensor-parallel size %d must divide the key/value heads (query "
                     "groups, %d) and the MLP's width (%d)",
                     tp->size, mega_gpt_kv_heads(c), mega_gpt_ffn(c));
  if (d->recompute < MEGA_GPT_RECOMPUTE_NONE || d->recompute > MEGA_GPT_RECOMPUTE_SELECTIVE)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: unknown recompute mode %d", (int)d->recompute);
  bool full = d->recompute == MEGA_GPT_RECOMPUTE_UNIFORM || d->recompute == MEGA_GPT_RECOMPUTE_BLOCK;
  if (full && d->recompute_layers < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: full recomputation needs recompute_layers >= 1, got %d",
                     d->recompute_layers);
  return MEGA_OK;
}

/* The table being built: params in forward order, each with its role, and
 * where each unit (gpt.h) starts, in forward order too. */
typedef struct table {
  mega_param_info *p;
  gpt_role *role;
  int *role_layer;
  int n, cap;
  size_t off;
  mega_gpt_unit *units;
  int nunits;
} table;

/* How a tensor splits over TP ranks (tp_split.h). */
typedef enum { REPL, ROWS, COLS, QKV } split_kind;

/* Starts a unit of block layer (-1: the embedding or the loss's). */
static void unit(table *t, int layer) {
  t->units[t->nunits++] = (mega_gpt_unit){.first = t->n, .layer = layer};
}

static bool is_bias(gpt_role r) {
  return r == R_QKVB || r == R_QB || r == R_KB || r == R_VB || r == R_PROJB || r == R_FCB ||
         r == R_UPB || r == R_FCPROJB;
}

static bool is_norm(gpt_role r) {
  return r == R_LN1W || r == R_LN1B || r == R_LN2W || r == R_LN2B || r == R_LNFW || r == R_LNFB;
}

/* Adds the full tensor [d0, d1] (d1 0: 1-D) as this rank's slice of it. */
static void add(table *t, const mega_gpt_tp *tp, const char *name, int d0, int d1,
                split_kind k, gpt_role role, int layer) {
  mega_param_info *pi = &t->p[t->n];
  t->role[t->n] = role;
  t->role_layer[t->n++] = layer;
  memset(pi, 0, sizeof *pi);
  snprintf(pi->name, sizeof pi->name, "%s", name);
  int n = tp->size > 1 ? tp->size : 1;
  pi->ndim = d1 ? 2 : 1;
  pi->full_shape[0] = d0;
  pi->full_shape[1] = d1;
  pi->full_numel = (size_t)d0 * (d1 ? (size_t)d1 : 1);
  size_t rows = (size_t)d0, cols = d1 ? (size_t)d1 : 1;
  switch (n > 1 ? k : REPL) {
  case REPL: pi->tp = (mega_tp_split){.parts = 0, .outer = 1, .inner = pi->full_numel}; break;
  case ROWS: pi->tp = (mega_tp_split){.parts = 1, .outer = 1, .inner = pi->full_numel}; break;
  case COLS: pi->tp = (mega_tp_split){.parts = 1, .outer = rows, .inner = cols}; break;
  case QKV: /* [C, 3C] or [3C]: thirds of the last dimension */
    pi->tp = (mega_tp_split){.parts = 3, .outer = d1 ? rows : 1, .inner = (d1 ? cols : rows) / 3};
    break;
  }
  pi->shape[0] = d0;
  pi->shape[1] = d1;
  if (n > 1 && (k == ROWS || (k == QKV && !d1))) pi->shape[0] = d0 / n;
  if (n > 1 && (k == COLS || (k == QKV && d1))) pi->shape[1] = d1 / n;
  pi->numel = pi->full_numel / (size_t)(n > 1 && k != REPL ? n : 1);
  pi->sp_partial = tp->sequence_parallel && n > 1 && is_norm(role);
  /* 16-float alignment keeps every tensor on a cache line. */
  pi->offset = t->off;
  t->off += (pi->numel + 15) / 16 * 16;
  pi->decay = d1 != 0; /* 2-D weights decay; biases and norms don't */
}

/* The stage's named offsets (s->wte, s->layers[l].qkvw, ...) from the
 * params' roles; GPT_NO_OFF for those it lacks. */
static void derive_offsets(mega_gpt_stage *s) {
  static const size_t field[] = {
#define F(r, f) [r] = offsetof(gpt_layer_off, f)
      F(R_LN1W, ln1w),   F(R_LN1B, ln1b), F(R_QKVW, qkvw),       F(R_QKVB, qkvb),
      F(R_QW, qw),       F(R_QB, qb),     F(R_KW, kw),           F(R_KB, kb),
      F(R_VW, vw),       F(R_VB, vb),     F(R_PROJW, projw),     F(R_PROJB, projb),
      F(R_LN2W, ln2w),   F(R_LN2B, ln2b), F(R_FCW, fcw),         F(R_FCB, fcb),
      F(R_UPW, upw),     F(R_UPB, upb),   F(R_FCPROJW, fcprojw), F(R_FCPROJB, fcprojb),
#undef F
  };
  s->wte = s->wpe = s->lnfw = s->lnfb = s->head = GPT_NO_OFF;
  for (int l = 0; l < s->desc.num_layers; l++) {
    size_t *o = (size_t *)&s->layers[l];
    for (size_t k = 0; k < sizeof(gpt_layer_off) / sizeof(size_t); k++) o[k] = GPT_NO_OFF;
  }
  for (int i = 0; i < s->nparams; i++) {
    size_t off = s->params[i].offset;
    switch (s->role[i]) {
    case R_WTE: s->wte = off; break;
    case R_WPE: s->wpe = off; break;
    case R_LNFW: s->lnfw = off; break;
    case R_LNFB: s->lnfb = off; break;
    case R_HEAD: s->head = off; break;
    default:
      *(size_t *)((char *)&s->layers[s->role_layer[i]] + field[s->role[i]]) = off;
      break;
    }
  }
  if (s->desc.loss && s->head == GPT_NO_OFF) s->head = s->wte; /* tied, on this stage */
}

/* Hugging Face's names of the two architectures. */
typedef struct arch_names {
  const char *wte, *wpe, *block, *ln1, *ln2, *lnf;
} arch_names;

static const arch_names gpt2_names = {"transformer.wte.weight", "transformer.wpe.weight",
                                      "transformer.h.%d.%s", "ln_1", "ln_2", "transformer.ln_f"};
static const arch_names llama_names = {"model.embed_tokens.weight", NULL, "model.layers.%d.%s",
                                       "input_layernorm", "post_attention_layernorm",
                                       "model.norm"};

/* Adds block i's tensor named by its suffix. */
static void add_in_block(table *t, const mega_gpt_stage *s, const arch_names *an, int i,
                         const char *suffix, int d0, int d1, split_kind k, gpt_role role) {
  char nm[64];
  snprintf(nm, sizeof nm, an->block, s->desc.first_layer + i, suffix);
  add(t, &s->desc.tp, nm, d0, d1, k, role, i);
}

/* A block's params, in gpt.h's order: one unit per call of unit(). */
static void add_block(table *t, const mega_gpt_stage *s, int i) {
  const mega_gpt_config *c = &s->cfg;
  bool llama = gpt_llama(s), bias = !c->no_bias;
  const arch_names *an = llama ? &llama_names : &gpt2_names;
  int C = c->channels, F = mega_gpt_ffn(c), hd = mega_gpt_head_dim(c);
  int Q = c->num_heads * hd, KV = mega_gpt_kv_heads(c) * hd;
  char part[48];
#define P(suffix, d0, d1, split, role) add_in_block(t, s, an, i, suffix, d0, d1, split, role)
#define NORM(which, w, b)                                   \
  do {                                                      \
    unit(t, i);                                             \
    snprintf(part, sizeof part, "%s.weight", which);        \
    P(part, C, 0, REPL, w);                                 \
    if (!llama) {                                           \
      snprintf(part, sizeof part, "%s.bias", which);        \
      P(part, C, 0, REPL, b);                               \
    }                                                       \
  } while (0)
  NORM(an->ln1, R_LN1W, R_LN1B);
  unit(t, i);
  if (!llama) { /* c_attn and c_fc column-parallel, the c_projs row-parallel */
    P("attn.c_attn.weight", C, 3 * C, QKV, R_QKVW);
    P("attn.c_attn.bias", 3 * C, 0, QKV, R_QKVB);
    unit(t, i);
    P("attn.c_proj.weight", C, C, ROWS, R_PROJW);
    P("attn.c_proj.bias", C, 0, REPL, R_PROJB);
  } else { /* nn.Linear [out, in]: rows are outputs */
    P("self_attn.q_proj.weight", Q, C, ROWS, R_QW);
    if (bias) P("self_attn.q_proj.bias", Q, 0, ROWS, R_QB);
    P("self_attn.k_proj.weight", KV, C, ROWS, R_KW);
    if (bias) P("self_attn.k_proj.bias", KV, 0, ROWS, R_KB);
    P("self_attn.v_proj.weight", KV, C, ROWS, R_VW);
    if (bias) P("self_attn.v_proj.bias", KV, 0, ROWS, R_VB);
    unit(t, i);
    P("self_attn.o_proj.weight", C, Q, COLS, R_PROJW);
    if (bias) P("self_attn.o_proj.bias", C, 0, REPL, R_PROJB);
  }
  NORM(an->ln2, R_LN2W, R_LN2B);
  unit(t, i);
  if (!llama) {
    P("mlp.c_fc.weight", C, F, COLS, R_FCW);
    P("mlp.c_fc.bias", F, 0, ROWS, R_FCB);
    unit(t, i);
    P("mlp.c_proj.weight", F, C, ROWS, R_FCPROJW);
    P("mlp.c_proj.bias", C, 0, REPL, R_FCPROJB);
  } else {
    P("mlp.gate_proj.weight", F, C, ROWS, R_FCW);
    if (bias) P("mlp.gate_proj.bias", F, 0, ROWS, R_FCB);
    P("mlp.up_proj.weight", F, C, ROWS, R_UPW);
    if (bias) P("mlp.up_proj.bias", F, 0, ROWS, R_UPB);
    unit(t, i);
    P("mlp.down_proj.weight", C, F, COLS, R_FCPROJW);
    if (bias) P("mlp.down_proj.bias", C, 0, REPL, R_FCPROJB);
  }
#undef NORM
#undef P
}

static void build_table(mega_gpt_stage *s, table *t) {
  const mega_gpt_config *c = &s->cfg;
  const mega_gpt_tp *tp = &s->desc.tp;
  const arch_names *an = gpt_llama(s) ? &llama_names : &gpt2_names;
  int C = c->channels, V = c->vocab_size;
  char nm[64];
  if (s->desc.embedding) {
    unit(t, -1);
    add(t, tp, an->wte, V, C, ROWS, R_WTE, -1);
    t->p[t->n - 1].tied_embedding = !c->untied;
    if (an->wpe) add(t, tp, an->wpe, c->max_seq_len, C, REPL, R_WPE, -1);
  }
  for (int i = 0; i < s->desc.num_layers; i++) add_block(t, s, i);
  if (s->desc.loss) {
    unit(t, -1);
    snprintf(nm, sizeof nm, "%s.weight", an->lnf);
    add(t, tp, nm, C, 0, REPL, R_LNFW, -1);
    snprintf(nm, sizeof nm, "%s.bias", an->lnf);
    if (!gpt_llama(s)) add(t, tp, nm, C, 0, REPL, R_LNFB, -1);
    if (c->untied || !s->desc.embedding) {
      unit(t, -1);
      add(t, tp, c->untied ? "lm_head.weight" : an->wte, V, C, ROWS, R_HEAD, -1);
      t->p[t->n - 1].tied_copy = !c->untied;
      t->p[t->n - 1].tied_embedding = !c->untied;
    }
  }
}

/* The units in backward order (gpt.h): the table's, reversed. */
static void build_units(mega_gpt_stage *s, const table *t) {
  int n = t->nunits;
  for (int i = 0; i < n; i++) {
    int j = n - 1 - i; /* its index in forward order */
    mega_gpt_unit u = t->units[j];
    int end = j + 1 < n ? t->units[j + 1].first : s->nparams;
    u.count = end - u.first;
    u.numel = 0;
    for (int k = 0; k < u.count; k++) u.numel += s->params[u.first + k].numel;
    s->units[i] = u;
  }
  s->nunits = n;
}

/* The init of this rank's slice of a tensor, where it lives (the
 * backend's init_normal): element i of the full tensor depends on its name
 * and i alone (see gpt.h), so slices of any TP size put together are the
 * TP=1 tensor. ones: the host's, at least numel of them. */
static mega_status init_tensor(mega_gpt_stage *s, const mega_param_info *pi, gpt_role role,
                               const float *ones, mega_err *err) {
  mega_backend *be = s->be;
  float *dst = s->param + pi->offset;
  if (is_bias(role) || role == R_LN1B || role == R_LN2B || role == R_LNFB) {
    be->ops->memset0(be, dst, pi->numel * sizeof *dst);
    return MEGA_OK;
  }
  if (is_norm(role))
    return be->ops->memcpy(be, dst, ones, pi->numel * sizeof *dst, MEGA_COPY_H2D, err);
  const mega_gpt_config *c = &s->cfg;
  const mega_gpt_tp *tp = &s->desc.tp;
  double std = c->init_std;
  if (role == R_PROJW || role == R_FCPROJW) std /= sqrt(2.0 * c->num_layers);
  size_t w = pi->numel, stride = pi->numel, off = 0; /* mega_tp_full_index's mapping */
  if (!mega_tp_split_replicated(&pi->tp) && tp->size > 1) {
    w = pi->tp.inner / (size_t)tp->size;
    stride = pi->tp.inner;
    off = (size_t)tp->rank * w;
  }
  be->ops->init_normal(be, dst, pi->numel, mega_rng_key(c->seed, pi->name), std, w, stride, off);
  return MEGA_OK;
}

/* Llama: RoPE's table, cos and sin of t * theta^(-2i/rot) for every
 * position t (computed in double, then rounded). */
static mega_status make_rope_table(mega_gpt_stage *s, mega_err *err) {
  int rot = mega_gpt_rot_dim(&s->cfg), T = s->cfg.max_seq_len, half = rot / 2;
  size_t n = (size_t)T * rot;
  float *host = malloc(n * sizeof *host);
  if (!host) return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for RoPE's table");
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double ang = t * pow((double)s->cfg.rope_theta, -2.0 * i / rot);
      host[(size_t)t * rot + i] = (float)cos(ang);
      host[(size_t)t * rot + half + i] = (float)sin(ang);
    }
  void *dev = NULL;
  mega_status st = s->be->ops->alloc(s->be, n * sizeof *host, &dev, err);
  if (st == MEGA_OK)
    st = s->be->ops->memcpy(s->be, dev, host, n * sizeof *host, MEGA_COPY_H2D, err);
  free(host);
  if (st != MEGA_OK) {
    s->be->ops->free(s->be, dev);
    mega_err_prefix(err, "gpt: RoPE's table");
    return st;
  }
  s->rope_cs = dev;
  return MEGA_OK;
}

mega_status mega_gpt_init_params(mega_gpt_stage *s, mega_err *err) {
  size_t most = 1; /* the norms' ones come from the host */
  for (int i = 0; i < s->nparams; i++)
    if (is_norm(s->role[i]) && s->params[i].numel > most) most = s->params[i].numel;
  float *ones = malloc(most * sizeof *ones);
  if (!ones) return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for init");
  for (size_t i = 0; i < most; i++) ones[i] = 1.0f;
  mega_status st = MEGA_OK;
  for (int i = 0; i < s->nparams && st == MEGA_OK; i++)
    st = init_tensor(s, &s->params[i], s->role[i], ones, err);
  free(ones);
  if (st == MEGA_OK) st = s->be->ops->synchronize(s->be, err);
  if (st != MEGA_OK) mega_err_prefix(err, "gpt: initialising the parameters");
  return st;
}

mega_status mega_gpt_stage_create(mega_backend *be, const mega_gpt_config *cfg,
                                  const mega_gpt_stage_desc *desc, mega_gpt_stage **out,
                                  mega_err *err) {
  mega_status st = mega_gpt_config_check(cfg, err);
  if (st) return st;
  if ((st = check_desc(cfg, desc, err))) return st;
  mega_gpt_stage *s = calloc(1, sizeof *s);
  /* at most 16 params and 6 units per block */
  int cap = 2 + 16 * desc->num_layers + 3, ucap = 6 * desc->num_layers + 3;
  mega_gpt_unit *fwd_units = calloc((size_t)ucap, sizeof *fwd_units);
  if (s) {
    s->params = calloc((size_t)cap, sizeof *s->params);
    s->role = calloc((size_t)cap, sizeof *s->role);
    s->role_layer = calloc((size_t)cap, sizeof *s->role_layer);
    s->layers = calloc((size_t)desc->num_layers + 1, sizeof *s->layers);
    s->units = calloc((size_t)ucap, sizeof *s->units);
  }
  if (!s || !s->params || !s->role || !s->role_layer || !s->layers || !s->units || !fwd_units) {
    free(fwd_units);
    mega_gpt_stage_destroy(s);
    return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory");
  }
  s->be = be;
  s->cfg = *cfg;
  s->desc = *desc;
  s->lay = gpt_llama(s) ? MEGA_W_OUT_IN : MEGA_W_IN_OUT;
  if (s->desc.tp.size < 1) s->desc.tp = (mega_gpt_tp){.size = 1};
  table t = {.p = s->params, .role = s->role, .role_layer = s->role_layer, .cap = cap,
             .units = fwd_units};
  build_table(s, &t);
  s->nparams = t.n;
  s->numel = t.off;
  derive_offsets(s);
  build_units(s, &t);
  free(fwd_units);
  if (gpt_llama(s) && desc->num_layers > 0 && (st = make_rope_table(s, err))) {
    mega_gpt_stage_destroy(s);
    return st;
  }
  void *p = NULL, *g = NULL;
  if ((st = be->ops->alloc(be, s->numel * sizeof(float), &p, err)) ||
      (st = be->ops->alloc(be, s->numel * sizeof(float), &g, err))) {
    be->ops->free(be, p);
    mega_gpt_stage_destroy(s);
    mega_err_prefix(err, "gpt: parameters");
    return st;
  }
  s->param = p;
  s->grad = g;
  if (desc->no_init) be->ops->memset0(be, s->param, s->numel * sizeof(float));
  else if ((st = mega_gpt_init_params(s, err))) {
    mega_gpt_stage_destroy(s);
    return st;
  }
  *out = s;
  return MEGA_OK;
}

void mega_gpt_stage_destroy(mega_gpt_stage *s) {
  if (!s) return;
  if (s->be && !s->borrowed) {
    s->be->ops->free(s->be, s->param);
    s->be->ops->free(s->be, s->grad);
  }
  if (s->rc_buf) s->be->ops->free(s->be, s->rc_buf);
  if (s->rope_cs) s->be->ops->free(s->be, s->rope_cs);
  free(s->params);
  free(s->role);
  free(s->role_layer);
  free(s->layers);
  free(s->units);
  free(s);
}

const mega_gpt_unit *mega_gpt_units(const mega_gpt_stage *s, int *count) {
  *count = s->nunits;
  return s->units;
}

void mega_gpt_on_grads_done(mega_gpt_stage *s, mega_gpt_grads_done_fn fn, void *arg) {
  s->grads_done = fn;
  s->grads_done_arg = arg;
}

void mega_gpt_on_params_needed(mega_gpt_stage *s, mega_gpt_grads_done_fn fn, void *arg) {
  s->params_needed = fn;
  s->params_needed_arg = arg;
}

mega_status mega_gpt_rebind(mega_gpt_stage *s, float *params, float *grads, size_t numel,
                            const size_t *offset, mega_err *err) {
  if (!params || !grads)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: rebind needs a param and a grad buffer");
  for (int i = 0; i < s->nparams; i++)
    if (offset[i] > numel || s->params[i].numel > numel - offset[i])
      return mega_fail(err, MEGA_ERR_INVALID,
                       "gpt: rebind puts %s at [%zu, %zu), past the buffer's %zu floats",
                       s->params[i].name, offset[i], offset[i] + s->params[i].numel, numel);
  for (int i = 0; i < s->nparams; i++) {
    mega_status st = s->be->ops->memcpy(s->be, params + offset[i], s->param + s->params[i].offset,
                                        s->params[i].numel * sizeof(float), MEGA_COPY_D2D, err);
    if (st) return st;
  }
  if (!s->borrowed) {
    s->be->ops->free(s->be, s->param);
    s->be->ops->free(s->be, s->grad);
  }
  s->borrowed = true;
  s->param = params;
  s->grad = grads;
  s->numel = numel;
  for (int i = 0; i < s->nparams; i++) s->params[i].offset = offset[i];
  derive_offsets(s);
  return MEGA_OK;
}

const mega_gpt_config *mega_gpt_stage_config(const mega_gpt_stage *s) { return &s->cfg; }
const mega_gpt_stage_desc *mega_gpt_stage_desc_get(const mega_gpt_stage *s) {
  return &s->desc;
}
mega_backend *mega_gpt_stage_backend(const mega_gpt_stage *s) { return s->be; }
const mega_gpt_tp *mega_gpt_stage_tp(const mega_gpt_stage *s) { return &s->desc.tp; }

int mega_gpt_stream_rows(const mega_gpt_stage *s, int B, int T) {
  return s->desc.tp.sequence_parallel ? B * T / s->desc.tp.size : B * T;
}

const mega_param_info *mega_gpt_params(const mega_gpt_stage *s, int *count) {
  *count = s->nparams;
  return s->params;
}

const mega_param_info *mega_gpt_param_find(const mega_gpt_stage *s, const char *name) {
  for (int i = 0; i < s->nparams; i++)
    if (strcmp(s->params[i].name, name) == 0) return &s->params[i];
  return NULL;
}

float *mega_gpt_param_data(mega_gpt_stage *s) { return s->param; }
float *mega_gpt_grad_data(mega_gpt_stage *s) { return s->grad; }
size_t mega_gpt_num_params(const mega_gpt_stage *s) { return s->numel; }

void mega_gpt_zero_grad(mega_gpt_stage *s) {
  s->be->ops->memset0(s->be, s->grad, s->numel * sizeof(float));
}

mega_status mega_gpt_load_safetensors(mega_gpt_stage *s, const mega_st_file *const *files,
                                      size_t nfiles, mega_err *err) {
  size_t maxn = 0;
  for (int i = 0; i < s->nparams; i++)
    if (s->params[i].full_numel > maxn) maxn = s->params[i].full_numel;
  float *host = malloc(maxn * sizeof *host), *slice = malloc(maxn * sizeof *slice);
  if (!host || !slice) {
    free(host);
    free(slice);
    return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for loading");
  }
  mega_status st = MEGA_OK;
  for (int i = 0; i < s->nparams && !st; i++) {
    const mega_param_info *pi = &s->params[i];
    const mega_st_file *f = NULL;
    const char *name = pi->name;
    for (size_t k = 0; k < nfiles && !f; k++)
      if (mega_st_find(files[k], name)) f = files[k];
    if (!f && pi->tied_copy)
      for (size_t k = 0; k < nfiles && !f; k++)
        if (mega_st_find(files[k], "lm_head.weight")) {
          f = files[k];
          name = "lm_head.weight";
        }
    if (!f) {
      st = mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "gpt: tensor %s is in none of the %zu checkpoint file(s)%s%s", pi->name,
                     nfiles, nfiles ? ", e.g. " : "", nfiles ? mega_st_path(files[0]) : "");
      break;
    }
    int64_t shape[2] = {pi->full_shape[0], pi->full_shape[1]};
    st = mega_st_read_f32(f, name, host, pi->full_numel, shape, pi->ndim, err);
    if (!st) mega_tp_cut(&pi->tp, s->desc.tp.size, s->desc.tp.rank, host, slice);
    if (!st)
      st = s->be->ops->memcpy(s->be, s->param + pi->offset, slice, pi->numel * sizeof *host,
                              MEGA_COPY_H2D, err);
  }
  free(host);
  free(slice);
  return st;
}

mega_status mega_gpt_save_safetensors(mega_gpt_stage *s, const char *path, mega_err *err) {
  if (s->desc.tp.size > 1) /* whole tensors need the group: worker/rank/rank_tp.c gathers them */
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "gpt: a stage saves alone only without tensor parallelism");
  float *host = malloc(s->numel * sizeof *host);
  mega_st_tensor *ts = calloc((size_t)s->nparams, sizeof *ts);
  mega_status st = MEGA_OK;
  if (!host || !ts) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for saving");
    goto done;
  }
  if ((st = s->be->ops->memcpy(s->be, host, s->param, s->numel * sizeof *host,
                               MEGA_COPY_D2H, err)))
    goto done;
  for (int i = 0; i < s->nparams; i++) {
    const mega_param_info *pi = &s->params[i];
    ts[i].name = pi->name;
    ts[i].ndim = pi->ndim;
    ts[i].shape[0] = pi->shape[0];
    ts[i].shape[1] = pi->shape[1];
    ts[i].numel = pi->numel;
    ts[i].data = host + pi->offset;
  }
  st = mega_st_write(path, ts, (size_t)s->nparams, NULL, 0, err);
done:
  free(host);
  free(ts);
  return st;
}
