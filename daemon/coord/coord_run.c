/* The coordinator, second half: one running attempt. Step reports merge
 * into StepMetrics for the watchers; hellos, checkpoints, errors and exits
 * come in as RankEvents. The first real failure is the attempt's cause (see
 * coord_internal.h for how a peer's echo of it is told apart); then every
 * node aborts its ranks, and the attempt ends once every rank's exit is
 * known (coord_end.c takes it from there). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/coord/coord_internal.h"
#include "daemon/etcd/etcd.h"
#include "daemon/jobs/jobtrace.h"
#include "daemon/model/replicas.h"
#include "daemon/model/util.h"

#define EV(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

static void timer_closed(uv_handle_t *h) {
  coord_run *run = h->data;
  if (--run->timers_open == 0) free(run);
}

void coord_run_free(coord_run *run) {
  for (uint32_t r = 0; run->held && r < run->world; r++) {
    if (run->held[r]) protobuf_c_message_free_unpacked(&run->held[r]->base, NULL);
    free(run->held_node[r]);
  }
  free(run->held);
  free(run->held_node);
  mega_replicas_plan_free(run->plan);
  free(run->recovered);
  mega_stepmerge_free(run->merge);
  free(run->hello);
  free(run->exited);
  free(run->errored);
  for (int i = 0; i < PENDING_SAVES; i++) free(run->saves[i].saved);
  free(run->cause);
  free(run->cancels);
  free(run->stopped);
  mega_jobspec_argv_free(run->args);
  run->args = NULL;
  run->timers_open = 2;
  uv_close((uv_handle_t *)&run->cause_timer, timer_closed);
  uv_close((uv_handle_t *)&run->stop_timer, timer_closed);
}

coord_run *coord_run_new(megad_coord *c, mega_job *j, int trace_iteration) {
  coord_run *run = calloc(1, sizeof *run);
  if (!run) return NULL;
  run->c = c;
  run->job = j;
  run->world = j->world;
  run->trace_iteration = trace_iteration;
  run->started_ms = megad_unix_ms();
  run->started_loop_ms = uv_now(c->b->loop);
  run->merge = mega_stepmerge_new(j->world, j->attempt, 0);
  run->hello = calloc(j->world, sizeof *run->hello);
  run->exited = calloc(j->world, sizeof *run->exited);
  run->errored = calloc(j->world, sizeof *run->errored);
  run->held = calloc(j->world, sizeof *run->held);
  run->held_node = calloc(j->world, sizeof *run->held_node);
  run->recovered = calloc(j->world, sizeof *run->recovered);
  if (!run->merge || !run->hello || !run->exited || !run->errored || !run->held ||
      !run->held_node || !run->recovered) {
    free(run->recovered);
    mega_stepmerge_free(run->merge);
    free(run->hello);
    free(run->exited);
    free(run->errored);
    free(run->held);
    free(run->held_node);
    free(run);
    return NULL;
  }
  snprintf(run->kv_prefix, sizeof run->kv_prefix, "%s/%u", j->id, j->attempt);
  uv_timer_init(c->b->loop, &run->cause_timer);
  uv_timer_init(c->b->loop, &run->stop_timer);
  run->cause_timer.data = run->stop_timer.data = run;
  j->coord.run = run;
  run->next = c->runs;
  if (c->runs) c->runs->prev = run;
  c->runs = run;
  return run;
}

coord_run *coord_run_of(megad_coord *c, const char *job_id, uint32_t attempt) {
  mega_job *j = megad_jobs_find(c->jobs, job_id);
  return j && j->coord.run && j->attempt == attempt ? j->coord.run : NULL;
}

void coord_ranks_gone(coord_run *run, uint32_t first, uint32_t n) {
  for (uint32_t r = first; r < first + n && r < run->world; r++)
    if (!run->exited[r]) {
      run->exited[r] = true;
      run->nexited++;
    }
  if (run->nexited == run->world) coord_run_finish(run);
}

static void on_stop_timer(uv_timer_t *t) {
  coord_run *run = t->data;
  megad_warn(run->c->b, "job %s: %u rank%s did not report an exit in time; counting them gone",
             run->job->id, run->world - run->nexited, run->world - run->nexited == 1 ? "" : "s");
  coord_ranks_gone(run, 0, run->world);
}

void coord_set_cause(coord_run *run, int prio, mega_end_kind kind, const char *msg) {
  char *m = strdup(msg);
  if (!m) return;
  free(run->cause);
  run->cause = m;
  run->cause_prio = prio;
  run->cause_kind = kind;
}

void coord_stop(coord_run *run, mega_end_kind kind, const char *why) {
  if (run->stopping) return;
  run->stopping = true;
  run->end_kind = kind;
  /* a planned end says why; a failure keeps its cause */
  if (why && (kind != run->cause_kind || !run->cause)) coord_set_cause(run, CAUSE_PRIMARY, kind, why);
  if (kind != MEGA_END_DONE && kind != MEGA_END_CANCELLED && !run->job->coord.failed_ms)
    run->job->coord.failed_ms = megad_unix_ms();
  uv_timer_stop(&run->cause_timer);
  char reason[1200];
  snprintf(reason, sizeof reason, "job %s attempt %u is stopping: %s", run->job->id,
           run->job->attempt, run->cause ? run->cause : mega_end_kind_name(kind));
  /* after a failure, for a re-plan, or when this coordinator stalls or
   * stops, whole states are kept for the next attempt (its restart, or the
   * node that takes the job over, asks for them); a job that ends keeps
   * none */
  bool hold = kind != MEGA_END_DONE && kind != MEGA_END_CANCELLED && kind != MEGA_END_FATAL &&
              kind != MEGA_END_STOPPED && !run->job->spec.no_replica_recovery;
  if (run->preparing) /* no node started a rank: none to stop or wait for */
    for (uint32_t r = 0; r < run->world; r++) {
      run->nexited += !run->exited[r];
      run->exited[r] = true;
    }
  else
    coord_abort_nodes(run, reason, hold);
  if (run->nexited == run->world) {
    coord_run_finish(run);
    return;
  }
  uv_timer_start(&run->stop_timer, on_stop_timer, MEGAD_ABORT_GRACE_MS + 4000, 0);
  if (kind != MEGA_END_COORDINATOR || !run->orphaned) return;
  /* the other nodes took this one for lost: their ranks stopped with hold
   * and their reports no longer come here, so waiting for them would only
   * run out the timer; what they kept is asked of them at the end */
  mega_job *j = run->job;
  megad_coord *c = run->c;
  run->gather = hold;
  for (size_t i = 0; i < j->nplaced && j->coord.run == run; i++)
    if (strcmp(j->placement[i].node_id, c->b->node_id))
      coord_ranks_gone(run, j->placement[i].first_rank, j->placement[i].nranks);
}

/* A node of the job that has gone quiet may be dying: its death is the
 * better cause than the peers' echo of it, so wait until it is declared. */
static bool node_going_quiet(coord_run *run) {
  megad_coord *c = run->c;
  for (size_t i = 0; i < run->job->nplaced; i++) {
    megad_node *n = megad_members_find(c->members, run->job->placement[i].node_id);
    if (n && !n->self &&
        (n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE ||
         n->state == MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT) &&
        megad_quiet_ms(c->b, n->seen_ms) > 2 * c->o.heartbeat_ms + 100)
      return true;
  }
  return false;
}

static void on_cause_timer(uv_timer_t *t) {
  coord_run *run = t->data;
  if (node_going_quiet(run) &&
      uv_now(run->c->b->loop) - run->cause_since < run->c->o.heartbeat_timeout_ms + 1000) {
    uv_timer_start(&run->cause_timer, on_cause_timer, 100, 0);
    return;
  }
  coord_stop(run, run->cause_kind, run->cause);
}

/* How long after a stall the failures it brings keep arriving: the other
 * nodes' aborts, the workers' own exits. */
#define STALL_AFTERMATH_MS 5000

bool coord_stall_cause(coord_run *run, uint64_t window_ms, char *buf, size_t len) {
  megad_coord *c = run->c;
  uint64_t start = 0, ms = megad_stall_recent(c->b, window_ms, &start);
  if (!ms || start < run->started_loop_ms) return false;
  /* heartbeat mode: the job's other nodes took this one for lost and
   * stopped their ranks; in etcd mode a stall past the lease stands this
   * node down instead (coord_etcd.c) */
  bool remote = false;
  for (size_t i = 0; i < run->job->nplaced && !remote; i++)
    remote = strcmp(run->job->placement[i].node_id, c->b->node_id) != 0;
  uint64_t pipe_ms = c->L->o.pipe_timeout_ms;
  if (!c->jobs->etcd && remote && ms >= c->o.heartbeat_timeout_ms) {
    run->orphaned = true;
    snprintf(buf, len, "node %s, the job's coordinator, stalled for %.1f s (its megad was "
             "stopped or starved of CPU), past the %.1f s heartbeat timeout: the job's other "
             "nodes took it for lost and stopped their ranks", c->b->node_id, (double)ms / 1000,
             c->o.heartbeat_timeout_ms / 1000.0);
  } else if (ms >= pipe_ms)
    snprintf(buf, len, "node %s, the job's coordinator, stalled for %.1f s (its megad was "
             "stopped or starved of CPU): its workers stop after %.1f s without word from it",
             c->b->node_id, (double)ms / 1000, pipe_ms / 1000.0);
  else
    return false;
  return true;
}

void coord_cause(coord_run *run, int prio, mega_end_kind kind, const char *msg) {
  if (run->stopping) return;
  char stall[400];
  if (coord_stall_cause(run, STALL_AFTERMATH_MS, stall, sizeof stall)) {
    prio = CAUSE_PRIMARY;
    kind = MEGA_END_COORDINATOR;
    msg = stall;
  }
  if (prio > run->cause_prio) coord_set_cause(run, prio, kind, msg);
  if (prio == CAUSE_PRIMARY) {
    coord_stop(run, run->cause_kind, run->cause);
  } else if (!uv_is_active((uv_handle_t *)&run->cause_timer)) {
    run->cause_since = uv_now(run->c->b->loop);
    uv_timer_start(&run->cause_timer, on_cause_timer, CAUSE_WAIT_MS, 0);
  }
}

/* ---- recovery from replicas ---- */

void coord_resume_point(const mega_job *j, char *buf, size_t len) {
  if (j->ckpt_iteration && j->spec.save)
    snprintf(buf, len, "the checkpoint of iteration %llu", (unsigned long long)j->ckpt_iteration);
  else
    snprintf(buf, len, "the start");
}

bool coord_may_act(const megad_coord *c) {
  return !c->jobs->etcd || megad_etcd_session_fresh(c->jobs->etcd);
}

/* ---- telling the nodes ---- */

static void ignore_reply(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)arg;
  (void)err; /* a node that cannot be reached is handled by its heartbeats */
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
}

void coord_abort_on(megad_coord *c, const mega_job *j, const char *node_id, bool stale,
                    const char *reason) {
  coord_abort_attempt(c, j, node_id, j->attempt, stale, false, reason);
}

void coord_abort_attempt(megad_coord *c, const mega_job *j, const char *node_id,
                         uint32_t attempt, bool stale, bool hold, const char *reason) {
  megad_node *n = megad_members_find(c->members, node_id);
  if (!n) return;
  if (n->self) { /* a megad that stops takes its own ranks with it */
    if (hold && !c->b->stopping)
      megad_launch_hold(c->L, j->id, attempt, reason, MEGAD_HOLD_GRACE_MS);
    else
      megad_launch_abort(c->L, j->id, attempt, stale, reason, MEGAD_ABORT_GRACE_MS);
    return;
  }
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
    return;
  Mega__V1__AbortJobRequest req = MEGA__V1__ABORT_JOB_REQUEST__INIT;
  req.job_id = j->id;
  req.attempt = attempt;
  req.reason = (char *)reason;
  req.grace_ms = hold ? MEGAD_HOLD_GRACE_MS : MEGAD_ABORT_GRACE_MS;
  req.stale = stale;
  req.hold = hold;
  megad_call(c->b, n->address, &mega_peer_abort_job, &req.base, 5000, ignore_reply, NULL, NULL);
}

/* Asks node_id to have j's ranks save and stop (--exit-signal-handler). */
static void stop_saving_on(megad_coord *c, const mega_job *j, const char *node_id,
                           const char *reason) {
  megad_node *n = megad_members_find(c->members, node_id);
  if (!n || n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
    return;
  if (n->self) {
    megad_launch_stop_graceful(c->L, j->id, reason);
    return;
  }
  Mega__V1__AbortJobRequest req = MEGA__V1__ABORT_JOB_REQUEST__INIT;
  req.job_id = j->id;
  req.attempt = j->attempt;
  req.reason = (char *)reason;
  req.save = true;
  megad_call(c->b, n->address, &mega_peer_abort_job, &req.base, 5000, ignore_reply, NULL, NULL);
}

size_t megad_coord_stop_saving(megad_coord *c, const char *reason) {
  size_t n = 0;
  if (!c->saving_reason) c->saving_reason = megad_strdup(reason);
  for (coord_run *run = c->runs; run; run = run->next) {
    const mega_job *j = run->job;
    if (run->stopping || !j->spec.exit_signal_handler) continue;
    for (size_t i = 0; i < j->nplaced; i++) stop_saving_on(c, j, j->placement[i].node_id, reason);
    megad_job_event(c->jobs, run->job, EV(INFO), NULL, -1,
                    "asking every rank to save a checkpoint and stop (--exit-signal-handler): %s",
                    reason);
    n++;
  }
  return n;
}

bool megad_coord_saving(const megad_coord *c) {
  for (const coord_run *run = c->runs; run; run = run->next)
    if (run->job->spec.exit_signal_handler) return true;
  return false;
}

void coord_abort_nodes(coord_run *run, const char *reason, bool hold) {
  const mega_job *j = run->job;
  for (size_t i = 0; i < j->nplaced; i++)
    coord_abort_attempt(run->c, j, j->placement[i].node_id, j->attempt, false, hold, reason);
}

/* A commit refused because this node may not act: training goes on
 * without it; the first of a run of them is an event. */
static void commit_skipped(coord_run *run, uint64_t iteration, char *why, size_t len) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  const char *etcd_why = NULL;
  bool reachable = megad_etcd_ok(c->jobs->etcd, &etcd_why);
  snprintf(why, len, "this node's etcd lease is not known alive%s%s", reachable ? "" : ": ",
           reachable || !etcd_why ? "" : etcd_why);
  if (!run->skipped++) {
    run->skipped_first = iteration;
    megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                    "checkpoint of iteration %llu not committed: %s; training goes on, and "
                    "checkpoints commit again once the lease is renewed",
                    (unsigned long long)iteration, why);
  }
  run->skipped_last = iteration;
}

void coord_ask_commit(coord_run *run, uint64_t iteration) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  const mega_job_node *jn = mega_job_node_of(j, 0);
  Mega__V1__CommitCheckpointRequest req = MEGA__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  req.job_id = j->id;
  req.attempt = j->attempt;
  req.rank = 0;
  req.iteration = iteration;
  req.coordinator_fence = j->etcd.fence;
  /* etcd: a lease not known alive may have lost the job, so no go-ahead;
   * but the rank hears so at once rather than wait for one */
  char why[MEGA_ERR_MSG_MAX + 64];
  if (!coord_may_act(c)) {
    commit_skipped(run, iteration, why, sizeof why);
    req.refused = why;
  }
  megad_node *n = jn ? megad_members_find(c->members, jn->node_id) : NULL;
  mega_err e = {0};
  if (n && n->self) {
    if (megad_launch_commit(c->L, &req, &e) != MEGA_OK)
      megad_warn(c->b, "job %s: checkpoint of iteration %llu: %s", j->id,
                 (unsigned long long)iteration, e.msg);
  } else if (n) {
    megad_call(c->b, n->address, &mega_peer_commit_checkpoint, &req.base, 5000, ignore_reply,
               NULL, NULL);
  }
}

/* ---- steps ---- */

static void on_step_merged(coord_run *run, mega_step_done *done) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  /* how stale a merged step is when it leaves: from the last rank's step end */
  int64_t end_us = 0;
  for (uint32_t r = 0; r < done->world; r++) {
    const Mega__V1__StepReport *rep = done->reports[r];
    int64_t e = rep->step_start_unix_us +
                (int64_t)((rep->metrics ? rep->metrics->step_time_s : 0) * 1e6);
    if (rep->step_start_unix_us && e > end_us) end_us = e;
  }
  if (end_us) {
    double delay = (double)(megad_unix_us() - end_us) / 1e6;
    j->coord.report_delay_sum_s += delay;
    j->coord.report_delay_n++;
    c->jobs->stats.report_delay_sum_s += delay;
    c->jobs->stats.report_delay_n++;
  }
  j->coord.launch_refusals = 0; /* an attempt that trains was launched */
  j->coord.not_before_ms = 0;
  /* a step the failed attempt still completes is no recovery */
  if (j->coord.failed_ms && !run->stopping) {
    megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                    "training again: attempt %u merged iteration %llu %.2f s after the failure "
                    "was detected", j->attempt, (unsigned long long)done->step->iteration,
                    (double)(megad_unix_ms() - j->coord.failed_ms) / 1000);
    j->coord.failed_ms = 0;
  }
  coord_late_flush(c, j);
  megad_job_step(c->jobs, j, done->step);
  if (run->trace_iteration > 0 && done->step->iteration == (uint64_t)run->trace_iteration) {
    char *path = NULL;
    mega_err e = {0};
    if (megad_trace_write(c->b, j, done, &path, &e) == MEGA_OK)
      megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                      "trace of iteration %d written to %s (megactl trace %s)",
                      run->trace_iteration, path, j->id);
    else
      megad_job_event(c->jobs, j, EV(INFO), NULL, -1, "could not write the trace of iteration %d: %s",
                      run->trace_iteration, e.msg);
    free(path);
  }
}

void megad_coord_step(megad_coord *c, const char *job_id, uint32_t attempt, const char *node_id,
                      const Mega__V1__StepReport *r) {
  (void)node_id;
  coord_run *run = coord_run_of(c, job_id, attempt);
  if (!run || !r->metrics) return;
  mega_step_done *done = NULL;
  mega_err e = {0};
  if (mega_stepmerge_add(run->merge, r->metrics->rank, r, &done, &e) != MEGA_OK) {
    megad_warn(c->b, "job %s: %s", job_id, e.msg);
    return;
  }
  if (done) {
    on_step_merged(run, done);
    mega_step_done_free(done);
  }
}

/* ---- checkpoints ---- */

static save_wait *save_of(coord_run *run, uint64_t iteration) {
  save_wait *free_slot = NULL, *oldest = NULL;
  for (int i = 0; i < PENDING_SAVES; i++) {
    save_wait *s = &run->saves[i];
    if (s->iteration == iteration) return s;
    if (!s->iteration && !free_slot) free_slot = s;
    if (s->iteration && (!oldest || s->iteration < oldest->iteration)) oldest = s;
  }
  save_wait *s = free_slot ? free_slot : oldest; /* a save some rank never finished */
  if (!s->saved && !(s->saved = calloc(run->world, sizeof *s->saved))) return NULL;
  memset(s->saved, 0, run->world * sizeof *s->saved);
  s->iteration = iteration;
  s->nsaved = 0;
  s->asked = false;
  return s;
}

/* Every rank's part of iteration's checkpoint is durable: the committing
 * rank may write the manifest. */
static void saved(coord_run *run, uint32_t rank, uint64_t iteration) {
  save_wait *s = save_of(run, iteration);
  if (!s || s->saved[rank]) return;
  s->saved[rank] = true;
  if (++s->nsaved < run->world || s->asked) return;
  s->asked = true;
  coord_ask_commit(run, iteration);
}

static void committed(coord_run *run, const char *node_id, uint32_t rank,
                      const Mega__V1__CheckpointDone *ck) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  for (int i = 0; i < PENDING_SAVES; i++)
    if (run->saves[i].iteration && run->saves[i].iteration <= ck->iteration)
      run->saves[i].iteration = 0;
  if (ck->iteration <= j->ckpt_iteration) return;
  j->ckpt_iteration = ck->iteration;
  free(j->ckpt_path);
  j->ckpt_path = megad_strdup(ck->path);
  megad_jobs_save(c->jobs, j, NULL);
  megad_job_event(c->jobs, j, EV(CHECKPOINT), node_id, (int)rank,
                  "checkpoint of iteration %llu committed in %s (%.1f MB, %.2f s; training "
                  "waited %.2f s)", (unsigned long long)ck->iteration, ck->path,
                  (double)ck->bytes / 1e6, ck->duration_s, ck->blocked_s);
  if (run->skipped) {
    char which[64];
    if (run->skipped == 1)
      snprintf(which, sizeof which, "iteration %llu", (unsigned long long)run->skipped_first);
    else
      snprintf(which, sizeof which, "iterations %llu to %llu",
               (unsigned long long)run->skipped_first, (unsigned long long)run->skipped_last);
    megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                    "checkpoints commit again; %u checkpoint%s (%s) went uncommitted while "
                    "this node's etcd lease was not known alive",
                    run->skipped, run->skipped == 1 ? "" : "s", which);
    run->skipped = 0;
  }
  /* nodes came back, or megactl rescale asked: re-plan from this checkpoint */
  if (j->spec.save && ck->iteration < j->train_iters) {
    uint32_t now = (uint32_t)j->nplaced, could = coord_could_place(c, j, true);
    if (mega_recovery_should_replan(j, now, could)) {
      char why[200];
      snprintf(why, sizeof why, "re-planning on %u node%s (was %u) at the checkpoint of "
               "iteration %llu", could, could == 1 ? "" : "s", now,
               (unsigned long long)ck->iteration);
      megad_job_event(c->jobs, j, EV(INFO), NULL, -1, "%s", why);
      coord_stop(run, MEGA_END_RESCALE, why);
    }
  }
}

/* ---- what the workers say ---- */

static void exit_cause(uint32_t rank, const char *node_id, const Mega__V1__RankExit *x, char *buf,
                       size_t len) {
  /* the last stderr line usually says why: an error, or a crash's own words */
  const char *tail = x->stderr_tail ? x->stderr_tail : "";
  const char *last = strrchr(tail, '\n');
  last = last ? last + 1 : tail;
  if (x->term_signal) {
    const char *hint = megad_signal_hint(x->term_signal);
    snprintf(buf, len, "rank %u (node %s) exited with signal %d (%s)%s%s%s%s", rank, node_id,
             x->term_signal, megad_signal_name(x->term_signal), hint ? ": " : "",
             hint ? hint : "", last[0] ? "; its last words: " : "", last);
    return;
  }
  snprintf(buf, len, "rank %u (node %s) exited with status %d%s%s", rank, node_id, x->exit_status,
           last[0] ? ": " : "", last);
}

static void on_hello(coord_run *run, uint32_t r) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  if (run->hello[r]) return;
  run->hello[r] = true;
  if (++run->nhello != run->world) return;
  double took = (double)(megad_unix_ms() - run->started_ms) / 1000;
  if (run->world == 1)
    megad_job_event(c->jobs, j, EV(STARTED), NULL, -1, "rank 0 started (%.2f s after placement)",
                    took);
  else
    megad_job_event(c->jobs, j, EV(STARTED), NULL, -1,
                    "all %u ranks started (%.2f s after placement)", run->world, took);
}

/* A rank stopped and holds a whole state: it counts as gone. A rank of an
 * attempt that takes its state from replicas is a donor only once it has
 * its state (RankRecovered): before, it holds nothing of the run. */
static void on_held(coord_run *run, uint32_t r, const char *node_id,
                    const Mega__V1__RankHeld *h) {
  if (run->held[r] || run->exited[r]) return;
  if (run->plan && !run->recovered[r]) {
    coord_ranks_gone(run, r, 1);
    return;
  }
  run->held[r] = (Mega__V1__RankHeld *)megad_pb_copy(&h->base);
  run->held_node[r] = megad_strdup(node_id);
  if (!run->held[r] || !run->held_node[r]) return; /* then it is not a donor */
  run->nheld++;
  coord_ranks_gone(run, r, 1);
}

/* A rank took its state from replicas; once all have, the donors go. */
static void on_recovered(coord_run *run, uint32_t r, const Mega__V1__RankRecovered *rec) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  if (!run->plan || run->recovered[r]) return;
  run->recovered[r] = true;
  run->recovered_bytes += rec->bytes;
  if (rec->seconds > run->recovered_s) run->recovered_s = rec->seconds;
  if (++run->nrecovered != run->world) return;
  megad_job_event(c->jobs, j, EV(INFO), NULL, -1,
                  "recovered iteration %llu from replicas; %llu iteration%s redone; %.1f MB "
                  "moved rank to rank in %.3f s",
                  (unsigned long long)run->plan->iteration,
                  (unsigned long long)run->plan_redone, run->plan_redone == 1 ? "" : "s",
                  (double)run->recovered_bytes / 1e6, run->recovered_s);
  coord_release_donors(c, j, "every rank of the next attempt has its state");
}

/* The ranks found the committed checkpoint incomplete (a disk that lost it,
 * a copy cut short) and loaded another complete one: an older one, or a
 * newer one every rank had written before the failure but nobody had
 * committed yet. From now on that one is the job's. Kept, the bad one would
 * stay what the next restart is said to start from, would turn down
 * replicas newer than it, and would pass over the commits that redo its
 * iterations. */
static void fell_back(coord_run *run, const Mega__V1__WorkerNote *n) {
  mega_job *j = run->job;
  if (!n->fell_back_to || !n->fell_back_path || !n->fell_back_path[0] || !j->spec.save ||
      n->fell_back_to == j->ckpt_iteration)
    return;
  char *path = megad_strdup(n->fell_back_path);
  if (!path) return;
  megad_job_event(run->c->jobs, j, EV(INFO), NULL, -1,
                  "the job's checkpoint is now iteration %llu's (%s): iteration %llu's is "
                  "incomplete", (unsigned long long)n->fell_back_to, path,
                  (unsigned long long)j->ckpt_iteration);
  j->ckpt_iteration = n->fell_back_to;
  free(j->ckpt_path);
  j->ckpt_path = path;
  megad_jobs_save(run->c->jobs, j, NULL);
}

void megad_coord_event(megad_coord *c, const char *job_id, uint32_t attempt, const char *node_id,
                       const Mega__V1__RankEvent *ev) {
  coord_run *run = coord_run_of(c, job_id, attempt);
  if (!run || ev->rank >= run->world) return;
  mega_job *j = run->job;
  uint32_t r = ev->rank;
  char msg[1600];
  switch (ev->kind_case) {
  case MEGA__V1__RANK_EVENT__KIND_STARTED:
    on_hello(run, r);
    break;
  case MEGA__V1__RANK_EVENT__KIND_NOTE:
    megad_job_event(c->jobs, j, EV(INFO), node_id, (int)r, "%s", ev->note->message);
    fell_back(run, ev->note);
    break;
  case MEGA__V1__RANK_EVENT__KIND_HELD:
    on_held(run, r, node_id, ev->held);
    break;
  case MEGA__V1__RANK_EVENT__KIND_RECOVERED:
    on_recovered(run, r, ev->recovered);
    break;
  case MEGA__V1__RANK_EVENT__KIND_STOPPED: {
    /* every rank says it; the first that was asked itself says why */
    bool first = !run->stopped;
    if (!first && (run->stopped_mine || !ev->stopped->asked)) break;
    free(run->stopped);
    run->stopped = megad_strdup(ev->stopped->reason);
    run->stopped_mine = ev->stopped->asked;
    run->stopped_iteration = ev->stopped->iteration;
    if (first)
      megad_job_event(c->jobs, j, EV(INFO), node_id, (int)r,
                      "the ranks agreed to stop after iteration %llu",
                      (unsigned long long)ev->stopped->iteration);
    break;
  }
  case MEGA__V1__RANK_EVENT__KIND_CHECKPOINT:
    if (run->stopping) break;
    if (ev->checkpoint->committed) committed(run, node_id, r, ev->checkpoint);
    else saved(run, r, ev->checkpoint->iteration);
    break;
  case MEGA__V1__RANK_EVENT__KIND_ERROR: {
    if (run->stopping || run->errored[r]) break;
    run->errored[r] = true;
    const Mega__V1__WorkerError *we = ev->error;
    snprintf(msg, sizeof msg, "rank %u (node %s): %s", r, node_id, we->message);
    megad_job_event(c->jobs, j, EV(RANK_FAILED), node_id, (int)r, "%s", msg);
    coord_cause(run, we->retryable ? CAUSE_SECONDARY : CAUSE_PRIMARY,
                we->fatal ? MEGA_END_FATAL : MEGA_END_CRASH, msg);
    break;
  }
  case MEGA__V1__RANK_EVENT__KIND_EXIT: {
    const Mega__V1__RankExit *x = ev->exit;
    bool ok = x->exit_status == 0 && x->term_signal == 0;
    if (!ok && !run->stopping && !run->errored[r]) {
      exit_cause(r, node_id, x, msg, sizeof msg);
      megad_job_event(c->jobs, j, EV(RANK_FAILED), node_id, (int)r, "%s", msg);
      /* megaw exits 2 for a job it refuses */
      coord_cause(run, CAUSE_PRIMARY,
                  x->exit_status == 2 && !x->term_signal ? MEGA_END_FATAL : MEGA_END_CRASH, msg);
    } else if (!ok && !run->stopping) {
      /* it said why before it went; a retryable reason stays secondary */
      coord_cause(run, CAUSE_SECONDARY, MEGA_END_CRASH, run->cause ? run->cause : "a rank failed");
    }
    if ((run = coord_run_of(c, job_id, attempt))) coord_ranks_gone(run, r, 1);
    break;
  }
  default:
    break;
  }
}
