/* Private to core/sched_*.c: the lowering pass that adds communication to a
 * compute-only schedule. */
#ifndef MEGA_CORE_SCHED_LOWER_H
#define MEGA_CORE_SCHED_LOWER_H

#include "core/schedule.h"

/* in holds only F, B and W per rank; out is initialised with in's
 * parameters and empty ranks, and receives the lowered actions. */
mega_status mega_sched_lower(const mega_schedule *in, mega_schedule *out, mega_err *err);

#endif
