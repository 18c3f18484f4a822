/* What the rpc wrapper's end-to-end tests (test_rpc.c, test_rpc_async.c)
 * share: a test server (testsrv.c) on a thread and loop of its own, a client
 * loop on the test's thread for the async client, and one server with one
 * channel to it for a whole cmocka group.
 *
 * Pass rpc_group_setup and rpc_group_teardown to cmocka_run_group_tests;
 * between them S is the server and CH a channel to it ("megad" in error
 * sentences). The tests of a group share both, and the jobs each leaves in
 * the server's table. The helpers fail the running test (cmocka) rather
 * than return errors. */
#ifndef MEGA_TESTS_PROTO_RPC_FIXTURE_H
#define MEGA_TESTS_PROTO_RPC_FIXTURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "proto/rpc_client.h"
#include "testsrv.h"

double now_ms(void); /* CLOCK_MONOTONIC */
/* Waits up to 5 s for *v to reach want; false if it did not. */
bool wait_atomic(atomic_int *v, int want);

/* A test server on its own thread and loop. Read stats (atomics) from any
 * thread; the rest is set before srv_start returns and fixed after. */
typedef struct srv_thread {
  uv_thread_t th;
  uv_loop_t loop;
  uv_async_t stop;
  uv_sem_t ready;
  mega_rpc_cq *cq;
  testsrv *srv;
  testsrv_stats stats;
  char addr[128];
  char target[160]; /* what a channel dials: 127.0.0.1:PORT, or the unix: address */
  size_t max_msg;
  unsigned grace_ms;
  int port;
  mega_status st;
  mega_err err;
} srv_thread;

/* addr "127.0.0.1:0" (a free port) or "unix:PATH"; max_msg 0: the wrapper's
 * default; grace_ms: how long shutdown lets calls in flight finish. */
srv_thread *srv_start(const char *addr, size_t max_msg, unsigned grace_ms);
/* Shuts the server down, joins its thread and frees s. */
void srv_stop_join(srv_thread *s);

/* A loop and completion queue on the test's thread, for the async client:
 * callbacks run only inside cl_run_until and cl_close. */
typedef struct client_loop {
  uv_loop_t loop;
  mega_rpc_cq *cq;
} client_loop;

void cl_open(client_loop *cl);
/* Runs the loop until *counter (a callback's) reaches want. */
void cl_run_until(client_loop *cl, const int *counter, int want);
/* Closes the queue and the loop; fails if a handle is left open. */
void cl_close(client_loop *cl);

/* The group's server and channel, between setup and teardown. */
extern srv_thread *S;
extern mega_rpc_channel *CH;

#define SERVER_MAX_MSG (8u << 20) /* S's message limit */

/* Setup starts S and opens CH (and ignores SIGPIPE); teardown frees both
 * and fails if the wrapper still holds anything after 5 s. */
int rpc_group_setup(void **state);
int rpc_group_teardown(void **state);

/* Submits a job named name with --train-iters iters to S over CH; returns
 * its id (the caller frees it). */
char *submit(const char *name, const char *iters);

#endif
