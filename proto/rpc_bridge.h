/* The completion queue -> libuv bridge.
 *
 * gRPC core's completion queue has no pollable fd. A thread loops on
 * grpc_completion_queue_next, pushes each (tag, ok) onto a mutex-protected
 * FIFO and wakes the loop with uv_async_send; the async callback drains the
 * FIFO on the loop thread. Every server handler, cancel callback and async
 * client callback therefore runs on the loop thread, and their state needs no
 * locks.
 *
 * One mega_rpc_cq serves any number of servers and async client calls on one
 * loop. Everything here is called on the loop thread. */
#ifndef MEGA_PROTO_RPC_BRIDGE_H
#define MEGA_PROTO_RPC_BRIDGE_H

#include <uv.h>

#include "proto/rpc.h"

typedef struct mega_rpc_cq mega_rpc_cq;

/* Creates the queue and its thread. The loop must outlive the queue. */
mega_status mega_rpc_cq_new(uv_loop_t *loop, mega_rpc_cq **out, mega_err *err);

/* Shuts the queue down. Call it after every server on it was shut down and
 * every async call on it has called back. The queue keeps delivering until
 * gRPC says it is empty; then its thread is joined, the queue and the async
 * handle are closed, cq is freed, and done(arg) runs (done may be NULL). The
 * loop must keep running until then. */
void mega_rpc_cq_close(mega_rpc_cq *cq, void (*done)(void *arg), void *arg);

uv_loop_t *mega_rpc_cq_loop(const mega_rpc_cq *cq);

#endif
