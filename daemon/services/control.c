/* The Control service: what megactl calls. A call about a job another node
 * coordinates is forwarded there (forward.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/etcd/etcd.h"
#include "daemon/jobs/jobtrace.h"
#include "daemon/model/util.h"
#include "daemon/services/services.h"

/* R_CANCEL_OVER: a cancel of a job that had ended already */
typedef enum { R_SUBMIT, R_GET, R_CANCEL, R_CANCEL_OVER, R_RESUME, R_RESCALE } reply_kind;

/* A job of the mirror whose coordinator a forwarded call could not reach
 * says so, and whose copy it is. */
static void note_copy(const megad_services *s, const mega_job *j, Mega__V1__Job *m,
                      int64_t since) {
  if (!since && j->coordinator) since = megad_unreachable_since(s, j->coordinator);
  if (!since) return;
  m->coordinator_unreachable_unix_ms = since;
  m->answered_by = s->b->node_id;
}

static void reply_job_from(const megad_services *s, mega_rpc_call *call, const mega_job *j,
                           reply_kind kind, int64_t unreachable_ms) {
  mega_job_msg m;
  mega_err e = {0};
  if (mega_job_msg_init(&m, j, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  if (s) note_copy(s, j, &m.job, unreachable_ms);
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
    r.events_left_out = mega_job_hist_events_left_out(&j->hist);
    mega_rpc_reply(call, &r.base);
    break;
  }
  case R_CANCEL:
  case R_CANCEL_OVER: {
    Mega__V1__CancelJobResponse r = MEGA__V1__CANCEL_JOB_RESPONSE__INIT;
    r.job = &m.job;
    r.already_over = kind == R_CANCEL_OVER;
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

static void reply_job(mega_rpc_call *call, const mega_job *j, reply_kind kind) {
  reply_job_from(NULL, call, j, kind, 0);
}

/* Whether this node's copy of j (etcd mode) answers call without the
 * job's coordinator: GetJob, and CancelJob of a job that ended, since
 * etcd's record says so and there is nothing to stop. */
static bool copy_answers(mega_rpc_call *call, const mega_job *j) {
  const mega_rpc_method *m = mega_rpc_call_method(call);
  return m == &mega_control_get_job ||
         (m == &mega_control_cancel_job && mega_job_state_final(j->state));
}

/* A call about a job whose coordinator cannot be reached: the mirror's
 * copy answers it (etcd mode) when it can, saying so. */
static bool answer_from_mirror(megad_services *s, mega_rpc_call *call, const char *job_id,
                               int64_t unreachable_ms) {
  const mega_job *j = megad_jobs_mirror_find(s->jobs, job_id);
  if (!j || !copy_answers(call, j)) return false;
  reply_job_from(s, call, j,
                 mega_rpc_call_method(call) == &mega_control_get_job ? R_GET : R_CANCEL_OVER,
                 unreachable_ms ? unreachable_ms : megad_unix_ms());
  return true;
}

/* The job, or NULL when the call was forwarded or answered NOT_FOUND. */
static mega_job *find(megad_services *s, mega_rpc_call *call, const char *id,
                      const ProtobufCMessage *req) {
  mega_job *j = megad_jobs_find(s->jobs, id);
  if (j && !j->etcd.fenced) return j; /* a fenced one is on its way out: another node has it */
  if (megad_forward(s, call, id, req, answer_from_mirror)) return NULL;
  /* etcd mode: a job with no coordinator right now is read from the mirror */
  if ((j = megad_jobs_mirror_find(s->jobs, id))) {
    if (copy_answers(call, j)) return j;
    /* ABORTED, so watchers try again; not UNAVAILABLE, which clients tell
     * as their own server being unreachable */
    mega_rpc_fail(call, MEGA_RPC_ABORTED,
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
  const Mega__V1__Job *x = *(Mega__V1__Job *const *)a, *y = *(Mega__V1__Job *const *)b;
  return x->created_unix_ms != y->created_unix_ms
             ? (x->created_unix_ms < y->created_unix_ms ? 1 : -1)
             : strcmp(y->id, x->id);
}

static bool wanted(const Mega__V1__ListJobsRequest *req, Mega__V1__JobState state) {
  bool want = req->n_states == 0;
  for (size_t st = 0; st < req->n_states; st++) want |= req->states[st] == state;
  return want;
}

/* Answers ListJobs with the jobs this node knows (the jobs it coordinates,
 * and in etcd mode every other job of the cluster from the mirror) and
 * those other nodes listed (remote, nremote), newest first. */
static void reply_list(megad_services *s, mega_rpc_call *call,
                       const Mega__V1__ListJobsRequest *req, Mega__V1__Job **remote,
                       size_t nremote, char **unanswered, size_t nun) {
  const mega_jobs *t = &s->jobs->t, *mi = &s->jobs->mirror;
  size_t n = t->n + mi->n, nlocal = 0;
  mega_job_msg *ms = calloc(n ? n : 1, sizeof *ms);
  Mega__V1__Job **ptrs = calloc(n + nremote + 1, sizeof *ptrs);
  if (!ms || !ptrs) {
    free(ms);
    free(ptrs);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    const mega_job *j = i < t->n ? t->v[i] : mi->v[i - t->n];
    if (i >= t->n && mega_jobs_table_find(t, j->id)) continue;
    if (!wanted(req, (Mega__V1__JobState)j->state)) continue;
    if (mega_job_msg_init(&ms[nlocal], j, NULL) != MEGA_OK) continue;
    if (i >= t->n) note_copy(s, j, &ms[nlocal].job, 0);
    ptrs[nlocal] = &ms[nlocal].job;
    nlocal++;
  }
  size_t k = nlocal;
  for (size_t i = 0; i < nremote; i++) {
    bool dup = false; /* a node's answer names only its own jobs; keep one of each anyway */
    for (size_t q = 0; q < k && !dup; q++) dup = !strcmp(ptrs[q]->id, remote[i]->id);
    if (!dup && wanted(req, remote[i]->state)) ptrs[k++] = remote[i];
  }
  qsort(ptrs, k, sizeof *ptrs, newest_first);
  Mega__V1__ListJobsResponse r = MEGA__V1__LIST_JOBS_RESPONSE__INIT;
  r.jobs = ptrs;
  r.n_jobs = req->limit && k > req->limit ? req->limit : k;
  r.unanswered = unanswered;
  r.n_unanswered = nun;
  mega_rpc_reply(call, &r.base);
  for (size_t i = 0; i < nlocal; i++) mega_job_msg_free(&ms[i]);
  free(ms);
  free(ptrs);
}

/* Without etcd a node knows only the jobs it coordinates: ls asks every
 * other live node for theirs (a job runs on nodes other than its
 * coordinator's, and `ls` there once said "no jobs"). */
typedef struct list_ctx {
  megad_services *s;
  mega_rpc_call *call; /* NULL once the client went away */
  Mega__V1__ListJobsRequest req; /* what the others are asked: local_only, no limit */
  uint32_t limit;                 /* the client's, applied once everything is in */
  Mega__V1__JobState *states;
  size_t waiting;
  ProtobufCMessage **answers;
  size_t nanswers;
  char **unanswered;
  size_t nun;
} list_ctx;

static void list_free(list_ctx *c) {
  for (size_t i = 0; i < c->nanswers; i++) protobuf_c_message_free_unpacked(c->answers[i], NULL);
  for (size_t i = 0; i < c->nun; i++) free(c->unanswered[i]);
  free(c->answers);
  free(c->unanswered);
  free(c->states);
  free(c);
}

static void list_done(list_ctx *c) {
  if (c->call) {
    mega_rpc_call_on_cancel(c->call, NULL, NULL);
    size_t nremote = 0;
    for (size_t i = 0; i < c->nanswers; i++)
      nremote += ((Mega__V1__ListJobsResponse *)c->answers[i])->n_jobs;
    Mega__V1__Job **remote = calloc(nremote + 1, sizeof *remote);
    size_t k = 0;
    for (size_t i = 0; remote && i < c->nanswers; i++) {
      Mega__V1__ListJobsResponse *r = (void *)c->answers[i];
      for (size_t q = 0; q < r->n_jobs; q++) remote[k++] = r->jobs[q];
    }
    Mega__V1__ListJobsRequest req = c->req;
    req.limit = c->limit;
    if (remote) reply_list(c->s, c->call, &req, remote, k, c->unanswered, c->nun);
    else mega_rpc_fail(c->call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    free(remote);
  }
  list_free(c);
}

typedef struct list_sub {
  list_ctx *c;
  char node[MEGAD_NODE_NAME_MAX + 1];
} list_sub;

static void list_answered(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)err;
  list_sub *sub = arg;
  list_ctx *c = sub->c;
  if (resp) {
    c->answers[c->nanswers++] = resp;
  } else {
    char *name = strdup(sub->node);
    if (name) c->unanswered[c->nun++] = name;
  }
  free(sub);
  if (--c->waiting == 0) list_done(c);
}

static void list_client_gone(mega_rpc_call *call, void *arg) {
  list_ctx *c = arg;
  c->call = NULL;
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "the client went away");
}

#define LIST_PEER_TIMEOUT_MS 2000

/* Starts the fan-out; false when there is no other live node to ask. */
static bool list_cluster(megad_services *s, mega_rpc_call *call,
                         const Mega__V1__ListJobsRequest *req) {
  size_t nn = s->members->nnodes;
  list_ctx *c = calloc(1, sizeof *c);
  if (!c) return false;
  *c = (list_ctx){.s = s, .call = call, .req = *req, .limit = req->limit};
  c->req.local_only = true;
  c->req.limit = 0; /* each node's newest need not be the cluster's */
  c->states = calloc(req->n_states + 1, sizeof *c->states);
  c->answers = calloc(nn + 1, sizeof *c->answers);
  c->unanswered = calloc(nn + 1, sizeof *c->unanswered);
  if (!c->states || !c->answers || !c->unanswered) {
    list_free(c);
    return false;
  }
  if (req->n_states) memcpy(c->states, req->states, req->n_states * sizeof *c->states);
  c->req.states = c->states;
  c->waiting = 1; /* held until every call is out */
  for (size_t i = 0; i < nn; i++) {
    megad_node *n = s->members->nodes[i];
    if (n->self) continue;
    if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
        n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
      /* not asked, since it cannot answer; but the jobs it coordinates are
       * missing from the list, so it is named like a node that was asked */
      char *name = strdup(n->id);
      if (name) c->unanswered[c->nun++] = name;
      continue;
    }
    list_sub *sub = calloc(1, sizeof *sub);
    if (!sub) continue;
    sub->c = c;
    snprintf(sub->node, sizeof sub->node, "%s", n->id);
    c->waiting++;
    if (megad_call(s->b, n->address, &mega_control_list_jobs, &c->req.base, LIST_PEER_TIMEOUT_MS,
                   list_answered, sub, NULL) != MEGA_OK) {
      mega_err e = {0};
      list_answered(sub, NULL, &e);
    }
  }
  if (c->waiting == 1 && !c->nun) { /* no one else */
    c->waiting = 0;
    c->call = NULL;
    list_free(c);
    return false;
  }
  mega_rpc_call_on_cancel(call, list_client_gone, c);
  if (--c->waiting == 0) list_done(c);
  return true;
}

static void on_list(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ListJobsRequest *req = (const void *)msg;
  if (!s->jobs->etcd && !req->local_only && list_cluster(s, call, req)) return;
  reply_list(s, call, req, NULL, 0, NULL, 0);
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
  if (mega_job_state_final(j->state)) { /* nothing to stop: say so, not "cancelled" again */
    reply_job_from(s, call, j, R_CANCEL_OVER, 0); /* a copy says so, as GetJob does */
    return;
  }
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
  mega_rpc_server_handle(srv, &mega_control_forget_node, megad_on_forget_node, s, NULL);
}
