/* The coordinator, second half: one running attempt. Step reports merge
 * into StepMetrics for the watchers; hellos, checkpoints, errors and exits
 * come in as RankEvents. The first real failure is the job's cause (see
 * coord.h for how a peer's echo of it is told apart); then every node aborts
 * its ranks, and the job ends once every rank's exit is known. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/coord.h"
#include "daemon/util.h"

static void finish(coord_run *run);

static void timer_closed(uv_handle_t *h) {
  coord_run *run = h->data;
  if (--run->timers_open == 0) free(run);
}

static void run_free(coord_run *run) {
  mega_stepmerge_free(run->merge);
  free(run->hello);
  free(run->exited);
  free(run->errored);
  free(run->end_error);
  free(run->cause);
  free(run->cancels);
  run->timers_open = 2;
  uv_close((uv_handle_t *)&run->cause_timer, timer_closed);
  uv_close((uv_handle_t *)&run->stop_timer, timer_closed);
}

coord_run *coord_run_new(megad *d, mega_job *j, int trace_iteration) {
  coord_run *run = calloc(1, sizeof *run);
  if (!run) return NULL;
  run->d = d;
  run->job = j;
  run->world = j->world;
  run->trace_iteration = trace_iteration;
  run->merge = mega_stepmerge_new(j->world, j->attempt, 0);
  run->hello = calloc(j->world, sizeof *run->hello);
  run->exited = calloc(j->world, sizeof *run->exited);
  run->errored = calloc(j->world, sizeof *run->errored);
  if (!run->merge || !run->hello || !run->exited || !run->errored) {
    mega_stepmerge_free(run->merge);
    free(run->hello);
    free(run->exited);
    free(run->errored);
    free(run);
    return NULL;
  }
  snprintf(run->kv_prefix, sizeof run->kv_prefix, "%s/%u", j->id, j->attempt);
  uv_timer_init(d->loop, &run->cause_timer);
  uv_timer_init(d->loop, &run->stop_timer);
  run->cause_timer.data = run->stop_timer.data = run;
  j->rt = run;
  return run;
}

static coord_run *run_of(megad *d, const char *job_id, uint32_t attempt) {
  mega_job *j = mega_jobs_find(&d->jobs, job_id);
  return j && j->rt && j->attempt == attempt ? j->rt : NULL;
}

void coord_ranks_gone(coord_run *run, uint32_t first, uint32_t n) {
  for (uint32_t r = first; r < first + n && r < run->world; r++)
    if (!run->exited[r]) {
      run->exited[r] = true;
      run->nexited++;
    }
  if (run->nexited == run->world) finish(run);
}

static void on_stop_timer(uv_timer_t *t) {
  coord_run *run = t->data;
  megad_warn(run->d, "job %s: %u rank%s did not report an exit in time; counting them gone",
             run->job->id, run->world - run->nexited, run->world - run->nexited == 1 ? "" : "s");
  coord_ranks_gone(run, 0, run->world);
}

void coord_stop(coord_run *run, mega_job_state state, const char *error) {
  if (run->stopping) return;
  run->stopping = true;
  run->end_state = state;
  run->end_error = error ? strdup(error) : NULL;
  uv_timer_stop(&run->cause_timer);
  char reason[1200];
  snprintf(reason, sizeof reason, "job %s is stopping: %s", run->job->id,
           error ? error : mega_job_state_name(state));
  coord_abort_nodes(run, reason);
  if (run->nexited == run->world) {
    finish(run);
    return;
  }
  uv_timer_start(&run->stop_timer, on_stop_timer, MEGAD_ABORT_GRACE_MS + 4000, 0);
}

/* A node of the job that has gone quiet may be dying: its death is the
 * better cause than the peers' echo of it, so wait until it is declared. */
static bool node_going_quiet(coord_run *run) {
  megad *d = run->d;
  uint64_t now = uv_now(d->loop);
  for (size_t i = 0; i < run->job->nplaced; i++) {
    megad_node *n = megad_node_find(d, run->job->placement[i].node_id);
    if (n && !n->self &&
        (n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE ||
         n->state == MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT) &&
        now - n->seen_ms > MEGAD_HEARTBEAT_MS + 500)
      return true;
  }
  return false;
}

static void on_cause_timer(uv_timer_t *t) {
  coord_run *run = t->data;
  if (node_going_quiet(run) && uv_now(run->d->loop) - run->cause_since < MEGAD_DEAD_MS + 2000) {
    uv_timer_start(&run->cause_timer, on_cause_timer, 250, 0);
    return;
  }
  coord_stop(run, MEGA_JOB_FAILED, run->cause);
}

void coord_cause(coord_run *run, int prio, const char *msg) {
  if (run->stopping) return;
  if (prio > run->cause_prio) {
    char *c = strdup(msg);
    if (c) {
      free(run->cause);
      run->cause = c;
      run->cause_prio = prio;
    }
  }
  if (prio == CAUSE_PRIMARY) coord_stop(run, MEGA_JOB_FAILED, run->cause);
  else if (!uv_is_active((uv_handle_t *)&run->cause_timer)) {
    run->cause_since = uv_now(run->d->loop);
    uv_timer_start(&run->cause_timer, on_cause_timer, MEGAD_CAUSE_WAIT_MS, 0);
  }
}

static void journal_last_step(megad *d, mega_job *j) {
  if (!j->last_step) return;
  uint8_t *buf;
  size_t len;
  mega_err e = {0};
  if (mega_jrec_step(j->id, j->last_step, &buf, &len, &e) == MEGA_OK) {
    if (mega_journal_append(d->journal, buf, len, &e) != MEGA_OK) megad_warn(d, "journal: %s", e.msg);
    free(buf);
  }
}

static void finish(coord_run *run) {
  megad *d = run->d;
  mega_job *j = run->job;
  mega_job_state state = MEGA_JOB_SUCCEEDED;
  const char *error = NULL;
  if (run->stopping) {
    state = run->end_state;
    error = run->end_error;
  } else if (run->cause) {
    state = MEGA_JOB_FAILED;
    error = run->cause;
  }
  char prefix[sizeof run->kv_prefix + 1];
  snprintf(prefix, sizeof prefix, "%s/", run->kv_prefix);
  mega_kv_delete_prefix(d->kv, prefix);
  mega_err e = {0};
  if (mega_job_transition(j, state, megad_unix_ms(), error, &e) != MEGA_OK)
    megad_warn(d, "job %s: %s", j->id, e.msg);
  j->rt = NULL;
  journal_last_step(d, j);
  megad_journal_job(d, j, NULL);
  Mega__V1__JobEventKind kind = state == MEGA_JOB_SUCCEEDED ? MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED
                                : state == MEGA_JOB_CANCELLED
                                    ? MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED
                                    : MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED;
  if (state == MEGA_JOB_SUCCEEDED)
    megad_job_event(d, j, kind, NULL, -1, "succeeded after %llu iteration%s",
                    (unsigned long long)j->last_iteration, j->last_iteration == 1 ? "" : "s");
  else
    megad_job_event(d, j, kind, NULL, -1, "%s", error ? error : mega_job_state_name(state));
  mega_job_msg m;
  if (mega_job_msg_init(&m, j, NULL) == MEGA_OK) {
    Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
    item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
    item.final_state = &m.job;
    mega_job_hist_push(j, &item, NULL);
    megad_watch_broadcast(d, j, &item);
    mega_job_msg_free(&m);
  }
  for (size_t i = 0; i < run->ncancels; i++)
    if (run->cancels[i].done) run->cancels[i].done(run->cancels[i].arg, j);
  run_free(run);
  megad_schedule(d);
}

/* ---- what the workers say ---- */

static void on_step_merged(coord_run *run, mega_step_done *done) {
  megad *d = run->d;
  mega_job *j = run->job;
  if (done->step->iteration > j->last_iteration) j->last_iteration = done->step->iteration;
  /* how stale a merged step is when it leaves: from the last rank's step end */
  int64_t end_us = 0;
  for (uint32_t r = 0; r < done->world; r++) {
    const Mega__V1__StepReport *rep = done->reports[r];
    int64_t e = rep->step_start_unix_us +
                (int64_t)((rep->metrics ? rep->metrics->step_time_s : 0) * 1e6);
    if (rep->step_start_unix_us && e > end_us) end_us = e;
  }
  if (end_us) {
    j->report_delay_sum_s += (double)(megad_unix_us() - end_us) / 1e6;
    j->report_delay_n++;
  }
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = done->step;
  mega_err e = {0};
  if (mega_job_hist_push(j, &item, &e) != MEGA_OK) megad_warn(d, "job %s: %s", j->id, e.msg);
  megad_watch_broadcast(d, j, &item);
  if (run->trace_iteration > 0 && done->step->iteration == (uint64_t)run->trace_iteration) {
    char *path = NULL;
    if (megad_trace_write(d, j, done, &path, &e) == MEGA_OK)
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                      "trace of iteration %d written to %s (megactl trace %s)",
                      run->trace_iteration, path, j->id);
    else
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                      "could not write the trace of iteration %d: %s", run->trace_iteration, e.msg);
    free(path);
  }
}

void megad_coord_step(megad *d, const char *job_id, uint32_t attempt, const char *node_id,
                      const Mega__V1__StepReport *r) {
  (void)node_id;
  coord_run *run = run_of(d, job_id, attempt);
  if (!run || !r->metrics) return;
  mega_step_done *done = NULL;
  mega_err e = {0};
  if (mega_stepmerge_add(run->merge, r->metrics->rank, r, &done, &e) != MEGA_OK) {
    megad_warn(d, "job %s: %s", job_id, e.msg);
    return;
  }
  if (done) {
    on_step_merged(run, done);
    mega_step_done_free(done);
  }
}

static void exit_cause(coord_run *run, uint32_t rank, const char *node_id,
                       const Mega__V1__RankExit *x, char *buf, size_t len) {
  if (x->term_signal) {
    snprintf(buf, len, "rank %u (node %s) exited with signal %d (%s)", rank, node_id,
             x->term_signal, megad_signal_name(x->term_signal));
    return;
  }
  /* the last stderr line usually says why */
  const char *tail = x->stderr_tail ? x->stderr_tail : "";
  const char *last = strrchr(tail, '\n');
  last = last ? last + 1 : tail;
  snprintf(buf, len, "rank %u (node %s) exited with status %d%s%s", rank, node_id, x->exit_status,
           last[0] ? ": " : "", last);
  (void)run;
}

void megad_coord_event(megad *d, const char *job_id, uint32_t attempt, const char *node_id,
                       const Mega__V1__RankEvent *ev) {
  coord_run *run = run_of(d, job_id, attempt);
  if (!run || ev->rank >= run->world) return;
  mega_job *j = run->job;
  uint32_t r = ev->rank;
  char msg[1600];
  switch (ev->kind_case) {
  case MEGA__V1__RANK_EVENT__KIND_STARTED:
    if (run->hello[r]) break;
    run->hello[r] = true;
    if (++run->nhello == run->world && run->world == 1)
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STARTED, NULL, -1,
                      "rank 0 started");
    else if (run->nhello == run->world)
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STARTED, NULL, -1,
                      "all %u ranks started", run->world);
    break;
  case MEGA__V1__RANK_EVENT__KIND_CHECKPOINT: {
    const Mega__V1__CheckpointDone *c = ev->checkpoint;
    if (c->iteration <= j->ckpt_iteration) break;
    j->ckpt_iteration = c->iteration;
    free(j->ckpt_path);
    j->ckpt_path = megad_strdup(c->path);
    megad_journal_job(d, j, NULL);
    megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CHECKPOINT, node_id, (int)r,
                    "checkpoint of iteration %llu saved in %s (%.1f MB, %.2f s)",
                    (unsigned long long)c->iteration, c->path, (double)c->bytes / 1e6,
                    c->duration_s);
    break;
  }
  case MEGA__V1__RANK_EVENT__KIND_ERROR:
    if (run->stopping || run->errored[r]) break;
    run->errored[r] = true;
    snprintf(msg, sizeof msg, "rank %u (node %s): %s", r, node_id, ev->error->message);
    megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RANK_FAILED, node_id, (int)r,
                    "%s", msg);
    coord_cause(run, ev->error->retryable ? CAUSE_SECONDARY : CAUSE_PRIMARY, msg);
    break;
  case MEGA__V1__RANK_EVENT__KIND_EXIT: {
    const Mega__V1__RankExit *x = ev->exit;
    bool ok = x->exit_status == 0 && x->term_signal == 0;
    if (!ok && !run->stopping && !run->errored[r]) {
      exit_cause(run, r, node_id, x, msg, sizeof msg);
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RANK_FAILED, node_id, (int)r,
                      "%s", msg);
      coord_cause(run, CAUSE_PRIMARY, msg);
    } else if (!ok && !run->stopping) {
      /* it said why before it went; a retryable reason stays secondary */
      coord_cause(run, CAUSE_SECONDARY, run->cause ? run->cause : "a rank failed");
    }
    if ((run = run_of(d, job_id, attempt))) coord_ranks_gone(run, r, 1);
    break;
  }
  default:
    break;
  }
}
