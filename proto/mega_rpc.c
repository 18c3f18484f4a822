#include "proto/mega_rpc.h"

#define METHOD(var, service, name, req, resp, kind)                                     \
  const mega_rpc_method var = {"/mega.v1." service "/" name, &mega__v1__##req##__descriptor, \
                               &mega__v1__##resp##__descriptor, kind}

METHOD(mega_control_submit_job, "Control", "SubmitJob", submit_job_request, submit_job_response, MEGA_RPC_UNARY);
METHOD(mega_control_get_job, "Control", "GetJob", get_job_request, get_job_response, MEGA_RPC_UNARY);
METHOD(mega_control_list_jobs, "Control", "ListJobs", list_jobs_request, list_jobs_response, MEGA_RPC_UNARY);
METHOD(mega_control_cancel_job, "Control", "CancelJob", cancel_job_request, cancel_job_response, MEGA_RPC_UNARY);
METHOD(mega_control_watch_job, "Control", "WatchJob", watch_job_request, watch_job_response, MEGA_RPC_SERVER_STREAM);
METHOD(mega_control_list_nodes, "Control", "ListNodes", list_nodes_request, list_nodes_response, MEGA_RPC_UNARY);
METHOD(mega_control_get_trace, "Control", "GetTrace", get_trace_request, trace_chunk, MEGA_RPC_SERVER_STREAM);
METHOD(mega_control_resume_job, "Control", "ResumeJob", resume_job_request, resume_job_response, MEGA_RPC_UNARY);
METHOD(mega_control_rescale_job, "Control", "RescaleJob", rescale_job_request, rescale_job_response, MEGA_RPC_UNARY);
METHOD(mega_control_forget_node, "Control", "ForgetNode", forget_node_request, forget_node_response, MEGA_RPC_UNARY);

METHOD(mega_peer_join, "Peer", "Join", join_request, join_response, MEGA_RPC_UNARY);
METHOD(mega_peer_heartbeat, "Peer", "Heartbeat", heartbeat_request, heartbeat_response, MEGA_RPC_UNARY);
METHOD(mega_peer_leave, "Peer", "Leave", leave_request, leave_response, MEGA_RPC_UNARY);
METHOD(mega_peer_launch_ranks, "Peer", "LaunchRanks", launch_ranks_request, launch_ranks_response, MEGA_RPC_UNARY);
METHOD(mega_peer_abort_job, "Peer", "AbortJob", abort_job_request, abort_job_response, MEGA_RPC_UNARY);
METHOD(mega_peer_report_step, "Peer", "ReportStep", report_step_request, report_step_response, MEGA_RPC_UNARY);
METHOD(mega_peer_kv_set, "Peer", "KvSet", kv_set_request, kv_set_response, MEGA_RPC_UNARY);
METHOD(mega_peer_kv_get, "Peer", "KvGet", kv_get_request, kv_get_response, MEGA_RPC_UNARY);
METHOD(mega_peer_kv_wait, "Peer", "KvWait", kv_wait_request, kv_wait_response, MEGA_RPC_UNARY);
METHOD(mega_peer_kv_gather, "Peer", "KvGather", kv_gather_request, kv_gather_response, MEGA_RPC_UNARY);
METHOD(mega_peer_commit_checkpoint, "Peer", "CommitCheckpoint", commit_checkpoint_request, commit_checkpoint_response, MEGA_RPC_UNARY);
METHOD(mega_peer_list_held, "Peer", "ListHeld", list_held_request, list_held_response,
       MEGA_RPC_UNARY);
METHOD(mega_peer_prepare_launch, "Peer", "PrepareLaunch", launch_ranks_request,
       prepare_launch_response, MEGA_RPC_UNARY);

const mega_rpc_method *const mega_control_methods[] = {
    &mega_control_submit_job, &mega_control_get_job,    &mega_control_list_jobs,
    &mega_control_cancel_job, &mega_control_watch_job,  &mega_control_list_nodes,
    &mega_control_get_trace,  &mega_control_resume_job, &mega_control_rescale_job,
    &mega_control_forget_node, NULL,
};

const mega_rpc_method *const mega_peer_methods[] = {
    &mega_peer_join,        &mega_peer_heartbeat,   &mega_peer_leave,
    &mega_peer_launch_ranks, &mega_peer_abort_job,  &mega_peer_report_step,
    &mega_peer_commit_checkpoint, &mega_peer_kv_set, &mega_peer_kv_get,
    &mega_peer_kv_wait,     &mega_peer_kv_gather,   &mega_peer_list_held,
    &mega_peer_prepare_launch,
    NULL,
};
