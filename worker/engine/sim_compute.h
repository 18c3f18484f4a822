/* --simulate-compute: a chunk's compute as sleeps (the engine's benches and
 * schedule tests without the maths), spread over the chunk's units in
 * proportion to their parameters, so that gradient buckets become ready,
 * and forward waits for parameters, when a real pass's would. */
#ifndef MEGA_WORKER_ENGINE_SIM_COMPUTE_H
#define MEGA_WORKER_ENGINE_SIM_COMPUTE_H

#include <stdbool.h>

#include "worker/engine/grads.h"
#include "worker/model/gpt.h"

/* ms over stage's units in backward order; with ready (and grads), each
 * unit then marks its parameters ready in grads, as the model's backward
 * does. chunk: the stage's index in grads. */
void mega_sim_backward(const mega_gpt_stage *stage, mega_grads *grads, int chunk, double ms,
                       bool ready);
/* ms over the units in forward order, each first waiting for its
 * parameters (mega_grads_need), as the model's forward does. */
void mega_sim_forward(const mega_gpt_stage *stage, mega_grads *grads, int chunk, double ms);

#endif
