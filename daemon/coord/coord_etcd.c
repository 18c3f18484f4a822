/* The coordinator in etcd mode: a job whose coordinator's lease expired is
 * claimed by whichever surviving node creates its coordinator key first
 * (a transaction: create if absent), and restarts there: from the state
 * the old attempt's surviving ranks hold, when they cover the job (it asks
 * their nodes: ListHeld), else from its newest committed checkpoint; a node
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

/* ---- what the old attempt's ranks hold ---- */

#define ASK_TRIES 15  /* a node whose ranks are still stopping is asked again... */
#define ASK_AGAIN_MS 200 /* ...this much later */

/* The answers of the old attempt's nodes, gathered before the restart. */
typedef struct gather {
  megad_coord *c;
  char *job_id;
  uint32_t attempt;
  size_t asking; /* asks still out */
  mega_replica_donor *d; /* [cap]: filled from the rest in gather_done */
  Mega__V1__RankHeld **copies;
  char **nodes;
  uint32_t *ranks;
  size_t n, cap;
} gather;

typedef struct ask {
  gather *g;
  char *node_id;
  int tries;
  uv_timer_t timer;
} ask;

static void gather_add(gather *g, const char *node_id, uint32_t rank, const Mega__V1__RankHeld *h) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 16;
    mega_replica_donor *d = realloc(g->d, cap * sizeof *d);
    if (d) g->d = d;
    Mega__V1__RankHeld **c = d ? realloc(g->copies, cap * sizeof *c) : NULL;
    if (c) g->copies = c;
    char **nd = c ? realloc(g->nodes, cap * sizeof *nd) : NULL;
    if (nd) g->nodes = nd;
    uint32_t *rk = nd ? realloc(g->ranks, cap * sizeof *rk) : NULL;
    if (!rk) return; /* out of memory: that rank is no donor */
    g->ranks = rk;
    g->cap = cap;
  }
  Mega__V1__RankHeld *copy = (Mega__V1__RankHeld *)megad_pb_copy(&h->base);
  char *node = megad_strdup(node_id);
  if (!copy || !node) {
    if (copy) protobuf_c_message_free_unpacked(&copy->base, NULL);
    free(node);
    return;
  }
  g->copies[g->n] = copy;
  g->nodes[g->n] = node;
  g->ranks[g->n] = rank;
  g->n++;
}

/* Every node answered (or could not): plan, and let the job start. */
static void gather_done(gather *g) {
  megad_coord *c = g->c;
  mega_job *j = megad_jobs_find(c->jobs, g->job_id);
  for (size_t i = 0; i < g->n; i++)
    g->d[i] = (mega_replica_donor){.rank = g->ranks[i], .node_id = g->nodes[i],
                                   .held = g->copies[i]};
  if (j && j->attempt == g->attempt && j->coord.gathering) {
    j->coord.gathering = false;
    coord_plan_replicas(c, j, g->d, g->n);
    if (j->coord.replicas)
      megad_job_event(c->jobs, j, EV(INFO), c->b->node_id, -1,
                      "%zu rank%s of attempt %u kept %s state: restarting from the replicas' "
                      "state at iteration %llu (%llu iteration%s to redo)", g->n,
                      g->n == 1 ? "" : "s", g->attempt, g->n == 1 ? "its" : "their",
                      (unsigned long long)j->coord.replicas->iteration,
                      (unsigned long long)j->coord.replicas_redone,
                      j->coord.replicas_redone == 1 ? "" : "s");
    else {
      char from[96];
      coord_resume_point(j, from, sizeof from);
      megad_job_event(c->jobs, j, EV(INFO), c->b->node_id, -1,
                      "restarting from %s; not from replicas: %s", from,
                      j->coord.replicas_why ? j->coord.replicas_why : "none held");
    }
    megad_coord_schedule(c);
  }
  for (size_t i = 0; i < g->n; i++) {
    protobuf_c_message_free_unpacked(&g->copies[i]->base, NULL);
    free(g->nodes[i]);
  }
  free(g->d);
  free(g->copies);
  free(g->nodes);
  free(g->ranks);
  free(g->job_id);
  free(g);
}

static void ask_closed(uv_handle_t *h) {
  ask *a = h->data;
  gather *g = a->g;
  free(a->node_id);
  free(a);
  if (--g->asking == 0) gather_done(g);
}

static void ask_node(ask *a);
static void on_ask_again(uv_timer_t *t) { ask_node(t->data); }

/* One node's answer: its held ranks, unless some are still stopping and
 * it may be asked again. */
static void take_answer(ask *a, const Mega__V1__ListHeldResponse *r) {
  if (r && r->stopping && a->tries < ASK_TRIES) {
    uv_timer_start(&a->timer, on_ask_again, ASK_AGAIN_MS, 0);
    return;
  }
  for (size_t i = 0; r && i < r->n_held; i++)
    if (r->held[i]->held) gather_add(a->g, a->node_id, r->held[i]->rank, r->held[i]->held);
  uv_close((uv_handle_t *)&a->timer, ask_closed);
}

static void asked(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  ask *a = arg;
  take_answer(a, err->status == MEGA_OK ? (const Mega__V1__ListHeldResponse *)resp : NULL);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
}

static void ask_node(ask *a) {
  megad_coord *c = a->g->c;
  a->tries++;
  megad_node *n = megad_members_find(c->members, a->node_id);
  if (!n || n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    take_answer(a, NULL);
    return;
  }
  if (n->self) { /* this node's own ranks of the old attempt */
    megad_held_rank h[256];
    uint32_t stopping = 0;
    size_t k = megad_launch_held(c->L, a->g->job_id, a->g->attempt, h, 256, &stopping);
    Mega__V1__HeldRank hr[256], *ptrs[256];
    for (size_t i = 0; i < k; i++) {
      mega__v1__held_rank__init(&hr[i]);
      hr[i].rank = h[i].rank;
      hr[i].held = (Mega__V1__RankHeld *)h[i].held;
      ptrs[i] = &hr[i];
    }
    Mega__V1__ListHeldResponse r = MEGA__V1__LIST_HELD_RESPONSE__INIT;
    r.held = ptrs;
    r.n_held = k;
    r.stopping = stopping;
    take_answer(a, &r);
    return;
  }
  Mega__V1__ListHeldRequest req = MEGA__V1__LIST_HELD_REQUEST__INIT;
  req.job_id = a->g->job_id;
  req.attempt = a->g->attempt;
  if (megad_call(c->b, n->address, &mega_peer_list_held, &req.base, 2000, asked, a, NULL) !=
      MEGA_OK)
    take_answer(a, NULL);
}

/* Asks every node of j's placement what its ranks of j's attempt hold;
 * j waits (gathering) until all answered. */
static void gather_held(megad_coord *c, mega_job *j) {
  gather *g = calloc(1, sizeof *g);
  if (!g || !(g->job_id = megad_strdup(j->id))) {
    free(g);
    return;
  }
  g->c = c;
  g->attempt = j->attempt;
  g->asking = 1; /* until every ask is out */
  j->coord.gathering = true;
  for (size_t i = 0; i < j->nplaced; i++) {
    ask *a = calloc(1, sizeof *a);
    if (!a || !(a->node_id = megad_strdup(j->placement[i].node_id))) {
      free(a);
      continue;
    }
    a->g = g;
    uv_timer_init(c->b->loop, &a->timer);
    a->timer.data = a;
    g->asking++;
    ask_node(a);
  }
  if (--g->asking == 0) gather_done(g);
}

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
    gather_held(c, j);
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
