/* How fast megad notices a failure and trains again: prints figures, never
 * fails on a time.
 *
 * For each kind of failure, a tiny GPT job on real megad processes on
 * loopback, checkpointing every --save-interval iterations, is hit at an
 * iteration; the figures come from the job's own events and steps:
 *
 *   signal   the failure -> the job's first event about it (a surviving
 *            rank's communicator error comes first when a node dies)
 *   detect   the failure -> the event naming its cause (RANK_FAILED for a
 *            worker, NODE_LOST for a node)
 *   back     detection -> the first iteration the next attempt merged
 *   redone   iterations trained again (last merged before the failure
 *            minus the newest committed checkpoint)
 *
 *   worker kill  kill -9 one worker of a DP 2 job (--max-restarts)
 *   worker hung  SIGSTOP one worker (the hang check)
 *   node kill    kill -9 a node's megad and workers (--nnodes 1:2)
 *   node hung    SIGSTOP a node's megad and workers (missed heartbeats)
 *
 *   bench_recovery [--runs N] [--save-interval K]
 *
 * Uses the megad and megaw of the build (or MEGAD / MEGAW) and the test
 * harness (tests/daemon/harness.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

typedef enum { WORKER_KILL, WORKER_HUNG, NODE_KILL, NODE_HUNG, NKINDS } fail_kind;
static const char *const kind_name[] = {"worker kill", "worker hung", "node kill", "node hung"};

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct run {
  fail_kind kind;
  hd *coord, *victim; /* the node whose worker or self fails */
  uint64_t at;        /* fail when this iteration is merged */
  int64_t fail_ms, back_ms;
  uint64_t last_before, ckpt;
  pid_t stopped[65];
  int nstopped;
  const char *job_id;
  bool cancelled;
} run;

static uint64_t checkpoint_of(hd *d, const char *id) {
  Mega__V1__Job *j = hd_get_job(d, id, NULL);
  uint64_t k = j ? j->checkpoint_iteration : 0;
  if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
  return k;
}

static void fail_now(run *r) {
  pid_t pids[64];
  r->ckpt = checkpoint_of(r->coord, r->job_id);
  r->fail_ms = unix_ms();
  switch (r->kind) {
  case WORKER_KILL:
  case WORKER_HUNG:
    if (hd_workers(r->victim, pids, 64) > 0) {
      kill(pids[0], r->kind == WORKER_KILL ? SIGKILL : SIGSTOP);
      r->stopped[r->nstopped++] = pids[0];
    }
    break;
  case NODE_KILL:
    hd_kill(r->victim);
    break;
  case NODE_HUNG:
    r->nstopped = hd_workers(r->victim, r->stopped, 64);
    r->stopped[r->nstopped++] = r->victim->pid;
    for (int i = 0; i < r->nstopped; i++) kill(r->stopped[i], SIGSTOP);
    break;
  default:
    break;
  }
}

static void on_item(void *arg, const Mega__V1__WatchJobResponse *it) {
  run *r = arg;
  if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) return;
  const Mega__V1__StepMetrics *s = it->step;
  if (!r->fail_ms) {
    r->last_before = s->iteration;
    if (s->iteration >= r->at) fail_now(r);
    return;
  }
  if (s->attempt == 0) {
    if (s->iteration > r->last_before) r->last_before = s->iteration;
    return;
  }
  if (!r->back_ms) r->back_ms = s->time_unix_ms;
  if (!r->cancelled) { /* measured: no need to train to the end */
    r->cancelled = true;
    Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)r->job_id;
    req.reason = "measured";
    ProtobufCMessage *resp = NULL;
    if (mega_rpc_unary(r->coord->ch, &mega_control_cancel_job, &req.base, 30000, &resp, NULL) ==
        MEGA_OK)
      protobuf_c_message_free_unpacked(resp, NULL);
  }
}

/* The first event of kind (or of either failure kind when kind is 0). */
static int64_t first_failure_event(hd *d, const char *id, int64_t after,
                                   Mega__V1__JobEventKind kind) {
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  ProtobufCMessage *resp = NULL;
  if (mega_rpc_unary(d->ch, &mega_control_get_job, &req.base, 5000, &resp, NULL) != MEGA_OK)
    return 0;
  Mega__V1__GetJobResponse *g = (void *)resp;
  int64_t t = 0;
  for (size_t i = 0; i < g->n_events && !t; i++) {
    const Mega__V1__JobEvent *e = g->events[i];
    bool want = kind ? e->kind == kind : e->kind == KIND(RANK_FAILED) || e->kind == KIND(NODE_LOST);
    if (want && e->time_unix_ms >= after)
      t = e->time_unix_ms;
  }
  protobuf_c_message_free_unpacked(resp, NULL);
  return t;
}

static void print_row(const char *name, double *v, int n, const char *unit, int decimals) {
  if (!n) {
    printf("  %-14s no data\n", name);
    return;
  }
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  printf("  %-14s min %.*f  median %.*f  max %.*f %s\n", name, decimals, v[0], decimals,
         v[n / 2], decimals, v[n - 1], unit);
}

static void bench(fail_kind kind, int runs, int save_interval) {
  double sig[32], detect[32], back[32], redone[32];
  int n = 0;
  for (int k = 0; k < runs && k < 32; k++) {
    hd a, b;
    bool two = kind == NODE_KILL || kind == NODE_HUNG;
    if (!hd_start(&a, "b1", two ? 1 : 2, NULL, NULL, NULL)) return;
    if (two && (!hd_start(&b, "b2", 1, a.addr, NULL, NULL) || !hd_wait_alive(&a, 2, 10000))) {
      hd_cleanup(&a);
      return;
    }
    char ckpt[256], si[16];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", a.dir);
    snprintf(si, sizeof si, "%d", save_interval);
    const char *extra[] = {"--save", ckpt, "--save-interval", si, NULL};
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, a.dir, 100000, extra);
    spec.nproc_per_node = two ? 1 : 2;
    spec.max_restarts = 10;
    if (two) {
      spec.nnodes_min = 1;
      spec.nnodes_max = 2;
    }
    char id[64];
    mega_err err = {0};
    if (hd_submit(&a, &spec, id, sizeof id, &err) != MEGA_OK) {
      printf("  submit failed: %s\n", err.msg);
      hd_cleanup(&a);
      if (two) hd_cleanup(&b);
      return;
    }
    run r = {.kind = kind, .coord = &a, .victim = two ? &b : &a,
             .at = (uint64_t)(3 * save_interval + save_interval / 2), .job_id = id};
    hd_watch w;
    hd_watch_job_cb(&a, id, true, 120000, &w, on_item, &r);
    Mega__V1__JobEventKind cause = two ? KIND(NODE_LOST) : KIND(RANK_FAILED);
    int64_t first = r.fail_ms ? first_failure_event(&a, id, r.fail_ms, 0) : 0;
    int64_t det = r.fail_ms ? first_failure_event(&a, id, r.fail_ms, cause) : 0;
    if (det && r.back_ms) {
      sig[n] = (double)(first - r.fail_ms) / 1000;
      detect[n] = (double)(det - r.fail_ms) / 1000;
      back[n] = (double)(r.back_ms - det) / 1000;
      redone[n] = (double)(r.last_before - r.ckpt);
      n++;
    } else {
      printf("  run %d: no restart seen (%s)\n", k + 1, w.final ? w.final->error : w.err.msg);
    }
    hd_watch_free(&w);
    for (int i = 0; i < r.nstopped; i++) kill(r.stopped[i], SIGKILL);
    hd_cleanup(&a);
    if (two) hd_cleanup(&b);
  }
  printf("%s (%d run%s, checkpoint every %d iterations):\n", kind_name[kind], n, n == 1 ? "" : "s",
         save_interval);
  print_row("signal", sig, n, "s", 3);
  print_row("detect", detect, n, "s", 3);
  print_row("back", back, n, "s", 3);
  print_row("redone", redone, n, "iterations", 0);
}

int main(int argc, char **argv) {
  int runs = 3, save_interval = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--save-interval")) save_interval = atoi(argv[i + 1]);
  }
  if (runs < 1 || save_interval < 1) {
    fprintf(stderr, "usage: bench_recovery [--runs N] [--save-interval K]\n");
    return 2;
  }
  if (!getenv("MEGAD")) setenv("MEGAD", BENCH_MEGAD, 1);
  if (!getenv("MEGAW")) setenv("MEGAW", BENCH_MEGAW, 1);
  signal(SIGPIPE, SIG_IGN);
  printf("megad recovery on loopback: tiny GPT (2 layers, hidden 32), default heartbeats "
         "(250 ms, lost after 1.5 s) and hang check (10 x median step, at least 2 s)\n");
  for (int k = 0; k < NKINDS; k++) bench((fail_kind)k, runs, save_interval);
  hd_cleanup_all();
  return 0;
}
