/* GET /metrics: a snapshot of every layer and of the process, rendered by
 * metrics_text.c and served by http.c (libmicrohttpd on the loop). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/model/metrics_text.h"
#include "daemon/services/services.h"
#include "daemon/web/http.h"
#include "daemon/web/webserve.h"
#include "core/version.h"

typedef struct metrics_srv {
  megad_services *s;
  megad_http *http;
  megad_webserve *web;
  uint64_t http_requests[4];
} metrics_srv;

/* ---- the process, from /proc ---- */

static double boot_time_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  char line[256];
  double bt = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "btime ", 6)) {
      bt = strtod(line + 6, NULL);
      break;
    }
  fclose(f);
  return bt;
}

static void proc_stats(megad_proc_stats *p) {
  *p = (megad_proc_stats){-1, -1, -1, -1, -1, -1};
  long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/proc/self/stat", "r");
  char buf[1024];
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  /* the command may hold spaces and parentheses: fields start after the last ')' */
  char *rp = strrchr(buf, ')');
  unsigned long utime, stime, vsize;
  unsigned long long start;
  long rss;
  if (rp && tick > 0 &&
      sscanf(rp + 2,
             "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d "
             "%llu %lu %ld",
             &utime, &stime, &start, &vsize, &rss) == 5) {
    p->cpu_seconds = (double)(utime + stime) / (double)tick;
    double bt = boot_time_s();
    if (bt >= 0) p->start_time_seconds = bt + (double)start / (double)tick;
    p->virtual_bytes = (double)vsize;
    p->resident_bytes = (double)rss * (double)page;
  }
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    double fds = 0;
    for (struct dirent *e; (e = readdir(d));)
      if (e->d_name[0] != '.') fds++;
    closedir(d);
    p->open_fds = fds - 1; /* not the one opendir holds */
  }
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY)
    p->max_fds = (double)rl.rlim_cur;
}

/* ---- the page ---- */

static char *page(void *arg, size_t *len) {
  metrics_srv *ms = arg;
  megad_services *sv = ms->s;
  const megad_jobs_stats *js = &sv->jobs->stats;
  megad_metrics m = {.version = mega_version(), .slots = sv->L->o.slots,
                     .slots_used = sv->L->slots_used,
                     .web_streams = (uint32_t)megad_webserve_streams(ms->web),
                     .jobs = (const mega_job *const *)sv->jobs->t.v, .njobs = sv->jobs->t.n};
  proc_stats(&m.proc);
  m.c.jobs_submitted = js->submitted;
  memcpy(m.c.jobs_finished, js->finished, sizeof m.c.jobs_finished);
  for (int k = 0; k < MEGAD_METRICS_EVENT_KINDS; k++) m.c.job_events[k] = js->events[k];
  m.c.steps_merged = js->steps;
  m.c.watchers_dropped = sv->jobs->watchers.dropped_total;
  m.c.watch_steps_missed = sv->jobs->watchers.steps_missed_total;
  m.c.report_delay_sum_s = js->report_delay_sum_s;
  m.c.report_delay_n = js->report_delay_n;
  m.c.steps_relayed = sv->L->steps_relayed;
  memcpy(m.c.http_requests, ms->http_requests, sizeof m.c.http_requests);
  megad_rpc_count *rpcs = NULL;
  if (sv->srv) {
    const char *path;
    uint64_t served;
    size_t n = mega_rpc_server_served(sv->srv, 0, &path, &served);
    rpcs = calloc(n ? n : 1, sizeof *rpcs);
    for (size_t i = 0; rpcs && i < n; i++)
      mega_rpc_server_served(sv->srv, i, &rpcs[i].method, &rpcs[i].served);
    m.rpcs = rpcs;
    m.nrpcs = rpcs ? n : 0;
  }
  char *text = megad_metrics_render(&m, len);
  free(rpcs);
  return text;
}

static const char *const probe_paths[] = {"/healthz", "/readyz", NULL};

/* GET (or HEAD) /healthz and /readyz, open to probes: nothing but ok or
 * why not; another method is 405. */
static bool health(metrics_srv *ms, const megad_http_req *req, megad_http_resp *out) {
  bool live = !strcmp(req->target, "/healthz"), ready = !strcmp(req->target, "/readyz");
  if (!live && !ready) return false;
  if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
    out->status = 405;
    out->type = "text/plain; charset=utf-8";
    out->allow = "GET, HEAD";
    out->body = strdup("a probe: use GET or HEAD\n");
    out->len = out->body ? strlen(out->body) : 0;
    return true;
  }
  const char *why = NULL;
  bool ok = live || megad_services_ready(ms->s, &why);
  out->status = ok ? 200 : 503;
  out->type = "text/plain; charset=utf-8";
  if (asprintf(&out->body, "%s\n", ok ? "ok" : why ? why : "not ready") < 0) out->body = NULL;
  out->len = out->body ? strlen(out->body) : 0;
  return true;
}

/* The web view's paths (daemon/web/webserve.h). */
static bool route(void *arg, const megad_http_req *req, megad_http_resp *out) {
  metrics_srv *ms = arg;
  if (health(ms, req, out)) return true;
  return megad_webserve_route(ms->web, req, out);
}

static void count(void *arg, unsigned status) {
  metrics_srv *ms = arg;
  ms->http_requests[megad_metrics_http_slot(status)]++;
}

static void http_log(void *arg, const char *msg) {
  metrics_srv *ms = arg;
  megad_log(ms->s->b, "/metrics: %s", msg);
}

mega_status megad_metrics_start(megad_services *sv, const char *addr, const char *token,
                                mega_err *err) {
  metrics_srv *ms = calloc(1, sizeof *ms);
  if (!ms) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  ms->s = sv;
  ms->web = megad_webserve_new(sv, token);
  if (!ms->web) {
    free(ms);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  megad_http_opts o = {.listen = addr, .path = "/metrics",
                       .content_type = "text/plain; version=0.0.4; charset=utf-8",
                       .token = token, .body = page, .count = count, .route = route, .log = http_log,
                       .probe_paths = probe_paths, .arg = ms};
  mega_err e = {0};
  if (megad_http_start(sv->b->loop, &o, &ms->http, &e) != MEGA_OK) {
    megad_webserve_free(ms->web);
    free(ms);
    return mega_fail(err, e.status, "--metrics-listen: %s", e.msg);
  }
  sv->http = ms;
  /* with port 0 the log is the only place that says which one */
  const char *colon = strrchr(addr, ':');
  megad_log(sv->b, "serving /metrics and the web view on %.*s:%u", (int)(colon - addr), addr,
            megad_http_port(ms->http));
  return MEGA_OK;
}

void megad_metrics_stop(megad_services *sv) {
  metrics_srv *ms = sv->http;
  if (!ms) return;
  sv->http = NULL;
  megad_http_stop(ms->http); /* closes the web view's streams */
  megad_webserve_free(ms->web);
  free(ms);
}
