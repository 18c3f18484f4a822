#include "daemon/model/placement.h"

#include <stdio.h>
#include <string.h>

/* Whether n runs a build other than the one req places for. */
static bool other_build(const mega_node_slots *n, const mega_placement_req *req) {
  return req->version && (!n->version || strcmp(n->version, req->version));
}

mega_status mega_place(const mega_node_slots *nodes, int nnodes, const mega_placement_req *req,
                       int *out, int *n, mega_err *err) {
  int k = req->nproc_per_node, lo = req->nnodes_min, hi = req->nnodes_max;
  if (k <= 0) return mega_fail(err, MEGA_ERR_INVALID, "--nproc-per-node must be positive, got %d", k);
  if (lo <= 0 || hi < lo)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nnodes %d:%d is not a range MIN:MAX with 1 <= MIN <= MAX", lo, hi);
  int mp = req->model_parallel > 0 ? req->model_parallel : 1;

  int fit = 0, alive = 0, other = -1, others = 0;
  for (int i = 0; i < nnodes; i++) {
    alive += nodes[i].alive;
    if (nodes[i].alive && nodes[i].free_slots >= k && other_build(&nodes[i], req)) {
      if (other < 0) other = i;
      others++;
    }
  }
  for (int pass = 0; pass < 2; pass++) /* the preferred node first, then the rest in order */
    for (int i = 0; i < nnodes && fit < hi; i++) {
      bool preferred = req->prefer && nodes[i].name && !strcmp(nodes[i].name, req->prefer);
      if ((pass == 0) != preferred || !nodes[i].alive || other_build(&nodes[i], req)) continue;
      if (nodes[i].free_slots >= k) out[fit++] = i;
    }
  /* The largest node count in [lo, fit] whose world TP*PP divides. */
  for (int c = fit; c >= lo; c--)
    if ((c * k) % mp == 0) {
      *n = c;
      return MEGA_OK;
    }
  if (fit < lo) {
    char why[256] = "";
    if (others)
      snprintf(why, sizeof why,
               "; %d more run%s another build of mega (%s: %s, not %s), and a job's ranks run "
               "one build: upgrade %s", others, others == 1 ? "s" : "", nodes[other].name,
               nodes[other].version && nodes[other].version[0] ? nodes[other].version
                                                                 : "version not known",
               req->version, others == 1 ? "it" : "them");
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "not enough nodes: the job needs %d node%s with %d free slot%s each, and %d "
                     "of %d alive node%s ha%s them%s",
                     lo, lo == 1 ? "" : "s", k, k == 1 ? "" : "s", fit, alive,
                     alive == 1 ? "" : "s", fit == 1 ? "s" : "ve", why);
  }
  return mega_fail(err, MEGA_ERR_INVALID,
                   "no node count in %d..%d gives a world size divisible by TP·PP = %d with %d "
                   "processes per node",
                   lo, fit, mp, k);
}
