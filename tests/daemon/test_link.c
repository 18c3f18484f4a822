/* worker/link over a socketpair: the test plays megad's end with the
 * blocking frame functions. The assignment comes first; KV calls are
 * answered by request id (also out of order); an Abort frame and EOF reach
 * the abort callback once and fail the calls in flight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/frame.h"
#include "worker/rank/link.h"

static void send_daemon(int fd, Mega__V1__DaemonFrame *f) {
  assert_int_equal(mega_frame_write(fd, &f->base, 0, NULL), MEGA_OK);
}

static Mega__V1__WorkerFrame *read_worker(int fd) {
  ProtobufCMessage *m = NULL;
  assert_int_equal(mega_frame_read(fd, &mega__v1__worker_frame__descriptor, 0, &m, NULL), MEGA_OK);
  return (Mega__V1__WorkerFrame *)m;
}

static unsigned pipe_timeout_ms; /* of the next fixture's assignment */

static void send_assignment(int fd) {
  Mega__V1__Bootstrap b = MEGA__V1__BOOTSTRAP__INIT;
  b.kv_prefix = "j-1/0";
  b.kv_timeout_ms = 5000;
  Mega__V1__Assignment a = MEGA__V1__ASSIGNMENT__INIT;
  a.job_id = "j-1";
  a.rank = 3;
  a.world_size = 4;
  a.bootstrap = &b;
  a.pipe_timeout_ms = pipe_timeout_ms;
  char *args[] = {"--num-layers", "2"};
  a.args = args;
  a.n_args = 2;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ASSIGNMENT;
  f.assignment = &a;
  send_daemon(fd, &f);
}

static void send_kv(int fd, uint64_t id, bool found, const char *value, const char *error) {
  Mega__V1__KvResponse r = MEGA__V1__KV_RESPONSE__INIT;
  r.request_id = id;
  r.found = found;
  if (value) {
    r.value.data = (uint8_t *)value;
    r.value.len = strlen(value);
  }
  r.error = (char *)(error ? error : "");
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_KV;
  f.kv = &r;
  send_daemon(fd, &f);
}

typedef struct aborts {
  pthread_mutex_t mu;
  int n;
  char why[256];
} aborts;

static void on_abort(void *arg, const char *why) {
  aborts *a = arg;
  pthread_mutex_lock(&a->mu);
  a->n++;
  snprintf(a->why, sizeof a->why, "%s", why);
  pthread_mutex_unlock(&a->mu);
}

typedef struct fixture {
  int daemon_fd;
  mega_link *link;
  aborts ab;
} fixture;

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -1;
  fx->daemon_fd = sv[0];
  pthread_mutex_init(&fx->ab.mu, NULL);
  send_assignment(fx->daemon_fd);
  mega_err err = {0};
  if (mega_link_open(sv[1], 1000, &fx->link, &err) != MEGA_OK) return -1;
  if (mega_link_start(fx->link, on_abort, &fx->ab, &err) != MEGA_OK) return -1;
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  mega_link_close(fx->link);
  if (fx->daemon_fd >= 0) close(fx->daemon_fd);
  pthread_mutex_destroy(&fx->ab.mu);
  free(fx);
  return 0;
}

static void test_assignment_and_sends(void **state) {
  fixture *fx = *state;
  const Mega__V1__Assignment *a = mega_link_assignment(fx->link);
  assert_string_equal(a->job_id, "j-1");
  assert_int_equal(a->rank, 3);
  assert_int_equal(a->n_args, 2);
  assert_string_equal(a->bootstrap->kv_prefix, "j-1/0");

  assert_int_equal(mega_link_send_hello(fx->link, "cpu", NULL), MEGA_OK);
  Mega__V1__WorkerFrame *f = read_worker(fx->daemon_fd);
  assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_HELLO);
  assert_int_equal(f->hello->rank, 3);
  assert_int_equal(f->hello->pid, getpid());
  protobuf_c_message_free_unpacked(&f->base, NULL);

  mega_rank_span spans[2] = {{.name = "F0.0", .cat = "compute", .start_us = 0, .dur_us = 10},
                             {.name = "RECV_F1.0", .cat = "p2p", .start_us = 10, .dur_us = 5}};
  mega_rank_metrics m = {.iteration = 7, .rank = 3, .pp_rank = 1, .dp_rank = 1, .has_loss = true,
                         .loss = 4.5, .lr = 1e-4, .tokens = 512, .step_time_s = 0.25,
                         .compute_s = 0.2, .bubble_s = 0.03, .peak_activation_bytes = 4096,
                         .param_bytes = 100, .grad_bytes = 200, .optimizer_state_bytes = 300,
                         .step_start_unix_us = 123456789, .spans = spans, .nspans = 2};
  assert_int_equal(mega_link_send_step(fx->link, &m, NULL), MEGA_OK);
  f = read_worker(fx->daemon_fd);
  assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_STEP);
  assert_int_equal(f->step->iteration, 7);
  assert_true(f->step->has_loss && f->step->loss == 4.5);
  assert_int_equal(f->step->metrics->pp_rank, 1);
  assert_int_equal(f->step->metrics->peak_activation_bytes, 4096);
  assert_int_equal(f->step->metrics->param_bytes, 100);
  assert_int_equal(f->step->metrics->grad_bytes, 200);
  assert_int_equal(f->step->metrics->optimizer_state_bytes, 300);
  assert_int_equal(f->step->step_start_unix_us, 123456789);
  assert_int_equal(f->step->n_spans, 2);
  assert_string_equal(f->step->spans[1]->name, "RECV_F1.0");
  assert_string_equal(f->step->spans[1]->cat, "p2p");
  protobuf_c_message_free_unpacked(&f->base, NULL);

  mega_rank_ckpt_report ck = {.iteration = 7, .path = "/ck/iter_7", .bytes = 1000,
                              .duration_s = 0.5, .blocked_s = 0.125, .committed = true};
  assert_int_equal(mega_link_send_checkpoint(fx->link, &ck, NULL), MEGA_OK);
  f = read_worker(fx->daemon_fd);
  assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_CHECKPOINT_DONE);
  assert_string_equal(f->checkpoint_done->path, "/ck/iter_7");
  assert_true(f->checkpoint_done->committed);
  assert_true(f->checkpoint_done->blocked_s == 0.125);
  protobuf_c_message_free_unpacked(&f->base, NULL);

  assert_int_equal(mega_link_send_error(fx->link, "peer rank 1 closed", true, false, NULL),
                   MEGA_OK);
  f = read_worker(fx->daemon_fd);
  assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_ERROR);
  assert_true(f->error->retryable);
  assert_false(f->error->fatal);
  protobuf_c_message_free_unpacked(&f->base, NULL);

  assert_int_equal(mega_link_send_progress(fx->link, "checkpoint", 40, NULL), MEGA_OK);
  f = read_worker(fx->daemon_fd);
  assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_PROGRESS);
  assert_string_equal(f->progress->phase, "checkpoint");
  assert_int_equal(f->progress->iteration, 40);
  protobuf_c_message_free_unpacked(&f->base, NULL);
}

/* Two threads' KV calls in flight at once, answered in reverse order. */
typedef struct getter {
  mega_link *link;
  const char *key;
  mega_status s;
  char value[32];
} getter;

static void *do_get(void *arg) {
  getter *g = arg;
  void *v = NULL;
  size_t len = 0;
  mega_err err = {0};
  g->s = mega_link_kv_ops.get(g->link, g->key, &v, &len, 3000, &err);
  if (g->s == MEGA_OK) snprintf(g->value, sizeof g->value, "%.*s", (int)len, (char *)v);
  free(v);
  return NULL;
}

static void test_kv_by_request_id(void **state) {
  fixture *fx = *state;
  getter a = {fx->link, "ka", 0, ""}, b = {fx->link, "kb", 0, ""};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, do_get, &a);
  pthread_create(&tb, NULL, do_get, &b);
  /* both gets arrive, each waiting for its key (one call each); answer the
   * second first */
  Mega__V1__WorkerFrame *w1 = read_worker(fx->daemon_fd), *w2 = read_worker(fx->daemon_fd);
  assert_int_equal(w1->kv->op_case, MEGA__V1__KV_REQUEST__OP_GET);
  assert_int_equal(w2->kv->op_case, MEGA__V1__KV_REQUEST__OP_GET);
  assert_int_equal(w1->kv->get->wait_ms, 3000);
  assert_int_not_equal(w1->kv->request_id, w2->kv->request_id);
  send_kv(fx->daemon_fd, w2->kv->request_id, true, !strcmp(w2->kv->get->key, "ka") ? "A" : "B",
          NULL);
  send_kv(fx->daemon_fd, w1->kv->request_id, true, !strcmp(w1->kv->get->key, "ka") ? "A" : "B",
          NULL);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  assert_int_equal(a.s, MEGA_OK);
  assert_string_equal(a.value, "A");
  assert_int_equal(b.s, MEGA_OK);
  assert_string_equal(b.value, "B");
  protobuf_c_message_free_unpacked(&w1->base, NULL);
  protobuf_c_message_free_unpacked(&w2->base, NULL);

  /* a megad that answers a get at once without the key (one that does not
   * wait): a wait, then a get */
  a.value[0] = '\0';
  pthread_create(&ta, NULL, do_get, &a);
  w1 = read_worker(fx->daemon_fd);
  assert_int_equal(w1->kv->op_case, MEGA__V1__KV_REQUEST__OP_GET);
  send_kv(fx->daemon_fd, w1->kv->request_id, false, NULL, NULL);
  w2 = read_worker(fx->daemon_fd);
  assert_int_equal(w2->kv->op_case, MEGA__V1__KV_REQUEST__OP_WAIT);
  assert_int_equal(w2->kv->wait->timeout_ms, 3000);
  send_kv(fx->daemon_fd, w2->kv->request_id, false, NULL, NULL);
  Mega__V1__WorkerFrame *g = read_worker(fx->daemon_fd);
  assert_int_equal(g->kv->op_case, MEGA__V1__KV_REQUEST__OP_GET);
  assert_int_equal(g->kv->get->wait_ms, 0);
  send_kv(fx->daemon_fd, g->kv->request_id, true, "A", NULL);
  pthread_join(ta, NULL);
  assert_int_equal(a.s, MEGA_OK);
  assert_string_equal(a.value, "A");
  protobuf_c_message_free_unpacked(&w1->base, NULL);
  protobuf_c_message_free_unpacked(&w2->base, NULL);
  protobuf_c_message_free_unpacked(&g->base, NULL);

  /* a daemon error before the timeout is a peer failure */
  pthread_create(&ta, NULL, do_get, &a);
  w1 = read_worker(fx->daemon_fd);
  send_kv(fx->daemon_fd, w1->kv->request_id, false, NULL, "cannot reach the coordinator n1");
  pthread_join(ta, NULL);
  assert_int_equal(a.s, MEGA_ERR_PEER);
  protobuf_c_message_free_unpacked(&w1->base, NULL);
}

typedef struct setter {
  mega_link *link;
  mega_status s;
  mega_err err;
} setter;

static void *do_set(void *arg) {
  setter *s = arg;
  s->s = mega_link_kv_ops.set(s->link, "k", "v", 1, &s->err);
  return NULL;
}

static void test_abort_frame(void **state) {
  fixture *fx = *state;
  setter s = {fx->link, 0, {0}};
  pthread_t t;
  pthread_create(&t, NULL, do_set, &s);
  Mega__V1__WorkerFrame *w = read_worker(fx->daemon_fd);
  assert_int_equal(w->kv->op_case, MEGA__V1__KV_REQUEST__OP_SET);
  assert_string_equal(w->kv->set->key, "k");
  protobuf_c_message_free_unpacked(&w->base, NULL);
  Mega__V1__Abort ab = MEGA__V1__ABORT__INIT;
  ab.reason = "rank 0 (node n1) exited with signal 9 (Killed)";
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ABORT;
  f.abort = &ab;
  send_daemon(fx->daemon_fd, &f);
  send_daemon(fx->daemon_fd, &f); /* a second abort calls nothing more */
  pthread_join(t, NULL);
  assert_int_equal(s.s, MEGA_ERR_PEER);
  assert_non_null(strstr(s.err.msg, "exited with signal 9"));
  usleep(50000);
  pthread_mutex_lock(&fx->ab.mu);
  assert_int_equal(fx->ab.n, 1);
  assert_non_null(strstr(fx->ab.why, "aborted by megad: rank 0 (node n1)"));
  pthread_mutex_unlock(&fx->ab.mu);
}

static void test_eof_is_abort(void **state) {
  fixture *fx = *state;
  close(fx->daemon_fd);
  fx->daemon_fd = -1;
  for (int i = 0; i < 200; i++) {
    pthread_mutex_lock(&fx->ab.mu);
    int n = fx->ab.n;
    pthread_mutex_unlock(&fx->ab.mu);
    if (n) break;
    usleep(10000);
  }
  assert_int_equal(fx->ab.n, 1);
  assert_non_null(strstr(fx->ab.why, "megad closed the worker pipe"));
  mega_err err = {0};
  const char *keys[] = {"x"};
  assert_int_equal(mega_link_kv_ops.wait(fx->link, keys, 1, 100, &err), MEGA_ERR_PEER);
  assert_int_not_equal(mega_link_send_hello(fx->link, "cpu", &err), MEGA_OK);
}

static void test_timeout(void **state) {
  fixture *fx = *state;
  /* The daemon answers a waiting get with an error once its timeout has passed. */
  getter g = {fx->link, "never", 0, ""};
  pthread_t t;
  pthread_create(&t, NULL, do_get, &g);
  Mega__V1__WorkerFrame *w = read_worker(fx->daemon_fd);
  assert_int_equal(w->kv->op_case, MEGA__V1__KV_REQUEST__OP_GET);
  usleep((useconds_t)w->kv->get->wait_ms * 1000);
  send_kv(fx->daemon_fd, w->kv->request_id, false, NULL, "timed out waiting for 'never'");
  pthread_join(t, NULL);
  assert_int_equal(g.s, MEGA_ERR_TIMEOUT);
  protobuf_c_message_free_unpacked(&w->base, NULL);
}

static void send_commit_or_refusal(int fd, uint64_t iteration, const char *refused) {
  Mega__V1__CommitCheckpointRequest c = MEGA__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  c.iteration = iteration;
  if (refused) c.refused = (char *)refused;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_COMMIT;
  f.commit = &c;
  send_daemon(fd, &f);
}

static void send_commit(int fd, uint64_t iteration) {
  send_commit_or_refusal(fd, iteration, NULL);
}

typedef struct committer {
  mega_link *link;
  int64_t iteration;
  mega_status s;
} committer;

static void *do_await(void *arg) {
  committer *c = arg;
  c->s = mega_link_await_commit(c->link, c->iteration, 5000, NULL);
  return NULL;
}

/* The committing rank waits for the coordinator's go-ahead for its own
 * iteration, not another's. */
static void test_commit_go_ahead(void **state) {
  fixture *fx = *state;
  committer c = {fx->link, 20, MEGA_ERR_INTERNAL};
  pthread_t t;
  pthread_create(&t, NULL, do_await, &c);
  send_commit(fx->daemon_fd, 10);
  usleep(100000);
  assert_int_equal(c.s, MEGA_ERR_INTERNAL); /* still waiting */
  send_commit(fx->daemon_fd, 20);
  pthread_join(t, NULL);
  assert_int_equal(c.s, MEGA_OK);
  /* one that never comes times out; an ended link cancels */
  mega_err err = {0};
  assert_int_equal(mega_link_await_commit(fx->link, 30, 100, &err), MEGA_ERR_TIMEOUT);
  assert_non_null(strstr(err.msg, "iteration 30"));
  close(fx->daemon_fd);
  fx->daemon_fd = -1;
  assert_int_equal(mega_link_await_commit(fx->link, 30, 5000, &err), MEGA_ERR_CANCELLED);
}

/* A refusal ends the wait at once, with the coordinator's reason (its etcd
 * lease not known alive: a rank once waited 60 s for a go-ahead that could
 * not come), and only for its own iteration. */
static void test_commit_refused(void **state) {
  fixture *fx = *state;
  committer c = {fx->link, 20, MEGA_ERR_INTERNAL};
  pthread_t t;
  pthread_create(&t, NULL, do_await, &c);
  send_commit_or_refusal(fx->daemon_fd, 10, "etcd is away");
  usleep(100000);
  assert_int_equal(c.s, MEGA_ERR_INTERNAL); /* still waiting */
  send_commit_or_refusal(fx->daemon_fd, 20, "etcd is away");
  pthread_join(t, NULL);
  assert_int_equal(c.s, MEGA_ERR_UNSUPPORTED);
  mega_err err = {0};
  assert_int_equal(mega_link_await_commit(fx->link, 20, 5000, &err), MEGA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "refused the commit of iteration 20: etcd is away"));
  send_commit(fx->daemon_fd, 25);
  assert_int_equal(mega_link_await_commit(fx->link, 25, 5000, &err), MEGA_OK);
}

/* megad pings; a frozen megad says nothing, and the worker stops on its
 * own (a SIGSTOPped megad once left its workers running for as long). */
static void test_silence_is_abort(void **state) {
  (void)state;
  pipe_timeout_ms = 300;
  fixture *fx;
  assert_int_equal(setup((void **)&fx), 0);
  pipe_timeout_ms = 0;
  Mega__V1__Ping ping = MEGA__V1__PING__INIT;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_PING;
  f.ping = &ping;
  for (int i = 0; i < 8; i++) {
    send_daemon(fx->daemon_fd, &f);
    usleep(100000);
  }
  pthread_mutex_lock(&fx->ab.mu);
  assert_int_equal(fx->ab.n, 0);
  pthread_mutex_unlock(&fx->ab.mu);
  int n = 0;
  for (int i = 0; i < 100 && !n; i++) { /* now silence */
    usleep(10000);
    pthread_mutex_lock(&fx->ab.mu);
    n = fx->ab.n;
    pthread_mutex_unlock(&fx->ab.mu);
  }
  assert_int_equal(n, 1);
  assert_non_null(strstr(fx->ab.why, "sent nothing on the worker pipe for 0.3 s"));
  teardown((void **)&fx);
}

static void test_first_frame_must_be_assignment(void **state) {
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  send_kv(sv[0], 1, false, NULL, NULL);
  mega_link *l = NULL;
  mega_err err = {0};
  assert_int_equal(mega_link_open(sv[1], 1000, &l, &err), MEGA_ERR_PEER);
  assert_non_null(strstr(err.msg, "instead of sending an assignment"));
  close(sv[0]);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  assert_int_equal(mega_link_open(sv[1], 100, &l, &err), MEGA_ERR_TIMEOUT);
  close(sv[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_assignment_and_sends, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kv_by_request_id, setup, teardown),
      cmocka_unit_test_setup_teardown(test_abort_frame, setup, teardown),
      cmocka_unit_test_setup_teardown(test_eof_is_abort, setup, teardown),
      cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_commit_go_ahead, setup, teardown),
      cmocka_unit_test_setup_teardown(test_commit_refused, setup, teardown),
      cmocka_unit_test(test_silence_is_abort),
      cmocka_unit_test(test_first_frame_must_be_assignment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
