#include "worker/rank/link.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "proto/frame.h"
#include "core/version.h"

/* A KV call waiting for its KvResponse. */
typedef struct kv_call {
  struct kv_call *next;
  uint64_t id;
  bool done;
  Mega__V1__KvResponse *resp; /* owned once done */
} kv_call;

struct mega_link {
  int fd, wake; /* wake: an eventfd that stops the reader */
  Mega__V1__DaemonFrame *first;
  pthread_mutex_t wmu; /* one frame written at a time */
  pthread_mutex_t mu;  /* the rest */
  pthread_cond_t cv;
  kv_call *calls;
  uint64_t next_id;
  bool closed; /* the reader saw EOF, an error or an Abort */
  bool hold;     /* the first Abort asked the rank to hold its state */
  bool released; /* and then: an Abort without hold, EOF, an error or silence */
  char why[MEGA_ERR_MSG_MAX];
  bool reader_started;
  pthread_t reader;
  mega_link_abort_fn abort_fn, stop_fn;
  void *abort_arg;
  int default_timeout_ms;
  int pipe_timeout_ms; /* silence that means megad is frozen or gone; 0: none */
  /* checkpoint answers received, newest last: a go-ahead, or a refusal
   * (refused[i] says why) */
  uint64_t commits[8];
  char refused[8][256];
  size_t ncommits;
};

static void link_free(mega_link *l) {
  if (l->first) protobuf_c_message_free_unpacked(&l->first->base, NULL);
  for (kv_call *c = l->calls, *n; c; c = n) {
    n = c->next;
    if (c->resp) protobuf_c_message_free_unpacked(&c->resp->base, NULL);
    free(c);
  }
  if (l->fd >= 0) close(l->fd);
  if (l->wake >= 0) close(l->wake);
  pthread_mutex_destroy(&l->wmu);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  free(l);
}

mega_status mega_link_open(int fd, int timeout_ms, mega_link **out, mega_err *err) {
  *out = NULL;
  signal(SIGPIPE, SIG_IGN);
  mega_link *l = calloc(1, sizeof *l);
  if (!l) {
    close(fd);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening the link to megad");
  }
  l->fd = fd;
  l->wake = eventfd(0, EFD_CLOEXEC);
  l->next_id = 1;
  pthread_mutex_init(&l->wmu, NULL);
  pthread_mutex_init(&l->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines below are monotonic */
  pthread_cond_init(&l->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (l->wake < 0) {
    link_free(l);
    return mega_fail(err, MEGA_ERR_IO, "eventfd: %s", strerror(errno));
  }
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n;
  do n = poll(&p, 1, timeout_ms > 0 ? timeout_ms : 30000);
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    link_free(l);
    return mega_fail(err, n == 0 ? MEGA_ERR_TIMEOUT : MEGA_ERR_IO,
                     "no assignment from megad on fd %d%s%s", fd, n == 0 ? " in time" : ": ",
                     n == 0 ? "" : strerror(errno));
  }
  ProtobufCMessage *msg = NULL;
  mega_status s = mega_frame_read(fd, &mega__v1__daemon_frame__descriptor, 0, &msg, err);
  if (s != MEGA_OK) {
    mega_err_prefix(err, "reading the assignment from megad");
    link_free(l);
    return s;
  }
  Mega__V1__DaemonFrame *f = (Mega__V1__DaemonFrame *)msg;
  if (!f || f->msg_case != MEGA__V1__DAEMON_FRAME__MSG_ASSIGNMENT) {
    if (f) protobuf_c_message_free_unpacked(msg, NULL);
    link_free(l);
    return mega_fail(err, MEGA_ERR_PEER, "megad %s instead of sending an assignment first",
                     f ? "sent another frame" : "closed the pipe");
  }
  l->first = f;
  const Mega__V1__Bootstrap *b = f->assignment->bootstrap;
  l->default_timeout_ms = b && b->kv_timeout_ms ? (int)b->kv_timeout_ms : 60000;
  l->pipe_timeout_ms = (int)f->assignment->pipe_timeout_ms;
  *out = l;
  return MEGA_OK;
}

const Mega__V1__Assignment *mega_link_assignment(const mega_link *l) {
  return l->first->assignment;
}

/* Ends the link for good: every waiting KV call fails with why; the abort
 * callback runs (once). hold: an Abort that lets the rank keep its state;
 * anything else also releases a held rank. Called on the reader thread. */
static void end_link(mega_link *l, const char *why, bool hold) {
  pthread_mutex_lock(&l->mu);
  bool first = !l->closed;
  if (first) {
    l->closed = true;
    l->hold = hold;
    snprintf(l->why, sizeof l->why, "%s", why);
  }
  if (!hold) l->released = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  if (first && l->abort_fn) l->abort_fn(l->abort_arg, why);
}

static void on_kv_response(mega_link *l, Mega__V1__KvResponse *r) {
  pthread_mutex_lock(&l->mu);
  kv_call *c = l->calls;
  while (c && c->id != r->request_id) c = c->next;
  if (c && !c->done) {
    c->resp = r;
    c->done = true;
    r = NULL;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL); /* a call that gave up */
}

static void on_commit(mega_link *l, const Mega__V1__CommitCheckpointRequest *c) {
  pthread_mutex_lock(&l->mu);
  size_t cap = sizeof l->commits / sizeof l->commits[0];
  if (l->ncommits == cap) {
    memmove(l->commits, l->commits + 1, (cap - 1) * sizeof l->commits[0]);
    memmove(l->refused, l->refused + 1, (cap - 1) * sizeof l->refused[0]);
    l->ncommits--;
  }
  snprintf(l->refused[l->ncommits], sizeof l->refused[0], "%s", c->refused ? c->refused : "");
  l->commits[l->ncommits++] = c->iteration;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static void *reader_main(void *arg) {
  mega_link *l = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = l->fd, .events = POLLIN}, {.fd = l->wake, .events = POLLIN}};
    int n = poll(p, 2, l->pipe_timeout_ms > 0 ? l->pipe_timeout_ms : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      end_link(l, "the link to megad failed (poll)", false);
      return NULL;
    }
    if (n == 0) { /* megad pings far more often than this */
      char why[160];
      snprintf(why, sizeof why,
               "megad sent nothing on the worker pipe for %.1f s (it is frozen or gone)",
               l->pipe_timeout_ms / 1000.0);
      end_link(l, why, false);
      return NULL;
    }
    if (p[1].revents) return NULL; /* mega_link_close */
    ProtobufCMessage *msg = NULL;
    mega_err e = {0};
    if (mega_frame_read(l->fd, &mega__v1__daemon_frame__descriptor, 0, &msg, &e) != MEGA_OK) {
      char why[MEGA_ERR_MSG_MAX + 64];
      snprintf(why, sizeof why, "the pipe from megad broke: %s", e.msg);
      end_link(l, why, false);
      return NULL;
    }
    if (!msg) {
      end_link(l, "megad closed the worker pipe (the daemon stopped or died)", false);
      return NULL;
    }
    Mega__V1__DaemonFrame *f = (Mega__V1__DaemonFrame *)msg;
    if (f->msg_case == MEGA__V1__DAEMON_FRAME__MSG_KV) {
      on_kv_response(l, f->kv);
      f->kv = NULL; /* on_kv_response took it */
      f->msg_case = MEGA__V1__DAEMON_FRAME__MSG__NOT_SET;
    } else if (f->msg_case == MEGA__V1__DAEMON_FRAME__MSG_COMMIT) {
      on_commit(l, f->commit);
    } else if (f->msg_case == MEGA__V1__DAEMON_FRAME__MSG_ABORT) {
      char why[MEGA_ERR_MSG_MAX];
      snprintf(why, sizeof why, "aborted by megad: %s",
               f->abort->reason && f->abort->reason[0] ? f->abort->reason : "no reason given");
      end_link(l, why, f->abort->hold);
    } else if (f->msg_case == MEGA__V1__DAEMON_FRAME__MSG_STOP && l->stop_fn) {
      l->stop_fn(l->abort_arg, f->stop->reason && f->stop->reason[0] ? f->stop->reason
                                                                       : "megad asked to stop");
    }
    protobuf_c_message_free_unpacked(msg, NULL);
  }
}

void mega_link_on_stop(mega_link *l, mega_link_abort_fn stop_fn) { l->stop_fn = stop_fn; }

mega_status mega_link_start(mega_link *l, mega_link_abort_fn abort_fn, void *arg, mega_err *err) {
  l->abort_fn = abort_fn;
  l->abort_arg = arg;
  int rc = pthread_create(&l->reader, NULL, reader_main, l);
  if (rc) return mega_fail(err, MEGA_ERR_IO, "cannot start the link's reader: %s", strerror(rc));
  l->reader_started = true;
  return MEGA_OK;
}

static mega_status send_frame(mega_link *l, Mega__V1__WorkerFrame *f, mega_err *err) {
  pthread_mutex_lock(&l->wmu);
  mega_status s = mega_frame_write(l->fd, &f->base, 0, err);
  pthread_mutex_unlock(&l->wmu);
  if (s != MEGA_OK) mega_err_prefix(err, "writing to megad");
  return s;
}

/* ---- KV ---- */

static void deadline_after(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends req (its request_id filled here) and waits up to wait_ms for the
 * answer; *resp is the caller's. timeout_ms is the request's own limit, to
 * tell "not there in time" from other failures. */
static mega_status kv_call_run(mega_link *l, Mega__V1__KvRequest *req, int timeout_ms,
                               Mega__V1__KvResponse **resp, mega_err *err) {
  *resp = NULL;
  kv_call *c = calloc(1, sizeof *c);
  if (!c) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  pthread_mutex_lock(&l->mu);
  if (l->closed) {
    pthread_mutex_unlock(&l->mu);
    free(c);
    return mega_fail(err, MEGA_ERR_PEER, "%s", l->why);
  }
  c->id = req->request_id = l->next_id++;
  c->next = l->calls;
  l->calls = c;
  pthread_mutex_unlock(&l->mu);

  int64_t t0 = mono_ms();
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_KV;
  f.kv = req;
  mega_status s = send_frame(l, &f, err);

  /* megad answers within timeout_ms; the margin covers a slow coordinator. */
  struct timespec until;
  deadline_after(&until, timeout_ms + 15000);
  pthread_mutex_lock(&l->mu);
  while (s == MEGA_OK && !c->done && !l->closed)
    if (pthread_cond_timedwait(&l->cv, &l->mu, &until) == ETIMEDOUT) break;
  if (s == MEGA_OK && !c->done)
    s = l->closed ? mega_fail(err, MEGA_ERR_PEER, "%s", l->why)
                  : mega_fail(err, MEGA_ERR_TIMEOUT, "megad did not answer a key-value request in %d ms",
                              timeout_ms + 15000);
  for (kv_call **p = &l->calls; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  pthread_mutex_unlock(&l->mu);
  if (s == MEGA_OK && c->resp->error && c->resp->error[0]) {
    bool late = mono_ms() - t0 >= timeout_ms;
    s = mega_fail(err, late ? MEGA_ERR_TIMEOUT : MEGA_ERR_PEER, "%s", c->resp->error);
  }
  if (s == MEGA_OK) *resp = c->resp;
  else if (c->resp) protobuf_c_message_free_unpacked(&c->resp->base, NULL);
  free(c);
  return s;
}

static int pick_timeout(mega_link *l, int timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : l->default_timeout_ms;
}

static mega_status kv_set(void *ctx, const char *key, const void *value, size_t len,
                          mega_err *err) {
  mega_link *l = ctx;
  Mega__V1__KvSetRequest set = MEGA__V1__KV_SET_REQUEST__INIT;
  set.key = (char *)key;
  set.value.data = (uint8_t *)value;
  set.value.len = len;
  Mega__V1__KvRequest req = MEGA__V1__KV_REQUEST__INIT;
  req.op_case = MEGA__V1__KV_REQUEST__OP_SET;
  req.set = &set;
  Mega__V1__KvResponse *resp;
  mega_status s = kv_call_run(l, &req, l->default_timeout_ms, &resp, err);
  if (s == MEGA_OK) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return s;
}

static mega_status kv_wait(void *ctx, const char *const *keys, size_t nkeys, int timeout_ms,
                           mega_err *err) {
  mega_link *l = ctx;
  int t = pick_timeout(l, timeout_ms);
  Mega__V1__KvWaitRequest w = MEGA__V1__KV_WAIT_REQUEST__INIT;
  w.keys = (char **)keys;
  w.n_keys = nkeys;
  w.timeout_ms = (uint32_t)t;
  Mega__V1__KvRequest req = MEGA__V1__KV_REQUEST__INIT;
  req.op_case = MEGA__V1__KV_REQUEST__OP_WAIT;
  req.wait = &w;
  Mega__V1__KvResponse *resp;
  mega_status s = kv_call_run(l, &req, t, &resp, err);
  if (s == MEGA_OK) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return s;
}

/* One KvGet that waits for the key (one call to the coordinator, not a wait
 * and a get). A megad that does not wait answers at once: then the wait and
 * the get, as before. */
static mega_status kv_get(void *ctx, const char *key, void **value, size_t *len, int timeout_ms,
                          mega_err *err) {
  mega_link *l = ctx;
  *value = NULL;
  *len = 0;
  int t = pick_timeout(l, timeout_ms);
  Mega__V1__KvGetRequest g = MEGA__V1__KV_GET_REQUEST__INIT;
  g.key = (char *)key;
  g.wait_ms = (uint32_t)t;
  Mega__V1__KvRequest req = MEGA__V1__KV_REQUEST__INIT;
  req.op_case = MEGA__V1__KV_REQUEST__OP_GET;
  req.get = &g;
  Mega__V1__KvResponse *resp;
  mega_status s = kv_call_run(l, &req, t, &resp, err);
  if (s == MEGA_OK && !resp->found) {
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    const char *keys[1] = {key};
    g.wait_ms = 0;
    if ((s = kv_wait(ctx, keys, 1, timeout_ms, err)) != MEGA_OK) return s;
    if ((s = kv_call_run(l, &req, l->default_timeout_ms, &resp, err)) != MEGA_OK) return s;
  }
  if (s != MEGA_OK) return s;
  if (!resp->found) {
    s = mega_fail(err, MEGA_ERR_PEER, "key '%s' vanished from megad's store (the job attempt ended?)",
                  key);
  } else {
    void *v = malloc(resp->value.len ? resp->value.len : 1);
    if (!v) {
      s = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    } else {
      if (resp->value.len) memcpy(v, resp->value.data, resp->value.len);
      *value = v;
      *len = resp->value.len;
    }
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return s;
}

/* A rank's part of a group's rendezvous: one KvGather, which megad answers
 * (or forwards to the coordinator) once every key exists. */
static mega_status kv_gather(void *ctx, const mega_kv_gather *in, int timeout_ms, void **out,
                             size_t *lens, mega_err *err) {
  mega_link *l = ctx;
  *out = NULL;
  int t = pick_timeout(l, timeout_ms);
  Mega__V1__KvSetRequest set = MEGA__V1__KV_SET_REQUEST__INIT;
  set.key = (char *)in->set_key;
  set.value = (ProtobufCBinaryData){in->set_len, (uint8_t *)in->set_value};
  Mega__V1__KvGatherRequest g = MEGA__V1__KV_GATHER_REQUEST__INIT;
  g.prefix = (char *)(in->prefix ? in->prefix : "");
  g.set = in->set_key ? &set : NULL;
  g.keys = (char **)in->keys;
  g.n_keys = in->nkeys;
  g.timeout_ms = (uint32_t)t;
  g.parts = in->parts;
  g.part = in->parts ? (uint32_t *)in->part : NULL;
  g.n_part = in->parts ? in->nkeys : 0;
  Mega__V1__KvRequest req = MEGA__V1__KV_REQUEST__INIT;
  req.here = in->here;
  req.op_case = MEGA__V1__KV_REQUEST__OP_GATHER;
  req.gather = &g;
  Mega__V1__KvResponse *resp;
  mega_status s = kv_call_run(l, &req, t, &resp, err);
  if (s != MEGA_OK) return s;
  size_t total = 0, n = in->nkeys;
  if (resp->n_values != n)
    s = mega_fail(err, MEGA_ERR_PEER, "megad answered a gather of %zu keys with %zu values "
                  "(an older megad?)", n, resp->n_values);
  for (size_t i = 0; s == MEGA_OK && i < n; i++) total += resp->values[i].len;
  uint8_t *buf = s == MEGA_OK ? malloc(total ? total : 1) : NULL;
  if (s == MEGA_OK && !buf) s = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0, at = 0; s == MEGA_OK && i < n; i++) {
    if (resp->values[i].len) memcpy(buf + at, resp->values[i].data, resp->values[i].len);
    at += lens[i] = resp->values[i].len;
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  if (s == MEGA_OK) *out = buf;
  return s;
}

const mega_kv_ops mega_link_kv_ops = {
    .set = kv_set, .get = kv_get, .wait = kv_wait, .gather = kv_gather};

/* ---- sends ---- */

mega_status mega_link_send_hello(mega_link *l, const char *device, mega_err *err) {
  Mega__V1__WorkerHello h = MEGA__V1__WORKER_HELLO__INIT;
  h.rank = mega_link_assignment(l)->rank;
  h.pid = (int32_t)getpid();
  h.version = (char *)mega_version();
  h.device = (char *)(device ? device : "cpu");
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_HELLO;
  f.hello = &h;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_step(mega_link *l, const mega_rank_metrics *m, mega_err *err) {
  Mega__V1__RankMetrics rm = MEGA__V1__RANK_METRICS__INIT;
  rm.rank = (uint32_t)m->rank;
  rm.pp_rank = (uint32_t)m->pp_rank;
  rm.dp_rank = (uint32_t)m->dp_rank;
  rm.tp_rank = (uint32_t)m->tp_rank;
  rm.compute_s = m->compute_s;
  rm.tp_comm_s = m->tp_comm_s;
  rm.bubble_s = m->bubble_s;
  rm.bubble_warmup_s = m->bubble_warmup_s;
  rm.bubble_steady_s = m->bubble_steady_s;
  rm.bubble_cooldown_s = m->bubble_cooldown_s;
  rm.p2p_wait_s = m->p2p_wait_s;
  rm.grad_sync_exposed_s = m->grad_sync_exposed_s;
  rm.peak_activation_bytes = m->peak_activation_bytes;
  rm.step_time_s = m->step_time_s;
  rm.peak_inflight = m->peak_inflight > 0 ? (uint32_t)m->peak_inflight : 0;
  rm.param_bytes = m->param_bytes;
  rm.grad_bytes = m->grad_bytes;
  rm.optimizer_state_bytes = m->optimizer_state_bytes;
  rm.shard_copy_bytes = m->shard_copy_bytes;
  rm.shard_copy_s = m->shard_copy_s;
  Mega__V1__StepReport r = MEGA__V1__STEP_REPORT__INIT;
  r.iteration = m->iteration > 0 ? (uint64_t)m->iteration : 0;
  r.metrics = &rm;
  r.has_loss = m->has_loss;
  r.loss = m->loss;
  r.has_grad_norm = m->has_grad_norm;
  r.grad_norm = m->grad_norm;
  r.lr = m->lr;
  r.tokens = m->tokens;
  r.skipped = m->skipped;
  r.step_start_unix_us = m->step_start_unix_us;
  r.has_eval_loss = m->has_eval_loss;
  r.eval_loss = m->eval_loss;
  r.has_final_eval_loss = m->has_final_eval_loss;
  r.final_eval_loss = m->final_eval_loss;
  r.has_test_loss = m->has_test_loss;
  r.test_loss = m->test_loss;
  Mega__V1__ActionSpan *spans = NULL, **sp = NULL;
  if (m->nspans) {
    spans = calloc(m->nspans, sizeof *spans);
    sp = calloc(m->nspans, sizeof *sp);
    if (!spans || !sp) {
      free(spans);
      free(sp);
      return mega_fail(err, MEGA_ERR_NOMEM, "out of memory sending %zu trace spans", m->nspans);
    }
    for (size_t i = 0; i < m->nspans; i++) {
      mega__v1__action_span__init(&spans[i]);
      spans[i].name = (char *)m->spans[i].name;
      spans[i].cat = (char *)(m->spans[i].cat ? m->spans[i].cat : "");
      spans[i].start_us = m->spans[i].start_us;
      spans[i].dur_us = m->spans[i].dur_us;
      sp[i] = &spans[i];
    }
    r.spans = sp;
    r.n_spans = m->nspans;
  }
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_STEP;
  f.step = &r;
  mega_status s = send_frame(l, &f, err);
  free(spans);
  free(sp);
  return s;
}

mega_status mega_link_send_checkpoint(mega_link *l, const mega_rank_ckpt_report *r,
                                      mega_err *err) {
  Mega__V1__CheckpointDone c = MEGA__V1__CHECKPOINT_DONE__INIT;
  c.iteration = r->iteration > 0 ? (uint64_t)r->iteration : 0;
  c.path = (char *)(r->path ? r->path : "");
  c.bytes = r->bytes;
  c.duration_s = r->duration_s;
  c.committed = r->committed;
  c.blocked_s = r->blocked_s;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_CHECKPOINT_DONE;
  f.checkpoint_done = &c;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_progress(mega_link *l, const char *phase, int64_t iteration,
                                    mega_err *err) {
  Mega__V1__Progress p = MEGA__V1__PROGRESS__INIT;
  p.phase = (char *)phase;
  p.iteration = iteration > 0 ? (uint64_t)iteration : 0;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_PROGRESS;
  f.progress = &p;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_note(mega_link *l, const char *message, int64_t fell_back_to,
                                const char *fell_back_path, mega_err *err) {
  Mega__V1__WorkerNote n = MEGA__V1__WORKER_NOTE__INIT;
  n.message = (char *)message;
  if (fell_back_path && fell_back_to > 0) {
    n.fell_back_to = (uint64_t)fell_back_to;
    n.fell_back_path = (char *)fell_back_path;
  }
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_NOTE;
  f.note = &n;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_stopped(mega_link *l, int64_t iteration, const char *reason,
                                   bool asked, mega_err *err) {
  Mega__V1__WorkerStopped st = MEGA__V1__WORKER_STOPPED__INIT;
  st.iteration = iteration > 0 ? (uint64_t)iteration : 0;
  st.reason = (char *)reason;
  st.asked = asked;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_STOPPED;
  f.stopped = &st;
  return send_frame(l, &f, err);
}

mega_status mega_link_await_commit(mega_link *l, int64_t iteration, int timeout_ms,
                                   mega_err *err) {
  struct timespec until;
  deadline_after(&until, timeout_ms > 0 ? timeout_ms : l->default_timeout_ms);
  mega_status s = MEGA_OK;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    size_t got = l->ncommits;
    for (size_t i = 0; i < l->ncommits && got == l->ncommits; i++)
      if (l->commits[i] == (uint64_t)iteration) got = i;
    if (got < l->ncommits && l->refused[got][0]) {
      s = mega_fail(err, MEGA_ERR_UNSUPPORTED, "megad refused the commit of iteration %lld: %s",
                    (long long)iteration, l->refused[got]);
      break;
    }
    if (got < l->ncommits) break;
    if (l->closed) {
      s = mega_fail(err, MEGA_ERR_CANCELLED, "%s", l->why);
      break;
    }
    if (pthread_cond_timedwait(&l->cv, &l->mu, &until) == ETIMEDOUT) {
      s = mega_fail(err, MEGA_ERR_TIMEOUT,
                    "megad did not answer the commit of iteration %lld in %d ms",
                    (long long)iteration, timeout_ms > 0 ? timeout_ms : l->default_timeout_ms);
      break;
    }
  }
  pthread_mutex_unlock(&l->mu);
  return s;
}

bool mega_link_hold_asked(mega_link *l) {
  pthread_mutex_lock(&l->mu);
  bool h = l->hold;
  pthread_mutex_unlock(&l->mu);
  return h;
}

bool mega_link_released(mega_link *l) {
  pthread_mutex_lock(&l->mu);
  bool r = l->released;
  pthread_mutex_unlock(&l->mu);
  return r;
}

mega_status mega_link_send_held(mega_link *l, const mega_rank_held *h, const char *address,
                                const uint8_t *token, size_t token_len, mega_err *err) {
  uint32_t shards[2];
  for (int i = 0; i < h->nshards && i < 2; i++) shards[i] = (uint32_t)h->shards[i];
  Mega__V1__RankHeld m = MEGA__V1__RANK_HELD__INIT;
  m.iteration = h->iteration > 0 ? (uint64_t)h->iteration : 0;
  m.pp = (uint32_t)h->pp;
  m.tp = (uint32_t)h->tp;
  m.dp = (uint32_t)h->dp;
  m.dp_size = (uint32_t)h->dp_size;
  m.all_params = h->all_params;
  m.full_moments = h->full_moments;
  m.shards = shards;
  m.n_shards = (size_t)(h->nshards < 2 ? h->nshards : 2);
  m.address = (char *)address;
  m.token.data = (uint8_t *)token;
  m.token.len = token_len;
  m.bytes = h->bytes;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_HELD;
  f.held = &m;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_recovered(mega_link *l, int64_t iteration, uint64_t bytes,
                                     double seconds, mega_err *err) {
  Mega__V1__RankRecovered m = MEGA__V1__RANK_RECOVERED__INIT;
  m.iteration = iteration > 0 ? (uint64_t)iteration : 0;
  m.bytes = bytes;
  m.seconds = seconds;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_RECOVERED;
  f.recovered = &m;
  return send_frame(l, &f, err);
}

mega_status mega_link_send_error(mega_link *l, const char *message, bool retryable, bool fatal,
                                 mega_err *err) {
  Mega__V1__WorkerError e = MEGA__V1__WORKER_ERROR__INIT;
  e.message = (char *)(message ? message : "");
  e.retryable = retryable;
  e.fatal = fatal;
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_ERROR;
  f.error = &e;
  return send_frame(l, &f, err);
}

void mega_link_close(mega_link *l) {
  if (!l) return;
  if (l->reader_started) {
    uint64_t one = 1;
    if (write(l->wake, &one, sizeof one) < 0) {
      /* an eventfd write only fails on overflow, which one write cannot cause */
    }
    pthread_join(l->reader, NULL);
  }
  link_free(l);
}
