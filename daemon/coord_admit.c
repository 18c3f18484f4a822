/* Admission: what a job must be to be accepted at submit. Everything from
 * the wire is bounded before any arithmetic on it; the paths must lie
 * under the roots; the job must be placeable on some node that exists; and
 * the node's queue must have room. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/jobspec.h"
#include "daemon/coord_internal.h"

/* Control characters reach terminals raw (escape sequences); a name is an
 * identifier, so it may hold none. */
static const char *bad_text(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return "a control character";
  return NULL;
}

mega_status coord_check_msg(const megad_coord *c, const Mega__V1__JobSpec *spec, mega_err *err) {
  (void)c;
  const char *name = spec->name ? spec->name : "";
  size_t len = strlen(name);
  if (len > MEGAD_JOB_NAME_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--name: %zu bytes is longer than the %d allowed",
                     len, MEGAD_JOB_NAME_MAX);
  const char *why = bad_text(name);
  if (why)
    return mega_fail(err, MEGA_ERR_INVALID, "--name holds %s; give a name of printable "
                     "characters", why);
  if (spec->n_args > MEGAD_JOB_ARGS_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "the job has %zu flag words, more than the %d allowed",
                     spec->n_args, MEGAD_JOB_ARGS_MAX);
  for (size_t i = 0; i < spec->n_args; i++) {
    size_t n = spec->args[i] ? strlen(spec->args[i]) : 0;
    if (n > MEGAD_JOB_ARG_MAX)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "job flag word %zu is %zu bytes long, more than the %d allowed", i + 1, n,
                       MEGAD_JOB_ARG_MAX);
  }
  if (spec->nnodes_min > MEGAD_NODES_MAX || spec->nnodes_max > MEGAD_NODES_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes %u:%u: at most %d nodes", spec->nnodes_min,
                     spec->nnodes_max, MEGAD_NODES_MAX);
  if (spec->nproc_per_node > MEGAD_NPROC_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nproc-per-node %u: at most %d", spec->nproc_per_node,
                     MEGAD_NPROC_MAX);
  if ((uint64_t)(spec->nnodes_max > spec->nnodes_min ? spec->nnodes_max : spec->nnodes_min) *
          (spec->nproc_per_node ? spec->nproc_per_node : 1) > MEGAD_WORLD_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes x --nproc-per-node is more than %d ranks",
                     MEGAD_WORLD_MAX);
  if (spec->max_restarts > MEGAD_RESTARTS_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--max-restarts %u: at most %d", spec->max_restarts,
                     MEGAD_RESTARTS_MAX);
  return MEGA_OK;
}

/* A job whose ranks per node no node has the slots for, or whose TP group
 * is larger than a node's ranks, can never start. */
static mega_status check_placeable(megad_coord *c, const mega_job *j, mega_err *err) {
  uint32_t most = 0;
  for (size_t i = 0; i < c->members->nnodes; i++)
    if (c->members->nodes[i]->slots > most) most = c->members->nodes[i]->slots;
  uint32_t nproc = coord_nproc(c, j);
  if (nproc > most)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nproc-per-node %u: no node of the cluster has that many slots (the most "
                     "is %u), so the job could never start",
                     nproc, most);
  if (j->tp > nproc)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--tensor-model-parallel-size %u is larger than the %u rank%s per node: a "
                     "tensor-parallel group must fit in one node",
                     j->tp, nproc, nproc == 1 ? "" : "s");
  return MEGA_OK;
}

mega_status coord_admit(megad_coord *c, const mega_job *j, mega_err *err) {
  const mega_jobspec *s = &j->spec;
  uint32_t lo = j->nnodes_min ? j->nnodes_min : 1, hi = j->nnodes_max > lo ? j->nnodes_max : lo;
  if (j->nnodes_max && j->nnodes_max < lo)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes %u:%u: MAX is below MIN", lo, j->nnodes_max);
  mega_status rc = c->o.roots ? megad_roots_check(c->o.roots, s, err) : MEGA_OK;
  if (rc != MEGA_OK) return rc;
  struct stat st;
  if (s->data_path && stat(s->data_path, &st) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: --data-path %s: %s on node %s (the coordinator; every node of "
                     "the job must see it)", s->data_path, strerror(errno), c->b->node_id);
  if (s->data_path && !S_ISREG(st.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID, "invalid job: --data-path %s is not a file",
                     s->data_path);
  if (s->save && stat(s->save, &st) == 0 && !S_ISDIR(st.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: --save %s is a file; give a directory for the checkpoints",
                     s->save);
  if ((rc = check_placeable(c, j, err)) != MEGA_OK) return rc;
  uint32_t nproc = coord_nproc(c, j);
  rc = coord_check_world(s, (int)(lo * nproc), err);
  for (uint32_t n = hi; rc != MEGA_OK && n > lo; n--)
    if (coord_check_world(s, (int)(n * nproc), NULL) == MEGA_OK) rc = MEGA_OK;
  if (rc != MEGA_OK) return rc;
  size_t waiting = c->nwaiting;
  if (c->o.max_pending && waiting >= c->o.max_pending)
    return mega_fail(err, MEGA_ERR_NOMEM,
                     "node %s already holds %zu waiting jobs (--max-pending %u); cancel some or "
                     "wait for them to start",
                     c->b->node_id, waiting, c->o.max_pending);
  return MEGA_OK;
}
