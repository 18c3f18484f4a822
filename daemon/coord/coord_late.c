/* Steps of an attempt this node did not run, sent again by the nodes of a
 * job it took over: the dead coordinator took with it what it had merged
 * (steps are not in etcd) and what was still on its way. They go into the
 * job's history once each, in their attempt's place however late they come
 * (jobhist.h), merged from the ranks that survive: the lost
 * node's ranks never report, so an iteration is merged from what came once
 * no more has come for LATE_QUIET_MS. */
#include <stdlib.h>
#include <string.h>

#include "daemon/coord/coord_internal.h"
#include "daemon/model/stepmerge.h"
#include "daemon/model/util.h"

#define LATE_QUIET_MS 300
#define LATE_WORLD_MAX 65536

struct coord_late {
  coord_late *next;
  char *job_id;
  uint32_t attempt;
  mega_stepmerge *m;
  uint64_t last_ms; /* uv_now of the last report */
};

/* Whether j's history holds attempt's iteration already. */
static bool in_history(const mega_job *j, uint32_t attempt, uint64_t iteration) {
  for (size_t i = 0; i < j->hist.len; i++) {
    const Mega__V1__WatchJobResponse *it = mega_job_hist_at(&j->hist, i);
    if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && it->step &&
        it->step->attempt == attempt && it->step->iteration == iteration)
      return true;
  }
  return false;
}

/* A merged step into the history, unless it is there or has no loss (a
 * loss of 0 in the history would be a lie). */
static void put(megad_coord *c, mega_job *j, mega_step_done *d) {
  bool loss = j->spec.simulate_compute != NULL;
  for (uint32_t r = 0; d->reports && r < d->world && !loss; r++)
    loss = d->reports[r] && d->reports[r]->has_loss;
  if (loss && !in_history(j, d->step->attempt, d->step->iteration))
    megad_job_step(c->jobs, j, d->step);
  mega_step_done_free(d);
}

static void late_free(coord_late *l) {
  mega_stepmerge_free(l->m);
  free(l->job_id);
  free(l);
}

static coord_late *late_of(megad_coord *c, const char *job_id, uint32_t attempt, uint32_t world) {
  for (coord_late *l = c->late; l; l = l->next)
    if (l->attempt == attempt && !strcmp(l->job_id, job_id)) return l;
  coord_late *l = calloc(1, sizeof *l);
  if (!l || !(l->job_id = megad_strdup(job_id)) ||
      !(l->m = mega_stepmerge_new(world, attempt, 0))) {
    if (l) free(l->job_id);
    free(l);
    return NULL;
  }
  l->attempt = attempt;
  l->next = c->late;
  c->late = l;
  return l;
}

mega_status coord_late_add(megad_coord *c, const char *job_id, uint32_t attempt, uint32_t world,
                           const char *node_id, Mega__V1__StepReport *const *r, size_t n,
                           mega_err *err) {
  mega_job *j = megad_jobs_find(c->jobs, job_id);
  if (!j || j->etcd.fenced)
    return mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "node %s does not coordinate job %s (yet): send its steps again later",
                     c->b->node_id, job_id);
  if (attempt > j->attempt || !world || world > LATE_WORLD_MAX)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "steps of attempt %u of job %s (world %u) sent again by node %s, but the "
                     "job is at attempt %u: they belong to no attempt it had", attempt, job_id,
                     world, node_id, j->attempt);
  coord_late *l = late_of(c, job_id, attempt, world);
  if (!l) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging steps sent again");
  megad_log(c->b, "job %s: node %s sent again %zu step report%s of attempt %u", job_id, node_id,
            n, n == 1 ? "" : "s", attempt);
  l->last_ms = uv_now(c->b->loop);
  for (size_t i = 0; i < n; i++) {
    if (!r[i]->metrics || in_history(j, attempt, r[i]->iteration)) continue;
    mega_step_done *d = NULL;
    /* a report it has already (sent twice) is refused, and changes nothing */
    if (mega_stepmerge_add(l->m, r[i]->metrics->rank, r[i], &d, NULL) == MEGA_OK && d)
      put(c, j, d);
  }
  return MEGA_OK;
}

/* Merges what came of j's late attempts (all jobs': j NULL) now, or (quiet)
 * those that heard nothing for LATE_QUIET_MS. */
static void flush(megad_coord *c, const mega_job *only, bool quiet) {
  uint64_t now = uv_now(c->b->loop);
  for (coord_late **p = &c->late; *p;) {
    coord_late *l = *p;
    if ((only && strcmp(l->job_id, only->id)) || (quiet && now < l->last_ms + LATE_QUIET_MS)) {
      p = &l->next;
      continue;
    }
    mega_job *j = megad_jobs_find(c->jobs, l->job_id);
    mega_step_done *d = NULL;
    while (mega_stepmerge_flush(l->m, UINT64_MAX, &d, NULL) == MEGA_OK && d) {
      if (j) put(c, j, d);
      else mega_step_done_free(d);
      d = NULL;
    }
    *p = l->next;
    late_free(l);
  }
}

void coord_late_tick(megad_coord *c) { flush(c, NULL, true); }

void coord_late_flush(megad_coord *c, const mega_job *j) {
  if (c->late) flush(c, j, false);
}

void coord_late_free(megad_coord *c) {
  for (coord_late *l = c->late, *next; l; l = next) {
    next = l->next;
    late_free(l);
  }
  c->late = NULL;
}
