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
   * them, on track world + r. */
  size_t spans = 0;
  for (uint32_t r = 0; r < done->world; r++) {
    const Mega__V1__StepReport *rep = done->reports[r];
    const Mega__V1__RankMetrics *m = rep->metrics;
    char name[96];
    snprintf(name, sizeof name, "rank %u (pp %u, dp %u, tp %u)", r, m ? m->pp_rank : 0,
             m ? m->dp_rank : 0, m ? m->tp_rank : 0);
    mega_trace_track(t, (int)r, name);
    double off = rep->step_start_unix_us && t0 ? (double)(rep->step_start_unix_us - t0) : 0;
    bool comm = false;
    for (size_t i = 0; i < rep->n_spans; i++, spans++) {
      bool c = mega_trace_cat_is_comm(rep->spans[i]->cat);
      comm |= c;
      mega_trace_span(t, (int)(c ? done->world + r : r), rep->spans[i]->name,
                      rep->spans[i]->cat, rep->spans[i]->start_us + off, rep->spans[i]->dur_us);
    }
    if (comm) {
      snprintf(name, sizeof name, "rank %u comm (gradient reductions)", r);
      mega_trace_track(t, (int)(done->world + r), name);
    }
  }
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
