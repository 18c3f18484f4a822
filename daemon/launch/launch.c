/* The launcher's worker processes (see launch.h): spawn, the pipe and its
 * frames, exits and abort (output capture: launch_output.c). Worker frames go on to the job's
 * coordinator through relay.c; hangcheck.c pings and watches for hung workers.
 *
 * A worker is done once it has exited and its stderr has drained (or a
 * moment later); its exit is reported, its handles closed. Abort sends an
 * Abort frame, then SIGKILL after the grace. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/jobspec.h"
#include "core/version.h"
#include "daemon/launch/launch_internal.h"
#include "daemon/model/roots.h"
#include "daemon/model/util.h"

extern char **environ;

/* ---- output capture ---- */

static void alloc_buf(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  size_t n = suggested < 65536 ? suggested : 65536;
  buf->base = malloc(n);
  buf->len = buf->base ? n : 0;
}

static void worker_try_finish(megad_worker *w);

static void on_out(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  megad_worker *w = s->data;
  bool is_err = s == (uv_stream_t *)&w->err;
  if (n > 0) launch_capture(w, buf->base, (size_t)n, is_err);
  free(buf->base);
  if (n < 0) {
    uv_read_stop(s);
    if (is_err) w->err_eof = true;
    else w->out_eof = true;
    worker_try_finish(w);
  }
}

/* ---- frames from the worker ---- */

static void worker_broke(megad_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void worker_broke(megad_worker *w, const char *fmt, ...) {
  if (w->broken || w->exited) return;
  w->broken = true;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Mega__V1__WorkerError e = MEGA__V1__WORKER_ERROR__INIT;
  e.message = msg;
  Mega__V1__RankEvent ev = MEGA__V1__RANK_EVENT__INIT;
  ev.kind_case = MEGA__V1__RANK_EVENT__KIND_ERROR;
  ev.error = &e;
  if (!w->error_msg) w->error_msg = strdup(msg);
  relay_event(w->l, w, &ev);
  launch_kill_worker(w);
}

static void release_slot(megad_worker *w);

static void handle_frame(megad_worker *w, Mega__V1__WorkerFrame *f) {
  megad_launch *l = w->l;
  Mega__V1__RankEvent ev = MEGA__V1__RANK_EVENT__INIT;
  switch (f->msg_case) {
  case MEGA__V1__WORKER_FRAME__MSG_HELLO:
    /* the node says it runs its megad's build (placement goes by it): a
     * megaw replaced under a running megad (an upgrade before the
     * restart) would make a job of two builds */
    if (!f->hello->version || strcmp(f->hello->version, mega_version())) {
      worker_broke(w, "its megaw (%s) is mega %s, but megad on node %s is %s: a job's ranks "
                   "run one build; restart megad after an upgrade, or give --worker the megaw "
                   "of megad's build", l->L->o.worker_path,
                   f->hello->version && f->hello->version[0] ? f->hello->version : "of no version",
                   l->L->b->node_id, mega_version());
      break;
    }
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_STARTED;
    ev.started = f->hello;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_STEP:
    if (f->step->metrics) f->step->metrics->rank = w->rank; /* the pipe says who it is */
    hangcheck_progress(w, "train", f->step->metrics ? f->step->metrics->step_time_s : 0);
    relay_step(l, f->step);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_PROGRESS:
    hangcheck_progress(w, f->progress->phase, 0);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_NOTE:
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_NOTE;
    ev.note = f->note;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_STOPPED:
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_STOPPED;
    ev.stopped = f->stopped;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_CHECKPOINT_DONE:
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_CHECKPOINT;
    ev.checkpoint = f->checkpoint_done;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_ERROR:
    if (!w->error_msg) w->error_msg = megad_strdup(f->error->message);
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_ERROR;
    ev.error = f->error;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_KV:
    relay_kv(w, f->kv);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_HELD:
    /* its slot is free for the next attempt, which fetches from it */
    w->held = true;
    release_slot(w);
    if (!w->held_msg) w->held_msg = (Mega__V1__RankHeld *)megad_pb_copy(&f->held->base);
    megad_log(l->L->b, "job %s attempt %u rank %u (pid %d) holds the state of iteration %llu "
              "at %s", l->req->job_id, l->req->attempt, w->rank, w->pid,
              (unsigned long long)f->held->iteration, f->held->address);
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_HELD;
    ev.held = f->held;
    relay_event(l, w, &ev);
    break;
  case MEGA__V1__WORKER_FRAME__MSG_RECOVERED:
    ev.kind_case = MEGA__V1__RANK_EVENT__KIND_RECOVERED;
    ev.recovered = f->recovered;
    relay_event(l, w, &ev);
    break;
  default:
    break;
  }
}

static void on_pipe_eof_timer(uv_timer_t *t) {
  megad_worker *w = t->data;
  if (!w->exited)
    worker_broke(w, "rank %u closed its pipe to megad but did not exit; killed it", w->rank);
}

static void on_pipe(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  megad_worker *w = s->data;
  if (n > 0) {
    mega_err e = {0};
    if (mega_frame_decoder_feed(&w->dec, buf->base, (size_t)n, &e) == MEGA_OK) {
      ProtobufCMessage *m;
      while (!w->closing && mega_frame_decoder_next(&w->dec, &m, &e) == MEGA_OK && m) {
        handle_frame(w, (Mega__V1__WorkerFrame *)m);
        protobuf_c_message_free_unpacked(m, NULL);
      }
    }
    if (e.status != MEGA_OK) {
      uv_read_stop(s);
      w->pipe_eof = true;
      worker_broke(w, "rank %u sent megad a frame that does not parse (%s); killed it", w->rank,
                   e.msg);
    }
  }
  free(buf->base);
  if (n < 0) {
    uv_read_stop(s);
    w->pipe_eof = true;
    if (!w->exited && !w->closing) uv_timer_start(&w->timer, on_pipe_eof_timer, 2000, 0);
    worker_try_finish(w);
  }
}

/* ---- exit and clean-up ---- */

/* A worker's slot is free once its process is gone: before its handles
 * close, so the attempt its exit ends can be placed here again at once. */
static void release_slot(megad_worker *w) {
  if (!w->slot_held) return;
  megad_launcher *L = w->l->L;
  w->slot_held = false;
  if (L->slots_used) L->slots_used--;
  if (L->slot_busy && w->slot < L->o.slots) L->slot_busy[w->slot] = false;
}

/* Takes the lowest free slot (the caller checked one is free). */
static void take_slot(megad_launcher *L, megad_worker *w) {
  L->slots_used++;
  w->slot_held = true;
  w->slot = 0;
  while (L->slot_busy && w->slot < L->o.slots && L->slot_busy[w->slot]) w->slot++;
  if (L->slot_busy && w->slot < L->o.slots) L->slot_busy[w->slot] = true;
}

static void handle_closed(uv_handle_t *h) {
  megad_worker *w = h->data;
  if (--w->open > 0) return;
  megad_launch *l = w->l;
  mega_frame_decoder_free(&w->dec);
  if (w->log_fd >= 0) close(w->log_fd);
  w->log_fd = -1;
  free(w->error_msg);
  w->error_msg = NULL;
  if (w->held_msg) protobuf_c_message_free_unpacked(&w->held_msg->base, NULL);
  w->held_msg = NULL;
  release_slot(w);
  l->live--;
  launch_maybe_free(l);
}

static void close_worker(megad_worker *w) {
  if (w->closing) return;
  w->closing = true;
  relay_worker_gone(w);
  uv_handle_t *hs[] = {(uv_handle_t *)&w->proc, (uv_handle_t *)&w->pipe, (uv_handle_t *)&w->out,
                       (uv_handle_t *)&w->err, (uv_handle_t *)&w->timer};
  for (size_t i = 0; i < 5; i++)
    if (!uv_is_closing(hs[i])) uv_close(hs[i], handle_closed);
}

static void report_exit(megad_worker *w) {
  if (w->reported) return;
  w->reported = true;
  release_slot(w);
  char *tail = launch_tail_text(w);
  Mega__V1__RankExit x = MEGA__V1__RANK_EXIT__INIT;
  x.exit_status = (int32_t)w->exit_status;
  x.term_signal = w->term_signal;
  x.stderr_tail = tail ? tail : "";
  Mega__V1__RankEvent ev = MEGA__V1__RANK_EVENT__INIT;
  ev.kind_case = MEGA__V1__RANK_EVENT__KIND_EXIT;
  ev.exit = &x;
  relay_event(w->l, w, &ev);
  free(tail);
}

static void on_drain_timer(uv_timer_t *t) {
  megad_worker *w = t->data;
  w->err_eof = w->out_eof = w->pipe_eof = true;
  worker_try_finish(w);
}

/* Done once it exited and its output drained (or the drain timer fired). */
static void worker_try_finish(megad_worker *w) {
  if (!w->exited || w->closing) return;
  if (!w->err_eof || !w->out_eof || !w->pipe_eof) return;
  report_exit(w);
  close_worker(w);
}

static void on_worker_exit(uv_process_t *p, int64_t status, int sig) {
  megad_worker *w = p->data;
  w->exited = true;
  w->exit_status = status;
  w->term_signal = sig;
  megad_log(w->l->L->b, "job %s attempt %u rank %u (pid %d) exited %s %d", w->l->req->job_id,
            w->l->req->attempt, w->rank, w->pid, sig ? "with signal" : "with status",
            sig ? sig : (int)status);
  /* stderr may still hold its last words; give it a moment */
  uv_timer_stop(&w->timer);
  uv_timer_start(&w->timer, on_drain_timer, 500, 0);
  worker_try_finish(w);
}

/* ---- start ---- */

static char *rank_path(const megad_launch *l, uint32_t rank, const char *suffix) {
  char *p = NULL;
  if (asprintf(&p, "%s/rank-%u%s", l->dir, rank, suffix) < 0) return NULL;
  return p;
}

/* MEGA_WORKER_FD tells megaw it was started by megad; MEGAD_PID lets it
 * notice a parent that died before PR_SET_PDEATHSIG was set. */
static char **worker_env(const megad_launcher *L) {
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 4, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "MEGA_WORKER_", 12) && strncmp(environ[i], "MEGAD_PID=", 10) &&
        strncmp(environ[i], "NOTIFY_SOCKET=", 14) && strncmp(environ[i], "WATCHDOG_", 9))
      env[k++] = environ[i];
  if (asprintf(&env[k++], "MEGA_WORKER_FD=3") < 0 ||
      asprintf(&env[k++], "MEGAD_PID=%d", (int)getpid()) < 0 ||
      asprintf(&env[k++], "MEGA_WORKER_HOSTNAME=%s", L->o.worker_host) < 0)
    env[k - 1] = NULL;
  return env;
}

static void free_env(char **env) {
  if (!env) return;
  size_t n = 0;
  while (env[n]) n++;
  for (size_t i = n >= 3 ? n - 3 : 0; i < n; i++) free(env[i]);
  free(env);
}

static mega_status spawn_worker(megad_launch *l, megad_worker *w, char **env, mega_err *err) {
  megad_launcher *L = l->L;
  uv_loop_t *loop = L->b->loop;
  const Mega__V1__LaunchRanksRequest *req = l->req;
  w->proc.data = w->pipe.data = w->out.data = w->err.data = w->timer.data = w;
  uv_pipe_init(loop, &w->pipe, 0);
  uv_pipe_init(loop, &w->out, 0);
  uv_pipe_init(loop, &w->err, 0);
  uv_timer_init(loop, &w->timer);
  w->open = 4;
  mega_frame_decoder_init(&w->dec, &mega__v1__worker_frame__descriptor, 0);
  char *log = rank_path(l, w->rank, ".log");
  w->log_fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
  free(log);

  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&w->out;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&w->err;
  stdio[3].flags = UV_CREATE_PIPE | UV_READABLE_PIPE | UV_WRITABLE_PIPE;
  stdio[3].data.stream = (uv_stream_t *)&w->pipe;
  char *args[] = {(char *)L->o.worker_path, NULL};
  uv_process_options_t po;
  memset(&po, 0, sizeof po);
  po.file = L->o.worker_path;
  po.args = args;
  po.env = env;
  po.exit_cb = on_worker_exit;
  po.stdio = stdio;
  po.stdio_count = 4;
  /* a session of its own: a terminal's ^C reaches megad, which stops the
   * job in order, not every worker at once */
  po.flags = UV_PROCESS_DETACHED;
  int rc = uv_spawn(loop, &w->proc, &po);
  w->open++; /* the process handle needs closing even when spawn failed */
  if (rc) {
    w->exited = true;
    w->reported = true;
    close_worker(w);
    return mega_fail(err, MEGA_ERR_IO, "cannot start %s for rank %u: %s", L->o.worker_path,
                     w->rank, uv_strerror(rc));
  }
  w->spawned = true;
  w->pid = w->proc.pid;
  snprintf(w->phase, sizeof w->phase, "setup");
  w->progress_ms = uv_now(loop);
  uv_read_start((uv_stream_t *)&w->pipe, alloc_buf, on_pipe);
  uv_read_start((uv_stream_t *)&w->out, alloc_buf, on_out);
  uv_read_start((uv_stream_t *)&w->err, alloc_buf, on_out);

  char *sdir = rank_path(l, w->rank, "");
  if (sdir) mkdir(sdir, 0700);
  Mega__V1__Assignment a = MEGA__V1__ASSIGNMENT__INIT;
  a.job_id = req->job_id;
  a.attempt = req->attempt;
  a.args = req->spec ? req->spec->args : NULL;
  a.n_args = req->spec ? req->spec->n_args : 0;
  a.rank = w->rank;
  a.world_size = req->world_size;
  a.local_rank = w->local_rank;
  a.local_world_size = (uint32_t)req->n_ranks;
  a.node_ranks = req->ranks;
  a.n_node_ranks = req->n_ranks;
  a.tp = req->tp;
  a.pp = req->pp;
  a.dp = req->dp;
  a.bootstrap = req->bootstrap;
  a.state_dir = sdir ? sdir : "";
  a.device = L->o.gpus ? (int32_t)w->slot : -1;
  a.backend = L->o.gpus ? "cuda" : "cpu";
  a.pipe_timeout_ms = L->o.pipe_timeout_ms;
  a.replicas = req->replicas;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ASSIGNMENT;
  f.assignment = &a;
  launch_send_frame(w, &f);
  free(sdir);
  return MEGA_OK;
}

mega_status megad_launch_start(megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                               int32_t *pids, mega_err *err) {
  megad_base *b = L->b;
  bool graceful = false;
  mega_status s = launch_check(L, req, &graceful, NULL, err);
  if (s != MEGA_OK) return s;
  megad_launch *l = calloc(1, sizeof *l);
  if (!l) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  l->L = L;
  l->req = (Mega__V1__LaunchRanksRequest *)megad_pb_copy(&req->base);
  l->w = calloc(req->n_ranks, sizeof *l->w);
  l->dir = l->req && l->w ? launch_attempt_dir(L, req->job_id, req->attempt, err) : NULL;
  if (!l->req || !l->w || !l->dir) {
    s = l->req && l->w ? err->status : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    if (l->req) protobuf_c_message_free_unpacked(&l->req->base, NULL);
    free(l->w);
    free(l->dir);
    free(l);
    return s;
  }
  l->coord_local = !strcmp(req->coordinator_node_id, b->node_id);
  l->graceful = graceful;
  uv_timer_init(b->loop, &l->kill_timer);
  uv_timer_init(b->loop, &l->retry_timer);
  l->kill_timer.data = l->retry_timer.data = l;
  l->timers_open = 2;
  l->next = L->launches;
  L->launches = l;
  launch_prune_attempts(l);
  char **env = worker_env(L);
  s = env ? MEGA_OK : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < req->n_ranks; i++) {
    megad_worker *w = &l->w[i];
    w->l = l;
    w->rank = req->ranks[i];
    w->local_rank = (uint32_t)i;
    w->log_fd = -1;
    pids[i] = 0;
    if (s != MEGA_OK) continue;
    l->nw++;
    l->live++;
    take_slot(L, w);
    if ((s = spawn_worker(l, w, env, err)) == MEGA_OK) pids[i] = w->pid;
  }
  free_env(env);
  if (s != MEGA_OK) {
    megad_launch_abort(L, req->job_id, req->attempt, false, err->msg, 0);
    return s;
  }
  megad_log(b, "job %s attempt %u: started %zu worker%s (ranks %u..%u)", req->job_id,
            req->attempt, req->n_ranks, req->n_ranks == 1 ? "" : "s", req->ranks[0],
            req->ranks[req->n_ranks - 1]);
  return MEGA_OK;
}

/* ---- abort ---- */

void megad_launch_abort_coord(megad_launcher *L, const char *coord_id, const char *reason,
                              bool hold) {
  for (megad_launch *l = L->launches; l; l = l->next)
    if (!strcmp(l->req->coordinator_node_id, coord_id)) {
      l->coord_gone = true;
      if (hold && !l->coord_local) resend_orphan(l); /* for the node that takes the job over */
      if (hold) l->orphan_until = uv_now(L->b->loop) + L->o.orphan_hold_ms;
      launch_abort(l, reason, hold ? MEGAD_HOLD_GRACE_MS : MEGAD_ABORT_GRACE_MS, hold);
      relay_flush(l);
      launch_maybe_free(l);
    }
  resend_tick(L); /* to a new coordinator known already */
}

size_t megad_launch_stop_graceful(megad_launcher *L, const char *job_id, const char *reason) {
  size_t n = 0;
  Mega__V1__Stop st = MEGA__V1__STOP__INIT;
  st.reason = (char *)reason;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_STOP;
  f.stop = &st;
  for (megad_launch *l = L->launches; l; l = l->next) {
    if (!l->graceful || l->aborting || !l->live || (job_id && strcmp(job_id, l->req->job_id)))
      continue;
    for (size_t i = 0; i < l->nw; i++) launch_send_frame(&l->w[i], &f);
    n++;
  }
  return n;
}

bool megad_launch_graceful_live(const megad_launcher *L) {
  for (const megad_launch *l = L->launches; l; l = l->next)
    if (l->graceful && !l->aborting && l->live) return true;
  return false;
}

void megad_launch_abort_all(megad_launcher *L, const char *reason) {
  for (megad_launch *l = L->launches; l; l = l->next)
    launch_abort(l, reason, MEGAD_ABORT_GRACE_MS, false);
}

mega_status megad_launch_commit(megad_launcher *L, const Mega__V1__CommitCheckpointRequest *req,
                                mega_err *err) {
  for (megad_launch *l = L->launches; l; l = l->next) {
    if (strcmp(l->req->job_id, req->job_id) || l->req->attempt != req->attempt || l->aborting)
      continue;
    for (size_t i = 0; i < l->nw; i++) {
      megad_worker *w = &l->w[i];
      if (w->rank != req->rank || w->exited || w->closing) continue;
      Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
      f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_COMMIT;
      f.commit = (Mega__V1__CommitCheckpointRequest *)req;
      launch_send_frame(w, &f);
      return MEGA_OK;
    }
  }
  return mega_fail(err, MEGA_ERR_NOT_FOUND, "node %s runs no rank %u of job %s attempt %u",
                   L->b->node_id, req->rank, req->job_id, req->attempt);
}

/* Calls f on each worker of job_id's attempt in a launch not released. */
static void each_attempt_worker(const megad_launcher *L, const char *job_id, uint32_t attempt,
                                void (*f)(const megad_worker *w, void *arg), void *arg) {
  for (const megad_launch *l = L->launches; l; l = l->next)
    if (!strcmp(l->req->job_id, job_id) && l->req->attempt == attempt && !l->released)
      for (size_t i = 0; i < l->nw; i++) f(&l->w[i], arg);
}

static bool holds(const megad_worker *w) { return w->held && w->held_msg && !w->exited; }

static void count_held(const megad_worker *w, void *arg) { *(size_t *)arg += holds(w); }

static void add_held(const megad_worker *w, void *arg) {
  Mega__V1__ListHeldResponse *r = arg;
  if (holds(w)) {
    Mega__V1__HeldRank *hr = r->held[r->n_held++];
    mega__v1__held_rank__init(hr);
    hr->rank = w->rank;
    hr->held = (Mega__V1__RankHeld *)w->held_msg;
  } else if (w->spawned && !w->exited && !w->held) {
    r->stopping++;
  }
}

Mega__V1__ListHeldResponse *megad_launch_held(const megad_launcher *L, const char *job_id,
                                              uint32_t attempt) {
  size_t n = 0;
  each_attempt_worker(L, job_id, attempt, count_held, &n);
  /* the response, then n pointers, then the n entries they point at */
  Mega__V1__ListHeldResponse *r =
      calloc(1, sizeof *r + n * (sizeof(Mega__V1__HeldRank *) + sizeof(Mega__V1__HeldRank)));
  if (!r) return NULL;
  mega__v1__list_held_response__init(r);
  r->held = (Mega__V1__HeldRank **)(r + 1);
  Mega__V1__HeldRank *entries = (Mega__V1__HeldRank *)(r->held + n);
  for (size_t i = 0; i < n; i++) r->held[i] = &entries[i];
  each_attempt_worker(L, job_id, attempt, add_held, r);
  return r;
}

bool megad_launch_idle(const megad_launcher *L) {
  for (const megad_launch *l = L->launches; l; l = l->next)
    if (l->live) return false;
  return true;
}

bool megad_launch_has(const megad_launcher *L, const char *job_id) {
  for (const megad_launch *l = L->launches; l; l = l->next)
    if (!strcmp(l->req->job_id, job_id)) return true;
  return false;
}

size_t megad_launch_coordinators(const megad_launcher *L, const char **ids, size_t max) {
  size_t n = 0;
  for (const megad_launch *l = L->launches; l && n < max; l = l->next) {
    if (!l->live || l->coord_local || l->coord_gone) continue;
    bool dup = false;
    for (size_t i = 0; i < n && !dup; i++) dup = !strcmp(ids[i], l->req->coordinator_node_id);
    if (!dup) ids[n++] = l->req->coordinator_node_id;
  }
  return n;
}

uint32_t megad_launch_load(const megad_launcher *L, const char **ids, size_t max, size_t *n) {
  *n = 0;
  for (const megad_launch *l = L->launches; l && *n < max; l = l->next) {
    if (!l->live) continue;
    bool dup = false;
    for (size_t i = 0; i < *n && !dup; i++) dup = !strcmp(ids[i], l->req->job_id);
    if (!dup) ids[(*n)++] = l->req->job_id;
  }
  return L->slots_used;
}

/* ---- the launcher ---- */

void megad_launch_stalled(megad_launcher *L) {
  for (megad_launch *l = L->launches; l; l = l->next) relay_probe(l);
}

/* Held ranks whose coordinator did not come back in time let go. */
static void orphans_tick(megad_launcher *L) {
  uint64_t now = uv_now(L->b->loop);
  for (megad_launch *l = L->launches; l; l = l->next)
    if (l->orphan_until && now >= l->orphan_until && !l->released) {
      l->orphan_until = 0;
      megad_log(L->b, "job %s attempt %u: no coordinator asked for its held ranks in %.1f s; "
                "letting them go", l->req->job_id, l->req->attempt,
                L->o.orphan_hold_ms / 1000.0);
      launch_abort(l, "no coordinator asked for the state it held", MEGAD_ABORT_GRACE_MS, false);
    }
}

static void on_tick(uv_timer_t *t) {
  hangcheck_tick(t->data);
  resend_tick(t->data);
  orphans_tick(t->data);
}

mega_status megad_launcher_init(megad_launcher *L, megad_base *b, megad_kvserve *kvs,
                                const megad_launcher_opts *o, const megad_launcher_cbs *cbs,
                                mega_err *err) {
  memset(L, 0, sizeof *L);
  L->b = b;
  L->kvs = kvs;
  L->o = *o;
  if (!(L->slot_busy = calloc(o->slots ? o->slots : 1, sizeof *L->slot_busy)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for %u slots", o->slots);
  if (!L->o.ping_ms) L->o.ping_ms = 500;
  if (!L->o.pipe_timeout_ms) L->o.pipe_timeout_ms = 3000;
  if (!L->o.step_floor_ms) L->o.step_floor_ms = 2000;
  if (!L->o.rendezvous_timeout_ms) L->o.rendezvous_timeout_ms = 60000;
  if (!L->o.orphan_hold_ms) L->o.orphan_hold_ms = MEGAD_ORPHAN_HOLD_MS;
  L->cbs = *cbs;
  uv_timer_init(b->loop, &L->tick);
  L->tick.data = L;
  L->tick_on = true;
  uv_timer_start(&L->tick, on_tick, 100, 100);
  return MEGA_OK;
}

void megad_launcher_free(megad_launcher *L) {
  if (L->tick_on) uv_close((uv_handle_t *)&L->tick, NULL);
  L->tick_on = false;
  resend_free_all(L);
  free(L->slot_busy); /* workers of launches still closing read it no more: slots_used only */
  L->slot_busy = NULL;
}
