/* A small server on the real Control service, for testing the rpc wrapper
 * (in C and from Python grpcio). Its handlers answer from an in-memory job
 * table; they are test code, not the daemon.
 *
 *   SubmitJob  stores a job ("j-1", "j-2", ...); a spec without a name is
 *              INVALID_ARGUMENT
 *   GetJob     NOT_FOUND for unknown ids; "j-slow" never answers (until
 *              cancelled: deadline and cancel tests)
 *   ListJobs   every job, optionally filtered by state
 *   CancelJob  answers 20 ms later from a timer (an asynchronous answer)
 *   WatchJob   --train-iters N > 0: N steps queued at once, an event, the
 *              final state; N = 0: a step every 5 ms until cancelled, and
 *              then the job's state becomes CANCELLED
 *   ListNodes  one node, "test-node"
 *   GetTrace   3 MiB in 64 KiB chunks, byte i being (i * 7 + 3) % 251
 *
 * All on the loop thread of the cq it is given. */
#ifndef MEGA_TESTS_PROTO_TESTSRV_H
#define MEGA_TESTS_PROTO_TESTSRV_H

#include <stdatomic.h>

#include "proto/rpc_server.h"

#define TESTSRV_TRACE_BYTES (3u << 20)
#define TESTSRV_TRACE_CHUNK (64u << 10)

typedef struct testsrv_stats {
  atomic_int cancels;       /* cancel callbacks run */
  atomic_int handled;       /* handler invocations */
  atomic_int max_queued;    /* the deepest a stream's write queue got */
  atomic_int streams_open;  /* WatchJob and GetTrace calls not yet ended */
} testsrv_stats;

typedef struct testsrv testsrv;

/* max_message_bytes 0: the wrapper's default. stats (the caller's, zeroed)
 * is updated on the loop thread and outlives the server. */
mega_status testsrv_new(mega_rpc_cq *cq, const char *addr, size_t max_message_bytes,
                        testsrv_stats *stats, int *port, testsrv **out, mega_err *err);
/* Shuts the server down and frees everything; done runs at the end. */
void testsrv_shutdown(testsrv *t, unsigned grace_ms, void (*done)(void *), void *arg);

#endif
