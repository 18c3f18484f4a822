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
 * every async call on it has called back or been cancelled
 * (mega_rpc_pending_cancel): those call back while the queue drains, and
 * start nothing more on it. From here on, async calls on cq are refused.
 * The queue keeps delivering until gRPC says it is empty; then its thread is
 * joined, the queue and the async handle are closed, cq is freed, and
 * done(arg) runs (done may be NULL). The loop must keep running until then. */
void mega_rpc_cq_close(mega_rpc_cq *cq, void (*done)(void *arg), void *arg);

/* Whether mega_rpc_cq_close was called (true for NULL, a queue its owner
 * already closed): gRPC aborts the process when a batch starts on a queue
 * that was shut down and has nothing pending. */
bool mega_rpc_cq_closing(const mega_rpc_cq *cq);

/* Completions the queue's thread took from gRPC that the loop has not run
 * yet: lets a test wait for an answer to arrive without running the loop. */
size_t mega_rpc_cq_queued(mega_rpc_cq *cq);

uv_loop_t *mega_rpc_cq_loop(const mega_rpc_cq *cq);

#endif
