/* worker/rank/replica_recv.c: what donors send a rank recovering from
 * replicas (ReplicaHeader, then ReplicaPiece frames each followed by its
 * floats, up to END), one donor after another. The first byte's low bit
 * says whether the moments are host memory (a distributed optimizer);
 * the rest is the donors' answers, read until it ends. A bad answer is an
 * error with a reason; the floats go only into the rank's tensors (ASan
 * watches), and when the whole is accepted every float was written: two
 * runs over buffers filled differently end the same. */
#include <fcntl.h>
#include <unistd.h>

#include "worker/rank/replica_recv.h"
#include "fuzz.h"
#include "replica_fixture.h"

enum { NT = 3, KINDS = 3 };
static mega_backend *be;
static float *buf[NT][KINDS]; /* param, exp_avg, exp_avg_sq */
static float *first[NT][KINDS];

static void once(void) {
  if (be) return;
  mega_err err = {0};
  FUZZ_CHECK(mega_backend_cpu_create(NULL, &be, &err) == MEGA_OK);
  for (int t = 0; t < NT; t++)
    for (int k = 0; k < KINDS; k++) {
      buf[t][k] = malloc(replica_sizes[t] * sizeof(float));
      first[t][k] = malloc(replica_sizes[t] * sizeof(float));
      FUZZ_CHECK(buf[t][k] && first[t][k]);
    }
}

/* Receives the input's donors into buffers filled with fill. MEGA_OK
 * when the whole came. */
static mega_status receive(const char *path, bool host_moments, float fill, mega_err *err) {
  static const char *const names[NT] = {"wte", "ln.b", "h.0.w"};
  mega_ckpt_param params[NT];
  for (int t = 0; t < NT; t++) {
    for (int k = 0; k < KINDS; k++)
      for (size_t i = 0; i < replica_sizes[t]; i++) buf[t][k][i] = fill;
    params[t] = (mega_ckpt_param){.name = names[t], .ndim = 1, .shape = {(int64_t)replica_sizes[t]},
                                  .numel = replica_sizes[t], .param = buf[t][0],
                                  .exp_avg = buf[t][1], .exp_avg_sq = buf[t][2]};
  }
  mega_replica_recv rv;
  mega_status st = mega_replica_recv_init(&rv, params, NT, be, host_moments, err);
  FUZZ_CHECK(st == MEGA_OK);
  int fd = open(path, O_RDONLY);
  FUZZ_CHECK(fd >= 0);
  off_t end = lseek(fd, 0, SEEK_END);
  lseek(fd, 0, SEEK_SET);
  for (int donor = 0; st == MEGA_OK && lseek(fd, 0, SEEK_CUR) < end; donor++) {
    mega_replica_want want = {.job_id = REPLICA_JOB, .attempt = REPLICA_ATTEMPT,
                              .donor_rank = donor, .iteration = REPLICA_ITERATION};
    char from[32];
    snprintf(from, sizeof from, "donor%d", donor);
    st = mega_replica_recv_stream(&rv, fd, &want, from, err);
  }
  close(fd);
  if (st == MEGA_OK) st = mega_replica_recv_whole(&rv, err);
  if (st == MEGA_OK) {
    size_t floats = 0;
    for (int t = 0; t < NT; t++) floats += replica_sizes[t];
    FUZZ_CHECK(rv.bytes == KINDS * floats * sizeof(float));
  }
  mega_replica_recv_free(&rv);
  return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  once();
  bool host_moments = data[0] & 1;
  const char *path = fuzz_file("stream", data + 1, size - 1);
  mega_err err = {0};
  mega_status st = receive(path, host_moments, 1.0f, &err);
  if (st != MEGA_OK) {
    FUZZ_CHECK(err.msg[0]);
    return 0;
  }
  for (int t = 0; t < NT; t++)
    for (int k = 0; k < KINDS; k++) memcpy(first[t][k], buf[t][k], replica_sizes[t] * sizeof(float));
  FUZZ_CHECK(receive(path, host_moments, -2.0f, &err) == MEGA_OK);
  for (int t = 0; t < NT; t++)
    for (int k = 0; k < KINDS; k++)
      FUZZ_CHECK(!memcmp(first[t][k], buf[t][k], replica_sizes[t] * sizeof(float)));
  return 0;
}
