/* mega's two services as method tables for the rpc wrapper: one constant per
 * method, so a typo is a compile error.
 *
 *   mega_rpc_server_handle(srv, &mega_control_get_job, on_get_job, d, &err);
 *   mega_rpc_unary(ch, &mega_control_get_job, &req.base, 5000, &resp, &err);
 *
 * The tables are NULL-terminated lists of every method of a service, in the
 * order of mega.proto. */
#ifndef MEGA_PROTO_MEGA_RPC_H
#define MEGA_PROTO_MEGA_RPC_H

#include "proto/mega.pb-c.h"
#include "proto/rpc.h"

extern const mega_rpc_method mega_control_submit_job;
extern const mega_rpc_method mega_control_get_job;
extern const mega_rpc_method mega_control_list_jobs;
extern const mega_rpc_method mega_control_cancel_job;
extern const mega_rpc_method mega_control_watch_job; /* server stream */
extern const mega_rpc_method mega_control_list_nodes;
extern const mega_rpc_method mega_control_get_trace; /* server stream */
extern const mega_rpc_method mega_control_resume_job;
extern const mega_rpc_method mega_control_rescale_job;
extern const mega_rpc_method mega_control_forget_node;

extern const mega_rpc_method mega_peer_join;
extern const mega_rpc_method mega_peer_heartbeat;
extern const mega_rpc_method mega_peer_leave;
extern const mega_rpc_method mega_peer_launch_ranks;
extern const mega_rpc_method mega_peer_abort_job;
extern const mega_rpc_method mega_peer_report_step;
extern const mega_rpc_method mega_peer_kv_set;
extern const mega_rpc_method mega_peer_kv_get;
extern const mega_rpc_method mega_peer_kv_wait;
extern const mega_rpc_method mega_peer_kv_gather;
extern const mega_rpc_method mega_peer_commit_checkpoint;
extern const mega_rpc_method mega_peer_list_held;
extern const mega_rpc_method mega_peer_prepare_launch;

/* Where every Peer method's path begins: the calls only megads make, which
 * a megad with a peer token lets only that token make (rpc_server.h). */
#define MEGA_PEER_PATH_PREFIX "/mega.v1.Peer/"

extern const mega_rpc_method *const mega_control_methods[];
extern const mega_rpc_method *const mega_peer_methods[];

#endif
