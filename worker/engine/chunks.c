#include "worker/engine/chunks.h"

#include <stdlib.h>
#include <string.h>

#include "core/schedule.h"

mega_status mega_chunks_config(const mega_jobspec *job, mega_gpt_config *cfg, mega_err *err) {
  mega_gpt_config_default(cfg);
  cfg->vocab_size = mega_jobspec_padded_vocab(job); /* Megatron pads wte's rows */
  cfg->max_seq_len = mega_jobspec_max_position_embeddings(job);
  cfg->num_layers = job->num_layers;
  cfg->num_heads = job->num_attention_heads;
  cfg->channels = job->hidden_size;
  cfg->init_std = (float)job->init_method_std;
  cfg->ln_eps = (float)job->norm_epsilon;
  cfg->seed = (uint64_t)job->seed;
  cfg->arch = mega_jobspec_llama(job) ? MEGA_GPT_ARCH_LLAMA : MEGA_GPT_ARCH_GPT2;
  cfg->num_kv_heads = mega_jobspec_query_groups(job);
  cfg->head_dim = mega_jobspec_kv_channels(job);
  cfg->ffn_hidden = mega_jobspec_ffn_hidden_size(job);
  cfg->untied = job->untie_embeddings_and_output_weights;
  cfg->no_bias = job->disable_bias_linear;
  cfg->gelu_erf = mega_jobspec_gelu_erf(job);
  cfg->rope_theta = (float)job->rotary_base;
  cfg->rotary_percent = job->rotary_percent;
  cfg->hidden_dropout = job->hidden_dropout;
  cfg->attention_dropout = job->attention_dropout;
  return mega_gpt_config_check(cfg, err);
}

/* The job's recomputation flags, per model chunk as Megatron applies them;
 * zero-bubble runs the backward halves apart. */
static void stage_recompute(const mega_jobspec *job, mega_gpt_stage_desc *d) {
  mega_sched_params p;
  mega_jobspec_sched_params(job, 0, &p);
  d->split_backward = p.kind == MEGA_SCHED_ZB_H1;
  if (job->recompute_granularity == MEGA_RECOMPUTE_SELECTIVE) {
    d->recompute = MEGA_GPT_RECOMPUTE_SELECTIVE;
  } else if (job->recompute_granularity == MEGA_RECOMPUTE_FULL) {
    d->recompute = job->recompute_method == MEGA_RECOMPUTE_BLOCK ? MEGA_GPT_RECOMPUTE_BLOCK
                                                                 : MEGA_GPT_RECOMPUTE_UNIFORM;
    d->recompute_layers = job->recompute_num_layers;
  }
}

static mega_status stage_desc(const mega_jobspec *job, const mega_layout *l, int pp_rank,
                              int chunk, const mega_gpt_tp *tp, mega_gpt_stage_desc *d,
                              mega_err *err) {
  if (mega_layout_count(l, pp_rank, chunk, MEGA_LAYER_MTP) > 0)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "layout: stage (pp %d, vp %d) has multi-token prediction layers ('m'), "
                     "which mega's GPT does not have", pp_rank, chunk);
  *d = (mega_gpt_stage_desc){
      .embedding = mega_layout_count(l, pp_rank, chunk, MEGA_LAYER_EMBEDDING) > 0,
      .loss = mega_layout_count(l, pp_rank, chunk, MEGA_LAYER_LOSS) > 0,
      .first_layer = mega_layout_offset(l, pp_rank, chunk, MEGA_LAYER_DECODER),
      .num_layers = mega_layout_count(l, pp_rank, chunk, MEGA_LAYER_DECODER),
      .tp = tp ? *tp : (mega_gpt_tp){.size = 1},
      .no_gelu_fusion = job->no_bias_gelu_fusion};
  stage_recompute(job, d);
  return MEGA_OK;
}

static mega_status build_views(mega_chunks *c, mega_err *err) {
  size_t total = 0;
  for (int v = 0; v < c->vp; v++) {
    int n = 0;
    mega_gpt_params(c->stages[v], &n);
    total += (size_t)n;
  }
  c->ranges = calloc(total + 1, sizeof *c->ranges);
  c->ckpt = calloc(total + 1, sizeof *c->ckpt);
  c->tied_copy = calloc(total + 1, sizeof *c->tied_copy);
  if (!c->ranges || !c->ckpt || !c->tied_copy)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for %zu parameter views", total);
  size_t k = 0;
  for (int v = 0; v < c->vp; v++) {
    int n = 0;
    const mega_param_info *info = mega_gpt_params(c->stages[v], &n);
    float *p = mega_gpt_param_data(c->stages[v]), *g = mega_gpt_grad_data(c->stages[v]);
    for (int i = 0; i < n; i++, k++) {
      c->ranges[k] = (mega_optim_range){.params = p + info[i].offset,
                                        .grads = g + info[i].offset,
                                        .numel = info[i].numel, .decay = info[i].decay};
      mega_ckpt_param *cp = &c->ckpt[k];
      const mega_gpt_tp *tp = mega_gpt_stage_tp(c->stages[v]);
      cp->name = info[i].name;
      cp->ndim = info[i].ndim;
      for (int d = 0; d < info[i].ndim; d++) cp->shape[d] = info[i].full_shape[d];
      cp->numel = info[i].full_numel;
      cp->tp_size = tp->size;
      cp->tp_rank = tp->rank;
      cp->tp = info[i].tp;
      cp->local_numel = info[i].numel;
      cp->param = p + info[i].offset;
      c->tied_copy[k] = info[i].tied_copy;
      if (info[i].tied_embedding) {
        c->wte_grad = g + info[i].offset;
        c->wte_numel = info[i].numel;
      }
    }
  }
  c->nparams = total;
  return MEGA_OK;
}

mega_status mega_chunks_build(mega_chunks *c, mega_backend *be, const mega_jobspec *job,
                              const mega_layout *layout, int pp_rank, const mega_gpt_tp *tp,
                              const mega_grads_opts *grads, bool no_init, mega_err *err) {
  *c = (mega_chunks){.vp = layout->vp};
  mega_status st = mega_chunks_config(job, &c->cfg, err);
  if (st != MEGA_OK) return st;
  c->stages = calloc((size_t)c->vp, sizeof *c->stages);
  if (!c->stages) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for %d chunks", c->vp);
  for (int v = 0; v < c->vp && st == MEGA_OK; v++) {
    mega_gpt_stage_desc d;
    st = stage_desc(job, layout, pp_rank, v, tp, &d, err);
    d.no_init = no_init;
    if (st == MEGA_OK) st = mega_gpt_stage_create(be, &c->cfg, &d, &c->stages[v], err);
  }
  if (st == MEGA_OK) st = mega_grads_create(be, c->stages, c->vp, grads, &c->grads, err);
  if (st == MEGA_OK) st = build_views(c, err);
  if (st != MEGA_OK) mega_chunks_free(c);
  return st;
}

void mega_chunks_bind_optim(mega_chunks *c, mega_optim *o) {
  for (size_t k = 0; k < c->nparams; k++) {
    c->ckpt[k].exp_avg = mega_optim_exp_avg(o, k);
    c->ckpt[k].exp_avg_sq = mega_optim_exp_avg_sq(o, k);
  }
}

void mega_chunks_point_moments(mega_chunks *c, float *const *exp_avg, float *const *exp_avg_sq) {
  size_t k = 0;
  for (int v = 0; v < c->vp; v++) {
    int n = 0;
    const mega_param_info *info = mega_gpt_params(c->stages[v], &n);
    for (int i = 0; i < n; i++, k++) {
      c->ckpt[k].exp_avg = exp_avg ? exp_avg[v] + info[i].offset : NULL;
      c->ckpt[k].exp_avg_sq = exp_avg_sq ? exp_avg_sq[v] + info[i].offset : NULL;
    }
  }
}

void mega_chunks_free(mega_chunks *c) {
  mega_grads_destroy(c->grads); /* first: it unhooks itself from the stages */
  if (c->stages)
    for (int v = 0; v < c->vp; v++) mega_gpt_stage_destroy(c->stages[v]);
  free(c->stages);
  free(c->ranges);
  free(c->ckpt);
  free(c->tied_copy);
  *c = (mega_chunks){0};
}
