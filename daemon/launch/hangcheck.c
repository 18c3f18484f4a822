/* Pings on every worker pipe, and the hang check (see launch.h): a worker
 * that makes no progress in time is reported hung. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/launch/launch_internal.h"

#define LONG_PHASE_MS 600000u /* eval and checkpoint saves */
/* a worker's first training step: no median yet, and a real model's first
 * step (a 50k vocabulary on CPU cores, allocations, a GPU's warmup) easily
 * takes seconds */
#define FIRST_STEP_MS 60000u

void hangcheck_progress(megad_worker *w, const char *phase, double step_s) {
  w->progress_ms = uv_now(w->l->L->b->loop);
  if (phase && phase[0]) snprintf(w->phase, sizeof w->phase, "%s", phase);
  if (step_s > 0) w->steps[w->nsteps++ % STEP_WINDOW] = step_s;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_step(const megad_worker *w) {
  int n = w->nsteps < STEP_WINDOW ? w->nsteps : STEP_WINDOW;
  if (!n) return 0;
  double v[STEP_WINDOW];
  memcpy(v, w->steps, (size_t)n * sizeof *v);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* How long w may go without progress in its phase. */
static uint64_t limit_ms(const megad_worker *w) {
  const megad_launcher *L = w->l->L;
  if (!strcmp(w->phase, "setup")) return (uint64_t)L->o.rendezvous_timeout_ms + 10000;
  if (strcmp(w->phase, "train")) return LONG_PHASE_MS;
  const Mega__V1__JobSpec *spec = w->l->req->spec;
  if (spec && spec->step_timeout_ms) return spec->step_timeout_ms;
  if (!w->nsteps) return FIRST_STEP_MS > L->o.step_floor_ms ? FIRST_STEP_MS : L->o.step_floor_ms;
  uint64_t adaptive = (uint64_t)(10 * 1000 * median_step(w));
  return adaptive > L->o.step_floor_ms ? adaptive : L->o.step_floor_ms;
}

/* The process state letter of /proc/PID/stat ('R', 'S', 'T' for stopped,
 * ...), or '?' when unreadable. */
static char proc_state(int pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parens */
  return rp && rp[1] == ' ' && rp[2] ? rp[2] : '?';
}

static bool stopped(int pid) {
  char st = proc_state(pid);
  return st == 'T' || st == 't';
}

static void hung(megad_worker *w, uint64_t quiet) {
  megad_launch *l = w->l;
  w->hung = true;
  bool is_stopped = stopped(w->pid);
  char msg[600];
  double med = median_step(w);
  int k = snprintf(msg, sizeof msg, "rank %u made no progress for %.1f s", w->rank,
                   (double)quiet / 1000);
  if (!strcmp(w->phase, "train") && med > 0)
    k += snprintf(msg + k, sizeof msg - (size_t)k, " (median step %.2f s)", med);
  else
    k += snprintf(msg + k, sizeof msg - (size_t)k, " (in %s)", w->phase);
  if (is_stopped)
    snprintf(msg + k, sizeof msg - (size_t)k, "; its process (pid %d) is stopped; killed it",
             w->pid);
  megad_warn(l->L->b, "job %s attempt %u: %s", l->req->job_id, l->req->attempt, msg);
  Mega__V1__WorkerError e = MEGA__V1__WORKER_ERROR__INIT;
  e.message = msg;
  /* a rank merely waiting is likely the echo of a peer that hangs */
  e.retryable = !is_stopped;
  Mega__V1__RankEvent ev = MEGA__V1__RANK_EVENT__INIT;
  ev.kind_case = MEGA__V1__RANK_EVENT__KIND_ERROR;
  ev.error = &e;
  if (!w->error_msg) w->error_msg = strdup(msg);
  relay_event(l, w, &ev);
  if (is_stopped) launch_kill_worker(w);
}

static bool running(const megad_worker *w) {
  return w->spawned && !w->exited && !w->closing && !w->pipe_eof;
}

void hangcheck_tick(megad_launcher *L) {
  uint64_t now = uv_now(L->b->loop);
  bool ping = now - L->last_ping_ms >= L->o.ping_ms;
  if (ping) L->last_ping_ms = now;
  Mega__V1__Ping p = MEGA__V1__PING__INIT;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_PING;
  f.ping = &p;
  for (megad_launch *l = L->launches; l; l = l->next) {
    for (size_t i = 0; i < l->nw; i++) {
      megad_worker *w = &l->w[i];
      /* a held worker waits, pinged, until it is released */
      if (!running(w) || (l->aborting && !w->held)) continue;
      if (ping) launch_send_frame(w, &f);
      if (w->held) continue;
      /* a stall of megad's own is no hang of the worker's */
      uint64_t quiet = megad_quiet_ms(L->b, w->progress_ms);
      if (w->hung || quiet < L->o.step_floor_ms) continue;
      /* a stopped process is hung in any phase; others get their phase's limit */
      if (quiet >= limit_ms(w) || stopped(w->pid)) hung(w, quiet);
    }
  }
}
