/* Scale in etcd mode (issue 14): prints figures, never fails on a time.
 *
 * For each node count N: one etcd member and N megad on loopback (2 slots
 * each, --etcd-endpoints, no --peers), then one job of 2N ranks: PP=4 x
 * DP=N/2, 2 ranks per node, the tiny GPT with --simulate-compute, submitted
 * to the first node. Where the time from submit to the first iteration goes,
 * from the job's own events (megad's clock, the same machine's):
 *   claim      submitted -> placed: the coordinator key and first records
 *              written to etcd, then placement
 *   launch     placed -> started: every node spawned its megaw, every rank
 *              checked its job and said hello
 *   rendezvous started -> the last rank's first step began (the merged
 *              step's time less that rank's own step time): the model built,
 *              the groups met through the coordinator's KV store, Gloo's
 *              connections made
 *   first iter the last rank's first step began -> the coordinator merged
 *              iteration 1: the pipeline, the DP all-reduce, the reports
 * and submit -> the first iteration at a watcher (this program's clock).
 * Per job, what it cost: etcd's writes, watch events and bytes sent (its
 * /metrics; the writes and events also split at iteration 1: the start,
 * then the rest and the end), the key-value calls the coordinator served
 * (its /metrics), and the CPU seconds of the workers, the megad and etcd
 * (/proc). MEGAD=path runs another build's megad (before and after).
 * With the largest N, after its job: each megad's and etcd's RSS, their CPU
 * over IDLE_S seconds of doing nothing, etcd's lease renewals and watchers,
 * the megad's open fds.
 *
 *   build/bench/bench_scale [-r RUNS] [N ...]
 *     N: node counts (default 4 8 16 32; 2N a multiple of 4); RUNS per count
 *     (default 1; with more, the median of submit -> first iteration).
 *     Skips (77) without etcd. Exits 1 when a job failed (the row says why). */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/etcd_fixture.h"
#include "tests/daemon/harness.h"

#define MAX_NODES 64
#define PP 4
#define MICRO_PER_REPLICA 4
#define ITERS 3
#define IDLE_S 10
#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- etcd's own counters (its /metrics page on the client port) ---- */

typedef struct etcd_counts {
  double writes;  /* puts and transactions */
  double events;  /* events sent to watchers */
  double renewed; /* leases kept alive */
  double sent;    /* bytes sent to clients */
  double watchers;
} etcd_counts;

static double metric(const char *page, const char *name) {
  size_t n = strlen(name);
  for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, n) && p[n] == ' ') return atof(p + n + 1);
  return 0;
}

static etcd_counts etcd_read(const etcd_fx *fx) {
  etcd_counts c = {0};
  char *page = hd_http_get(fx->m[0].client_port, "/metrics", NULL);
  if (!page) return c;
  c.writes = metric(page, "etcd_mvcc_put_total") + metric(page, "etcd_mvcc_txn_total");
  c.events = metric(page, "etcd_debugging_mvcc_events_total");
  c.renewed = metric(page, "etcd_debugging_lease_renewed_total");
  c.sent = metric(page, "etcd_network_client_grpc_sent_bytes_total");
  c.watchers = metric(page, "etcd_debugging_mvcc_watcher_total");
  free(page);
  return c;
}

/* What the watch saw of iteration 1. */
typedef struct first_step {
  const etcd_fx *fx;
  etcd_counts at;    /* etcd's counters then: the job's start, apart from its end */
  int64_t seen_ms;   /* at this program */
  int64_t merged_ms; /* at the coordinator */
  double fastest_s;  /* the rank that began last */
} first_step;

static void on_item(void *arg, const Mega__V1__WatchJobResponse *it) {
  first_step *f = arg;
  if (f->seen_ms || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) return;
  f->seen_ms = unix_ms();
  f->at = etcd_read(f->fx);
  f->merged_ms = it->step->time_unix_ms;
  f->fastest_s = it->step->step_time_s;
  for (size_t i = 0; i < it->step->n_ranks; i++)
    if (it->step->ranks[i]->step_time_s < f->fastest_s)
      f->fastest_s = it->step->ranks[i]->step_time_s;
}

/* Key-value calls (Peer KvSet, KvGet, KvWait, KvGather) the coordinator served: its
 * workers' rendezvous from every other node (its own ranks' go locally). */
static double kv_served(int metrics_port) {
  char *page = hd_http_get(metrics_port, "/metrics", NULL);
  const char *name = "mega_rpc_served_total{method=\"/mega.v1.Peer/Kv";
  double n = 0;
  for (const char *p = page; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, strlen(name))) n += atof(strchr(p, ' ') + 1);
  free(page);
  return n;
}

/* ---- resident memory and CPU from /proc ---- */

static double rss_mb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  double mb = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) mb = atof(line + 6) / 1024;
  if (f) fclose(f);
  return mb;
}

/* CPU ticks of pid itself, or of its children it reaped (its workers). */
static long ticks_of(pid_t pid, bool children) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  long ut = 0, st = 0, cut = 0, cst = 0;
  /* after the name: state, then 10 fields before utime, stime, cutime, cstime */
  if (p)
    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld %ld %ld", &ut, &st, &cut,
           &cst);
  return children ? cut + cst : ut + st;
}

static long cpu_ticks(pid_t pid) { return ticks_of(pid, false); }

/* CPU seconds used so far: every megad's own, their workers' (reaped), etcd's. */
typedef struct cpu_use {
  double megad, workers, etcd;
} cpu_use;

static cpu_use cpu_now(const hd *d, int n, pid_t etcd) {
  double hz = (double)sysconf(_SC_CLK_TCK);
  cpu_use u = {0, 0, (double)cpu_ticks(etcd) / hz};
  for (int i = 0; i < n; i++) {
    u.megad += (double)ticks_of(d[i].pid, false) / hz;
    u.workers += (double)ticks_of(d[i].pid, true) / hz;
  }
  return u;
}

/* Open file descriptors of pid (sockets, pipes, files). */
static int fds_of(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  int n = 0;
  for (struct dirent *e; dir && (e = readdir(dir));) n += e->d_name[0] != '.';
  if (dir) closedir(dir);
  return n;
}

static void idle(hd *d, int n, const etcd_fx *fx, char *out, size_t cap) {
  pid_t etcd = fx->m[0].pid;
  sleep(2); /* the nodes' records settle after the job (their load) */
  long hz = sysconf(_SC_CLK_TCK), before[MAX_NODES + 1];
  for (int i = 0; i < n; i++) before[i] = cpu_ticks(d[i].pid);
  before[n] = cpu_ticks(etcd);
  etcd_counts c0 = etcd_read(fx);
  sleep(IDLE_S);
  etcd_counts c1 = etcd_read(fx);
  double sum_rss = 0, max_rss = 0, sum_cpu = 0, max_cpu = 0;
  int max_fds = 0;
  for (int i = 1; i < n; i++)
    if (fds_of(d[i].pid) > max_fds) max_fds = fds_of(d[i].pid);
  for (int i = 0; i < n; i++) {
    double r = rss_mb(d[i].pid), c = 100.0 * (double)(cpu_ticks(d[i].pid) - before[i]) / hz / IDLE_S;
    sum_rss += r;
    sum_cpu += c;
    if (r > max_rss) max_rss = r;
    if (c > max_cpu) max_cpu = c;
  }
  snprintf(out, cap,
           "idle after the job, %d megad over %d s: RSS %.1f MB each (max %.1f), CPU %.2f%% of a "
           "core each (max %.2f%%, all %.1f%%); open fds: the coordinator %d, the others at "
           "most %d\n"
           "idle after the job, etcd (1 member): RSS %.1f MB, CPU %.2f%% of a core; %.1f lease "
           "renewals/s, %.1f writes/s, %.1f watch events/s, %.1f KB/s sent, %.0f watchers\n",
           n, IDLE_S, sum_rss / n, max_rss, sum_cpu / n, max_cpu, sum_cpu, fds_of(d[0].pid),
           max_fds, rss_mb(etcd),
           100.0 * (double)(cpu_ticks(etcd) - before[n]) / hz / IDLE_S,
           (c1.renewed - c0.renewed) / IDLE_S, (c1.writes - c0.writes) / IDLE_S,
           (c1.events - c0.events) / IDLE_S, (c1.sent - c0.sent) / IDLE_S / 1024, c1.watchers);
}

/* ---- one node count ---- */

typedef struct result {
  bool ok;
  double started, joined, claim, launch, rdv, first, merged, watch;
  int lost; /* NODE_LOST events of the job */
  etcd_counts job; /* etcd's counters from submit to the job's end */
  etcd_counts start; /* from submit to iteration 1 at the watcher */
  double kv;       /* the coordinator's key-value calls served meanwhile */
  cpu_use cpu;     /* CPU seconds from submit to the job's end */
  char why[600];
  char idle[400]; /* the idle figures, when measured */
} result;

static void stop_all(hd *d, int n) {
  for (int i = 0; i < n; i++)
    if (d[i].pid > 0) kill(d[i].pid, SIGTERM);
  for (int i = n - 1; i >= 0; i--) {
    hd_stop(&d[i]);
    hd_cleanup(&d[i]);
  }
}

/* The first event of each kind (unix ms, 0: none), how many NODE_LOST. */
static int event_times(hd *d, const char *id, int64_t at[16]) {
  memset(at, 0, 16 * sizeof at[0]);
  Mega__V1__GetJobResponse *r = hd_get_job_history(d, id, NULL);
  int lost = 0;
  for (size_t i = 0; r && i < r->n_events; i++) {
    Mega__V1__JobEvent *e = r->events[i];
    if ((unsigned)e->kind < 16 && !at[e->kind]) at[e->kind] = e->time_unix_ms;
    lost += e->kind == KIND(NODE_LOST);
  }
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return lost;
}

/* Why a run failed, on stderr: the coordinator's warnings and etcd's own
 * (slow requests, slow disk). */
static void warnings(const hd *coordinator, const etcd_fx *fx) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "grep -h 'warning' %s | head -n 12 | cut -c1-240 >&2; "
           "grep -h ' W | ' %s/e1.log | tail -n 5 | cut -c1-240 >&2",
           coordinator->log, fx->dir);
  if (system(cmd)) {
    /* none */
  }
}

static result run(int n, bool measure_idle) {
  result res = {0};
  etcd_fx fx;
  if (!etcd_fx_start(&fx, 1)) {
    snprintf(res.why, sizeof res.why, "etcd did not start");
    return res;
  }
  static hd d[MAX_NODES];
  /* the first node, the job's coordinator, serves /metrics too */
  int mport = hd_free_port();
  char maddr[32];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", mport);
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, "--metrics-listen", maddr, NULL};
  double t0 = hd_now_s();
  int up = 0;
  bool ok = true;
  for (; up < n && ok; up++) {
    char name[16];
    snprintf(name, sizeof name, "s%02d", up + 1);
    if (up == 1) extra[2] = NULL; /* the others: no /metrics */
    ok = hd_start(&d[up], name, 2, NULL, NULL, extra);
  }
  if (!ok) up--;
  res.started = hd_now_s() - t0;
  for (int i = 0; i < n && ok; i++) ok = hd_wait_alive(&d[i], n, 60000);
  res.joined = hd_now_s() - t0;
  if (!ok) {
    snprintf(res.why, sizeof res.why, "the %d megad did not all come up and see each other "
             "within 60 s", n);
    stop_all(d, up);
    etcd_fx_stop(&fx);
    return res;
  }

  int world = 2 * n, dp = world / PP;
  char gbs[16];
  snprintf(gbs, sizeof gbs, "%d", dp * MICRO_PER_REPLICA);
  const char *flags[] = {"--num-layers", "4", "--pipeline-model-parallel-size", "4",
                         "--micro-batch-size", "1", "--global-batch-size", gbs,
                         "--simulate-compute", "2:4", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d[0].dir, ITERS, flags);
  spec.nproc_per_node = 2;
  spec.nnodes_min = spec.nnodes_max = (uint32_t)n;
  char id[64];
  mega_err err = {0};
  etcd_counts c0 = etcd_read(&fx);
  double kv0 = kv_served(mport);
  cpu_use u0 = cpu_now(d, n, fx.m[0].pid);
  int64_t submit_ms = unix_ms();
  if (hd_submit(&d[0], &spec, id, sizeof id, &err) != MEGA_OK) {
    snprintf(res.why, sizeof res.why, "submit failed: %s", err.msg);
    stop_all(d, n);
    etcd_fx_stop(&fx);
    return res;
  }
  first_step f = {.fx = &fx};
  hd_watch w;
  hd_watch_job_cb(&d[0], id, true, 600000, &w, on_item, &f);
  usleep(200000); /* the job's last records reach etcd and its watchers */
  etcd_counts c1 = etcd_read(&fx);
  res.kv = kv_served(mport) - kv0;
  cpu_use u1 = cpu_now(d, n, fx.m[0].pid);
  res.cpu = (cpu_use){u1.megad - u0.megad, u1.workers - u0.workers, u1.etcd - u0.etcd};
  res.job = (etcd_counts){c1.writes - c0.writes, c1.events - c0.events, 0, c1.sent - c0.sent, 0};
  if (f.seen_ms)
    res.start = (etcd_counts){f.at.writes - c0.writes, f.at.events - c0.events, 0,
                              f.at.sent - c0.sent, 0};
  res.ok = w.final && w.final->state == MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
  if (!res.ok)
    snprintf(res.why, sizeof res.why, "%s", w.final ? w.final->error : w.err.msg);
  int64_t at[16];
  res.lost = event_times(&d[0], id, at);
  hd_watch_free(&w);
  if (!res.ok) warnings(&d[0], &fx);

  /* the rank that began its first step last began it fastest_s before the merge */
  int64_t last_began = f.merged_ms - (int64_t)(f.fastest_s * 1000);
  res.claim = at[KIND(PLACED)] ? (at[KIND(PLACED)] - at[KIND(SUBMITTED)]) / 1e3 : -1;
  res.launch = at[KIND(STARTED)] ? (at[KIND(STARTED)] - at[KIND(PLACED)]) / 1e3 : -1;
  res.rdv = f.merged_ms ? (last_began - at[KIND(STARTED)]) / 1e3 : -1;
  res.first = f.merged_ms ? (f.merged_ms - last_began) / 1e3 : -1;
  res.merged = f.merged_ms ? (f.merged_ms - at[KIND(SUBMITTED)]) / 1e3 : -1;
  res.watch = f.seen_ms ? (f.seen_ms - submit_ms) / 1e3 : -1;
  if (measure_idle && res.ok) idle(d, n, &fx, res.idle, sizeof res.idle);
  stop_all(d, n);
  etcd_fx_stop(&fx);
  return res;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define ROW "%4d %5d %3dx%-3d %7.2f %7.2f | %6.3f %6.3f %6.3f %6.3f | %7.3f %7.3f | %6.0f %7.0f %7.1f | %6.0f | %6.1f %5.1f %4.1f"

int main(int argc, char **argv) {
  etcd_fx_require();
  int counts[16] = {4, 8, 16, 32}, nc = 0, runs = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-r") && i + 1 < argc) {
      runs = atoi(argv[++i]);
      if (runs < 1 || runs > 50) {
        fprintf(stderr, "bench_scale: -r '%s': give 1..50 runs per node count\n", argv[i]);
        return 2;
      }
      continue;
    }
    int n = atoi(argv[i]);
    if (n < 2 || n > MAX_NODES || (2 * n) % PP || nc == 16) {
      fprintf(stderr, "bench_scale: node count '%s': give up to 16 counts of 2..%d with 2N a "
                      "multiple of %d (PP=%d, 2 ranks per node)\n", argv[i], MAX_NODES, PP, PP);
      return 2;
    }
    counts[nc++] = n;
  }
  if (!nc) nc = 4;
  setenv("MEGAD", BENCH_MEGAD, 0);
  setenv("MEGAW", BENCH_MEGAW, 0);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double load[3] = {0};
  getloadavg(load, 3);
  printf("megad on etcd (1 member) on loopback: %ld CPU core%s shared by every process (load "
         "average %.1f at the start). N megad of 2 slots; a job of 2N ranks, PP=%d x DP=2N/%d, "
         "tiny GPT, --simulate-compute 2:4, %d microbatches per replica, %d iterations, "
         "submitted to the first node. Seconds.\n",
         cores, cores == 1 ? "" : "s", load[0], PP, PP, MICRO_PER_REPLICA, ITERS);
  printf("%4s %5s %7s %7s %7s | %6s %6s %6s %6s | %7s %7s | %6s %7s %7s | %6s | %6s %5s %4s\n",
         "N", "world", "PPxDP", "started", "all see", "claim", "launch", "rdv", "1st it", "merged",
         "watch", "writes", "events", "sent KB", "KV", "cpu:w", "megad", "etcd");
  int failed = 0;
  for (int i = 0; i < nc; i++) {
    int n = counts[i], ok = 0;
    double watch[50];
    for (int k = 0; k < runs; k++) {
      result r = run(n, i == nc - 1 && k == runs - 1);
      printf(ROW "  %s", n, 2 * n, PP, 2 * n / PP, r.started, r.joined, r.claim, r.launch, r.rdv,
             r.first, r.merged, r.watch, r.job.writes, r.job.events, r.job.sent / 1024, r.kv, r.cpu.workers, r.cpu.megad, r.cpu.etcd,
             r.ok ? "ok\n" : "FAILED: ");
      if (!r.ok) printf("%s (%d node-lost events)\n", r.why, r.lost);
      else
        printf("     etcd: submit -> iteration 1: %.0f writes, %.0f events; then -> the end: %.0f "
               "writes, %.0f events\n", r.start.writes, r.start.events,
               r.job.writes - r.start.writes, r.job.events - r.start.events);
      fputs(r.idle, stdout);
      fflush(stdout);
      if (r.ok) watch[ok++] = r.watch;
      failed += !r.ok;
    }
    if (runs > 1 && ok)
      printf("N=%d: submit -> first iteration at the watcher, median %.3f s over %d run%s; %d "
             "of %d failed\n", n, median(watch, ok), ok, ok == 1 ? "" : "s", runs - ok, runs);
  }
  printf("started: the N megad up, one after another; all see: every one lists N ALIVE "
         "(bench_etcd_join.py times the join properly). claim: submitted -> placed (the "
         "coordinator key in etcd, placement); launch: placed -> every rank said hello; rdv: "
         "-> the last rank began iteration 1 (model, rendezvous, Gloo connections); 1st it: -> "
         "the coordinator merged it; merged: submit -> that merge (job events); watch: submit -> "
         "iteration 1 at a watcher (this program's clock). writes, events, sent KB: etcd's "
         "puts and transactions, events sent to watchers and bytes sent to clients from submit "
         "to the job's end (its /metrics). KV: key-value calls (Peer KvSet/KvGet/KvWait/KvGather) "
         "the "
         "coordinator served meanwhile, from the other nodes' ranks. cpu: CPU seconds used from "
         "submit to the job's end by all workers, all megad and etcd.\n");
  return failed ? 1 : 0;
}
