/* Cluster membership: every node heartbeats every other node it knows, once a
 * second, and learns new nodes from the views that come back. A node not
 * heard from for MEGAD_SUSPECT_MS is SUSPECT, for MEGAD_DEAD_MS DEAD: the
 * jobs with ranks there fail, and the ranks here of jobs it coordinated are
 * aborted. A new incarnation (a restarted megad) counts as a loss too. */
#include <stdlib.h>
#include <string.h>

#include "daemon/megad.h"
#include "daemon/util.h"

static const char *state_name(Mega__V1__NodeState s) {
  switch (s) {
  case MEGA__V1__NODE_STATE__NODE_STATE_ALIVE: return "alive";
  case MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT: return "suspect";
  case MEGA__V1__NODE_STATE__NODE_STATE_DEAD: return "dead";
  case MEGA__V1__NODE_STATE__NODE_STATE_LEFT: return "left";
  default: return "unknown";
  }
}

static void node_free(megad_node *n) {
  if (!n) return;
  free(n->id);
  free(n->address);
  free(n->version);
  free(n->backend);
  for (size_t i = 0; i < n->njob_ids; i++) free(n->job_ids[i]);
  free(n->job_ids);
  if (n->ch) mega_rpc_channel_free(n->ch);
  free(n);
}

megad_node *megad_node_find(megad *d, const char *id) {
  for (size_t i = 0; id && i < d->nnodes; i++)
    if (!strcmp(d->nodes[i]->id, id)) return d->nodes[i];
  return NULL;
}

megad_node *megad_self(megad *d) { return d->nodes[0]; }

static megad_node *node_add(megad *d, const char *id, const char *address) {
  megad_node **v = realloc(d->nodes, (d->nnodes + 1) * sizeof *v);
  if (!v) return NULL;
  d->nodes = v;
  megad_node *n = calloc(1, sizeof *n);
  if (!n || !(n->id = strdup(id)) || !(n->address = megad_strdup(address))) {
    node_free(n);
    return NULL;
  }
  n->state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  n->seen_ms = uv_now(d->loop);
  d->nodes[d->nnodes++] = n;
  d->view_version++;
  return n;
}

static void set_str(char **dst, const char *src) {
  if (!src || (*dst && !strcmp(*dst, src))) return;
  char *c = strdup(src);
  if (!c) return;
  free(*dst);
  *dst = c;
}

static void set_job_ids(megad_node *n, char **ids, size_t k) {
  char **v = calloc(k ? k : 1, sizeof *v);
  if (!v) return;
  for (size_t i = 0; i < k; i++) v[i] = megad_strdup(ids[i]);
  for (size_t i = 0; i < n->njob_ids; i++) free(n->job_ids[i]);
  free(n->job_ids);
  n->job_ids = v;
  n->njob_ids = k;
}

mega_status megad_members_init(megad *d, mega_err *err) {
  megad_node *self = node_add(d, d->node_id, d->address);
  if (!self) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  self->self = true;
  self->slots = (uint32_t)d->o.slots;
  self->incarnation = d->incarnation;
  self->version = strdup(MEGA_VERSION);
  self->backend = strdup("cpu");
  self->last_heartbeat_unix_ms = megad_unix_ms();
  for (const char *p = d->o.peers; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len) {
      char **v = realloc(d->peers, (d->npeers + 1) * sizeof *v);
      bool *j = realloc(d->peer_joined, (d->npeers + 1) * sizeof *j);
      if (v) d->peers = v;
      if (j) d->peer_joined = j;
      bool *g = j ? realloc(d->peer_joining, (d->npeers + 1) * sizeof *g) : NULL;
      if (g) d->peer_joining = g;
      bool *w = g ? realloc(d->peer_warned, (d->npeers + 1) * sizeof *w) : NULL;
      if (w) d->peer_warned = w;
      if (!v || !j || !g || !w || !(d->peers[d->npeers] = strndup(p, len)))
        return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
      d->peer_joined[d->npeers] = d->peer_joining[d->npeers] = d->peer_warned[d->npeers] = false;
      d->npeers++;
    }
    p = end ? end + 1 : NULL;
  }
  return MEGA_OK;
}

void megad_members_free(megad *d) {
  for (size_t i = 0; i < d->nnodes; i++) node_free(d->nodes[i]);
  free(d->nodes);
  d->nodes = NULL;
  d->nnodes = 0;
  for (size_t i = 0; i < d->npeers; i++) free(d->peers[i]);
  free(d->peers);
  free(d->peer_joined);
  free(d->peer_joining);
  free(d->peer_warned);
  d->peers = NULL;
  d->npeers = 0;
}


/* ---- messages ---- */

typedef struct view_msg {
  Mega__V1__MembershipView view;
  Mega__V1__Node *nodes, **ptrs;
} view_msg;

static void node_msg(megad_node *n, Mega__V1__Node *m) {
  mega__v1__node__init(m);
  m->id = n->id;
  m->address = n->address;
  m->state = n->state;
  m->slots = n->slots;
  m->slots_used = n->slots_used;
  m->backend = n->backend ? n->backend : "";
  m->device_name = "";
  m->incarnation = n->incarnation;
  m->last_heartbeat_unix_ms = n->last_heartbeat_unix_ms;
  m->version = n->version ? n->version : "";
  m->job_ids = n->job_ids;
  m->n_job_ids = n->njob_ids;
}

/* Refreshes what this node says about itself. */
static void refresh_self(megad *d) {
  megad_node *self = megad_self(d);
  const char *ids[256];
  size_t k = megad_launch_job_ids(d, ids, 256);
  set_job_ids(self, (char **)ids, k);
  self->last_heartbeat_unix_ms = megad_unix_ms();
}

static bool view_init(megad *d, view_msg *v) {
  refresh_self(d);
  mega__v1__membership_view__init(&v->view);
  v->nodes = calloc(d->nnodes, sizeof *v->nodes);
  v->ptrs = calloc(d->nnodes, sizeof *v->ptrs);
  if (!v->nodes || !v->ptrs) {
    free(v->nodes);
    free(v->ptrs);
    return false;
  }
  for (size_t i = 0; i < d->nnodes; i++) {
    node_msg(d->nodes[i], &v->nodes[i]);
    v->ptrs[i] = &v->nodes[i];
  }
  v->view.version = d->view_version;
  v->view.nodes = v->ptrs;
  v->view.n_nodes = d->nnodes;
  return true;
}

static void view_free(view_msg *v) {
  free(v->nodes);
  free(v->ptrs);
}

/* ---- liveness ---- */

static void node_lost(megad *d, megad_node *n, Mega__V1__NodeState to, const char *why) {
  n->state = to;
  d->view_version++;
  megad_warn(d, "%s", why);
  megad_coord_node_lost(d, n->id, why);
  char abort_why[512];
  snprintf(abort_why, sizeof abort_why, "the job's coordinator is gone: %s", why);
  megad_launch_abort_coord(d, n->id, abort_why);
}

/* A sign of life from n, in incarnation inc (0: unknown). */
static void saw(megad *d, megad_node *n, uint64_t inc) {
  if (inc && n->incarnation && inc != n->incarnation) {
    char why[300];
    snprintf(why, sizeof why, "node %s restarted (its megad is a new incarnation)", n->id);
    node_lost(d, n, MEGA__V1__NODE_STATE__NODE_STATE_ALIVE, why);
  }
  if (inc) n->incarnation = inc;
  if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_ALIVE) {
    megad_log(d, "node %s (%s) is alive again (was %s)", n->id, n->address, state_name(n->state));
    n->state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
    d->view_version++;
  }
  n->seen_ms = uv_now(d->loop);
  n->last_heartbeat_unix_ms = megad_unix_ms();
}

static void check_liveness(megad *d) {
  uint64_t now = uv_now(d->loop);
  for (size_t i = 1; i < d->nnodes; i++) {
    megad_node *n = d->nodes[i];
    if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
        n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
      continue;
    uint64_t quiet = now - n->seen_ms;
    if (quiet >= MEGAD_DEAD_MS) {
      char why[300];
      snprintf(why, sizeof why, "node %s stopped answering heartbeats", n->id);
      node_lost(d, n, MEGA__V1__NODE_STATE__NODE_STATE_DEAD, why);
    } else if (quiet >= MEGAD_SUSPECT_MS && n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE) {
      n->state = MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT;
      d->view_version++;
    }
  }
}

/* Learns the nodes of a view; liveness stays this node's own judgement.
 * from is the node that sent it (its own load counts), or NULL. */
static void merge_view(megad *d, const Mega__V1__MembershipView *v, megad_node *from) {
  for (size_t i = 0; v && i < v->n_nodes; i++) {
    const Mega__V1__Node *m = v->nodes[i];
    if (!m->id || !m->id[0] || !strcmp(m->id, d->node_id)) continue;
    megad_node *n = megad_node_find(d, m->id);
    if (!n) {
      if (m->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT ||
          m->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD || !m->address || !m->address[0])
        continue;
      if (!(n = node_add(d, m->id, m->address))) continue;
      n->incarnation = m->incarnation;
      megad_log(d, "node %s (%s) joined the view", n->id, n->address);
    } else if (m->incarnation < n->incarnation) {
      continue; /* stale news of an older incarnation */
    }
    if (m->address && m->address[0] && strcmp(n->address, m->address)) {
      set_str(&n->address, m->address);
      if (n->ch) mega_rpc_channel_free(n->ch);
      n->ch = NULL;
    }
    n->slots = m->slots;
    set_str(&n->version, m->version);
    set_str(&n->backend, m->backend);
    if (from == n) {
      n->slots_used = m->slots_used;
      set_job_ids(n, m->job_ids, m->n_job_ids);
    }
  }
}

/* ---- outgoing: Join and Heartbeat ---- */

typedef struct join_ctx {
  megad *d;
  size_t peer; /* index in d->peers, or SIZE_MAX for a rejoin */
} join_ctx;

static void joined(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  join_ctx *c = arg;
  megad *d = c->d;
  bool peer = c->peer < d->npeers;
  if (peer) d->peer_joining[c->peer] = false;
  /* A peer not up yet is asked again on the next tick; a refusal (a taken
   * node name) is worth saying, once. */
  if (peer && !resp && err->status == MEGA_ERR_INVALID && !d->peer_warned[c->peer]) {
    d->peer_warned[c->peer] = true;
    megad_warn(d, "joining %s: %s", d->peers[c->peer], err->msg);
  }
  if (resp && !d->stopping) {
    Mega__V1__JoinResponse *r = (void *)resp;
    merge_view(d, r->view, NULL);
    /* the answering node lists itself under the address it was asked at */
    for (size_t i = 0; peer && r->view && i < r->view->n_nodes; i++) {
      const Mega__V1__Node *m = r->view->nodes[i];
      megad_node *n = megad_node_find(d, m->id);
      if (n && !n->self && m->address && !strcmp(m->address, d->peers[c->peer]))
        saw(d, n, m->incarnation);
    }
    if (peer && !d->peer_joined[c->peer]) {
      d->peer_joined[c->peer] = true;
      megad_log(d, "joined %s (%zu node%s in view)", d->peers[c->peer], d->nnodes,
                d->nnodes == 1 ? "" : "s");
    }
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(c);
}

static void send_join(megad *d, const char *address, size_t peer) {
  join_ctx *c = calloc(1, sizeof *c);
  if (!c) return;
  c->d = d;
  c->peer = peer;
  refresh_self(d);
  Mega__V1__Node self;
  node_msg(megad_self(d), &self);
  Mega__V1__JoinRequest req = MEGA__V1__JOIN_REQUEST__INIT;
  req.node = &self;
  if (megad_call_addr(d, address, &mega_peer_join, &req.base, 2000, joined, c, NULL) != MEGA_OK) {
    free(c);
    return;
  }
  if (peer < d->npeers) d->peer_joining[peer] = true;
}

typedef struct hb_ctx {
  megad *d;
  char *node_id;
} hb_ctx;

static void heartbeat_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)err;
  hb_ctx *c = arg;
  megad *d = c->d;
  megad_node *n = megad_node_find(d, c->node_id);
  if (n) n->hb_inflight = false;
  if (n && resp && !d->stopping) {
    Mega__V1__HeartbeatResponse *r = (void *)resp;
    uint64_t inc = 0;
    bool knows_me = false;
    for (size_t i = 0; r->view && i < r->view->n_nodes; i++) {
      const Mega__V1__Node *m = r->view->nodes[i];
      if (!strcmp(m->id, n->id)) inc = m->incarnation;
      if (!strcmp(m->id, d->node_id) && m->incarnation == d->incarnation) knows_me = true;
    }
    saw(d, n, inc);
    merge_view(d, r->view, n);
    if (!knows_me) send_join(d, n->address, SIZE_MAX); /* it restarted and forgot this node */
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(c->node_id);
  free(c);
}

static void send_heartbeat(megad *d, megad_node *n) {
  hb_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->node_id = strdup(n->id))) {
    free(c);
    return;
  }
  c->d = d;
  megad_node *self = megad_self(d);
  Mega__V1__HeartbeatRequest req = MEGA__V1__HEARTBEAT_REQUEST__INIT;
  req.node_id = d->node_id;
  req.incarnation = d->incarnation;
  req.view_version = d->view_version;
  req.slots_used = self->slots_used;
  req.job_ids = self->job_ids;
  req.n_job_ids = self->njob_ids;
  if (megad_call(d, n, &mega_peer_heartbeat, &req.base, 2000, heartbeat_done, c, NULL) != MEGA_OK) {
    free(c->node_id);
    free(c);
    return;
  }
  n->hb_inflight = true;
}

void megad_members_tick(megad *d) {
  refresh_self(d);
  for (size_t i = 0; i < d->npeers; i++)
    if (!d->peer_joined[i] && !d->peer_joining[i]) send_join(d, d->peers[i], i);
  for (size_t i = 1; i < d->nnodes; i++) {
    megad_node *n = d->nodes[i];
    if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT && !n->hb_inflight) send_heartbeat(d, n);
  }
  check_liveness(d);
}

static void left(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)arg;
  (void)err;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
}

void megad_members_leave(megad *d) {
  Mega__V1__LeaveRequest req = MEGA__V1__LEAVE_REQUEST__INIT;
  req.node_id = d->node_id;
  req.incarnation = d->incarnation;
  for (size_t i = 1; i < d->nnodes; i++) {
    megad_node *n = d->nodes[i];
    if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE ||
        n->state == MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT)
      megad_call(d, n, &mega_peer_leave, &req.base, 1000, left, NULL, NULL);
  }
}

/* ---- incoming: Join, Heartbeat, Leave, ListNodes ---- */

static void reply_view(megad *d, mega_rpc_call *call, bool heartbeat) {
  view_msg v;
  if (!view_init(d, &v)) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (heartbeat) {
    Mega__V1__HeartbeatResponse r = MEGA__V1__HEARTBEAT_RESPONSE__INIT;
    r.view = &v.view;
    mega_rpc_reply(call, &r.base);
  } else {
    Mega__V1__JoinResponse r = MEGA__V1__JOIN_RESPONSE__INIT;
    r.view = &v.view;
    mega_rpc_reply(call, &r.base);
  }
  view_free(&v);
}

static void on_join(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__JoinRequest *req = (const void *)msg;
  const Mega__V1__Node *m = req->node;
  if (!m || !m->id || !m->id[0] || !m->address || !m->address[0]) {
    mega_rpc_fail(call, MEGA_RPC_INVALID_ARGUMENT, "Join needs the node's id and address");
    return;
  }
  if (!strcmp(m->id, d->node_id)) {
    if (m->incarnation != d->incarnation)
      mega_rpc_fail(call, MEGA_RPC_ALREADY_EXISTS,
                    "node name %s is taken by the megad at %s: give each node its own --node-name",
                    m->id, d->address);
    else
      reply_view(d, call, false);
    return;
  }
  megad_node *n = megad_node_find(d, m->id);
  bool fresh = !n;
  if (!n && !(n = node_add(d, m->id, m->address))) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (strcmp(n->address, m->address)) {
    set_str(&n->address, m->address);
    if (n->ch) mega_rpc_channel_free(n->ch);
    n->ch = NULL;
  }
  n->slots = m->slots;
  n->slots_used = m->slots_used;
  set_str(&n->version, m->version);
  set_str(&n->backend, m->backend);
  saw(d, n, m->incarnation);
  d->view_version++;
  if (fresh) megad_log(d, "node %s (%s, %u slot%s) joined", n->id, n->address, n->slots,
                       n->slots == 1 ? "" : "s");
  reply_view(d, call, false);
  megad_schedule(d);
}

static void on_heartbeat(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__HeartbeatRequest *req = (const void *)msg;
  megad_node *n = megad_node_find(d, req->node_id);
  if (n && !n->self) {
    saw(d, n, req->incarnation);
    n->slots_used = req->slots_used;
    set_job_ids(n, req->job_ids, req->n_job_ids);
  }
  reply_view(d, call, true);
}

static void on_leave(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad *d = data;
  const Mega__V1__LeaveRequest *req = (const void *)msg;
  megad_node *n = megad_node_find(d, req->node_id);
  if (n && !n->self && (!req->incarnation || req->incarnation == n->incarnation) &&
      n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    char why[300];
    snprintf(why, sizeof why, "node %s left the cluster (its megad stopped)", n->id);
    node_lost(d, n, MEGA__V1__NODE_STATE__NODE_STATE_LEFT, why);
  }
  Mega__V1__LeaveResponse r = MEGA__V1__LEAVE_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

static void on_list_nodes(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  (void)msg;
  megad *d = data;
  view_msg v;
  if (!view_init(d, &v)) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  Mega__V1__ListNodesResponse r = MEGA__V1__LIST_NODES_RESPONSE__INIT;
  r.nodes = v.ptrs;
  r.n_nodes = d->nnodes;
  r.self_node_id = d->node_id;
  r.view_version = d->view_version;
  mega_rpc_reply(call, &r.base);
  view_free(&v);
}

void megad_members_register(megad *d) {
  mega_rpc_server_handle(d->srv, &mega_peer_join, on_join, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_peer_heartbeat, on_heartbeat, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_peer_leave, on_leave, d, NULL);
  mega_rpc_server_handle(d->srv, &mega_control_list_nodes, on_list_nodes, d, NULL);
}
