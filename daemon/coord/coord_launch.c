/* The coordinator's launches. An attempt starts in two rounds: every node
 * of its placement is asked whether it would start its ranks (this node's
 * launcher directly, the others over Peer PrepareLaunch, the request
 * LaunchRanks will carry), and only once all said yes are they asked to
 * start them. A node that refuses in the first round is the attempt's cause
 * and no rank starts anywhere; one that refuses the second (its slots taken
 * meanwhile, or stopping) is the cause too, and the ranks started elsewhere
 * are stopped at once, as for any failure. In the first round each node
 * also says what its own files give the job (its vocabulary), and nodes
 * that disagree fail the job before any rank starts. */
#include <stdlib.h>
#include <string.h>

#include "core/jobspec.h"
#include "core/version.h"
#include "daemon/coord/coord_internal.h"

typedef struct launch_ctx {
  megad_coord *c;
  char *job_id, *node_id;
  uint32_t attempt, first, n;
} launch_ctx;

/* Why a node could not start its ranks: not reachable yet, busy or
 * stopping (the job waits and is placed again), or a problem of the job or
 * the node that a retry would meet again (bad files, megaw missing): the
 * job fails. Over the wire a node's refusal is INVALID or INTERNAL, an
 * unreachable node IO (UNAVAILABLE) or TIMEOUT, a busy one NOMEM. */
static mega_end_kind launch_failure(mega_status s, bool remote) {
  if (s == MEGA_ERR_INVALID || s == MEGA_ERR_INTERNAL) return MEGA_END_FATAL;
  if (!remote && s == MEGA_ERR_IO) return MEGA_END_FATAL;
  return MEGA_END_LAUNCH;
}

static void launch_failed(coord_run *run, uint32_t first, uint32_t n, const char *node_id,
                          mega_status s, bool remote, const char *msg) {
  char why[MEGA_ERR_MSG_MAX + 192];
  bool preparing = run->preparing;
  snprintf(why, sizeof why, "cannot start ranks %u..%u on node %s: %s%s", first, first + n - 1,
           node_id, msg, preparing ? "; no node launched a rank of the attempt" : "");
  mega_end_kind kind = launch_failure(s, remote);
  /* a node's own refusal (peer.c: RESOURCE_EXHAUSTED): not there again
   * until a newer view of it; one that did not answer backs off */
  bool refused = remote ? s == MEGA_ERR_NOMEM : s == MEGA_ERR_UNSUPPORTED;
  if (remote && kind == MEGA_END_LAUNCH) coord_refused(run->c, node_id);
  if (kind == MEGA_END_LAUNCH && !refused) run->job->coord.launch_unreached = true;
  /* the cause, then the ranks; while preparing the stop counts every rank
   * gone (none started) and ends the attempt */
  coord_cause(run, CAUSE_PRIMARY, kind, why);
  if (!preparing) coord_ranks_gone(run, first, n);
}

/* The LaunchRanksRequest for jn's node, pointing into m (and the run). */
typedef struct launch_msg {
  Mega__V1__JobSpec spec;
  Mega__V1__Bootstrap boot;
  Mega__V1__LaunchRanksRequest req;
  uint32_t *ranks;
} launch_msg;

static bool launch_msg_init(launch_msg *m, coord_run *run, const mega_job_node *jn) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  if (!(m->ranks = calloc(jn->nranks, sizeof *m->ranks))) return false;
  for (uint32_t i = 0; i < jn->nranks; i++) m->ranks[i] = jn->first_rank + i;
  mega__v1__job_spec__init(&m->spec);
  m->spec.name = j->name;
  m->spec.args = run->args;
  m->spec.n_args = run->nargs;
  m->spec.nnodes_min = j->nnodes_min;
  m->spec.nnodes_max = j->nnodes_max;
  m->spec.nproc_per_node = j->nproc_per_node;
  m->spec.max_restarts = j->max_restarts;
  m->spec.step_timeout_ms = j->step_timeout_ms;
  mega__v1__bootstrap__init(&m->boot);
  m->boot.kv_prefix = run->kv_prefix;
  m->boot.kv_timeout_ms = c->o.rendezvous_timeout_ms;
  Mega__V1__LaunchRanksRequest *req = &m->req;
  mega__v1__launch_ranks_request__init(req);
  req->job_id = j->id;
  req->attempt = j->attempt;
  req->spec = &m->spec;
  req->world_size = j->world;
  req->tp = j->tp;
  req->pp = j->pp;
  req->dp = j->dp;
  req->ranks = m->ranks;
  req->n_ranks = jn->nranks;
  req->bootstrap = &m->boot;
  req->coordinator_node_id = c->b->node_id;
  req->coordinator_address = (char *)c->o.address;
  req->coordinator_fence = j->etcd.fence;
  req->replicas = run->plan;
  req->node_id = (char *)jn->node_id;
  req->coordinator_version = (char *)mega_version();
  return true;
}

static void each_node(megad_coord *c, const char *job_id, uint32_t attempt, bool prepare);

static void vocab_text(const megad_launch_files *f, char *buf, size_t len) {
  if (f->eod_id >= 0) snprintf(buf, len, "%d entries (<|endoftext|> %d)", f->vocab_entries, f->eod_id);
  else snprintf(buf, len, "%d entries (no <|endoftext|>)", f->vocab_entries);
}

/* What node_id's files give the job must be what the first node's gave:
 * ranks that build other embeddings meet in collectives of other sizes
 * (Gloo's agreement names the calls, NCCL hangs or reads past them) or
 * train apart. A node of an older megad answers nothing (0). Returns false
 * after failing the attempt (as fatal: a retry reads the same files). */
static bool files_agree(coord_run *run, const char *node_id, const megad_launch_files *f,
                        uint32_t first, uint32_t n) {
  if (!f->vocab_entries) return true;
  if (!run->files_node[0]) {
    run->files = *f;
    snprintf(run->files_node, sizeof run->files_node, "%s", node_id);
    return true;
  }
  if (run->files.vocab_entries == f->vocab_entries && run->files.eod_id == f->eod_id) return true;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  bool parsed = mega_jobspec_parse(&s, (int)run->nargs, run->args, NULL) == MEGA_OK;
  char mine[96], theirs[96], msg[MEGA_ERR_MSG_MAX];
  vocab_text(f, mine, sizeof mine);
  vocab_text(&run->files, theirs, sizeof theirs);
  snprintf(msg, sizeof msg, "its --vocab-file %s holds %s, and node %s's %s: the nodes of a job "
           "must read the same vocabulary (its size shapes the model every rank builds); give "
           "every node the same file", parsed && s.vocab_file ? s.vocab_file : "",
           mine, run->files_node, theirs);
  mega_jobspec_free(&s);
  launch_failed(run, first, n, node_id, MEGA_ERR_INVALID, false, msg);
  return false;
}

/* A node said yes to the first round; after the last, the second starts. */
static void node_prepared(coord_run *run) {
  if (run->unprepared && --run->unprepared) return;
  run->preparing = false;
  char id[256]; /* a copy: once the attempt ends the job may be forgotten */
  snprintf(id, sizeof id, "%s", run->job->id);
  each_node(run->c, id, run->job->attempt, false);
}

static void answered(void *arg, ProtobufCMessage *resp, const mega_err *err, bool prepare) {
  launch_ctx *lc = arg;
  coord_run *run = coord_run_of(lc->c, lc->job_id, lc->attempt);
  /* a megad without PrepareLaunch (an older one) checks at the launch */
  bool ok = err->status == MEGA_OK || (prepare && err->status == MEGA_ERR_UNSUPPORTED);
  if (run && !run->stopping && prepare == run->preparing) {
    megad_launch_files f = {0, -1};
    if (prepare && err->status == MEGA_OK && resp) {
      const Mega__V1__PrepareLaunchResponse *pr = (const void *)resp;
      f = (megad_launch_files){pr->vocab_entries, pr->eod_id};
    }
    if (!ok) launch_failed(run, lc->first, lc->n, lc->node_id, err->status, true, err->msg);
    else if (prepare && files_agree(run, lc->node_id, &f, lc->first, lc->n)) node_prepared(run);
  } else if (run && !ok && !prepare) { /* stopping: the node's ranks never started */
    coord_ranks_gone(run, lc->first, lc->n);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(lc->job_id);
  free(lc->node_id);
  free(lc);
}

static void prepared(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  answered(arg, resp, err, true);
}

static void launched(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  answered(arg, resp, err, false);
}

/* Asks jn's node to check (prepare) or start its ranks of run's attempt:
 * here at once, elsewhere over the peer service. */
static void ask_node(coord_run *run, const mega_job_node *jn, bool prepare) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  launch_msg m;
  mega_err e = {0};
  megad_node *node = megad_members_find(c->members, jn->node_id);
  bool here = node && node->self, remote = !here;
  mega_status rc;
  megad_launch_files files = {0, -1};
  if (!launch_msg_init(&m, run, jn)) {
    rc = mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    remote = false;
  } else if (here && prepare) {
    rc = megad_launch_check(c->L, &m.req, &files, &e);
  } else if (here) {
    int32_t *pids = calloc(jn->nranks, sizeof *pids);
    rc = pids ? megad_launch_start(c->L, &m.req, pids, &e)
              : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    free(pids);
  } else {
    launch_ctx *lc = calloc(1, sizeof *lc);
    rc = lc ? MEGA_OK : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    if (lc) {
      *lc = (launch_ctx){c, strdup(j->id), strdup(jn->node_id), j->attempt, jn->first_rank,
                         jn->nranks};
      rc = node ? megad_call(c->b, node->address,
                             prepare ? &mega_peer_prepare_launch : &mega_peer_launch_ranks,
                             &m.req.base, 10000, prepare ? prepared : launched, lc, &e)
                : mega_fail(&e, MEGA_ERR_IO, "the node is not known here");
      if (rc != MEGA_OK) {
        free(lc->job_id);
        free(lc->node_id);
        free(lc);
      }
    }
  }
  free(m.ranks);
  if (rc != MEGA_OK) launch_failed(run, jn->first_rank, jn->nranks, jn->node_id, rc, remote, e.msg);
  else if (here && prepare && files_agree(run, jn->node_id, &files, jn->first_rank, jn->nranks))
    node_prepared(run);
}

/* One round over the placement. The run is looked up again before each
 * node: a refusal may have ended the attempt, and its end started the next
 * one. Past a failed start the rest are not started: their ranks count as
 * gone, and the last of them ends the attempt. */
static void each_node(megad_coord *c, const char *job_id, uint32_t attempt, bool prepare) {
  for (size_t i = 0;; i++) {
    coord_run *run = coord_run_of(c, job_id, attempt);
    if (!run || i >= run->job->nplaced || prepare != run->preparing) return;
    const mega_job_node *jn = &run->job->placement[i];
    if (!run->stopping) ask_node(run, jn, prepare);
    else if (!prepare) coord_ranks_gone(run, jn->first_rank, jn->nranks);
    else return;
  }
}

void coord_launch_attempt(coord_run *run, char **args, size_t nargs) {
  mega_job *j = run->job;
  run->args = args;
  run->nargs = nargs;
  run->preparing = true;
  run->unprepared = (uint32_t)j->nplaced;
  char id[256];
  snprintf(id, sizeof id, "%s", j->id);
  each_node(run->c, id, j->attempt, true);
}
