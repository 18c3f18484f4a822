/* The coordinator's launches: each node of an attempt's placement asked
 * to start its ranks (this node's through launch.h, others' over the peer
 * service), and what a failed start means for the attempt. */
#include <stdlib.h>
#include <string.h>

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
  char why[MEGA_ERR_MSG_MAX + 128];
  snprintf(why, sizeof why, "cannot start ranks %u..%u on node %s: %s", first, first + n - 1,
           node_id, msg);
  mega_end_kind kind = launch_failure(s, remote);
  /* a node's own refusal (peer.c: RESOURCE_EXHAUSTED): not there again
   * until a newer view of it; one that did not answer backs off */
  bool refused = remote ? s == MEGA_ERR_NOMEM : s == MEGA_ERR_UNSUPPORTED;
  if (remote && kind == MEGA_END_LAUNCH) coord_refused(run->c, node_id);
  if (kind == MEGA_END_LAUNCH && !refused) run->job->coord.launch_unreached = true;
  coord_cause(run, CAUSE_PRIMARY, kind, why); /* the cause, then the ranks */
  coord_ranks_gone(run, first, n);
}

static void launched(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  launch_ctx *lc = arg;
  coord_run *run = coord_run_of(lc->c, lc->job_id, lc->attempt);
  if (run && err->status != MEGA_OK)
    launch_failed(run, lc->first, lc->n, lc->node_id, err->status, true, err->msg);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(lc->job_id);
  free(lc->node_id);
  free(lc);
}

void coord_launch_on(coord_run *run, const mega_job_node *jn, char **args, size_t nargs,
                      Mega__V1__ReplicaPlan *replicas) {
  megad_coord *c = run->c;
  mega_job *j = run->job;
  uint32_t *ranks = calloc(jn->nranks, sizeof *ranks);
  if (!ranks) {
    launch_failed(run, jn->first_rank, jn->nranks, jn->node_id, MEGA_ERR_NOMEM, false,
                  "out of memory");
    return;
  }
  for (uint32_t i = 0; i < jn->nranks; i++) ranks[i] = jn->first_rank + i;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = j->name;
  spec.args = args;
  spec.n_args = nargs;
  spec.nnodes_min = j->nnodes_min;
  spec.nnodes_max = j->nnodes_max;
  spec.nproc_per_node = j->nproc_per_node;
  spec.max_restarts = j->max_restarts;
  spec.step_timeout_ms = j->step_timeout_ms;
  Mega__V1__Bootstrap boot = MEGA__V1__BOOTSTRAP__INIT;
  boot.kv_address = (char *)c->o.address;
  boot.kv_prefix = run->kv_prefix;
  boot.kv_timeout_ms = c->o.rendezvous_timeout_ms;
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
  req.bootstrap = &boot;
  req.coordinator_node_id = c->b->node_id;
  req.coordinator_address = (char *)c->o.address;
  req.coordinator_fence = j->etcd.fence;
  req.replicas = replicas;
  req.node_id = (char *)jn->node_id;
  mega_err e = {0};
  megad_node *node = megad_members_find(c->members, jn->node_id);
  mega_status rc;
  if (node && node->self) {
    int32_t *pids = calloc(jn->nranks, sizeof *pids);
    rc = pids ? megad_launch_start(c->L, &req, pids, &e)
              : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    free(pids);
  } else {
    launch_ctx *lc = calloc(1, sizeof *lc);
    rc = lc ? MEGA_OK : mega_fail(&e, MEGA_ERR_NOMEM, "out of memory");
    if (lc) {
      *lc = (launch_ctx){c, strdup(j->id), strdup(jn->node_id), j->attempt, jn->first_rank,
                         jn->nranks};
      rc = node ? megad_call(c->b, node->address, &mega_peer_launch_ranks, &req.base, 10000,
                             launched, lc, &e)
                : mega_fail(&e, MEGA_ERR_IO, "the node is not known here");
      if (rc != MEGA_OK) {
        free(lc->job_id);
        free(lc->node_id);
        free(lc);
      }
    }
  }
  free(ranks);
  if (rc != MEGA_OK)
    launch_failed(run, jn->first_rank, jn->nranks, jn->node_id, rc, !(node && node->self), e.msg);
}

