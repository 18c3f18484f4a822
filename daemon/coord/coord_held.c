/* What the ranks of a job's attempt kept, asked of its nodes (Peer
 * ListHeld) before the coordinator restarts the job: after a takeover in
 * etcd mode (coord_etcd.c), and after this megad restarted while the
 * attempt ran (coord.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/coord/coord_internal.h"
#include "daemon/model/util.h"

#define EV(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

/* ---- what the old attempt's ranks hold ---- */

#define ASK_TRIES 15  /* a node whose ranks are still stopping is asked again... */
#define ASK_AGAIN_MS 200 /* ...this much later */
/* a node not in the view yet (this megad just restarted: its peers come
 * back into its view within a heartbeat or two) is looked for this often */
#define VIEW_TRIES 25

/* The answers of the old attempt's nodes, gathered before the restart. */
typedef struct gather {
  megad_coord *c;
  char *job_id;
  uint32_t attempt;
  /* this megad just restarted: a node may not be in its view yet, and the
   * old attempt's ranks on it may still run (they are told to hold) */
  bool restarted;
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
  bool told; /* to hold (restarted) */
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
    coord_plan_replicas(c, j, g->d, g->n, 0);
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
    c->held_gathered(c);
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
  if (!n && a->g->restarted && a->tries < VIEW_TRIES) {
    uv_timer_start(&a->timer, on_ask_again, ASK_AGAIN_MS, 0);
    return;
  }
  if (!n || n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    take_answer(a, NULL);
    return;
  }
  if (n->self) { /* this node's own ranks of the old attempt */
    Mega__V1__ListHeldResponse *r = megad_launch_held(c->L, a->g->job_id, a->g->attempt);
    take_answer(a, r); /* out of memory: as a node that answered nothing */
    free(r);
    return;
  }
  mega_job *j = megad_jobs_find(c->jobs, a->g->job_id);
  if (a->g->restarted && !a->told && j) {
    a->told = true; /* its ranks answer "stopping" until they hold */
    coord_abort_attempt(c, j, a->node_id, a->g->attempt, false, true,
                        "the job's coordinator restarted");
  }
  Mega__V1__ListHeldRequest req = MEGA__V1__LIST_HELD_REQUEST__INIT;
  req.job_id = a->g->job_id;
  req.attempt = a->g->attempt;
  req.node_id = c->b->node_id; /* kept steps come here, even from a restart on this node */
  if (megad_call(c->b, n->address, &mega_peer_list_held, &req.base, 2000, asked, a, NULL) !=
      MEGA_OK)
    take_answer(a, NULL);
}

void coord_gather_held(megad_coord *c, mega_job *j, bool restarted) {
  gather *g = calloc(1, sizeof *g);
  if (!g || !(g->job_id = megad_strdup(j->id))) {
    free(g);
    return;
  }
  g->c = c;
  g->attempt = j->attempt;
  g->restarted = restarted;
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

