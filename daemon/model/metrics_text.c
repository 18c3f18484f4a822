/* The /metrics page in Prometheus' text format: one family at a time, its
 * HELP and TYPE first and its samples together (the format wants them so). */
#include "daemon/model/metrics_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/step_bubble.h"

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(sbuf *b, const char *fmt, ...) {
  while (!b->oom) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 8192) + (size_t)n;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

static void family(sbuf *b, const char *name, const char *type, const char *help) {
  addf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value as Prometheus parses it (Go's ParseFloat): NaN, +Inf, -Inf. */
static const char *num(char *buf, size_t len, double v) {
  if (isnan(v)) return "NaN";
  if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  snprintf(buf, len, "%.17g", v);
  return buf;
}

/* A label value: backslash, quote and newline escaped. Ids are ours, but
 * nothing is trusted to be. */
static void label(char *out, size_t cap, const char *s) {
  size_t o = 0;
  for (; s && *s && o + 3 < cap; s++) {
    char c = *s;
    if (c == '\\' || c == '"' || c == '\n') {
      out[o++] = '\\';
      c = c == '\n' ? 'n' : c;
    }
    out[o++] = c;
  }
  out[o] = '\0';
}

static void sample(sbuf *b, const char *name, const char *labels, double v) {
  char nb[32];
  addf(b, "%s%s%s%s %s\n", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "",
       num(nb, sizeof nb, v));
}

static void sample_u(sbuf *b, const char *name, const char *labels, uint64_t v) {
  addf(b, "%s%s%s%s %llu\n", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "",
       (unsigned long long)v);
}

/* ---- the process ---- */

static void proc_metrics(sbuf *b, const megad_proc_stats *p) {
  struct {
    const char *name, *type, *help;
    double v;
  } f[] = {
      {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
       p->cpu_seconds},
      {"process_start_time_seconds", "gauge",
       "Start time of the process since unix epoch in seconds.", p->start_time_seconds},
      {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
       p->resident_bytes},
      {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", p->virtual_bytes},
      {"process_open_fds", "gauge", "Number of open file descriptors.", p->open_fds},
      {"process_max_fds", "gauge", "Maximum number of open file descriptors.", p->max_fds},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    if (f[i].v < 0) continue; /* the system did not say */
    family(b, f[i].name, f[i].type, f[i].help);
    sample(b, f[i].name, NULL, f[i].v);
  }
}

/* ---- the node ---- */

static const char *const event_kinds[MEGAD_METRICS_EVENT_KINDS] = {
    "unspecified", "submitted", "placed",    "started", "checkpoint", "rank_failed", "node_lost",
    "restarting",  "rescaled",  "succeeded", "failed",  "cancelled",  "info", "stopped"};

int megad_metrics_http_slot(unsigned status) {
  return status == 200 ? 0 : status == 401 ? 1 : status == 404 ? 2 : 3;
}

/* One family with one label over a fixed list of values. */
static void by_label(sbuf *b, const char *name, const char *type, const char *help,
                     const char *key, const char *const *values, const uint64_t *counts,
                     size_t n) {
  family(b, name, type, help);
  char l[320];
  for (size_t i = 0; i < n; i++) {
    snprintf(l, sizeof l, "%s=\"%s\"", key, values[i]);
    sample_u(b, name, l, counts[i]);
  }
}

static void node_metrics(sbuf *b, const megad_metrics *m) {
  const megad_counters *c = &m->c;
  char l[320];
  family(b, "mega_build_info", "gauge", "Always 1; the version is a label.");
  label(l, sizeof l, m->version ? m->version : "");
  addf(b, "mega_build_info{version=\"%s\"} 1\n", l);

  static const mega_job_state states[] = {MEGA_JOB_PENDING,   MEGA_JOB_RUNNING,
                                          MEGA_JOB_RESTARTING, MEGA_JOB_SUCCEEDED,
                                          MEGA_JOB_FAILED,    MEGA_JOB_CANCELLED,
                                          MEGA_JOB_STOPPED};
  enum { NSTATES = sizeof states / sizeof states[0] };
  const char *names[NSTATES];
  uint64_t now[NSTATES] = {0};
  for (size_t s = 0; s < NSTATES; s++) {
    names[s] = mega_job_state_name(states[s]);
    for (size_t i = 0; i < m->njobs; i++) now[s] += m->jobs[i]->state == states[s];
  }
  by_label(b, "mega_jobs", "gauge", "Jobs this megad coordinates now, by state.", "state", names,
           now, NSTATES);
  static const char *const fin[4] = {"succeeded", "failed", "cancelled", "stopped"};
  by_label(b, "mega_jobs_finished_total", "counter", "Jobs that ended, by final state.", "state",
           fin, c->jobs_finished, 4);
  by_label(b, "mega_job_events_total", "counter", "Job events, by kind.", "kind", event_kinds + 1,
           c->job_events + 1, MEGAD_METRICS_EVENT_KINDS - 1);
  static const char *const codes[4] = {"200", "401", "404", "other"};
  by_label(b, "mega_http_requests_total", "counter", "HTTP requests answered, by status code.",
           "code", codes, c->http_requests, 4);

  const struct {
    const char *name, *type, *help;
    uint64_t v;
  } one[] = {
      {"mega_node_slots", "gauge", "Worker slots of this node.", m->slots},
      {"mega_node_slots_used", "gauge", "Slots running workers now.", m->slots_used},
      {"mega_web_streams", "gauge", "The web view's live update streams open now.",
       m->web_streams},
      {"mega_jobs_submitted_total", "counter", "Jobs submitted to this megad.", c->jobs_submitted},
      {"mega_job_restarts_total", "counter",
       "Jobs sent back to RESTARTING: a failed attempt, a megad restart or a resume.",
       c->job_events[7]},
      {"mega_steps_merged_total", "counter",
       "Training steps this coordinator merged from every rank.", c->steps_merged},
      {"mega_worker_steps_relayed_total", "counter",
       "Step reports of this node's workers passed on to their coordinator.", c->steps_relayed},
      {"mega_watchers_dropped_total", "counter",
       "WatchJob streams dropped for falling too far behind.", c->watchers_dropped},
      {"mega_watch_steps_missed_total", "counter",
       "Steps slow watchers skipped, each told by a gap marker in its stream.",
       c->watch_steps_missed},
  };
  for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
    family(b, one[i].name, one[i].type, one[i].help);
    sample_u(b, one[i].name, NULL, one[i].v);
  }

  family(b, "mega_step_report_delay_seconds", "summary",
         "From the slowest rank's step end to this coordinator's merge, every job.");
  sample(b, "mega_step_report_delay_seconds_sum", NULL, c->report_delay_sum_s);
  sample_u(b, "mega_step_report_delay_seconds_count", NULL, c->report_delay_n);
  family(b, "mega_rpc_served_total", "counter", "gRPC calls handed to a handler, by method.");
  for (size_t i = 0; i < m->nrpcs; i++) {
    char meth[256];
    label(meth, sizeof meth, m->rpcs[i].method);
    snprintf(l, sizeof l, "method=\"%s\"", meth);
    sample_u(b, "mega_rpc_served_total", l, m->rpcs[i].served);
  }
}

/* ---- the running jobs ---- */

static bool listed(const mega_job *j) {
  return j->state == MEGA_JOB_RUNNING || j->state == MEGA_JOB_RESTARTING;
}

typedef struct shown {
  const mega_job *j;
  char id[160];
} shown;

static void job_metrics(sbuf *b, const shown *v, size_t n, size_t unlisted) {
  family(b, "mega_jobs_unlisted", "gauge",
         "Running jobs left out of the per-job series (bounded cardinality).");
  sample_u(b, "mega_jobs_unlisted", NULL, unlisted);
  char l[320];
  family(b, "mega_job_iteration", "gauge", "The last iteration every rank of the job finished.");
  for (size_t i = 0; i < n; i++) {
    snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
    sample_u(b, "mega_job_iteration", l, v[i].j->last_iteration);
  }
  family(b, "mega_job_train_iterations", "gauge", "Iterations the job trains for.");
  for (size_t i = 0; i < n; i++) {
    snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
    sample_u(b, "mega_job_train_iterations", l, v[i].j->train_iters);
  }
  family(b, "mega_job_attempt", "gauge", "The job's current attempt (0: the first, one more per restart or rescale).");
  for (size_t i = 0; i < n; i++) {
    snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
    sample_u(b, "mega_job_attempt", l, v[i].j->attempt);
  }
  family(b, "mega_job_loss", "gauge", "Training loss of the job's last merged step.");
  for (size_t i = 0; i < n; i++)
    if (v[i].j->hist.last_step && !v[i].j->hist.last_step->no_loss) {
      snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
      sample(b, "mega_job_loss", l, v[i].j->hist.last_step->loss);
    }
  family(b, "mega_job_tokens_per_second", "gauge", "Global tokens per second, last step.");
  for (size_t i = 0; i < n; i++)
    if (v[i].j->hist.last_step) {
      snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
      sample(b, "mega_job_tokens_per_second", l, v[i].j->hist.last_step->tokens_per_s);
    }
  /* for a staleness alert, time() - this > N: the last step's figures stay
   * while a job restarts or hangs, so they alone would not fire */
  family(b, "mega_job_last_step_timestamp_seconds", "gauge",
         "When the coordinator merged the job's last step, in seconds since the epoch.");
  for (size_t i = 0; i < n; i++)
    if (v[i].j->hist.last_step && v[i].j->hist.last_step->time_unix_ms > 0) {
      snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
      sample(b, "mega_job_last_step_timestamp_seconds", l,
             (double)v[i].j->hist.last_step->time_unix_ms / 1e3);
    }
  /* the fractions megactl watch and the web view show (proto/step_bubble.h) */
  family(b, "mega_job_bubble_ratio", "gauge",
         "Pipeline bubble over step time, mean over ranks, last step.");
  for (size_t i = 0; i < n; i++) {
    const Mega__V1__StepMetrics *s = v[i].j->hist.last_step;
    if (!s) continue;
    snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
    sample(b, "mega_job_bubble_ratio", l, mega_step_bubble(s));
  }
  /* per stage, not per rank: a stage's ranks (TP x DP) are averaged, so the
   * series stay as few as the pipeline is deep */
  family(b, "mega_job_stage_bubble_ratio", "gauge",
         "One pipeline stage's bubble over step time, mean over its ranks, last step.");
  for (size_t i = 0; i < n; i++) {
    const Mega__V1__StepMetrics *s = v[i].j->hist.last_step;
    if (!s) continue;
    mega_stage_bubble st[MEGAD_METRICS_STAGES_MAX];
    int stages = mega_step_stage_bubbles(s, st, MEGAD_METRICS_STAGES_MAX);
    for (int p = 0; p < stages; p++)
      if (st[p].ranks) {
        snprintf(l, sizeof l, "job=\"%s\",stage=\"%d\"", v[i].id, p);
        sample(b, "mega_job_stage_bubble_ratio", l, st[p].bubble);
      }
  }
  family(b, "mega_job_step_report_delay_seconds", "summary",
         "From the slowest rank's step end to the coordinator's merge.");
  for (size_t i = 0; i < n; i++) {
    const mega_job *j = v[i].j;
    if (!j->coord.report_delay_n) continue;
    snprintf(l, sizeof l, "job=\"%s\"", v[i].id);
    sample(b, "mega_job_step_report_delay_seconds_sum", l, j->coord.report_delay_sum_s);
    sample_u(b, "mega_job_step_report_delay_seconds_count", l, j->coord.report_delay_n);
  }
}

char *megad_metrics_render(const megad_metrics *m, size_t *len) {
  sbuf b = {0};
  proc_metrics(&b, &m->proc);
  node_metrics(&b, m);
  shown *v = calloc(MEGAD_METRICS_JOBS_MAX, sizeof *v);
  if (!v) {
    free(b.p);
    return NULL;
  }
  size_t n = 0, unlisted = 0;
  for (size_t i = 0; i < m->njobs; i++) {
    if (!listed(m->jobs[i])) continue;
    if (n == MEGAD_METRICS_JOBS_MAX) {
      unlisted++;
      continue;
    }
    v[n].j = m->jobs[i];
    label(v[n].id, sizeof v[n].id, m->jobs[i]->id);
    n++;
  }
  job_metrics(&b, v, n, unlisted);
  free(v);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  if (len) *len = b.len;
  return b.p;
}
