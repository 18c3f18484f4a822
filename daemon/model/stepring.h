/* A job's step curve for the web view: every merged StepMetrics as a compact
 * point, in a bounded array that thins its older half when full, so a
 * 100,000-iteration job keeps at most MEGA_STEPRING_CAP points (recent ones
 * at full resolution, older ones ever sparser), plus the attempts' starts
 * (restarts and rescales) to mark on the curve.
 *
 * Each point gets a sequence number (base + 1, base + 2, ... in arrival
 * order) that a reader passes back as its cursor: iterations repeat after a
 * restart from a checkpoint, sequence numbers never do. base is the curve's
 * epoch << 32, taken at its first point from a counter megad seeds at start
 * at random (mega_stepring_seed), so a cursor of another curve (one before
 * megad restarted, or before the job's record was made anew) is told from
 * one of this curve, whatever its length (mega_stepring_knows). Epochs are
 * below 2^21, so a cursor stays below 2^53 and exact in JavaScript.
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
#define MEGA_STEPRING_EPOCHS ((1u << 21) - 1) /* epochs are 1 .. this */

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
  uint64_t base;    /* the curve's epoch << 32: points are numbered after it; 0: none yet */
  uint64_t seq;     /* of the newest point (base when none is kept); 0: none yet */
  uint64_t thinned; /* points dropped by thinning */
} mega_stepring;

void mega_stepring_free(mega_stepring *r);
/* Adds step as a point; thins when full. MEGA_ERR_NOMEM leaves r as it was. */
mega_status mega_stepring_push(mega_stepring *r, const Mega__V1__StepMetrics *step, mega_err *err);
/* The index of the first point with seq > since (n when none). */
size_t mega_stepring_after(const mega_stepring *r, uint64_t since);
/* Whether cursor is this curve's: 0 (before every point) or one of its
 * numbers up to seq. Any other is another curve's (or made up): a reader
 * must start afresh from 0, or it would mix two curves. */
bool mega_stepring_knows(const mega_stepring *r, uint64_t cursor);
/* Seeds the epochs of the curves started from now on (megad: at random at
 * its start, so its curves' epochs differ from its previous life's with
 * odds of 2^21 to 1; unseeded, they count from 1). */
void mega_stepring_seed(uint32_t seed);

#endif
