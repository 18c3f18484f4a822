/* Cluster membership (see members.h): heartbeats between peers, the Peer
 * calls, and the start and end of both modes; over members_etcd.c and the
 * node table (members_nodes.c). */
#include "daemon/members/members_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/util.h"
#include "core/version.h"

mega_status megad_members_init(megad_members *m, megad_base *b, const megad_members_opts *o,
                               uint64_t incarnation, megad_etcd *etcd,
                               const megad_members_cbs *cbs, mega_err *err) {
  memset(m, 0, sizeof *m);
  if (etcd && o->peers && o->peers[0])
    return mega_fail(err, MEGA_ERR_INVALID, "membership comes from etcd or from peers, not both");
  m->b = b;
  m->etcd = etcd;
  m->o = *o;
  m->cbs = *cbs;
  m->incarnation = incarnation;
  megad_node *self = members_node_add(m, b->node_id, o->address);
  if (!self) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  self->self = true;
  self->slots = o->slots;
  self->incarnation = incarnation;
  self->version = strdup(mega_version());
  self->backend = strdup(o->backend ? o->backend : "cpu");
  self->device_name = strdup(o->device_name ? o->device_name : "");
  self->last_heartbeat_unix_ms = megad_unix_ms();
  uv_timer_init(b->loop, &m->timer);
  m->timer.data = m;
  m->timer_on = true;
  for (const char *p = o->peers; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len) {
      char **v = realloc(m->peers, (m->npeers + 1) * sizeof *v);
      bool *j = realloc(m->peer_joined, (m->npeers + 1) * sizeof *j);
      if (v) m->peers = v;
      if (j) m->peer_joined = j;
      bool *g = j ? realloc(m->peer_joining, (m->npeers + 1) * sizeof *g) : NULL;
      if (g) m->peer_joining = g;
      bool *w = g ? realloc(m->peer_warned, (m->npeers + 1) * sizeof *w) : NULL;
      if (w) m->peer_warned = w;
      if (!v || !j || !g || !w || !(m->peers[m->npeers] = strndup(p, len)))
        return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
      m->peer_joined[m->npeers] = m->peer_joining[m->npeers] = m->peer_warned[m->npeers] = false;
      m->npeers++;
    }
    p = end ? end + 1 : NULL;
  }
  return MEGA_OK;
}

void megad_members_free(megad_members *m) {
  if (m->timer_on) uv_close((uv_handle_t *)&m->timer, NULL);
  m->timer_on = false;
  for (size_t i = 0; i < m->nnodes; i++) members_node_free(m->nodes[i]);
  free(m->nodes);
  m->nodes = NULL;
  m->nnodes = 0;
  free(m->etcd_key);
  free(m->etcd_sig);
  free(m->etcd_load_key);
  m->etcd_key = m->etcd_sig = m->etcd_load_key = NULL;
  free(m->loads_waits); /* none: the client's end ran them (megad_etcd_free) */
  m->loads_waits = NULL;
  m->nloads_waits = 0;
  for (size_t i = 0; i < m->npeers; i++) free(m->peers[i]);
  free(m->peers);
  free(m->peer_joined);
  free(m->peer_joining);
  free(m->peer_warned);
  m->peers = NULL;
  m->npeers = 0;
}


/* ---- messages ---- */

typedef struct view_msg {
  Mega__V1__MembershipView view;
  Mega__V1__Node *nodes, **ptrs;
} view_msg;

static bool view_init(megad_members *m, view_msg *v) {
  members_refresh_self(m);
  mega__v1__membership_view__init(&v->view);
  v->nodes = calloc(m->nnodes, sizeof *v->nodes);
  v->ptrs = calloc(m->nnodes, sizeof *v->ptrs);
  if (!v->nodes || !v->ptrs) {
    free(v->nodes);
    free(v->ptrs);
    return false;
  }
  for (size_t i = 0; i < m->nnodes; i++) {
    members_node_msg(m->nodes[i], &v->nodes[i]);
    /* etcd mode: a node is heard from as long as its lease lives */
    if (m->etcd && megad_node_usable(m->nodes[i])) v->nodes[i].last_heartbeat_unix_ms = megad_unix_ms();
    v->ptrs[i] = &v->nodes[i];
  }
  v->view.version = m->view_version;
  v->view.nodes = v->ptrs;
  v->view.n_nodes = m->nnodes;
  return true;
}

static void view_free(view_msg *v) {
  free(v->nodes);
  free(v->ptrs);
}

/* ---- liveness ---- */

/* A sign of life from n, in incarnation inc (0: unknown). */
static void members_saw(megad_members *m, megad_node *n, uint64_t inc) {
  /* a megad that left is stopping: an answer it gave before it left (a
   * heartbeat's, still on its way) is no sign of life; only a new
   * incarnation comes back */
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT && (!inc || inc == n->incarnation))
    return;
  /* a new incarnation is a loss (unless the old one was lost already),
   * then an up, as in etcd mode: it runs none of the old one's ranks */
  if (inc && n->incarnation && inc != n->incarnation) {
    bool down = n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
                n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT;
    char why[300];
    snprintf(why, sizeof why, "node %s restarted (its megad is a new incarnation)", n->id);
    if (!down) members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_DEAD, why);
    else megad_log(m->b, "node %s is back as a new incarnation", n->id);
  }
  if (inc) n->incarnation = inc;
  n->seen_ms = uv_now(m->b->loop);
  n->last_heartbeat_unix_ms = megad_unix_ms();
  if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_ALIVE) {
    bool was_lost = n->state != MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT;
    megad_log(m->b, "node %s (%s) is alive again (was %s)", n->id, n->address,
              members_state_name(n->state));
    n->state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
    m->view_version++;
    if (was_lost && m->cbs.node_up) m->cbs.node_up(m->cbs.arg, n);
  }
}

static void check_liveness(megad_members *m) {
  for (size_t i = 1; i < m->nnodes; i++) {
    megad_node *n = m->nodes[i];
    if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
        n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
      continue;
    /* this node's own stall is no silence of n's */
    uint64_t quiet = megad_quiet_ms(m->b, n->seen_ms);
    if (quiet >= m->o.heartbeat_timeout_ms) {
      char why[300];
      snprintf(why, sizeof why, "node %s missed heartbeats for %.1f s", n->id,
               (double)quiet / 1000);
      members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_DEAD, why);
    } else if (quiet >= m->o.heartbeat_timeout_ms / 2 &&
               n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE) {
      n->state = MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT;
      m->view_version++;
    }
  }
}

/* Learns the nodes of a view; liveness stays this node's own judgement.
 * from is the node that sent it (its own load counts), or NULL. */
static void merge_view(megad_members *mb, const Mega__V1__MembershipView *v, megad_node *from) {
  for (size_t i = 0; v && i < v->n_nodes; i++) {
    const Mega__V1__Node *m = v->nodes[i];
    if (!m->id || !m->id[0] || !strcmp(m->id, mb->b->node_id)) continue;
    megad_node *n = megad_members_find(mb, m->id);
    bool fresh = false;
    if (!n) {
      if (m->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT ||
          m->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD || !m->address || !m->address[0] ||
          members_forgotten(mb, m->id, m->incarnation))
        continue;
      if (!(n = members_node_add(mb, m->id, m->address))) continue;
      n->incarnation = n->address_inc = m->incarnation;
      fresh = true;
      megad_log(mb->b, "node %s (%s) joined the view", n->id, n->address);
    } else if (m->incarnation < n->incarnation) {
      continue; /* stale news of an older incarnation */
    }
    members_set_address(mb, n, m->address, m->incarnation);
    n->slots = m->slots;
    members_set_version(mb, n, m->version);
    members_set_str(&n->backend, m->backend);
    members_set_str(&n->device_name, m->device_name);
    if (from == n) {
      n->slots_used = m->slots_used;
      members_set_job_ids(n, m->job_ids, m->n_job_ids);
    }
    if (fresh && mb->cbs.node_up) mb->cbs.node_up(mb->cbs.arg, n);
  }
}

typedef struct join_ctx {
  megad_members *m;
  size_t peer; /* index in m->peers, or SIZE_MAX for a rejoin */
} join_ctx;

static void joined(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  join_ctx *c = arg;
  megad_members *m = c->m;
  bool peer = c->peer < m->npeers;
  if (peer) m->peer_joining[c->peer] = false;
  /* A peer not up yet is asked again on the next tick; a refusal (a taken
   * node name) is worth saying, once. */
  if (peer && !resp && err->status == MEGA_ERR_INVALID && !m->peer_warned[c->peer]) {
    m->peer_warned[c->peer] = true;
    megad_warn(m->b, "joining %s: %s", m->peers[c->peer], err->msg);
  }
  if (resp && !m->b->stopping) {
    Mega__V1__JoinResponse *r = (void *)resp;
    merge_view(m, r->view, NULL);
    /* the answering node lists itself under the address it was asked at */
    for (size_t i = 0; peer && r->view && i < r->view->n_nodes; i++) {
      const Mega__V1__Node *nm = r->view->nodes[i];
      megad_node *n = megad_members_find(m, nm->id);
      if (n && !n->self && nm->address && !strcmp(nm->address, m->peers[c->peer]))
        members_saw(m, n, nm->incarnation);
    }
    if (peer && !m->peer_joined[c->peer]) {
      m->peer_joined[c->peer] = true;
      megad_log(m->b, "joined %s (%zu node%s in view)", m->peers[c->peer], m->nnodes,
                m->nnodes == 1 ? "" : "s");
    }
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(c);
}

static void send_join(megad_members *m, const char *address, size_t peer) {
  join_ctx *c = calloc(1, sizeof *c);
  if (!c) return;
  c->m = m;
  c->peer = peer;
  members_refresh_self(m);
  Mega__V1__Node self;
  members_node_msg(megad_members_self(m), &self);
  Mega__V1__JoinRequest req = MEGA__V1__JOIN_REQUEST__INIT;
  req.node = &self;
  if (megad_call(m->b, address, &mega_peer_join, &req.base, 2000, joined, c, NULL) != MEGA_OK) {
    free(c);
    return;
  }
  if (peer < m->npeers) m->peer_joining[peer] = true;
}

typedef struct hb_ctx {
  megad_members *m;
  char *node_id;
} hb_ctx;

static void heartbeat_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)err;
  hb_ctx *c = arg;
  megad_members *m = c->m;
  megad_node *n = megad_members_find(m, c->node_id);
  if (n) n->hb_inflight = false;
  Mega__V1__HeartbeatResponse *hr = (void *)resp;
  if (n && hr && !m->b->stopping && hr->node_id && hr->node_id[0] && strcmp(hr->node_id, n->id)) {
    /* another megad listens at n's address now: n's is gone, and what
     * answers there is no sign of n's life */
    if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_DEAD &&
        n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
      char why[400];
      snprintf(why, sizeof why, "node %s is gone: its address %s answers as node %s", n->id,
               n->address, hr->node_id);
      members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_DEAD, why);
    }
  } else if (n && resp && !m->b->stopping) {
    Mega__V1__HeartbeatResponse *r = (void *)resp;
    uint64_t inc = 0;
    bool knows_me = false;
    for (size_t i = 0; r->view && i < r->view->n_nodes; i++) {
      const Mega__V1__Node *nm = r->view->nodes[i];
      if (!strcmp(nm->id, n->id)) inc = nm->incarnation;
      if (!strcmp(nm->id, m->b->node_id) && nm->incarnation == m->incarnation) knows_me = true;
    }
    members_saw(m, n, inc);
    merge_view(m, r->view, n);
    if (!knows_me) send_join(m, n->address, SIZE_MAX); /* it restarted and forgot this node */
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(c->node_id);
  free(c);
}

static void send_heartbeat(megad_members *m, megad_node *n) {
  hb_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->node_id = strdup(n->id))) {
    free(c);
    return;
  }
  c->m = m;
  megad_node *self = megad_members_self(m);
  Mega__V1__HeartbeatRequest req = MEGA__V1__HEARTBEAT_REQUEST__INIT;
  req.node_id = m->b->node_id;
  req.incarnation = m->incarnation;
  req.view_version = m->view_version;
  req.slots_used = self->slots_used;
  req.job_ids = self->job_ids;
  req.n_job_ids = self->njob_ids;
  req.address = self->address;
  if (megad_call(m->b, n->address, &mega_peer_heartbeat, &req.base, m->o.heartbeat_timeout_ms,
                 heartbeat_done, c, NULL) != MEGA_OK) {
    free(c->node_id);
    free(c);
    return;
  }
  n->hb_inflight = true;
}

/* Whether n is due a heartbeat: every interval while it answers; a DEAD
 * one after gaps that double up to MEGAD_MEMBERS_PROBE_MAX_MS (it may be
 * back from a partition or a freeze, but most likely it is gone, and a
 * call to it every interval for ever costs every node). */
static bool heartbeat_due(megad_members *m, megad_node *n) {
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT || n->hb_inflight) return false;
  if (n->state != MEGA__V1__NODE_STATE__NODE_STATE_DEAD) return true;
  uint64_t now = uv_now(m->b->loop);
  if (now < n->probe_at_ms) return false;
  unsigned gap = n->probe_gap_ms ? 2 * n->probe_gap_ms : 2 * m->o.heartbeat_interval_ms;
  unsigned most = MEGAD_MEMBERS_PROBE_MAX_MS > m->o.heartbeat_interval_ms
                      ? MEGAD_MEMBERS_PROBE_MAX_MS
                      : m->o.heartbeat_interval_ms;
  n->probe_gap_ms = gap < most ? gap : most;
  n->probe_at_ms = now + n->probe_gap_ms;
  return true;
}

static void on_tick(uv_timer_t *t) {
  megad_members *m = t->data;
  if (m->b->stopping) return;
  members_refresh_self(m);
  for (size_t i = 0; i < m->npeers; i++)
    if (!m->peer_joined[i] && !m->peer_joining[i]) send_join(m, m->peers[i], i);
  for (size_t i = 1; i < m->nnodes; i++)
    if (heartbeat_due(m, m->nodes[i])) send_heartbeat(m, m->nodes[i]);
  check_liveness(m);
}

void megad_members_start(megad_members *m) {
  if (m->etcd) members_etcd_start(m);
  else uv_timer_start(&m->timer, on_tick, 0, m->o.heartbeat_interval_ms);
}

static void left(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)err;
  megad_members *m = arg;
  if (m->leave_calls) m->leave_calls--;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
}

bool megad_members_leaving(const megad_members *m) { return m->etcd_leaving || m->leave_calls; }

/* A Peer Leave to n, if it is up. */
static void send_leave(megad_members *m, megad_node *n) {
  if (n->self || (n->state != MEGA__V1__NODE_STATE__NODE_STATE_ALIVE &&
                  n->state != MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT))
    return;
  Mega__V1__LeaveRequest req = MEGA__V1__LEAVE_REQUEST__INIT;
  req.node_id = m->b->node_id;
  req.incarnation = m->incarnation;
  if (megad_call(m->b, n->address, &mega_peer_leave, &req.base, 1000, left, m, NULL) == MEGA_OK)
    m->leave_calls++;
}

void megad_members_leave_to(megad_members *m, const char *const *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    megad_node *nd = megad_members_find(m, ids[i]);
    if (nd) send_leave(m, nd);
  }
}

void megad_members_leave(megad_members *m) {
  if (m->left) return;
  m->left = true;
  uv_timer_stop(&m->timer);
  if (m->etcd) {
    members_etcd_leave(m);
    return;
  }
  for (size_t i = 1; i < m->nnodes; i++) send_leave(m, m->nodes[i]);
}

/* ---- incoming: Join, Heartbeat, Leave, ListNodes ---- */

static void reply_view(megad_members *m, mega_rpc_call *call, bool heartbeat) {
  view_msg v;
  if (!view_init(m, &v)) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (heartbeat) {
    Mega__V1__HeartbeatResponse r = MEGA__V1__HEARTBEAT_RESPONSE__INIT;
    r.view = &v.view;
    r.node_id = m->b->node_id;
    r.incarnation = m->incarnation;
    mega_rpc_reply(call, &r.base);
  } else {
    Mega__V1__JoinResponse r = MEGA__V1__JOIN_RESPONSE__INIT;
    r.view = &v.view;
    mega_rpc_reply(call, &r.base);
  }
  view_free(&v);
}

static void on_join(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_members *m = data;
  const Mega__V1__JoinRequest *req = (const void *)msg;
  const Mega__V1__Node *nm = req->node;
  if (m->etcd) {
    mega_rpc_fail(call, MEGA_RPC_FAILED_PRECONDITION,
                  "megad %s takes its membership from etcd: start the joining megad with the "
                  "same --etcd-endpoints instead of --peers", m->b->node_id);
    return;
  }
  if (!nm || !nm->id || !nm->id[0] || !nm->address || !nm->address[0]) {
    mega_rpc_fail(call, MEGA_RPC_INVALID_ARGUMENT, "Join needs the node's id and address");
    return;
  }
  if (!strcmp(nm->id, m->b->node_id)) {
    if (nm->incarnation != m->incarnation)
      mega_rpc_fail(call, MEGA_RPC_ALREADY_EXISTS,
                    "node name %s is taken by the megad at %s: give each node its own --node-name",
                    nm->id, m->o.address);
    else
      reply_view(m, call, false);
    return;
  }
  members_unforget(m, nm->id); /* it speaks for itself */
  megad_node *n = megad_members_find(m, nm->id);
  bool fresh = !n;
  if (!n && !(n = members_node_add(m, nm->id, nm->address))) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  members_set_address(m, n, nm->address, nm->incarnation);
  n->slots = nm->slots;
  n->slots_used = nm->slots_used;
  members_set_version(m, n, nm->version);
  members_set_str(&n->backend, nm->backend);
  members_set_str(&n->device_name, nm->device_name);
  members_saw(m, n, nm->incarnation);
  m->view_version++;
  if (fresh) megad_log(m->b, "node %s (%s, %u slot%s) joined", n->id, n->address, n->slots,
                       n->slots == 1 ? "" : "s");
  reply_view(m, call, false);
  if (fresh && m->cbs.node_up) m->cbs.node_up(m->cbs.arg, n);
}

static void on_heartbeat(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_members *m = data;
  const Mega__V1__HeartbeatRequest *req = (const void *)msg;
  megad_node *n = megad_members_find(m, req->node_id);
  if (n && !n->self) {
    /* before the incarnation: views this node sends carry both, together */
    if (req->incarnation >= n->incarnation)
      members_set_address(m, n, req->address, req->incarnation);
    members_saw(m, n, req->incarnation);
    n->slots_used = req->slots_used;
    members_set_job_ids(n, req->job_ids, req->n_job_ids);
  }
  reply_view(m, call, true);
}

static void on_leave(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_members *m = data;
  const Mega__V1__LeaveRequest *req = (const void *)msg;
  megad_node *n = megad_members_find(m, req->node_id);
  if (n && !n->self && (!req->incarnation || req->incarnation == n->incarnation) &&
      n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    char why[300];
    snprintf(why, sizeof why, "node %s left the cluster (its megad stopped)", n->id);
    members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_LEFT, why);
  }
  Mega__V1__LeaveResponse r = MEGA__V1__LEAVE_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

/* A ListNodes call waiting for a read of the loads (etcd mode). */
typedef struct members_list_wait {
  mega_rpc_call *call; /* NULL once answered (its client went away) */
  megad_members *m;
} members_list_wait;

#define LIST_LOADS_FRESH_MS 200

static void answer_list(megad_members *m, mega_rpc_call *call) {
  view_msg v;
  if (!view_init(m, &v)) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  Mega__V1__ListNodesResponse r = MEGA__V1__LIST_NODES_RESPONSE__INIT;
  r.nodes = v.ptrs;
  r.n_nodes = m->nnodes;
  r.self_node_id = m->b->node_id;
  r.view_version = m->view_version;
  mega_rpc_reply(call, &r.base);
  view_free(&v);
}

/* Its client went away (or the server stops): answered with what is known;
 * the read's callback frees w. */
static void list_gone(mega_rpc_call *call, void *arg) {
  members_list_wait *w = arg;
  w->call = NULL;
  answer_list(w->m, call);
}

/* The loads were read (or could not be): the call is answered. */
static void list_loaded(void *arg) {
  members_list_wait *w = arg;
  if (w->call) {
    mega_rpc_call_on_cancel(w->call, NULL, NULL);
    answer_list(w->m, w->call);
  }
  free(w);
}

/* In etcd mode the other nodes' loads are read first (not watched). */
static void on_list_nodes(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  (void)msg;
  megad_members *m = data;
  members_list_wait *w = m->etcd ? calloc(1, sizeof *w) : NULL;
  if (!w) {
    answer_list(m, call);
    return;
  }
  w->call = call;
  w->m = m;
  mega_rpc_call_on_cancel(call, list_gone, w);
  if (mega_rpc_call_cancelled(call)) { /* a cancel before the callback was set */
    mega_rpc_call_on_cancel(call, NULL, NULL);
    list_gone(call, w);
  }
  megad_members_read_loads(m, LIST_LOADS_FRESH_MS, list_loaded, w);
}

void megad_members_register(megad_members *m, mega_rpc_server *srv) {
  mega_rpc_server_handle(srv, &mega_peer_join, on_join, m, NULL);
  mega_rpc_server_handle(srv, &mega_peer_heartbeat, on_heartbeat, m, NULL);
  mega_rpc_server_handle(srv, &mega_peer_leave, on_leave, m, NULL);
  mega_rpc_server_handle(srv, &mega_control_list_nodes, on_list_nodes, m, NULL);
}
