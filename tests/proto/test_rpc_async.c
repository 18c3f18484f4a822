/* The rpc wrapper's async client end to end on loopback, on a client loop
 * of the test's own, against the group's test server (rpc_fixture.h):
 * parallel unary calls, a stream beside an error, cancelling; a server
 * shut down with calls in flight; and the loopback latency of both
 * clients. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"
#include "rpc_fixture.h"

/* What a test's async calls reported, counted by the callbacks below. */
typedef struct tally {
  int done, ok, items;
  uint64_t last_iter;
  mega_status last;
  char msg[MEGA_ERR_MSG_MAX];
} tally;

static void on_reply(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  tally *t = arg;
  t->done++;
  t->last = err->status;
  snprintf(t->msg, sizeof t->msg, "%s", err->msg);
  if (err->status == MEGA_OK) {
    assert_non_null(resp);
    t->ok++;
    protobuf_c_message_free_unpacked(resp, NULL);
  } else {
    assert_null(resp);
  }
}

static void on_item(void *arg, ProtobufCMessage *msg) {
  tally *t = arg;
  Mega__V1__WatchJobResponse *w = (void *)msg;
  if (w->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) {
    assert_int_equal(w->step->iteration, t->last_iter + 1);
    t->last_iter = w->step->iteration;
  }
  t->items++;
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_end(void *arg, const mega_err *err) {
  tally *t = arg;
  t->done++;
  t->last = err->status;
  snprintf(t->msg, sizeof t->msg, "%s", err->msg);
  if (err->status == MEGA_OK) t->ok++;
}

static void test_async_parallel_unary(void **state) {
  (void)state;
  client_loop cl;
  cl_open(&cl);
  tally t = {0};
  mega_err err;
  Mega__V1__ListNodesRequest nreq = MEGA__V1__LIST_NODES_REQUEST__INIT;
  Mega__V1__SubmitJobRequest sreq = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "parallel";
  sreq.spec = &spec;
  for (int i = 0; i < 40; i++) {
    mega_status st = i % 2 ? mega_rpc_unary_async(CH, cl.cq, &mega_control_list_nodes,
                                                  &nreq.base, 10000, on_reply, &t, NULL, &err)
                           : mega_rpc_unary_async(CH, cl.cq, &mega_control_submit_job,
                                                  &sreq.base, 10000, on_reply, &t, NULL, &err);
    assert_int_equal(st, MEGA_OK);
  }
  cl_run_until(&cl, &t.done, 40);
  assert_int_equal(t.ok, 40);
  cl_close(&cl);
}

static void test_async_stream_and_errors(void **state) {
  (void)state;
  char *id = submit("async-stream", "500");
  client_loop cl;
  cl_open(&cl);
  tally t = {0}, nf = {0};
  mega_err err;
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = id;
  assert_int_equal(mega_rpc_stream_async(CH, cl.cq, &mega_control_watch_job, &req.base, 10000,
                                         on_item, on_end, &t, NULL, &err),
                   MEGA_OK);
  Mega__V1__GetJobRequest g = MEGA__V1__GET_JOB_REQUEST__INIT;
  g.job_id = "j-missing";
  assert_int_equal(mega_rpc_unary_async(CH, cl.cq, &mega_control_get_job, &g.base, 10000,
                                        on_reply, &nf, NULL, &err),
                   MEGA_OK);
  cl_run_until(&cl, &t.done, 1);
  cl_run_until(&cl, &nf.done, 1);
  assert_int_equal(t.last, MEGA_OK);
  assert_int_equal(t.items, 502); /* 500 steps, an event, the final state */
  assert_int_equal(t.last_iter, 500);
  assert_int_equal(nf.last, MEGA_ERR_NOT_FOUND);
  assert_string_equal(nf.msg, "job j-missing not found");

  /* Wrong request type: refused at once, nothing started. */
  mega_status st = mega_rpc_unary_async(CH, cl.cq, &mega_control_get_job, &req.base, 1000,
                                        on_reply, &nf, NULL, &err);
  assert_int_equal(st, MEGA_ERR_INTERNAL);
  cl_close(&cl);
  free(id);
}

typedef struct cancel_ctx {
  mega_rpc_pending *p;
  uv_timer_t timer;
} cancel_ctx;

static void cancel_fire(uv_timer_t *h) {
  cancel_ctx *c = h->data;
  mega_rpc_pending_cancel(c->p);
  uv_close((uv_handle_t *)h, NULL);
}

static void test_async_cancel(void **state) {
  (void)state;
  int cancels = atomic_load(&S->stats.cancels);
  client_loop cl;
  cl_open(&cl);
  tally t = {0};
  mega_err err;
  cancel_ctx c;
  Mega__V1__GetJobRequest g = MEGA__V1__GET_JOB_REQUEST__INIT;
  g.job_id = "j-slow";
  assert_int_equal(mega_rpc_unary_async(CH, cl.cq, &mega_control_get_job, &g.base, 0, on_reply,
                                        &t, &c.p, &err),
                   MEGA_OK);
  uv_timer_init(&cl.loop, &c.timer);
  c.timer.data = &c;
  uv_timer_start(&c.timer, cancel_fire, 100, 0);
  cl_run_until(&cl, &t.done, 1);
  assert_int_equal(t.last, MEGA_ERR_CANCELLED);
  assert_true(wait_atomic(&S->stats.cancels, cancels + 1));
  cl_close(&cl);
}

/* ---- a queue closed with answers not yet run ---- */

/* Waits up to 5 s, without running the loop, for cq to hold n completions. */
static bool wait_queued(mega_rpc_cq *cq, size_t n) {
  for (int i = 0; i < 500 && mega_rpc_cq_queued(cq) < n; i++) usleep(10000);
  return mega_rpc_cq_queued(cq) >= n;
}

/* megad's stop cancels its calls and closes the queue at once: a stream's
 * message and its end may then already wait in the queue. The message's
 * callback must start no further read, since gRPC aborts the process on a
 * batch started on a queue that is shut down with nothing pending. */
static void test_async_close_with_message_queued(void **state) {
  (void)state;
  char *id = submit("queued-at-close", "0"); /* a watch that never ends */
  client_loop cl;
  cl_open(&cl);
  tally t = {0};
  mega_err err;
  mega_rpc_pending *p = NULL;
  Mega__V1__WatchJobRequest w = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  w.job_id = id;
  assert_int_equal(mega_rpc_stream_async(CH, cl.cq, &mega_control_watch_job, &w.base, 0, on_item,
                                         on_end, &t, &p, &err),
                   MEGA_OK);
  assert_true(wait_queued(cl.cq, 2)); /* the request sent, the first message in */
  mega_rpc_pending_cancel(p);
  assert_true(wait_queued(cl.cq, 3)); /* and the status */
  cl_close(&cl);                      /* runs all three on a shut-down queue */
  assert_int_equal(t.items, 1);
  assert_int_equal(t.done, 1);
  assert_int_equal(t.last, MEGA_ERR_CANCELLED);
  free(id);
}

/* A call started on a closing (or closed: NULL) queue is refused, not left
 * to gRPC's abort or a crash. */
static void test_async_refused_on_closing_queue(void **state) {
  (void)state;
  client_loop cl;
  cl_open(&cl);
  tally t = {0};
  mega_err err;
  mega_rpc_cq_close(cl.cq, NULL, NULL);
  Mega__V1__ListNodesRequest n = MEGA__V1__LIST_NODES_REQUEST__INIT;
  assert_int_equal(mega_rpc_unary_async(CH, cl.cq, &mega_control_list_nodes, &n.base, 1000,
                                        on_reply, &t, NULL, &err),
                   MEGA_ERR_CANCELLED);
  assert_non_null(strstr(err.msg, "completion queue is closing"));
  Mega__V1__WatchJobRequest w = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  w.job_id = "j-1";
  assert_int_equal(mega_rpc_stream_async(CH, cl.cq, &mega_control_watch_job, &w.base, 0, on_item,
                                         on_end, &t, NULL, &err),
                   MEGA_ERR_CANCELLED);
  /* megad_base_close_cq hands its queue to the close and keeps NULL */
  assert_int_equal(mega_rpc_unary_async(CH, NULL, &mega_control_list_nodes, &n.base, 1000,
                                        on_reply, &t, NULL, &err),
                   MEGA_ERR_CANCELLED);
  uv_run(&cl.loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&cl.loop), 0);
  assert_int_equal(t.done, 0);
}

/* ---- shutdown with calls in flight ---- */

static void test_shutdown_with_calls_in_flight(void **state) {
  (void)state;
  /* a grace of 50 times the cancel's 20 ms: under valgrind on a loaded
   * machine 100 ms was sometimes not enough for the reply to go out */
  srv_thread *s2 = srv_start("127.0.0.1:0", 0, 1000);
  mega_rpc_channel *ch;
  mega_err err;
  assert_int_equal(mega_rpc_channel_new(s2->target, NULL, &ch, &err), MEGA_OK);
  /* A job whose watch never ends. */
  Mega__V1__SubmitJobRequest sreq = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "forever";
  sreq.spec = &spec;
  ProtobufCMessage *resp;
  assert_int_equal(mega_rpc_unary(ch, &mega_control_submit_job, &sreq.base, 5000, &resp, &err),
                   MEGA_OK);
  char *id = strdup(((Mega__V1__SubmitJobResponse *)resp)->job->id);
  protobuf_c_message_free_unpacked(resp, NULL);

  client_loop cl;
  cl_open(&cl);
  tally watch = {0}, slow = {0}, cancel = {0};
  Mega__V1__WatchJobRequest w = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  w.job_id = id;
  assert_int_equal(mega_rpc_stream_async(ch, cl.cq, &mega_control_watch_job, &w.base, 0, on_item,
                                         on_end, &watch, NULL, &err),
                   MEGA_OK);
  Mega__V1__GetJobRequest g = MEGA__V1__GET_JOB_REQUEST__INIT;
  g.job_id = "j-slow";
  assert_int_equal(mega_rpc_unary_async(ch, cl.cq, &mega_control_get_job, &g.base, 0, on_reply,
                                        &slow, NULL, &err),
                   MEGA_OK);
  Mega__V1__CancelJobRequest c = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  c.job_id = id;
  assert_int_equal(mega_rpc_unary_async(ch, cl.cq, &mega_control_cancel_job, &c.base, 0,
                                        on_reply, &cancel, NULL, &err),
                   MEGA_OK);
  /* Run the client until the server holds all three. */
  while (atomic_load(&s2->stats.handled) < 4 || watch.items < 2) uv_run(&cl.loop, UV_RUN_ONCE);

  mega_rpc_channel_free(ch); /* the calls keep the channel alive */
  srv_stop_join(s2);         /* returns once the server and its queue are gone */

  cl_run_until(&cl, &watch.done, 1);
  cl_run_until(&cl, &slow.done, 1);
  cl_run_until(&cl, &cancel.done, 1);
  assert_int_not_equal(watch.last, MEGA_OK);
  assert_int_not_equal(slow.last, MEGA_OK);
  /* CancelJob answers within its 20 ms, inside the grace period. */
  assert_int_equal(cancel.last, MEGA_OK);
  cl_close(&cl);
  free(id);
}

/* ---- latency (a figure, never a failure) ---- */

static void test_loopback_latency(void **state) {
  (void)state;
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp;
  mega_err err;
  const int N = getenv("MEGA_RPC_LATENCY_N") ? atoi(getenv("MEGA_RPC_LATENCY_N")) : 200;
  for (int i = 0; i < 20; i++) { /* warm up */
    assert_int_equal(mega_rpc_unary(CH, &mega_control_list_nodes, &req.base, 5000, &resp, &err),
                     MEGA_OK);
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  double t0 = now_ms();
  for (int i = 0; i < N; i++) {
    assert_int_equal(mega_rpc_unary(CH, &mega_control_list_nodes, &req.base, 5000, &resp, &err),
                     MEGA_OK);
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  double blocking_us = (now_ms() - t0) * 1000.0 / N;

  client_loop cl;
  cl_open(&cl);
  tally t = {0};
  t0 = now_ms();
  for (int i = 0; i < N; i++) {
    assert_int_equal(mega_rpc_unary_async(CH, cl.cq, &mega_control_list_nodes, &req.base, 5000,
                                          on_reply, &t, NULL, &err),
                     MEGA_OK);
    cl_run_until(&cl, &t.done, i + 1);
  }
  double async_us = (now_ms() - t0) * 1000.0 / N;
  assert_int_equal(t.ok, N);
  cl_close(&cl);
  printf("loopback unary round trip (%d calls): blocking %.0f us, async via bridge %.0f us\n", N,
         blocking_us, async_us);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_parallel_unary),
      cmocka_unit_test(test_async_stream_and_errors),
      cmocka_unit_test(test_async_cancel),
      cmocka_unit_test(test_async_close_with_message_queued),
      cmocka_unit_test(test_async_refused_on_closing_queue),
      cmocka_unit_test(test_shutdown_with_calls_in_flight),
      cmocka_unit_test(test_loopback_latency),
  };
  return cmocka_run_group_tests(tests, rpc_group_setup, rpc_group_teardown);
}
