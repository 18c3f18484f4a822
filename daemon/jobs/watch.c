/* Watchers of jobs (see watch.h). */
#include "daemon/jobs/watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct megad_watcher {
  megad_watcher *next;
  megad_watchers *ws;
  mega_job *job;
  mega_rpc_call *call; /* a stream, or NULL for an in-process watcher */
  megad_watch_fn fn;
  void *arg;
  uint64_t missed, miss_first, miss_last; /* steps skipped since the last gap */
};

/* The gap marker, queued before anything else goes to w again. */
static mega_status send_gap(mega_rpc_call *call, uint64_t missed, uint64_t first, uint64_t last,
                            uint64_t missed_events, const char *reason) {
  Mega__V1__WatchGap g = MEGA__V1__WATCH_GAP__INIT;
  g.missed_steps = missed;
  g.missed_events = missed_events;
  g.first_iteration = first;
  g.last_iteration = last;
  g.reason = (char *)reason;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_GAP;
  item.gap = &g;
  return mega_rpc_send(call, &item.base, NULL);
}

/* Whether a step goes to w: not while w is behind (from the high mark
 * until it drained half of it). A skipped step is counted. */
static bool skip_step(megad_watchers *ws, megad_watcher *w, const Mega__V1__StepMetrics *s) {
  size_t q = mega_rpc_call_queued(w->call);
  if (q < MEGAD_WATCH_QUEUE_MAX && !(w->missed && q > MEGAD_WATCH_QUEUE_MAX / 2)) return false;
  uint64_t it = s ? s->iteration : 0;
  if (!w->missed++) w->miss_first = it;
  w->miss_last = it;
  ws->steps_missed_total++;
  return true;
}

static void unlink_watcher(megad_watchers *ws, megad_watcher *w) {
  for (megad_watcher **p = &ws->head; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      if (w->call) ws->streams--;
      return;
    }
}

void megad_watch_broadcast(megad_watchers *ws, mega_job *j, const Mega__V1__WatchJobResponse *item,
                           megad_watch_drops *drops) {
  bool final = item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
  if (drops) drops->n = 0;
  for (megad_watcher **p = &ws->head; *p;) {
    megad_watcher *w = *p;
    if (w->job != j) {
      p = &w->next;
      continue;
    }
    if (!w->call) {
      w->fn(w->arg, item);
      if (final) {
        *p = w->next;
        free(w);
      } else {
        p = &w->next;
      }
      continue;
    }
    if (item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && skip_step(ws, w, item->step)) {
      p = &w->next;
      continue;
    }
    if (w->missed) {
      char why[128];
      snprintf(why, sizeof why, "this watcher fell behind (%d messages queued); steps were skipped",
               MEGAD_WATCH_QUEUE_MAX);
      send_gap(w->call, w->missed, w->miss_first, w->miss_last, 0, why);
      w->missed = 0;
    }
    /* A failed send means the client went away: its cancel callback
     * (watcher_gone) unlinks it. */
    if (mega_rpc_send(w->call, &item->base, NULL) != MEGA_OK) {
      p = &w->next;
      continue;
    }
    if (final) {
      *p = w->next;
      ws->streams--;
      mega_rpc_call_on_cancel(w->call, NULL, NULL);
      mega_rpc_finish(w->call);
      free(w);
      continue;
    }
    if (mega_rpc_call_queued(w->call) <= MEGAD_WATCH_QUEUE_HARD) {
      p = &w->next;
      continue;
    }
    /* it stopped reading: drop this watcher, never the job */
    *p = w->next;
    ws->streams--;
    ws->dropped_total++;
    if (drops && drops->n < sizeof drops->peers / sizeof drops->peers[0])
      snprintf(drops->peers[drops->n], sizeof drops->peers[0], "%s", mega_rpc_call_peer(w->call));
    if (drops) drops->n++;
    mega_rpc_call_on_cancel(w->call, NULL, NULL);
    mega_rpc_fail(w->call, MEGA_RPC_RESOURCE_EXHAUSTED,
                  "this watcher fell more than %d messages behind job %s and was dropped; the job "
                  "goes on (watch again, with replay, to catch up)",
                  MEGAD_WATCH_QUEUE_HARD, j->id);
    free(w);
  }
}

static void watcher_gone(mega_rpc_call *call, void *arg) {
  megad_watcher *w = arg;
  unlink_watcher(w->ws, w);
  free(w);
  mega_rpc_finish(call);
}

/* A final state in the history is the job's end only when it is the last
 * item and the job is over: a resumed job's history holds the end of the
 * attempt that failed before. */
static bool replay_item(const mega_job *j, size_t i) {
  const Mega__V1__WatchJobResponse *item = mega_job_hist_at(&j->hist, i);
  if (item->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE) return true;
  return i + 1 == j->hist.len && mega_job_state_final(j->state);
}

static megad_watcher *add(megad_watchers *ws, mega_job *j) {
  megad_watcher *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->ws = ws;
  w->job = j;
  w->next = ws->head;
  ws->head = w;
  return w;
}

megad_watcher *megad_watch_local(megad_watchers *ws, mega_job *j, bool replay, megad_watch_fn fn,
                                 void *arg) {
  for (size_t i = 0; replay && i < j->hist.len; i++)
    if (replay_item(j, i)) fn(arg, mega_job_hist_at(&j->hist, i));
  megad_watcher *w = add(ws, j);
  if (!w) return NULL;
  w->fn = fn;
  w->arg = arg;
  return w;
}

void megad_watch_call(megad_watchers *ws, mega_job *j, mega_rpc_call *call, bool replay) {
  bool final_sent = false;
  if (!mega_job_state_final(j->state)) {
    size_t mine = 0;
    for (megad_watcher *w = ws->head; w; w = w->next) mine += w->call && w->job == j;
    if (ws->streams >= MEGAD_WATCHERS_MAX || mine >= MEGAD_WATCHERS_PER_JOB) {
      mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED,
                    "megad already serves %zu watchers (%zu of job %s); the limits are %d in "
                    "all and %d per job",
                    ws->streams, mine, j->id, MEGAD_WATCHERS_MAX, MEGAD_WATCHERS_PER_JOB);
      return;
    }
  }
  /* what the history let go is said where it was: the oldest steps went
   * (the events before them are kept), so before the first step kept */
  const mega_job_hist *h = &j->hist;
  bool gap = replay && (h->lost_steps || h->lost_other);
  size_t gap_at = gap ? mega_job_hist_gap_at(h) : 0;
  for (size_t i = 0; replay && i <= h->len; i++) {
    if (gap && i == gap_at) {
      char why[256];
      snprintf(why, sizeof why,
               "older than the %d items of history megad keeps (events are kept before steps), "
               "or between the first %d and the newest %d events it keeps of a job",
               MEGA_JOB_HISTORY, MEGA_JOB_EVENTS_FIRST, MEGA_JOB_EVENTS_LAST);
      send_gap(call, h->lost_steps, h->lost_first, h->lost_last, h->lost_other, why);
    }
    if (i == h->len || !replay_item(j, i)) continue;
    const Mega__V1__WatchJobResponse *item = mega_job_hist_at(&j->hist, i);
    if (mega_rpc_send(call, &item->base, NULL) != MEGA_OK) {
      mega_rpc_finish(call);
      return;
    }
    final_sent = item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
  }
  if (mega_job_state_final(j->state)) {
    if (!final_sent) {
      mega_job_msg m;
      if (mega_job_msg_init(&m, j, NULL) == MEGA_OK) {
        Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
        item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
        item.final_state = &m.job;
        mega_rpc_send(call, &item.base, NULL);
        mega_job_msg_free(&m);
      }
    }
    mega_rpc_finish(call);
    return;
  }
  megad_watcher *w = add(ws, j);
  if (!w) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->call = call;
  ws->streams++;
  mega_rpc_call_on_cancel(call, watcher_gone, w);
  /* a cancel before the callback was set is not replayed */
  if (mega_rpc_call_cancelled(call)) {
    mega_rpc_call_on_cancel(call, NULL, NULL);
    watcher_gone(call, w);
  }
}

void megad_watch_drop_job(megad_watchers *ws, const mega_job *j, const char *why) {
  for (megad_watcher **pw = &ws->head; *pw;) {
    megad_watcher *w = *pw;
    if (j && w->job != j) {
      pw = &w->next;
      continue;
    }
    *pw = w->next;
    if (w->call) {
      ws->streams--;
      mega_rpc_call_on_cancel(w->call, NULL, NULL);
      /* not UNAVAILABLE: that reads as the client's server being out of
       * reach; this node answered (and the client may watch again) */
      mega_rpc_fail(w->call, MEGA_RPC_ABORTED, "%s", why);
    }
    free(w);
  }
}

void megad_watch_drop_all(megad_watchers *ws, const char *why) { megad_watch_drop_job(ws, NULL, why); }
