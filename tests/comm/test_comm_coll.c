/* Collectives over Gloo between forked ranks on loopback, checked against
 * results computed locally from every rank's (deterministic) inputs; the
 * *_here tests mark the groups as all on this node, so that their
 * collectives go through shared memory (gloo_shm.cc). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/comm/mp.h"

#define TIMEOUT_MS 10000

/* env->arg: NULL, or a bool that says whether to mark the group here. */
static mega_comm *open_comm(const mp_env *env, const char *group, int rank,
                            int size, bool kv) {
  mega_store *store = mp_store(env, kv);
  if (!store) return NULL;
  bool here = env->arg && *(const bool *)env->arg;
  mega_comm *c = NULL;
  mega_err err = {0};
  mega_status st = here ? mega_store_group_here(store, group, &err) : MEGA_OK;
  if (st == MEGA_OK)
    st = mega_comm_create(store, group, rank, size, NULL, TIMEOUT_MS, &c, &err);
  mega_store_close(store);
  if (st != MEGA_OK) {
    fprintf(stderr, "rank %d: creating '%s': %s: %s\n", rank, group,
            mega_status_str(st), err.msg);
    return NULL;
  }
  const char *want = here && size > 1 ? "gloo+shm" : "gloo";
  if (strcmp(mega_comm_transport(c), want) != 0) {
    fprintf(stderr, "rank %d: '%s' moves collectives by %s, want %s\n", rank, group,
            mega_comm_transport(c), want);
    mega_comm_destroy(c);
    return NULL;
  }
  return c;
}

static float sum_over(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; r++) s += mp_val(r, i);
  return s;
}

/* Uneven per-rank counts, zeros included; `set` picks one of several. The
 * last ones take several of shared memory's windows (a slot is 1 MB at two
 * ranks, shared by all parts in a reduce-scatter). */
static size_t count_of(int set, int r) {
  static const size_t sets[][4] = {{3, 0, 5, 1},      {1000, 70001, 3, 12},
                                   {4, 4, 4, 4},      {0, 0, 0, 0},
                                   {0, 2, 0, 9},      {300001, 5, 0, 150000}};
  return sets[set][r];
}
#define NSETS 6

static float max_over(int n, size_t i) {
  float m = mp_val(0, i);
  for (int r = 1; r < n; r++) m = mp_val(r, i) > m ? mp_val(r, i) : m;
  return m;
}

/* Sums and maxima; the ring cuts a chunk into segments of at most 1M
 * floats, so the largest size takes three per chunk at two ranks. */
static int check_all_reduce(int rank, int n, mega_comm *c) {
  static const size_t sizes[] = {0, 1, 5, 4099, 262147, 4194319};
  mega_err err = {0};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t len = sizes[k];
    float *buf = malloc((len ? len : 1) * sizeof(float));
    MP_CHECK(buf, "malloc");
    for (int max = 0; max < 2; max++) {
      for (size_t i = 0; i < len; i++) buf[i] = mp_val(rank, i);
      if (max)
        MP_OK(mega_comm_all_reduce_max(c, buf, len, 0, &err), err);
      else
        MP_OK(mega_comm_all_reduce(c, buf, len, 0, &err), err);
      for (size_t i = 0; i < len; i++) {
        float want = max ? max_over(n, i) : sum_over(n, i);
        MP_CHECK(buf[i] == want, "all_reduce%s of %zu: [%zu] = %g, want %g",
                 max ? "_max" : "", len, i, buf[i], want);
      }
    }
    free(buf);
  }
  return 0;
}

static int check_all_gather(int rank, int n, mega_comm *c) {
  mega_err err = {0};
  for (int set = 0; set < NSETS; set++) {
    size_t counts[4], total = 0, before = 0;
    for (int r = 0; r < n; r++) {
      counts[r] = count_of(set, r);
      if (r < rank) before += counts[r];
      total += counts[r];
    }
    for (int dt = 0; dt < 2; dt++) {
      size_t esz = dt == 0 ? sizeof(float) : 1;
      for (int in_place = 0; in_place < 2; in_place++) {
        uint8_t *out = malloc(total * esz + 1), *in = malloc(counts[rank] * esz + 1);
        MP_CHECK(out && in, "malloc");
        memset(out, 0x5a, total * esz + 1);
        for (size_t i = 0; i < counts[rank]; i++) {
          if (dt == 0)
            ((float *)in)[i] = mp_val(rank, i);
          else
            in[i] = mp_byte(rank, i);
        }
        const void *src = in;
        if (in_place) {
          memcpy(out + before * esz, in, counts[rank] * esz);
          src = out + before * esz;
        }
        MP_OK(mega_comm_all_gather(c, src, out, counts, dt == 0 ? MEGA_DT_F32 : MEGA_DT_BYTE,
                                   0, &err), err);
        size_t at = 0;
        for (int r = 0; r < n; r++) {
          for (size_t i = 0; i < counts[r]; i++, at++) {
            if (dt == 0)
              MP_CHECK(((float *)out)[at] == mp_val(r, i),
                       "all_gather set %d: rank %d's [%zu] = %g", set, r, i,
                       ((float *)out)[at]);
            else
              MP_CHECK(out[at] == mp_byte(r, i), "all_gather bytes set %d: rank %d's [%zu]",
                       set, r, i);
          }
        }
        MP_CHECK(out[total * esz] == 0x5a, "all_gather wrote past the end");
        free(out);
        free(in);
      }
    }
  }
  return 0;
}

static int check_broadcast(int rank, int n, mega_comm *c) {
  mega_err err = {0};
  for (int root = 0; root < n; root++) {
    size_t nf = 1001 + (size_t)root, nb = 77777 + (size_t)root * 1500000;
    float *f = malloc(nf * sizeof(float));
    uint8_t *b = malloc(nb);
    MP_CHECK(f && b, "malloc");
    for (size_t i = 0; i < nf; i++) f[i] = rank == root ? mp_val(root, i) : -1.0f;
    for (size_t i = 0; i < nb; i++) b[i] = rank == root ? mp_byte(root, i) : 0;
    MP_OK(mega_comm_broadcast(c, f, nf, MEGA_DT_F32, root, 0, &err), err);
    MP_OK(mega_comm_broadcast(c, b, nb, MEGA_DT_BYTE, root, 0, &err), err);
    for (size_t i = 0; i < nf; i++)
      MP_CHECK(f[i] == mp_val(root, i), "broadcast from %d: [%zu] = %g", root, i, f[i]);
    for (size_t i = 0; i < nb; i++)
      MP_CHECK(b[i] == mp_byte(root, i), "broadcast bytes from %d: [%zu]", root, i);
    free(f);
    free(b);
  }
  return 0;
}

static int check_reduce_scatter(int rank, int n, mega_comm *c) {
  mega_err err = {0};
  for (int set = 0; set < NSETS; set++) {
    size_t counts[4], total = 0, off = 0;
    for (int r = 0; r < n; r++) {
      counts[r] = count_of(set, r);
      if (r < rank) off += counts[r];
      total += counts[r];
    }
    float *in = malloc((total + 1) * sizeof(float));
    float *out = malloc((counts[rank] + 1) * sizeof(float));
    MP_CHECK(in && out, "malloc");
    for (size_t i = 0; i < total; i++) in[i] = mp_val(rank, i);
    out[counts[rank]] = 12345.0f;
    MP_OK(mega_comm_reduce_scatter(c, in, out, counts, 0, &err), err);
    for (size_t i = 0; i < counts[rank]; i++)
      MP_CHECK(out[i] == sum_over(n, off + i), "reduce_scatter set %d: [%zu] = %g, want %g",
               set, i, out[i], sum_over(n, off + i));
    MP_CHECK(out[counts[rank]] == 12345.0f, "reduce_scatter wrote past its chunk");
    for (size_t i = 0; i < total; i++)
      MP_CHECK(in[i] == mp_val(rank, i), "reduce_scatter changed its input");
    /* in place: into this rank's own part of in; the rest stays */
    MP_OK(mega_comm_reduce_scatter(c, in, in + off, counts, 0, &err), err);
    for (size_t i = 0; i < total; i++) {
      float want = i >= off && i < off + counts[rank] ? sum_over(n, i) : mp_val(rank, i);
      MP_CHECK(in[i] == want, "in-place reduce_scatter set %d: [%zu] = %g, want %g", set, i,
               in[i], want);
    }
    free(in);
    free(out);
  }
  return 0;
}

static int body_collectives(int rank, const mp_env *env) {
  int n = env->nranks;
  mega_err err = {0};
  mega_comm *c = open_comm(env, "world", rank, n, false);
  MP_CHECK(c, "no communicator");
  if (check_all_reduce(rank, n, c)) return 1;
  if (check_all_gather(rank, n, c)) return 1;
  if (check_broadcast(rank, n, c)) return 1;
  if (check_reduce_scatter(rank, n, c)) return 1;
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  MP_OK(mega_comm_status(c, &err), err);
  mega_comm_destroy(c);
  return 0;
}

/* Asynchronous collectives queued back to back, with P2P traffic on the
 * same communicator while they run; waited on in reverse order. */
static int body_async_overlap(int rank, const mp_env *env) {
  int n = env->nranks;
  mega_err err = {0};
  mega_comm *c = open_comm(env, "world", rank, n, false);
  MP_CHECK(c, "no communicator");
  const size_t big = 1u << 20, pl = 1u << 18;
  float *a = malloc(big * sizeof(float)), *rs_in = malloc(big * sizeof(float));
  size_t counts[4], off = 0;
  for (int r = 0; r < n; r++) {
    counts[r] = big / (size_t)n + (r == 0 ? big % (size_t)n : 0);
    if (r < rank) off += counts[r];
  }
  float *rs_out = malloc(counts[rank] * sizeof(float));
  float *send = malloc(pl * sizeof(float)), *recv = malloc(pl * sizeof(float));
  MP_CHECK(a && rs_in && rs_out && send && recv, "malloc");
  for (size_t i = 0; i < big; i++) a[i] = rs_in[i] = mp_val(rank, i);
  int bar = rank;

  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < big; i++) a[i] = mp_val(rank, i);
    mega_req *ar, *rs, *br, *p2p[2];
    MP_OK(mega_comm_iall_reduce(c, a, big, 0, &ar, &err), err);
    MP_OK(mega_comm_ireduce_scatter(c, rs_in, rs_out, counts, 0, &rs, &err), err);
    MP_OK(mega_comm_ibroadcast(c, &bar, sizeof bar, MEGA_DT_BYTE, round % n, 0, &br, &err), err);
    bool done = true;
    MP_OK(mega_req_test(ar, &done, &err), err);
    /* P2P to the ring neighbours while the collectives run. */
    for (size_t i = 0; i < pl; i++) send[i] = mp_val(rank + 100 * round, i);
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    MP_OK(mega_comm_irecv(c, recv, pl * sizeof(float), left, 77, &p2p[0], &err), err);
    MP_OK(mega_comm_isend(c, send, pl * sizeof(float), right, 77, &p2p[1], &err), err);
    for (int k = 0; k < 2; k++) {
      MP_OK(mega_req_wait(p2p[k], 0, &err), err);
      mega_req_free(p2p[k]);
    }
    for (size_t i = 0; i < pl; i++)
      MP_CHECK(recv[i] == mp_val(left + 100 * round, i), "p2p [%zu]", i);
    MP_OK(mega_req_wait(br, 0, &err), err);
    MP_OK(mega_req_wait(rs, 0, &err), err);
    MP_OK(mega_req_wait(ar, 0, &err), err);
    mega_req_free(br);
    mega_req_free(rs);
    mega_req_free(ar);
    MP_CHECK(bar == round % n, "broadcast gave %d", bar);
    bar = rank;
    for (size_t i = 0; i < big; i += 997)
      MP_CHECK(a[i] == sum_over(n, i), "all_reduce [%zu] = %g", i, a[i]);
    for (size_t i = 0; i < counts[rank]; i += 13)
      MP_CHECK(rs_out[i] == sum_over(n, off + i), "reduce_scatter [%zu]", i);
  }
  free(a), free(rs_in), free(rs_out), free(send), free(recv);
  mega_comm_destroy(c);
  return 0;
}

/* Four ranks in three groups, like TP=1 x PP=2 x DP=2: the world, data-
 * parallel groups {0,2} and {1,3}, pipeline groups {0,1} and {2,3}. The
 * DP all-reduce runs asynchronously while the pipeline pair exchanges
 * activations. Rendezvous through the C vtable store. */
static int body_subgroups(int rank, const mp_env *env) {
  mega_err err = {0};
  char dp_name[16], pp_name[16];
  snprintf(dp_name, sizeof dp_name, "dp%d", rank % 2);
  snprintf(pp_name, sizeof pp_name, "pp%d", rank / 2);
  mega_comm *world = open_comm(env, "world", rank, 4, true);
  mega_comm *dp = open_comm(env, dp_name, rank / 2, 2, true);
  mega_comm *pp = open_comm(env, pp_name, rank % 2, 2, true);
  MP_CHECK(world && dp && pp, "no communicator");
  MP_CHECK(mega_comm_rank(dp) == rank / 2 && mega_comm_size(dp) == 2, "dp rank");
  MP_CHECK(mega_comm_rank(pp) == rank % 2, "pp rank");

  enum { G = 100003 };
  float *grad = malloc(G * sizeof(float));
  MP_CHECK(grad, "malloc");
  for (size_t i = 0; i < G; i++) grad[i] = (float)(rank + 1) + (float)(i % 3);
  mega_req *ar;
  MP_OK(mega_comm_iall_reduce(dp, grad, G, 0, &ar, &err), err);

  float act[256], got[256];
  for (int i = 0; i < 256; i++) act[i] = (float)(rank * 1000 + i);
  mega_req *p;
  if (rank % 2 == 0) {
    MP_OK(mega_comm_isend(pp, act, sizeof act, 1, 0, &p, &err), err);
  } else {
    MP_OK(mega_comm_irecv(pp, got, sizeof got, 0, 0, &p, &err), err);
  }
  MP_OK(mega_req_wait(p, 0, &err), err);
  mega_req_free(p);
  if (rank % 2 == 1)
    for (int i = 0; i < 256; i++)
      MP_CHECK(got[i] == (float)((rank - 1) * 1000 + i), "activation [%d] = %g", i, got[i]);

  MP_OK(mega_req_wait(ar, 0, &err), err);
  mega_req_free(ar);
  /* Group {r%2, r%2+2}: (a+1) + (a+3) where a = rank % 2. */
  float base = (float)(rank % 2 + 1) + (float)(rank % 2 + 3);
  for (size_t i = 0; i < G; i++)
    MP_CHECK(grad[i] == base + 2.0f * (float)(i % 3), "dp sum [%zu] = %g", i, grad[i]);

  float one = 1.0f;
  MP_OK(mega_comm_all_reduce(world, &one, 1, 0, &err), err);
  MP_CHECK(one == 4.0f, "world sum %g", one);
  MP_OK(mega_comm_barrier(world, 0, &err), err);
  free(grad);
  mega_comm_destroy(pp);
  mega_comm_destroy(dp);
  mega_comm_destroy(world);
  return 0;
}

static void test_collectives_2(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_collectives, NULL, 20000, 0), 0);
}

static void test_collectives_3(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_collectives, NULL, 20000, 0), 0);
}

static void test_collectives_4(void **state) {
  (void)state;
  assert_int_equal(mp_run(4, body_collectives, NULL, 20000, 0), 0);
}

static void test_async_overlap(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_async_overlap, NULL, 20000, 0), 0);
}

static void test_subgroups(void **state) {
  (void)state;
  assert_int_equal(mp_run(4, body_subgroups, NULL, 20000, 0), 0);
}

static bool here = true;

static void test_collectives_here_2(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_collectives, &here, 20000, 0), 0);
}

static void test_collectives_here_3(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_collectives, &here, 20000, 0), 0);
}

static void test_collectives_here_4(void **state) {
  (void)state;
  assert_int_equal(mp_run(4, body_collectives, &here, 20000, 0), 0);
}

static void test_async_overlap_here(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_async_overlap, &here, 20000, 0), 0);
}

static void test_subgroups_here(void **state) {
  (void)state;
  assert_int_equal(mp_run(4, body_subgroups, &here, 20000, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collectives_2),
      cmocka_unit_test(test_collectives_3),
      cmocka_unit_test(test_collectives_4),
      cmocka_unit_test(test_async_overlap),
      cmocka_unit_test(test_subgroups),
      cmocka_unit_test(test_collectives_here_2),
      cmocka_unit_test(test_collectives_here_3),
      cmocka_unit_test(test_collectives_here_4),
      cmocka_unit_test(test_async_overlap_here),
      cmocka_unit_test(test_subgroups_here),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
