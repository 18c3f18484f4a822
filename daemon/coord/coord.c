/* The coordinator, first half: submission, placement, attempts (their
 * launches: coord_launch.c), the end of an attempt (the recovery
 * decision), cancel, resume and rescale. coord_run.c follows a running
 * attempt. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/jobspec.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/model/replicas.h"
#include "daemon/model/util.h"

#define EV(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k
#define SCHEDULE_MS 500
#define LAUNCH_RETRY_MS 500 /* doubled per refusal in a row, up to 8 s */
/* etcd mode: a pass places on the nodes' loads read at most this long ago
 * (they are not watched; members.h) */
#define LOADS_FRESH_MS 100
/* A replica plan older than this is dropped: its ranks give up holding
 * after 120 s (megaw_assigned.c), and a restart that waited this long for
 * nodes may as well read the checkpoint. */
#define REPLICAS_FRESH_MS 60000

mega_status megad_coord_submit(megad_coord *c, const Mega__V1__JobSpec *spec, mega_job **out,
                               mega_err *err) {
  *out = NULL;
  if (c->b->stopping)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "megad on %s is shutting down", c->b->node_id);
  if (!spec) return mega_fail(err, MEGA_ERR_INVALID, "SubmitJob needs a job spec");
  mega_status rc = coord_check_msg(c, spec, err);
  if (rc != MEGA_OK) return rc;
  mega_jobspec probe;
  mega_jobspec_defaults(&probe);
  rc = mega_jobspec_parse(&probe, (int)spec->n_args, spec->args, err);
  mega_jobspec_free(&probe);
  if (rc != MEGA_OK) return rc;
  char id[128];
  mega_jobs_next_id(&c->jobs->t, c->b->node_id, id, sizeof id);
  mega_job *j;
  if ((rc = mega_job_new(id, spec, c->b->node_id, megad_unix_ms(), &j, err)) != MEGA_OK) return rc;
  j->train_iters = (uint64_t)mega_jobspec_train_iters(&j->spec);
  j->tp = (uint32_t)j->spec.tensor_model_parallel_size;
  j->pp = (uint32_t)j->spec.pipeline_model_parallel_size;
  j->vp = (uint32_t)mega_jobspec_vp(&j->spec);
  if ((rc = coord_admit(c, j, err)) != MEGA_OK || (rc = megad_jobs_add(c->jobs, j, err)) != MEGA_OK) {
    mega_job_free(j);
    return rc;
  }
  coord_wq_add(c, j);
  uint32_t lo = j->nnodes_min ? j->nnodes_min : 1, hi = j->nnodes_max > lo ? j->nnodes_max : lo,
           nproc = coord_nproc(c, j);
  char nodes[48];
  if (hi > lo) snprintf(nodes, sizeof nodes, "%u to %u nodes", lo, hi);
  else snprintf(nodes, sizeof nodes, "%u node%s", lo, lo == 1 ? "" : "s");
  char restarts[48] = "";
  if (j->max_restarts)
    snprintf(restarts, sizeof restarts, ", up to %u restart%s", j->max_restarts,
             j->max_restarts == 1 ? "" : "s");
  megad_job_event(c->jobs, j, EV(SUBMITTED), c->b->node_id, -1,
                  "submitted%s%s: %s x %u rank%s, TP %u, PP %u, %llu iterations%s",
                  j->name[0] ? " as " : "", j->name, nodes, nproc, nproc == 1 ? "" : "s", j->tp,
                  j->pp, (unsigned long long)j->train_iters, restarts);
  *out = j;
  return MEGA_OK;
}

static void on_retain_soon(uv_timer_t *t) {
  megad_coord *c = t->data;
  coord_retain(c, megad_unix_ms());
}

void megad_coord_launch_ended(megad_coord *c) {
  if (c->tick_on) uv_timer_start(&c->retain_soon, on_retain_soon, 0, 0);
}

/* Ends j (megad_job_finalize) and forgets why it waited, so a job resumed
 * later says it again. */
void coord_finalize(megad_coord *c, mega_job *j, mega_job_state state, const char *error) {
  mega_job_state before = j->state;
  coord_late_flush(c, j);
  megad_job_finalize(c->jobs, j, state, error);
  if (before == state || j->state != state) return; /* refused: nothing ended */
  coord_release_donors(c, j, "the job ended");
  free(j->coord.wait);
  j->coord.wait = NULL;
  j->coord.failed_ms = 0; /* a resume's first step is no recovery from this */
  /* --retain-jobs holds at every end, not only at the next 10 s tick (a
   * stream of short jobs once listed 36 with --retain-jobs 5); on the next
   * turn of the loop, as the caller may still use j */
  if (c->o.retain_jobs && c->tick_on) uv_timer_start(&c->retain_soon, on_retain_soon, 0, 0);
}

/* ---- starting an attempt ---- */

static void set_wait(megad_coord *c, mega_job *j, const char *why) {
  if (j->coord.wait && !strcmp(j->coord.wait, why)) return;
  free(j->coord.wait);
  j->coord.wait = strdup(why);
  megad_job_event(c->jobs, j, EV(INFO), NULL, -1, "waiting: %s", why);
}

static void describe(const mega_job *j, char *buf, size_t len) {
  size_t off = (size_t)snprintf(buf, len, "world %u = TP %u x PP %u x DP %u;", j->world, j->tp,
                                j->pp, j->dp);
  for (size_t i = 0; i < j->nplaced && off < len; i++) {
    const mega_job_node *p = &j->placement[i];
    off += (size_t)snprintf(buf + off, len - off, "%s %s %u..%u on %s", i ? "," : "",
                            p->nranks == 1 ? "rank" : "ranks", p->first_rank,
                            p->first_rank + p->nranks - 1, p->node_id);
  }
}

/* The replica plan j's next attempt may still use: one the restart waited
 * too long for is dropped (its ranks let go), and the event says so. */
static Mega__V1__ReplicaPlan *fresh_replicas(megad_coord *c, mega_job *j) {
  Mega__V1__ReplicaPlan *p = j->coord.replicas;
  if (!p || megad_unix_ms() - j->coord.replicas_ms <= REPLICAS_FRESH_MS) return p;
  char from[96];
  uint64_t it = p->iteration;
  coord_release_donors(c, j, "the restart waited too long for nodes");
  coord_resume_point(j, from, sizeof from);
  megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                  "the replicas' state of iteration %llu is no longer held (the restart waited "
                  "%.0f s for nodes); starting from %s", (unsigned long long)it,
                  (double)(megad_unix_ms() - j->coord.replicas_ms) / 1000, from);
  return NULL;
}

/* Starts j's next attempt now if the cluster has room. Returns false when j
 * must keep waiting (and the jobs behind it too, FIFO). */
static bool try_start(megad_coord *c, mega_job *j) {
  /* not while it asks what the old attempt's ranks hold; etcd: nor before
   * this node's claim on j is in etcd, nor while its lease is not known
   * alive */
  if (j->coord.gathering) return false;
  if (c->jobs->etcd && (!j->etcd.fence || !coord_may_act(c))) return false;
  mega_err e = {0};
  mega_jobspec as;
  mega_jobspec_defaults(&as);
  /* the roots again: a job from the journal was admitted under other ones */
  if (mega_recovery_attempt_spec(j, &as, &e) != MEGA_OK ||
      (c->o.roots && megad_roots_check(c->o.roots, &as, &e) != MEGA_OK)) {
    mega_jobspec_free(&as);
    coord_finalize(c, j, MEGA_JOB_FAILED, e.msg);
    return true;
  }
  int *idx = calloc(c->members->nnodes ? c->members->nnodes : 1, sizeof *idx), n = 0;
  mega_status rc = idx ? coord_place(c, j, false, false, idx, &n, &e)
                       : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
  if (rc != MEGA_OK) {
    /* no count fits now: wait (submit made sure some count in range can) */
    free(idx);
    mega_jobspec_free(&as);
    if (rc != MEGA_ERR_NOMEM) set_wait(c, j, e.msg);
    return false;
  }
  uint32_t nproc = coord_nproc(c, j), world = (uint32_t)n * nproc, old_dp = j->dp,
           old_world = j->world;
  bool restart = j->state == MEGA_JOB_RESTARTING;
  mega_job_node *nodes = calloc((size_t)n, sizeof *nodes);
  for (int i = 0; nodes && i < n; i++)
    nodes[i] = (mega_job_node){.node_id = c->members->nodes[idx[i]]->id,
                               .first_rank = (uint32_t)i * nproc, .nranks = nproc};
  free(idx);
  if (restart) j->attempt++;
  if (!nodes ||
      mega_job_place(j, nodes, (size_t)n, world, j->tp, j->pp, (uint32_t)mega_jobspec_vp(&as),
                     &e) != MEGA_OK ||
      mega_job_transition(j, MEGA_JOB_RUNNING, megad_unix_ms(), NULL, &e) != MEGA_OK) {
    free(nodes);
    mega_jobspec_free(&as);
    coord_finalize(c, j, MEGA_JOB_FAILED, e.msg[0] ? e.msg : "out of memory");
    return true;
  }
  free(nodes);
  free(j->coord.wait);
  j->coord.wait = NULL;
  int nargs = 0;
  char **args = mega_jobspec_to_argv(&as, &nargs);
  coord_run *run = args ? coord_run_new(c, j, as.trace_iteration) : NULL;
  mega_jobspec_free(&as);
  if (!run) {
    mega_jobspec_argv_free(args);
    coord_finalize(c, j, MEGA_JOB_FAILED, "megad ran out of memory starting the job");
    return true;
  }
  megad_jobs_save(c->jobs, j, NULL);
  char where[640], from[96];
  describe(j, where, sizeof where);
  Mega__V1__ReplicaPlan *plan = restart ? fresh_replicas(c, j) : NULL;
  if (plan)
    snprintf(from, sizeof from, "the replicas' state at iteration %llu",
             (unsigned long long)plan->iteration);
  else
    snprintf(from, sizeof from, "%s",
             j->ckpt_iteration && j->spec.save ? "the newest checkpoint" : "the start");
  if (restart && old_world && world != old_world)
    megad_job_event(c->jobs, j, EV(RESCALED), NULL, -1,
                    "rescaled from DP %u to DP %u as attempt %u, from %s: %s", old_dp, j->dp,
                    j->attempt, from, where);
  else if (restart)
    megad_job_event(c->jobs, j, EV(PLACED), NULL, -1, "placed attempt %u: %s", j->attempt, where);
  else
    megad_job_event(c->jobs, j, EV(PLACED), NULL, -1, "placed: %s", where);
  /* the attempt owns the plan now; the donors wait until its ranks have
   * their state (coord_run.c) */
  run->plan = plan;
  run->plan_redone = j->coord.replicas_redone;
  j->coord.replicas = NULL;
  coord_launch_attempt(run, args, (size_t)nargs);
  return true;
}

/* A job waiting for nodes that could not run even on an idle cluster does
 * not hold up the jobs behind it; it is not looked at again until the
 * membership view changes (a node joins, is suspect, alive or lost). */
static bool blocks_queue(megad_coord *c, mega_job *j) {
  int *idx = calloc(c->members->nnodes ? c->members->nnodes : 1, sizeof *idx), n = 0;
  bool fits = idx && coord_place(c, j, false, true, idx, &n, NULL) == MEGA_OK;
  free(idx);
  if (!fits) j->coord.wq_epoch = c->members->view_version + 1;
  return fits;
}

static bool waiting(const mega_job *j) {
  return !j->coord.run && (j->state == MEGA_JOB_PENDING || j->state == MEGA_JOB_RESTARTING);
}

/* FIFO from the queue's head: each waiting job starts if the cluster has
 * room; the first that must wait holds up the rest. A pass costs the jobs it
 * starts plus one, not the jobs held (a job that cannot fit even an idle
 * cluster is skipped until the membership changes). A pass asked for during
 * one (a launch that fails at once ends its attempt) runs after it. */
static void schedule_pass(megad_coord *c) {
  if (c->b->stopping) return;
  if (c->scheduling) {
    c->reschedule = true;
    return;
  }
  c->scheduling = true;
  do {
    c->reschedule = false;
    for (mega_job *j = c->wq_head, *next; j && !c->reschedule; j = next) {
      next = j->coord.wq_next;
      if (!waiting(j)) {
        coord_wq_remove(c, j);
        continue;
      }
      if (j->coord.wq_epoch == c->members->view_version + 1) continue; /* too big for this view */
      if (j->coord.not_before_ms > megad_unix_ms()) continue; /* its launches were refused */
      if (try_start(c, j)) {
        coord_wq_remove(c, j);
        next = c->wq_head; /* the queue may have changed under the start */
        continue;
      }
      if (blocks_queue(c, j)) break;
    }
  } while (c->reschedule && !c->b->stopping);
  c->scheduling = false;
}

static void loads_back(void *arg) {
  megad_coord *c = arg;
  c->loads_asked = false;
  schedule_pass(c);
}

/* In etcd mode a pass that may place waits for the nodes' loads, read from
 * etcd when older than LOADS_FRESH_MS: they are not watched, so a job's
 * start and end do not reach every node (members.h). */
void megad_coord_schedule(megad_coord *c) {
  if (c->b->stopping) return;
  if (!c->jobs->etcd || !c->wq_head || c->scheduling) {
    schedule_pass(c);
    return;
  }
  if (c->loads_asked) return; /* the pass runs when the read is back */
  c->loads_asked = true;
  megad_members_read_loads(c->members, LOADS_FRESH_MS, loads_back, c);
}

/* etcd mode: whether an attempt this node runs could grow at its next
 * checkpoint (coord_could_place reads the loads then). */
static bool could_grow(const megad_coord *c) {
  for (const coord_run *run = c->runs; run; run = run->next) {
    uint32_t lo, hi;
    mega_recovery_node_range(run->job, &lo, &hi);
    if (run->job->spec.save && hi > run->job->nplaced) return true;
  }
  return false;
}

#define RETAIN_TICKS (10000 / SCHEDULE_MS)

/* Nodes' heartbeats free slots without an event here: look again, while
 * anything waits. Every 10 s, retention. */
static void on_tick(uv_timer_t *t) {
  megad_coord *c = t->data;
  if (c->wq_head) megad_coord_schedule(c);
  else if (c->jobs->etcd && could_grow(c)) megad_members_read_loads(c->members, SCHEDULE_MS,
                                                                   NULL, NULL);
  coord_etcd_tick(c);
  coord_late_tick(c);
  if (++c->ticks % RETAIN_TICKS == 0) coord_retain(c, megad_unix_ms());
}

/* ---- the end of an attempt ---- */

/* The recovery decision: the job ends, or waits as RESTARTING. */
static void decide(megad_coord *c, mega_job *j, mega_end_kind kind, const char *cause) {
  mega_recovery r = mega_recovery_decide(j, kind, cause);
  if (r.next != MEGA_JOB_RESTARTING) {
    coord_finalize(c, j, r.next, r.why[0] ? r.why : NULL);
    return;
  }
  mega_err e = {0};
  if (mega_job_transition(j, MEGA_JOB_RESTARTING, megad_unix_ms(), NULL, &e) != MEGA_OK) {
    megad_warn(c->b, "%s", e.msg);
    return;
  }
  if (r.counted) j->restarts++;
  megad_jobs_save(c->jobs, j, NULL);
  coord_wq_add(c, j);
  char budget[96] = "";
  if (r.counted)
    snprintf(budget, sizeof budget, " (restart %u of %u)", j->restarts, j->max_restarts);
  bool unreached = j->coord.launch_unreached;
  j->coord.launch_unreached = false;
  if (kind == MEGA_END_LAUNCH && unreached && ++j->coord.launch_refusals > 1) {
    unsigned shift = j->coord.launch_refusals - 2 < 4 ? j->coord.launch_refusals - 2 : 4;
    int64_t wait_ms = LAUNCH_RETRY_MS << shift;
    j->coord.not_before_ms = megad_unix_ms() + wait_ms;
    snprintf(budget, sizeof budget, " (launch refused %u times in a row: next try in %.1f s)",
             j->coord.launch_refusals, (double)wait_ms / 1000);
  } else if (kind == MEGA_END_LAUNCH && !unreached) {
    /* a node was busy: every other node's view is as old as its was, so
     * the next placement waits for one newer view (a heartbeat, a load
     * put; half a second at most); at once, it started ranks on the nodes
     * just freed by other coordinators' refused attempts, and was refused
     * in turn */
    unsigned wait_ms = c->o.heartbeat_ms < LAUNCH_RETRY_MS ? c->o.heartbeat_ms : LAUNCH_RETRY_MS;
    j->coord.not_before_ms = megad_unix_ms() + wait_ms;
  }
  char from[800], why[560] = "";
  if (j->coord.replicas_why)
    snprintf(why, sizeof why, "; not from replicas: %s", j->coord.replicas_why);
  const Mega__V1__ReplicaPlan *p = j->coord.replicas;
  if (j->coord.gathering) /* coord_held.c says where from once they answered */
    snprintf(from, sizeof from, "what its ranks kept (asking the nodes of attempt %u)",
             j->attempt);
  else if (p)
    snprintf(from, sizeof from, "the replicas' state at iteration %llu (%llu iteration%s to "
             "redo)", (unsigned long long)p->iteration,
             (unsigned long long)j->coord.replicas_redone,
             j->coord.replicas_redone == 1 ? "" : "s");
  else if (j->ckpt_iteration && j->spec.save)
    snprintf(from, sizeof from, "the checkpoint of iteration %llu (%llu iteration%s to redo%s)",
             (unsigned long long)j->ckpt_iteration,
             (unsigned long long)(j->last_iteration - j->ckpt_iteration),
             j->last_iteration - j->ckpt_iteration == 1 ? "" : "s", why);
  else
    snprintf(from, sizeof from, "the start (%s%s)",
             j->spec.save ? "no checkpoint was committed yet" : "the job saves no checkpoints",
             why);
  megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1, "attempt %u ended (%s); restarting from %s%s",
                  j->attempt, cause && cause[0] ? cause : mega_end_kind_name(kind), from, budget);
}

/* megad_coord.attempt_over: coord_run.c calls it once an attempt's every
 * rank is gone (coord.h says when). */
static void attempt_over(megad_coord *c, mega_job *j, mega_end_kind kind, const char *cause,
                         const megad_cancel_wait *cancels, size_t ncancels, bool ask_held) {
  if (ask_held && !j->etcd.fenced) coord_gather_held(c, j, false); /* answers come later */
  if (!j->etcd.fenced) decide(c, j, kind, cause);
  for (size_t i = 0; i < ncancels; i++)
    if (cancels[i].done) cancels[i].done(cancels[i].arg, j);
  if (j->etcd.fenced) megad_jobs_drop(c->jobs, j); /* another node has it now (coord_etcd.c) */
  megad_coord_schedule(c);
}

/* ---- cancel, resume, rescale ---- */

void megad_coord_cancel(megad_coord *c, mega_job *j, const char *reason,
                        void (*done)(void *arg, mega_job *j), void *arg) {
  char why[512];
  snprintf(why, sizeof why, "cancelled%s%s", reason && reason[0] ? ": " : "",
           reason ? reason : "");
  coord_run *run = j->coord.run;
  if (!run) {
    if (!mega_job_state_final(j->state)) {
      coord_wq_remove(c, j);
      coord_finalize(c, j, MEGA_JOB_CANCELLED, why);
      megad_coord_schedule(c);
    }
    if (done) done(arg, j);
    return;
  }
  if (done) {
    megad_cancel_wait *v = realloc(run->cancels, (run->ncancels + 1) * sizeof *v);
    if (v) {
      run->cancels = v;
      v[run->ncancels++] = (megad_cancel_wait){done, arg};
    }
  }
  coord_stop(run, MEGA_END_CANCELLED, why);
}

void megad_coord_cancel_forget(megad_coord *c, mega_job *j, void *arg) {
  (void)c;
  coord_run *run = j->coord.run;
  for (size_t i = 0; run && i < run->ncancels; i++)
    if (run->cancels[i].arg == arg) run->cancels[i].done = NULL;
}

mega_status megad_coord_resume(megad_coord *c, mega_job *j, mega_err *err) {
  if (j->state != MEGA_JOB_FAILED && j->state != MEGA_JOB_STOPPED)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "job %s is %s; only a failed or stopped job can be resumed",
                     j->id, mega_job_state_name(j->state));
  mega_jobspec probe;
  mega_jobspec_defaults(&probe);
  mega_status s = mega_recovery_attempt_spec(j, &probe, err); /* its flags parse here */
  mega_jobspec_free(&probe);
  if (s != MEGA_OK) return s;
  /* a job submitted since on the same --save would share it */
  s = coord_save_in_use(c, j, err);
  if (s != MEGA_OK) return s;
  s = mega_job_transition(j, MEGA_JOB_RESTARTING, megad_unix_ms(), NULL, err);
  if (s != MEGA_OK) return s;
  free(j->error);
  j->error = NULL;
  j->ended_ms = 0;
  megad_jobs_save(c->jobs, j, NULL);
  coord_wq_add(c, j);
  if (j->ckpt_iteration && j->spec.save)
    megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1,
                    "resumed by a user from the checkpoint of iteration %llu",
                    (unsigned long long)j->ckpt_iteration);
  else
    megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1,
                    "resumed by a user from the start (no checkpoint was committed)");
  megad_coord_schedule(c);
  return MEGA_OK;
}

mega_status megad_coord_rescale(megad_coord *c, mega_job *j, uint32_t nnodes, mega_err *err) {
  uint32_t lo = j->nnodes_min ? j->nnodes_min : 1, hi = j->nnodes_max > lo ? j->nnodes_max : lo;
  if (mega_job_state_final(j->state))
    return mega_fail(err, MEGA_ERR_INVALID, "job %s is %s; only a running job can be rescaled",
                     j->id, mega_job_state_name(j->state));
  if (nnodes < lo || nnodes > hi)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nnodes %u is outside job %s's range %u:%u (submit with --nnodes MIN:MAX "
                     "to let a job change size)", nnodes, j->id, lo, hi);
  if (j->coord.run && !j->spec.save)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "job %s saves no checkpoints (--save): it cannot re-plan without losing "
                     "its progress", j->id);
  j->coord.want_nodes = nnodes;
  megad_job_event(c->jobs, j, EV(INFO), NULL, -1, "rescale to %u node%s requested; %s", nnodes,
                  nnodes == 1 ? "" : "s",
                  j->coord.run ? "it happens at the next checkpoint"
                               : "it applies when the job starts");
  return MEGA_OK;
}

/* ---- membership ---- */

void megad_coord_node_lost(megad_coord *c, const megad_node *n, const char *why) {
  for (size_t i = 0; i < c->jobs->t.n; i++) {
    mega_job *j = c->jobs->t.v[i];
    coord_run *run = j->coord.run;
    if (!run) continue;
    for (size_t k = 0; k < j->nplaced; k++) {
      if (strcmp(j->placement[k].node_id, n->id)) continue;
      if (!run->stopping)
        megad_job_event(c->jobs, j, EV(NODE_LOST), n->id, -1, "%s", why);
      coord_cause(run, CAUSE_PRIMARY, MEGA_END_NODE_LOST, why);
      /* run may be gone now: the attempt ended with these ranks */
      if (j->coord.run) coord_ranks_gone(run, j->placement[k].first_rank, j->placement[k].nranks);
      break;
    }
  }
}

void megad_coord_stalled(megad_coord *c, uint64_t ms) {
  (void)ms; /* coord_stall_cause reads the stall from the base */
  for (coord_run *run = c->runs, *next; run; run = next) {
    next = run->next; /* coord_cause may end the attempt */
    char why[400];
    if (run->stopping || !coord_stall_cause(run, 0, why, sizeof why)) continue;
    megad_job_event(c->jobs, run->job, EV(INFO), c->b->node_id, -1, "%s", why);
    coord_cause(run, CAUSE_PRIMARY, MEGA_END_COORDINATOR, why);
  }
}

void megad_coord_node_up(megad_coord *c, const megad_node *n) {
  /* A node that comes back may still run ranks of attempts that ended
   * while it was away: they must do no harm. Those that hold the state the
   * job goes on from (its donors) stay. */
  for (size_t i = 0; !n->self && i < c->jobs->t.n; i++) {
    mega_job *j = c->jobs->t.v[i];
    if (j->state != MEGA_JOB_RUNNING && j->state != MEGA_JOB_RESTARTING) continue;
    uint32_t upto = j->attempt;
    if (j->coord.ndonors && j->coord.donors_attempt < upto) upto = j->coord.donors_attempt;
    coord_abort_attempt(c, j, n->id, upto, true, false, "this attempt of the job is over");
  }
  megad_coord_schedule(c);
}

/* ---- life cycle ---- */

bool megad_coord_runs(megad_coord *c, const char *job_id, uint32_t attempt) {
  return coord_run_of(c, job_id, attempt) != NULL;
}

bool megad_coord_keeps(megad_coord *c, const char *job_id, uint32_t attempt) {
  const mega_job *j = megad_jobs_find(c->jobs, job_id);
  if (!j || coord_run_of(c, job_id, attempt)) return false;
  return (j->coord.gathering && j->attempt == attempt) ||
         (j->coord.ndonors && j->coord.donors_attempt == attempt);
}

void megad_coord_stop_all(megad_coord *c, const char *reason) {
  char why[512];
  snprintf(why, sizeof why, "megad on %s stopped (%s)", c->b->node_id, reason);
  if (c->tick_on) uv_timer_stop(&c->tick);
  for (size_t i = 0; i < c->jobs->t.n; i++) {
    coord_run *run = c->jobs->t.v[i]->coord.run;
    if (run) coord_stop(run, MEGA_END_COORDINATOR, why);
  }
}

size_t megad_coord_stopping(const megad_coord *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->jobs->t.n; i++) n += c->jobs->t.v[i]->coord.run != NULL;
  return n;
}

mega_status megad_coord_init(megad_coord *c, megad_base *b, megad_jobs *jobs,
                             megad_members *members, megad_launcher *L, megad_kvserve *kvs,
                             const megad_coord_opts *o, mega_err *err) {
  (void)err;
  memset(c, 0, sizeof *c);
  c->b = b;
  c->jobs = jobs;
  c->members = members;
  c->L = L;
  c->kvs = kvs;
  c->o = *o;
  c->attempt_over = attempt_over;
  c->held_gathered = megad_coord_schedule;
  uv_timer_init(b->loop, &c->tick);
  uv_timer_init(b->loop, &c->retain_soon);
  c->tick.data = c->retain_soon.data = c;
  c->tick_on = true;
  return MEGA_OK;
}

void megad_coord_start(megad_coord *c) {
  for (size_t i = 0; i < c->jobs->t.n; i++) {
    mega_job *j = c->jobs->t.v[i];
    if (j->state == MEGA_JOB_PENDING || j->state == MEGA_JOB_RESTARTING) coord_wq_add(c, j);
    bool elsewhere = false; /* the last attempt's ranks on other nodes may hold their state */
    for (size_t k = 0; k < j->nplaced; k++)
      elsewhere = elsewhere || strcmp(j->placement[k].node_id, c->b->node_id) != 0;
    if (j->state == MEGA_JOB_RESTARTING && elsewhere && !j->spec.no_replica_recovery) {
      /* its attempt ended as this megad stopped (SIGTERM): the ranks it
       * told to hold kept their state for its return */
      megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1,
                      "megad on %s started again; asking the nodes of attempt %u what their "
                      "ranks kept", c->b->node_id, j->attempt);
      coord_gather_held(c, j, true);
    }
    if (j->state != MEGA_JOB_RUNNING) continue;
    mega_err e = {0};
    if (mega_job_transition(j, MEGA_JOB_RESTARTING, megad_unix_ms(), NULL, &e) != MEGA_OK) continue;
    megad_jobs_save(c->jobs, j, NULL);
    /* the old attempt's ranks on other nodes may have kept their state
     * (this node's died with its megad) */
    if (elsewhere && !j->spec.no_replica_recovery) {
      megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1,
                      "megad on %s restarted while attempt %u ran; asking its nodes what their "
                      "ranks kept", c->b->node_id, j->attempt);
      coord_gather_held(c, j, true);
    } else {
      char from[96];
      coord_resume_point(j, from, sizeof from);
      megad_job_event(c->jobs, j, EV(RESTARTING), NULL, -1,
                      "megad on %s restarted while attempt %u ran; resuming from %s",
                      c->b->node_id, j->attempt, from);
    }
    coord_wq_add(c, j);
  }
  coord_retain(c, megad_unix_ms());
  uv_timer_start(&c->tick, on_tick, 0, SCHEDULE_MS);
}

void megad_coord_free(megad_coord *c) {
  if (c->tick_on) {
    uv_close((uv_handle_t *)&c->tick, NULL);
    uv_close((uv_handle_t *)&c->retain_soon, NULL);
  }
  c->tick_on = false;
  free(c->saving_reason);
  c->saving_reason = NULL;
  coord_late_free(c);
}
