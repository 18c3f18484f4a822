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
                           .seed = 1337};
}

mega_status mega_gpt_config_check(const mega_gpt_config *c, mega_err *err) {
  if (c->vocab_size < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: vocab_size must be >= 1, got %d",
                     c->vocab_size);
  if (c->max_seq_len < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: max_seq_len must be >= 1, got %d",
                     c->max_seq_len);
  if (c->num_layers < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: num_layers must be >= 1, got %d",
                     c->num_layers);
  if (c->num_heads < 1 || c->channels < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_heads (%d) and channels (%d) must be >= 1", c->num_heads,
                     c->channels);
  if (c->channels % c->num_heads != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: num_heads (%d) must divide channels (%d); pick a head count "
                     "that divides the hidden size",
                     c->num_heads, c->channels);
  /* Every tensor, activations included, must index in int and size_t. */
  if ((int64_t)c->channels * 4 > (1 << 24) || (int64_t)c->vocab_size > (1 << 24) ||
      (int64_t)c->max_seq_len > (1 << 20))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: sizes too large (channels %d, vocab %d, max_seq_len %d)",
                     c->channels, c->vocab_size, c->max_seq_len);
  if (!(c->init_std >= 0.0f) || !isfinite(c->init_std))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: init_std must be finite and >= 0, got %g",
                     (double)c->init_std);
  if (!(c->ln_eps > 0.0f) || !isfinite(c->ln_eps))
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: ln_eps must be finite and > 0, got %g",
                     (double)c->ln_eps);
  return MEGA_OK;
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
  if (d->recompute < MEGA_GPT_RECOMPUTE_NONE || d->recompute > MEGA_GPT_RECOMPUTE_SELECTIVE)
    return mega_fail(err, MEGA_ERR_INVALID, "gpt: unknown recompute mode %d", (int)d->recompute);
  bool full = d->recompute == MEGA_GPT_RECOMPUTE_UNIFORM || d->recompute == MEGA_GPT_RECOMPUTE_BLOCK;
  if (full && d->recompute_layers < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "gpt: full recomputation needs recompute_layers >= 1, got %d",
                     d->recompute_layers);
  return MEGA_OK;
}

typedef struct table {
  mega_param_info *p;
  int n, cap;
  size_t off;
} table;

/* How a tensor splits over TP ranks (tp_split.h). */
typedef enum { REPL, ROWS, COLS, QKV } split_kind;

/* Adds the full tensor [d0, d1] (d1 0: 1-D) as this rank's slice of it. */
static size_t add(table *t, const mega_gpt_tp *tp, const char *name, int d0, int d1,
                  split_kind k, bool decay, bool tied) {
  mega_param_info *pi = &t->p[t->n++];
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
  pi->sp_partial = tp->sequence_parallel && n > 1 && strstr(name, "ln_") != NULL;
  /* 16-float alignment keeps every tensor on a cache line. */
  pi->offset = t->off;
  t->off += (pi->numel + 15) / 16 * 16;
  pi->decay = decay;
  pi->tied_copy = tied;
  return pi->offset;
}

#define LAYER_PARAMS 12

/* The named offsets (s->wte, s->layers[l].qkvw, ...) from the table, which
 * lists them in this same order. */
static void derive_offsets(mega_gpt_stage *s) {
  const mega_param_info *p = s->params;
  int k = 0;
  s->wte = s->wpe = s->lnfw = s->lnfb = s->head = GPT_NO_OFF;
  if (s->desc.embedding) {
    s->wte = p[k++].offset;
    s->wpe = p[k++].offset;
  }
  for (int i = 0; i < s->desc.num_layers; i++) {
    gpt_layer_off *o = &s->layers[i];
    size_t *f[LAYER_PARAMS] = {&o->ln1w, &o->ln1b, &o->qkvw,   &o->qkvb, &o->projw, &o->projb,
                               &o->ln2w, &o->ln2b, &o->fcw,    &o->fcb,  &o->fcprojw,
                               &o->fcprojb};
    for (int j = 0; j < LAYER_PARAMS; j++) *f[j] = p[k++].offset;
  }
  if (s->desc.loss) {
    s->lnfw = p[k++].offset;
    s->lnfb = p[k++].offset;
    s->head = s->desc.embedding ? s->wte : p[k++].offset;
  }
}

static void build_table(mega_gpt_stage *s, table *t) {
  const mega_gpt_config *c = &s->cfg;
  const mega_gpt_tp *tp = &s->desc.tp;
  int C = c->channels, V = c->vocab_size;
  char nm[64];
  if (s->desc.embedding) {
    add(t, tp, "transformer.wte.weight", V, C, ROWS, true, false);
    add(t, tp, "transformer.wpe.weight", c->max_seq_len, C, REPL, true, false);
  }
  for (int i = 0; i < s->desc.num_layers; i++) {
    int l = s->desc.first_layer + i;
#define P(suffix, d0, d1, split, decay)                                   \
  snprintf(nm, sizeof nm, "transformer.h.%d.%s", l, suffix);             \
  add(t, tp, nm, d0, d1, split, decay, false)
    /* in derive_offsets' order; c_attn and c_fc are column-parallel,
     * the two c_proj row-parallel (their biases replicated) */
    P("ln_1.weight", C, 0, REPL, false);
    P("ln_1.bias", C, 0, REPL, false);
    P("attn.c_attn.weight", C, 3 * C, QKV, true);
    P("attn.c_attn.bias", 3 * C, 0, QKV, false);
    P("attn.c_proj.weight", C, C, ROWS, true);
    P("attn.c_proj.bias", C, 0, REPL, false);
    P("ln_2.weight", C, 0, REPL, false);
    P("ln_2.bias", C, 0, REPL, false);
    P("mlp.c_fc.weight", C, 4 * C, COLS, true);
    P("mlp.c_fc.bias", 4 * C, 0, ROWS, false);
    P("mlp.c_proj.weight", 4 * C, C, ROWS, true);
    P("mlp.c_proj.bias", C, 0, REPL, false);
#undef P
  }
  if (s->desc.loss) {
    add(t, tp, "transformer.ln_f.weight", C, 0, REPL, false, false);
    add(t, tp, "transformer.ln_f.bias", C, 0, REPL, false, false);
    if (!s->desc.embedding) add(t, tp, "transformer.wte.weight", V, C, ROWS, true, true);
  }
}

/* The units in backward order (gpt.h). */
static void build_units(mega_gpt_stage *s) {
  int n = 0, emb = s->desc.embedding ? 2 : 0, L = s->desc.num_layers, np = s->nparams;
  mega_gpt_unit *u = s->units;
  if (s->desc.loss) {
    if (!s->desc.embedding) u[n++] = (mega_gpt_unit){.first = np - 1, .count = 1, .layer = -1};
    int lnf = s->desc.embedding ? np - 2 : np - 3;
    u[n++] = (mega_gpt_unit){.first = lnf, .count = 2, .layer = -1};
  }
  /* Within a block the table is ln_1, c_attn, c_proj, ln_2, c_fc,
   * mlp.c_proj (weight and bias each); backward goes the other way. */
  for (int l = L - 1; l >= 0; l--)
    for (int k = LAYER_PARAMS - 2; k >= 0; k -= 2)
      u[n++] = (mega_gpt_unit){.first = emb + LAYER_PARAMS * l + k, .count = 2, .layer = l};
  if (s->desc.embedding) u[n++] = (mega_gpt_unit){.first = 0, .count = 2, .layer = -1};
  for (int i = 0; i < n; i++)
    for (int k = 0; k < u[i].count; k++) u[i].numel += s->params[u[i].first + k].numel;
  s->nunits = n;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The init of this rank's slice of a tensor: element i of the full tensor
 * depends on its name and i alone (see gpt.h), so slices of any TP size
 * put together are the TP=1 tensor. */
static void init_tensor(const mega_gpt_config *c, const mega_gpt_tp *tp,
                        const mega_param_info *pi, float *dst) {
  if (ends_with(pi->name, ".bias")) {
    memset(dst, 0, pi->numel * sizeof *dst);
    return;
  }
  if (strstr(pi->name, ".ln_")) {
    for (size_t i = 0; i < pi->numel; i++) dst[i] = 1.0f;
    return;
  }
  double std = c->init_std;
  if (ends_with(pi->name, "attn.c_proj.weight") || ends_with(pi->name, "mlp.c_proj.weight"))
    std /= sqrt(2.0 * c->num_layers);
  uint64_t key = mega_rng_key(c->seed, pi->name);
  for (size_t i = 0; i < pi->numel; i++)
    dst[i] = (float)(std * mega_rng_normal(key, mega_tp_full_index(&pi->tp, tp->size, tp->rank, i)));
}

mega_status mega_gpt_init_params(mega_gpt_stage *s, mega_err *err) {
  float *host = malloc(s->numel * sizeof *host);
  if (!host) return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory for init");
  memset(host, 0, s->numel * sizeof *host);
  for (int i = 0; i < s->nparams; i++)
    init_tensor(&s->cfg, &s->desc.tp, &s->params[i], host + s->params[i].offset);
  mega_status st = s->be->ops->memcpy(s->be, s->param, host, s->numel * sizeof *host,
                                      MEGA_COPY_H2D, err);
  free(host);
  return st;
}

mega_status mega_gpt_stage_create(mega_backend *be, const mega_gpt_config *cfg,
                                  const mega_gpt_stage_desc *desc, mega_gpt_stage **out,
                                  mega_err *err) {
  mega_status st = mega_gpt_config_check(cfg, err);
  if (st) return st;
  if ((st = check_desc(cfg, desc, err))) return st;
  mega_gpt_stage *s = calloc(1, sizeof *s);
  int cap = 2 + LAYER_PARAMS * desc->num_layers + 3;
  if (s) {
    s->params = calloc((size_t)cap, sizeof *s->params);
    s->layers = calloc((size_t)desc->num_layers + 1, sizeof *s->layers);
    s->units = calloc((size_t)LAYER_PARAMS / 2 * desc->num_layers + 3, sizeof *s->units);
  }
  if (!s || !s->params || !s->layers || !s->units) {
    mega_gpt_stage_destroy(s);
    return mega_fail(err, MEGA_ERR_NOMEM, "gpt: out of memory");
  }
  s->be = be;
  s->cfg = *cfg;
  s->desc = *desc;
  if (s->desc.tp.size < 1) s->desc.tp = (mega_gpt_tp){.size = 1};
  table t = {.p = s->params, .cap = cap};
  build_table(s, &t);
  s->nparams = t.n;
  s->numel = t.off;
  derive_offsets(s);
  build_units(s);
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
  free(s->params);
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
