/* The coordinator's state of one running job attempt, shared by coord.c
 * (submit, scheduling, placement, launch) and coord_run.c (worker events,
 * failures and their cause, the end of the attempt). Private to the daemon. */
#ifndef MEGA_DAEMON_COORD_H
#define MEGA_DAEMON_COORD_H

#include "daemon/megad.h"

/* How much a failure explains. A rank that fails because a peer died says
 * so with a retryable WorkerError (secondary); the peer's own crash or
 * non-retryable error is the cause (primary). A secondary cause waits
 * MEGAD_CAUSE_WAIT_MS for a primary one before the job is stopped (longer
 * while a node of the job has gone quiet: its loss is the cause then). */
enum { CAUSE_NONE, CAUSE_SECONDARY, CAUSE_PRIMARY };
#define MEGAD_CAUSE_WAIT_MS 1500

typedef struct cancel_wait {
  void (*done)(void *arg, mega_job *j);
  void *arg;
} cancel_wait;

typedef struct coord_run {
  megad *d;
  mega_job *job;
  uint32_t world;
  mega_stepmerge *merge;
  char kv_prefix[192];
  int trace_iteration;
  bool *hello, *exited, *errored;
  uint32_t nhello, nexited;
  bool stopping;
  mega_job_state end_state;
  char *end_error;
  char *cause;
  int cause_prio;
  uint64_t cause_since; /* uv_now of the first secondary cause */
  uv_timer_t cause_timer, stop_timer;
  int timers_open; /* while closing */
  cancel_wait *cancels;
  size_t ncancels;
} coord_run;

/* coord_run.c */
coord_run *coord_run_new(megad *d, mega_job *j, int trace_iteration);
/* Ranks [first, first+n) will never report (not started, or their node is
 * lost): counted as exited. */
void coord_ranks_gone(coord_run *run, uint32_t first, uint32_t n);
/* A failure of the attempt, with its weight (CAUSE_*). */
void coord_cause(coord_run *run, int prio, const char *msg);
/* Stops the attempt: every node aborts its ranks; the job ends in state
 * once every rank has exited (or after the grace). */
void coord_stop(coord_run *run, mega_job_state state, const char *error);

/* coord.c: sends AbortJob for the attempt to every node of the placement. */
void coord_abort_nodes(coord_run *run, const char *reason);

#endif
