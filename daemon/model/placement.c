#include "daemon/model/placement.h"

#include <stdio.h>
#include <string.h>

/* Whether n runs a build other than the one req places for. */
static bool other_build(const mega_node_slots *n, const mega_placement_req *req) {
  return req->version && (!n->version || strcmp(n->version, req->version));
}

static const char *build_of(const mega_node_slots *n) {
  return n->version && n->version[0] ? n->version : "version not known";
}

/* Whether nodes[i] is a node of another build the job would fit on. */
static bool other_fit(const mega_node_slots *nodes, int i, const mega_placement_req *req) {
  return nodes[i].alive && nodes[i].free_slots >= req->nproc_per_node &&
         other_build(&nodes[i], req);
}

#define NAMES_PER_BUILD 4

/* nodes[i]'s build and the nodes of it that would fit, from i on: "b, d
 * and 2 more: 0.1". */
static void one_build(const mega_node_slots *nodes, int nnodes, int i,
                      const mega_placement_req *req, char *buf, size_t len) {
  size_t off = 0;
  int named = 0, more = 0;
  for (int q = i; q < nnodes && off < len; q++) {
    if (!other_fit(nodes, q, req) || strcmp(build_of(&nodes[q]), build_of(&nodes[i]))) continue;
    if (named == NAMES_PER_BUILD) more++;
    else off += (size_t)snprintf(buf + off, len - off, "%s%s", named++ ? ", " : "", nodes[q].name);
  }
  if (off < len && more) off += (size_t)snprintf(buf + off, len - off, " and %d more", more);
  if (off < len) snprintf(buf + off, len - off, ": %s", build_of(&nodes[i]));
}

/* The nodes of other builds that would fit, by build: "b, d: 0.1; c:
 * version not known", as many builds as len holds, then "; ...". */
static void other_builds(const mega_node_slots *nodes, int nnodes, const mega_placement_req *req,
                         char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < nnodes; i++) {
    if (!other_fit(nodes, i, req)) continue;
    bool said = false; /* its build was listed with an earlier node */
    for (int p = 0; p < i && !said; p++)
      said = other_fit(nodes, p, req) && !strcmp(build_of(&nodes[p]), build_of(&nodes[i]));
    if (said) continue;
    char g[256];
    one_build(nodes, nnodes, i, req, g, sizeof g);
    if (off + strlen(g) + 8 > len) { /* the line stays whole; megactl nodes lists them all */
      snprintf(buf + off, len - off, "%s...", off ? "; " : "");
      return;
    }
    off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "; " : "", g);
  }
}

mega_status mega_place(const mega_node_slots *nodes, int nnodes, const mega_placement_req *req,
                       int *out, int *n, mega_err *err) {
  int k = req->nproc_per_node, lo = req->nnodes_min, hi = req->nnodes_max;
  if (k <= 0) return mega_fail(err, MEGA_ERR_INVALID, "--nproc-per-node must be positive, got %d", k);
  if (lo <= 0 || hi < lo)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nnodes %d:%d is not a range MIN:MAX with 1 <= MIN <= MAX", lo, hi);
  int mp = req->model_parallel > 0 ? req->model_parallel : 1;

  int fit = 0, alive = 0, others = 0;
  for (int i = 0; i < nnodes; i++) {
    alive += nodes[i].alive;
    others += other_fit(nodes, i, req);
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
    char why[MEGA_ERR_MSG_MAX] = "", which[MEGA_ERR_MSG_MAX - 280];
    if (others) {
      other_builds(nodes, nnodes, req, which, sizeof which);
      snprintf(why, sizeof why,
               "; %d more run%s another build of mega (%s), not this coordinator's %s, and a "
               "job's ranks run one build: upgrade %s", others, others == 1 ? "s" : "", which, req->version,
               others == 1 ? "it" : "them");
    }
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
