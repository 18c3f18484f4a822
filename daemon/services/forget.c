/* Control.ForgetNode (megactl nodes forget): a node gone for good leaves
 * the views. The answering node forgets it first (refused while it answers
 * or has ranks of a job coordinated here), then asks every other live node
 * to (local_only), each checking the same for itself, and says who did. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/services/services.h"

/* The fan-out: one call to each other live node. */
typedef struct forget_ctx {
  megad_services *s;
  mega_rpc_call *call; /* NULL once the client went away */
  Mega__V1__ForgetNodeRequest req; /* what the others are asked */
  char *node_id;
  size_t waiting;
  char **lists[4]; /* forgotten_by, kept_by, unanswered, down */
  size_t n[4];
} forget_ctx;

enum { FORGOT, KEPT, UNANSWERED, DOWN };

typedef struct forget_sub {
  forget_ctx *c;
  char node[MEGAD_NODE_NAME_MAX + 1];
} forget_sub;

#define FORGET_PEER_TIMEOUT_MS 2000

static void forget_free(forget_ctx *c) {
  for (int k = 0; k < 4; k++) {
    for (size_t i = 0; i < c->n[k]; i++) free(c->lists[k][i]);
    free(c->lists[k]);
  }
  free(c->node_id);
  free(c);
}

static void add(forget_ctx *c, int k, const char *node, const char *why) {
  char *v = NULL;
  if (why ? asprintf(&v, "%s: %s", node, why) < 0 : !(v = strdup(node))) return;
  c->lists[k][c->n[k]++] = v;
}

static void forget_done(forget_ctx *c) {
  if (c->call) {
    mega_rpc_call_on_cancel(c->call, NULL, NULL);
    Mega__V1__ForgetNodeResponse r = MEGA__V1__FORGET_NODE_RESPONSE__INIT;
    r.forgotten_by = c->lists[FORGOT];
    r.n_forgotten_by = c->n[FORGOT];
    r.kept_by = c->lists[KEPT];
    r.n_kept_by = c->n[KEPT];
    r.unanswered = c->lists[UNANSWERED];
    r.n_unanswered = c->n[UNANSWERED];
    r.down = c->lists[DOWN];
    r.n_down = c->n[DOWN];
    mega_rpc_reply(c->call, &r.base);
  }
  forget_free(c);
}

static void forget_answered(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  forget_sub *sub = arg;
  forget_ctx *c = sub->c;
  if (resp) add(c, FORGOT, sub->node, NULL);
  else if (err->status == MEGA_ERR_IO || err->status == MEGA_ERR_TIMEOUT ||
           err->status == MEGA_ERR_CANCELLED)
    add(c, UNANSWERED, sub->node, NULL);
  else /* it answered, and refused: its reason */
    add(c, KEPT, sub->node, err->msg);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(sub);
  if (--c->waiting == 0) forget_done(c);
}

static void forget_client_gone(mega_rpc_call *call, void *arg) {
  forget_ctx *c = arg;
  c->call = NULL;
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "the client went away; the nodes asked still forget");
}

static void ask_others(megad_services *s, mega_rpc_call *call, const char *id, uint64_t inc) {
  size_t nn = s->members->nnodes;
  forget_ctx *c = calloc(1, sizeof *c);
  bool ok = c && (c->node_id = strdup(id));
  for (int k = 0; ok && k < 4; k++) ok = (c->lists[k] = calloc(nn + 1, sizeof(char *)));
  if (!ok) {
    if (c) forget_free(c);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED,
                  "node %s forgot %s, but is out of memory to ask the others", s->b->node_id, id);
    return;
  }
  c->s = s;
  c->call = call;
  mega__v1__forget_node_request__init(&c->req);
  c->req.node_id = c->node_id;
  c->req.local_only = true;
  c->req.incarnation = inc;
  add(c, FORGOT, s->b->node_id, NULL);
  c->waiting = 1; /* held until every call is out */
  for (size_t i = 0; i < nn; i++) {
    megad_node *n = s->members->nodes[i];
    if (n->self) continue;
    if (!megad_node_usable(n) && n->state != MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT) {
      add(c, DOWN, n->id, NULL); /* cannot answer; it keeps what it lists */
      continue;
    }
    forget_sub *sub = calloc(1, sizeof *sub);
    if (!sub) {
      add(c, UNANSWERED, n->id, NULL);
      continue;
    }
    sub->c = c;
    snprintf(sub->node, sizeof sub->node, "%s", n->id);
    c->waiting++;
    mega_err e = {.status = MEGA_ERR_IO};
    if (megad_call(s->b, n->address, &mega_control_forget_node, &c->req.base,
                   FORGET_PEER_TIMEOUT_MS, forget_answered, sub, NULL) != MEGA_OK)
      forget_answered(sub, NULL, &e);
  }
  mega_rpc_call_on_cancel(call, forget_client_gone, c);
  if (--c->waiting == 0) forget_done(c);
}

void megad_on_forget_node(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_services *s = data;
  const Mega__V1__ForgetNodeRequest *req = (const void *)msg;
  const char *id = req->node_id ? req->node_id : "";
  const mega_job *j = id[0] ? megad_coord_job_on(s->coord, id) : NULL;
  if (j) {
    mega_rpc_fail(call, MEGA_RPC_FAILED_PRECONDITION,
                  "node %s has ranks of job %s (attempt %u), which node %s coordinates: cancel "
                  "the job or let that attempt end first (a lost node's attempt ends within "
                  "seconds)",
                  id, j->id, (unsigned)j->attempt, s->b->node_id);
    return;
  }
  const megad_node *n = megad_members_find(s->members, id);
  uint64_t inc = n ? n->incarnation : 0;
  if (req->incarnation > inc) inc = req->incarnation;
  mega_err e = {0};
  if (megad_members_forget(s->members, id, inc, req->local_only, &e) != MEGA_OK) {
    /* the node is there, but may not be forgotten: not the argument's fault */
    mega_rpc_fail(call, n ? MEGA_RPC_FAILED_PRECONDITION : mega_rpc_code_from_status(e.status),
                  "%s", e.msg);
    return;
  }
  if (!req->local_only) {
    ask_others(s, call, id, inc);
    return;
  }
  Mega__V1__ForgetNodeResponse r = MEGA__V1__FORGET_NODE_RESPONSE__INIT;
  char *me = s->b->node_id;
  r.forgotten_by = &me;
  r.n_forgotten_by = 1;
  mega_rpc_reply(call, &r.base);
}
