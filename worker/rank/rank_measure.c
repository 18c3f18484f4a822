/* Where an iteration's gradient reductions fell (seed 003): each bucket's
 * times, and those of the tied embedding's point-to-point exchange
 * (grads_tied.c), against the step, for the JSON and the trace; and the
 * CPU the rank's threads got, which on a machine with fewer cores than
 * ranks is part of the answer. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "worker/rank/rank_internal.h"

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rank_thread_clock(double *cpu, double *runq, double *process_cpu) {
  *process_cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  *cpu = clock_s(CLOCK_THREAD_CPUTIME_ID);
  *runq = -1;
  /* schedstat: time on a CPU, time runnable on a run queue (ns), slices */
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  unsigned long long on, wait;
  if (n <= 0) return;
  buf[n] = '\0';
  if (sscanf(buf, "%llu %llu", &on, &wait) == 2) *runq = 1e-9 * (double)wait;
}

/* A wall time as seconds from t0; -1 for unknown (0). */
static double rel(double t, double t0) { return t > 0 ? t - t0 : -1; }

static void add_span(mega_rank *r, const char *name, const char *cat, double a, double b) {
  if (a < 0 || b <= a || r->nspans >= r->span_cap) return;
  mega_rank_span *sp = &r->spans[r->nspans++];
  snprintf(sp->name, sizeof sp->name, "%s", name);
  sp->cat = cat;
  sp->start_us = a * 1e6;
  sp->dur_us = (b - a) * 1e6;
}

/* A reduction's spans on the rank's communicator track: queued behind the
 * collectives before it, then running. */
static void add_spans(mega_rank *r, const mega_rank_reduction *x) {
  char name[24];
  if (x->bucket < 0) snprintf(name, sizeof name, "embd exchange");
  else snprintf(name, sizeof name, "bucket %d%s", x->bucket, x->tied ? " (wte)" : "");
  add_span(r, name, "reduce_queue", x->launched_s, x->started_s);
  add_span(r, name, "reduce", x->started_s, x->done_s);
}

mega_status rank_collect_reductions(mega_rank *r, double t0, bool trace, mega_err *err) {
  const mega_grads *g = r->chunks.grads;
  size_t nb = (size_t)mega_grads_num_buckets(g);
  if (!r->reductions) {
    r->reductions = calloc(nb + 1, sizeof *r->reductions);
    if (!r->reductions) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for measurements");
  }
  r->nreductions = 0;
  for (size_t b = 0; b < nb; b++) {
    const mega_grads_timing *t = mega_grads_timing_of(g, (int)b);
    const mega_grads_bucket *k = mega_grads_bucket_at(g, (int)b);
    if (!t->launched || !r->dcomm[GROUP_DP]) continue; /* no reduction at DP 1 */
    r->reductions[r->nreductions++] = (mega_rank_reduction){
        .bucket = (int)b, .chunk = k->chunk, .tied = k->tied, .floats = k->numel,
        .launched_s = rel(t->launched, t0), .started_s = rel(t->started, t0),
        .done_s = rel(t->done, t0), .waited_s = rel(t->waited, t0), .cpu_s = t->cpu_s,
        .runq_s = t->runq_s};
  }
  /* bucket -1: the tied embedding's exchange (grads.h): on the embedding
   * stage the copy's receive, posted at the start, queued until its wte
   * bucket needs it; on the loss stage from the copy's send to the total's
   * arrival */
  size_t floats;
  const mega_grads_timing *t = mega_grads_tied_timing(g, &floats);
  if (t->launched > 0)
    r->reductions[r->nreductions++] = (mega_rank_reduction){
        .bucket = -1, .tied = true, .floats = floats, .launched_s = rel(t->launched, t0),
        .started_s = rel(t->started, t0), .done_s = rel(t->done, t0),
        .waited_s = rel(t->waited, t0), .cpu_s = t->cpu_s, .runq_s = t->runq_s};
  for (size_t i = 0; trace && i < r->nreductions; i++) add_spans(r, &r->reductions[i]);
  return MEGA_OK;
}
