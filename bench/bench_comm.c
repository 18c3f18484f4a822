/* Communicator figures on one machine, with 2 and 4 ranks forked on it:
 * P2P bandwidth, small round-trip latency, a small all-gather's latency,
 * and all-reduce bus bandwidth. Every group is marked as all on this node,
 * as the worker marks its groups, so collectives go through shared memory;
 * MEGA_COMM_SHM=0 keeps them on Gloo's loopback TCP, for comparison. P2P is
 * TCP either way. Prints figures; never fails on a time.
 *
 *   bench_comm [ranks...]      (default: 2 4)
 *   bench_comm lanes [floats [buffers]]
 *                              k = 1, 2, 4 pairs of ranks, each pair
 *                              all-reducing floats (1M) at the same time, as
 *                              the data-parallel groups of k pipeline stages
 *                              do in the cooldown: the time of one all-reduce
 *                              for each k, and how many run at full speed at
 *                              once (lanes = k t1 / tk at its largest), the
 *                              figure core/sim's --grad-sync-lanes takes;
 *                              with buffers > 1 each call takes the next of
 *                              that many, so that with enough of them every
 *                              call finds its floats out of the caches, as
 *                              the engine's buckets are under
 *                              --simulate-compute */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/comm/mp.h"

#define TIMEOUT_MS 30000
#define WINDOW 8

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Ranks pair up (0-1, 2-3, ...); each even rank streams `count` messages of
 * `len` bytes to its odd partner, WINDOW in flight, all pairs at once. The
 * time runs from a barrier to the partner's 1-byte acknowledgement. */
static int p2p_bandwidth(int rank, int n, mega_comm *c, size_t len, int count) {
  mega_err err = {0};
  char *buf[WINDOW];
  for (int w = 0; w < WINDOW; w++) {
    buf[w] = malloc(len);
    MP_CHECK(buf[w], "malloc");
    memset(buf[w], rank, len);
  }
  int peer = rank ^ 1;
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  double t0 = mp_now_ms();
  mega_req *req[WINDOW] = {NULL};
  for (int i = 0; i < count; i++) {
    int w = i % WINDOW;
    if (req[w]) {
      MP_OK(mega_req_wait(req[w], 0, &err), err);
      mega_req_free(req[w]);
    }
    if (rank % 2 == 0)
      MP_OK(mega_comm_isend(c, buf[w], len, peer, 1, &req[w], &err), err);
    else
      MP_OK(mega_comm_irecv(c, buf[w], len, peer, 1, &req[w], &err), err);
  }
  for (int w = 0; w < WINDOW; w++) {
    if (!req[w]) continue;
    MP_OK(mega_req_wait(req[w], 0, &err), err);
    mega_req_free(req[w]);
  }
  char ack = 1;
  mega_req *r;
  if (rank % 2 == 0)
    MP_OK(mega_comm_irecv(c, &ack, 1, peer, 2, &r, &err), err);
  else
    MP_OK(mega_comm_isend(c, &ack, 1, peer, 2, &r, &err), err);
  MP_OK(mega_req_wait(r, 0, &err), err);
  mega_req_free(r);
  double ms = mp_now_ms() - t0;
  /* Gather every sender's time on rank 0. */
  float mine = (float)ms, all[16] = {0};
  size_t counts[16];
  for (int i = 0; i < n; i++) counts[i] = 1;
  MP_OK(mega_comm_all_gather(c, &mine, all, counts, MEGA_DT_F32, 0, &err), err);
  if (rank == 0) {
    double bytes = (double)len * count, sum = 0, worst = 0;
    for (int i = 0; i < n; i += 2) {
      double gbs = bytes / (all[i] * 1e-3) / 1e9;
      sum += gbs;
      if (all[i] > worst) worst = all[i];
    }
    printf("ranks=%d  p2p %5zu KiB: %5.2f GB/s per pair, %5.2f GB/s total over %d pair(s) "
           "(%d msgs, %d in flight, slowest pair %.0f ms)\n",
           n, len >> 10, sum / (n / 2), sum, n / 2, count, WINDOW, worst);
  }
  for (int w = 0; w < WINDOW; w++) free(buf[w]);
  return 0;
}

/* Ping-pong of 8 bytes between ranks 0 and 1; other ranks idle. */
static int round_trip(int rank, int n, mega_comm *c, int iters) {
  mega_err err = {0};
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank < 2) {
    double *rtt = malloc(sizeof(double) * (size_t)iters);
    MP_CHECK(rtt, "malloc");
    char msg[8] = {0};
    for (int i = 0; i < iters; i++) {
      double t0 = mp_now_ms();
      mega_req *r;
      for (int leg = 0; leg < 2; leg++) {
        bool send = (leg == 0) == (rank == 0);
        if (send)
          MP_OK(mega_comm_isend(c, msg, sizeof msg, 1 - rank, 3, &r, &err), err);
        else
          MP_OK(mega_comm_irecv(c, msg, sizeof msg, 1 - rank, 3, &r, &err), err);
        MP_OK(mega_req_wait(r, 0, &err), err);
        mega_req_free(r);
      }
      rtt[i] = (mp_now_ms() - t0) * 1e3;
    }
    if (rank == 0) {
      double mean = 0;
      for (int i = 0; i < iters; i++) mean += rtt[i];
      mean /= iters;
      qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
      printf("ranks=%d  p2p 8 B round trip: median %.1f us, p90 %.1f us, mean %.1f us "
             "(%d round trips, 0<->1)\n",
             n, rtt[iters / 2], rtt[iters * 9 / 10], mean, iters);
    }
    free(rtt);
  }
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  return 0;
}

/* 16 bytes from each rank to all, as the rank's sums of the norm and the
 * pipeline's statistics end every iteration: the median time of one. */
static int small_all_gather(int rank, int n, mega_comm *c, int iters) {
  mega_err err = {0};
  double mine[2] = {1, 2}, all[32], *t = malloc(sizeof(double) * (size_t)iters);
  MP_CHECK(t, "malloc");
  size_t counts[16];
  for (int i = 0; i < n; i++) counts[i] = sizeof mine;
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  for (int i = 0; i < iters; i++) {
    double t0 = mp_now_ms();
    MP_OK(mega_comm_all_gather(c, mine, all, counts, MEGA_DT_BYTE, 0, &err), err);
    t[i] = (mp_now_ms() - t0) * 1e3;
  }
  if (rank == 0) {
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    printf("ranks=%d  all_gather 16 B each: median %.1f us, p90 %.1f us (%d iterations)\n", n,
           t[iters / 2], t[iters * 9 / 10], iters);
  }
  free(t);
  return 0;
}

static int all_reduce(int rank, int n, mega_comm *c, size_t count, int iters) {
  mega_err err = {0};
  float *buf = malloc(count * sizeof(float));
  MP_CHECK(buf, "malloc");
  for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
  MP_OK(mega_comm_all_reduce(c, buf, count, 0, &err), err); /* warm up */
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  double t0 = mp_now_ms();
  for (int i = 0; i < iters; i++) MP_OK(mega_comm_all_reduce(c, buf, count, 0, &err), err);
  double ms = (mp_now_ms() - t0) / iters;
  if (rank == 0) {
    double bytes = (double)count * sizeof(float);
    double algbw = bytes / (ms * 1e-3) / 1e9;
    if (count >= 1000)
      printf("ranks=%d  all_reduce %zuM floats: %.1f ms, busbw %.2f GB/s (algbw %.2f GB/s, "
             "%d iterations)\n",
             n, count / 1000000, ms, algbw * 2.0 * (n - 1) / n, algbw, iters);
    else
      printf("ranks=%d  all_reduce %zu float(s): %.1f us per call, through the comm thread "
             "(%d iterations)\n",
             n, count, ms * 1e3, iters);
  }
  free(buf);
  return 0;
}

/* A group all on this node, as the worker makes its groups on one machine. */
static mega_status create_here(mega_store *store, const char *group, int rank, int n,
                               mega_comm **c, mega_err *err) {
  mega_status st = mega_store_group_here(store, group, err);
  return st == MEGA_OK ? mega_comm_create(store, group, rank, n, NULL, TIMEOUT_MS, c, err) : st;
}

static int body(int rank, const mp_env *env) {
  int n = env->nranks;
  mega_store *store = mp_store(env, false);
  MP_CHECK(store, "no store");
  mega_comm *c = NULL;
  mega_err err = {0};
  double t0 = mp_now_ms();
  MP_OK(create_here(store, "bench", rank, n, &c, &err), err);
  double t_create = mp_now_ms() - t0;
  mega_store_close(store);
  if (rank == 0)
    printf("ranks=%d  create (FileStore rendezvous + full mesh): %.0f ms, collectives by %s\n",
           n, t_create, mega_comm_transport(c));
  if (n % 2 == 0) {
    if (p2p_bandwidth(rank, n, c, 64u << 10, 4096)) return 1;
    if (p2p_bandwidth(rank, n, c, 1u << 20, 256)) return 1;
    if (p2p_bandwidth(rank, n, c, 4u << 20, 64)) return 1;
  }
  if (round_trip(rank, n, c, 2000)) return 1;
  if (small_all_gather(rank, n, c, 2000)) return 1;
  if (all_reduce(rank, n, c, 1, 2000)) return 1;
  if (all_reduce(rank, n, c, 10000000, 5)) return 1;
  fflush(stdout);
  mega_comm_destroy(c);
  return 0;
}

/* lanes: this rank's pair (2p, 2p+1) all-reduces in its own group while
 * every other pair does the same; returns the mean ms of one all-reduce. */
typedef struct lanes_arg {
  size_t count;
  int buffers;
  int iters;
  const char *out; /* rank 0 writes the mean there, for the parent */
} lanes_arg;

static int lanes_body(int rank, const mp_env *env) {
  const lanes_arg *a = env->arg;
  int n = env->nranks;
  mega_store *store = mp_store(env, false);
  MP_CHECK(store, "no store");
  mega_comm *all = NULL, *pair = NULL;
  mega_err err = {0};
  char name[32];
  snprintf(name, sizeof name, "pair%d", rank / 2);
  MP_OK(create_here(store, "all", rank, n, &all, &err), err);
  MP_OK(create_here(store, name, rank % 2, 2, &pair, &err), err);
  if (rank == 0 && n == 2) {
    printf("collectives by %s\n", mega_comm_transport(pair));
    fflush(stdout);
  }
  mega_store_close(store);
  size_t total = a->count * (size_t)a->buffers;
  float *buf = malloc(total * sizeof(float));
  MP_CHECK(buf, "malloc");
  for (size_t i = 0; i < total; i++) buf[i] = 1.0f;
  MP_OK(mega_comm_all_reduce(pair, buf, a->count, 0, &err), err); /* warm up */
  MP_OK(mega_comm_barrier(all, 0, &err), err);
  double t0 = mp_now_ms();
  for (int i = 0; i < a->iters; i++) {
    float *at = buf + (size_t)((i + 1) % a->buffers) * a->count;
    MP_OK(mega_comm_all_reduce(pair, at, a->count, 0, &err), err);
  }
  double mine = (mp_now_ms() - t0) / a->iters, times[16] = {0};
  size_t counts[16];
  for (int i = 0; i < n; i++) counts[i] = sizeof(double);
  MP_OK(mega_comm_all_gather(all, &mine, times, counts, MEGA_DT_BYTE, 0, &err), err);
  if (rank == 0) {
    double mean = 0;
    for (int i = 0; i < n; i++) mean += times[i] / n;
    FILE *f = fopen(a->out, "w");
    if (f) {
      fprintf(f, "%.6f\n", mean);
      fclose(f);
    }
  }
  free(buf);
  mega_comm_destroy(pair);
  mega_comm_destroy(all);
  return 0;
}

static int run_lanes(size_t count, int buffers) {
  char path[] = "/tmp/bench-comm-lanes-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    perror("bench_comm: mkstemp");
    return 1;
  }
  close(fd);
  lanes_arg a = {
      .count = count, .buffers = buffers, .iters = count >= 1000000 ? 60 : 400, .out = path};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_comm lanes: k pairs of ranks all-reduce %zu floats each at once, "
         "over %d buffer(s), %ld core(s)\n",
         count, buffers, cores);
  double t1 = 0, lanes = 0;
  int failed = 0;
  for (int k = 1; k <= 4 && !failed; k *= 2) {
    failed += mp_run(2 * k, lanes_body, &a, 300000, 0);
    FILE *f = fopen(path, "r");
    double ms = 0;
    if (!f || fscanf(f, "%lf", &ms) != 1 || ms <= 0) failed++;
    if (f) fclose(f);
    if (failed) break;
    if (k == 1) t1 = ms;
    double l = k * t1 / ms;
    if (l > lanes) lanes = l;
    printf("pairs=%d  %.2f ms per all-reduce (%.2fx alone), %.2f at full speed\n", k, ms,
           ms / t1, l);
  }
  unlink(path);
  if (failed) {
    fprintf(stderr, "bench_comm: a lanes run failed\n");
    return 1;
  }
  printf("lanes=%.2f\n", lanes);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "lanes")) {
    long long count = argc > 2 ? atoll(argv[2]) : 1000000;
    long long buffers = argc > 3 ? atoll(argv[3]) : 1;
    if (count < 1) {
      fprintf(stderr, "bench_comm: lanes takes a float count >= 1, not '%s'\n", argv[2]);
      return 2;
    }
    if (buffers < 1 || buffers > 256 || (unsigned long long)count * buffers > (1ull << 28)) {
      fprintf(stderr,
              "bench_comm: lanes takes 1..256 buffers, at most 2^28 floats in all, not '%s'\n",
              argv[3]);
      return 2;
    }
    return run_lanes((size_t)count, (int)buffers);
  }
  int ranks[8] = {2, 4}, nr = 2;
  if (argc > 1) {
    nr = 0;
    for (int i = 1; i < argc && nr < 8; i++) {
      int n = atoi(argv[i]);
      if (n < 2 || n > 16) {
        fprintf(stderr, "bench_comm: rank counts are 2..16, not '%s'\n", argv[i]);
        return 2;
      }
      ranks[nr++] = n;
    }
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_comm: one process per rank, %ld core(s)\n", cores);
  int failed = 0;
  for (int i = 0; i < nr; i++) failed += mp_run(ranks[i], body, NULL, 120000, 0);
  if (failed) fprintf(stderr, "bench_comm: %d rank(s) failed\n", failed);
  return failed ? 1 : 0;
}
