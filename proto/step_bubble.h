/* The pipeline bubble of one merged step, the one definition every output
 * uses (megactl watch, the web view's curve and stage bars, /metrics, megad
 * run's line), so they agree on the same step: a rank's bubble is bubble_s
 * over its own step_time_s (the step's when it has none), clamped to 0..1;
 * a stage's is the mean over its ranks (its data- and tensor-parallel
 * replicas); the job's the mean over all ranks, which is the mean over
 * stages since every stage has as many ranks. core/sim's closed form is the
 * same fraction of each rank's makespan. */
#ifndef MEGA_PROTO_STEP_BUBBLE_H
#define MEGA_PROTO_STEP_BUBBLE_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/mega.pb-c.h"

typedef struct mega_stage_bubble {
  int ranks;                       /* ranks that reported for this stage */
  double bubble;                   /* 0..1 */
  double warmup, steady, cooldown; /* the split of bubble, when reported */
  bool split;                      /* some rank reported a phase split */
} mega_stage_bubble;

/* Fills out[s] for stages 0..n-1, n = the largest pp_rank + 1, at most max;
 * returns n (0 when the step has no ranks). A stage none of whose ranks has
 * a step time has ranks 0. */
int mega_step_stage_bubbles(const Mega__V1__StepMetrics *m, mega_stage_bubble *out, int max);

/* The job's bubble: the mean of the ranks' (0 when no rank has a time). */
double mega_step_bubble(const Mega__V1__StepMetrics *m);

/* The ranks merged into the step: world_size, or n_ranks from a megad that
 * did not set it. Not n_ranks alone: a replay's old steps come without
 * their ranks (daemon/model/jobhist.h). */
uint32_t mega_step_world(const Mega__V1__StepMetrics *m);

#endif
