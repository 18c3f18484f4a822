/* A cpu backend that counts what its callers ask of it, for tests of how
 * often a step waits: copies to the host and sum_squares (each a wait on a
 * device backend), and the AdamW calls. With ranges, it has the optional
 * many-range ops as the cuda backend does, so the callers' posting path
 * runs here; without, the callers take backend.c's fallbacks. */
#ifndef MEGA_TESTS_WORKER_COUNT_BACKEND_H
#define MEGA_TESTS_WORKER_COUNT_BACKEND_H

#include <stdbool.h>

#include "worker/backend/backend.h"

typedef struct fx_counts {
  int d2h, sum_squares, sum_squares_post, adamw, adamw_ranges;
} fx_counts;

/* cpu's ops over cpu's state, counted into *counts; adamw_ranges and
 * sum_squares_post present when ranges (each a loop over cpu's adamw or
 * sum_squares, so the bits are the cpu backend's). cpu and counts must
 * outlive it; mega_backend_destroy frees only the wrapper. */
mega_backend *fx_counting(mega_backend *cpu, fx_counts *counts, bool ranges);

#endif
