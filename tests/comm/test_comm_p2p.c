/* Point-to-point over Gloo between forked ranks on loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "tests/comm/mp.h"

#define TIMEOUT_MS 10000

static mega_comm *open_comm(const mp_env *env, const char *group, int rank,
                            int size, bool kv) {
  mega_store *store = mp_store(env, kv);
  if (!store) return NULL;
  mega_comm *c = NULL;
  mega_err err = {0};
  mega_status st = mega_comm_create(store, group, rank, size, NULL, TIMEOUT_MS, &c, &err);
  mega_store_close(store);
  if (st != MEGA_OK)
    fprintf(stderr, "rank %d: creating '%s': %s: %s\n", rank, group,
            mega_status_str(st), err.msg);
  return c;
}

static void fill(uint8_t *p, size_t n, int seed) {
  for (size_t i = 0; i < n; i++) p[i] = mp_byte(seed, i);
}

static size_t first_bad(const uint8_t *p, size_t n, int seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != mp_byte(seed, i)) return i;
  return n;
}

/* Sizes from 0 to several MiB, one direction then the other. */
static int body_sizes(int rank, const mp_env *env) {
  static const size_t sizes[] = {0, 1, 7, 4096, 65537, (4u << 20) + 3};
  mega_err err = {0};
  mega_comm *c = open_comm(env, "pp", rank, 2, false);
  MP_CHECK(c, "no communicator");
  MP_CHECK(mega_comm_rank(c) == rank && mega_comm_size(c) == 2, "rank/size");
  int peer = 1 - rank;
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t n = sizes[k];
    uint8_t *buf = n ? malloc(n) : NULL;
    MP_CHECK(n == 0 || buf, "malloc");
    for (int dir = 0; dir < 2; dir++) {
      int sender = dir;  /* rank 0 sends first, then rank 1 */
      mega_req *r = NULL;
      if (rank == sender) {
        fill(buf, n, 10 * (int)k + dir);
        MP_OK(mega_comm_isend(c, buf, n, peer, (uint32_t)k, &r, &err), err);
      } else {
        if (n) memset(buf, 0xee, n);
        MP_OK(mega_comm_irecv(c, buf, n, peer, (uint32_t)k, &r, &err), err);
      }
      MP_OK(mega_req_wait(r, 0, &err), err);
      MP_OK(mega_req_wait(r, 0, &err), err); /* a completed request stays so */
      mega_req_free(r);
      if (rank != sender) {
        size_t bad = first_bad(buf, n, 10 * (int)k + dir);
        MP_CHECK(bad == n, "size %zu: byte %zu differs", n, bad);
      }
    }
    free(buf);
  }
  MP_OK(mega_comm_status(c, &err), err);
  mega_comm_destroy(c);
  return 0;
}

/* Many requests in flight on one pair, in both directions, posted in
 * different orders on the two sides, matched by tag; same-tag messages
 * match in posting order. Goes through the C vtable store. Receives are
 * polled with mega_req_test, sends waited on. */
#define NTAG 8
#define NSAME 3
static size_t tag_size(int k) { return k == 3 ? (4u << 20) : 1000 + (size_t)k * 12345; }

static int body_outstanding(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "pair", rank, 2, true);
  MP_CHECK(c, "no communicator");
  int peer = 1 - rank;
  uint8_t *rbuf[NTAG], *sbuf[NTAG];
  mega_req *rreq[NTAG + NSAME], *sreq[NTAG + NSAME];
  uint8_t same_in[NSAME][64], same_out[NSAME][64];
  for (int k = 0; k < NTAG; k++) {
    rbuf[k] = calloc(1, tag_size(k));
    sbuf[k] = malloc(tag_size(k));
    MP_CHECK(rbuf[k] && sbuf[k], "malloc");
    fill(sbuf[k], tag_size(k), 100 * rank + k);
  }
  /* Rank 0 posts receives first, rank 1 sends first; tags in opposite
   * orders on the two sides. */
  for (int phase = 0; phase < 2; phase++) {
    bool recv_phase = (phase == 0) == (rank == 0);
    for (int i = 0; i < NTAG; i++) {
      int k = recv_phase ? i : NTAG - 1 - i;
      if (recv_phase)
        MP_OK(mega_comm_irecv(c, rbuf[k], tag_size(k), peer, (uint32_t)k, &rreq[k], &err), err);
      else
        MP_OK(mega_comm_isend(c, sbuf[k], tag_size(k), peer, (uint32_t)k, &sreq[k], &err), err);
    }
    for (int j = 0; j < NSAME; j++) {
      if (recv_phase) {
        memset(same_in[j], 0, sizeof same_in[j]);
        MP_OK(mega_comm_irecv(c, same_in[j], 64, peer, 100, &rreq[NTAG + j], &err), err);
      } else {
        memset(same_out[j], 'a' + j, sizeof same_out[j]);
        MP_OK(mega_comm_isend(c, same_out[j], 64, peer, 100, &sreq[NTAG + j], &err), err);
      }
    }
  }
  /* Poll the receives until all are done. */
  int pending = NTAG + NSAME;
  bool done[NTAG + NSAME] = {false};
  double end = mp_now_ms() + TIMEOUT_MS;
  while (pending > 0) {
    for (int k = 0; k < NTAG + NSAME; k++) {
      if (done[k]) continue;
      MP_OK(mega_req_test(rreq[k], &done[k], &err), err);
      if (done[k]) pending--;
    }
    MP_CHECK(mp_now_ms() < end, "%d receives still pending", pending);
    if (pending) mp_sleep_ms(1);
  }
  for (int k = NTAG + NSAME - 1; k >= 0; k--) {
    MP_OK(mega_req_wait(sreq[k], 0, &err), err);
    mega_req_free(sreq[k]);
    MP_OK(mega_req_wait(rreq[k], 0, &err), err);
    mega_req_free(rreq[k]);
  }
  for (int k = 0; k < NTAG; k++) {
    size_t bad = first_bad(rbuf[k], tag_size(k), 100 * peer + k);
    MP_CHECK(bad == tag_size(k), "tag %d: byte %zu differs", k, bad);
    free(rbuf[k]);
    free(sbuf[k]);
  }
  for (int j = 0; j < NSAME; j++)
    MP_CHECK(same_in[j][0] == 'a' + j && same_in[j][63] == 'a' + j,
             "same-tag message %d arrived as '%c'", j, same_in[j][0]);
  mega_comm_destroy(c);
  return 0;
}

/* A receive polled before its send exists stays not done, and completes
 * once the peer sends. */
static int body_test_before_send(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_comm(env, "late", rank, 2, false);
  MP_CHECK(c, "no communicator");
  int v = rank == 1 ? 4242 : 0;
  mega_req *r = NULL;
  if (rank == 0) {
    MP_OK(mega_comm_irecv(c, &v, sizeof v, 1, 9, &r, &err), err);
    bool done = true;
    MP_OK(mega_req_test(r, &done, &err), err);
    MP_CHECK(!done, "a receive completed before anything was sent");
    double end = mp_now_ms() + TIMEOUT_MS;
    while (!done) {
      MP_OK(mega_req_test(r, &done, &err), err);
      MP_CHECK(mp_now_ms() < end, "receive never completed");
      mp_sleep_ms(1);
    }
    MP_CHECK(v == 4242, "received %d", v);
  } else {
    mp_sleep_ms(300);
    MP_OK(mega_comm_isend(c, &v, sizeof v, 0, 9, &r, &err), err);
    MP_OK(mega_req_wait(r, 0, &err), err);
  }
  mega_req_free(r);
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  mega_comm_destroy(c);
  return 0;
}

/* Four ranks: every rank sends to both neighbours and to the rank across,
 * all at once, for several rounds. */
static int body_ring4(int rank, const mp_env *env) {
  mega_err err = {0};
  int n = env->nranks;
  mega_comm *c = open_comm(env, "ring", rank, n, false);
  MP_CHECK(c, "no communicator");
  const size_t len = 1u << 20;
  int peers[3] = {(rank + 1) % n, (rank + n - 1) % n, (rank + 2) % n};
  uint8_t *out = malloc(len), *in[3];
  MP_CHECK(out, "malloc");
  for (int p = 0; p < 3; p++) MP_CHECK((in[p] = malloc(len)) != NULL, "malloc");
  for (int round = 0; round < 4; round++) {
    fill(out, len, 1000 * round + rank);
    mega_req *rq[6];
    for (int p = 0; p < 3; p++) {
      MP_OK(mega_comm_irecv(c, in[p], len, peers[p], (uint32_t)round, &rq[p], &err), err);
      MP_OK(mega_comm_isend(c, out, len, peers[p], (uint32_t)round, &rq[3 + p], &err), err);
    }
    for (int k = 0; k < 6; k++) {
      MP_OK(mega_req_wait(rq[k], 0, &err), err);
      mega_req_free(rq[k]);
    }
    for (int p = 0; p < 3; p++) {
      size_t bad = first_bad(in[p], len, 1000 * round + peers[p]);
      MP_CHECK(bad == len, "round %d from rank %d: byte %zu differs", round, peers[p], bad);
    }
  }
  free(out);
  for (int p = 0; p < 3; p++) free(in[p]);
  mega_comm_destroy(c);
  return 0;
}

/* The kernel's cap on a receive buffer a process may ask for. */
static long rmem_max(void) {
  FILE *f = fopen("/proc/sys/net/core/rmem_max", "r");
  long v = -1;
  if (f && fscanf(f, "%ld", &v) != 1) v = -1;
  if (f) fclose(f);
  return v;
}

/* Every connection of the mesh has a receive buffer of 128 segments or
 * the most the kernel allows: with loopback's 64 KiB segments the default
 * 128 KiB left messages of that size waiting 40 ms for a delayed ACK. The
 * child has no sockets but the communicator's. */
static int body_windows(int rank, const mp_env *env) {
  mega_comm *c = open_comm(env, "win", rank, env->nranks, false);
  MP_CHECK(c, "no communicator");
  DIR *d = opendir("/proc/self/fd");
  MP_CHECK(d, "no /proc/self/fd");
  int seen = 0, bad = 0;
  long cap = rmem_max();
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    int fd = atoi(e->d_name);
    struct sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d)) continue;
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0) continue;
    int mss = 0, buf = 0;
    socklen_t l = sizeof mss, bl = sizeof buf;
    if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) != 0) continue;
    MP_CHECK(getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, &bl) == 0, "SO_RCVBUF");
    long want = 128L * mss;
    if (cap > 0 && want > cap) want = cap;
    if (buf < want) {
      fprintf(stderr, "rank %d: fd %d: receive buffer %d, segment %d\n", rank, fd, buf, mss);
      bad++;
    }
    seen++;
  }
  closedir(d);
  MP_CHECK(seen == env->nranks - 1, "%d connections, not %d", seen, env->nranks - 1);
  MP_CHECK(bad == 0, "%d of %d connections keep a narrow receive window", bad, seen);
  mega_comm_destroy(c);
  return 0;
}

static void test_sizes(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_sizes, NULL, 15000, 0), 0);
}

static void test_outstanding_kv_store(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_outstanding, NULL, 15000, 0), 0);
}

static void test_poll_before_send(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_test_before_send, NULL, 15000, 0), 0);
}

static void test_ring4(void **state) {
  (void)state;
  assert_int_equal(mp_run(4, body_ring4, NULL, 15000, 0), 0);
}

static void test_receive_windows(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_windows, NULL, 15000, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_outstanding_kv_store),
      cmocka_unit_test(test_poll_before_send),
      cmocka_unit_test(test_ring4),
      cmocka_unit_test(test_receive_windows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
