#include "testsrv.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/mega_rpc.h"

typedef struct job {
  char id[32];
  char *name;
  char **args;
  size_t n_args;
  Mega__V1__JobState state;
  uint64_t train_iters, last_iteration;
} job;

#define MEGA_TEST_CONTAINER(ptr, type, member) \
  ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

struct testsrv {
  mega_rpc_cq *cq;
  mega_rpc_server *srv;
  testsrv_stats *stats;
  job *jobs;
  size_t n_jobs;
  void (*done)(void *);
  void *done_arg;
};

/* An answer that comes later, from a timer. */
typedef struct later {
  testsrv *t;
  mega_rpc_call *call;
  uv_timer_t timer;
  size_t job;
  uint64_t iter;
} later;

static void note_queued(testsrv *t, mega_rpc_call *call) {
  int q = (int)mega_rpc_call_queued(call);
  int old = atomic_load(&t->stats->max_queued);
  while (q > old && !atomic_compare_exchange_weak(&t->stats->max_queued, &old, q)) {
  }
}

static job *find_job(testsrv *t, const char *id) {
  for (size_t i = 0; i < t->n_jobs; i++)
    if (strcmp(t->jobs[i].id, id) == 0) return &t->jobs[i];
  return NULL;
}

/* Fills m (pointing into j) for sending; nothing is allocated. */
static void job_msg(const job *j, Mega__V1__Job *m, Mega__V1__JobSpec *spec) {
  mega__v1__job__init(m);
  mega__v1__job_spec__init(spec);
  spec->name = j->name;
  spec->n_args = j->n_args;
  spec->args = j->args;
  m->id = (char *)j->id;
  m->name = j->name;
  m->state = j->state;
  m->spec = spec;
  m->world_size = 1;
  m->tp = m->pp = m->dp = m->vp = 1;
  m->train_iters = j->train_iters;
  m->last_iteration = j->last_iteration;
  m->coordinator_node_id = "test-node";
}

static void later_closed(uv_handle_t *h) { free(h->data); }

static void later_free(later *l) {
  uv_timer_stop(&l->timer);
  l->timer.data = l;
  uv_close((uv_handle_t *)&l->timer, later_closed);
}

static later *later_new(testsrv *t, mega_rpc_call *call, size_t job_idx) {
  later *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->t = t;
  l->call = call;
  l->job = job_idx;
  uv_timer_init(mega_rpc_cq_loop(t->cq), &l->timer);
  return l;
}

/* ---- handlers ---- */

static void on_submit(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  const Mega__V1__SubmitJobRequest *req = (const void *)msg;
  if (!req->spec || !req->spec->name || !req->spec->name[0]) {
    mega_rpc_fail(call, MEGA_RPC_INVALID_ARGUMENT, "the job spec has no name: give --name");
    return;
  }
  job *js = realloc(t->jobs, (t->n_jobs + 1) * sizeof *js);
  if (!js) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  t->jobs = js;
  job *j = &t->jobs[t->n_jobs];
  memset(j, 0, sizeof *j);
  snprintf(j->id, sizeof j->id, "j-%zu", t->n_jobs + 1);
  j->name = strdup(req->spec->name);
  j->n_args = req->spec->n_args;
  j->args = calloc(j->n_args ? j->n_args : 1, sizeof *j->args);
  for (size_t i = 0; i < j->n_args; i++) {
    j->args[i] = strdup(req->spec->args[i]);
    const char *a = req->spec->args[i];
    if (strcmp(a, "--train-iters") == 0 && i + 1 < j->n_args)
      j->train_iters = strtoull(req->spec->args[i + 1], NULL, 10);
  }
  j->state = MEGA__V1__JOB_STATE__JOB_STATE_PENDING;
  t->n_jobs++;
  Mega__V1__SubmitJobResponse resp = MEGA__V1__SUBMIT_JOB_RESPONSE__INIT;
  Mega__V1__Job m;
  Mega__V1__JobSpec spec;
  job_msg(j, &m, &spec);
  resp.job = &m;
  mega_rpc_reply(call, &resp.base);
}

static void slow_cancelled(mega_rpc_call *call, void *arg) {
  testsrv *t = arg;
  atomic_fetch_add(&t->stats->cancels, 1);
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "cancelled");
}

static void on_get(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  const Mega__V1__GetJobRequest *req = (const void *)msg;
  if (strcmp(req->job_id, "j-slow") == 0) { /* held until the client gives up */
    mega_rpc_call_on_cancel(call, slow_cancelled, t);
    return;
  }
  job *j = find_job(t, req->job_id);
  if (!j) {
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND, "job %s not found", req->job_id);
    return;
  }
  Mega__V1__GetJobResponse resp = MEGA__V1__GET_JOB_RESPONSE__INIT;
  Mega__V1__Job m;
  Mega__V1__JobSpec spec;
  job_msg(j, &m, &spec);
  resp.job = &m;
  mega_rpc_reply(call, &resp.base);
}

static void on_list(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  const Mega__V1__ListJobsRequest *req = (const void *)msg;
  size_t n = t->n_jobs;
  Mega__V1__Job *ms = calloc(n ? n : 1, sizeof *ms);
  Mega__V1__JobSpec *specs = calloc(n ? n : 1, sizeof *specs);
  Mega__V1__Job **ptrs = calloc(n ? n : 1, sizeof *ptrs);
  Mega__V1__ListJobsResponse resp = MEGA__V1__LIST_JOBS_RESPONSE__INIT;
  for (size_t i = 0; i < n; i++) {
    bool want = req->n_states == 0;
    for (size_t k = 0; k < req->n_states; k++) want |= req->states[k] == t->jobs[i].state;
    if (!want || (req->limit && resp.n_jobs == req->limit)) continue;
    job_msg(&t->jobs[i], &ms[i], &specs[i]);
    ptrs[resp.n_jobs++] = &ms[i];
  }
  resp.jobs = ptrs;
  mega_rpc_reply(call, &resp.base);
  free(ms);
  free(specs);
  free(ptrs);
}

static void cancel_job_fire(uv_timer_t *h) {
  later *l = MEGA_TEST_CONTAINER(h, later, timer);
  job *j = &l->t->jobs[l->job];
  j->state = MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED;
  Mega__V1__CancelJobResponse resp = MEGA__V1__CANCEL_JOB_RESPONSE__INIT;
  Mega__V1__Job m;
  Mega__V1__JobSpec spec;
  job_msg(j, &m, &spec);
  resp.job = &m;
  mega_rpc_reply(l->call, &resp.base);
  later_free(l);
}

static void later_cancelled(mega_rpc_call *call, void *arg) {
  later *l = arg;
  atomic_fetch_add(&l->t->stats->cancels, 1);
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "cancelled");
  later_free(l);
}

static void on_cancel_job(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  const Mega__V1__CancelJobRequest *req = (const void *)msg;
  job *j = find_job(t, req->job_id);
  if (!j) {
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND, "job %s not found", req->job_id);
    return;
  }
  later *l = later_new(t, call, (size_t)(j - t->jobs));
  if (!l) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  mega_rpc_call_on_cancel(call, later_cancelled, l);
  uv_timer_start(&l->timer, cancel_job_fire, 20, 0);
}

static void step_msg(uint64_t iter, Mega__V1__StepMetrics *s, Mega__V1__RankMetrics *r,
                     Mega__V1__RankMetrics **rp) {
  mega__v1__step_metrics__init(s);
  s->iteration = iter;
  s->loss = 10.0 / (double)iter;
  s->step_time_s = 0.125;
  s->tokens_per_s = 1024.0;
  for (int k = 0; k < 2; k++) {
    mega__v1__rank_metrics__init(&r[k]);
    r[k].rank = (uint32_t)k;
    r[k].pp_rank = (uint32_t)k;
    r[k].compute_s = 0.1;
    r[k].bubble_s = 0.025;
    rp[k] = &r[k];
  }
  s->n_ranks = 2;
  s->ranks = rp;
}

static mega_status send_step(mega_rpc_call *call, uint64_t iter) {
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics r[2], *rp[2];
  step_msg(iter, &s, r, rp);
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = &s;
  return mega_rpc_send(call, &item.base, NULL);
}

static void watch_tick(uv_timer_t *h) {
  later *l = MEGA_TEST_CONTAINER(h, later, timer);
  job *j = &l->t->jobs[l->job];
  if (send_step(l->call, ++l->iter) == MEGA_OK) j->last_iteration = l->iter;
}

static void watch_cancelled(mega_rpc_call *call, void *arg) {
  later *l = arg;
  atomic_fetch_add(&l->t->stats->cancels, 1);
  atomic_fetch_sub(&l->t->stats->streams_open, 1);
  l->t->jobs[l->job].state = MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED;
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "watch cancelled");
  later_free(l);
}

static void stream_cancelled(mega_rpc_call *call, void *arg) {
  testsrv *t = arg;
  atomic_fetch_add(&t->stats->cancels, 1);
  atomic_fetch_sub(&t->stats->streams_open, 1);
  mega_rpc_finish(call);
}

static void on_watch(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  const Mega__V1__WatchJobRequest *req = (const void *)msg;
  job *j = find_job(t, req->job_id);
  if (!j) {
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND, "job %s not found", req->job_id);
    return;
  }
  atomic_fetch_add(&t->stats->streams_open, 1);
  j->state = MEGA__V1__JOB_STATE__JOB_STATE_RUNNING;
  if (j->train_iters == 0) { /* until the client goes away */
    later *l = later_new(t, call, (size_t)(j - t->jobs));
    mega_rpc_call_on_cancel(call, watch_cancelled, l);
    uv_timer_start(&l->timer, watch_tick, 5, 5);
    return;
  }
  mega_rpc_call_on_cancel(call, stream_cancelled, t);
  for (uint64_t i = 1; i <= j->train_iters; i++) {
    if (send_step(call, i) != MEGA_OK) return; /* cancelled: the callback ends it */
    note_queued(t, call);
  }
  j->last_iteration = j->train_iters;
  j->state = MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED;
  ev.message = "finished";
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  mega_rpc_send(call, &item.base, NULL);
  Mega__V1__Job m;
  Mega__V1__JobSpec spec;
  job_msg(j, &m, &spec);
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
  item.final_state = &m;
  mega_rpc_send(call, &item.base, NULL);
  atomic_fetch_sub(&t->stats->streams_open, 1);
  mega_rpc_finish(call);
}

static void on_nodes(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  (void)msg;
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  Mega__V1__ListNodesResponse resp = MEGA__V1__LIST_NODES_RESPONSE__INIT;
  Mega__V1__Node node = MEGA__V1__NODE__INIT, *np = &node;
  node.id = "test-node";
  node.address = "127.0.0.1";
  node.state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  node.slots = 4;
  node.backend = "cpu";
  resp.n_nodes = 1;
  resp.nodes = &np;
  resp.self_node_id = "test-node";
  mega_rpc_reply(call, &resp.base);
}

static void on_trace(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  (void)msg;
  testsrv *t = data;
  atomic_fetch_add(&t->stats->handled, 1);
  atomic_fetch_add(&t->stats->streams_open, 1);
  mega_rpc_call_on_cancel(call, stream_cancelled, t);
  uint8_t *buf = malloc(TESTSRV_TRACE_CHUNK);
  for (size_t off = 0; buf && off < TESTSRV_TRACE_BYTES; off += TESTSRV_TRACE_CHUNK) {
    for (size_t i = 0; i < TESTSRV_TRACE_CHUNK; i++) buf[i] = (uint8_t)(((off + i) * 7 + 3) % 251);
    Mega__V1__TraceChunk c = MEGA__V1__TRACE_CHUNK__INIT;
    c.data.data = buf;
    c.data.len = TESTSRV_TRACE_CHUNK;
    c.total_bytes = TESTSRV_TRACE_BYTES;
    if (mega_rpc_send(call, &c.base, NULL) != MEGA_OK) {
      free(buf);
      return;
    }
    note_queued(t, call);
  }
  free(buf);
  atomic_fetch_sub(&t->stats->streams_open, 1);
  mega_rpc_finish(call);
}

/* ---- lifetime ---- */

mega_status testsrv_new(mega_rpc_cq *cq, const char *addr, size_t max_message_bytes,
                        testsrv_stats *stats, int *port, testsrv **out, mega_err *err) {
  *out = NULL;
  testsrv *t = calloc(1, sizeof *t);
  if (!t) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  t->cq = cq;
  t->stats = stats;
  mega_rpc_server_opts opts = {.max_message_bytes = max_message_bytes};
  mega_status st = mega_rpc_server_new(cq, &opts, &t->srv, err);
  if (st != MEGA_OK) {
    free(t);
    return st;
  }
  struct {
    const mega_rpc_method *m;
    mega_rpc_handler fn;
  } table[] = {
      {&mega_control_submit_job, on_submit}, {&mega_control_get_job, on_get},
      {&mega_control_list_jobs, on_list},    {&mega_control_cancel_job, on_cancel_job},
      {&mega_control_watch_job, on_watch},   {&mega_control_list_nodes, on_nodes},
      {&mega_control_get_trace, on_trace},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0] && st == MEGA_OK; i++)
    st = mega_rpc_server_handle(t->srv, table[i].m, table[i].fn, t, err);
  if (st == MEGA_OK) st = mega_rpc_server_listen(t->srv, addr, port, err);
  if (st == MEGA_OK) st = mega_rpc_server_start(t->srv, err);
  if (st != MEGA_OK) {
    mega_rpc_server_shutdown(t->srv, 0, free, t);
    return st;
  }
  *out = t;
  return MEGA_OK;
}

static void testsrv_down(void *arg) {
  testsrv *t = arg;
  for (size_t i = 0; i < t->n_jobs; i++) {
    for (size_t k = 0; k < t->jobs[i].n_args; k++) free(t->jobs[i].args[k]);
    free(t->jobs[i].args);
    free(t->jobs[i].name);
  }
  free(t->jobs);
  void (*done)(void *) = t->done;
  void *arg2 = t->done_arg;
  free(t);
  if (done) done(arg2);
}

void testsrv_shutdown(testsrv *t, unsigned grace_ms, void (*done)(void *), void *arg) {
  t->done = done;
  t->done_arg = arg;
  mega_rpc_server_shutdown(t->srv, grace_ms, testsrv_down, t);
}
