/* The learning-rate schedule of Megatron's OptimizerParamScheduler, counted
 * in iterations (Megatron counts samples, with every bound scaled by the
 * global batch, which gives the same values at iteration boundaries).
 *
 *   it <= warmup (warmup > 0):  lr * it / warmup        (linear from 0)
 *   constant style:             lr
 *   it > decay_iters:           min_lr
 *   otherwise, with r = (it - warmup) / (decay_iters - warmup):
 *     linear:  min_lr + (lr - min_lr) * (1 - r)
 *     cosine:  min_lr + (lr - min_lr) * 0.5 * (cos(pi r) + 1)
 *
 * `it` is the number of optimizer steps already taken, so the first step
 * (iteration 1) uses lr_at(0), which is 0 under warmup, as in Megatron.
 * A plain value; nothing allocates. */
#ifndef MEGA_WORKER_LR_SCHED_H
#define MEGA_WORKER_LR_SCHED_H

#include <stdint.h>

#include "core/jobspec.h" /* mega_lr_style */
#include "core/status.h"

typedef struct mega_lr_sched {
  double lr, min_lr;
  int64_t warmup_iters, decay_iters;
  mega_lr_style style;
} mega_lr_sched;

/* Checks the values (lr >= min_lr >= 0, warmup >= 0, decay_iters > warmup
 * unless the style is constant). */
mega_status mega_lr_sched_check(const mega_lr_sched *s, mega_err *err);

/* The rate for the step taken after `it` steps. */
double mega_lr_at(const mega_lr_sched *s, int64_t it);

/* The schedule a job's flags ask for (--lr-decay-iters defaults to
 * --train-iters, as in Megatron). */
mega_lr_sched mega_lr_sched_from_job(const mega_jobspec *s);

#endif
