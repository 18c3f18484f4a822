/* trainer_state.json, as a checkpoint is written: where training stands,
 * the LR schedule it used, the job's flags (config.json is
 * ckpt_config.c's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"
#include "worker/ckpt/ckpt_internal.h"

json_t *mega_ckpt_state_json(const mega_ckpt_state *s, const mega_jobspec *job,
                             bool has_optimizer_state) {
  json_t *js = json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:i, s:b}", "format",
                         MEGA_CKPT_STATE_FORMAT, "version", MEGA_CKPT_STATE_VERSION,
                         MEGA_CKPT_VERSION_KEY, mega_version(), "iteration", (json_int_t)s->iteration,
                         "consumed_samples", (json_int_t)s->consumed_samples, "optimizer_steps",
                         (json_int_t)s->optimizer_steps, "attempt", s->attempt,
                         "has_optimizer_state", has_optimizer_state);
  if (js && s->consumed_valid_samples >= 0 &&
      json_object_set_new(js, "consumed_valid_samples",
                          json_integer((json_int_t)s->consumed_valid_samples))) {
    json_decref(js);
    return NULL;
  }
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

