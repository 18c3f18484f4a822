/* The launcher's lower half: what relay.c and hangcheck.c need of a launch
 * and its workers (frames down the pipe, kill, abort, the launch's end), so
 * that calls inside the launcher only go down. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/launch/launch_internal.h"

/* ---- the pipe to the worker ---- */

typedef struct write_req {
  uv_write_t req;
  uint8_t *buf;
} write_req;

static void written(uv_write_t *req, int status) {
  (void)status; /* a dead worker shows as its exit */
  write_req *w = (write_req *)req;
  free(w->buf);
  free(w);
}

void launch_send_frame(megad_worker *w, const Mega__V1__DaemonFrame *f) {
  if (!w->spawned || w->closing || w->pipe_eof) return;
  write_req *wr = calloc(1, sizeof *wr);
  size_t len;
  if (!wr || mega_frame_encode(&f->base, 0, &wr->buf, &len, NULL) != MEGA_OK) {
    free(wr);
    return;
  }
  uv_buf_t b = uv_buf_init((char *)wr->buf, (unsigned)len);
  if (uv_write(&wr->req, (uv_stream_t *)&w->pipe, &b, 1, written)) {
    free(wr->buf);
    free(wr);
  }
}

void launch_send_kv_response(megad_worker *w, uint64_t id, bool found, const uint8_t *val,
                             size_t len, const char *error) {
  Mega__V1__KvResponse r = MEGA__V1__KV_RESPONSE__INIT;
  r.request_id = id;
  r.found = found;
  r.value.data = (uint8_t *)val;
  r.value.len = len;
  r.error = (char *)(error ? error : "");
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_KV;
  f.kv = &r;
  launch_send_frame(w, &f);
}

void launch_send_kv_values(megad_worker *w, uint64_t id, ProtobufCBinaryData *values, size_t n) {
  Mega__V1__KvResponse r = MEGA__V1__KV_RESPONSE__INIT;
  r.request_id = id;
  r.found = true;
  r.error = "";
  r.values = values;
  r.n_values = n;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_KV;
  f.kv = &r;
  launch_send_frame(w, &f);
}

void launch_send_abort(megad_worker *w, const char *reason, unsigned grace_ms, bool hold) {
  Mega__V1__Abort a = MEGA__V1__ABORT__INIT;
  a.reason = (char *)reason;
  a.grace_ms = grace_ms;
  a.hold = hold;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ABORT;
  f.abort = &a;
  launch_send_frame(w, &f);
}

/* ---- kill, abort ---- */

void launch_kill_worker(megad_worker *w) {
  if (w->spawned && !w->exited) uv_process_kill(&w->proc, SIGKILL);
}

static void on_kill_timer(uv_timer_t *t) {
  megad_launch *l = t->data;
  for (size_t i = 0; i < l->nw; i++)
    if (l->released || !l->w[i].held) launch_kill_worker(&l->w[i]);
}

void launch_abort(megad_launch *l, const char *reason, unsigned grace_ms, bool hold) {
  if (hold ? l->aborting : l->released) return;
  l->aborting = true;
  l->released = !hold;
  for (size_t i = 0; i < l->nw; i++) launch_send_abort(&l->w[i], reason, grace_ms, hold);
  uv_timer_stop(&l->kill_timer);
  uv_timer_start(&l->kill_timer, on_kill_timer, grace_ms, 0);
}

static void note_ended(megad_launcher *L, const char *job_id, uint32_t attempt) {
  struct megad_launch_ended *e = &L->ended[L->ended_next];
  L->ended_next = (L->ended_next + 1) % (sizeof L->ended / sizeof L->ended[0]);
  snprintf(e->job_id, sizeof e->job_id, "%s", job_id);
  e->attempt = attempt;
}

bool launch_attempt_ended(const megad_launcher *L, const char *job_id, uint32_t attempt) {
  for (size_t i = 0; i < sizeof L->ended / sizeof L->ended[0]; i++)
    if (L->ended[i].job_id[0] && !strcmp(L->ended[i].job_id, job_id) &&
        attempt <= L->ended[i].attempt)
      return true;
  return false;
}

static void abort_matching(megad_launcher *L, const char *job_id, int64_t attempt, bool stale,
                           bool hold, const char *reason, unsigned grace_ms) {
  if (attempt > 0 || (attempt == 0 && !stale))
    note_ended(L, job_id, (uint32_t)(stale ? attempt - 1 : attempt));
  for (megad_launch *l = L->launches; l; l = l->next) {
    if (strcmp(l->req->job_id, job_id)) continue;
    bool match = attempt < 0 || (stale ? l->req->attempt < (uint32_t)attempt
                                       : l->req->attempt == (uint32_t)attempt);
    if (match) launch_abort(l, reason, grace_ms, hold);
  }
}

void megad_launch_abort(megad_launcher *L, const char *job_id, int64_t attempt, bool stale,
                        const char *reason, unsigned grace_ms) {
  abort_matching(L, job_id, attempt, stale, false, reason, grace_ms);
}

void megad_launch_hold(megad_launcher *L, const char *job_id, uint32_t attempt,
                       const char *reason, unsigned grace_ms) {
  abort_matching(L, job_id, attempt, false, true, reason, grace_ms);
}

/* ---- the launch's end ---- */

void launch_free_queue(megad_launch *l) {
  for (size_t i = 0; i < l->nsteps; i++) protobuf_c_message_free_unpacked(&l->steps[i]->base, NULL);
  for (size_t i = 0; i < l->nevents; i++)
    protobuf_c_message_free_unpacked(&l->events[i]->base, NULL);
  free(l->steps);
  free(l->events);
  l->steps = NULL;
  l->events = NULL;
  l->nsteps = l->nevents = 0;
}

static void free_launch_mem(megad_launch *l) {
  if (l->req) protobuf_c_message_free_unpacked(&l->req->base, NULL);
  launch_free_queue(l);
  resend_free_kept(l);
  free(l->w);
  free(l->dir);
  free(l);
}

static void timer_closed(uv_handle_t *h) {
  megad_launch *l = h->data;
  if (--l->timers_open == 0) free_launch_mem(l);
}

void launch_maybe_free(megad_launch *l) {
  if (l->live || l->refs || l->sending || l->timers_open < 2) return;
  if (!l->coord_gone && (l->nsteps || l->nevents)) return; /* still to tell the coordinator */
  for (megad_launch **p = &l->L->launches; *p; p = &(*p)->next)
    if (*p == l) {
      *p = l->next;
      break;
    }
  /* The keys of groups that lived on this node (the coordinator clears its
   * own store when the attempt ends). */
  const char *kp = l->req->bootstrap ? l->req->bootstrap->kv_prefix : NULL;
  if (!l->coord_local && kp && kp[0]) {
    char *prefix = malloc(strlen(kp) + 2);
    if (prefix) {
      strcpy(prefix, kp);
      if (prefix[strlen(prefix) - 1] != '/') strcat(prefix, "/");
      mega_kv_delete_prefix(l->L->kvs->kv, prefix);
    }
    free(prefix);
  }
  /* the job's directory says when its last launch here ended */
  char *slash = l->dir ? strrchr(l->dir, '/') : NULL;
  if (slash) {
    *slash = '\0';
    utimensat(AT_FDCWD, l->dir, NULL, 0);
    *slash = '/';
  }
  if (l->L->cbs.ended) l->L->cbs.ended(l->L->cbs.arg, l->req->job_id);
  uv_close((uv_handle_t *)&l->kill_timer, timer_closed);
  uv_close((uv_handle_t *)&l->retry_timer, timer_closed);
}


static bool attempt_here(const megad_launcher *L, const char *job_id, unsigned long attempt) {
  for (const megad_launch *l = L->launches; l; l = l->next)
    if (l->req->attempt == attempt && !strcmp(l->req->job_id, job_id)) return true;
  return false;
}

void launch_prune_attempts(megad_launch *l) {
  char *slash = strrchr(l->dir, '/');
  if (!slash || l->req->attempt < MEGAD_ATTEMPT_DIRS_KEPT) return;
  *slash = '\0'; /* the job's directory */
  DIR *d = opendir(l->dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    char *end;
    unsigned long n = strtoul(e->d_name, &end, 10);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end ||
        n + MEGAD_ATTEMPT_DIRS_KEPT > l->req->attempt || attempt_here(l->L, l->req->job_id, n))
      continue;
    char *old = NULL;
    if (asprintf(&old, "%s/%s", l->dir, e->d_name) >= 0) megad_rmtree(old);
    free(old);
  }
  if (d) closedir(d);
  *slash = '/';
}
