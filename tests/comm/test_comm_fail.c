/* Failures between forked ranks: a peer killed mid-receive or mid-
 * collective or mid-send, a silent peer, abort from another thread, a rank that never
 * joins, a request freed before it completed. Every wait must end, with
 * the right status, well inside the test's deadline. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/comm/mp.h"

static mega_comm *open_comm_on(const mp_env *env, const char *group, int rank, int size,
                               const char *host, int timeout_ms) {
  mega_store *store = mp_store(env, false);
  if (!store) return NULL;
  mega_comm *c = NULL;
  mega_err err = {0};
  mega_status st = mega_comm_create(store, group, rank, size, host, timeout_ms, &c, &err);
  mega_store_close(store);
  if (st != MEGA_OK)
    fprintf(stderr, "rank %d: creating '%s': %s: %s\n", rank, group,
            mega_status_str(st), err.msg);
  return c;
}

static mega_comm *open_comm(const mp_env *env, const char *group, int rank,
                            int size, int timeout_ms) {
  return open_comm_on(env, group, rank, size, NULL, timeout_ms);
}

/* Rank 1 dies (SIGKILL) while rank 0 waits for 4 MiB from it: rank 0 must
 * hear MEGA_ERR_PEER naming rank 1 long before its 10 s timeout, and every
 * later call must fail at once with the same cause. */
static int body_killed_mid_recv(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "pp", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 1) {
    mp_die_after_ms(300);
  }
  const size_t n = 4u << 20;
  char *buf = malloc(n);
  MP_CHECK(buf, "malloc");
  mega_req *r;
  MP_OK(mega_comm_irecv(c, buf, n, 1, 1, &r, &err), err);
  double t0 = mp_now_ms();
  mega_status st = mega_req_wait(r, 0, &err);
  double dt = mp_now_ms() - t0;
  mega_req_free(r);
  MP_CHECK(st == MEGA_ERR_PEER, "wait gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(dt < 2000, "the death of rank 1 took %.0f ms to notice", dt);
  MP_CHECK(strstr(err.msg, "rank 1"), "message does not name rank 1: %s", err.msg);

  mega_err later = {0};
  t0 = mp_now_ms();
  st = mega_comm_isend(c, buf, 16, 1, 2, &r, &later);
  MP_CHECK(st == MEGA_ERR_PEER && strcmp(later.msg, err.msg) == 0,
           "a later send gave %s: %s", mega_status_str(st), later.msg);
  float x = 1;
  st = mega_comm_all_reduce(c, &x, 1, 0, &later);
  MP_CHECK(st == MEGA_ERR_PEER && strcmp(later.msg, err.msg) == 0,
           "a later all_reduce gave %s: %s", mega_status_str(st), later.msg);
  MP_CHECK(mp_now_ms() - t0 < 100, "later calls did not fail fast");
  MP_CHECK(mega_comm_status(c, &later) == MEGA_ERR_PEER, "status: %s", later.msg);
  free(buf);
  mega_comm_destroy(c);
  return 0;
}

/* Rank 2 of 3 dies during an all-reduce: both survivors fail promptly. */
static int body_killed_in_collective(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "dp", rank, 3, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 2) {
    mp_die_after_ms(300);
  }
  const size_t n = 1u << 20;
  float *buf = calloc(n, sizeof(float));
  MP_CHECK(buf, "malloc");
  double t0 = mp_now_ms();
  mega_status st = mega_comm_all_reduce(c, buf, n, 0, &err);
  double dt = mp_now_ms() - t0;
  MP_CHECK(st == MEGA_ERR_PEER, "all_reduce gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(dt < 2500, "the death took %.0f ms to notice", dt);
  MP_CHECK(strstr(err.msg, "rank "), "message names no rank: %s", err.msg);
  free(buf);
  mega_comm_destroy(c);
  return 0;
}

/* Rank 2 of 3 dies while the others wait for its broadcast (each straight
 * from rank 2): each must name rank 2, whether it accepted its connection
 * to rank 2 (Gloo then prints rank 2's end of it, learnt after the
 * rendezvous) or made it. With *arg true each rank listens on a loopback
 * address of its own, else all on 127.0.0.1. */
static int body_dead_peer_named(int rank, const mp_env *env) {
  bool own_hosts = *(const bool *)env->arg;
  char host[32];
  snprintf(host, sizeof host, "127.0.0.%d", own_hosts ? rank + 1 : 1);
  mega_err err = {0};
  mega_comm *c = open_comm_on(env, "dp", rank, 3, host, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 2) {
    mp_die_after_ms(300);
  }
  /* each survivor hears of the death only on its own connection to rank
   * 2, and Gloo names that by an address */
  float buf[16] = {0};
  mega_status st = mega_comm_broadcast(c, buf, 16, MEGA_DT_F32, 2, 0, &err);
  MP_CHECK(st == MEGA_ERR_PEER, "broadcast gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(strstr(err.msg, "rank 2"), "rank %d's message does not name rank 2: %s", rank,
           err.msg);
  mp_sleep_ms(500); /* the others check theirs before this one closes */
  mega_comm_destroy(c);
  return 0;
}

/* Rank 1 is alive but silent: rank 0's receive times out after the
 * communicator's 1500 ms, and a barrier with its own 800 ms on a second
 * communicator times out after that. */
static int body_silent_peer(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "a", rank, 2, 1500);
  mega_comm *c2 = open_comm(env, "b", rank, 2, 10000);
  MP_CHECK(c && c2, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 1) {
    mp_sleep_ms(3500);
  } else {
    int v;
    mega_req *r;
    MP_OK(mega_comm_irecv(c, &v, sizeof v, 1, 3, &r, &err), err);
    double t0 = mp_now_ms();
    mega_status st = mega_req_wait(r, 0, &err);
    double dt = mp_now_ms() - t0;
    mega_req_free(r);
    MP_CHECK(st == MEGA_ERR_TIMEOUT, "wait gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt > 1400 && dt < 2500, "timed out after %.0f ms, not about 1500", dt);
    MP_CHECK(mega_comm_status(c, NULL) == MEGA_ERR_TIMEOUT, "status after a timeout");

    t0 = mp_now_ms();
    st = mega_comm_barrier(c2, 800, &err);
    dt = mp_now_ms() - t0;
    MP_CHECK(st == MEGA_ERR_TIMEOUT, "barrier gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt > 700 && dt < 2000, "barrier timed out after %.0f ms, not about 800", dt);
  }
  mega_comm_destroy(c2);
  mega_comm_destroy(c);
  return 0;
}

typedef struct waiter {
  mega_req *req;
  mega_status st;
  double done_at;
  mega_err err;
} waiter;

static void *wait_thread(void *p) {
  waiter *w = p;
  w->st = mega_req_wait(w->req, 0, &w->err);
  w->done_at = mp_now_ms();
  return NULL;
}

typedef struct aborter {
  mega_comm *comm;
  int delay_ms;
  double at;
} aborter;

static void *abort_thread(void *p) {
  aborter *a = p;
  mp_sleep_ms(a->delay_ms);
  a->at = mp_now_ms();
  mega_comm_abort(a->comm);
  return NULL;
}

/* Rank 0 has a receive waited on in one thread and a blocking all-reduce
 * (that rank 1 never joins) in another; a third thread aborts: both end
 * with MEGA_ERR_CANCELLED promptly. Rank 1, waiting for rank 0, learns of
 * it as a peer failure. */
static int body_abort(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "g", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  double t0 = mp_now_ms();
  if (rank == 1) {
    int v;
    mega_req *r;
    MP_OK(mega_comm_irecv(c, &v, sizeof v, 0, 6, &r, &err), err);
    mega_status st = mega_req_wait(r, 0, &err);
    double dt = mp_now_ms() - t0;
    mega_req_free(r);
    MP_CHECK(st == MEGA_ERR_PEER, "rank 1's wait gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt < 3000, "rank 1 learned of the abort after %.0f ms", dt);
    MP_CHECK(strstr(err.msg, "rank 0"), "message does not name rank 0: %s", err.msg);
    mega_comm_destroy(c);
    return 0;
  }
  int v;
  waiter w = {0};
  MP_OK(mega_comm_irecv(c, &v, sizeof v, 1, 5, &w.req, &err), err);
  pthread_t wt, at;
  aborter a = {c, 500, 0};
  MP_CHECK(pthread_create(&wt, NULL, wait_thread, &w) == 0, "pthread_create");
  MP_CHECK(pthread_create(&at, NULL, abort_thread, &a) == 0, "pthread_create");
  const size_t n = 1u << 20;
  float *buf = calloc(n, sizeof(float));
  MP_CHECK(buf, "malloc");
  mega_status st = mega_comm_all_reduce(c, buf, n, 0, &err);
  double coll_done = mp_now_ms();
  pthread_join(at, NULL);
  pthread_join(wt, NULL);
  MP_CHECK(st == MEGA_ERR_CANCELLED, "all_reduce gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(coll_done - a.at < 1000, "all_reduce returned %.0f ms after the abort",
           coll_done - a.at);
  MP_CHECK(w.st == MEGA_ERR_CANCELLED, "wait gave %s: %s", mega_status_str(w.st), w.err.msg);
  MP_CHECK(w.done_at - a.at < 1000, "wait returned %.0f ms after the abort", w.done_at - a.at);
  mega_req_free(w.req);

  mega_req *r;
  st = mega_comm_isend(c, &v, sizeof v, 1, 7, &r, &err);
  MP_CHECK(st == MEGA_ERR_CANCELLED, "a later send gave %s", mega_status_str(st));
  MP_CHECK(mega_comm_status(c, NULL) == MEGA_ERR_CANCELLED, "status after abort");
  free(buf);
  mega_comm_destroy(c);
  return 0;
}

/* Only rank 0 of a group of 2 ever joins: creation times out, through the
 * FileStore and through the C vtable store. */
static int body_lonely(int rank, const mp_env *env) {
  for (int kv = 0; kv < 2; kv++) {
    mega_store *store = mp_store(env, kv);
    MP_CHECK(store, "no store");
    mega_comm *c = NULL;
    mega_err err = {0};
    double t0 = mp_now_ms();
    mega_status st = mega_comm_create(store, kv ? "kv" : "file", 0, 2, NULL, 800, &c, &err);
    double dt = mp_now_ms() - t0;
    mega_store_close(store);
    MP_CHECK(st == MEGA_ERR_TIMEOUT && !c, "create gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt > 700 && dt < 3000, "create gave up after %.0f ms", dt);
  }
  return 0;
}

/* Rank 1 stops halfway through a transfer with rank 0, then dies. Gloo
 * never wakes a wait on a transfer under way when its connection fails, so
 * only the communicator can: after mega_comm_abort, freeing the request and
 * destroying the communicator must take well under the 10 s timeout. With
 * a broadcast from rank 0 (64 MiB), rank 0's send is half written (rank 1
 * stops before it starts); with a 64M-float all-reduce, rank 1 stops 20 ms
 * into it, and rank 0 may be half way through receiving a chunk too. */
static int body_killed_mid_transfer(int rank, const mp_env *env) {
  bool reduce = *(const bool *)env->arg;
  mega_err err = {0};
  mega_comm *c = open_comm(env, "mt", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  const size_t n = reduce ? 64u << 20 : 16u << 20; /* floats */
  float *buf = calloc(n, sizeof(float));
  MP_CHECK(buf, "malloc");
  char path[512];
  snprintf(path, sizeof path, "%s/victim", env->dir);
  mega_req *r = NULL;
  if (reduce) MP_OK(mega_comm_iall_reduce(c, buf, n, 0, &r, &err), err);
  if (rank == 1) {
    if (!reduce) MP_OK(mega_comm_ibroadcast(c, buf, n, MEGA_DT_F32, 0, 0, &r, &err), err);
    /* under way, or the receive posted: 20 ms into a 256 MiB all-reduce
     * (at 150 ms a quiet machine had finished it, and the test saw the
     * collective succeed) */
    mp_sleep_ms(reduce ? 20 : 100);
    if (reduce) {
      bool done = false;
      MP_OK(mega_req_test(r, &done, &err), err);
      MP_CHECK(!done, "the all-reduce finished in 20 ms: the test needs a bigger one");
    }
    FILE *f = fopen(path, "w");
    MP_CHECK(f, "cannot write %s", path);
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    raise(SIGSTOP); /* rank 0 kills it */
    return 1;
  }
  int victim = 0;
  for (int i = 0; i < 500 && !victim; i++) {
    FILE *f = fopen(path, "r");
    if (!f || fscanf(f, "%d", &victim) != 1) victim = 0;
    if (f) fclose(f);
    if (!victim) mp_sleep_ms(10);
  }
  MP_CHECK(victim > 0, "rank 1 never wrote %s", path);
  char stat[64], line[256] = "";
  snprintf(stat, sizeof stat, "/proc/%d/stat", victim);
  for (int i = 0; i < 500; i++) {
    FILE *f = fopen(stat, "r");
    if (f && fgets(line, sizeof line, f) && strstr(line, ") T ")) {
      fclose(f);
      break;
    }
    if (f) fclose(f);
    mp_sleep_ms(10);
  }
  MP_CHECK(strstr(line, ") T "), "rank 1 did not stop: %s", line);
  if (!reduce) MP_OK(mega_comm_ibroadcast(c, buf, n, MEGA_DT_F32, 0, 0, &r, &err), err);
  mp_sleep_ms(300); /* the sockets fill up; rank 1 reads nothing more */
  kill(victim, SIGKILL);
  mp_sleep_ms(300); /* the connection resets */
  double t0 = mp_now_ms();
  mega_comm_abort(c);
  mega_status st = mega_req_wait(r, 0, &err);
  MP_CHECK(st != MEGA_OK, "the collective with a dead rank succeeded");
  mega_req_free(r);
  mega_comm_destroy(c);
  double dt = mp_now_ms() - t0;
  MP_CHECK(dt < 3000, "freeing the collective took %.0f ms after the abort", dt);
  free(buf);
  return 0;
}

/* Freeing a receive that has not completed breaks the communicator (Gloo
 * cannot withdraw it); the peer hears of it. */
static int body_free_pending(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "g", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  int v = 0;
  mega_req *r;
  if (rank == 0) {
    MP_OK(mega_comm_irecv(c, &v, sizeof v, 1, 1, &r, &err), err);
    mega_req_free(r);
    mega_status st = mega_comm_status(c, &err);
    MP_CHECK(st == MEGA_ERR_CANCELLED && strstr(err.msg, "freed before it completed"),
             "status %s: %s", mega_status_str(st), err.msg);
  } else {
    MP_OK(mega_comm_irecv(c, &v, sizeof v, 0, 1, &r, &err), err);
    mega_status st = mega_req_wait(r, 0, &err);
    mega_req_free(r);
    MP_CHECK(st == MEGA_ERR_PEER, "rank 1's wait gave %s: %s", mega_status_str(st), err.msg);
  }
  mega_comm_destroy(c);
  return 0;
}

static void test_killed_mid_recv(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_killed_mid_recv, NULL, 15000, 1u << 1), 0);
}

static void test_killed_mid_send(void **state) {
  (void)state;
  bool reduce = false;
  assert_int_equal(mp_run(2, body_killed_mid_transfer, &reduce, 20000, 1u << 1), 0);
}

static void test_killed_mid_all_reduce(void **state) {
  (void)state;
  bool reduce = true;
  assert_int_equal(mp_run(2, body_killed_mid_transfer, &reduce, 20000, 1u << 1), 0);
}

static void test_killed_in_collective(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_killed_in_collective, NULL, 15000, 1u << 2), 0);
}

static void test_dead_peer_named_same_host(void **state) {
  (void)state;
  bool own_hosts = false;
  assert_int_equal(mp_run(3, body_dead_peer_named, &own_hosts, 15000, 1u << 2), 0);
}

static void test_dead_peer_named_own_hosts(void **state) {
  (void)state;
  bool own_hosts = true;
  assert_int_equal(mp_run(3, body_dead_peer_named, &own_hosts, 15000, 1u << 2), 0);
}

static void test_silent_peer_times_out(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_silent_peer, NULL, 15000, 0), 0);
}

static void test_abort_from_thread(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_abort, NULL, 15000, 0), 0);
}

static void test_rank_never_joins(void **state) {
  (void)state;
  assert_int_equal(mp_run(1, body_lonely, NULL, 15000, 0), 0);
}

static void test_free_pending_request(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_free_pending, NULL, 15000, 0), 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_mid_recv),
      cmocka_unit_test(test_killed_mid_send),
      cmocka_unit_test(test_killed_mid_all_reduce),
      cmocka_unit_test(test_killed_in_collective),
      cmocka_unit_test(test_dead_peer_named_same_host),
      cmocka_unit_test(test_dead_peer_named_own_hosts),
      cmocka_unit_test(test_silent_peer_times_out),
      cmocka_unit_test(test_abort_from_thread),
      cmocka_unit_test(test_rank_never_joins),
      cmocka_unit_test(test_free_pending_request),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
