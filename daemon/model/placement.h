/* Placement: which nodes run a job's ranks. Ranks are contiguous per node
 * (node i of the placement runs ranks [i*K, (i+1)*K) for K processes per
 * node), so TP groups, the fastest-varying dimension, stay inside a node.
 *
 * Pure logic over a snapshot of the membership; the caller owns all arrays. */
#ifndef MEGA_DAEMON_PLACEMENT_H
#define MEGA_DAEMON_PLACEMENT_H

#include <stdbool.h>

#include "core/status.h"

typedef struct mega_node_slots {
  const char *name;
  int free_slots;
  bool alive;
  const char *version; /* the node's mega build (core/version.h); NULL: not known */
} mega_node_slots;

typedef struct mega_placement_req {
  int nnodes_min, nnodes_max; /* torchrun's --nnodes MIN[:MAX] */
  int nproc_per_node;         /* K */
  int model_parallel;         /* TP*PP: the world must be a multiple of it */
  const char *prefer;         /* node to place first (the coordinator), or NULL */
  /* The build every rank must run (the coordinator's): a node of another,
   * or of none known, is not placed on. NULL: any. */
  const char *version;
} mega_placement_req;

/* Picks as many alive nodes with K free slots as the request allows (at most
 * nnodes_max, at least nnodes_min), largest world that is a multiple of
 * TP*PP, preferring the named node, then the order given, on nodes of the
 * request's version only: a job's ranks run one build. Writes the chosen
 * node indexes to out[nnodes_max] and their count to *n. Too few nodes is
 * UNSUPPORTED, saying how many there are and, when nodes of another build
 * would have fit, which nodes run which build (a few names per build). */
mega_status mega_place(const mega_node_slots *nodes, int nnodes, const mega_placement_req *req,
                       int *out, int *n, mega_err *err);

#endif
