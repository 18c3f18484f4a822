/* The Control service: what megactl calls. A call about a job another node
 * coordinates is forwarded there (forward.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/etcd/etcd.h"
#include "daemon/jobs/jobtrace.h"
#include "daemon/services/services.h"

typedef enum { R_SUBMIT, R_GET, R_CANCEL, R_RESUME, R_RESCALE } reply_kind;

static void reply_job(mega_rpc_call *call, const mega_job *j, reply_kind kind) {
  mega_job_msg m;
  mega_err e = {0};
  if (mega_job_msg_init(&m, j, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  switch (kind) {
  case R_SUBMIT: {
    Mega__V1__SubmitJobResponse r = MEGA__V1__SUBMIT_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
    break;
  }
  case R_GET: {
    Mega__V1__GetJobResponse r = MEGA__V1__GET_JOB_RESPONSE__INIT;
    r.job = &m.job;
    r.events = j->hist.events;
    r.n_events = j->hist.nevents;
    mega_rpc_reply(call, &r.base);
    break;
  }
  case R_CANCEL: {
    Mega__V1__CancelJobResponse r = MEGA__V1__CANCEL_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
    break;
  }
  case R_RESUME: {
    Mega__V1__ResumeJobResponse r = MEGA__V1__RESUME_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
    break;
  }
  case R_RESCALE: {
    Mega__V1__RescaleJobResponse r = MEGA__V1__RESCALE_JOB_RESPONSE__INIT;
    r.job = &m.job;
    mega_rpc_reply(call, &r.base);
    break;
  }
  }
  mega_job_msg_free(&m);
}

/* The job, or NULL when the call was forwarded or answered NOT_FOUND. */
static mega_job *find(megad_services *s, mega_rpc_call *call, const char *id,
                      const ProtobufCMessage *req) {
  mega_job *j = megad_jobs_find(s->jobs, id);
  if (j && !j->etcd.fenced) return j; /* a fenced one is on its way out: another node has it */
  if (megad_forward(s, call, id, req)) return NULL;
  /* etcd mode: a job with no coordinator right now is read from the mirror */
  if ((j = megad_jobs_mirror_find(s->jobs, id))) {
    if (mega_rpc_call_method(call) == &mega_control_get_job) return j;
    /* UNAVAILABLE, so watchers try again; the message has no ": ", which
     * clients would cut at */
    mega_rpc_fail(call, MEGA_RPC_UNAVAILABLE,
                  "job %s has no coordinator right now (%s); a surviving node takes a running job "
                  "over within seconds, so ask again", id,
                  mega_job_state_final(j->state) ? "it ended and its coordinator is gone"
                                                  : "its coordinator's etcd lease expired");
    return NULL;
  }
  mega_rpc_fail(call, MEGA_RPC_NOT_FOUND, "no job '%s' in the cluster node %s knows", id ? id : "",
                s->b->node_id);
  return NULL;
}

bool megad_services_ready(megad_services *s, const char **why) {
  *why = NULL;
  if (s->b->stopping) {
    *why = "megad is stopping";
    return false;
  }
  return !s->jobs->etcd ||
         (megad_etcd_ok(s->jobs->etcd, why) && megad_jobs_durable(s->jobs, why));
}

static void on_submit(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__SubmitJobRequest *req = (const void *)msg;
  mega_job *j;
  mega_err e = {0};
  const char *away = NULL;
  if (s->jobs->etcd && (!megad_etcd_ok(s->jobs->etcd, &away) || !megad_jobs_durable(s->jobs, &away))) {
    /* not UNAVAILABLE, whose message clients replace with their own
     * connection's story: this one is megad's answer, to be shown as is */
    mega_rpc_fail(call, MEGA_RPC_FAILED_PRECONDITION,
                  "megad on %s takes no new jobs while etcd is unreachable (%s); running jobs go "
                  "on; submit again once etcd is back", s->b->node_id, away ? away : "?");
    return;
  }
  if (megad_coord_submit(s->coord, req->spec, &j, &e) != MEGA_OK) {
    if (s->b->stopping) mega_rpc_fail(call, MEGA_RPC_UNAVAILABLE, "%s", e.msg);
    else mega_rpc_fail_err(call, &e);
    return;
  }
  reply_job(call, j, R_SUBMIT);
  megad_coord_schedule(s->coord);
}

static void on_get(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__GetJobRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (j) reply_job(call, j, R_GET);
}

static int newest_first(const void *a, const void *b) {
  const mega_job *x = *(const mega_job *const *)a, *y = *(const mega_job *const *)b;
  return x->created_ms != y->created_ms ? (x->created_ms < y->created_ms ? 1 : -1)
                                        : strcmp(y->id, x->id);
}

/* The jobs this node coordinates, and in etcd mode every other job of the
 * cluster from the mirror; newest first. */
static void on_list(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ListJobsRequest *req = (const void *)msg;
  const mega_jobs *t = &s->jobs->t, *mi = &s->jobs->mirror;
  size_t n = t->n + mi->n, k = 0, nj = 0;
  mega_job_msg *ms = calloc(n ? n : 1, sizeof *ms);
  Mega__V1__Job **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  const mega_job **jobs = calloc(n ? n : 1, sizeof *jobs);
  if (!ms || !ptrs || !jobs) {
    free(ms);
    free(ptrs);
    free(jobs);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < t->n; i++) jobs[nj++] = t->v[i];
  for (size_t i = 0; i < mi->n; i++)
    if (!mega_jobs_table_find(t, mi->v[i]->id)) jobs[nj++] = mi->v[i];
  if (mi->n) qsort(jobs, nj, sizeof *jobs, newest_first);
  for (size_t i = 0; i < nj; i++) {
    const mega_job *j = mi->n ? jobs[i] : jobs[nj - 1 - i]; /* the table is oldest first */
    bool want = req->n_states == 0;
    for (size_t st = 0; st < req->n_states; st++) want |= req->states[st] == j->state;
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
  free(jobs);
}

typedef struct cancel_ctx {
  megad_services *s;
  mega_rpc_call *call;
  mega_job *job;
  bool answered, waiting;
} cancel_ctx;

static void cancel_finished(void *arg, mega_job *j) {
  cancel_ctx *c = arg;
  c->answered = true;
  if (c->waiting) mega_rpc_call_on_cancel(c->call, NULL, NULL);
  reply_job(c->call, j, R_CANCEL);
  if (c->waiting) free(c);
}

static void cancel_call_gone(mega_rpc_call *call, void *arg) {
  cancel_ctx *c = arg;
  megad_coord_cancel_forget(c->s->coord, c->job, c);
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "the client went away; job %s is still being cancelled",
                c->job->id);
  free(c);
}

static void on_cancel_job(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__CancelJobRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (!j) return;
  cancel_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *c = (cancel_ctx){s, call, j, false, false};
  /* answered once the job is over: no worker is left behind by then */
  megad_coord_cancel(s->coord, j, req->reason, cancel_finished, c);
  if (c->answered) {
    free(c);
    return;
  }
  c->waiting = true;
  mega_rpc_call_on_cancel(call, cancel_call_gone, c);
}

static void on_resume(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ResumeJobRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (!j) return;
  mega_err e = {0};
  if (megad_coord_resume(s->coord, j, &e) != MEGA_OK) mega_rpc_fail_err(call, &e);
  else reply_job(call, j, R_RESUME);
}

static void on_rescale(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__RescaleJobRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (!j) return;
  mega_err e = {0};
  if (megad_coord_rescale(s->coord, j, req->nnodes, &e) != MEGA_OK) mega_rpc_fail_err(call, &e);
  else reply_job(call, j, R_RESCALE);
}

static void on_watch(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__WatchJobRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (j) megad_watch_call(&s->jobs->watchers, j, call, req->replay);
}

static void on_get_trace(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__GetTraceRequest *req = (const void *)msg;
  mega_job *j = find(s, call, req->job_id, msg);
  if (j) megad_trace_send(s->b, j, call);
}

void megad_control_register(megad_services *s, mega_rpc_server *srv) {
  mega_rpc_server_handle(srv, &mega_control_submit_job, on_submit, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_get_job, on_get, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_list_jobs, on_list, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_cancel_job, on_cancel_job, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_watch_job, on_watch, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_get_trace, on_get_trace, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_resume_job, on_resume, s, NULL);
  mega_rpc_server_handle(srv, &mega_control_rescale_job, on_rescale, s, NULL);
}
