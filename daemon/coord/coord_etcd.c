/* The coordinator in etcd mode: a job whose coordinator's lease expired is
 * claimed by whichever surviving node creates its coordinator key first
 * (a transaction: create if absent), and restarts there: from the state
 * the old attempt's surviving ranks hold, when they cover the job (it asks
 * their nodes: coord_held.c), else from its newest committed checkpoint; a node
 * that lost its claim or its lease stands down, and its fence keeps
 * anything it still sends from counting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/coord/coord_internal.h"
#include "daemon/etcd/etcd.h"
#include "daemon/model/util.h"

#define EV(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k
#define NCLAIMS (sizeof ((megad_coord *)0)->claims / sizeof ((megad_coord *)0)->claims[0])

/* ---- taking a job over ---- */

static void resume_adopted(megad_coord *c, mega_job *j, const char *from_node) {
  if (j->state == MEGA_JOB_RUNNING) {
    /* the old attempt's ranks, wherever they still run, stop; those with a
     * whole state keep it for the next attempt */
    for (size_t i = 0; i < j->nplaced; i++)
      coord_abort_attempt(c, j, j->placement[i].node_id, j->attempt, false,
                          !j->spec.no_replica_recovery, "the job's coordinator changed");
    mega_err e = {0};
    if (mega_job_transition(j, MEGA_JOB_RESTARTING, megad_unix_ms(), NULL, &e) != MEGA_OK) {
      megad_warn(c->b, "%s", e.msg);
      return;
    }
    megad_jobs_save(c->jobs, j, NULL);
    megad_job_event(c->jobs, j, EV(RESTARTING), c->b->node_id, -1,
                    "node %s took the job over from %s (its etcd lease expired) while attempt %u "
                    "ran; asking its nodes what their ranks kept", c->b->node_id, from_node,
                    j->attempt);
    coord_gather_held(c, j, false);
  } else if (j->state == MEGA_JOB_RESTARTING && j->nplaced && !j->spec.no_replica_recovery) {
    /* its last attempt ended (its coordinator stopped, say) with ranks
     * that may still hold their state for the next one: the plan made
     * for them went with the old coordinator, so they are asked again */
    megad_job_event(c->jobs, j, EV(INFO), c->b->node_id, -1,
                    "node %s took the restarting job over from %s (its etcd lease expired); "
                    "asking the nodes of attempt %u what their ranks kept", c->b->node_id,
                    from_node, j->attempt);
    coord_gather_held(c, j, false);
  } else {
    megad_job_event(c->jobs, j, EV(INFO), c->b->node_id, -1,
                    "node %s took the %s job over from %s (its etcd lease expired)",
                    c->b->node_id, mega_job_state_name(j->state), from_node);
  }
  coord_wq_add(c, j);
  megad_coord_schedule(c);
}

static void adopt(megad_coord *c, const char *id, int64_t fence, const megad_etcd_kv *kvs,
                  size_t n) {
  mega_jobs tmp;
  mega_jobs_init(&tmp);
  mega_err e = {0};
  for (size_t i = 0; i < n; i++)
    if (mega_jobs_apply(&tmp, kvs[i].value, kvs[i].value_len, &e) != MEGA_OK)
      megad_warn(c->b, "etcd: job %s: skipping %s: %s", id, kvs[i].key, e.msg);
  mega_job *j = mega_jobs_take(&tmp, id);
  mega_jobs_free(&tmp);
  if (!j) {
    megad_warn(c->b, "etcd: claimed job %s but etcd holds no record of it", id);
    return;
  }
  char old[128];
  snprintf(old, sizeof old, "node %s", j->coordinator && j->coordinator[0] ? j->coordinator : "?");
  char *self = strdup(c->b->node_id);
  if (!self) {
    mega_job_free(j);
    return;
  }
  free(j->coordinator);
  j->coordinator = self;
  j->etcd.fence = fence;
  if (megad_jobs_adopt(c->jobs, j, &e) != MEGA_OK) {
    megad_warn(c->b, "etcd: taking job %s over: %s", id, e.msg);
    mega_job_free(j);
    return;
  }
  megad_log(c->b, "took %s job %s over from %s (fence %lld)", mega_job_state_name(j->state), id,
            old, (long long)fence);
  /* the steps this node kept for the dead coordinator: here now, before
   * the next attempt's (other nodes hear of the claim from etcd) */
  megad_launch_coord_moved(c->L, id, c->b->node_id, c->o.address);
  if (!mega_job_state_final(j->state)) resume_adopted(c, j, old);
}

typedef struct claim_ctx {
  megad_coord *c;
  size_t slot;
  int64_t lease, fence;
} claim_ctx;

static void claim_end(claim_ctx *x, char *id, size_t cap) {
  snprintf(id, cap, "%s", x->c->claims[x->slot]);
  x->c->claims[x->slot][0] = '\0';
  free(x);
}

/* A claim found to be this node's own (a first try went through): the
 * job's keys, read now. */
static void reread(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  claim_ctx *x = arg;
  megad_coord *c = x->c;
  int64_t fence = x->fence;
  char id[160];
  claim_end(x, id, sizeof id);
  if (err->status == MEGA_ERR_CANCELLED || c->b->stopping) return;
  if (!r) megad_warn(c->b, "etcd: reading job %s after claiming it: %s", id, err->msg);
  else if (!megad_jobs_find(c->jobs, id)) adopt(c, id, fence, r->kvs, r->nkvs);
}

static void claimed(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  claim_ctx *x = arg;
  megad_coord *c = x->c;
  if (megad_jobs_claim_mine(c->jobs, r, x->lease) && !c->b->stopping) {
    char pre[192];
    snprintf(pre, sizeof pre, "mega/j/%s/", c->claims[x->slot]);
    x->fence = r->kvs[0].create_revision;
    mega_err e = {0};
    if (megad_etcd_get(c->jobs->etcd, pre, true, reread, x, &e) == MEGA_OK) return;
    megad_warn(c->b, "etcd: %s", e.msg);
  }
  char id[160];
  claim_end(x, id, sizeof id);
  if (err->status == MEGA_ERR_CANCELLED || c->b->stopping) return;
  if (!r) {
    megad_warn(c->b, "etcd: claiming job %s: %s", id, err->msg);
    return;
  }
  if (r->succeeded && !megad_jobs_find(c->jobs, id)) adopt(c, id, r->revision, r->kvs, r->nkvs);
}

static void claim(megad_coord *c, const char *id) {
  int64_t lease = megad_etcd_session_lease(c->jobs->etcd);
  size_t slot = NCLAIMS;
  for (size_t i = 0; i < NCLAIMS; i++) {
    if (!strcmp(c->claims[i], id)) return; /* in flight */
    if (!c->claims[i][0] && slot == NCLAIMS) slot = i;
  }
  if (!lease || slot == NCLAIMS || !coord_may_act(c) || strlen(id) >= sizeof c->claims[0]) return;
  char ckey[192], pre[192], rec[192];
  snprintf(ckey, sizeof ckey, "mega/c/%s", id);
  snprintf(pre, sizeof pre, "mega/j/%s/", id);
  snprintf(rec, sizeof rec, "mega/j/%s/0", id);
  /* nobody holds it, and the job still exists (not forgotten meanwhile) */
  megad_etcd_cmp cmp[2] = {
      {.key = ckey, .target = MEGAD_ETCD_CREATE, .number = 0},
      {.key = rec, .target = MEGAD_ETCD_VERSION, .result = MEGAD_ETCD_GREATER, .number = 0},
  };
  megad_etcd_op ops[2] = {
      {.kind = MEGAD_ETCD_PUT, .key = ckey, .value = c->b->node_id,
       .value_len = strlen(c->b->node_id), .lease = lease},
      {.kind = MEGAD_ETCD_GET, .key = pre, .prefix = true},
  };
  /* refused: who holds it (this node, if a first try went through) */
  megad_etcd_op holder = {.kind = MEGAD_ETCD_GET, .key = ckey};
  claim_ctx *x = malloc(sizeof *x);
  if (!x) return;
  *x = (claim_ctx){c, slot, lease, 0};
  snprintf(c->claims[slot], sizeof c->claims[slot], "%s", id);
  mega_err e = {0};
  if (megad_etcd_txn(c->jobs->etcd, cmp, 2, ops, 2, &holder, 1, claimed, x, &e) != MEGA_OK) {
    c->claims[slot][0] = '\0';
    free(x);
    megad_warn(c->b, "etcd: claiming job %s: %s", id, e.msg);
  }
}

void megad_coord_orphan(megad_coord *c, const char *job_id) {
  if (!c->b->stopping && !megad_jobs_find(c->jobs, job_id)) claim(c, job_id);
}

/* Jobs that lost their coordinator while this node could not claim them
 * (no lease yet, etcd away, a claim already in flight), those found at
 * start, and ended ones: their new coordinator's retention forgets them in
 * time, so etcd does not keep them forever. */
void coord_etcd_tick(megad_coord *c) {
  if (!c->jobs->etcd || c->b->stopping) return;
  const mega_jobs *m = &c->jobs->mirror;
  for (size_t i = 0; i < m->n; i++) {
    const mega_job *j = m->v[i];
    if ((!j->etcd.fence || j->etcd.orphan) && !megad_jobs_find(c->jobs, j->id)) claim(c, j->id);
  }
}

/* ---- steps kept for a coordinator that died ---- */

mega_status megad_coord_resent(megad_coord *c, const char *job_id, uint32_t attempt,
                               uint32_t world, const char *node_id,
                               Mega__V1__StepReport *const *r, size_t n, mega_err *err) {
  if (coord_run_of(c, job_id, attempt)) { /* the attempt runs here: the ordinary path */
    for (size_t i = 0; i < n; i++) megad_coord_step(c, job_id, attempt, node_id, r[i]);
    return MEGA_OK;
  }
  return coord_late_add(c, job_id, attempt, world, node_id, r, n, err);
}

/* ---- standing down ---- */

void megad_coord_fenced(megad_coord *c, mega_job *j, const char *why) {
  j->etcd.fenced = true;
  megad_warn(c->b, "job %s: standing down as its coordinator: %s", j->id, why);
  coord_wq_remove(c, j);
  if (j->coord.run) {
    char msg[512];
    snprintf(msg, sizeof msg, "node %s no longer coordinates job %s: %s", c->b->node_id, j->id,
             why);
    coord_stop(j->coord.run, MEGA_END_COORDINATOR, msg); /* attempt_over lets go of it */
    return;
  }
  megad_jobs_drop(c->jobs, j);
}

void megad_coord_refused(megad_coord *c, mega_job *j, const char *why) {
  coord_wq_remove(c, j);
  if (j->coord.run) return; /* not started without a fence */
  char msg[768];
  snprintf(msg, sizeof msg, "etcd refused the job's record (%s); it exists only on node %s",
           why, c->b->node_id);
  coord_finalize(c, j, MEGA_JOB_FAILED, msg);
}

void megad_coord_stand_down(megad_coord *c, const char *why) {
  if (!c->jobs->etcd) return;
  for (size_t i = c->jobs->t.n; i-- > 0;) {
    if (i >= c->jobs->t.n) continue; /* the table shrank under a stand-down */
    mega_job *j = c->jobs->t.v[i];
    /* a job whose claim was never taken is nobody else's: it stays */
    if (!j->etcd.fenced && j->etcd.fence && !mega_job_state_final(j->state))
      megad_coord_fenced(c, j, why);
  }
}
