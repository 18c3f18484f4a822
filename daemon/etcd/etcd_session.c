/* The session: one lease, granted and kept alive.
 *
 * Each keepalive is its own LeaseKeepAlive call (one request, half-closed,
 * one answer: etcd.h), sent every ttl/4 to the current endpoint; a failed
 * one moves the client to the next endpoint, so the next tick tries there.
 * etcd answers TTL 0 for a lease it no longer has: the session is lost. */
#include "daemon/etcd/etcd_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* One keepalive call; outlives the session if the session ends first. */
typedef struct keepalive {
  etcd_session *s; /* NULL once the session is gone */
  size_t ep;
  uint64_t sent_ms; /* the lease lives at least a TTL from here once answered */
  bool answered, gone;
  mega_rpc_pending *p;
} keepalive;

struct etcd_session {
  megad_etcd *e;
  megad_etcd_session_cbs cbs;
  unsigned ttl_s;
  int64_t lease, ttl;
  uv_timer_t *timer;   /* keepalive ticks, or grant retries */
  etcd_call *grant;
  keepalive *ka;
  uint64_t last_ok_ms;
  uint64_t fresh_ms; /* when the last answered keepalive was sent */
  bool reachable;
  char why[MEGA_ERR_MSG_MAX + 600]; /* why not reachable */
  mega_err last_err;
};

static void session_over(etcd_session *s, const char *why);
static void on_grant_timer(uv_timer_t *t);

bool etcd_session_reachable(const etcd_session *s, const char **why) {
  if (why) *why = s->reachable ? NULL : s->why;
  return s->reachable;
}

static void set_reachable(etcd_session *s, bool ok, const char *why) {
  if (s->reachable == ok) return;
  s->reachable = ok;
  snprintf(s->why, sizeof s->why, "%s", ok || !why ? "" : why);
  if (s->cbs.reachable) s->cbs.reachable(s->cbs.arg, ok, why);
}

/* No answer for a whole TTL: say so once (the lease may still live). */
static void check_unreachable(etcd_session *s) {
  if (!s->reachable || etcd_now_ms(s->e) - s->last_ok_ms < (uint64_t)s->ttl * 1000) return;
  megad_etcd *e = s->e;
  mega_err err = s->last_err;
  if (err.status == MEGA_OK) mega_fail(&err, MEGA_ERR_TIMEOUT, "no keepalive answered");
  etcd_note(e, &err);
  if (!e->ok) { /* etcd_note wrote why only for unreachable-type errors */
    set_reachable(s, false, e->why);
    return;
  }
  char why[MEGA_ERR_MSG_MAX + 64];
  snprintf(why, sizeof why, "etcd at %s kept no lease alive for %" PRId64 " s: %s", e->eps_text,
           s->ttl, err.msg);
  set_reachable(s, false, why);
}

static void on_ka_item(void *arg, ProtobufCMessage *msg) {
  keepalive *k = arg;
  Etcdserverpb__LeaseKeepAliveResponse *r = (Etcdserverpb__LeaseKeepAliveResponse *)msg;
  k->answered = true;
  k->gone = r->ttl <= 0;
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_ka_end(void *arg, const mega_err *err) {
  keepalive *k = arg;
  etcd_session *s = k->s;
  bool answered = k->answered, gone = k->gone;
  size_t ep = k->ep;
  uint64_t sent_ms = k->sent_ms;
  free(k);
  if (!s) return;
  s->ka = NULL;
  megad_etcd *e = s->e;
  if (answered && gone) {
    char why[128];
    snprintf(why, sizeof why, "etcd says lease %" PRIx64 " is gone (expired or revoked)",
             (uint64_t)s->lease);
    mega_err ok = {0};
    etcd_note(e, &ok);
    set_reachable(s, true, NULL);
    session_over(s, why);
    return;
  }
  if (answered) {
    s->last_ok_ms = etcd_now_ms(e);
    s->fresh_ms = sent_ms;
    mega_err_clear(&s->last_err);
    etcd_note(e, &s->last_err);
    set_reachable(s, true, NULL);
    return;
  }
  s->last_err = *err;
  if (err->status == MEGA_OK)
    mega_fail(&s->last_err, MEGA_ERR_PEER, "etcd at %s ended a keepalive without an answer",
              e->eps[ep]);
  etcd_endpoint_failed(e, ep); /* whatever went wrong, try another member next */
  if (etcd_err_token(e, err)) etcd_auth_refresh(e, NULL, NULL); /* the next tick has it */
  check_unreachable(s);
}

static void on_tick(uv_timer_t *t) {
  etcd_session *s = t->data;
  if (s->ka) { /* the last one is still out */
    check_unreachable(s);
    return;
  }
  megad_etcd *e = s->e;
  keepalive *k = calloc(1, sizeof *k);
  if (!k) return;
  k->s = s;
  k->ep = e->cur;
  k->sent_ms = etcd_now_ms(e);
  Etcdserverpb__LeaseKeepAliveRequest r = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
  r.id = s->lease;
  unsigned interval = (unsigned)(s->ttl * 1000 / 4);
  mega_err err = {0};
  if (mega_rpc_stream_async(e->chans[k->ep], e->b->cq, &etcd_lease_keep_alive, &r.base,
                            interval < 400 ? 400 : interval, on_ka_item, on_ka_end, k, &k->p,
                            &err) != MEGA_OK) {
    free(k);
    s->last_err = err;
    check_unreachable(s);
    return;
  }
  s->ka = k;
}

static void on_granted(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  etcd_session *s = arg;
  s->grant = NULL;
  Etcdserverpb__LeaseGrantResponse *g = (Etcdserverpb__LeaseGrantResponse *)resp;
  mega_err e2 = *err;
  if (g && g->error && g->error[0])
    mega_fail(&e2, MEGA_ERR_PEER, "etcd refused a lease: %s", g->error);
  else if (g && g->id == 0)
    mega_fail(&e2, MEGA_ERR_PEER, "etcd granted lease 0");
  if (e2.status != MEGA_OK) {
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    s->last_err = e2;
    char why[MEGA_ERR_MSG_MAX + 32];
    snprintf(why, sizeof why, "no lease from etcd: %s", e2.msg);
    set_reachable(s, false, why);
    uv_timer_start(s->timer, on_grant_timer, 500, 0); /* ask again */
    return;
  }
  s->lease = g->id;
  s->ttl = g->ttl > 0 ? g->ttl : s->ttl_s;
  protobuf_c_message_free_unpacked(resp, NULL);
  s->last_ok_ms = s->fresh_ms = etcd_now_ms(s->e);
  mega_err_clear(&s->last_err);
  uint64_t interval = (uint64_t)s->ttl * 1000 / 4;
  uv_timer_start(s->timer, on_tick, interval, interval);
  set_reachable(s, true, NULL);
  if (s->cbs.up) s->cbs.up(s->cbs.arg, s->lease);
}

static mega_status grant(etcd_session *s, mega_err *err) {
  Etcdserverpb__LeaseGrantRequest r = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
  r.ttl = s->ttl_s;
  return etcd_call_start(s->e, &etcd_lease_grant, &r.base, 0, on_granted, s, &s->grant, err);
}

/* Asks again (the session is the timer's data). */
static void on_grant_timer(uv_timer_t *t) {
  etcd_session *s = t->data;
  mega_err err = {0};
  if (grant(s, &err) != MEGA_OK) {
    s->last_err = err;
    uv_timer_start(s->timer, on_grant_timer, 500, 0);
  }
}

mega_status megad_etcd_session_start(megad_etcd *e, unsigned ttl_s,
                                     const megad_etcd_session_cbs *cbs, mega_err *err) {
  mega_status closing = etcd_closing(e, "an etcd session", err);
  if (closing != MEGA_OK) return closing;
  if (e->session)
    return mega_fail(err, MEGA_ERR_INVALID, "an etcd session is already running; end it first");
  if (ttl_s == 0) return mega_fail(err, MEGA_ERR_INVALID, "an etcd session needs a TTL of 1 s or more");
  etcd_session *s = calloc(1, sizeof *s);
  if (!s) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  s->e = e;
  s->cbs = *cbs;
  s->ttl_s = ttl_s;
  s->ttl = ttl_s;
  s->reachable = true;
  if (!(s->timer = etcd_timer_new(e, s))) {
    free(s);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  mega_status st = grant(s, err);
  if (st != MEGA_OK) {
    etcd_timer_free(s->timer);
    free(s);
    return st;
  }
  e->session = s;
  return MEGA_OK;
}

int64_t megad_etcd_session_lease(const megad_etcd *e) {
  return e->session ? e->session->lease : 0;
}

/* Within 90% of the TTL from the sending of the last answered keepalive:
 * etcd renewed the lease after that moment, whatever the answer's delay or
 * a stalled loop; the tenth left covers the two clocks' rates. */
bool megad_etcd_session_fresh(const megad_etcd *e) {
  const etcd_session *s = e->session;
  return s && s->lease && etcd_now_ms(e) - s->fresh_ms < (uint64_t)s->ttl * 900;
}

void etcd_session_free(etcd_session *s) {
  if (s->e->session == s) s->e->session = NULL;
  etcd_call_drop(s->grant);
  if (s->ka) {
    s->ka->s = NULL;
    mega_rpc_pending_cancel(s->ka->p);
  }
  etcd_timer_free(s->timer);
  free(s);
}

/* The lease is gone: free the session, then tell the caller (who may start
 * a new one from lost). */
static void session_over(etcd_session *s, const char *why) {
  megad_etcd_session_cbs cbs = s->cbs;
  etcd_session_free(s);
  if (cbs.lost) cbs.lost(cbs.arg, why);
}

void megad_etcd_session_end(megad_etcd *e) {
  etcd_session *s = e->session;
  if (!s) return;
  int64_t lease = s->lease;
  etcd_session_free(s);
  if (!lease) return;
  Etcdserverpb__LeaseRevokeRequest r = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
  r.id = lease;
  for (size_t tries = 0; tries < e->nep; tries++) {
    size_t ep = e->cur;
    ProtobufCMessage *resp = NULL;
    mega_err err = {0};
    if (mega_rpc_unary(e->chans[ep], &etcd_lease_revoke, &r.base, 1000, &resp, &err) == MEGA_OK) {
      protobuf_c_message_free_unpacked(resp, NULL);
      return;
    }
    if (!etcd_err_failover(&err)) return; /* NOT_FOUND: already gone */
    etcd_endpoint_failed(e, ep);
    if (err.status == MEGA_ERR_TIMEOUT) return; /* at most 1 s at shutdown */
  }
}
