/* The shared fixture of the rpc wrapper's end-to-end tests (rpc_fixture.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/mega_rpc.h"
#include "rpc_fixture.h"

double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

bool wait_atomic(atomic_int *v, int want) {
  for (int i = 0; i < 500; i++) {
    if (atomic_load(v) >= want) return true;
    usleep(10000);
  }
  return false;
}

/* ---- a test server on its own thread ---- */

static void srv_cq_closed(void *arg) {
  srv_thread *s = arg;
  uv_close((uv_handle_t *)&s->stop, NULL);
}

static void srv_down(void *arg) {
  srv_thread *s = arg;
  mega_rpc_cq_close(s->cq, srv_cq_closed, s);
}

static void srv_stop(uv_async_t *a) {
  srv_thread *s = a->data;
  testsrv_shutdown(s->srv, s->grace_ms, srv_down, s);
}

static void srv_main(void *arg) {
  srv_thread *s = arg;
  uv_loop_init(&s->loop);
  uv_async_init(&s->loop, &s->stop, srv_stop);
  s->stop.data = s;
  s->st = mega_rpc_cq_new(&s->loop, &s->cq, &s->err);
  if (s->st == MEGA_OK)
    s->st = testsrv_new(s->cq, s->addr, s->max_msg, &s->stats, &s->port, &s->srv, &s->err);
  uv_sem_post(&s->ready);
  if (s->st != MEGA_OK) return; /* the test fails on st */
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
}

srv_thread *srv_start(const char *addr, size_t max_msg, unsigned grace_ms) {
  srv_thread *s = calloc(1, sizeof *s);
  snprintf(s->addr, sizeof s->addr, "%s", addr);
  s->max_msg = max_msg;
  s->grace_ms = grace_ms;
  uv_sem_init(&s->ready, 0);
  uv_thread_create(&s->th, srv_main, s);
  uv_sem_wait(&s->ready);
  if (s->st != MEGA_OK) fail_msg("test server on %s: %s", addr, s->err.msg);
  if (strncmp(addr, "unix:", 5) == 0) snprintf(s->target, sizeof s->target, "%s", addr);
  else snprintf(s->target, sizeof s->target, "127.0.0.1:%d", s->port);
  return s;
}

void srv_stop_join(srv_thread *s) {
  uv_async_send(&s->stop);
  uv_thread_join(&s->th);
  uv_sem_destroy(&s->ready);
  free(s);
}

/* ---- a client loop on this thread ---- */

void cl_open(client_loop *cl) {
  mega_err err;
  uv_loop_init(&cl->loop);
  assert_int_equal(mega_rpc_cq_new(&cl->loop, &cl->cq, &err), MEGA_OK);
}

void cl_run_until(client_loop *cl, const int *counter, int want) {
  while (*counter < want) uv_run(&cl->loop, UV_RUN_ONCE);
}

void cl_close(client_loop *cl) {
  mega_rpc_cq_close(cl->cq, NULL, NULL);
  uv_run(&cl->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&cl->loop), 0);
}

/* ---- the group: one server, one channel ---- */

srv_thread *S;
mega_rpc_channel *CH;

int rpc_group_setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  S = srv_start("127.0.0.1:0", SERVER_MAX_MSG, 200);
  mega_err err;
  mega_rpc_channel_opts o = {.peer_name = "megad"};
  if (mega_rpc_channel_new(S->target, &o, &CH, &err) != MEGA_OK) return -1;
  return 0;
}

int rpc_group_teardown(void **state) {
  (void)state;
  mega_rpc_channel_free(CH);
  srv_stop_join(S);
  return mega_rpc_wait_released(5000) ? 0 : -1;
}

char *submit(const char *name, const char *iters) {
  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  char *args[] = {"--train-iters", (char *)iters, "--pipeline-model-parallel-size", "1"};
  spec.name = (char *)name;
  spec.n_args = 4;
  spec.args = args;
  req.spec = &spec;
  ProtobufCMessage *resp;
  mega_err err;
  mega_status st = mega_rpc_unary(CH, &mega_control_submit_job, &req.base, 5000, &resp, &err);
  if (st != MEGA_OK) fail_msg("SubmitJob: %s", err.msg);
  Mega__V1__SubmitJobResponse *r = (void *)resp;
  char *id = strdup(r->job->id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return id;
}
