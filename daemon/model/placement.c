#include "daemon/model/placement.h"

#include <string.h>

mega_status mega_place(const mega_node_slots *nodes, int nnodes, const mega_placement_req *req,
                       int *out, int *n, mega_err *err) {
  int k = req->nproc_per_node, lo = req->nnodes_min, hi = req->nnodes_max;
  if (k <= 0) return mega_fail(err, MEGA_ERR_INVALID, "--nproc-per-node must be positive, got %d", k);
  if (lo <= 0 || hi < lo)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nnodes %d:%d is not a range MIN:MAX with 1 <= MIN <= MAX", lo, hi);
  int mp = req->model_parallel > 0 ? req->model_parallel : 1;

  int fit = 0, alive = 0;
  for (int i = 0; i < nnodes; i++) alive += nodes[i].alive;
  for (int pass = 0; pass < 2; pass++) /* the preferred node first, then the rest in order */
    for (int i = 0; i < nnodes && fit < hi; i++) {
      bool preferred = req->prefer && nodes[i].name && !strcmp(nodes[i].name, req->prefer);
      if ((pass == 0) != preferred || !nodes[i].alive) continue;
      if (nodes[i].free_slots >= k) out[fit++] = i;
    }
  /* The largest node count in [lo, fit] whose world TP*PP divides. */
  for (int c = fit; c >= lo; c--)
    if ((c * k) % mp == 0) {
      *n = c;
      return MEGA_OK;
    }
  if (fit < lo)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "not enough nodes: the job needs %d node%s with %d free slot%s each, and %d "
                     "of %d alive node%s ha%s them",
                     lo, lo == 1 ? "" : "s", k, k == 1 ? "" : "s", fit, alive,
                     alive == 1 ? "" : "s", fit == 1 ? "s" : "ve");
  return mega_fail(err, MEGA_ERR_INVALID,
                   "no node count in %d..%d gives a world size divisible by TP·PP = %d with %d "
                   "processes per node",
                   lo, fit, mp, k);
}
