/* Watchers of jobs: WatchJob streams and in-process watchers (megad run).
 *
 * A stream has a write queue in the rpc wrapper. A watcher that lets it grow
 * past MEGAD_WATCH_QUEUE_MAX messages is skipped steps, never events or the
 * end, until it has drained half of it; then a WatchGap item tells it how
 * many steps it missed and which, before anything else. So memory stays
 * bounded, a slow client never holds up the loop, the job or the other
 * watchers, and no loss is silent. One that still lets its queue pass
 * MEGAD_WATCH_QUEUE_HARD (it stopped reading; events alone fill it) is
 * dropped with RESOURCE_EXHAUSTED; the caller hears of each drop and may
 * say so. A replay that reaches back past the history starts with a gap.
 * A watcher follows its job across attempts: only the job's end ends the
 * stream. Watchers are limited per job and in total (RESOURCE_EXHAUSTED).
 *
 * On the loop thread only. Ownership: the list owns its watchers; it borrows
 * their jobs, which must outlive them (a job's end ends its watchers). */
#ifndef MEGA_DAEMON_WATCH_H
#define MEGA_DAEMON_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/model/job.h"
#include "proto/rpc_server.h"

/* Above the history, so a replay alone never skips a step. */
#define MEGAD_WATCH_QUEUE_MAX (MEGA_JOB_HISTORY + 1024)
#define MEGAD_WATCH_QUEUE_HARD (4 * MEGAD_WATCH_QUEUE_MAX)
#define MEGAD_WATCHERS_MAX 4096     /* streams in all */
#define MEGAD_WATCHERS_PER_JOB 1024 /* streams of one job */

typedef void (*megad_watch_fn)(void *arg, const Mega__V1__WatchJobResponse *item);

typedef struct megad_watcher megad_watcher;

typedef struct megad_watchers {
  megad_watcher *head;
  size_t streams;             /* WatchJob streams now */
  uint64_t steps_missed_total; /* steps skipped for slow watchers (each told by a gap) */
  uint64_t dropped_total;      /* watchers dropped at MEGAD_WATCH_QUEUE_HARD */
} megad_watchers;

/* Starts a WatchJob stream on call: the history first when replay, then
 * every new item; a job already over gets its final state and the stream
 * ends. */
void megad_watch_call(megad_watchers *ws, mega_job *j, mega_rpc_call *call, bool replay);
/* An in-process watcher; replay sends the history first. It is freed after
 * the final state. */
megad_watcher *megad_watch_local(megad_watchers *ws, mega_job *j, bool replay, megad_watch_fn fn,
                                 void *arg);

/* The watchers a broadcast dropped for falling behind. */
typedef struct megad_watch_drops {
  size_t n;
  char peers[8][128]; /* the first ones' addresses */
} megad_watch_drops;

/* Sends item to every watcher of j; a final_state item ends their streams.
 * drops (may be NULL) gets the watchers dropped. */
void megad_watch_broadcast(megad_watchers *ws, mega_job *j, const Mega__V1__WatchJobResponse *item,
                           megad_watch_drops *drops);
/* The watchers of j (every watcher when j is NULL: shutdown) end, streams
 * with UNAVAILABLE and why. */
void megad_watch_drop_job(megad_watchers *ws, const mega_job *j, const char *why);
void megad_watch_drop_all(megad_watchers *ws, const char *why);

#endif
