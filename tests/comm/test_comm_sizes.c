/* Ranks that disagree on a collective: other sizes, another operation,
 * another root. Gloo's TCP pair enforces on its own event loop thread that
 * a message fits the receive posted for it, so a larger send used to end
 * the receiving process (std::terminate on gloo::EnforceNotMet), and
 * through shared memory the ranks read each other's slots past what was
 * written. Every rank must instead get MEGA_ERR_INVALID naming the
 * operation and both sizes, and every later call must fail at once; a
 * send and receive of other sizes time out instead of ending the process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/comm/mp.h"

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE_SCATTER } op_kind;

typedef struct sizes_case {
  bool here;      /* the group on this node: shared memory */
  op_kind op[4];  /* each rank's operation */
  size_t count[4];
  int root[4];    /* OP_BROADCAST */
  int ranks;
  const char *want[4]; /* what every rank's message must hold */
} sizes_case;

static mega_comm *open_group(const mp_env *env, bool here, int rank, int size) {
  mega_store *store = mp_store(env, false);
  if (!store) return NULL;
  mega_comm *c = NULL;
  mega_err err = {0};
  mega_status st = here ? mega_store_group_here(store, "dp", &err) : MEGA_OK;
  if (st == MEGA_OK) st = mega_comm_create(store, "dp", rank, size, NULL, 10000, &c, &err);
  mega_store_close(store);
  if (st != MEGA_OK)
    fprintf(stderr, "rank %d: creating 'dp': %s: %s\n", rank, mega_status_str(st), err.msg);
  return c;
}

/* This rank's collective of the case; counts[] for the gather and scatter
 * are every rank's count as this rank sees it: its own count for each. */
static mega_status run_op(mega_comm *c, const sizes_case *k, int rank, float *buf,
                          float *out, mega_err *err) {
  size_t n = k->count[rank], counts[4];
  for (int i = 0; i < k->ranks; i++) counts[i] = n;
  switch (k->op[rank]) {
  case OP_ALL_REDUCE: return mega_comm_all_reduce(c, buf, n, 0, err);
  case OP_ALL_GATHER:
    return mega_comm_all_gather(c, buf, out, counts, MEGA_DT_F32, 0, err);
  case OP_BROADCAST: return mega_comm_broadcast(c, buf, n, MEGA_DT_F32, k->root[rank], 0, err);
  case OP_REDUCE_SCATTER: return mega_comm_reduce_scatter(c, buf, out, counts, 0, err);
  }
  return MEGA_ERR_INTERNAL;
}

static int body_sizes(int rank, const mp_env *env) {
  const sizes_case *k = env->arg;
  mega_err err = {0};
  mega_comm *c = open_group(env, k->here, rank, k->ranks);
  MP_CHECK(c, "no communicator");
  MP_CHECK(strcmp(mega_comm_transport(c), k->here ? "gloo+shm" : "gloo") == 0, "transport %s",
           mega_comm_transport(c));
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  size_t most = 0;
  for (int i = 0; i < k->ranks; i++) most = k->count[i] > most ? k->count[i] : most;
  float *buf = calloc(most * 4 + 1, sizeof *buf), *out = calloc(most * 4 + 1, sizeof *out);
  MP_CHECK(buf && out, "calloc");
  double t0 = mp_now_ms();
  mega_status st = run_op(c, k, rank, buf, out, &err);
  double dt = mp_now_ms() - t0;
  fprintf(stderr, "rank %d: %s: %s\n", rank, mega_status_str(st), err.msg);
  MP_CHECK(st == MEGA_ERR_INVALID, "gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(dt < 5000, "the disagreement took %.0f ms to find", dt);
  for (int i = 0; i < 4 && k->want[i]; i++)
    MP_CHECK(strstr(err.msg, k->want[i]), "the message lacks '%s': %s", k->want[i], err.msg);
  MP_CHECK(strstr(err.msg, "group 'dp'"), "the message does not name the group: %s", err.msg);
  /* broken: every later call fails at once with the same cause */
  mega_err later = {0};
  float x = 1;
  st = mega_comm_all_reduce(c, &x, 1, 0, &later);
  MP_CHECK(st == MEGA_ERR_INVALID && !strcmp(later.msg, err.msg), "a later call gave %s: %s",
           mega_status_str(st), later.msg);
  free(buf);
  free(out);
  mega_comm_destroy(c);
  return 0;
}

/* A send larger than its receive: Gloo cannot take it, so the two never
 * match (the size is part of the slot) and both time out, saying that the
 * sizes may differ. */
static int body_p2p(int rank, const mp_env *env) {
  (void)env->arg;
  mega_err err = {0};
  mega_comm *c = open_group(env, false, rank, 2);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  char buf[200] = {0};
  mega_req *r;
  if (rank == 0) MP_OK(mega_comm_isend(c, buf, 200, 1, 7, &r, &err), err);
  else MP_OK(mega_comm_irecv(c, buf, 100, 0, 7, &r, &err), err);
  mega_status st = mega_req_wait(r, 1000, &err);
  mega_req_free(r);
  fprintf(stderr, "rank %d: %s: %s\n", rank, mega_status_str(st), err.msg);
  /* the first to time out breaks the group: the other may hear that first */
  MP_CHECK(st == MEGA_ERR_TIMEOUT || st == MEGA_ERR_PEER, "gave %s: %s", mega_status_str(st),
           err.msg);
  MP_CHECK(st != MEGA_ERR_TIMEOUT || strstr(err.msg, "another size"),
           "the message does not say the sizes may differ: %s", err.msg);
  mega_comm_destroy(c);
  return 0;
}

static void test_p2p_sizes_tcp(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_p2p, NULL, 20000, 0), 0);
}

static void run_case(const sizes_case *k) {
  assert_int_equal(mp_run(k->ranks, body_sizes, (void *)k, 20000, 0), 0);
}

/* The larger send is the one Gloo cannot take. */
static void test_all_reduce_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 2, .count = {100, 200}, .want = {"all_reduce", "100", "200"}};
  run_case(&k);
}

static void test_all_reduce_tcp_three(void **state) {
  (void)state;
  sizes_case k = {.ranks = 3,
                  .count = {5000, 5000, 7000},
                  .want = {"all_reduce", "5000", "7000"}};
  run_case(&k);
}

static void test_all_reduce_shm(void **state) {
  (void)state;
  sizes_case k = {.here = true, .ranks = 2, .count = {100, 200},
                  .want = {"all_reduce", "100", "200"}};
  run_case(&k);
}

static void test_all_gather_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 2,
                  .op = {OP_ALL_GATHER, OP_ALL_GATHER},
                  .count = {64, 96},
                  .want = {"all_gather", "128", "192"}};
  run_case(&k);
}

static void test_all_gather_small_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 3,
                  .op = {OP_ALL_GATHER, OP_ALL_GATHER, OP_ALL_GATHER},
                  .count = {8, 8, 9},
                  .want = {"all_gather", "24", "27"}};
  run_case(&k);
}

static void test_reduce_scatter_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 2,
                  .op = {OP_REDUCE_SCATTER, OP_REDUCE_SCATTER},
                  .count = {300, 100},
                  .want = {"reduce_scatter", "600", "200"}};
  run_case(&k);
}

static void test_broadcast_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 2,
                  .op = {OP_BROADCAST, OP_BROADCAST},
                  .count = {4096, 1024},
                  .want = {"broadcast", "4096", "1024"}};
  run_case(&k);
}

static void test_broadcast_root_shm(void **state) {
  (void)state;
  sizes_case k = {.here = true,
                  .ranks = 2,
                  .op = {OP_BROADCAST, OP_BROADCAST},
                  .count = {64, 64},
                  .root = {0, 1},
                  .want = {"broadcast", "root 0", "root 1"}};
  run_case(&k);
}

static void test_other_operation_tcp(void **state) {
  (void)state;
  sizes_case k = {.ranks = 2,
                  .op = {OP_ALL_REDUCE, OP_BROADCAST},
                  .count = {64, 64},
                  .want = {"all_reduce of 64 floats", "broadcast of 64 floats"}};
  run_case(&k);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_reduce_tcp),
      cmocka_unit_test(test_all_reduce_tcp_three),
      cmocka_unit_test(test_all_reduce_shm),
      cmocka_unit_test(test_all_gather_tcp),
      cmocka_unit_test(test_all_gather_small_tcp),
      cmocka_unit_test(test_reduce_scatter_tcp),
      cmocka_unit_test(test_broadcast_tcp),
      cmocka_unit_test(test_broadcast_root_shm),
      cmocka_unit_test(test_other_operation_tcp),
      cmocka_unit_test(test_p2p_sizes_tcp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
