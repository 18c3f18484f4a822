#include "worker/optim/lr_sched.h"

#include <math.h>
#include <string.h>

static const char *style_name(mega_lr_style s) {
  return s == MEGA_LR_COSINE ? "cosine" : s == MEGA_LR_LINEAR ? "linear" : "constant";
}

mega_status mega_lr_sched_check(const mega_lr_sched *s, mega_err *err) {
  if (!(s->lr >= 0.0) || !isfinite(s->lr))
    return mega_fail(err, MEGA_ERR_INVALID, "--lr must be a finite number >= 0 (got %g)", s->lr);
  if (!(s->min_lr >= 0.0) || s->min_lr > s->lr)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--min-lr must be between 0 and --lr (got %g with --lr %g)", s->min_lr, s->lr);
  if (s->warmup_iters < 0)
    return mega_fail(err, MEGA_ERR_INVALID, "--lr-warmup-iters must be >= 0");
  if (s->style != MEGA_LR_CONSTANT && s->style != MEGA_LR_LINEAR && s->style != MEGA_LR_COSINE)
    return mega_fail(err, MEGA_ERR_INVALID, "unknown --lr-decay-style");
  if (s->style != MEGA_LR_CONSTANT && s->decay_iters <= s->warmup_iters)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--lr-decay-iters (%lld) must exceed --lr-warmup-iters (%lld) for %s decay",
                     (long long)s->decay_iters, (long long)s->warmup_iters,
                     style_name(s->style));
  return MEGA_OK;
}

double mega_lr_at(const mega_lr_sched *s, int64_t it) {
  if (s->warmup_iters > 0 && it <= s->warmup_iters)
    return s->lr * (double)it / (double)s->warmup_iters;
  if (s->style == MEGA_LR_CONSTANT) return s->lr;
  if (it > s->decay_iters) return s->min_lr;
  double span = (double)(s->decay_iters - s->warmup_iters);
  double r = span > 0 ? (double)(it - s->warmup_iters) / span : 1.0;
  double coeff = s->style == MEGA_LR_LINEAR ? 1.0 - r : 0.5 * (cos(M_PI * r) + 1.0);
  return s->min_lr + coeff * (s->lr - s->min_lr);
}

mega_lr_sched mega_lr_sched_from_job(const mega_jobspec *s) {
  return (mega_lr_sched){
      .lr = s->lr,
      .min_lr = s->min_lr,
      .warmup_iters = s->lr_warmup_iters,
      .decay_iters = mega_jobspec_lr_decay_iters(s),
      .style = (mega_lr_style)s->lr_decay_style,
  };
}
