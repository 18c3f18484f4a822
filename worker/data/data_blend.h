/* Megatron's blending rule (megatron/core/datasets/helpers.cpp,
 * build_blending_indices): with weights w normalized to sum 1, sample s
 * (0, 1, 2, ...) comes from the dataset d maximizing
 * w[d] * max(s, 1) - c[d], the lowest d on a tie, where c[d] counts the
 * samples taken from d before s; it is d's sample number c[d].
 *
 * The rule depends on every earlier sample, so a blend keeps the counts at
 * every 1024th sample up to the number it was made for, and replays at most
 * 1023 samples per look-up (further samples replay from the last kept
 * counts). Immutable after create: any number of threads may look up. */
#ifndef MEGA_WORKER_DATA_BLEND_H
#define MEGA_WORKER_DATA_BLEND_H

#include <stdint.h>

#include "core/status.h"

typedef struct mega_blend mega_blend;

/* weights: n > 0 finite numbers > 0 (normalized here). samples: how many
 * samples are looked up fast. The caller owns *out. */
mega_status mega_blend_create(const double *weights, int n, int64_t samples, mega_blend **out,
                              mega_err *err);
void mega_blend_destroy(mega_blend *b); /* NULL is fine */

/* The dataset sample s comes from, and its sample number in that dataset. */
void mega_blend_source(const mega_blend *b, int64_t s, int *dataset, int64_t *index);

#endif
