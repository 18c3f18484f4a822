/* A job's history: the bounded ring of items WatchJob replays, the events
 * GetJob lists (the first and the newest, bounded), its last step, and its
 * step curve for the web view.
 *
 * The jobs layer owns it: megad_job_event, megad_job_step and
 * megad_job_finalize push to it (and the journal's replay, mega_jobs_apply,
 * refills it); watch.c replays it, and the web view, GetJob and /metrics
 * read it. Pure: no loop, no I/O.
 *
 * Ownership: the history owns its items (copies of what was pushed). */
#ifndef MEGA_DAEMON_JOBHIST_H
#define MEGA_DAEMON_JOBHIST_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "daemon/model/stepring.h"
#include "proto/mega.pb-c.h"

/* Items kept for WatchJob's replay, per job (the oldest steps go first). */
#define MEGA_JOB_HISTORY 1024
/* Steps of the replay that keep their per-rank figures: the newest, which
 * megactl watch's bubble bars and the trace look at. An older step keeps
 * every job-level figure (world_size among them) and loses its ranks: a
 * rank's entry is ~190 bytes, so a 1,024-rank job's full ring would hold
 * ~200 MB, and megad keeps up to --retain-jobs ended jobs. */
#define MEGA_JOB_HISTORY_RANKS 64
/* Events kept for GetJob, per job: the first ones (submitted, placed, the
 * first attempt's) and the newest; those in between are let go, counted.
 * An event is at most about 1 KiB, so GetJob's answer stays under 600 KB
 * however long the job runs (gRPC refuses messages past its limit). */
#define MEGA_JOB_EVENTS_FIRST 64
#define MEGA_JOB_EVENTS_LAST 448

typedef struct mega_job_hist {
  /* WatchJob's replay: a ring of owned items, oldest at ring[head]; it
   * grows to MEGA_JOB_HISTORY as it fills, so a job that never ran costs
   * little. Only its newest MEGA_JOB_HISTORY_RANKS steps keep their ranks */
  Mega__V1__WatchJobResponse **ring;
  size_t head, len, cap;
  /* steps the ring let go (a replay says so with a gap marker): how many,
   * the least and the greatest iteration among them; and the other items
   * (events, final states) it let go, only ever when it held nothing else,
   * or never had (events whose numbers the history skipped: those let go
   * from between the first and the newest before a journal's compaction
   * or in etcd) */
  uint64_t lost_steps, lost_first, lost_last, lost_other;
  /* the newest step by (attempt, iteration), owned; NULL before the first */
  Mega__V1__StepMetrics *last_step;
  /* every step in arrival order, thinned when old (the web view's curves:
   * a late step shows there where it came, after its attempt's mark) */
  mega_stepring curve;
  /* GetJob's events, oldest first (owned): the first MEGA_JOB_EVENTS_FIRST
   * and the newest MEGA_JOB_EVENTS_LAST; events_total - nevents were let
   * go from between them. Each carries its number (1: the job's first). */
  Mega__V1__JobEvent **events;
  size_t nevents, events_cap;
  uint64_t events_total; /* the job's events so far: the newest one's number */
} mega_job_hist;

/* Frees what h holds; h is empty (all zero) after. A zeroed history is an
 * empty one. */
void mega_job_hist_free(mega_job_hist *h);
/* Adds a copy of item (a step, an event or the final state) at the end,
 * except a step that comes late: one of an earlier attempt, or an earlier
 * iteration, than steps kept (sent again after a takeover). It goes before
 * the items that belong after it: later steps, a later attempt's events,
 * the end (event and final state) of its attempt or a later one, so a
 * replay lists each attempt's steps in order and the job's end last. When
 * MEGA_JOB_HISTORY are kept the oldest step goes (the late step itself
 * when it is older than every step kept), never an event: with no step
 * kept, a new step goes, and a new event pushes out the oldest item. What
 * goes is counted (lost_*). A step that is not among the newest
 * MEGA_JOB_HISTORY_RANKS kept loses its ranks (n_ranks 0; world_size says
 * how many it had). A step also joins curve and becomes
 * last_step unless it is older than last_step. An event is numbered (its
 * own number, or the next when it has none: a record of an older megad)
 * and joins events, pushing out the oldest of the newest when they are
 * full; an event whose number the history has had already (a record
 * delivered twice) changes nothing. */
mega_status mega_job_hist_push(mega_job_hist *h, const Mega__V1__WatchJobResponse *item,
                               mega_err *err);
/* The event the next event pushes out of events, or NULL while there is
 * room: what a store of the job's events (etcd) lets go with it. */
const Mega__V1__JobEvent *mega_job_hist_event_victim(const mega_job_hist *h);
/* Events let go from the middle of events. */
uint64_t mega_job_hist_events_left_out(const mega_job_hist *h);
/* Item i (0: oldest) of the ring, or NULL past its end. */
const Mega__V1__WatchJobResponse *mega_job_hist_at(const mega_job_hist *h, size_t i);
/* Where a replay's gap marker for what the ring let go belongs: before
 * item i. The steps that went were older than every step kept, so it is
 * the first step kept (the events before it stay in their place), or 0
 * when other items went too, or no step is kept. */
size_t mega_job_hist_gap_at(const mega_job_hist *h);

#endif
