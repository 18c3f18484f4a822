/* The coordinator's queue of waiting jobs, and the retention of ended ones.
 *
 * The queue: intrusive and doubly linked, so
 * adding and removing cost O(1) (a restarting job walks to its place by age)
 * and a scheduling pass starts at the oldest waiting job instead of walking
 * every job this node ever held. */
#include "daemon/coord/coord_internal.h"

#include <stdlib.h>

#include "daemon/model/util.h"

void coord_wq_add(megad_coord *c, mega_job *j) {
  if (j->coord.wq_in) return;
  mega_job *after = c->wq_tail;
  while (after && after->created_ms > j->created_ms) after = after->coord.wq_prev;
  j->coord.wq_prev = after;
  j->coord.wq_next = after ? after->coord.wq_next : c->wq_head;
  if (j->coord.wq_next) j->coord.wq_next->coord.wq_prev = j;
  else c->wq_tail = j;
  if (after) after->coord.wq_next = j;
  else c->wq_head = j;
  j->coord.wq_in = true;
  j->coord.wq_epoch = 0;
  c->nwaiting++;
}

void coord_wq_remove(megad_coord *c, mega_job *j) {
  if (!j->coord.wq_in) return;
  if (j->coord.wq_prev) j->coord.wq_prev->coord.wq_next = j->coord.wq_next;
  else c->wq_head = j->coord.wq_next;
  if (j->coord.wq_next) j->coord.wq_next->coord.wq_prev = j->coord.wq_prev;
  else c->wq_tail = j->coord.wq_prev;
  j->coord.wq_prev = j->coord.wq_next = NULL;
  j->coord.wq_in = false;
  c->nwaiting--;
}

typedef struct retain_ctx {
  /* the count: ended jobs that ended before threshold_ms, and ties_left of
   * those that ended at it (the longest ended go first) */
  bool by_count;
  int64_t threshold_ms;
  size_t ties_left;
  int64_t cutoff_ms; /* ended before this: too old */
} retain_ctx;

/* Called for ended jobs only, in submission order. */
static bool too_many_or_old(const mega_job *j, void *arg) {
  retain_ctx *r = arg;
  bool surplus = false;
  if (r->by_count && j->ended_ms < r->threshold_ms) {
    surplus = true;
  } else if (r->by_count && j->ended_ms == r->threshold_ms && r->ties_left) {
    r->ties_left--;
    surplus = true;
  }
  return surplus || (r->cutoff_ms && j->ended_ms > 0 && j->ended_ms < r->cutoff_ms);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Keeps the retain_jobs ended most recently: finds the end time below
 * which (and how many at which) the rest go. */
static bool count_threshold(megad_coord *c, size_t ended, retain_ctx *r) {
  size_t drop = ended - c->o.retain_jobs;
  int64_t *t = malloc(ended * sizeof *t);
  if (!t) return false;
  size_t n = 0;
  for (size_t i = 0; i < c->jobs->t.n; i++)
    if (mega_job_state_final(c->jobs->t.v[i]->state)) t[n++] = c->jobs->t.v[i]->ended_ms;
  qsort(t, n, sizeof *t, cmp_i64);
  r->by_count = true;
  r->threshold_ms = t[drop - 1];
  size_t below = 0;
  while (below < n && t[below] < r->threshold_ms) below++;
  r->ties_left = drop - below;
  free(t);
  return true;
}

static void forget_ended(megad_coord *c, int64_t now_ms) {
  size_t ended = 0;
  for (size_t i = 0; i < c->jobs->t.n; i++) ended += mega_job_state_final(c->jobs->t.v[i]->state);
  retain_ctx r = {.cutoff_ms = c->o.retain_ms ? now_ms - (int64_t)c->o.retain_ms : 0};
  if (c->o.retain_jobs && ended > c->o.retain_jobs && !count_threshold(c, ended, &r))
    return; /* out of memory: the next pass */
  if (!r.by_count && !r.cutoff_ms) return;
  size_t n = megad_jobs_forget(c->jobs, too_many_or_old, &r);
  if (n)
    megad_log(c->b, "forgot %zu ended job%s (--retain-jobs %u, --retain-age %u s)", n,
              n == 1 ? "" : "s", c->o.retain_jobs, c->o.retain_ms / 1000);
}

void coord_retain(megad_coord *c, int64_t now_ms) {
  forget_ended(c, now_ms);
  /* the journal of a megad that runs for weeks: as bounded as the table */
  megad_jobs_tidy(c->jobs);
}
