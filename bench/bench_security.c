/* megad under load with the cluster token on (issue 11): prints figures,
 * never fails on a time.
 *
 *   1. pending flood: one job holds the only slot, then N jobs wait behind
 *      it; submit, GetJob and cancel latency (p50, p99, max) at the start
 *      and at the end of the flood, and megad's CPU while idle with N
 *      pending (from /proc/PID/stat)
 *   2. W watchers of a job of S steps, while C SubmitJob/GetJob calls run,
 *      every 10th without the token: steps each watcher got plus the steps a
 *      gap marker told it it missed, refused and failed calls, megad's RSS
 *      before and after
 *
 *   3. I idle connections, 100 that sent garbage bytes and 100 that sent half
 *      an HTTP/2 preface (slowloris) on megad's port: GetJob latency of an
 *      authenticated client meanwhile, and how many of them megad closed
 *      within 15 s (its handshake timeout is 10 s)
 *
 *   bench_security [--pending N] [--watchers W] [--steps S] [--calls C] [--idle I]
 *
 * Defaults: N 10000, W 500, S 3000, C 10000, I 1000. BENCH_PLAIN=1 starts
 * megad without the token and limits (a megad from before issue 11, for
 * figures before and after: MEGAD=/path/to/old/megad BENCH_PLAIN=1).  Uses the megad and megaw of the
 * build (or MEGAD / MEGAW) and the test harness (tests/daemon/harness.h). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define TOKEN "YmVuY2gtdG9rZW4tb2YtbWVnYWQtYmVuY2g="

static double now_ms(void) { return hd_now_s() * 1e3; }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void print_lat(const char *what, double *v, int n) {
  if (n <= 0) return;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  printf("  %-34s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  (%d calls)\n", what, v[n / 2],
         v[(n * 99) / 100], v[n - 1], n);
}

/* utime + stime of pid, in seconds */
static double cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

/* A job spec of its own (hd_tiny_spec's storage is static: one thread at a
 * time); free it with free_spec. */
static Mega__V1__JobSpec *make_spec(hd *d, int iters, const char *const *extra) {
  Mega__V1__JobSpec tmp, *spec = malloc(sizeof *spec);
  hd_tiny_spec(&tmp, d->dir, iters, extra);
  *spec = tmp;
  spec->args = calloc(tmp.n_args, sizeof *spec->args);
  for (size_t i = 0; i < tmp.n_args; i++) spec->args[i] = strdup(tmp.args[i]);
  return spec;
}

static void free_spec(Mega__V1__JobSpec *spec) {
  for (size_t i = 0; i < spec->n_args; i++) free(spec->args[i]);
  free(spec->args);
  free(spec);
}

static mega_status submit_spec(mega_rpc_channel *ch, Mega__V1__JobSpec *sp, uint32_t nnodes,
                               char *id) {
  Mega__V1__JobSpec spec = *sp;
  spec.nnodes_min = nnodes;
  spec.nproc_per_node = 1;
  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  req.spec = &spec;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  mega_status s = mega_rpc_unary(ch, &mega_control_submit_job, &req.base, 30000, &resp, &err);
  if (s == MEGA_OK && id) snprintf(id, 64, "%s", ((Mega__V1__SubmitJobResponse *)resp)->job->id);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return s;
}

static mega_status submit(hd *d, mega_rpc_channel *ch, int iters, const char *const *extra,
                          uint32_t nnodes, char *id) {
  Mega__V1__JobSpec *spec = make_spec(d, iters, extra);
  mega_status s = submit_spec(ch, spec, nnodes, id);
  free_spec(spec);
  return s;
}

static mega_status get_or_cancel(mega_rpc_channel *ch, const char *id, bool cancel) {
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  mega_status s;
  if (cancel) {
    Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    s = mega_rpc_unary(ch, &mega_control_cancel_job, &req.base, 30000, &resp, &err);
  } else {
    Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
    req.job_id = (char *)id;
    s = mega_rpc_unary(ch, &mega_control_get_job, &req.base, 30000, &resp, &err);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return s;
}

/* ---- 1 ---- */

static void pending_flood(hd *d, int n) {
  printf("1. %d jobs pending behind one that holds the only slot\n", n);
  const char *slow[] = {"--simulate-compute", "200:200", NULL};
  char holder[64];
  Mega__V1__JobSpec *hs = make_spec(d, 1000000, slow);
  hs->step_timeout_ms = 600000; /* it must hold the slot for the whole flood */
  mega_status hst = submit_spec(d->ch, hs, 1, holder);
  free_spec(hs);
  if (hst != MEGA_OK) {
    printf("  the first job was refused\n");
    return;
  }
  char(*ids)[64] = calloc((size_t)n, sizeof *ids);
  double *lat = calloc((size_t)n, sizeof *lat);
  int k = n < 1000 ? n : 1000, failed = 0;
  double t0 = now_ms();
  for (int i = 0; i < n; i++) {
    double t = now_ms();
    if (submit(d, d->ch, 2, NULL, 1, ids[i]) != MEGA_OK) failed++;
    lat[i] = now_ms() - t;
  }
  double total = now_ms() - t0;
  printf("  submitted %d in %.1f s (%.0f/s), %d refused\n", n, total / 1e3, n / (total / 1e3), failed);
  double *first = malloc((size_t)k * sizeof *first), *last = malloc((size_t)k * sizeof *last);
  memcpy(first, lat, (size_t)k * sizeof *lat);
  memcpy(last, lat + n - k, (size_t)k * sizeof *lat);
  char what[64];
  snprintf(what, sizeof what, "submit, the first %d", k);
  print_lat(what, first, k);
  snprintf(what, sizeof what, "submit, the last %d", k);
  print_lat(what, last, k);
  for (int i = 0; i < k; i++) {
    double t = now_ms();
    get_or_cancel(d->ch, ids[n - 1 - i], false);
    lat[i] = now_ms() - t;
  }
  print_lat("GetJob with all pending", lat, k);
  double c0 = cpu_s(d->pid);
  sleep(10);
  printf("  megad idle with %d pending: %.2f%% of a core over 10 s\n", n,
         100 * (cpu_s(d->pid) - c0) / 10);
  for (int i = 0; i < k; i++) {
    double t = now_ms();
    get_or_cancel(d->ch, ids[n - 1 - i], true);
    lat[i] = now_ms() - t;
  }
  print_lat("cancel, with the rest pending", lat, k);
  Mega__V1__Job *hj = hd_get_job(d, holder, NULL);
  printf("  the holder is %s at iteration %llu (it must have held the slot throughout)\n",
         hj && hj->state == MEGA__V1__JOB_STATE__JOB_STATE_RUNNING ? "running" : "NOT running",
         hj ? (unsigned long long)hj->last_iteration : 0ULL);
  if (hj) protobuf_c_message_free_unpacked(&hj->base, NULL);
  for (int i = 0; i < n - k; i++) get_or_cancel(d->ch, ids[i], true);
  get_or_cancel(d->ch, holder, true);
  printf("  megad RSS after the flood: %ld kB\n", rss_kb(d->pid));
  free(ids);
  free(lat);
  free(first);
  free(last);
}

/* ---- 2 ---- */

typedef struct watcher {
  hd *d;
  const char *id;
  hd_watch *w;
} watcher;

static void *watch_one(void *arg) {
  watcher *w = arg;
  hd_watch_job(w->d, w->id, true, 600000, w->w);
  return NULL;
}

typedef struct caller {
  Mega__V1__JobSpec *spec;
  mega_rpc_channel *good, *bad;
  int calls, ok, refused, failed, full;
  const char *job;
} caller;

static void *call_many(void *arg) {
  caller *c = arg;
  for (int i = 0; i < c->calls; i++) {
    bool unauth = i % 10 == 9;
    mega_rpc_channel *ch = unauth ? c->bad : c->good;
    mega_status s = i % 2 ? get_or_cancel(ch, c->job, false) : submit_spec(ch, c->spec, 2, NULL);
    if (unauth) c->refused += s != MEGA_OK;
    else if (s == MEGA_OK) c->ok++;
    else if (s == MEGA_ERR_NOMEM) c->full++; /* --max-pending */
    else c->failed++;
  }
  return NULL;
}

static void watchers_and_calls(hd *d, int nw, int steps, int calls) {
  printf("2. %d watchers of a %d-step job while %d SubmitJob/GetJob calls run (every 10th "
         "without the token)\n", nw, steps, calls);
  long rss0 = rss_kb(d->pid);
  const char *fast[] = {"--simulate-compute", "0:0", NULL};
  char id[64];
  Mega__V1__JobSpec *js = make_spec(d, steps, fast);
  js->step_timeout_ms = 600000; /* megad's loop is what is loaded here, not the worker */
  mega_status jst = submit_spec(d->ch, js, 1, id);
  free_spec(js);
  if (jst != MEGA_OK) {
    printf("  the job was refused\n");
    return;
  }
  watcher *ws = calloc((size_t)nw, sizeof *ws);
  pthread_t *th = calloc((size_t)nw, sizeof *th);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (int i = 0; i < nw; i++) {
    ws[i] = (watcher){d, id, calloc(1, sizeof(hd_watch))};
    pthread_create(&th[i], &attr, watch_one, &ws[i]);
  }
  mega_rpc_auth none = {0};
  mega_rpc_channel_opts bo = {.peer_name = "megad", .auth = &none};
  caller cs[4];
  pthread_t ct[4];
  for (int i = 0; i < 4; i++) {
    cs[i] = (caller){.spec = make_spec(d, 2, NULL), .good = d->ch, .calls = calls / 4, .job = id};
    mega_rpc_channel_new(d->addr, &bo, &cs[i].bad, NULL);
    pthread_create(&ct[i], NULL, call_many, &cs[i]);
  }
  int ok = 0, refused = 0, failed = 0, full = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(ct[i], NULL);
    ok += cs[i].ok;
    refused += cs[i].refused;
    failed += cs[i].failed;
    full += cs[i].full;
    mega_rpc_channel_free(cs[i].bad);
    free_spec(cs[i].spec);
  }
  long rss_mid = rss_kb(d->pid);
  int every = 0, told = 0, short_silent = 0, ended = 0;
  uint64_t min_got = UINT64_MAX, max_got = 0, max_missed = 0;
  for (int i = 0; i < nw; i++) {
    pthread_join(th[i], NULL);
    hd_watch *w = ws[i].w;
    ended += w->final != NULL;
    if ((uint64_t)w->steps < min_got) min_got = (uint64_t)w->steps;
    if ((uint64_t)w->steps > max_got) max_got = (uint64_t)w->steps;
    if (w->missed > max_missed) max_missed = w->missed;
    if (w->steps == steps) every++;
    else if ((uint64_t)w->steps + w->missed == (uint64_t)steps) told++;
    else short_silent++;
    hd_watch_free(w);
    free(w);
  }
  printf("  calls: %d authenticated ok, %d failed, %d refused by --max-pending; %d "
         "unauthenticated refused of %d\n", ok, failed, full, refused, calls / 10);
  printf("  watchers: %d got every step, %d were told of a gap (at most %llu steps missed), "
         "%d lost steps silently; %d saw the end; steps got %llu to %llu\n",
         every, told, (unsigned long long)max_missed, short_silent, ended,
         (unsigned long long)min_got, (unsigned long long)max_got);
  Mega__V1__Job *j = hd_get_job(d, id, NULL);
  if (j) {
    printf("  the job: %s at iteration %llu of %d, attempt %u%s%s\n", j->state ==
           MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED ? "succeeded" : "did not succeed",
           (unsigned long long)j->last_iteration, steps, j->attempt,
           j->error && j->error[0] ? ": " : "", j->error ? j->error : "");
    protobuf_c_message_free_unpacked(&j->base, NULL);
  }
  printf("  megad RSS: %ld kB before, %ld kB under load, %ld kB after\n", rss0, rss_mid,
         rss_kb(d->pid));
  free(ws);
  free(th);
}

/* ---- 3 ---- */

static int connect_to(const char *addr) {
  const char *colon = strrchr(addr, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void idle_and_garbage(hd *d, int idle) {
  printf("3. %d idle connections, 100 sending garbage, 100 half a preface (slowloris)\n", idle);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  int n = idle + 200, opened = 0;
  int *fds = calloc((size_t)n, sizeof *fds);
  for (int i = 0; i < n; i++) {
    fds[i] = connect_to(d->addr);
    opened += fds[i] >= 0;
    if (fds[i] < 0) continue;
    if (i >= idle && i < idle + 100) {
      char junk[512];
      for (size_t k = 0; k < sizeof junk; k++) junk[k] = (char)(k * 131 + i);
      if (write(fds[i], junk, sizeof junk) < 0) {}
    } else if (i >= idle + 100) {
      if (write(fds[i], "PRI * HTTP/2.0\r\n", 16) < 0) {}
    }
  }
  printf("  opened %d of %d connections\n", opened, n);
  double lat[200];
  int k = 0;
  for (int i = 0; i < 200; i++) {
    double t = now_ms();
    Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    mega_err err = {0};
    if (mega_rpc_unary(d->ch, &mega_control_list_nodes, &req.base, 5000, &resp, &err) == MEGA_OK)
      lat[k++] = now_ms() - t;
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    usleep(20000);
  }
  print_lat("ListNodes meanwhile", lat, k);
  sleep(12);
  int closed = 0;
  for (int i = 0; i < n; i++) {
    if (fds[i] < 0) continue;
    char buf[4096];
    ssize_t r;
    while ((r = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT)) > 0) {
    } /* a GOAWAY, then the end */
    closed += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  printf("  after 12 s megad had closed %d of the %d (idle, garbage and slowloris alike)\n",
         closed, opened);
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  printf("  megad RSS: %ld kB\n", rss_kb(d->pid));
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  int pending = 10000, watchers = 500, steps = 3000, calls = 10000, idle = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--pending")) pending = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--watchers")) watchers = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--calls")) calls = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--idle")) idle = atoi(argv[i + 1]);
  }
  if (!getenv("MEGAD")) setenv("MEGAD", BENCH_MEGAD, 1);
  if (!getenv("MEGAW")) setenv("MEGAW", BENCH_MEGAW, 1);
  char dir[64], tok[128];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  FILE *f = fopen(tok, "w");
  fputs(TOKEN, f);
  fclose(f);
  chmod(tok, 0600);
  mega_rpc_auth auth = {.token = TOKEN};
  bool plain = getenv("BENCH_PLAIN") && !strcmp(getenv("BENCH_PLAIN"), "1");
  hd_set_auth(plain ? NULL : &auth);
  char maxp[32];
  snprintf(maxp, sizeof maxp, "%d", pending + calls / 2 + 100);
  const char *extra[] = {"--token-file", tok, "--max-pending", maxp, NULL};
  hd d;
  if (!hd_start(&d, "bench", 1, NULL, NULL, plain ? NULL : extra)) return 1;
  if (plain) printf("(BENCH_PLAIN: no token, so the 'unauthenticated' calls are served)\n");
  printf("megad %d, RSS at start %ld kB\n", (int)d.pid, rss_kb(d.pid));
  pending_flood(&d, pending);
  watchers_and_calls(&d, watchers, steps, calls);
  idle_and_garbage(&d, idle);
  hd_cleanup(&d);
  hd_rmdir(dir);
  return 0;
}
