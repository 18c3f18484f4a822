/* megad's life cycle: start (state dir, journal replay, server, peers) and
 * shutdown in order. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "daemon/megad.h"
#include "daemon/util.h"

/* ---- logging ---- */

static void vlog(megad *d, bool warn, const char *fmt, va_list ap) {
  if (d->o.quiet && !warn) return;
  char line[1024];
  vsnprintf(line, sizeof line, fmt, ap);
  /* Under systemd the journal adds time and name; a terminal gets both. */
  if (getenv("JOURNAL_STREAM")) {
    fprintf(stderr, "%s%s\n", warn ? "<4>" : "<6>", line);
  } else {
    time_t t = time(NULL);
    struct tm tm;
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime_r(&t, &tm));
    fprintf(stderr, "megad[%s] %s %s%s\n", d->node_id ? d->node_id : "-", ts,
            warn ? "warning: " : "", line);
  }
}

void megad_log(megad *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(d, false, fmt, ap);
  va_end(ap);
}

void megad_warn(megad *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(d, true, fmt, ap);
  va_end(ap);
}

/* ---- files ---- */

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

char *megad_job_dir(megad *d, const char *job_id) {
  char *dir = NULL;
  if (asprintf(&dir, "%s/jobs/%s", d->state_dir, job_id) < 0) return NULL;
  if (mkdir_p(dir)) {
    megad_warn(d, "cannot create %s: %s", dir, strerror(errno));
    free(dir);
    return NULL;
  }
  return dir;
}

mega_status megad_journal_job(megad *d, const mega_job *j, mega_err *err) {
  uint8_t *buf;
  size_t len;
  mega_status s = mega_jrec_job(j, &buf, &len, err);
  if (s == MEGA_OK) {
    s = mega_journal_append(d->journal, buf, len, err);
    free(buf);
  }
  if (s != MEGA_OK) megad_warn(d, "journal: %s", err ? err->msg : "cannot append");
  return s;
}

/* ---- async calls ---- */

struct megad_rpc {
  megad_rpc *next, *prev;
  megad *d;
  mega_rpc_channel *ch; /* a channel of its own (megad_call_addr), or NULL */
  mega_rpc_pending *p;
  mega_rpc_reply_fn cb;
  void *arg;
};

static void rpc_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  megad_rpc *r = arg;
  megad *d = r->d;
  if (r->prev) r->prev->next = r->next;
  else d->rpcs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->cb(r->arg, resp, err);
  if (r->ch) mega_rpc_channel_free(r->ch);
  free(r);
}

static mega_status call_on(megad *d, mega_rpc_channel *ch, bool own, const mega_rpc_method *m,
                           const ProtobufCMessage *req, unsigned timeout_ms, mega_rpc_reply_fn cb,
                           void *arg, mega_err *err) {
  megad_rpc *r = calloc(1, sizeof *r);
  if (!r) {
    if (own) mega_rpc_channel_free(ch);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  r->d = d;
  r->ch = own ? ch : NULL;
  r->cb = cb;
  r->arg = arg;
  mega_status s = mega_rpc_unary_async(ch, d->cq, m, req, timeout_ms, rpc_done, r, &r->p, err);
  if (s != MEGA_OK) {
    if (own) mega_rpc_channel_free(ch);
    free(r);
    return s;
  }
  r->next = d->rpcs;
  if (d->rpcs) d->rpcs->prev = r;
  d->rpcs = r;
  return MEGA_OK;
}

static mega_status channel_to(const char *address, mega_rpc_channel **ch, mega_err *err) {
  mega_rpc_channel_opts o = {.peer_name = "megad", .max_backoff_ms = 1000};
  return mega_rpc_channel_new(address, &o, ch, err);
}

mega_status megad_call(megad *d, megad_node *n, const mega_rpc_method *m,
                       const ProtobufCMessage *req, unsigned timeout_ms, mega_rpc_reply_fn cb,
                       void *arg, mega_err *err) {
  if (!n->ch) {
    mega_status s = channel_to(n->address, &n->ch, err);
    if (s != MEGA_OK) return s;
  }
  return call_on(d, n->ch, false, m, req, timeout_ms, cb, arg, err);
}

mega_status megad_call_addr(megad *d, const char *address, const mega_rpc_method *m,
                            const ProtobufCMessage *req, unsigned timeout_ms,
                            mega_rpc_reply_fn cb, void *arg, mega_err *err) {
  megad_node *n = NULL;
  for (size_t i = 1; i < d->nnodes && !n; i++)
    if (!strcmp(d->nodes[i]->address, address)) n = d->nodes[i];
  if (n) return megad_call(d, n, m, req, timeout_ms, cb, arg, err);
  mega_rpc_channel *ch;
  mega_status s = channel_to(address, &ch, err);
  if (s != MEGA_OK) return s;
  return call_on(d, ch, true, m, req, timeout_ms, cb, arg, err);
}


/* ---- start ---- */

typedef struct replay_ctx {
  megad *d;
  size_t records;
} replay_ctx;

static int replay_one(void *ctx, const uint8_t *rec, size_t len) {
  replay_ctx *c = ctx;
  megad *d = c->d;
  mega_err e = {0};
  c->records++;
  if (mega_jobs_apply(&d->jobs, rec, len, &e) != MEGA_OK)
    megad_warn(d, "journal: skipping a record: %s", e.msg);
  return 0;
}

static void failed_on_restart(void *arg, mega_job *j) {
  megad *d = arg;
  megad_journal_job(d, j, NULL);
  megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED, NULL, -1, "%s", j->error);
}

/* The journal holds every change; once it is mostly history, it is
 * rewritten as one record per job, its kept events and its last step. */
static void compact_journal(megad *d, size_t replayed) {
  size_t cap = 64, n = 0;
  void **recs = malloc(cap * sizeof *recs);
  size_t *lens = malloc(cap * sizeof *lens);
  bool ok = recs && lens;
  for (size_t i = 0; ok && i < d->jobs.n; i++) {
    mega_job *j = d->jobs.v[i];
    for (size_t k = 0; ok && k <= j->hist_len + 1; k++) {
      if (n + 1 > cap) {
        cap *= 2;
        void **r = realloc(recs, cap * sizeof *r);
        size_t *l = r ? realloc(lens, cap * sizeof *l) : NULL;
        if (r) recs = r;
        if (!r || !l) {
          ok = false;
          break;
        }
        lens = l;
      }
      uint8_t *buf = NULL;
      mega_status st = MEGA_OK;
      if (k == 0) {
        st = mega_jrec_job(j, &buf, &lens[n], NULL);
      } else if (k <= j->hist_len) {
        const Mega__V1__WatchJobResponse *it = mega_job_hist_at(j, k - 1);
        if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT) continue;
        st = mega_jrec_event(j->id, it->event, &buf, &lens[n], NULL);
      } else if (j->last_step) {
        st = mega_jrec_step(j->id, j->last_step, &buf, &lens[n], NULL);
      } else {
        continue;
      }
      if (st != MEGA_OK) ok = false;
      else recs[n++] = buf;
    }
  }
  mega_err e = {0};
  if (ok && 2 * n + 64 < replayed) {
    if (mega_journal_rewrite(d->journal, (const void *const *)recs, lens, n, &e) == MEGA_OK)
      megad_log(d, "journal: compacted %zu records into %zu", replayed, n);
    else
      megad_warn(d, "journal: %s", e.msg);
  }
  for (size_t i = 0; i < n; i++) free(recs[i]);
  free(recs);
  free(lens);
}

static mega_status open_journal(megad *d, mega_err *err) {
  char *path = NULL;
  if (asprintf(&path, "%s/journal", d->state_dir) < 0)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  mega_status s = mega_journal_open(path, &d->journal, err);
  size_t dropped = 0;
  replay_ctx rc = {d, 0};
  if (s == MEGA_OK) s = mega_journal_replay(d->journal, replay_one, &rc, &dropped, err);
  if (s == MEGA_OK && dropped)
    megad_warn(d, "journal %s: cut a torn last record (%zu bytes)", path, dropped);
  free(path);
  if (s != MEGA_OK) return s;
  size_t n = mega_jobs_fail_unfinished(&d->jobs, megad_unix_ms(),
                                       "megad restarted while the job was running",
                                       failed_on_restart, d);
  if (d->jobs.n)
    megad_log(d, "journal: %zu job%s replayed, %zu marked failed (they were running)", d->jobs.n,
              d->jobs.n == 1 ? "" : "s", n);
  compact_journal(d, rc.records);
  return MEGA_OK;
}

/* megaw next to megad (installed), or in ../worker (the build tree). */
static char *find_worker(void) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = '\0';
  const char *tries[] = {"%s/megaw", "%s/../worker/megaw"};
  for (int i = 0; i < 2; i++) {
    char *p = NULL;
    if (asprintf(&p, tries[i], exe) < 0) return NULL;
    if (access(p, X_OK) == 0) {
      char *real = realpath(p, NULL);
      free(p);
      return real;
    }
    free(p);
  }
  return NULL;
}

/* host:port others use to reach this node. */
static mega_status make_address(megad *d, mega_err *err) {
  const char *l = d->o.listen;
  if (!strncmp(l, "unix:", 5)) {
    d->address = strdup(l);
    d->worker_host = strdup(d->o.advertise ? d->o.advertise : "127.0.0.1");
  } else {
    const char *colon = strrchr(l, ':');
    char host[256];
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - l) : (int)strlen(l), l);
    if (d->o.advertise) {
      snprintf(host, sizeof host, "%s", d->o.advertise);
    } else if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "[::]")) {
      if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "127.0.0.1");
    }
    if (asprintf(&d->address, "%s:%d", host, d->port) < 0) d->address = NULL;
    /* Workers bind Gloo to a plain host; strip IPv6 brackets. */
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = '\0';
    }
    d->worker_host = strdup(host);
  }
  if (!d->address || !d->worker_host) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  return MEGA_OK;
}

static void on_tick(uv_timer_t *t) {
  megad *d = t->data;
  if (d->stopping) return;
  megad_members_tick(d);
  megad_schedule(d);
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

mega_status megad_start(megad *d, uv_loop_t *loop, const megad_opts *o, mega_err *err) {
  memset(d, 0, sizeof *d);
  d->o = *o;
  d->loop = loop;
  mega_jobs_init(&d->jobs);
  char host[256];
  if (o->node_name) snprintf(host, sizeof host, "%s", o->node_name);
  else if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "localhost");
  d->node_id = strdup(host);
  d->incarnation = (uint64_t)megad_unix_us() ^ ((uint64_t)getpid() << 40);
  if (o->slots < 1 || o->slots > 4096)
    return mega_fail(err, MEGA_ERR_INVALID, "--slots %d: give the number of worker slots (1..4096)",
                     o->slots);
  d->state_dir = realpath(o->state_dir, NULL);
  if (!d->state_dir && (mkdir_p(o->state_dir) || !(d->state_dir = realpath(o->state_dir, NULL))))
    return mega_fail(err, MEGA_ERR_IO, "cannot create the state directory %s: %s", o->state_dir,
                     strerror(errno));
  if (o->worker_path) d->worker_path = realpath(o->worker_path, NULL);
  else d->worker_path = find_worker();
  if (!d->worker_path || access(d->worker_path, X_OK))
    return mega_fail(err, MEGA_ERR_INVALID,
                     o->worker_path ? "--worker %s: not an executable file"
                                    : "cannot find megaw next to megad%s; give --worker PATH",
                     o->worker_path ? o->worker_path : "");

  mega_status s = open_journal(d, err);
  if (s != MEGA_OK) return s;
  if (!(d->kv = mega_kv_new(loop))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  if ((s = mega_rpc_cq_new(loop, &d->cq, err)) != MEGA_OK) return s;
  if ((s = mega_rpc_server_new(d->cq, NULL, &d->srv, err)) != MEGA_OK) return s;
  megad_control_register(d);
  megad_peer_register(d);
  megad_kv_register(d);
  megad_trace_register(d);
  megad_members_register(d);
  if ((s = mega_rpc_server_listen(d->srv, o->listen, &d->port, err)) != MEGA_OK ||
      (s = mega_rpc_server_start(d->srv, err)) != MEGA_OK)
    return s;
  if ((s = make_address(d, err)) != MEGA_OK) return s;
  if ((s = megad_members_init(d, err)) != MEGA_OK) return s;
  if (o->metrics_listen && (s = megad_http_start(d, o->metrics_listen, err)) != MEGA_OK) return s;

  uv_timer_init(loop, &d->tick);
  d->tick.data = d;
  uv_timer_start(&d->tick, on_tick, 0, MEGAD_HEARTBEAT_MS);
  uv_timer_init(loop, &d->watchdog);
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
    d->watchdog_on = true;
    uv_timer_start(&d->watchdog, on_watchdog, usec / 2000, usec / 2000);
  }
  sd_notifyf(0, "READY=1\nSTATUS=node %s listening on %s, %d slot%s", d->node_id, d->address,
             o->slots, o->slots == 1 ? "" : "s");
  megad_log(d, "node %s listening on %s with %d slot%s; worker %s; state in %s", d->node_id,
            d->address, o->slots, o->slots == 1 ? "" : "s", d->worker_path, d->state_dir);
  return MEGA_OK;
}

/* ---- stop ----
 * Phases, each waiting for the last on a 50 ms timer:
 *   1 workers: running jobs fail with the reason, every worker is aborted
 *     (Abort frame, SIGKILL after the grace) and reaped; AbortJob reaches
 *     the other nodes of jobs this node coordinates
 *   2 peers: Leave, and every call in flight answered or cancelled
 *   3 the server: watchers end, the server shuts down, then the queue */

typedef struct stopper {
  megad *d;
  uv_timer_t t;
  int phase;
  uint64_t phase_start;
  void (*done)(void *);
  void *arg;
} stopper;

static void closed_free(uv_handle_t *h) { free(h->data); }

static void final_close(stopper *st) {
  megad *d = st->d;
  uv_close((uv_handle_t *)&d->tick, NULL);
  uv_close((uv_handle_t *)&d->watchdog, NULL);
  megad_members_free(d);
  mega_kv_free(d->kv);
  d->kv = NULL;
  mega_journal_close(d->journal);
  d->journal = NULL;
  mega_jobs_free(&d->jobs);
  free(d->address);
  free(d->worker_host);
  free(d->worker_path);
  free(d->state_dir);
  d->address = d->worker_host = d->worker_path = d->state_dir = NULL;
  void (*done)(void *) = st->done;
  void *arg = st->arg;
  st->t.data = st;
  uv_close((uv_handle_t *)&st->t, closed_free);
  if (done) done(arg);
}

static void cq_closed(void *arg) { final_close(arg); }

static void server_down(void *arg) {
  stopper *st = arg;
  st->d->srv = NULL;
  mega_rpc_cq_close(st->d->cq, cq_closed, st);
}

static void stop_step(uv_timer_t *t) {
  stopper *st = t->data;
  megad *d = st->d;
  uint64_t waited = uv_now(d->loop) - st->phase_start;
  switch (st->phase) {
  case 1:
    if ((!megad_launch_idle(d) || megad_coord_stopping(d)) && waited < MEGAD_ABORT_GRACE_MS + 4000)
      return;
    if (!megad_launch_idle(d)) megad_warn(d, "stopping with workers not yet reaped");
    megad_members_leave(d);
    st->phase = 2;
    st->phase_start = uv_now(d->loop);
    return;
  case 2:
    if (d->rpcs && waited < 1500) return;
    for (megad_rpc *r = d->rpcs; r; r = r->next) mega_rpc_pending_cancel(r->p);
    if (d->rpcs) return;
    st->phase = 3;
    uv_timer_stop(&st->t);
    megad_watch_drop_all(d);
    megad_http_stop(d);
    mega_rpc_server_shutdown(d->srv, 500, server_down, st);
    return;
  default:
    return;
  }
}

void megad_stop(megad *d, const char *reason, void (*done)(void *arg), void *arg) {
  if (d->stopping) return;
  d->stopping = true;
  sd_notifyf(0, "STOPPING=1\nSTATUS=stopping: %s", reason);
  megad_log(d, "stopping: %s", reason);
  uv_timer_stop(&d->tick);
  uv_timer_stop(&d->watchdog);
  stopper *st = calloc(1, sizeof *st);
  if (!st) {
    megad_warn(d, "out of memory while stopping");
    return;
  }
  st->d = d;
  st->done = done;
  st->arg = arg;
  st->phase = 1;
  st->phase_start = uv_now(d->loop);
  megad_coord_stop_all(d, reason);
  megad_launch_abort_all(d, reason);
  uv_timer_init(d->loop, &st->t);
  st->t.data = st;
  uv_timer_start(&st->t, stop_step, 0, 50);
}
