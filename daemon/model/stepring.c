/* A job's step curve (see stepring.h). */
#include "daemon/model/stepring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/step_bubble.h"

/* The next curve's epoch, less one (megad runs one loop thread: the web
 * view's curves are made on it only). */
static uint32_t next_epoch;

void mega_stepring_seed(uint32_t seed) { next_epoch = seed; }

void mega_stepring_free(mega_stepring *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}

/* A point that starts an attempt is marked on the curve, so thinning always
 * keeps it (there are few); one with an eval loss is kept while that still
 * frees enough room. */
static bool pinned(const mega_stepring *r, size_t i, bool evals) {
  return (evals && r->v[i].has_eval) || (i > 0 && r->v[i].attempt != r->v[i - 1].attempt);
}

/* Drops every second point of the older half: each thinning halves the
 * density of what is already old, so the curve keeps its shape at every age. */
static void thin(mega_stepring *r) {
  size_t half = r->n / 2;
  for (int pass = 0; pass < 2; pass++) {
    bool evals = pass == 0;
    size_t o = 0;
    for (size_t i = 0; i < half; i++)
      if (i % 2 == 0 || pinned(r, i, evals)) o++;
    if (evals && half - o < r->n / 8) continue; /* the evals leave too little room */
    /* in place: a kept point is never written over before it is read */
    o = 0;
    for (size_t i = 0; i < half; i++) {
      bool keep = i % 2 == 0 || pinned(r, i, evals);
      if (keep) r->v[o++] = r->v[i];
    }
    memmove(r->v + o, r->v + half, (r->n - half) * sizeof *r->v);
    r->thinned += half - o;
    r->n -= half - o;
    return;
  }
}

static void point_of(mega_steppoint *p, const Mega__V1__StepMetrics *s) {
  memset(p, 0, sizeof *p);
  p->iteration = s->iteration;
  p->time_ms = s->time_unix_ms;
  p->loss = s->no_loss ? NAN : s->loss; /* drawn as a gap, as a diverged one */
  p->has_eval = s->has_eval_loss;
  p->eval_loss = s->eval_loss;
  p->grad_norm = s->grad_norm;
  p->lr = s->lr;
  p->tokens_per_s = s->tokens_per_s;
  p->step_time_s = s->step_time_s;
  p->attempt = s->attempt;
  p->world = mega_step_world(s);
  p->skipped = s->skipped;
  for (size_t i = 0; i < s->n_ranks; i++)
    if (s->ranks[i]->grad_sync_exposed_s > p->grad_sync_s)
      p->grad_sync_s = s->ranks[i]->grad_sync_exposed_s;
  p->bubble = mega_step_bubble(s);
}

mega_status mega_stepring_push(mega_stepring *r, const Mega__V1__StepMetrics *step, mega_err *err) {
  if (r->n == MEGA_STEPRING_CAP) thin(r);
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 64;
    if (cap > MEGA_STEPRING_CAP) cap = MEGA_STEPRING_CAP;
    mega_steppoint *v = realloc(r->v, cap * sizeof *v);
    if (!v) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory keeping the step curve");
    r->v = v;
    r->cap = cap;
  }
  if (!r->base) r->seq = r->base = (uint64_t)(next_epoch++ % MEGA_STEPRING_EPOCHS + 1) << 32;
  mega_steppoint *p = &r->v[r->n];
  point_of(p, step);
  p->seq = ++r->seq;
  const mega_steppoint *prev = r->n ? &r->v[r->n - 1] : NULL;
  if (prev && prev->attempt != p->attempt) {
    if (r->nmarks == MEGA_STEPRING_MARKS) {
      memmove(r->marks, r->marks + 1, (MEGA_STEPRING_MARKS - 1) * sizeof *r->marks);
      r->nmarks--;
    }
    r->marks[r->nmarks++] = (mega_stepmark){.seq = p->seq, .iteration = p->iteration,
                                            .attempt = p->attempt, .world = p->world,
                                            .prev_world = prev->world};
  }
  r->n++;
  return MEGA_OK;
}

size_t mega_stepring_after(const mega_stepring *r, uint64_t since) {
  size_t lo = 0, hi = r->n; /* seq increases along v */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->v[mid].seq <= since) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

bool mega_stepring_knows(const mega_stepring *r, uint64_t cursor) {
  return !cursor || (r->base && cursor >= r->base && cursor <= r->seq);
}
