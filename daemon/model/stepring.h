/* A job's step curve for the web view: every merged StepMetrics as a compact
 * point, in a bounded array that thins its older half when full, so a
 * 100,000-iteration job keeps at most MEGA_STEPRING_CAP points (recent ones
 * at full resolution, older ones ever sparser), plus the attempts' starts
 * (restarts and rescales) to mark on the curve.
 *
 * Each point gets a sequence number (1, 2, ... in arrival order) that a
 * reader passes back as its cursor: iterations repeat after a restart from a
 * checkpoint, sequence numbers never do.
 *
 * Pure: no loop, no I/O. Ownership: the ring owns its arrays. */
#ifndef MEGA_DAEMON_STEPRING_H
#define MEGA_DAEMON_STEPRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "proto/mega.pb-c.h"

#define MEGA_STEPRING_CAP 2048
#define MEGA_STEPRING_MARKS 256

typedef struct mega_steppoint {
  uint64_t seq, iteration;
  int64_t time_ms;
  double loss, eval_loss, grad_norm, lr, tokens_per_s, step_time_s;
  double bubble;         /* mean over ranks of bubble_s / step_time_s */
  double grad_sync_s;    /* the most any rank's gradient sync was exposed */
  uint32_t attempt, world;
  bool has_eval, skipped;
} mega_steppoint;

/* The first step of an attempt after another attempt's steps. */
typedef struct mega_stepmark {
  uint64_t seq, iteration;
  uint32_t attempt, world, prev_world; /* world != prev_world: a rescale */
} mega_stepmark;

typedef struct mega_stepring {
  mega_steppoint *v; /* [n], arrival order */
  size_t n, cap;
  mega_stepmark marks[MEGA_STEPRING_MARKS]; /* [nmarks], oldest first */
  size_t nmarks;
  uint64_t seq;     /* of the newest point; 0: none yet */
  uint64_t thinned; /* points dropped by thinning */
} mega_stepring;

void mega_stepring_free(mega_stepring *r);
/* Adds step as a point; thins when full. MEGA_ERR_NOMEM leaves r as it was. */
mega_status mega_stepring_push(mega_stepring *r, const Mega__V1__StepMetrics *step, mega_err *err);
/* The index of the first point with seq > since (n when none). */
size_t mega_stepring_after(const mega_stepring *r, uint64_t since);

#endif
