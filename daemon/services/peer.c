/* The Peer service's job calls: a coordinator checks, starts, aborts and
 * commits a node's ranks, and nodes report their workers' steps and events
 * to it. */
#include <stdlib.h>
#include <string.h>

#include "daemon/services/services.h"

/* etcd mode: a coordinator whose claim on the job is older than the one
 * this node knows lost the job; nothing it asks for is done. */
static bool stale(megad_services *s, mega_rpc_call *call, const char *job_id, int64_t fence) {
  int64_t now = megad_jobs_coord_rev(s->jobs, job_id);
  if (!now || fence >= now) return false;
  mega_rpc_fail(call, MEGA_RPC_ABORTED,
                "job %s is coordinated under fence %lld now; this call comes from a coordinator "
                "that lost it (fence %lld) and is refused", job_id, (long long)now,
                (long long)fence);
  return true;
}

static void on_launch_ranks(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__LaunchRanksRequest *req = (const void *)msg;
  if (stale(s, call, req->job_id, req->coordinator_fence)) return;
  int32_t *pids = calloc(req->n_ranks ? req->n_ranks : 1, sizeof *pids);
  if (!pids) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  mega_err e = {0};
  if (megad_launch_start(s->L, req, pids, &e) != MEGA_OK) {
    /* slots taken meanwhile, or stopping: the coordinator places the job again */
    mega_rpc_fail(call, e.status == MEGA_ERR_UNSUPPORTED ? MEGA_RPC_RESOURCE_EXHAUSTED
                                                        : mega_rpc_code_from_status(e.status),
                  "%s", e.msg);
    free(pids);
    return;
  }
  Mega__V1__LaunchRanksResponse r = MEGA__V1__LAUNCH_RANKS_RESPONSE__INIT;
  r.pids = pids;
  r.n_pids = req->n_ranks;
  mega_rpc_reply(call, &r.base);
  free(pids);
}

/* The same request, checked and not started: the coordinator launches an
 * attempt only once every node of it passed this. */
static void on_prepare_launch(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__LaunchRanksRequest *req = (const void *)msg;
  if (stale(s, call, req->job_id, req->coordinator_fence)) return;
  mega_err e = {0};
  megad_launch_files files = {0, -1};
  if (megad_launch_check(s->L, req, &files, &e) != MEGA_OK) {
    mega_rpc_fail(call, e.status == MEGA_ERR_UNSUPPORTED ? MEGA_RPC_RESOURCE_EXHAUSTED
                                                        : mega_rpc_code_from_status(e.status),
                  "%s", e.msg);
    return;
  }
  Mega__V1__PrepareLaunchResponse r = MEGA__V1__PREPARE_LAUNCH_RESPONSE__INIT;
  r.vocab_entries = files.vocab_entries;
  r.eod_id = files.eod_id;
  mega_rpc_reply(call, &r.base);
}

static void on_abort_job(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__AbortJobRequest *req = (const void *)msg;
  const char *why = req->reason && req->reason[0] ? req->reason : "aborted";
  unsigned grace = req->grace_ms ? req->grace_ms : MEGAD_ABORT_GRACE_MS;
  if (req->save) megad_launch_stop_graceful(s->L, req->job_id, req->reason);
  else if (req->hold && !req->stale) megad_launch_hold(s->L, req->job_id, req->attempt, why, grace);
  else megad_launch_abort(s->L, req->job_id, req->attempt, req->stale, why, grace);
  Mega__V1__AbortJobResponse r = MEGA__V1__ABORT_JOB_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

/* A coordinator that took a job over, or restarted, asks what this node's
 * ranks of the old attempt hold. */
static void on_list_held(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ListHeldRequest *req = (const void *)msg;
  megad_node *n = req->node_id && req->node_id[0] ? megad_members_find(s->members, req->node_id)
                                                  : NULL;
  /* the steps kept for it go before it starts the next attempt */
  if (n && n->address)
    megad_launch_coord_asked(s->L, req->job_id, req->attempt, n->id, n->address);
  else
    megad_launch_resend_now(s->L, req->job_id);
  Mega__V1__ListHeldResponse *r = megad_launch_held(s->L, req->job_id, req->attempt);
  if (!r) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "node %s is out of memory", s->b->node_id);
    return;
  }
  mega_rpc_reply(call, &r->base);
  free(r);
}

static void on_report_step(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ReportStepRequest *req = (const void *)msg;
  if (req->resent) { /* kept for a coordinator that died: this node took the job over */
    mega_err e = {0};
    if (megad_coord_resent(s->coord, req->job_id, req->attempt, req->world_size, req->node_id,
                           req->steps, req->n_steps, &e) != MEGA_OK) {
      mega_rpc_fail_err(call, &e);
      return;
    }
    Mega__V1__ReportStepResponse r = MEGA__V1__REPORT_STEP_RESPONSE__INIT;
    mega_rpc_reply(call, &r.base);
    return;
  }
  /* Ranks of an attempt that is over (they were launched as it ended, their
   * node was away, or this megad restarted) hear so, and their node aborts
   * them: a stale attempt never reports into a new one. */
  if (!megad_coord_runs(s->coord, req->job_id, req->attempt)) {
    if (megad_coord_keeps(s->coord, req->job_id, req->attempt)) {
      Mega__V1__ReportStepResponse r = MEGA__V1__REPORT_STEP_RESPONSE__INIT;
      mega_rpc_reply(call, &r.base);
      return;
    }
    mega_rpc_fail(call, MEGA_RPC_NOT_FOUND, "node %s runs no attempt %u of job %s",
                  s->b->node_id, req->attempt, req->job_id);
    return;
  }
  for (size_t i = 0; i < req->n_steps; i++)
    megad_coord_step(s->coord, req->job_id, req->attempt, req->node_id, req->steps[i]);
  for (size_t i = 0; i < req->n_events; i++)
    megad_coord_event(s->coord, req->job_id, req->attempt, req->node_id, req->events[i]);
  Mega__V1__ReportStepResponse r = MEGA__V1__REPORT_STEP_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

static void on_commit(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__CommitCheckpointRequest *req = (const void *)msg;
  if (stale(s, call, req->job_id, req->coordinator_fence)) return;
  mega_err e = {0};
  if (megad_launch_commit(s->L, req, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  Mega__V1__CommitCheckpointResponse r = MEGA__V1__COMMIT_CHECKPOINT_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

void megad_peer_register(megad_services *s, mega_rpc_server *srv) {
  mega_rpc_server_handle(srv, &mega_peer_launch_ranks, on_launch_ranks, s, NULL);
  mega_rpc_server_handle(srv, &mega_peer_abort_job, on_abort_job, s, NULL);
  mega_rpc_server_handle(srv, &mega_peer_list_held, on_list_held, s, NULL);
  mega_rpc_server_handle(srv, &mega_peer_prepare_launch, on_prepare_launch, s, NULL);
  mega_rpc_server_handle(srv, &mega_peer_report_step, on_report_step, s, NULL);
  mega_rpc_server_handle(srv, &mega_peer_commit_checkpoint, on_commit, s, NULL);
}
