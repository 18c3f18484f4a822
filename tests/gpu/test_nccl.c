/* The NCCL communicator on two ranks (two processes, one GPU each), through
 * comm.h: point to point both ways at once, all-reduce (sum and max),
 * all-gather (equal and unequal parts), reduce-scatter, broadcast and a
 * barrier, on device buffers. Needs two GPUs; otherwise every rank says why
 * and exits 77 (skipped). It has not yet run on a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/backend/cuda_module.h"

static mega_backend *be;

static float *dev(const float *host, size_t n) {
  void *d;
  mega_err err = {0};
  if (be->ops->alloc(be, n * 4, &d, &err) ||
      (host && be->ops->memcpy(be, d, host, n * 4, MEGA_COPY_H2D, &err))) {
    fprintf(stderr, "alloc: %s\n", err.msg);
    exit(1);
  }
  return d;
}

static int expect(const char *what, const float *d, const float *want, size_t n) {
  float got[64];
  mega_err err = {0};
  if (be->ops->memcpy(be, got, d, n * 4, MEGA_COPY_D2H, &err)) {
    printf("FAIL %s: %s\n", what, err.msg);
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      printf("FAIL %s[%zu]: %g, want %g\n", what, i, (double)got[i], (double)want[i]);
      return 1;
    }
  return 0;
}

#define CHECK(call)                                   \
  do {                                                \
    if ((call) != MEGA_OK) {                          \
      printf("FAIL %s: %s\n", #call, err.msg);         \
      return 1;                                       \
    }                                                 \
  } while (0)

static int rank_main(int rank, const char *dir) {
  mega_err err = {0};
  const mega_cuda_module *m;
  if (mega_cuda_module_load(&m, &err) != MEGA_OK || m->device_count(&err) < 2) {
    printf("skipped: %s\n", err.msg[0] ? err.msg : "fewer than 2 GPUs");
    return 77;
  }
  mega_store *store;
  mega_comm *c;
  CHECK(m->backend_create(rank, &be, &err));
  CHECK(mega_store_open_file(dir, "nccl-test", &store, &err));
  CHECK(mega_comm_create_nccl(store, "g", rank, 2, be, 30000, &c, &err));
  int bad = 0;
  /* point to point, both directions posted at once */
  float mine[4] = {rank + 1.0f, rank + 2.0f, rank + 3.0f, rank + 4.0f}, theirs[4];
  for (int i = 0; i < 4; i++) theirs[i] = (1 - rank) + 1.0f + i;
  float *s = dev(mine, 4), *r = dev(NULL, 4);
  mega_req *rs, *rr;
  CHECK(mega_comm_isend(c, s, 16, 1 - rank, 7, &rs, &err));
  CHECK(mega_comm_irecv(c, r, 16, 1 - rank, 7, &rr, &err));
  CHECK(mega_req_wait(rs, 0, &err));
  CHECK(mega_req_wait(rr, 0, &err));
  mega_req_free(rs);
  mega_req_free(rr);
  bad += expect("send/receive", r, theirs, 4);
  /* all-reduce: sum and max of {rank+1, 10-rank} */
  float v[2] = {rank + 1.0f, 10.0f - rank}, sum[2] = {3, 19}, mx[2] = {2, 10};
  float *d = dev(v, 2);
  CHECK(mega_comm_all_reduce(c, d, 2, 0, &err));
  bad += expect("all-reduce", d, sum, 2);
  d = dev(v, 2);
  CHECK(mega_comm_all_reduce_max(c, d, 2, 0, &err));
  bad += expect("all-reduce max", d, mx, 2);
  /* all-gather with unequal parts: rank 0 gives 1 float, rank 1 gives 2 */
  size_t counts[2] = {1, 2};
  float part[2] = {rank * 10.0f + 1, rank * 10.0f + 2}, whole[3] = {1, 11, 12};
  float *in = dev(part, 2), *out = dev(NULL, 3);
  CHECK(mega_comm_all_gather(c, in, out, counts, MEGA_DT_F32, 0, &err));
  bad += expect("all-gather (unequal)", out, whole, 3);
  /* reduce-scatter of {1,2,3,4} + {10,20,30,40}, equal halves */
  float rsin[4] = {1, 2, 3, 4};
  if (rank) for (int i = 0; i < 4; i++) rsin[i] *= 10;
  size_t halves[2] = {2, 2};
  float want_rs[2][2] = {{11, 22}, {33, 44}};
  float *rin = dev(rsin, 4), *rout = dev(NULL, 2);
  CHECK(mega_comm_reduce_scatter(c, rin, rout, halves, 0, &err));
  bad += expect("reduce-scatter", rout, want_rs[rank], 2);
  /* broadcast from rank 1, then a barrier */
  float b[3] = {rank ? 5.0f : 0.0f, rank ? 6.0f : 0.0f, rank ? 7.0f : 0.0f}, wb[3] = {5, 6, 7};
  float *db = dev(b, 3);
  CHECK(mega_comm_broadcast(c, db, 3, MEGA_DT_F32, 1, 0, &err));
  bad += expect("broadcast", db, wb, 3);
  CHECK(mega_comm_barrier(c, 0, &err));
  mega_comm_destroy(c);
  mega_store_close(store);
  if (!bad) printf("ok   rank %d: p2p and every collective\n", rank);
  return bad ? 1 : 0;
}

int main(void) {
  char dir[] = "/tmp/mega-nccl-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  pid_t pids[2];
  for (int r = 0; r < 2; r++) /* no CUDA in the parent: it forks */
    if ((pids[r] = fork()) == 0) {
      int code = rank_main(r, dir);
      fflush(stdout);
      _exit(code);
    }
  int worst = 0;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code == 77 && worst == 0) worst = 77;
    if (code != 0 && code != 77) worst = 1;
  }
  return worst;
}
