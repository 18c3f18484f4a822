/* The end of an attempt: what its ranks left behind (the states they hold
 * and the plan that hands them to the next attempt), why it stopped, the
 * iterations the survivors completed that no report brought in, and the
 * job handed back to the coordinator, which decides what follows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/jobs/jobtrace.h"
#include "daemon/model/replicas.h"
#include "daemon/model/util.h"

#define EV(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

void coord_release_donors(megad_coord *c, mega_job *j, const char *why) {
  for (size_t i = 0; i < j->coord.ndonors; i++) {
    coord_abort_attempt(c, j, j->coord.donors[i], j->coord.donors_attempt, false, false, why);
    free(j->coord.donors[i]);
  }
  free(j->coord.donors);
  j->coord.donors = NULL;
  j->coord.ndonors = 0;
  mega_replicas_plan_free(j->coord.replicas);
  j->coord.replicas = NULL;
}

/* Notes the nodes of j's attempt: ranks there may hold state, and wait for
 * a release (every node of the attempt, so a rank that held too late for
 * the plan goes too). */
static void note_donors(mega_job *j) {
  j->coord.donors = calloc(j->nplaced + 1, sizeof *j->coord.donors);
  j->coord.donors_attempt = j->attempt;
  for (size_t r = 0; j->coord.donors && r < j->nplaced; r++)
    j->coord.donors[j->coord.ndonors++] = megad_strdup(j->placement[r].node_id);
}

void coord_plan_replicas(megad_coord *c, mega_job *j, const mega_replica_donor *d, size_t n,
                         uint64_t floor) {
  free(j->coord.replicas_why);
  j->coord.replicas_why = NULL;
  note_donors(j);
  char why[MEGA_ERR_MSG_MAX + 64] = "";
  /* each donor's build, as the view has its node */
  mega_replica_donor *dv = calloc(n ? n : 1, sizeof *dv);
  for (size_t i = 0; dv && i < n; i++) {
    const megad_node *nd = megad_members_find(c->members, d[i].node_id);
    dv[i] = d[i];
    dv[i].version = nd ? nd->version : NULL;
  }
  mega_replicas_in in = {.attempt = j->attempt, .tp = j->tp, .pp = j->pp, .dp = j->dp,
                         .distributed = j->spec.use_distributed_optimizer, .donors = dv,
                         .ndonors = n, .ckpt_iteration = j->spec.save ? j->ckpt_iteration : 0,
                         .floor = floor, .version = mega_version()};
  mega_err e = {0};
  Mega__V1__ReplicaPlan *p = NULL;
  if (j->spec.no_replica_recovery) snprintf(why, sizeof why, "--no-replica-recovery");
  else if (!dv) snprintf(why, sizeof why, "megad ran out of memory");
  else if (mega_replicas_plan(&in, &p, why, sizeof why, &e) != MEGA_OK)
    snprintf(why, sizeof why, "%s", e.msg);
  free(dv);
  if (!p) {
    j->coord.replicas_why = megad_strdup(why);
    coord_release_donors(c, j, "the next attempt does not take its state from replicas");
    return;
  }
  j->coord.replicas = p;
  j->coord.replicas_ms = megad_unix_ms();
  j->coord.replicas_redone =
      j->last_iteration > p->iteration ? j->last_iteration - p->iteration : 0;
}

/* At an attempt's end: where the next one takes its state from. */
static void plan_replicas(coord_run *run) {
  mega_replica_donor *d = calloc(run->world + 1, sizeof *d);
  size_t n = 0;
  for (uint32_t r = 0; d && r < run->world; r++)
    if (run->held[r])
      d[n++] = (mega_replica_donor){.rank = r, .node_id = run->held_node[r], .held = run->held[r]};
  if (d) {
    coord_plan_replicas(run->c, run->job, d, n, run->plan ? run->plan->iteration : 0);
  } else {
    free(run->job->coord.replicas_why);
    run->job->coord.replicas_why = megad_strdup("megad ran out of memory");
  }
  free(d);
}

/* An attempt that was to take its state from replicas ended before every
 * rank had it: its donors still hold it (they are released only once
 * fetched from), and the next attempt takes the same plan, unless the
 * end may have been the fetch's own failure (a rank's, not a refused
 * launch, a lost node or a stop of the coordinator's) or a donor's node is
 * gone. Then true, and the plan is j's again. */
static bool keep_plan(coord_run *run, mega_end_kind kind) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  if (!run->plan || run->nrecovered == run->world || !j->coord.ndonors ||
      j->coord.donors_attempt != run->plan->attempt)
    return false;
  if (kind != MEGA_END_LAUNCH && kind != MEGA_END_NODE_LOST && kind != MEGA_END_COORDINATOR &&
      kind != MEGA_END_RESCALE)
    return false;
  for (size_t i = 0; i < run->plan->n_sources; i++) {
    const megad_node *n = megad_members_find(c->members, run->plan->sources[i]->node_id);
    if (!n || n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
        n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
      return false;
  }
  free(j->coord.replicas_why);
  j->coord.replicas_why = NULL;
  mega_replicas_plan_free(j->coord.replicas);
  j->coord.replicas = run->plan;
  j->coord.replicas_redone = run->plan_redone;
  run->plan = NULL;
  /* what this attempt's ranks may hold is not wanted */
  coord_abort_nodes(run, "the attempt ended before its ranks had their state", false);
  return true;
}

/* Why the job stopped early, and where it goes on from: this megad's own
 * SIGTERM when it had one (the whole story), else the ranks' reason. */
static void stopped_why(const coord_run *run, char *buf, size_t len) {
  const mega_job *j = run->job;
  bool by_flag = !strncmp(run->stopped, "--exit-interval", 15) ||
                 !strncmp(run->stopped, "--exit-duration", 15);
  const char *why = run->c->saving_reason && !by_flag ? run->c->saving_reason : run->stopped;
  if (j->spec.save && j->ckpt_iteration == run->stopped_iteration && run->c->o.one_job)
    snprintf(buf, len, "stopped after iteration %llu: %s; the checkpoint of iteration %llu is "
             "committed: a run with --load %s goes on from it",
             (unsigned long long)run->stopped_iteration, why,
             (unsigned long long)j->ckpt_iteration, j->spec.save);
  else if (j->spec.save && j->ckpt_iteration == run->stopped_iteration)
    snprintf(buf, len, "stopped after iteration %llu: %s; the checkpoint of iteration %llu is "
             "committed: megactl resume %s, or a new job with --load %s, goes on from it",
             (unsigned long long)run->stopped_iteration, why,
             (unsigned long long)j->ckpt_iteration, j->id, j->spec.save);
  else if (j->spec.save && j->ckpt_iteration)
    snprintf(buf, len, "stopped after iteration %llu: %s; its checkpoint was not committed: "
             "resuming goes on from iteration %llu", (unsigned long long)run->stopped_iteration,
             why, (unsigned long long)j->ckpt_iteration);
  else
    snprintf(buf, len, "stopped after iteration %llu: %s; %s",
             (unsigned long long)run->stopped_iteration, why,
             j->spec.save ? "no checkpoint was committed"
                          : "the job saves no checkpoints (no --save): nothing to resume from");
}

/* Whether a flushed step has its loss: the last stage's reports may have
 * died with a node while an earlier stage's came. */
static bool flushed_loss(const mega_step_done *d) {
  for (uint32_t r = 0; d->reports && r < d->world; r++)
    if (d->reports[r] && d->reports[r]->has_loss) return true;
  return false;
}

void coord_run_finish(coord_run *run) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  mega_end_kind kind = run->stopping ? run->end_kind : run->cause ? run->cause_kind : MEGA_END_DONE;
  /* the ranks agreed to stop after a committed checkpoint; a node whose
   * megad stopped too (the same SIGTERM) before its rank's exit came in
   * takes nothing from the job */
  if (kind == MEGA_END_NODE_LOST && run->stopped && j->spec.save &&
      j->ckpt_iteration == run->stopped_iteration)
    kind = MEGA_END_DONE;
  char why[1024];
  if (kind == MEGA_END_DONE && run->stopped) { /* every rank exited 0, stopped as asked */
    kind = MEGA_END_STOPPED;
    stopped_why(run, why, sizeof why);
    coord_set_cause(run, CAUSE_PRIMARY, kind, why);
  }
  /* the donors an attempt fetched from are done with, and its own ranks
   * may hold; an attempt that ended before it fetched leaves them held */
  bool kept = kind != MEGA_END_DONE && kind != MEGA_END_STOPPED && keep_plan(run, kind);
  /* a coordinator that stood down (etcd) plans nothing and lets nothing
   * go: the node that took the job over asks for what the ranks kept */
  if (!kept && j->coord.ndonors && !j->etcd.fenced)
    coord_release_donors(c, j, "the attempt that fetched from them ended");
  /* after a stall the other nodes no longer report: they are asked (the
   * coordinator does, attempt_over) */
  bool ask_held = !kept && !j->etcd.fenced && run->gather && kind != MEGA_END_DONE &&
                  kind != MEGA_END_STOPPED;
  if (!kept && !ask_held && !j->etcd.fenced && kind != MEGA_END_DONE && kind != MEGA_END_STOPPED)
    plan_replicas(run);
  /* iterations the survivors completed but a lost rank never reported: the
   * next attempt starts after them, so they are merged from what came */
  mega_step_done *d = NULL;
  coord_late_flush(c, j); /* earlier attempts' steps first */
  uint64_t told = j->last_iteration; /* in the history, or said to be left out */
  while (j->coord.replicas &&
         mega_stepmerge_flush(run->merge, j->coord.replicas->iteration, &d, NULL) == MEGA_OK &&
         d) {
    uint64_t it = d->step->iteration;
    if (it > j->last_iteration && (j->spec.simulate_compute || flushed_loss(d)))
      megad_job_step(c->jobs, j, d->step);
    else if (it > j->last_iteration) /* a loss of 0 in the history would be a lie */
      megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                      "iteration %llu completed, but no rank that survived reported its loss: "
                      "left out of the history", (unsigned long long)it);
    if (it > told) told = it;
    mega_step_done_free(d);
    d = NULL;
  }
  /* and those no survivor reported at all (they failed after the step,
   * gathering the updated parameters): the next attempt starts after them */
  uint64_t upto = j->coord.replicas ? j->coord.replicas->iteration : 0;
  if (upto > told + 4)
    megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                    "iterations %llu to %llu completed, but no rank that survived reported them: "
                    "left out of the history", (unsigned long long)told + 1,
                    (unsigned long long)upto);
  else
    for (uint64_t it = told + 1; it <= upto; it++)
      megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                      "iteration %llu completed, but no rank that survived reported it: left "
                      "out of the history", (unsigned long long)it);
  char prefix[sizeof run->kv_prefix + 1];
  snprintf(prefix, sizeof prefix, "%s/", run->kv_prefix);
  mega_kv_delete_prefix(c->kvs->kv, prefix);
  j->coord.run = NULL;
  if (run->prev) run->prev->next = run->next;
  else c->runs = run->next;
  if (run->next) run->next->prev = run->prev;
  coord_released(c, j);
  /* the coordinator decides what follows, answers the cancels, schedules */
  c->attempt_over(c, j, kind, run->cause, run->cancels, run->ncancels, ask_held);
  coord_run_free(run);
}
