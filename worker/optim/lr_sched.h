/* The learning-rate schedule of Megatron's OptimizerParamScheduler. Like
 * Megatron's, it counts steps in samples: a job's iteration bounds are
 * iterations x --global-batch-size (mega_jobspec_lr_samples), and the step
 * count is the samples consumed, so a batch-size rampup moves the schedule
 * by each iteration's real batch. With n steps taken:
 *
 *   n <= warmup (warmup > 0):  init + (lr - init) * n / warmup
 *   constant style:            lr
 *   n > decay:                 min_lr
 *   inverse-square-root:       max(min_lr, lr * sqrt(max(warmup, 1)) / sqrt(max(n, 1)))
 *   otherwise, with r = (n - warmup) / (decay - warmup), min_lr + (lr - min_lr) * c:
 *     linear:  c = 1 - r
 *     cosine:  c = 0.5 * (cos(pi r) + 1)
 *     WSD:     c = 1 until n > decay - wsd_decay; then with q = (n - (decay -
 *              wsd_decay)) / wsd_decay, by --lr-wsd-decay-style:
 *              exponential 2 * 0.5^q - 1, linear 1 - q, cosine 0.5 * (cos(pi q) + 1),
 *              minus_sqrt 1 - sqrt(q)
 *
 * The step of iteration i uses n = the samples consumed before it
 * (mega_jobspec_samples_before), so the first step's rate is the warmup's
 * start, as in Megatron. A plain value; nothing allocates. */
#ifndef MEGA_WORKER_LR_SCHED_H
#define MEGA_WORKER_LR_SCHED_H

#include <stdint.h>

#include "core/jobspec.h" /* mega_lr_style */
#include "core/status.h"

typedef struct mega_lr_sched {
  double lr, min_lr, init_lr;
  double warmup, decay, wsd_decay; /* in steps (samples, from a job) */
  mega_lr_style style;
  mega_wsd_style wsd_style;
} mega_lr_sched;

/* Checks the values (lr >= min_lr >= 0, lr >= init_lr >= 0, warmup >= 0,
 * decay > warmup unless the style is constant, wsd_decay > 0 for WSD). */
mega_status mega_lr_sched_check(const mega_lr_sched *s, mega_err *err);

/* The rate for the step taken after `steps` steps. */
double mega_lr_at(const mega_lr_sched *s, double steps);

/* The schedule a job's flags ask for, in samples. */
mega_lr_sched mega_lr_sched_from_job(const mega_jobspec *s);

/* Names, as the flags spell them: "cosine", "WSD"; "exponential". */
const char *mega_lr_style_name(mega_lr_style s);
const char *mega_wsd_style_name(mega_wsd_style s);

#endif
