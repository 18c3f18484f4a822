/* Membership from etcd (members.h): this node's session and record, and the
 * watch of everyone's. */
#include "daemon/members/members_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/model/util.h"

#define NODES_PREFIX "mega/nodes/"
#define LOAD_PREFIX "mega/load/"
#define SESSION_TTL_S(m) ((m)->o.etcd_lease_s ? (m)->o.etcd_lease_s : 2u)
/* A name still registered this long after we first asked is taken by a live
 * megad: a crashed one's lease would have expired by then. */
#define TAKEN_WARN_MS(m) (SESSION_TTL_S(m) * 1000 + 1000)

static void session_start(megad_members *m);
static void list_nodes(megad_members *m);

/* ---- this node's record ---- */

/* This node as a packed mega.v1.Node in state st, without its load (which
 * would make every job's start and end an event at every node); NULL when
 * out of memory. */
static uint8_t *record(megad_members *m, Mega__V1__NodeState st, size_t *len) {
  members_refresh_self(m);
  Mega__V1__Node n;
  members_node_msg(megad_members_self(m), &n);
  n.state = st;
  n.slots_used = 0;
  n.job_ids = NULL;
  n.n_job_ids = 0;
  uint8_t *buf = NULL;
  return megad_pb_pack(&n.base, &buf, len) ? buf : NULL;
}

/* This node's load, for mega/load/<id>: a mega.v1.Node with its id,
 * incarnation, slots, slots used and job ids; NULL when out of memory. */
static uint8_t *load_value(megad_members *m, size_t *len) {
  members_refresh_self(m);
  megad_node *self = megad_members_self(m);
  Mega__V1__Node n = MEGA__V1__NODE__INIT;
  n.id = self->id;
  n.incarnation = self->incarnation;
  n.slots = self->slots;
  n.slots_used = self->slots_used;
  n.job_ids = self->job_ids;
  n.n_job_ids = self->njob_ids;
  uint8_t *buf = NULL;
  return megad_pb_pack(&n.base, &buf, len) ? buf : NULL;
}

/* What a put must carry again when it changes: the load. */
static char *load_sig(megad_members *m) {
  megad_node *self = megad_members_self(m);
  size_t len = 16;
  for (size_t i = 0; i < self->njob_ids; i++) len += strlen(self->job_ids[i]) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  int k = snprintf(s, len, "%u", self->slots_used);
  for (size_t i = 0; i < self->njob_ids; i++) k += snprintf(s + k, len - k, ",%s", self->job_ids[i]);
  return s;
}

static void warn_once(megad_members *m, const char *what, const mega_err *err) {
  if (m->etcd_warned) return;
  m->etcd_warned = true;
  megad_warn(m->b, "etcd: %s: %s", what, err->msg);
}

static void put_done(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_members *m = arg;
  m->etcd_putting = false;
  if (!r) {
    free(m->etcd_sig); /* put again on the next tick */
    m->etcd_sig = NULL;
    if (err->status != MEGA_ERR_CANCELLED) warn_once(m, "updating this node's load", err);
    return;
  }
  m->etcd_warned = false;
}

/* Puts the load again if it changed since the last put (not the record:
 * nobody watches the load). */
static void put_load(megad_members *m) {
  int64_t lease = megad_etcd_session_lease(m->etcd);
  if (!m->etcd_registered || m->etcd_putting || !lease) return;
  members_refresh_self(m);
  char *sig = load_sig(m);
  if (!sig || (m->etcd_sig && !strcmp(sig, m->etcd_sig))) {
    free(sig);
    return;
  }
  size_t len;
  uint8_t *buf = load_value(m, &len);
  mega_err err = {0};
  if (buf && megad_etcd_put(m->etcd, m->etcd_load_key, buf, len, lease, put_done, m, &err) ==
                 MEGA_OK) {
    m->etcd_putting = true;
    free(m->etcd_sig);
    m->etcd_sig = sig;
    sig = NULL;
  }
  free(buf);
  free(sig);
}

static void registered(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_members *m = arg;
  m->etcd_registering = false;
  if (!r) {
    if (err->status != MEGA_ERR_CANCELLED) warn_once(m, "registering this node", err);
    return; /* the next tick tries again */
  }
  uint64_t now = uv_now(m->b->loop);
  if (!r->succeeded) {
    /* The name is held: by a crashed predecessor until its lease expires,
     * or by another live megad. */
    Mega__V1__Node *h = r->nkvs ? mega__v1__node__unpack(NULL, r->kvs[0].value_len,
                                                          r->kvs[0].value)
                                : NULL;
    if (!m->etcd_taken_ms) m->etcd_taken_ms = now;
    if (now - m->etcd_taken_ms >= TAKEN_WARN_MS(m) && !m->etcd_warned) {
      m->etcd_warned = true;
      megad_warn(m->b,
                 "node name %s is taken by the megad at %s (registered in etcd): give each node "
                 "its own --node-name; retrying",
                 m->b->node_id, h && h->address ? h->address : "an unknown address");
    }
    if (h) mega__v1__node__free_unpacked(h, NULL);
    return;
  }
  m->etcd_registered = true;
  m->etcd_taken_ms = 0;
  m->etcd_warned = false;
  megad_log(m->b, "registered in etcd as %s (incarnation %llu)", m->etcd_key,
            (unsigned long long)m->incarnation);
  put_load(m); /* the load may have changed meanwhile */
}

/* Create-if-absent under our lease: a name is one node's. The load goes
 * with the record, so a node listed has a load to read. */
static void register_self(megad_members *m) {
  int64_t lease = megad_etcd_session_lease(m->etcd);
  if (m->etcd_registered || m->etcd_registering || !lease) return;
  size_t len, load_len;
  uint8_t *buf = record(m, MEGA__V1__NODE_STATE__NODE_STATE_ALIVE, &len);
  uint8_t *load = load_value(m, &load_len);
  char *sig = load_sig(m);
  if (!buf || !load || !sig) {
    free(buf);
    free(load);
    free(sig);
    return;
  }
  megad_etcd_cmp absent = {.key = m->etcd_key, .target = MEGAD_ETCD_CREATE, .number = 0};
  megad_etcd_op put[2] = {{.kind = MEGAD_ETCD_PUT, .key = m->etcd_key, .value = buf,
                           .value_len = len, .lease = lease},
                          {.kind = MEGAD_ETCD_PUT, .key = m->etcd_load_key, .value = load,
                           .value_len = load_len, .lease = lease}};
  megad_etcd_op holder = {.kind = MEGAD_ETCD_GET, .key = m->etcd_key};
  mega_err err = {0};
  if (megad_etcd_txn(m->etcd, &absent, 1, put, 2, &holder, 1, registered, m, &err) == MEGA_OK) {
    m->etcd_registering = true;
    free(m->etcd_sig);
    m->etcd_sig = sig;
    sig = NULL;
  }
  free(buf);
  free(load);
  free(sig);
}

/* ---- the session ---- */

static void on_up(void *arg, int64_t lease) {
  megad_members *m = arg;
  (void)lease;
  m->etcd_registered = false;
  register_self(m);
}

static void on_lost(void *arg, const char *why) {
  megad_members *m = arg;
  m->etcd_registered = false;
  if (m->b->stopping || m->etcd_leaving) return;
  /* The cluster took this node for dead: come back as someone new. */
  m->incarnation = megad_new_incarnation();
  megad_members_self(m)->incarnation = m->incarnation;
  megad_warn(m->b, "etcd session lost (%s): registering again as incarnation %llu", why,
             (unsigned long long)m->incarnation);
  if (m->cbs.self_fenced) m->cbs.self_fenced(m->cbs.arg, why);
  session_start(m);
}

static void on_reachable(void *arg, bool ok, const char *why) {
  megad_members *m = arg;
  if (ok) megad_log(m->b, "etcd is reachable again");
  else megad_warn(m->b, "%s (running jobs go on; trying the other endpoints)", why);
}

static void session_start(megad_members *m) {
  megad_etcd_session_cbs cbs = {on_up, on_lost, on_reachable, m};
  mega_err err = {0};
  if (megad_etcd_session_start(m->etcd, SESSION_TTL_S(m), &cbs, &err) != MEGA_OK)
    megad_warn(m->b, "etcd: cannot start a session: %s", err.msg);
}

/* ---- everyone's records ---- */

static void apply_put(megad_members *m, const char *id, const uint8_t *value, size_t len) {
  Mega__V1__Node *r = mega__v1__node__unpack(NULL, len, value);
  if (!r) {
    megad_warn(m->b, "etcd: %s%s is not a mega.v1.Node record; ignored", NODES_PREFIX, id);
    return;
  }
  megad_node *n = megad_members_find(m, id);
  if (r->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    if (n && n->state != MEGA__V1__NODE_STATE__NODE_STATE_LEFT &&
        n->state != MEGA__V1__NODE_STATE__NODE_STATE_DEAD) {
      char why[300];
      snprintf(why, sizeof why, "node %s left the cluster (its megad stopped)", id);
      members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_LEFT, why);
    }
    mega__v1__node__free_unpacked(r, NULL);
    return;
  }
  bool fresh = !n;
  if (!n && (!r->address || !r->address[0] || !(n = members_node_add(m, id, r->address)))) {
    mega__v1__node__free_unpacked(r, NULL);
    return;
  }
  bool gone = n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
              n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT;
  bool restarted = !fresh && !gone && r->incarnation != n->incarnation;
  if (restarted) { /* it lost its session and came back before its DELETE reached us */
    char why[300];
    snprintf(why, sizeof why, "node %s restarted (its megad is a new incarnation)", id);
    members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_ALIVE, why);
  }
  n->incarnation = r->incarnation;
  n->state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  members_set_address(m, n, r->address, r->incarnation);
  n->slots = r->slots;
  members_set_version(m, n, r->version);
  members_set_str(&n->backend, r->backend);
  members_set_str(&n->device_name, r->device_name);
  n->seen_ms = uv_now(m->b->loop);
  n->last_heartbeat_unix_ms = megad_unix_ms();
  if (fresh || gone || restarted) { /* a new incarnation runs nothing; later loads are read */
    n->slots_used = r->slots_used;
    members_set_job_ids(n, r->job_ids, r->n_job_ids);
  }
  m->view_version++;
  mega__v1__node__free_unpacked(r, NULL);
  if (fresh || gone || restarted) {
    megad_log(m->b, "node %s (%s, %u slot%s) %s (etcd)", n->id, n->address, n->slots,
              n->slots == 1 ? "" : "s", fresh ? "joined" : gone ? "is back" : "is back as new");
    if (m->cbs.node_up) m->cbs.node_up(m->cbs.arg, n);
  }
}

static void apply_delete(megad_members *m, const char *id) {
  megad_node *n = megad_members_find(m, id);
  if (!n || n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT)
    return;
  char why[300];
  snprintf(why, sizeof why,
           "node %s lost its etcd registration (its lease expired: its megad died or was cut "
           "off for over %u s)", id, SESSION_TTL_S(m));
  members_node_lost(m, n, MEGA__V1__NODE_STATE__NODE_STATE_DEAD, why);
}

static void on_event(void *arg, megad_etcd_evtype type, const megad_etcd_kv *kv) {
  megad_members *m = arg;
  if (m->b->stopping || strncmp(kv->key, NODES_PREFIX, strlen(NODES_PREFIX))) return;
  const char *id = kv->key + strlen(NODES_PREFIX);
  /* a node id has no '/' (main.c): such a key is a cluster's whose prefix
   * is this one's and "nodes/" (--etcd-prefix P/nodes/), not a node here */
  if (strchr(id, '/')) return;
  if (!strcmp(id, m->b->node_id)) {
    /* Our own record deleted while our session lives (etcdctl del): put it back. */
    if (type == MEGAD_ETCD_EV_DELETE && m->etcd_registered) {
      m->etcd_registered = false;
      register_self(m);
    }
    return;
  }
  if (type == MEGAD_ETCD_EV_PUT) apply_put(m, id, kv->value, kv->value_len);
  else apply_delete(m, id);
}

static void on_reset(void *arg, const char *why) {
  megad_members *m = arg;
  megad_warn(m->b, "etcd: %s; listing the nodes again", why);
  megad_etcd_watch_cancel(m->etcd_watch);
  m->etcd_watch = NULL;
  list_nodes(m);
}

static void listed(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_members *m = arg;
  m->etcd_listing = false;
  if (!r) {
    if (err->status != MEGA_ERR_CANCELLED) warn_once(m, "listing the nodes", err);
    return; /* the next tick lists again */
  }
  /* Nodes we knew that are no longer there were lost while we did not watch. */
  for (size_t i = 1; i < m->nnodes; i++) {
    megad_node *n = m->nodes[i];
    bool there = false;
    for (size_t k = 0; k < r->nkvs && !there; k++)
      there = !strcmp(r->kvs[k].key + strlen(NODES_PREFIX), n->id);
    if (!there) apply_delete(m, n->id);
  }
  for (size_t k = 0; k < r->nkvs; k++) {
    megad_etcd_kv kv = r->kvs[k];
    on_event(m, MEGAD_ETCD_EV_PUT, &kv);
  }
  megad_etcd_watch_cbs cbs = {on_event, on_reset, m};
  mega_err e2 = {0};
  if (megad_etcd_watch_start(m->etcd, NODES_PREFIX, r->revision + 1, &cbs, &m->etcd_watch, &e2) !=
      MEGA_OK)
    megad_warn(m->b, "etcd: cannot watch %s: %s", NODES_PREFIX, e2.msg);
}

static void list_nodes(megad_members *m) {
  if (m->etcd_listing || m->etcd_watch) return;
  mega_err err = {0};
  if (megad_etcd_get(m->etcd, NODES_PREFIX, true, listed, m, &err) == MEGA_OK)
    m->etcd_listing = true;
}

/* ---- everyone's loads, read when asked ---- */

/* A load read from mega/load/<n's id>, or none (kv NULL: the key is gone
 * with its lease). One of an older incarnation is not n's. */
static void apply_load(megad_members *m, megad_node *n, const megad_etcd_kv *kv) {
  Mega__V1__Node *r = kv ? mega__v1__node__unpack(NULL, kv->value_len, kv->value) : NULL;
  if (kv && !r) {
    megad_warn(m->b, "etcd: %s is not a mega.v1.Node load; ignored", kv->key);
    return;
  }
  if (!r) {
    n->slots_used = 0;
    members_set_job_ids(n, NULL, 0);
  } else if (!n->incarnation || r->incarnation == n->incarnation) {
    n->slots_used = r->slots_used;
    members_set_job_ids(n, r->job_ids, r->n_job_ids);
  }
  /* as of when the read was asked: placement counts ranks it saw leave
   * until a load read after that (coord_place.c) */
  n->seen_ms = m->loads_asked_ms;
  if (r) mega__v1__node__free_unpacked(r, NULL);
}

static void loads_read(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_members *m = arg;
  m->loads_reading = false;
  if (r) {
    m->loads_read_ms = m->loads_asked_ms ? m->loads_asked_ms : 1;
    size_t pl = strlen(LOAD_PREFIX);
    for (size_t i = 1; i < m->nnodes; i++) {
      megad_node *n = m->nodes[i];
      if (!megad_node_usable(n)) continue;
      const megad_etcd_kv *kv = NULL;
      for (size_t k = 0; k < r->nkvs && !kv; k++)
        if (!strcmp(r->kvs[k].key + pl, n->id)) kv = &r->kvs[k];
      apply_load(m, n, kv);
    }
  } else if (err->status != MEGA_ERR_CANCELLED) {
    warn_once(m, "reading the nodes' loads", err);
  }
  /* the waits are taken first: a callback may ask again */
  members_loads_wait *w = m->loads_waits;
  size_t nw = m->nloads_waits;
  m->loads_waits = NULL;
  m->nloads_waits = 0;
  for (size_t i = 0; i < nw; i++) w[i].cb(w[i].arg);
  free(w);
}

void megad_members_read_loads(megad_members *m, unsigned max_age_ms, megad_members_loads_cb done,
                              void *arg) {
  uint64_t now = uv_now(m->b->loop);
  bool fresh = m->loads_read_ms && now - m->loads_read_ms <= max_age_ms;
  if (!m->etcd || m->b->stopping || fresh) {
    if (done) done(arg);
    return;
  }
  if (!m->loads_reading) {
    mega_err err = {0};
    if (megad_etcd_get(m->etcd, LOAD_PREFIX, true, loads_read, m, &err) != MEGA_OK) {
      warn_once(m, "reading the nodes' loads", &err);
      if (done) done(arg);
      return;
    }
    m->loads_reading = true;
    m->loads_asked_ms = now;
  }
  if (!done) return;
  members_loads_wait *v = realloc(m->loads_waits, (m->nloads_waits + 1) * sizeof *v);
  if (!v) { /* out of memory: with the loads as they are */
    done(arg);
    return;
  }
  m->loads_waits = v;
  v[m->nloads_waits++] = (members_loads_wait){done, arg};
}

/* ---- start, tick, leave ---- */

static void on_tick(uv_timer_t *t) {
  megad_members *m = t->data;
  if (m->b->stopping || m->etcd_leaving) return;
  list_nodes(m);    /* if the first listing failed */
  register_self(m); /* if not registered yet */
  put_load(m);
}

void members_etcd_start(megad_members *m) {
  size_t len = strlen(NODES_PREFIX) + strlen(m->b->node_id) + 1;
  if ((m->etcd_key = malloc(len))) snprintf(m->etcd_key, len, NODES_PREFIX "%s", m->b->node_id);
  size_t load_len = strlen(LOAD_PREFIX) + strlen(m->b->node_id) + 1;
  if ((m->etcd_load_key = malloc(load_len)))
    snprintf(m->etcd_load_key, load_len, LOAD_PREFIX "%s", m->b->node_id);
  if (!m->etcd_key || !m->etcd_load_key) {
    megad_warn(m->b, "out of memory starting etcd membership");
    return;
  }
  session_start(m);
  list_nodes(m);
  uv_timer_start(&m->timer, on_tick, m->o.heartbeat_interval_ms, m->o.heartbeat_interval_ms);
}

static void left(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  (void)r;
  (void)err;
  megad_members *m = arg;
  megad_etcd_session_end(m->etcd); /* the record goes now, not after the TTL */
  m->etcd_leaving = false;
}

void members_etcd_leave(megad_members *m) {
  megad_etcd_watch_cancel(m->etcd_watch);
  m->etcd_watch = NULL;
  int64_t lease = megad_etcd_session_lease(m->etcd);
  if (!m->etcd_registered || !lease) {
    megad_etcd_session_end(m->etcd);
    return;
  }
  size_t len;
  uint8_t *buf = record(m, MEGA__V1__NODE_STATE__NODE_STATE_LEFT, &len);
  mega_err err = {0};
  if (buf && megad_etcd_put(m->etcd, m->etcd_key, buf, len, lease, left, m, &err) == MEGA_OK)
    m->etcd_leaving = true;
  else
    megad_etcd_session_end(m->etcd);
  free(buf);
}
