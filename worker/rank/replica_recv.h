/* Recovery from replicas, what a donor sends (proto/mega.proto's
 * ReplicaHeader, then ReplicaPiece frames each followed by its floats):
 * the header checked against the plan and the other donors, each piece
 * against this rank's tensors and every piece before it, and the whole
 * against the state it must fill. A peer's bytes write nowhere else and
 * leave no float unwritten unnoticed. rank_fetch.c connects and asks;
 * tests/fuzz/fuzz_replica.c feeds it bytes. Private to worker/rank. */
#ifndef MEGA_WORKER_REPLICA_RECV_H
#define MEGA_WORKER_REPLICA_RECV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/ckpt/checkpoint.h"

/* What a donor's header must say: the plan's job, attempt, donor and
 * iteration, this rank's coordinate. */
typedef struct mega_replica_want {
  const char *job_id;
  int attempt, donor_rank;
  int64_t iteration;
  int pp, tp;
} mega_replica_want;

typedef struct mega_replica_recv {
  /* what came: the donors' optimizer steps and evaluation batches (every
   * header must agree), and the floats' bytes */
  int64_t steps, eval_done;
  uint64_t bytes;
  /* private */
  const mega_ckpt_param *params;
  size_t nparams;
  mega_backend *be;
  bool host_moments, have_hdr;
  float *stage;
  uint64_t *before; /* [nparams + 1]: floats of the tensors before each */
  uint64_t *came[4]; /* by piece kind (PARAM and the moments): a bit per float received */
  uint64_t got[4];
} mega_replica_recv;

/* Receives into params[0..n) (borrowed: their param, exp_avg and
 * exp_avg_sq buffers, mega_ckpt_param_local floats each): parameters are
 * backend memory of be, moments too unless host_moments (a distributed
 * optimizer's whole moments in host memory). MEGA_ERR_NOMEM when its
 * bookkeeping (a bit per float) does not fit. */
mega_status mega_replica_recv_init(mega_replica_recv *rv, const mega_ckpt_param *params, size_t n,
                                   mega_backend *be, bool host_moments, mega_err *err);
void mega_replica_recv_free(mega_replica_recv *rv);

/* One donor's answer read from fd: its header, then pieces up to END.
 * from names the donor in messages. A refusal, a header other than want
 * or disagreeing with an earlier donor's, a piece outside the tensors or
 * over floats that came already, a cut stream: MEGA_ERR_PEER. */
mega_status mega_replica_recv_stream(mega_replica_recv *rv, int fd, const mega_replica_want *want,
                                     const char *from, mega_err *err);

/* After the last donor: every parameter and moment came (once each, as
 * the pieces were checked). MEGA_ERR_INTERNAL when the donors, each doing
 * as asked, did not cover the rank: a plan that is wrong. */
mega_status mega_replica_recv_whole(const mega_replica_recv *rv, mega_err *err);

#endif
