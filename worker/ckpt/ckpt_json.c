/* The two JSON files of a checkpoint as it is written: config.json (Hugging
 * Face's GPT2LMHeadModel) and trainer_state.json (where training stands,
 * the LR schedule it used, the job's flags). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/ckpt_internal.h"

/* A float as the shortest decimal that reads back as it, so 1e-5f is
 * written 1e-05 rather than 9.99999974738e-06. */
static double tidy(float x) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.9g", (double)x);
  for (int prec = 1; prec <= 9; prec++) {
    char b2[32];
    snprintf(b2, sizeof b2, "%.*g", prec, (double)x);
    if (strtof(b2, NULL) == x) return strtod(b2, NULL);
  }
  return strtod(buf, NULL);
}

json_t *mega_ckpt_config_json(const mega_gpt_config *cfg) {
  json_t *archs = json_pack("[s]", "GPT2LMHeadModel");
  return json_pack(
      "{s:o, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:f, s:s, s:b, s:f, s:f, s:f, s:f, s:s}",
      "architectures", archs, "model_type", "gpt2", "vocab_size", cfg->vocab_size,
      "n_positions", cfg->max_seq_len, "n_ctx", cfg->max_seq_len, "n_embd", cfg->channels,
      "n_layer", cfg->num_layers, "n_head", cfg->num_heads, "n_inner", "layer_norm_epsilon",
      tidy(cfg->ln_eps), "activation_function", "gelu_new", "tie_word_embeddings", 1,
      "initializer_range", tidy(cfg->init_std),
      /* no dropout in mega, so an HF model in train mode computes the same */
      "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0, "torch_dtype", "float32");
}

json_t *mega_ckpt_state_json(const mega_ckpt_state *s, const mega_jobspec *job,
                             bool has_optimizer_state) {
  json_t *js = json_pack("{s:s, s:i, s:I, s:I, s:I, s:i, s:b}", "format", MEGA_CKPT_STATE_FORMAT,
                         "version", MEGA_CKPT_STATE_VERSION, "iteration", (json_int_t)s->iteration,
                         "consumed_samples", (json_int_t)s->consumed_samples, "optimizer_steps",
                         (json_int_t)s->optimizer_steps, "attempt", s->attempt,
                         "has_optimizer_state", has_optimizer_state);
  if (js && s->has_sched) {
    /* Megatron's OptimizerParamScheduler state: what a resume checks */
    const mega_lr_sched *l = &s->sched;
    json_t *lj = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:s}", "lr", l->lr, "min_lr",
                           l->min_lr, "warmup_init", l->init_lr, "warmup_samples", l->warmup,
                           "decay_samples", l->decay, "wsd_decay_samples", l->wsd_decay,
                           "decay_style", mega_lr_style_name(l->style), "wsd_decay_style",
                           mega_wsd_style_name(l->wsd_style));
    if (!lj || json_object_set_new(js, "lr_schedule", lj)) {
      json_decref(js);
      return NULL;
    }
  }
  if (js && job) {
    json_t *jj = mega_jobspec_to_json(job);
    if (!jj || json_object_set_new(js, "job", jj)) {
      json_decref(js);
      return NULL;
    }
  }
  return js;
}

