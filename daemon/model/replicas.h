/* Recovery from replicas, the decision (pure: no loop, no I/O, unit-tested
 * in tests/daemon/test_replicas.c): from what the ranks of an ended attempt
 * held when it stopped (RankHeld), where the next attempt's ranks take
 * their state, or why they cannot and go back to the checkpoint.
 *
 * Every (pp, tp) coordinate of the job needs, at one iteration M common to
 * all coordinates:
 *   - every parameter: from a held rank whose parameters are all whole at
 *     M, else shard by shard from the ranks that hold those shards;
 *   - every moment: from a held rank with every moment (no distributed
 *     optimizer), or each of the attempt's DP shards from a rank that holds
 *     it at M: its owner, or the rank keeping its copy.
 * M is the newest iteration at which every coordinate is covered: ranks
 * that completed one more step than their peers before the failure make M
 * one iteration later (nothing to redo) when they cover the job alone.
 * Sources are spread over the donors that can serve them, so the
 * coordinates of a stage fetch from different ranks where they can.
 *
 * Ownership: held and node ids are borrowed; the plan is the caller's
 * (mega_replicas_plan_free). */
#ifndef MEGA_DAEMON_REPLICAS_H
#define MEGA_DAEMON_REPLICAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "proto/mega.pb-c.h"

/* One rank of the ended attempt that held its state. */
typedef struct mega_replica_donor {
  uint32_t rank;
  const char *node_id;
  const Mega__V1__RankHeld *held;
  const char *version; /* its node's mega build (core/version.h); NULL: not known */
} mega_replica_donor;

typedef struct mega_replicas_in {
  uint32_t attempt; /* the ended attempt */
  uint32_t tp, pp, dp;
  bool distributed; /* --use-distributed-optimizer: moments come by shard */
  const mega_replica_donor *donors;
  size_t ndonors;
  uint64_t ckpt_iteration; /* the newest committed checkpoint (0: none) */
  /* The iteration the ended attempt's ranks started from when they took it
   * from replicas (0: otherwise). No rank of the run holds less: one that
   * says so had not got its state yet, and is no donor. */
  uint64_t floor;
  /* The build the next attempt's ranks run (the coordinator's): a donor of
   * another, or of none known, is none (a job's ranks run one build, and
   * its state goes from rank to rank). NULL: any. */
  const char *version;
} mega_replicas_in;

/* A plan (*out, the caller's) or NULL with why filled: the sentence the
 * job's event gives for going back to the checkpoint instead. */
mega_status mega_replicas_plan(const mega_replicas_in *in, Mega__V1__ReplicaPlan **out,
                               char *why, size_t len, mega_err *err);
void mega_replicas_plan_free(Mega__V1__ReplicaPlan *p); /* NULL is fine */

/* The distinct node ids of p's donors, into ids (borrowed from p), at most
 * max; returns how many. */
size_t mega_replicas_plan_nodes(const Mega__V1__ReplicaPlan *p, const char **ids, size_t max);

#endif
