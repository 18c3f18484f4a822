/* One measured action of an iteration: what the engine records for
 * --trace-iteration and the rank hands up in its metrics. Its own header so
 * that the engine needs nothing of the rank above it. */
#ifndef MEGA_WORKER_ENGINE_SPAN_H
#define MEGA_WORKER_ENGINE_SPAN_H

/* One measured action, for the Chrome trace of --trace-iteration. */
typedef struct mega_rank_span {
  char name[24];   /* the action's text form, "F3.0", or "optimizer", ... */
  const char *cat; /* "compute", "p2p", "bubble", "grad_sync", "optimizer" (static) */
  double start_us; /* from the iteration's start */
  double dur_us;
} mega_rank_span;

#endif
