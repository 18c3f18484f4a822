#include "worker/optim/lr_sched.h"

#include <math.h>
#include <string.h>

const char *mega_lr_style_name(mega_lr_style s) {
  static const char *const names[] = {"constant", "linear", "cosine", "inverse-square-root",
                                      "WSD"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

const char *mega_wsd_style_name(mega_wsd_style s) {
  static const char *const names[] = {"exponential", "linear", "cosine", "minus_sqrt"};
  return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

mega_status mega_lr_sched_check(const mega_lr_sched *s, mega_err *err) {
  if (!(s->lr >= 0.0) || !isfinite(s->lr))
    return mega_fail(err, MEGA_ERR_INVALID, "--lr must be a finite number >= 0 (got %g)", s->lr);
  if (!(s->min_lr >= 0.0) || s->min_lr > s->lr)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--min-lr must be between 0 and --lr (got %g with --lr %g)", s->min_lr, s->lr);
  if (!(s->init_lr >= 0.0) || s->init_lr > s->lr)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--lr-warmup-init must be between 0 and --lr (got %g with --lr %g)",
                     s->init_lr, s->lr);
  if (!(s->warmup >= 0) || !isfinite(s->warmup))
    return mega_fail(err, MEGA_ERR_INVALID, "the LR warmup must be >= 0 (got %g)", s->warmup);
  if ((unsigned)s->style > MEGA_LR_WSD || (unsigned)s->wsd_style > MEGA_WSD_MINUS_SQRT)
    return mega_fail(err, MEGA_ERR_INVALID, "unknown --lr-decay-style");
  if (s->style != MEGA_LR_CONSTANT && !(s->decay > s->warmup))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the LR decay (%g samples) must exceed the warmup (%g samples) for %s decay",
                     s->decay, s->warmup, mega_lr_style_name(s->style));
  if (s->style == MEGA_LR_WSD && !(s->wsd_decay > 0))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "WSD needs the length of its anneal (--lr-wsd-decay-iters or -samples)");
  return MEGA_OK;
}

/* WSD's anneal coefficient at fraction q of it. */
static double wsd_coeff(mega_wsd_style st, double q) {
  switch (st) {
  case MEGA_WSD_LINEAR: return 1.0 - q;
  case MEGA_WSD_COSINE: return 0.5 * (cos(M_PI * q) + 1.0);
  case MEGA_WSD_MINUS_SQRT: return 1.0 - sqrt(q);
  case MEGA_WSD_EXPONENTIAL: break;
  }
  return 2.0 * pow(0.5, q) - 1.0;
}

double mega_lr_at(const mega_lr_sched *s, double n) {
  if (s->warmup > 0 && n <= s->warmup)
    return s->init_lr + (s->lr - s->init_lr) * n / s->warmup;
  if (s->style == MEGA_LR_CONSTANT) return s->lr;
  if (n > s->decay) return s->min_lr;
  if (s->style == MEGA_LR_INVERSE_SQRT) {
    double w = s->warmup > 1 ? s->warmup : 1, m = n > 1 ? n : 1;
    double lr = s->lr * sqrt(w) / sqrt(m);
    return lr > s->min_lr ? lr : s->min_lr;
  }
  double r = (n - s->warmup) / (s->decay - s->warmup), coeff;
  if (s->style == MEGA_LR_LINEAR) {
    coeff = 1.0 - r;
  } else if (s->style == MEGA_LR_COSINE) {
    coeff = 0.5 * (cos(M_PI * r) + 1.0);
  } else {
    double start = s->decay - s->wsd_decay;
    coeff = n <= start ? 1.0 : wsd_coeff(s->wsd_style, (n - start) / s->wsd_decay);
  }
  return s->min_lr + coeff * (s->lr - s->min_lr);
}

mega_lr_sched mega_lr_sched_from_job(const mega_jobspec *s) {
  mega_lr_samples l;
  mega_jobspec_lr_samples(s, &l);
  return (mega_lr_sched){
      .lr = s->lr,
      .min_lr = s->min_lr,
      .init_lr = s->lr_warmup_init,
      .warmup = l.warmup,
      .decay = l.decay,
      .wsd_decay = l.wsd_decay,
      .style = (mega_lr_style)s->lr_decay_style,
      .wsd_style = (mega_wsd_style)s->lr_wsd_decay_style,
  };
}
