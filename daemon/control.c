/* The Control service (what megactl calls) and WatchJob's watchers.
 *
 * A watcher's stream has a write queue in the rpc wrapper; a watcher that
 * lets it grow past MEGAD_WATCH_QUEUE_MAX messages is dropped with
 * RESOURCE_EXHAUSTED (and an event says so), so a slow client never holds
 * up the loop, the job or the other watchers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/megad.h"

/* ---- watchers ---- */

static void unlink_watcher(megad *d, megad_watcher *w) {
  for (megad_watcher **p = &d->watchers; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      return;
    }
}

typedef struct dropped {
  char peer[128];
  mega_job *job;
} dropped;

void megad_watch_broadcast(megad *d, mega_job *j, const Mega__V1__WatchJobResponse *item) {
  bool final = item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
  dropped drops[8];
  size_t ndrops = 0, more = 0;
  for (megad_watcher **p = &d->watchers; *p;) {
    megad_watcher *w = *p;
    if (w->job != j) {
      p = &w->next;
      continue;
    }
    if (!w->call) {
      w->local(w->arg, item);
      if (final) {
        *p = w->next;
        free(w);
      } else {
        p = &w->next;
      }
      continue;
    }
    /* A failed send means the client went away: its cancel callback
     * (watcher_gone) unlinks it. */
    if (mega_rpc_send(w->call, &item->base, NULL) != MEGA_OK) {
      p = &w->next;
      continue;
    }
    if (final) {
      *p = w->next;
      mega_rpc_call_on_cancel(w->call, NULL, NULL);
      mega_rpc_finish(w->call);
      free(w);
      continue;
    }
    if (mega_rpc_call_queued(w->call) <= MEGAD_WATCH_QUEUE_MAX) {
      p = &w->next;
      continue;
    }
    /* too far behind: drop this watcher, never the job */
    *p = w->next;
    if (ndrops < 8) {
      snprintf(drops[ndrops].peer, sizeof drops[ndrops].peer, "%s", mega_rpc_call_peer(w->call));
      drops[ndrops++].job = j;
    } else {
      more++;
    }
    mega_rpc_call_on_cancel(w->call, NULL, NULL);
    mega_rpc_fail(w->call, MEGA_RPC_RESOURCE_EXHAUSTED,
                  "this watcher fell more than %d messages behind job %s and was dropped; the job "
                  "goes on (watch again, with replay, to catch up)",
                  MEGAD_WATCH_QUEUE_MAX, j->id);
    free(w);
  }
  for (size_t i = 0; i < ndrops; i++)
    megad_job_event(d, drops[i].job, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                    "a watcher at %s fell more than %d messages behind and was dropped",
                    drops[i].peer, MEGAD_WATCH_QUEUE_MAX);
  if (more)
    megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                    "%zu more watchers fell behind and were dropped", more);
}

static void watcher_gone(mega_rpc_call *call, void *arg) {
  megad_watcher *w = arg;
  megad *d = w->arg;
  unlink_watcher(d, w);
  free(w);
  mega_rpc_finish(call);
}

megad_watcher *megad_watch_local(megad *d, mega_job *j, bool replay,
                                 void (*fn)(void *arg, const Mega__V1__WatchJobResponse *item),
                                 void *arg) {
  for (size_t i = 0; replay && i < j->hist_len; i++) fn(arg, mega_job_hist_at(j, i));
  megad_watcher *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->job = j;
  w->local = fn;
  w->arg = arg;
  w->next = d->watchers;
  d->watchers = w;
  return w;
}

void megad_watch_drop_all(megad *d) {
  while (d->watchers) {
    megad_watcher *w = d->watchers;
    d->watchers = w->next;
    if (w->call) {
      mega_rpc_call_on_cancel(w->call, NULL, NULL);
      mega_rpc_fail(w->call, MEGA_RPC_UNAVAILABLE, "megad on %s is shutting down", d->node_id);
    }
    free(w);
  }
}

/* ---- handlers ---- */

static void reply_job(mega_rpc_call *call, const mega_job *j, int kind) {
  mega_job_msg m;
  mega_err e = {0};
  if (mega_job_msg_init(&m, j, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  if (kind == 0) {
    Mega__V1__SubmitJobResponse r = MEGA__V1__SUBMIT_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
  } else if (kind == 1) {
    Mega__V1__GetJobResponse r = MEGA__V1__GET_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
  } else {
    Mega__V1__CancelJobResponse r = MEGA__V1__CANCEL_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
  }
  mega_job_msg_free(&m);
}

static mega_job *find_or_fail(megad *d, mega_rpc_call *call, const char *id) {
  mega_job *j = mega_jobs_find(&d->jobs, id);
  if (!j)
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND,
                  "no job '%s' on node %s (a job lives on the megad that accepted it)",
                  id ? id : "", d->node_id);
  return j;
}

static void on_submit(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__SubmitJobRequest *req = (const void *)msg;
  mega_job *j;
  mega_err e = {0};
  if (megad_submit(d, req->spec, &j, &e) != MEGA_OK) {
    if (d->stopping) mega_rpc_fail(call, MEGA_RPC_UNAVAILABLE, "%s", e.msg);
    else mega_rpc_fail_err(call, &e);
    return;
  }
  reply_job(call, j, 0);
  megad_schedule(d);
}

static void on_get(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__GetJobRequest *req = (const void *)msg;
  mega_job *j = find_or_fail(d, call, req->job_id);
  if (j) reply_job(call, j, 1);
}

static void on_list(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__ListJobsRequest *req = (const void *)msg;
  size_t n = d->jobs.n, k = 0;
  mega_job_msg *ms = calloc(n ? n : 1, sizeof *ms);
  Mega__V1__Job **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  if (!ms || !ptrs) {
    free(ms);
    free(ptrs);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = n; i-- > 0;) { /* newest first */
    const mega_job *j = d->jobs.v[i];
    bool want = req->n_states == 0;
    for (size_t s = 0; s < req->n_states; s++) want |= req->states[s] == j->state;
    if (!want || (req->limit && k == req->limit)) continue;
    if (mega_job_msg_init(&ms[k], j, NULL) != MEGA_OK) continue;
    ptrs[k] = &ms[k].job;
    k++;
  }
  Mega__V1__ListJobsResponse r = MEGA__V1__LIST_JOBS_RESPONSE__INIT;
  r.jobs = ptrs;
  r.n_jobs = k;
  mega_rpc_reply(call, &r.base);
  for (size_t i = 0; i < k; i++) mega_job_msg_free(&ms[i]);
  free(ms);
  free(ptrs);
}

typedef struct cancel_ctx {
  megad *d;
  mega_rpc_call *call;
  mega_job *job;
  bool answered, waiting;
} cancel_ctx;

static void cancel_finished(void *arg, mega_job *j) {
  cancel_ctx *c = arg;
  c->answered = true;
  if (c->waiting) mega_rpc_call_on_cancel(c->call, NULL, NULL);
  reply_job(c->call, j, 2);
  if (c->waiting) free(c);
}

static void cancel_call_gone(mega_rpc_call *call, void *arg) {
  cancel_ctx *c = arg;
  megad_cancel_forget(c->d, c->job, c);
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "the client went away; job %s is still being cancelled",
                c->job->id);
  free(c);
}

static void on_cancel_job(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__CancelJobRequest *req = (const void *)msg;
  mega_job *j = find_or_fail(d, call, req->job_id);
  if (!j) return;
  cancel_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *c = (cancel_ctx){d, call, j, false, false};
  /* answered once the job is over: no worker is left behind by then */
  megad_cancel(d, j, req->reason, cancel_finished, c);
  if (c->answered) {
    free(c);
    return;
  }
  c->waiting = true;
  mega_rpc_call_on_cancel(call, cancel_call_gone, c);
}

static void on_watch(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__WatchJobRequest *req = (const void *)msg;
  mega_job *j = find_or_fail(d, call, req->job_id);
  if (!j) return;
  bool final_sent = false;
  for (size_t i = 0; req->replay && i < j->hist_len; i++) {
    const Mega__V1__WatchJobResponse *item = mega_job_hist_at(j, i);
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
  megad_watcher *w = calloc(1, sizeof *w);
  if (!w) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->job = j;
  w->call = call;
  w->arg = d;
  w->next = d->watchers;
  d->watchers = w;
  mega_rpc_call_on_cancel(call, watcher_gone, w);
  /* a cancel before the callback was set is not replayed */
  if (mega_rpc_call_cancelled(call)) {
    mega_rpc_call_on_cancel(call, NULL, NULL);
    watcher_gone(call, w);
  }
}

void megad_control_register(megad *d) {
  mega_rpc_server_handle(d->srv, &mega_control_submit_job, on_submit, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_control_get_job, on_get, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_control_list_jobs, on_list, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_control_cancel_job, on_cancel_job, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_control_watch_job, on_watch, d, NULL);
}
