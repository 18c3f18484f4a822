#include "tiny_model.h"

#include <stdlib.h>
#include <string.h>

#include "worker/backend/backend.h"

bool tu_model_make(tu_model *m, uint64_t seed, int layers, double weight_decay) {
  mega_gpt_config cfg;
  mega_gpt_config_default(&cfg);
  cfg.max_seq_len = 8;
  cfg.num_layers = layers;
  cfg.num_heads = 2;
  cfg.channels = 16;
  cfg.seed = seed;
  return tu_model_make_cfg(m, &cfg, weight_decay);
}

bool tu_model_make_cfg(tu_model *m, const mega_gpt_config *cfg, double weight_decay) {
  memset(m, 0, sizeof *m);
  mega_err err = {0};
  if (mega_backend_cpu_create(NULL, &m->be, &err) != MEGA_OK) return false;
  m->cfg = *cfg;
  uint64_t seed = cfg->seed;
  int layers = cfg->num_layers;
  mega_gpt_stage_desc d = {.embedding = true, .loss = true, .first_layer = 0,
                           .num_layers = layers};
  if (mega_gpt_stage_create(m->be, &m->cfg, &d, &m->s, &err) != MEGA_OK) goto fail;
  int count;
  const mega_param_info *pi = mega_gpt_params(m->s, &count);
  float *p = mega_gpt_param_data(m->s), *g = mega_gpt_grad_data(m->s);
  for (size_t i = 0; i < mega_gpt_num_params(m->s); i++)
    g[i] = (float)((i * 2654435761u + seed) % 1000) / 1000.0f - 0.5f;
  mega_optim_range *r = calloc((size_t)count, sizeof *r);
  m->cp = calloc((size_t)count, sizeof *m->cp);
  m->n = (size_t)count;
  if (!r || !m->cp) {
    free(r);
    goto fail;
  }
  for (int i = 0; i < count; i++)
    r[i] = (mega_optim_range){p + pi[i].offset, g + pi[i].offset, pi[i].numel, pi[i].decay};
  mega_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                           .weight_decay = weight_decay, .clip_grad = 1.0};
  mega_status st = mega_optim_create(m->be, r, m->n, &hp, &m->o, &err);
  free(r);
  double ss;
  if (st != MEGA_OK || mega_optim_grad_sumsq(m->o, &ss, &err) != MEGA_OK ||
      mega_optim_step(m->o, ss, 1e-3, NULL, &err) != MEGA_OK)
    goto fail;
  for (int i = 0; i < count; i++)
    m->cp[i] = (mega_ckpt_param){.name = pi[i].name, .ndim = pi[i].ndim,
                                 .shape = {pi[i].shape[0], pi[i].shape[1]},
                                 .numel = pi[i].numel, .param = p + pi[i].offset,
                                 .exp_avg = mega_optim_exp_avg(m->o, (size_t)i),
                                 .exp_avg_sq = mega_optim_exp_avg_sq(m->o, (size_t)i)};
  return true;
fail:
  tu_model_free(m);
  return false;
}

void tu_model_free(tu_model *m) {
  mega_optim_destroy(m->o);
  mega_gpt_stage_destroy(m->s);
  mega_backend_destroy(m->be);
  free(m->cp);
  memset(m, 0, sizeof *m);
}
