/* How fast megad notices a failure and trains again, and how much it
 * throws away: recovery from replicas against a restart from the newest
 * checkpoint, at the same --save-interval. Prints figures, never fails on
 * a time.
 *
 * For each kind of failure, a GPT job on real megad processes on loopback
 * is hit at an iteration; the figures come from the job's own events and
 * steps:
 *
 *   signal   the failure -> the job's first event about it (a surviving
 *            rank's communicator error comes first when a node dies)
 *   detect   the failure -> the event naming its cause (RANK_FAILED for a
 *            worker, NODE_LOST for a node)
 *   back     detection -> the first iteration the next attempt merged
 *   redone   iterations trained again: the last merged before the failure
 *            minus where the next attempt started (the replicas' iteration,
 *            or the newest committed checkpoint)
 *   moved    MB the next attempt's ranks took: from the replicas, rank to
 *            rank; or read from the checkpoint (its size x the ranks that
 *            load it)
 *
 *   worker kill  kill -9 one worker of a DP 2 job on one node (--max-restarts)
 *   worker hung  SIGSTOP one worker (the hang check)
 *   node kill    kill -9 a node's megad and workers (DP 2 on two nodes,
 *                --nnodes 1:2: the job goes on at DP 1)
 *   node hung    SIGSTOP a node's megad and workers (missed heartbeats)
 *   coordinator restart  kill -9 the coordinator's megad (DP 2 on two
 *                nodes: its rank dies with it) and start it again at once
 *                on its state dir, joining the other node; "detect" is its
 *                first event after the restart (heartbeat mode has no
 *                takeover: the restart is the recovery)
 *
 * Then the step-time and memory cost of the distributed optimizer's shard
 * copies: the same model at DP 2 with --use-distributed-optimizer, with
 * and without --no-optimizer-shard-copy.
 *
 *   bench_recovery [--runs N] [--save-interval K] [--model 150mb|tiny] [--steps N]
 *
 * The default model is GPT with 4 layers, hidden 512 (12.8 M parameters:
 * 153 MB of parameters and Adam's moments). Uses the megad and megaw of
 * the build (or MEGAD / MEGAW) and the test harness (tests/daemon/harness.h). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k
#define MAX_RUNS 32

typedef enum { WORKER_KILL, WORKER_HUNG, NODE_KILL, NODE_HUNG, COORD_RESTART, NKINDS } fail_kind;
static const char *const kind_name[] = {"worker kill", "worker hung", "node kill", "node hung",
                                        "coordinator restart"};

/* The model's flags after hd_tiny_spec's (the last of a flag wins). */
static const char *model_flags[16];

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
  uint32_t new_world;
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
  case COORD_RESTART: /* restarted once the watch on it ends (bench) */
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

static void cancel(run *r) {
  r->cancelled = true;
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)r->job_id;
  req.reason = "measured";
  ProtobufCMessage *resp = NULL;
  if (mega_rpc_unary(r->coord->ch, &mega_control_cancel_job, &req.base, 30000, &resp, NULL) ==
      MEGA_OK)
    protobuf_c_message_free_unpacked(resp, NULL);
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
  if (!r->back_ms) {
    r->back_ms = s->time_unix_ms;
    r->new_world = (uint32_t)s->n_ranks;
  }
  if (!r->cancelled) cancel(r); /* measured: no need to train to the end */
}

/* What the job's history says after the failure. */
typedef struct history {
  int64_t first, detect;       /* the first failure event; the one naming the cause */
  bool from_replicas;
  uint64_t start;              /* the iteration the next attempt started from */
  double replica_mb, ckpt_mb;  /* moved from replicas; the size of checkpoint ckpt */
} history;

static bool verbose;

static void read_history(hd *d, const run *r, Mega__V1__JobEventKind cause, history *h) {
  memset(h, 0, sizeof *h);
  h->start = r->ckpt;
  Mega__V1__GetJobResponse *g = hd_get_job_history(d, r->job_id, NULL);
  for (size_t i = 0; g && i < g->n_events; i++) {
    const Mega__V1__JobEvent *e = g->events[i];
    const char *m = e->message;
    if (verbose && e->time_unix_ms >= r->fail_ms)
      printf("      %+8.3f s  %.150s\n", (double)(e->time_unix_ms - r->fail_ms) / 1000, m);
    bool failure = e->kind == KIND(RANK_FAILED) || e->kind == KIND(NODE_LOST);
    if (failure && e->time_unix_ms >= r->fail_ms && !h->first) h->first = e->time_unix_ms;
    if (e->kind == cause && e->time_unix_ms >= r->fail_ms && !h->detect)
      h->detect = e->time_unix_ms;
    unsigned long long it;
    const char *q = strstr(m, " redone; ");
    if (sscanf(m, "recovered iteration %llu from replicas", &it) == 1 && q) {
      h->from_replicas = true;
      h->start = it;
      h->replica_mb = atof(q + strlen(" redone; "));
    }
    const char *c = strstr(m, "committed in ");
    const char *p = c ? strstr(c, " (") : NULL;
    if (sscanf(m, "checkpoint of iteration %llu", &it) == 1 && it == r->ckpt && p)
      h->ckpt_mb = atof(p + 2);
  }
  if (!h->first) h->first = h->detect; /* a restart: its own event is the first */
  if (g) protobuf_c_message_free_unpacked(&g->base, NULL);
}

static void print_row(const char *name, double *v, int n, const char *unit, int decimals) {
  if (!n) {
    printf("    %-8s no data\n", name);
    return;
  }
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  printf("    %-8s min %.*f  median %.*f  max %.*f %s\n", name, decimals, v[0], decimals,
         v[n / 2], decimals, v[n - 1], unit);
}

static void bench(fail_kind kind, bool replicas, int runs, int save_interval) {
  double sig[MAX_RUNS], detect[MAX_RUNS], back[MAX_RUNS], redone[MAX_RUNS], moved[MAX_RUNS];
  int n = 0, fell_back = 0;
  for (int k = 0; k < runs && k < MAX_RUNS; k++) {
    hd a, b;
    bool two = kind == NODE_KILL || kind == NODE_HUNG || kind == COORD_RESTART;
    if (!hd_start(&a, "b1", two ? 1 : 2, NULL, NULL, NULL)) return;
    if (two && (!hd_start(&b, "b2", 1, a.addr, NULL, NULL) || !hd_wait_alive(&a, 2, 10000))) {
      hd_cleanup(&a);
      return;
    }
    char ckpt[256], si[16];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", a.dir);
    snprintf(si, sizeof si, "%d", save_interval);
    const char *extra[32];
    int ne = 0;
    for (int i = 0; model_flags[i]; i++) extra[ne++] = model_flags[i];
    const char *more[] = {"--save", ckpt, "--save-interval", si,
                          replicas ? NULL : "--no-replica-recovery", NULL};
    for (int i = 0; more[i]; i++) extra[ne++] = more[i];
    extra[ne] = NULL;
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
    run r = {.kind = kind, .coord = &a, .victim = two && kind != COORD_RESTART ? &b : &a,
             .at = (uint64_t)(3 * save_interval + save_interval / 2), .job_id = id};
    hd_watch w;
    hd_watch_job_cb(&a, id, true, 600000, &w, on_item, &r);
    if (kind == COORD_RESTART && r.fail_ms) { /* the watch ended with its megad */
      hd_watch_free(&w);
      snprintf(a.peers, sizeof a.peers, "%s", b.addr);
      if (!hd_restart(&a, NULL)) {
        printf("  run %d: megad did not start again\n", k + 1);
        hd_cleanup(&b);
        return;
      }
      hd_watch_job_cb(&a, id, true, 600000, &w, on_item, &r);
    }
    history h;
    read_history(&a, &r,
                 kind == COORD_RESTART ? KIND(RESTARTING) : two ? KIND(NODE_LOST) : KIND(RANK_FAILED),
                 &h);
    if (h.detect && r.back_ms) {
      sig[n] = (double)(h.first - r.fail_ms) / 1000;
      detect[n] = (double)(h.detect - r.fail_ms) / 1000;
      back[n] = (double)(r.back_ms - h.detect) / 1000;
      redone[n] = r.last_before > h.start ? (double)(r.last_before - h.start) : 0;
      moved[n] = h.from_replicas ? h.replica_mb : h.ckpt_mb * r.new_world;
      fell_back += replicas && !h.from_replicas;
      n++;
    } else {
      printf("  run %d: no restart seen (%s)\n", k + 1, w.final ? w.final->error : w.err.msg);
    }
    hd_watch_free(&w);
    for (int i = 0; i < r.nstopped; i++) kill(r.stopped[i], SIGKILL);
    hd_cleanup(&a);
    if (two) hd_cleanup(&b);
  }
  printf("  %s, %s (%d run%s):\n", kind_name[kind],
         replicas ? "from replicas" : "from the checkpoint (--no-replica-recovery)", n,
         n == 1 ? "" : "s");
  if (fell_back) printf("    %d run%s went back to the checkpoint\n", fell_back,
                        fell_back == 1 ? "" : "s");
  print_row("signal", sig, n, "s", 3);
  print_row("detect", detect, n, "s", 3);
  print_row("back", back, n, "s", 3);
  print_row("redone", redone, n, "iterations", 0);
  print_row("moved", moved, n, replicas ? "MB rank to rank" : "MB read from the checkpoint", 1);
}

/* The shard copy's cost: median step time and the optimizer state per
 * rank over steps iterations at DP 2 with the distributed optimizer. */
typedef struct cost {
  double step[4096], copy_s[4096];
  int n;
  uint64_t own, copy;
} cost;

static void on_cost_item(void *arg, const Mega__V1__WatchJobResponse *it) {
  cost *c = arg;
  if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP || c->n >= 4096) return;
  const Mega__V1__StepMetrics *s = it->step;
  if (s->iteration <= 3) return; /* past the first steps' warm-up */
  double copy_s = 0;
  for (size_t i = 0; i < s->n_ranks; i++)
    if (s->ranks[i]->shard_copy_s > copy_s) copy_s = s->ranks[i]->shard_copy_s;
  c->copy_s[c->n] = copy_s;
  c->step[c->n++] = s->step_time_s;
  if (s->n_ranks) {
    c->own = s->ranks[0]->optimizer_state_bytes;
    c->copy = s->ranks[0]->shard_copy_bytes;
  }
}

static bool copy_cost(bool copy, int steps, cost *c) {
  memset(c, 0, sizeof *c);
  hd a;
  if (!hd_start(&a, "c1", 2, NULL, NULL, NULL)) return false;
  const char *extra[32];
  int ne = 0;
  for (int i = 0; model_flags[i]; i++) extra[ne++] = model_flags[i];
  extra[ne++] = "--use-distributed-optimizer";
  if (!copy) extra[ne++] = "--no-optimizer-shard-copy";
  extra[ne] = NULL;
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, a.dir, steps + 3, extra);
  spec.nproc_per_node = 2;
  char id[64];
  mega_err err = {0};
  bool ok = hd_submit(&a, &spec, id, sizeof id, &err) == MEGA_OK;
  if (ok) {
    hd_watch w;
    hd_watch_job_cb(&a, id, true, 600000, &w, on_cost_item, c);
    ok = hd_succeeded(&a, &w);
    hd_watch_free(&w);
  } else {
    printf("  submit failed: %s\n", err.msg);
  }
  hd_cleanup(&a);
  qsort(c->step, (size_t)c->n, sizeof *c->step, cmp_d);
  qsort(c->copy_s, (size_t)c->n, sizeof *c->copy_s, cmp_d);
  return ok && c->n;
}

static void bench_copy(int steps) {
  static cost with, without;
  if (!copy_cost(false, steps, &without) || !copy_cost(true, steps, &with)) return;
  double m0 = without.step[without.n / 2], m1 = with.step[with.n / 2];
  double c = with.copy_s[with.n / 2];
  printf("  the distributed optimizer's shard copies (DP 2, one node, %d steps each):\n", steps);
  printf("    inside   median %.4f s of each step waiting for the copy's exchange and "
         "stepping it (%.1f%% of the step; the slowest rank's)\n", c, 100 * c / m1);
  printf("    step     median %.3f s without, %.3f s with (two runs on a shared machine: "
         "%+.1f%%)\n", m0, m1, 100 * (m1 - m0) / m0);
  printf("    memory   optimizer state per rank %.1f MB, and %.1f MB more for the copy\n",
         (double)with.own / 1e6, (double)with.copy / 1e6);
}

int main(int argc, char **argv) {
  int runs = 2, save_interval = 10, steps = 30;
  const char *model = "150mb", *only = NULL;
  bool bad = false;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--verbose")) verbose = true;
    else if (!v) bad = true;
    else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--save-interval")) save_interval = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--model")) model = argv[++i];
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only")) only = argv[++i];
    else bad = true;
  }
  if (bad || runs < 1 || save_interval < 1 || steps < 1 ||
      (strcmp(model, "150mb") && strcmp(model, "tiny"))) {
    fprintf(stderr, "usage: bench_recovery [--runs N] [--save-interval K] [--model 150mb|tiny] "
                    "[--steps N] [--only 'worker kill'|...|copy] [--verbose]\n");
    return 2;
  }
  static const char *const big[] = {"--num-layers", "4", "--hidden-size", "512",
                                    "--num-attention-heads", "8", "--seq-length", "32",
                                    "--micro-batch-size", "1", "--global-batch-size", "2", NULL};
  if (!strcmp(model, "150mb"))
    for (int i = 0; big[i]; i++) model_flags[i] = big[i];
  if (!getenv("MEGAD")) setenv("MEGAD", BENCH_MEGAD, 1);
  if (!getenv("MEGAW")) setenv("MEGAW", BENCH_MEGAW, 1);
  signal(SIGPIPE, SIG_IGN);
  printf("megad recovery on loopback: %s, DP 2, checkpoint every %d iterations, default "
         "heartbeats (250 ms, lost after 1.5 s) and hang check (10 x median step, at least 2 s)\n",
         !strcmp(model, "tiny") ? "tiny GPT (2 layers, hidden 32)"
                                : "GPT 4 layers, hidden 512 (12.8 M parameters, 153 MB with "
                                  "Adam's moments)",
         save_interval);
  for (int k = 0; k < NKINDS; k++) {
    if (only && strcmp(only, kind_name[k])) continue;
    bench((fail_kind)k, true, runs, save_interval);
    bench((fail_kind)k, false, runs, save_interval);
  }
  if (!only || !strcmp(only, "copy")) bench_copy(steps);
  hd_cleanup_all();
  return 0;
}
