/* Chrome trace (Trace Event Format) writer; Perfetto and chrome://tracing
 * open its output. One process, one track (tid) per pipeline rank. Both the
 * simulator's predicted timeline and the engine's measured spans go through
 * it, so the two pictures speak the same language.
 *
 * The trace owns everything added to it; mega_trace_dump returns a string
 * the caller frees. */
#ifndef MEGA_CORE_TRACE_H
#define MEGA_CORE_TRACE_H

#include "core/sim.h"

typedef struct mega_trace mega_trace;

mega_trace *mega_trace_new(const char *process_name);
void mega_trace_free(mega_trace *t);

/* Names track tid ("rank 0", "rank 1 (pp 1, dp 0)", ...). */
void mega_trace_track(mega_trace *t, int tid, const char *name);

/* A complete span ("ph":"X"); times in microseconds. cat groups spans
 * ("compute", "p2p", "bubble", ...). */
void mega_trace_span(mega_trace *t, int tid, const char *name, const char *cat,
                     double start_us, double dur_us);

/* Whether a measured span with this cat ran on a rank's communicator thread
 * rather than its training thread ("reduce": a gradient reduction moving
 * bytes, "reduce_queue": one queued behind the collectives before it): such
 * spans overlap the rank's actions, so a trace draws them on a track of
 * their own. */
bool mega_trace_cat_is_comm(const char *cat);

/* Every action of a simulated schedule, one track per rank; time_unit_us
 * converts the cost model's unit to microseconds. */
void mega_trace_add_sim(mega_trace *t, const mega_schedule *s, const mega_sim *sim,
                        double time_unit_us);

/* The JSON document ({"traceEvents": [...]}). */
char *mega_trace_dump(const mega_trace *t);

#endif
