/* The rpc wrapper's blocking client end to end on loopback, against the
 * group's test server (rpc_fixture.h): unary calls and streams, error
 * statuses, deadlines, unknown methods, unreachable peers, binding errors,
 * a unix socket, and garbage bytes on the port. The async client is in
 * test_rpc_async.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"
#include "rpc_fixture.h"

static Mega__V1__GetJobResponse *get_job(const char *id, mega_status *st, mega_err *err) {
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  ProtobufCMessage *resp;
  *st = mega_rpc_unary(CH, &mega_control_get_job, &req.base, 5000, &resp, err);
  return (void *)resp;
}

/* ---- unary ---- */

static void test_unary_ok(void **state) {
  (void)state;
  char *id = submit("unary-ok", "10");
  mega_status st;
  mega_err err;
  Mega__V1__GetJobResponse *r = get_job(id, &st, &err);
  assert_int_equal(st, MEGA_OK);
  assert_string_equal(r->job->id, id);
  assert_string_equal(r->job->name, "unary-ok");
  assert_int_equal(r->job->spec->n_args, 4);
  assert_string_equal(r->job->spec->args[2], "--pipeline-model-parallel-size");
  assert_int_equal(r->job->train_iters, 10);
  assert_int_equal(r->job->state, MEGA__V1__JOB_STATE__JOB_STATE_PENDING);
  protobuf_c_message_free_unpacked(&r->base, NULL);

  /* CancelJob answers from a timer, 20 ms after the request. */
  Mega__V1__CancelJobRequest creq = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  creq.job_id = id;
  ProtobufCMessage *resp;
  assert_int_equal(mega_rpc_unary(CH, &mega_control_cancel_job, &creq.base, 5000, &resp, &err),
                   MEGA_OK);
  assert_int_equal(((Mega__V1__CancelJobResponse *)resp)->job->state,
                   MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED);
  protobuf_c_message_free_unpacked(resp, NULL);

  Mega__V1__ListJobsRequest lreq = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  Mega__V1__JobState want = MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED;
  lreq.n_states = 1;
  lreq.states = &want;
  assert_int_equal(mega_rpc_unary(CH, &mega_control_list_jobs, &lreq.base, 5000, &resp, &err),
                   MEGA_OK);
  Mega__V1__ListJobsResponse *l = (void *)resp;
  bool seen = false;
  for (size_t i = 0; i < l->n_jobs; i++) {
    assert_int_equal(l->jobs[i]->state, MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED);
    seen |= strcmp(l->jobs[i]->id, id) == 0;
  }
  assert_true(seen);
  protobuf_c_message_free_unpacked(resp, NULL);
  free(id);
}

static void test_unary_error_status(void **state) {
  (void)state;
  mega_status st;
  mega_err err;
  Mega__V1__GetJobResponse *r = get_job("j-404", &st, &err);
  assert_null(r);
  assert_int_equal(st, MEGA_ERR_NOT_FOUND);
  assert_int_equal(err.status, MEGA_ERR_NOT_FOUND);
  assert_string_equal(err.msg, "job j-404 not found");

  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  req.spec = &spec;
  ProtobufCMessage *resp;
  st = mega_rpc_unary(CH, &mega_control_submit_job, &req.base, 5000, &resp, &err);
  assert_int_equal(st, MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "the job spec has no name: give --name");
}

static void test_request_over_server_limit(void **state) {
  (void)state;
  size_t n = SERVER_MAX_MSG + 1024;
  char *big = malloc(n + 1);
  memset(big, 'x', n);
  big[n] = '\0';
  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "big";
  spec.n_args = 1;
  spec.args = &big;
  req.spec = &spec;
  ProtobufCMessage *resp;
  mega_err err;
  mega_status st = mega_rpc_unary(CH, &mega_control_submit_job, &req.base, 5000, &resp, &err);
  assert_int_equal(st, MEGA_ERR_NOMEM); /* RESOURCE_EXHAUSTED */
  assert_non_null(strstr(err.msg, "larger than max"));
  free(big);
  /* The server is fine afterwards. */
  char *id = submit("after-big", "1");
  free(id);
}

/* ---- streams ---- */

static void test_stream_many_slow_reader(void **state) {
  (void)state;
  const int N = 3000;
  char *id = submit("stream", "3000");
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = id;
  mega_rpc_stream *s;
  mega_err err;
  /* a deadline for a hang, not a speed: under valgrind on a loaded machine
   * the 3,000 items took more than 20 s */
  assert_int_equal(mega_rpc_stream_open(CH, &mega_control_watch_job, &req.base, 120000, &s, &err),
                   MEGA_OK);
  usleep(100000); /* let the server queue everything before we read */
  int steps = 0;
  bool event = false, final = false;
  ProtobufCMessage *msg;
  while (mega_rpc_stream_next(s, &msg, &err) == MEGA_OK && msg) {
    Mega__V1__WatchJobResponse *w = (void *)msg;
    if (w->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) {
      assert_false(event);
      assert_int_equal(w->step->iteration, (uint64_t)steps + 1);
      assert_int_equal(w->step->n_ranks, 2);
      steps++;
      if (steps % 500 == 0) usleep(20000); /* a slow reader */
    } else if (w->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT) {
      assert_string_equal(w->event->message, "finished");
      event = true;
    } else {
      assert_int_equal(w->final_state->state, MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
      final = true;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  assert_int_equal(err.status, MEGA_OK);
  assert_null(msg);
  assert_int_equal(steps, N);
  assert_true(event && final);
  /* The end repeats. */
  assert_int_equal(mega_rpc_stream_next(s, &msg, &err), MEGA_OK);
  assert_null(msg);
  mega_rpc_stream_close(s);
  assert_true(atomic_load(&S->stats.max_queued) >= 100);
  free(id);
}

static void test_stream_large_chunks(void **state) {
  (void)state;
  Mega__V1__GetTraceRequest req = MEGA__V1__GET_TRACE_REQUEST__INIT;
  req.job_id = "any";
  mega_rpc_stream *s;
  mega_err err;
  assert_int_equal(mega_rpc_stream_open(CH, &mega_control_get_trace, &req.base, 20000, &s, &err),
                   MEGA_OK);
  size_t off = 0;
  ProtobufCMessage *msg;
  bool pattern_ok = true;
  while (mega_rpc_stream_next(s, &msg, &err) == MEGA_OK && msg) {
    Mega__V1__TraceChunk *c = (void *)msg;
    assert_int_equal(c->total_bytes, TESTSRV_TRACE_BYTES);
    for (size_t i = 0; i < c->data.len; i++)
      pattern_ok &= c->data.data[i] == (uint8_t)(((off + i) * 7 + 3) % 251);
    off += c->data.len;
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  assert_int_equal(err.status, MEGA_OK);
  assert_int_equal(off, TESTSRV_TRACE_BYTES);
  assert_true(pattern_ok);
  mega_rpc_stream_close(s);
}

static void test_stream_not_found(void **state) {
  (void)state;
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = "j-none";
  mega_rpc_stream *s;
  mega_err err;
  assert_int_equal(mega_rpc_stream_open(CH, &mega_control_watch_job, &req.base, 5000, &s, &err),
                   MEGA_OK);
  ProtobufCMessage *msg;
  assert_int_equal(mega_rpc_stream_next(s, &msg, &err), MEGA_ERR_NOT_FOUND);
  assert_null(msg);
  assert_string_equal(err.msg, "job j-none not found");
  mega_rpc_stream_close(s);
}

static void test_client_cancel_seen_by_server(void **state) {
  (void)state;
  char *id = submit("forever", "0");
  int cancels = atomic_load(&S->stats.cancels);
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = id;
  mega_rpc_stream *s;
  mega_err err;
  assert_int_equal(mega_rpc_stream_open(CH, &mega_control_watch_job, &req.base, 0, &s, &err),
                   MEGA_OK);
  for (int i = 0; i < 3; i++) {
    ProtobufCMessage *msg;
    assert_int_equal(mega_rpc_stream_next(s, &msg, &err), MEGA_OK);
    assert_non_null(msg);
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  mega_rpc_stream_close(s); /* cancels */
  assert_true(wait_atomic(&S->stats.cancels, cancels + 1));
  mega_status st;
  Mega__V1__GetJobResponse *r = get_job(id, &st, &err);
  assert_int_equal(st, MEGA_OK);
  assert_int_equal(r->job->state, MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED);
  assert_true(r->job->last_iteration >= 3);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  free(id);
}

/* ---- deadlines, unknown methods, refused connections ---- */

static void test_deadline_exceeded(void **state) {
  (void)state;
  int cancels = atomic_load(&S->stats.cancels);
  mega_status st;
  mega_err err;
  double t0 = now_ms();
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = "j-slow";
  ProtobufCMessage *resp;
  st = mega_rpc_unary(CH, &mega_control_get_job, &req.base, 200, &resp, &err);
  double took = now_ms() - t0;
  assert_int_equal(st, MEGA_ERR_TIMEOUT);
  assert_null(resp);
  char want[256];
  snprintf(want, sizeof want, "megad at %s did not answer GetJob within 0.2 s", S->target);
  assert_string_equal(err.msg, want);
  assert_true(took >= 150 && took < 5000);
  /* The server learns of it through RECV_CLOSE_ON_SERVER. */
  assert_true(wait_atomic(&S->stats.cancels, cancels + 1));
}

static void test_unknown_method_unimplemented(void **state) {
  (void)state;
  static const mega_rpc_method nope = {"/mega.v1.Control/Nope",
                                       &mega__v1__get_job_request__descriptor,
                                       &mega__v1__get_job_response__descriptor, MEGA_RPC_UNARY};
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  ProtobufCMessage *resp;
  mega_err err;
  double t0 = now_ms();
  mega_status st = mega_rpc_unary(CH, &nope, &req.base, 10000, &resp, &err);
  assert_true(now_ms() - t0 < 2000); /* promptly, not at the deadline */
  assert_int_equal(st, MEGA_ERR_UNSUPPORTED);
  char want[256];
  snprintf(want, sizeof want,
           "megad at %s does not implement /mega.v1.Control/Nope (is it another version of mega?)",
           S->target);
  assert_string_equal(err.msg, want);

  /* A real method this server has no handler for. */
  Mega__V1__KvGetRequest kv = MEGA__V1__KV_GET_REQUEST__INIT;
  kv.key = "k";
  st = mega_rpc_unary(CH, &mega_peer_kv_get, &kv.base, 10000, &resp, &err);
  assert_int_equal(st, MEGA_ERR_UNSUPPORTED);

  /* A stream to an unknown path ends with the same status. */
  static const mega_rpc_method nope_stream = {
      "/mega.v1.Control/NopeStream", &mega__v1__get_job_request__descriptor,
      &mega__v1__get_job_response__descriptor, MEGA_RPC_SERVER_STREAM};
  mega_rpc_stream *s;
  assert_int_equal(mega_rpc_stream_open(CH, &nope_stream, &req.base, 10000, &s, &err), MEGA_OK);
  ProtobufCMessage *msg;
  assert_int_equal(mega_rpc_stream_next(s, &msg, &err), MEGA_ERR_UNSUPPORTED);
  mega_rpc_stream_close(s);
}

static int closed_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(fd, (struct sockaddr *)&sa, sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

static void test_connection_refused(void **state) {
  (void)state;
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", closed_port());
  mega_rpc_channel *ch;
  mega_err err;
  mega_rpc_channel_opts o = {.peer_name = "megad"};
  assert_int_equal(mega_rpc_channel_new(target, &o, &ch, &err), MEGA_OK);
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp;
  double t0 = now_ms();
  mega_status st = mega_rpc_unary(ch, &mega_control_list_nodes, &req.base, 5000, &resp, &err);
  assert_true(now_ms() - t0 < 3000);
  assert_int_equal(st, MEGA_ERR_IO);
  char want[128];
  snprintf(want, sizeof want, "cannot reach megad at %s: connection refused", target);
  assert_string_equal(err.msg, want);
  mega_rpc_channel_free(ch);
}

/* Answers every connection with HTTP/1.1, as a web server would, until
 * the listening socket is shut down. */
static void http1_main(void *arg) {
  int lfd = *(int *)arg;
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) return;
    char buf[1024];
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    recv(fd, buf, sizeof buf, 0);
    const char resp[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    send(fd, resp, sizeof resp - 1, MSG_NOSIGNAL);
    close(fd);
  }
}

static void expect_unreachable(const char *target, const char *reason) {
  mega_rpc_channel *ch;
  mega_err err;
  mega_rpc_channel_opts o = {.peer_name = "megad"};
  assert_int_equal(mega_rpc_channel_new(target, &o, &ch, &err), MEGA_OK);
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp;
  assert_int_equal(mega_rpc_unary(ch, &mega_control_list_nodes, &req.base, 5000, &resp, &err),
                   MEGA_ERR_IO);
  char want[256];
  snprintf(want, sizeof want, "cannot reach megad at %s: %s", target, reason);
  assert_string_equal(err.msg, want);
  mega_rpc_channel_free(ch);
}

static void test_unreachable_sentences(void **state) {
  (void)state;
  char target[64];
  snprintf(target, sizeof target, "unix:/tmp/mega-test-missing-%d.sock", (int)getpid());
  expect_unreachable(target, "no such socket");

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(lfd, 8), 0);
  socklen_t len = sizeof sa;
  getsockname(lfd, (struct sockaddr *)&sa, &len);
  uv_thread_t th;
  uv_thread_create(&th, http1_main, &lfd);
  snprintf(target, sizeof target, "127.0.0.1:%d", ntohs(sa.sin_port));
  expect_unreachable(target, "what answers there does not speak gRPC");
  shutdown(lfd, SHUT_RDWR); /* wakes accept */
  uv_thread_join(&th);
  close(lfd);
}

/* ---- binding ---- */

static void flag_done(void *arg) { (*(int *)arg)++; }

static void never_called(mega_rpc_call *call, const ProtobufCMessage *req, void *data) {
  (void)req;
  (void)data;
  mega_rpc_fail(call, MEGA_RPC_INTERNAL, "unexpected");
}

/* A second server on a taken address gets a sentence, and shuts down clean. */
static void expect_bind_error(const char *addr, const char *want) {
  client_loop cl;
  cl_open(&cl);
  mega_rpc_server *srv;
  mega_err err;
  assert_int_equal(mega_rpc_server_new(cl.cq, NULL, &srv, &err), MEGA_OK);
  assert_int_equal(mega_rpc_server_handle(srv, &mega_control_get_job, never_called, NULL, &err),
                   MEGA_OK);
  int port = -1;
  mega_status st = mega_rpc_server_listen(srv, addr, &port, &err);
  assert_int_equal(st, MEGA_ERR_IO);
  assert_int_equal(port, 0);
  assert_string_equal(err.msg, want);
  int done = 0;
  mega_rpc_server_shutdown(srv, 0, flag_done, &done);
  cl_run_until(&cl, &done, 1);
  cl_close(&cl);
}

static void test_second_server_same_port(void **state) {
  (void)state;
  char addr[64], want[160];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", S->port);
  snprintf(want, sizeof want, "cannot listen on %s: address already in use", addr);
  expect_bind_error(addr, want);
  /* The first server is unharmed. */
  char *id = submit("after-bind", "1");
  free(id);
}

/* A host without a port is refused (gRPC would listen on 443), and so is
 * an IPv6 address without brackets and a port. */
static void test_listen_needs_a_port(void **state) {
  (void)state;
  static const char *const bad[] = {"127.0.0.1", "localhost", "[::1]", "::1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    client_loop cl;
    cl_open(&cl);
    mega_rpc_server *srv;
    mega_err err;
    assert_int_equal(mega_rpc_server_new(cl.cq, NULL, &srv, &err), MEGA_OK);
    int port = -1;
    assert_int_equal(mega_rpc_server_listen(srv, bad[i], &port, &err), MEGA_ERR_INVALID);
    assert_int_equal(port, 0);
    if (!strstr(err.msg, "give HOST:PORT")) fail_msg("%s: %s", bad[i], err.msg);
    int done = 0;
    mega_rpc_server_shutdown(srv, 0, flag_done, &done);
    cl_run_until(&cl, &done, 1);
    cl_close(&cl);
  }
}

static void test_unix_socket(void **state) {
  (void)state;
  char addr[128];
  snprintf(addr, sizeof addr, "unix:/tmp/mega-test-rpc-%d.sock", (int)getpid());
  srv_thread *u = srv_start(addr, 0, 0);
  mega_rpc_channel *ch;
  mega_err err;
  assert_int_equal(mega_rpc_channel_new(addr, NULL, &ch, &err), MEGA_OK);
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp;
  assert_int_equal(mega_rpc_unary(ch, &mega_control_list_nodes, &req.base, 5000, &resp, &err),
                   MEGA_OK);
  assert_string_equal(((Mega__V1__ListNodesResponse *)resp)->self_node_id, "test-node");
  protobuf_c_message_free_unpacked(resp, NULL);

  char want[200];
  snprintf(want, sizeof want, "cannot listen on %s: address already in use (a server answers there)",
           addr);
  expect_bind_error(addr, want);

  mega_rpc_channel_free(ch);
  srv_stop_join(u);
  unlink(addr + 5);
}

/* ---- garbage on the port ---- */

static void send_raw(int port, const void *head, size_t head_len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {.tv_sec = 3};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  send(fd, head, head_len, MSG_NOSIGNAL);
  unsigned char junk[16384];
  unsigned seed = 12345;
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(rand_r(&seed) >> 7);
  for (int i = 0; i < 4; i++) send(fd, junk, sizeof junk, MSG_NOSIGNAL);
  char buf[4096];
  while (recv(fd, buf, sizeof buf, 0) > 0) { /* until the server drops us */
  }
  close(fd);
}

static void test_garbage_bytes_server_survives(void **state) {
  (void)state;
  const char http1[] = "GET / HTTP/1.1\r\nHost: megad\r\n\r\n";
  const char h2[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  send_raw(S->port, http1, sizeof http1 - 1);
  send_raw(S->port, h2, sizeof h2 - 1);
  send_raw(S->port, "", 0);
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp;
  mega_err err;
  assert_int_equal(mega_rpc_unary(CH, &mega_control_list_nodes, &req.base, 5000, &resp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_ok),
      cmocka_unit_test(test_unary_error_status),
      cmocka_unit_test(test_request_over_server_limit),
      cmocka_unit_test(test_stream_many_slow_reader),
      cmocka_unit_test(test_stream_large_chunks),
      cmocka_unit_test(test_stream_not_found),
      cmocka_unit_test(test_client_cancel_seen_by_server),
      cmocka_unit_test(test_deadline_exceeded),
      cmocka_unit_test(test_unknown_method_unimplemented),
      cmocka_unit_test(test_connection_refused),
      cmocka_unit_test(test_unreachable_sentences),
      cmocka_unit_test(test_second_server_same_port),
      cmocka_unit_test(test_listen_needs_a_port),
      cmocka_unit_test(test_unix_socket),
      cmocka_unit_test(test_garbage_bytes_server_survives),
  };
  return cmocka_run_group_tests(tests, rpc_group_setup, rpc_group_teardown);
}
