/* One rank training the whole model: data, model stage, optimizer, LR
 * schedule and checkpoints, iteration by iteration.
 *
 * Each iteration runs G / micro_batch microbatches (forward, backward with
 * loss scale 1/(G*T), gradients accumulating), then one AdamW step with the
 * global-norm clip at the scheduled rate. The reported loss is the mean
 * cross-entropy over the iteration's G*T target tokens.
 *
 * Ownership: the trainer copies the job, borrows the backend (which must
 * outlive it) and owns everything else. */
#ifndef MEGA_WORKER_TRAIN_H
#define MEGA_WORKER_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/backend/backend.h"

typedef struct mega_trainer mega_trainer;

typedef struct mega_step_report {
  int64_t iteration; /* 1-based: the iteration just finished */
  double loss;       /* mean cross-entropy over G*T tokens */
  double grad_norm;  /* global norm before clipping */
  double clip_coef;  /* applied to the gradients; 1 when not clipped */
  double lr;         /* the rate this step used */
  double step_time_s;
  double tokens_per_s;
} mega_step_report;

typedef struct mega_trainer_opts {
  uint64_t max_shard_bytes; /* checkpoint shard limit; 0: the default (5 GB) */
} mega_trainer_opts;

/* job must have passed mega_jobspec_check for world size 1. Opens the data,
 * builds the model and optimizer, removes stale temp checkpoints from
 * --save, and with --load resumes from the newest checkpoint there (when
 * there is none, it starts fresh and *resumed stays false). opts and
 * resumed may be NULL. */
mega_status mega_trainer_create(const mega_jobspec *job, mega_backend *be,
                                const mega_trainer_opts *opts, mega_trainer **out,
                                bool *resumed, mega_err *err);
void mega_trainer_destroy(mega_trainer *t); /* NULL is fine */

/* Iterations completed (the resumed one after a load). */
int64_t mega_trainer_iteration(const mega_trainer *t);
/* Parameters in the model. */
size_t mega_trainer_num_params(const mega_trainer *t);
/* Path of the checkpoint loaded, or NULL. */
const char *mega_trainer_loaded_path(const mega_trainer *t);

/* Runs one iteration. */
mega_status mega_trainer_step(mega_trainer *t, mega_step_report *rep, mega_err *err);

/* Whether --save asks for a checkpoint now: every --save-interval
 * iterations, and after the last (--train-iters). */
bool mega_trainer_save_due(const mega_trainer *t);
/* Writes the checkpoint of the current iteration under --save. */
mega_status mega_trainer_save(mega_trainer *t, mega_err *err);

/* Sum of squares of the flat parameter buffer: a cheap fingerprint of the
 * weights for tests. */
mega_status mega_trainer_param_sumsq(const mega_trainer *t, double *out, mega_err *err);

#endif
