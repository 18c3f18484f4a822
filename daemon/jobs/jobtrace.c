/* The Chrome trace of --trace-iteration (see jobtrace.h). */
#include "daemon/jobs/jobtrace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/trace.h"

#define TRACE_CHUNK (1u << 20)
#define COMM_LANES 8 /* tracks per rank's communicator; more spans go on the last */

/* A rank's communicator spans overlap one another: a bucket waits in the
 * queue while another reduces, and the embedding's exchange spans both. A
 * trace viewer draws one track as a stack of spans that nest, and drops or
 * misdraws one that overlaps another partly, so each span goes on the first
 * of the rank's comm tracks where it nests: after what ended before it
 * starts, inside what is open there. */
typedef struct comm_lanes {
  double open[COMM_LANES][16]; /* each lane's open spans' ends, innermost last */
  int nopen[COMM_LANES];
  int used;
} comm_lanes;

static int comm_lane(comm_lanes *l, double start, double end) {
  for (int k = 0; k < COMM_LANES; k++) {
    while (l->nopen[k] && l->open[k][l->nopen[k] - 1] <= start) l->nopen[k]--;
    int n = l->nopen[k];
    if ((n && end > l->open[k][n - 1]) || n == 16) continue;
    l->open[k][l->nopen[k]++] = end;
    if (k + 1 > l->used) l->used = k + 1;
    return k;
  }
  if (l->used < COMM_LANES) l->used = COMM_LANES;
  return COMM_LANES - 1;
}

/* A rank's spans by start, the longer first at one start (it holds the
 * other): the order comm_lane needs, and the one a viewer reads nesting
 * from (a grad-sync span starts with the GW inside it). */
typedef struct comm_span {
  const Mega__V1__ActionSpan *s;
} comm_span;

static int by_start(const void *a, const void *b) {
  const Mega__V1__ActionSpan *x = ((const comm_span *)a)->s, *y = ((const comm_span *)b)->s;
  if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
  return (x->dur_us < y->dur_us) - (x->dur_us > y->dur_us);
}

static char *trace_path(const megad_base *b, const char *job_id) {
  char *p = NULL;
  if (asprintf(&p, "%s/jobs/%s/trace.json", b->state_dir, job_id) < 0) return NULL;
  return p;
}

mega_status megad_trace_write(megad_base *b, const mega_job *j, const mega_step_done *done,
                              char **path, mega_err *err) {
  *path = NULL;
  char title[256];
  snprintf(title, sizeof title, "job %s%s%s, iteration %llu", j->id, j->name[0] ? " " : "", j->name,
           (unsigned long long)done->step->iteration);
  mega_trace *t = mega_trace_new(title);
  if (!t) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  /* Ranks start the iteration at slightly different times: keep that skew. */
  int64_t t0 = 0;
  for (uint32_t r = 0; r < done->world; r++) {
    int64_t s = done->reports[r]->step_start_unix_us;
    if (s && (!t0 || s < t0)) t0 = s;
  }
  /* Rank r's actions on track r; its communicator's spans, which overlap
   * them, on track world + r, and those that overlap these partly on
   * 2 world + r, 3 world + r, ... (comm_lane). */
  size_t spans = 0;
  comm_span *cs = NULL;
  for (uint32_t r = 0; r < done->world; r++) {
    const Mega__V1__StepReport *rep = done->reports[r];
    const Mega__V1__RankMetrics *m = rep->metrics;
    char name[96];
    snprintf(name, sizeof name, "rank %u (pp %u, dp %u, tp %u)", r, m ? m->pp_rank : 0,
             m ? m->dp_rank : 0, m ? m->tp_rank : 0);
    mega_trace_track(t, (int)r, name);
    double off = rep->step_start_unix_us && t0 ? (double)(rep->step_start_unix_us - t0) : 0;
    comm_span *grown = realloc(cs, (rep->n_spans ? rep->n_spans : 1) * sizeof *cs);
    if (!grown) {
      free(cs);
      mega_trace_free(t);
      return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    }
    cs = grown;
    for (size_t i = 0; i < rep->n_spans; i++, spans++) cs[i].s = rep->spans[i];
    qsort(cs, rep->n_spans, sizeof *cs, by_start);
    comm_lanes lanes = {0};
    for (size_t i = 0; i < rep->n_spans; i++) {
      const Mega__V1__ActionSpan *s = cs[i].s;
      double dur = s->dur_us > 0 ? s->dur_us : 0;
      if (!mega_trace_cat_is_comm(s->cat)) {
        mega_trace_span(t, (int)r, s->name, s->cat, s->start_us + off, s->dur_us);
        continue;
      }
      int k = comm_lane(&lanes, s->start_us, s->start_us + dur);
      mega_trace_span(t, (int)(done->world * (uint32_t)(k + 1) + r), s->name, s->cat,
                      s->start_us + off, dur);
    }
    for (int k = 0; k < lanes.used; k++) {
      if (k) snprintf(name, sizeof name, "rank %u comm (gradient reductions, %d)", r, k + 1);
      else snprintf(name, sizeof name, "rank %u comm (gradient reductions)", r);
      mega_trace_track(t, (int)(done->world * (uint32_t)(k + 1) + r), name);
    }
  }
  free(cs);
  char *json = mega_trace_dump(t);
  mega_trace_free(t);
  if (!json) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  char *dir = megad_job_dir(b, j->id), *p = trace_path(b, j->id), *tmp = NULL;
  mega_status s = MEGA_OK;
  if (!dir || !p || asprintf(&tmp, "%s.tmp", p) < 0) {
    tmp = NULL;
    s = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  } else {
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(json, f) >= 0;
    if (f && fclose(f)) ok = false;
    if (!ok || rename(tmp, p)) {
      s = mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", p, strerror(errno));
      unlink(tmp);
    }
  }
  if (s == MEGA_OK && !spans) megad_warn(b, "job %s: the ranks sent no spans to trace", j->id);
  free(json);
  free(dir);
  free(tmp);
  if (s == MEGA_OK) *path = p;
  else free(p);
  return s;
}

void megad_trace_send(const megad_base *b, const mega_job *j, mega_rpc_call *call) {
  char *p = trace_path(b, j->id);
  FILE *f = p ? fopen(p, "rb") : NULL;
  free(p);
  if (!f) {
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND,
                  "job %s has no trace%s: submit it with --trace-iteration K", j->id,
                  mega_job_state_final(j->state) ? "" : " yet");
    return;
  }
  struct stat st;
  uint64_t total = fstat(fileno(f), &st) == 0 ? (uint64_t)st.st_size : 0;
  uint8_t *buf = malloc(TRACE_CHUNK);
  if (!buf) {
    fclose(f);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  /* The whole file is queued now; the wrapper writes it out in order. */
  size_t n;
  bool ok = true;
  while (ok && (n = fread(buf, 1, TRACE_CHUNK, f)) > 0) {
    Mega__V1__TraceChunk c = MEGA__V1__TRACE_CHUNK__INIT;
    c.data.data = buf;
    c.data.len = n;
    c.total_bytes = total;
    ok = mega_rpc_send(call, &c.base, NULL) == MEGA_OK;
  }
  free(buf);
  fclose(f);
  mega_rpc_finish(call); /* also when the client went away meanwhile (ok false) */
}

char *megad_trace_load(const megad_base *b, const char *job_id, size_t *len) {
  char *p = trace_path(b, job_id);
  FILE *f = p ? fopen(p, "rb") : NULL;
  free(p);
  if (!f) return NULL;
  struct stat st;
  char *buf = NULL;
  if (fstat(fileno(f), &st) == 0 && (buf = malloc((size_t)st.st_size + 1))) {
    *len = fread(buf, 1, (size_t)st.st_size, f);
    buf[*len] = '\0';
    if (ferror(f)) {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  return buf;
}
