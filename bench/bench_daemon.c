/* megad on loopback: prints figures, never fails on a time.
 *
 *   1. submit -> first merged iteration at a watcher, 4-worker job (PP 2 x DP 2)
 *   2. a worker's step end -> the watcher's line: step end -> merge (megad's
 *      /metrics summary), plus merge -> watcher (StepMetrics.time_unix_ms)
 *   3. 1,000 unary GetJob calls: one after another, and from 8 threads
 *   4. 50 concurrent watchers of one job (replay on): every one must get
 *      every step; the counts are printed
 *
 *   bench_daemon [--watchers N] [--iters N]
 *
 * Uses the megad and megaw of the build (or MEGAD / MEGAW from the
 * environment) and the test harness (tests/daemon/harness.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static double now_us(void) { return hd_now_s() * 1e6; }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- 1 and 2 ---- */

static void submit_to_first_step(hd *d, int runs, int iters) {
  double lat[16];
  int ok = 0;
  double merge_to_watcher_ms = 0;
  int merge_n = 0;
  for (int k = 0; k < runs; k++) {
    Mega__V1__JobSpec spec;
    const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
    hd_tiny_spec(&spec, d->dir, iters, extra);
    spec.nproc_per_node = 4;
    char id[64];
    mega_err err = {0};
    double t0 = now_us();
    if (hd_submit(d, &spec, id, sizeof id, &err) != MEGA_OK) {
      printf("  submit failed: %s\n", err.msg);
      continue;
    }
    Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
    req.job_id = id;
    req.replay = true; /* a step merged before the watch began still counts */
    mega_rpc_stream *s = NULL;
    if (mega_rpc_stream_open(d->ch, &mega_control_watch_job, &req.base, 120000, &s, &err) != MEGA_OK)
      continue;
    ProtobufCMessage *m;
    bool first = true;
    while (mega_rpc_stream_next(s, &m, &err) == MEGA_OK && m) {
      Mega__V1__WatchJobResponse *it = (void *)m;
      if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) {
        if (first) {
          lat[ok++] = (now_us() - t0) / 1e3;
          first = false;
        } else if (it->step->time_unix_ms) {
          merge_to_watcher_ms += (double)(unix_ms() - it->step->time_unix_ms);
          merge_n++;
        }
      }
      protobuf_c_message_free_unpacked(m, NULL);
    }
    mega_rpc_stream_close(s);
  }
  if (!ok) return;
  qsort(lat, (size_t)ok, sizeof lat[0], cmp_d);
  printf("submit -> first iteration at the watcher (4 workers, PP 2 x DP 2, tiny GPT): "
         "median %.1f ms, min %.1f ms, max %.1f ms over %d jobs\n",
         lat[ok / 2], lat[0], lat[ok - 1], ok);
  if (merge_n)
    printf("merge -> watcher (StepMetrics.time_unix_ms, ms clock): mean %.2f ms over %d steps\n",
           merge_to_watcher_ms / merge_n, merge_n);
}

/* megad's own measure of step end -> merge, from GET /metrics. */
static void report_delay(const char *maddr) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  const char *colon = strrchr(maddr, ':');
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
    close(s);
    return;
  }
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  if (write(s, req, sizeof req - 1) < 0) {
    close(s);
    return;
  }
  static char page[1 << 20];
  size_t n = 0;
  ssize_t r;
  while ((r = read(s, page + n, sizeof page - 1 - n)) > 0) n += (size_t)r;
  close(s);
  page[n] = '\0';
  double sum = 0, count = 0;
  /* the node-wide summary: it outlives the jobs */
  char *p = strstr(page, "\nmega_step_report_delay_seconds_sum ");
  if (p) sum = atof(strchr(p + 1, ' ') + 1);
  p = strstr(page, "\nmega_step_report_delay_seconds_count ");
  if (p) count = atof(strchr(p + 1, ' ') + 1);
  if (count > 0)
    printf("worker step end -> merge at the coordinator (slowest rank's StepReport.step_start_unix_us"
           " + step_time_s): mean %.2f ms over %.0f steps\n",
           1e3 * sum / count, count);
}

/* ---- 3 ---- */

typedef struct getter {
  hd *d;
  const char *id;
  int n, failed;
} getter;

static void *get_many(void *arg) {
  getter *g = arg;
  for (int i = 0; i < g->n; i++) {
    Mega__V1__Job *j = hd_get_job(g->d, g->id, NULL);
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    else g->failed++;
  }
  return NULL;
}

static void unary_throughput(hd *d, const char *id) {
  getter g = {d, id, 1000, 0};
  double t0 = hd_now_s();
  get_many(&g);
  double t = hd_now_s() - t0;
  printf("1000 GetJob calls, one after another: %.0f calls/s (%.0f us each), %d failed\n", 1000 / t,
         1e6 * t / 1000, g.failed);
  getter gs[8];
  pthread_t th[8];
  t0 = hd_now_s();
  for (int i = 0; i < 8; i++) {
    gs[i] = (getter){d, id, 125, 0};
    pthread_create(&th[i], NULL, get_many, &gs[i]);
  }
  int failed = 0;
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    failed += gs[i].failed;
  }
  t = hd_now_s() - t0;
  printf("1000 GetJob calls from 8 threads: %.0f calls/s, %d failed\n", 1000 / t, failed);
}

/* ---- 4 ---- */

typedef struct watcher {
  hd *d;
  const char *id;
  hd_watch w;
} watcher;

static void *watch_one(void *arg) {
  watcher *w = arg;
  hd_watch_job(w->d, w->id, true, 300000, &w->w);
  return NULL;
}

static void many_watchers(hd *d, int nw, int iters) {
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, d->dir, iters, extra);
  spec.nproc_per_node = 4;
  char id[64];
  mega_err err = {0};
  if (hd_submit(d, &spec, id, sizeof id, &err) != MEGA_OK) {
    printf("  submit failed: %s\n", err.msg);
    return;
  }
  watcher *ws = calloc((size_t)nw, sizeof *ws);
  pthread_t *th = calloc((size_t)nw, sizeof *th);
  double t0 = hd_now_s();
  for (int i = 0; i < nw; i++) {
    ws[i] = (watcher){d, id, {0}};
    pthread_create(&th[i], NULL, watch_one, &ws[i]);
  }
  int min = iters + 1, max = 0, complete = 0;
  for (int i = 0; i < nw; i++) {
    pthread_join(th[i], NULL);
    int n = ws[i].w.steps;
    if (n < min) min = n;
    if (n > max) max = n;
    complete += ws[i].w.final && ws[i].w.final->state == MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED &&
                n == iters;
    hd_watch_free(&ws[i].w);
  }
  double t = hd_now_s() - t0;
  printf("%d concurrent watchers of a %d-iteration job (%.1f s): steps per watcher min %d, max %d; "
         "%d of %d got every step and the final state%s\n",
         nw, iters, t, min, max, complete, nw, complete == nw ? " (nothing dropped)" : "");
  free(ws);
  free(th);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  int nw = 50, iters = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--watchers")) nw = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
  }
  if (!getenv("MEGAD")) setenv("MEGAD", BENCH_MEGAD, 1);
  if (!getenv("MEGAW")) setenv("MEGAW", BENCH_MEGAW, 1);

  /* a free port for /metrics */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  bind(s, (struct sockaddr *)&sa, sizeof sa);
  getsockname(s, (struct sockaddr *)&sa, &sl);
  close(s);
  char maddr[64];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", ntohs(sa.sin_port));
  const char *extra[] = {"--metrics-listen", maddr, NULL};

  hd d;
  if (!hd_start(&d, "bench", 4, NULL, NULL, extra)) {
    printf("megad did not start; no figures\n");
    return 0;
  }
  printf("megad %s on %s, 4 slots; %d watchers\n", d.name, d.addr, nw);
  submit_to_first_step(&d, 5, 20);
  report_delay(maddr);
  unary_throughput(&d, "j-1-bench");
  many_watchers(&d, nw, iters);
  hd_stop(&d);
  hd_cleanup(&d);
  return 0;
}
