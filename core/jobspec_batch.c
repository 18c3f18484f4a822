/* How many samples each iteration takes: a constant --global-batch-size, or
 * Megatron's --rampup-batch-size START INCR SAMPLES, and with it how many
 * iterations --train-samples means.
 *
 * Megatron's rule (RampupBatchsizeNumMicroBatchesCalculator, before it was
 * replaced by step schedules): with n = (G - START) / INCR increments of
 * SAMPLES / n samples each, after c consumed samples the global batch is
 *
 *   G                                      when c > SAMPLES
 *   START + INCR * floor(c / (SAMPLES / n))  otherwise (in doubles, as Python)
 *
 * and iteration i takes batch(c_i) samples, c_0 = 0, c_{i+1} = c_i +
 * batch(c_i). The batch is monotone in c, so the iterations fall in runs of
 * one batch size (at most n + 1 runs): walking the runs, with a search for
 * each run's end, gives c_i and the batch of any iteration in O(n log) steps
 * without replaying every iteration. */
#include "core/jobspec.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"

static bool whole(const char *w, long long *out) {
  char *end;
  errno = 0;
  long long x = strtoll(w, &end, 10);
  if (end == w || *end || errno) return false;
  *out = x;
  return true;
}

bool mega_jobspec_rampup(const mega_jobspec *s, int64_t out[3]) {
  const mega_strlist *l = &s->rampup_batch_size;
  long long v[3];
  if (l->n != 3 || !whole(l->v[0], &v[0]) || !whole(l->v[1], &v[1]) || !whole(l->v[2], &v[2]) ||
      v[0] < 1 || v[1] < 1 || v[2] < 1 || v[2] > (1LL << 40) || v[0] >= s->global_batch_size ||
      (s->global_batch_size - v[0]) % v[1] || (s->global_batch_size - v[0]) / v[1] > 65536)
    return false;
  for (int k = 0; k < 3; k++) out[k] = v[k];
  return true;
}

int mega_jobspec_batch_at(const mega_jobspec *s, int64_t consumed) {
  int64_t r[3];
  int G = s->global_batch_size;
  if (!mega_jobspec_rampup(s, r) || consumed > r[2]) return G;
  int64_t n = (G - r[0]) / r[1];
  double per = (double)r[2] / (double)n;
  int64_t steps = (int64_t)((double)consumed / per);
  int64_t b = r[0] + steps * r[1];
  return b < G ? (int)b : G; /* Megatron asserts it never passes G */
}

/* A run of iterations of one batch size: iterations [it, it + n) take b
 * samples each, the first starting after c samples. n is 0 for the last
 * run (it never ends). */
typedef struct run {
  int64_t it, c, n;
  int b;
} run;

/* The run that starts at iteration it after c samples. */
static run run_at(const mega_jobspec *s, int64_t it, int64_t c) {
  run r = {.it = it, .c = c, .b = mega_jobspec_batch_at(s, c)};
  if (r.b == s->global_batch_size) return r; /* the batch no longer changes */
  /* the first k >= 1 where the batch differs: exponential, then binary search */
  int64_t lo = 0, hi = 1; /* same at lo, unknown at hi */
  while (mega_jobspec_batch_at(s, c + hi * r.b) == r.b) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (mega_jobspec_batch_at(s, c + mid * r.b) == r.b) lo = mid;
    else hi = mid;
  }
  r.n = hi;
  return r;
}

int64_t mega_jobspec_samples_before(const mega_jobspec *s, int64_t it) {
  run r = run_at(s, 0, 0);
  while (r.n && it >= r.it + r.n) r = run_at(s, r.it + r.n, r.c + r.n * r.b);
  return r.c + (it - r.it) * r.b;
}

int mega_jobspec_batch_of(const mega_jobspec *s, int64_t it) {
  return mega_jobspec_batch_at(s, mega_jobspec_samples_before(s, it));
}

int mega_jobspec_lr_decay_iters(const mega_jobspec *s) {
  return s->lr_decay_iters > 0 ? s->lr_decay_iters : s->train_iters;
}

/* Megatron's update_train_iters: iteration-based training is as given;
 * sample-based takes the rampup's iterations while at most SAMPLES (and
 * --train-samples) samples are consumed, then whole global batches. */
int64_t mega_jobspec_train_iters(const mega_jobspec *s) {
  if (s->train_iters > 0 || s->train_samples < 1) return s->train_iters > 0 ? s->train_iters : 0;
  int64_t r[3], T = s->train_samples, it = 0, c = 0;
  if (!mega_jobspec_rampup(s, r)) return s->global_batch_size > 0 ? T / s->global_batch_size : 0;
  run u = run_at(s, 0, 0);
  while (c <= r[2] && c <= T) {
    /* the iterations of this run that still start within both bounds */
    int64_t bound = r[2] < T ? r[2] : T, k = (bound - c) / u.b + 1;
    if (u.n && k > u.it + u.n - it) k = u.it + u.n - it;
    it += k, c += k * u.b;
    if (u.n && it == u.it + u.n) u = run_at(s, it, c);
  }
  if (T > c) it += (T - c) / s->global_batch_size;
  return it;
}

/* ---- checks ---- */

mega_status mega_jobspec_check_batch(const mega_jobspec *s, int dp, mega_err *err) {
  bool iters = s->train_iters > 0, samples = s->train_samples > 0;
  if (!iters && !samples) return BAD("--train-iters is required (or --train-samples)");
  if (iters && samples)
    return BAD("--train-iters and --train-samples exclude each other; train by iterations or "
               "by samples, as in Megatron");
  const mega_strlist *l = &s->rampup_batch_size;
  /* Megatron trains train_samples // global_batch_size iterations: fewer
   * samples than one batch train none, and the job would end "succeeded"
   * with an untrained model (a ramp always starts one batch) */
  if (samples && !l->n && s->global_batch_size > 0 && s->train_samples < s->global_batch_size)
    return BAD("--train-samples %lld is fewer than one global batch (--global-batch-size %d): "
               "the job would train no iteration; give at least %d samples, or --train-iters",
               (long long)s->train_samples, s->global_batch_size, s->global_batch_size);
  if (!l->n) return MEGA_OK;
  long long v[3];
  if (l->n != 3 || !whole(l->v[0], &v[0]) || !whole(l->v[1], &v[1]) || !whole(l->v[2], &v[2]))
    return BAD("--rampup-batch-size takes three whole numbers, START INCR SAMPLES (e.g. 16 16 "
               "5859375)");
  if (v[0] < 1 || v[1] < 1 || v[2] < 1)
    return BAD("--rampup-batch-size %lld %lld %lld: START, INCR and SAMPLES must each be at "
               "least 1", v[0], v[1], v[2]);
  int G = s->global_batch_size;
  /* bounds that keep the ramp's arithmetic small (a ramp walks its steps) */
  if (v[2] > (1LL << 40))
    return BAD("--rampup-batch-size SAMPLES %lld is more than the %lld allowed", v[2],
               1LL << 40);
  if (v[0] < G && (G - v[0]) / v[1] > 65536)
    return BAD("--rampup-batch-size %lld %lld %lld ramps in %lld steps, more than the 65536 "
               "allowed; take a larger INCR", v[0], v[1], v[2], (G - v[0]) / v[1]);
  if (v[0] >= G)
    return BAD("--rampup-batch-size START %lld must be less than --global-batch-size %d, the "
               "batch the ramp ends at (without a ramp, drop the flag)", v[0], G);
  if ((G - v[0]) % v[1])
    return BAD("--rampup-batch-size: --global-batch-size %d minus START %lld is not divisible "
               "by INCR %lld", G, v[0], v[1]);
  if (iters) {
    long long per = G;
    char decay[96] = "";
    if (s->lr_decay_iters > 0)
      snprintf(decay, sizeof decay, ", and --lr-decay-samples %lld for --lr-decay-iters %d",
               (long long)s->lr_decay_iters * per, s->lr_decay_iters);
    return BAD("--rampup-batch-size needs sample-based training, as in Megatron: give "
               "--train-samples %lld instead of --train-iters %d (%d iterations of "
               "--global-batch-size %d)%s",
               (long long)s->train_iters * per, s->train_iters, s->train_iters, G, decay);
  }
  if (dp > 0) {
    long long per = (long long)s->micro_batch_size * dp;
    if (v[0] % per || v[1] % per)
      return BAD("--rampup-batch-size %lld %lld %lld: every batch of the ramp must divide by "
                 "--micro-batch-size %d x data-parallel size %d = %lld, so START and INCR must",
                 v[0], v[1], v[2], s->micro_batch_size, dp, per);
  }
  return MEGA_OK;
}

/* ---- the LR schedule's lengths, in samples ---- */

/* Megatron's get_optimizer_param_scheduler: iteration-based bounds are
 * iterations x --global-batch-size; sample-based ones are as given, the
 * decay by default --train-samples; a warmup fraction is of the decay. */
void mega_jobspec_lr_samples(const mega_jobspec *s, mega_lr_samples *out) {
  double G = s->global_batch_size;
  bool by_samples = s->train_samples > 0;
  *out = (mega_lr_samples){0};
  if (by_samples) {
    out->decay = s->lr_decay_samples > 0 ? s->lr_decay_samples : s->train_samples;
    out->warmup = s->lr_warmup_samples;
    out->wsd_decay = s->lr_wsd_decay_samples > 0 ? s->lr_wsd_decay_samples : 0;
  } else {
    out->decay = (double)mega_jobspec_lr_decay_iters(s) * G;
    out->warmup = (double)s->lr_warmup_iters * G;
    out->wsd_decay = s->lr_wsd_decay_iters > 0 ? (double)s->lr_wsd_decay_iters * G : 0;
  }
  if (!isnan(s->lr_warmup_fraction)) out->warmup = s->lr_warmup_fraction * out->decay;
}

mega_status mega_jobspec_check_lr(const mega_jobspec *s, mega_err *err) {
  bool by_samples = s->train_samples > 0;
  static const struct {
    const char *iters, *samples;
  } pairs[] = {{"--lr-decay-iters", "--lr-decay-samples"},
               {"--lr-warmup-iters", "--lr-warmup-samples"},
               {"--lr-wsd-decay-iters", "--lr-wsd-decay-samples"}};
  bool given_iters[3] = {s->lr_decay_iters > 0, s->lr_warmup_iters > 0,
                         s->lr_wsd_decay_iters > 0};
  bool given_samples[3] = {s->lr_decay_samples > 0, s->lr_warmup_samples > 0,
                           s->lr_wsd_decay_samples > 0};
  for (int k = 0; k < 3; k++) {
    if (by_samples && given_iters[k])
      return BAD("%s is for iteration-based training; with --train-samples give %s",
                 pairs[k].iters, pairs[k].samples);
    if (!by_samples && given_samples[k])
      return BAD("%s is for sample-based training (--train-samples); with --train-iters give %s",
                 pairs[k].samples, pairs[k].iters);
  }
  if (!isnan(s->lr_warmup_fraction) && (given_iters[1] || given_samples[1]))
    return BAD("--lr-warmup-fraction and %s exclude each other; give one warmup",
               given_iters[1] ? "--lr-warmup-iters" : "--lr-warmup-samples");
  bool wsd = s->lr_decay_style == MEGA_LR_WSD;
  bool wsd_len = given_iters[2] || given_samples[2];
  if (wsd && !wsd_len)
    return BAD("--lr-decay-style WSD needs the length of its final anneal: %s N",
               by_samples ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters");
  if (!wsd && (wsd_len || s->lr_wsd_decay_style != MEGA_WSD_EXPONENTIAL))
    return BAD("%s is for --lr-decay-style WSD; drop it or give that style",
               given_iters[2]     ? pairs[2].iters
               : given_samples[2] ? pairs[2].samples
                                  : "--lr-wsd-decay-style");
  if (s->min_lr > s->lr) return BAD("--min-lr %g is larger than --lr %g", s->min_lr, s->lr);
  if (s->lr_warmup_init > s->lr)
    return BAD("--lr-warmup-init %g is larger than --lr %g", s->lr_warmup_init, s->lr);
  mega_lr_samples l;
  mega_jobspec_lr_samples(s, &l);
  if (!(l.warmup < l.decay)) {
    if (!isnan(s->lr_warmup_fraction))
      return BAD("--lr-warmup-fraction %g leaves no decay", s->lr_warmup_fraction);
    if (by_samples)
      return BAD("--lr-warmup-samples %d must be less than the decay samples %.0f "
                 "(--lr-decay-samples, by default --train-samples)",
                 s->lr_warmup_samples, l.decay);
    return BAD("--lr-warmup-iters %d must be less than the decay iterations %d "
               "(--lr-decay-iters, by default --train-iters)",
               s->lr_warmup_iters, mega_jobspec_lr_decay_iters(s));
  }
  return MEGA_OK;
}
