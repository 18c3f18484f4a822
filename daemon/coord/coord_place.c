/* Where a job can run now: free slots per node (this coordinator's view of
 * its own attempts, the nodes' heartbeats, and ranks it just saw leave),
 * and the largest node count in the job's range that gives a valid job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/coord/coord_internal.h"
#include "core/version.h"
#include "daemon/model/placement.h"

uint32_t coord_nproc(megad_coord *c, const mega_job *j) {
  return j->nproc_per_node ? j->nproc_per_node : megad_members_self(c->members)->slots;
}

/* The check megactl and megaw make too (core/jobspec), on the data file as
 * this node sees it. */
mega_status coord_check_world(const mega_jobspec *s, int world, mega_err *err) {
  struct stat st;
  const char *one = mega_jobspec_data_single(s);
  long long bytes = one && stat(one, &st) == 0 && S_ISREG(st.st_mode) ? (long long)st.st_size : -1;
  return mega_jobspec_check_all(s, world, bytes, err);
}

/* Counts what this coordinator's running attempts place on node_id. */
uint32_t megad_coord_slots_on(const megad_coord *c, const char *node_id) {
  uint32_t n = 0;
  for (const coord_run *run = c->runs; run; run = run->next) {
    const mega_job *j = run->job;
    for (size_t k = 0; k < j->nplaced; k++)
      if (!strcmp(j->placement[k].node_id, node_id)) n += j->placement[k].nranks;
  }
  return n;
}

const mega_job *megad_coord_job_on(const megad_coord *c, const char *node_id) {
  for (const coord_run *run = c->runs; run; run = run->next)
    for (size_t k = 0; k < run->job->nplaced; k++)
      if (!strcmp(run->job->placement[k].node_id, node_id)) return run->job;
  return NULL;
}

void coord_released(megad_coord *c, const mega_job *j) {
  uint64_t now = uv_now(c->b->loop);
  for (size_t k = 0; k < j->nplaced; k++) {
    struct megad_released *slot = NULL;
    for (size_t i = 0; i < sizeof c->released / sizeof c->released[0] && !slot; i++)
      if (!c->released[i].nranks) slot = &c->released[i];
    /* all in use: overwrite entry 0, which need not be the oldest (entries
     * fill the first free place, and 0 may have just been overwritten); the
     * ranks it held count as busy again until their node's next heartbeat,
     * which only delays placement */
    if (!slot) slot = &c->released[0];
    snprintf(slot->node_id, sizeof slot->node_id, "%s", j->placement[k].node_id);
    slot->nranks = j->placement[k].nranks;
    slot->at_ms = now;
  }
}

/* Ranks released on nd that its heartbeats may still count: until one sent
 * after the release has come in. */
static uint32_t released_on(megad_coord *c, const megad_node *nd) {
  uint32_t n = 0;
  for (size_t i = 0; i < sizeof c->released / sizeof c->released[0]; i++) {
    struct megad_released *r = &c->released[i];
    if (!r->nranks) continue;
    if (nd->seen_ms > r->at_ms + c->o.heartbeat_ms + 50) {
      if (!strcmp(r->node_id, nd->id)) r->nranks = 0; /* its heartbeats know now */
      continue;
    }
    if (!strcmp(r->node_id, nd->id)) n += r->nranks;
  }
  return n;
}

void coord_refused(megad_coord *c, const char *node_id) {
  struct megad_refused *slot = &c->refused[0];
  for (size_t i = 0; i < sizeof c->refused / sizeof c->refused[0]; i++) {
    struct megad_refused *r = &c->refused[i];
    if (r->at_ms && !strcmp(r->node_id, node_id)) {
      slot = r;
      break;
    }
    if (r->at_ms < slot->at_ms) slot = r; /* a free entry, else the oldest */
  }
  snprintf(slot->node_id, sizeof slot->node_id, "%s", node_id);
  slot->at_ms = uv_now(c->b->loop);
}

/* Whether nd refused a launch that its heartbeats (or load in etcd, put
 * each heartbeat interval) may not show yet: it was full then, whatever an
 * older view says. */
static bool refused_by(megad_coord *c, const megad_node *nd) {
  for (size_t i = 0; i < sizeof c->refused / sizeof c->refused[0]; i++) {
    struct megad_refused *r = &c->refused[i];
    if (!r->at_ms || strcmp(r->node_id, nd->id)) continue;
    if (nd->seen_ms <= r->at_ms + c->o.heartbeat_ms + 50) return true;
    r->at_ms = 0; /* its view knows now */
  }
  return false;
}

/* Slots of node free for j: what its heartbeat says is used (less what this
 * coordinator saw leave since), or what this coordinator's attempts take
 * there, whichever is more. own: j's own ranks there count as free; empty:
 * every slot counts as free. */
static int free_slots(megad_coord *c, const megad_node *nd, const mega_job *j, bool own,
                      bool empty) {
  if (empty) return (int)nd->slots;
  if (!nd->self && refused_by(c, nd)) return 0;
  uint32_t mine = megad_coord_slots_on(c, nd->id);
  uint32_t used = nd->self ? c->L->slots_used : nd->slots_used;
  if (!nd->self) {
    uint32_t gone = released_on(c, nd);
    used = used > gone ? used - gone : 0;
  }
  if (mine > used) used = mine; /* its heartbeat may not show them yet */
  if (own && j->coord.run)
    for (size_t k = 0; k < j->nplaced; k++)
      if (!strcmp(j->placement[k].node_id, nd->id))
        used = used > j->placement[k].nranks ? used - j->placement[k].nranks : 0;
  return used >= nd->slots ? 0 : (int)(nd->slots - used);
}

/* Picks nodes for j: idx gets node indexes into members, *n their count,
 * the largest count in j's range that gives a valid job. own, empty: see
 * free_slots. UNSUPPORTED: not enough usable nodes now (wait); INVALID: no
 * count in range gives a valid job. */
mega_status coord_place(megad_coord *c, mega_job *j, bool own, bool empty, int *idx, int *n,
                         mega_err *err) {
  megad_members *m = c->members;
  mega_node_slots *ns = calloc(m->nnodes ? m->nnodes : 1, sizeof *ns);
  if (!ns) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < m->nnodes; i++) {
    megad_node *nd = m->nodes[i];
    ns[i].name = nd->id;
    ns[i].free_slots = free_slots(c, nd, j, own, empty);
    ns[i].alive = megad_node_usable(nd);
    ns[i].version = nd->version;
  }
  uint32_t lo, hi;
  mega_recovery_node_range(j, &lo, &hi);
  int nproc = (int)coord_nproc(c, j);
  mega_placement_req req = {.nnodes_min = (int)lo, .nnodes_max = (int)hi, .nproc_per_node = nproc,
                            .model_parallel = (int)(j->tp * j->pp), .prefer = c->b->node_id,
                            .version = mega_version()};
  mega_status rc = mega_place(ns, (int)m->nnodes, &req, idx, n, err);
  free(ns);
  /* The largest count whose world the job's own checks accept. */
  for (; rc == MEGA_OK && *n >= (int)lo; (*n)--)
    if (coord_check_world(&j->spec, *n * nproc, err) == MEGA_OK) return MEGA_OK;
  if (rc == MEGA_OK) rc = err ? err->status : MEGA_ERR_INVALID;
  return rc;
}

uint32_t coord_could_place(megad_coord *c, mega_job *j, bool own) {
  int *idx = calloc(c->members->nnodes ? c->members->nnodes : 1, sizeof *idx), n = 0;
  uint32_t r = idx && coord_place(c, j, own, false, idx, &n, NULL) == MEGA_OK ? (uint32_t)n : 0;
  free(idx);
  return r;
}

