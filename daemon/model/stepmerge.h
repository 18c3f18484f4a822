/* Merging the step reports of one iteration from every rank into one
 * StepMetrics, as the coordinator streams it to watchers.
 *
 *   loss          from the ranks that have it (every last-stage rank
 *                 reports the same global loss); grad_norm likewise
 *   lr            the lowest rank's
 *   step_time_s   the slowest rank's
 *   tokens_per_s  global tokens (each data-parallel replica's, once) / step time
 *   ranks         one RankMetrics per rank, in rank order
 *
 * Reports may come in any order, ranks at different iterations. An
 * iteration is merged once every rank has reported it; at most `window`
 * incomplete iterations are held (the oldest is dropped beyond that, which a
 * rank that never reports causes). Single-threaded; no loop. */
#ifndef MEGA_DAEMON_STEPMERGE_H
#define MEGA_DAEMON_STEPMERGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "proto/mega.pb-c.h"

typedef struct mega_stepmerge mega_stepmerge;

/* A merged iteration. step and reports are owned by the struct. */
typedef struct mega_step_done {
  Mega__V1__StepMetrics *step;
  Mega__V1__StepReport **reports; /* [world], by rank: what each sent (spans for traces) */
  uint32_t world;
} mega_step_done;

/* NULL when out of memory. window 0: 512 (a remote node's reports may
 * trail a local rank's by a second at a few ms an iteration). */
mega_stepmerge *mega_stepmerge_new(uint32_t world, uint32_t attempt, size_t window);
void mega_stepmerge_free(mega_stepmerge *m);

/* Adds rank's report (copied). *done (the caller's, freed with
 * mega_step_done_free) is the merged iteration when this report completed
 * one, else NULL. A rank out of range, an iteration 0, or a second report of
 * the same (rank, iteration) is MEGA_ERR_INVALID and changes nothing. */
mega_status mega_stepmerge_add(mega_stepmerge *m, uint32_t rank, const Mega__V1__StepReport *r,
                               mega_step_done **done, mega_err *err);

void mega_step_done_free(mega_step_done *d);

/* Stops waiting for the missing reports of the oldest incomplete iteration
 * at or below upto: *done (the caller's) is its merge from the ranks that
 * reported (the others' RankMetrics left empty), NULL when none is left.
 * For an attempt whose lost node never passed on its ranks' reports of
 * iterations the survivors completed (recovery from replicas starts after
 * them): their loss is known, every last-stage rank reports it. */
mega_status mega_stepmerge_flush(mega_stepmerge *m, uint64_t upto, mega_step_done **done,
                                 mega_err *err);

size_t mega_stepmerge_pending(const mega_stepmerge *m); /* incomplete iterations held */
uint64_t mega_stepmerge_dropped(const mega_stepmerge *m); /* incomplete ones given up */

#endif
