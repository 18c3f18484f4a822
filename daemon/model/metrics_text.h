/* The /metrics page: a snapshot of megad rendered as Prometheus text
 * (exposition format 0.0.4). Pure: data in, text out; no loop, no I/O.
 *
 * Prometheus practice: base units (_seconds, _bytes), counters end in _total
 * and only grow while the process lives, gauges say what is now, and every
 * label has a bounded set of values. A job appears as a series only while it
 * runs (RUNNING or RESTARTING), at most MEGAD_METRICS_JOBS_MAX of them, and
 * is named by its id, never by the name its user gave it. */
#ifndef MEGA_DAEMON_METRICS_TEXT_H
#define MEGA_DAEMON_METRICS_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/model/job.h"

/* Jobs given series of their own; the rest are counted in
 * mega_jobs_unlisted. */
#define MEGAD_METRICS_JOBS_MAX 64
/* Pipeline stages given a bubble series per job; deeper pipelines show the
 * first ones and the job's overall ratio. */
#define MEGAD_METRICS_STAGES_MAX 64
/* JobEventKind values counted (0 .. MEGAD_METRICS_EVENT_KINDS - 1). */
#define MEGAD_METRICS_EVENT_KINDS 14

/* What the process itself costs; a field the system did not tell is < 0. */
typedef struct megad_proc_stats {
  double cpu_seconds, start_time_seconds;
  double resident_bytes, virtual_bytes;
  double open_fds, max_fds;
} megad_proc_stats;

/* Counters since this megad started. */
typedef struct megad_counters {
  uint64_t jobs_submitted;
  uint64_t jobs_finished[4]; /* succeeded, failed, cancelled, stopped */
  uint64_t job_events[MEGAD_METRICS_EVENT_KINDS]; /* by JobEventKind */
  uint64_t steps_merged;     /* steps this coordinator merged from every rank */
  uint64_t steps_relayed;    /* worker step reports this node passed on */
  uint64_t watchers_dropped; /* WatchJob streams dropped for falling behind */
  uint64_t watch_steps_missed; /* steps slow watchers skipped (each told by a gap) */
  uint64_t http_requests[4]; /* 200, 401, 404, other */
  double report_delay_sum_s; /* slowest rank's step end -> merge, every merged step */
  uint64_t report_delay_n;
} megad_counters;

/* gRPC calls served, per method. */
typedef struct megad_rpc_count {
  const char *method; /* "/mega.v1.Control/SubmitJob" */
  uint64_t served;
} megad_rpc_count;

typedef struct megad_metrics {
  megad_proc_stats proc;
  const char *version;
  uint32_t slots, slots_used;
  uint32_t web_streams; /* the web view's live streams open now */
  megad_counters c;
  const megad_rpc_count *rpcs;
  size_t nrpcs;
  const mega_job *const *jobs; /* every job in the table; the renderer picks */
  size_t njobs;
} megad_metrics;

/* The page, NUL-terminated (the caller frees); NULL when out of memory. */
char *megad_metrics_render(const megad_metrics *m, size_t *len);

/* Index into megad_counters.http_requests for an HTTP status. */
int megad_metrics_http_slot(unsigned status);

#endif
