/* The coordinator, first half: a submitted job is checked, journaled and
 * queued; pending jobs start in FIFO order when the cluster has the slots;
 * a started job is placed (daemon/placement), and each node of the placement
 * is told to launch its ranks, with the Gloo rendezvous under a key-value
 * prefix of its own. (coord_run.c follows the attempt from there.) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/jobspec.h"
#include "daemon/coord.h"
#include "daemon/placement.h"
#include "daemon/util.h"

/* ---- events ---- */

void megad_job_event(megad *d, mega_job *j, Mega__V1__JobEventKind kind, const char *node_id,
                     int rank, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.time_unix_ms = megad_unix_ms();
  ev.kind = kind;
  ev.message = msg;
  ev.node_id = (char *)(node_id ? node_id : "");
  ev.has_rank = rank >= 0;
  ev.rank = rank >= 0 ? (uint32_t)rank : 0;
  ev.attempt = j->attempt;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  mega_err e = {0};
  if (mega_job_hist_push(j, &item, &e) != MEGA_OK) megad_warn(d, "job %s: %s", j->id, e.msg);
  uint8_t *buf;
  size_t len;
  if (d->journal && mega_jrec_event(j->id, &ev, &buf, &len, &e) == MEGA_OK) {
    if (mega_journal_append(d->journal, buf, len, &e) != MEGA_OK) megad_warn(d, "journal: %s", e.msg);
    free(buf);
  }
  megad_log(d, "job %s: %s", j->id, msg);
  megad_watch_broadcast(d, j, &item);
}

/* ---- checking a spec ---- */

typedef struct spec_info {
  int nproc, nmin, nmax;
  int tp, pp, vp, train_iters, trace_iteration;
} spec_info;

/* The check megactl and megaw make too (core/jobspec), on the data file
 * when this node can see it. */
static mega_status check_world(const mega_jobspec *s, int world, mega_err *err) {
  struct stat st;
  long long bytes = s->data_path && stat(s->data_path, &st) == 0 && S_ISREG(st.st_mode)
                        ? (long long)st.st_size
                        : -1;
  return mega_jobspec_check_all(s, world, bytes, err);
}

static mega_status parse_spec(megad *d, uint32_t nargs, char **args, uint32_t nproc,
                              uint32_t nmin, uint32_t nmax, int world, spec_info *info,
                              mega_err *err) {
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_status rc = mega_jobspec_parse(&s, (int)nargs, args, err);
  if (rc == MEGA_OK) {
    info->nproc = nproc ? (int)nproc : (int)megad_self(d)->slots;
    info->nmin = nmin ? (int)nmin : 1;
    info->nmax = nmax ? (int)nmax : info->nmin;
    info->tp = s.tensor_model_parallel_size;
    info->pp = s.pipeline_model_parallel_size;
    info->vp = mega_jobspec_vp(&s);
    info->train_iters = s.train_iters;
    info->trace_iteration = s.trace_iteration;
    if (info->nmax < info->nmin) {
      rc = mega_fail(err, MEGA_ERR_INVALID, "--nnodes %d:%d: MAX is below MIN", info->nmin,
                     info->nmax);
    } else if (world > 0) {
      rc = check_world(&s, world, err);
    } else {
      /* Before placement: some node count in range must give a valid world. */
      rc = check_world(&s, info->nmin * info->nproc, err);
      for (int n = info->nmax; rc != MEGA_OK && n > info->nmin; n--)
        if (check_world(&s, n * info->nproc, NULL) == MEGA_OK) rc = MEGA_OK;
    }
  }
  mega_jobspec_free(&s);
  return rc;
}

mega_status megad_submit(megad *d, const Mega__V1__JobSpec *spec, mega_job **out, mega_err *err) {
  *out = NULL;
  if (d->stopping)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "megad on %s is shutting down", d->node_id);
  if (!spec) return mega_fail(err, MEGA_ERR_INVALID, "SubmitJob needs a job spec");
  spec_info info;
  mega_status rc = parse_spec(d, (uint32_t)spec->n_args, spec->args, spec->nproc_per_node,
                              spec->nnodes_min, spec->nnodes_max, 0, &info, err);
  if (rc != MEGA_OK) return rc;
  char id[128];
  mega_jobs_next_id(&d->jobs, d->node_id, id, sizeof id);
  mega_job *j;
  if ((rc = mega_job_new(id, spec, d->node_id, megad_unix_ms(), &j, err)) != MEGA_OK) return rc;
  j->train_iters = (uint64_t)info.train_iters;
  j->tp = (uint32_t)info.tp;
  j->pp = (uint32_t)info.pp;
  j->vp = (uint32_t)info.vp;
  if ((rc = megad_journal_job(d, j, err)) != MEGA_OK || (rc = mega_jobs_add(&d->jobs, j, err)) != MEGA_OK) {
    mega_job_free(j);
    return rc;
  }
  megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED, d->node_id, -1,
                  "submitted%s%s: %d node%s x %d rank%s, TP %d, PP %d, %d iterations",
                  j->name[0] ? " as " : "", j->name, info.nmin, info.nmin == 1 ? "" : "s",
                  info.nproc, info.nproc == 1 ? "" : "s", info.tp, info.pp, info.train_iters);
  *out = j;
  return MEGA_OK;
}

/* ---- placement ---- */

uint32_t megad_coord_slots_on(megad *d, const char *node_id) {
  uint32_t n = 0;
  for (size_t i = 0; i < d->jobs.n; i++) {
    const mega_job *j = d->jobs.v[i];
    if (!j->rt) continue;
    for (size_t k = 0; k < j->nplaced; k++)
      if (!strcmp(j->placement[k].node_id, node_id)) n += j->placement[k].nranks;
  }
  return n;
}

/* Picks the nodes: out gets node indexes, *n their count. */
/* With empty, every alive node's slots count as free: whether the job could
 * run at all on today's nodes. */
static mega_status place_on(megad *d, const spec_info *info, bool empty, int *out, int *n,
                            mega_err *err) {
  mega_node_slots *ns = calloc(d->nnodes, sizeof *ns);
  if (!ns) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < d->nnodes; i++) {
    megad_node *nd = d->nodes[i];
    uint32_t used = nd->slots_used, mine = megad_coord_slots_on(d, nd->id);
    if (!nd->self && mine > used) used = mine; /* its heartbeat may not show them yet */
    if (empty) used = 0;
    ns[i].name = nd->id;
    ns[i].free_slots = used >= nd->slots ? 0 : (int)(nd->slots - used);
    ns[i].alive = nd->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  }
  mega_placement_req req = {.nnodes_min = info->nmin, .nnodes_max = info->nmax,
                            .nproc_per_node = info->nproc, .model_parallel = info->tp * info->pp,
                            .prefer = d->node_id};
  mega_status rc = mega_place(ns, (int)d->nnodes, &req, out, n, err);
  free(ns);
  return rc;
}

static mega_status place(megad *d, const spec_info *info, int *out, int *n, mega_err *err) {
  return place_on(d, info, false, out, n, err);
}

/* A pending job that could not run even on an idle cluster waits for nodes
 * to join, but does not hold up the jobs behind it. */
static bool blocks_queue(megad *d, mega_job *j) {
  spec_info info;
  int *idx = calloc(d->nnodes ? d->nnodes : 1, sizeof *idx), n = 0;
  bool fits = idx &&
              parse_spec(d, (uint32_t)j->nargs, j->args, j->nproc_per_node, j->nnodes_min,
                         j->nnodes_max, 0, &info, NULL) == MEGA_OK &&
              place_on(d, &info, true, idx, &n, NULL) == MEGA_OK;
  free(idx);
  return fits;
}

/* ---- launching ---- */

typedef struct launch_ctx {
  megad *d;
  char *job_id, *node_id;
  uint32_t attempt, first, n;
} launch_ctx;

static coord_run *run_of(megad *d, const char *job_id, uint32_t attempt) {
  mega_job *j = mega_jobs_find(&d->jobs, job_id);
  return j && j->rt && j->attempt == attempt ? j->rt : NULL;
}

static void launched(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  launch_ctx *c = arg;
  coord_run *run = run_of(c->d, c->job_id, c->attempt);
  if (run && err->status != MEGA_OK) {
    char msg[MEGA_ERR_MSG_MAX + 128];
    snprintf(msg, sizeof msg, "cannot start ranks %u..%u on node %s: %s", c->first,
             c->first + c->n - 1, c->node_id, err->msg);
    coord_cause(run, CAUSE_PRIMARY, msg); /* first the cause, then the ranks (which may end it) */
    coord_ranks_gone(run, c->first, c->n);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(c->job_id);
  free(c->node_id);
  free(c);
}

static void launch_on(coord_run *run, const mega_job_node *jn) {
  megad *d = run->d;
  mega_job *j = run->job;
  uint32_t *ranks = calloc(jn->nranks, sizeof *ranks);
  if (!ranks) {
    coord_cause(run, CAUSE_PRIMARY, "megad ran out of memory starting the job");
    coord_ranks_gone(run, jn->first_rank, jn->nranks);
    return;
  }
  for (uint32_t i = 0; i < jn->nranks; i++) ranks[i] = jn->first_rank + i;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = j->name;
  spec.args = j->args;
  spec.n_args = j->nargs;
  spec.nnodes_min = j->nnodes_min;
  spec.nnodes_max = j->nnodes_max;
  spec.nproc_per_node = j->nproc_per_node;
  Mega__V1__Bootstrap b = MEGA__V1__BOOTSTRAP__INIT;
  b.comm_backend = "gloo";
  b.kv_address = d->address;
  b.kv_prefix = run->kv_prefix;
  b.kv_timeout_ms = MEGAD_KV_TIMEOUT_MS;
  Mega__V1__LaunchRanksRequest req = MEGA__V1__LAUNCH_RANKS_REQUEST__INIT;
  req.job_id = j->id;
  req.attempt = j->attempt;
  req.spec = &spec;
  req.world_size = j->world;
  req.tp = j->tp;
  req.pp = j->pp;
  req.dp = j->dp;
  req.ranks = ranks;
  req.n_ranks = jn->nranks;
  req.bootstrap = &b;
  req.coordinator_node_id = d->node_id;
  req.coordinator_address = d->address;
  mega_err e = {0};
  megad_node *node = megad_node_find(d, jn->node_id);
  mega_status rc;
  if (node && node->self) {
    int32_t *pids = calloc(jn->nranks, sizeof *pids);
    rc = pids ? megad_launch_start(d, &req, pids, &e) : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    free(pids);
  } else {
    launch_ctx *c = calloc(1, sizeof *c);
    rc = c ? MEGA_OK : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    if (c) {
      *c = (launch_ctx){d, strdup(j->id), strdup(jn->node_id), j->attempt, jn->first_rank, jn->nranks};
      rc = node ? megad_call(d, node, &mega_peer_launch_ranks, &req.base, 10000, launched, c, &e)
                : mega_fail(&e, MEGA_ERR_NOT_FOUND, "the node is not known here");
      if (rc != MEGA_OK) {
        free(c->job_id);
        free(c->node_id);
        free(c);
      }
    }
  }
  free(ranks);
  if (rc != MEGA_OK) {
    char msg[MEGA_ERR_MSG_MAX + 128];
    snprintf(msg, sizeof msg, "cannot start ranks %u..%u on node %s: %s", jn->first_rank,
             jn->first_rank + jn->nranks - 1, jn->node_id, e.msg);
    coord_cause(run, CAUSE_PRIMARY, msg);
    coord_ranks_gone(run, jn->first_rank, jn->nranks);
  }
}

static void abort_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)arg;
  (void)err; /* a node that cannot be reached is handled by its heartbeats */
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
}

void coord_abort_nodes(coord_run *run, const char *reason) {
  megad *d = run->d;
  mega_job *j = run->job;
  Mega__V1__AbortJobRequest req = MEGA__V1__ABORT_JOB_REQUEST__INIT;
  req.job_id = j->id;
  req.attempt = j->attempt;
  req.reason = (char *)reason;
  req.grace_ms = MEGAD_ABORT_GRACE_MS;
  for (size_t i = 0; i < j->nplaced; i++) {
    megad_node *n = megad_node_find(d, j->placement[i].node_id);
    if (!n) continue;
    if (n->self)
      megad_launch_abort(d, j->id, j->attempt, reason, MEGAD_ABORT_GRACE_MS);
    else if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_DEAD &&
             n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
      megad_call(d, n, &mega_peer_abort_job, &req.base, 5000, abort_done, NULL, NULL);
  }
}

/* ---- starting ---- */

static void set_wait(megad *d, mega_job *j, const char *why) {
  if (j->wait && !strcmp(j->wait, why)) return;
  free(j->wait);
  j->wait = strdup(why);
  megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1, "waiting: %s", why);
}

static void fail_pending(megad *d, mega_job *j, const char *why) {
  if (mega_job_transition(j, MEGA_JOB_FAILED, megad_unix_ms(), why, NULL) != MEGA_OK) return;
  megad_journal_job(d, j, NULL);
  megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED, NULL, -1, "%s", why);
  mega_job_msg m;
  if (mega_job_msg_init(&m, j, NULL) == MEGA_OK) {
    Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
    item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
    item.final_state = &m.job;
    megad_watch_broadcast(d, j, &item);
    mega_job_msg_free(&m);
  }
}

/* Returns false when j must keep waiting (and the jobs behind it too). */
static bool try_start(megad *d, mega_job *j) {
  spec_info info;
  mega_err e = {0};
  if (parse_spec(d, (uint32_t)j->nargs, j->args, j->nproc_per_node, j->nnodes_min, j->nnodes_max,
                 0, &info, &e) != MEGA_OK) {
    fail_pending(d, j, e.msg);
    return true;
  }
  int *idx = calloc(d->nnodes, sizeof *idx), n = 0;
  if (!idx) return false;
  mega_status rc = place(d, &info, idx, &n, &e);
  if (rc == MEGA_ERR_UNSUPPORTED) {
    set_wait(d, j, e.msg);
    free(idx);
    return false;
  }
  int world = n * info.nproc;
  if (rc == MEGA_OK)
    rc = parse_spec(d, (uint32_t)j->nargs, j->args, j->nproc_per_node, j->nnodes_min,
                    j->nnodes_max, world, &info, &e);
  if (rc != MEGA_OK) {
    fail_pending(d, j, e.msg);
    free(idx);
    return true;
  }
  mega_job_node *nodes = calloc((size_t)n, sizeof *nodes);
  char where[512] = "";
  size_t off = 0;
  for (int i = 0; nodes && i < n; i++) {
    nodes[i].node_id = d->nodes[idx[i]]->id;
    nodes[i].first_rank = (uint32_t)(i * info.nproc);
    nodes[i].nranks = (uint32_t)info.nproc;
    if (off < sizeof where)
      off += (size_t)snprintf(where + off, sizeof where - off, "%s%s %u..%u on %s", i ? "," : "",
                              info.nproc == 1 ? "rank" : "ranks", nodes[i].first_rank,
                              nodes[i].first_rank + nodes[i].nranks - 1, nodes[i].node_id);
  }
  free(idx);
  if (!nodes || mega_job_place(j, nodes, (size_t)n, (uint32_t)world, (uint32_t)info.tp,
                               (uint32_t)info.pp, (uint32_t)info.vp, &e) != MEGA_OK ||
      mega_job_transition(j, MEGA_JOB_RUNNING, megad_unix_ms(), NULL, &e) != MEGA_OK) {
    free(nodes);
    fail_pending(d, j, e.msg[0] ? e.msg : "out of memory placing the job");
    return true;
  }
  free(nodes);
  free(j->wait);
  j->wait = NULL;
  coord_run *run = coord_run_new(d, j, info.trace_iteration);
  if (!run) {
    megad_warn(d, "job %s: out of memory starting it", j->id);
    return false;
  }
  megad_journal_job(d, j, NULL);
  megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED, NULL, -1,
                  "placed: world %u = TP %u x PP %u x DP %u; %s", j->world, j->tp, j->pp, j->dp,
                  where);
  /* After a failed launch the rest are not started: their ranks count as
   * gone, and the last of them ends the attempt (run is freed then). */
  for (size_t i = 0; i < j->nplaced && (run = j->rt); i++) {
    if (run->stopping) coord_ranks_gone(run, j->placement[i].first_rank, j->placement[i].nranks);
    else launch_on(run, &j->placement[i]);
  }
  return true;
}

void megad_schedule(megad *d) {
  if (d->stopping) return;
  for (size_t i = 0; i < d->jobs.n; i++) {
    mega_job *j = d->jobs.v[i];
    /* FIFO: while the first job waiting for busy slots waits, the rest do too. */
    if (j->state == MEGA_JOB_PENDING && !try_start(d, j) && blocks_queue(d, j)) return;
  }
}

/* ---- cancel and stop ---- */

void megad_cancel(megad *d, mega_job *j, const char *reason,
                  void (*done)(void *arg, mega_job *j), void *arg) {
  char why[512];
  snprintf(why, sizeof why, "cancelled%s%s", reason && reason[0] ? ": " : "",
           reason ? reason : "");
  if (j->state == MEGA_JOB_PENDING) {
    mega_job_transition(j, MEGA_JOB_CANCELLED, megad_unix_ms(), why, NULL);
    megad_journal_job(d, j, NULL);
    megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED, NULL, -1, "%s", why);
    mega_job_msg m;
    if (mega_job_msg_init(&m, j, NULL) == MEGA_OK) {
      Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
      item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
      item.final_state = &m.job;
      megad_watch_broadcast(d, j, &item);
      mega_job_msg_free(&m);
    }
    megad_schedule(d);
  }
  coord_run *run = j->rt;
  if (!run) {
    if (done) done(arg, j);
    return;
  }
  if (done) {
    cancel_wait *v = realloc(run->cancels, (run->ncancels + 1) * sizeof *v);
    if (v) {
      run->cancels = v;
      v[run->ncancels++] = (cancel_wait){done, arg};
    }
  }
  coord_stop(run, MEGA_JOB_CANCELLED, why);
}

void megad_cancel_forget(megad *d, mega_job *j, void *arg) {
  (void)d;
  coord_run *run = j->rt;
  for (size_t i = 0; run && i < run->ncancels; i++)
    if (run->cancels[i].arg == arg) run->cancels[i].done = NULL;
}

void megad_coord_stop_all(megad *d, const char *reason) {
  char why[512];
  snprintf(why, sizeof why, "megad on %s stopped while the job was running (%s)", d->node_id,
           reason);
  for (size_t i = 0; i < d->jobs.n; i++)
    if (d->jobs.v[i]->rt) coord_stop(d->jobs.v[i]->rt, MEGA_JOB_FAILED, why);
}

size_t megad_coord_stopping(megad *d) {
  size_t n = 0;
  for (size_t i = 0; i < d->jobs.n; i++) n += d->jobs.v[i]->rt != NULL;
  return n;
}

void megad_coord_node_lost(megad *d, const char *node_id, const char *why) {
  for (size_t i = 0; i < d->jobs.n; i++) {
    mega_job *j = d->jobs.v[i];
    coord_run *run = j->rt;
    if (!run) continue;
    for (size_t k = 0; k < j->nplaced; k++) {
      if (strcmp(j->placement[k].node_id, node_id)) continue;
      megad_job_event(d, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST, node_id, -1, "%s",
                      why);
      coord_cause(run, CAUSE_PRIMARY, why);
      /* run may be gone now: the job ended with these ranks */
      if (!j->rt) break;
      coord_ranks_gone(run, j->placement[k].first_rank, j->placement[k].nranks);
      break;
    }
  }
}
