/* The rendezvous store as a service: waits on several keys with one
 * deadline, and the Peer KvSet/KvGet/KvWait calls other nodes' workers come
 * through. (This node's own workers reach the store from launch.c.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/kvserve/kvserve.h"

struct megad_kvwait {
  megad_kvserve *ks;
  char **keys;
  size_t n, i;
  uint64_t deadline; /* uv_now; 0: none */
  int timeout_ms;
  uint64_t cur; /* the mega_kv wait in progress, 0 when none */
  /* One timer for the whole wait, not one per key waited for: a group's
   * ranks each wait for the keys of all the others. */
  uv_timer_t *timer;
  bool in_step, sync_done, cancelled, timed_out;
  mega_status sync_status;
  megad_kvwait_fn fn;
  void *arg;
};

static void timer_closed(uv_handle_t *h) { free(h); }

static void kvwait_free(megad_kvwait *w) {
  for (size_t i = 0; i < w->n; i++) free(w->keys[i]);
  free(w->keys);
  if (w->timer) {
    uv_timer_stop(w->timer);
    uv_close((uv_handle_t *)w->timer, timer_closed);
  }
  free(w);
}

static void finish(megad_kvwait *w, mega_status s) {
  char msg[512] = "";
  const char *key = w->i < w->n ? w->keys[w->i] : "";
  if (s == MEGA_ERR_TIMEOUT)
    snprintf(msg, sizeof msg, "timed out after %d ms waiting for key '%s'", w->timeout_ms, key);
  else if (s == MEGA_ERR_CANCELLED)
    snprintf(msg, sizeof msg, "the wait for key '%s' was cancelled (the job attempt ended)", key);
  else if (s != MEGA_OK)
    snprintf(msg, sizeof msg, "waiting for key '%s' failed: %s", key, mega_status_str(s));
  if (!w->cancelled) w->fn(w->arg, s, msg);
  kvwait_free(w);
}

static bool step(megad_kvwait *w);

static void on_key(void *ctx, mega_status s, const uint8_t *val, size_t len) {
  (void)val;
  (void)len;
  megad_kvwait *w = ctx;
  w->cur = 0;
  if (w->in_step) { /* answered before mega_kv_wait returned */
    w->sync_done = true;
    w->sync_status = s;
    return;
  }
  if (w->timed_out) {
    finish(w, MEGA_ERR_TIMEOUT);
    return;
  }
  if (w->cancelled || s != MEGA_OK) {
    finish(w, w->cancelled ? MEGA_ERR_CANCELLED : s);
    return;
  }
  w->i++;
  step(w);
}

/* Returns true when w finished (and is freed). */
static bool step(megad_kvwait *w) {
  while (w->i < w->n) {
    if (w->deadline && uv_now(w->ks->b->loop) >= w->deadline) {
      finish(w, MEGA_ERR_TIMEOUT);
      return true;
    }
    w->in_step = true;
    w->sync_done = false;
    uint64_t id = mega_kv_wait(w->ks->kv, w->keys[w->i], 0, on_key, w);
    w->in_step = false;
    if (!w->sync_done) {
      w->cur = id;
      return false;
    }
    if (w->sync_status != MEGA_OK) {
      finish(w, w->sync_status);
      return true;
    }
    w->i++;
  }
  finish(w, MEGA_OK);
  return true;
}

/* The deadline passed: the key waited for now is cancelled, and on_key
 * says why. */
static void on_deadline(uv_timer_t *t) {
  megad_kvwait *w = t->data;
  w->timed_out = true;
  if (w->cur) mega_kv_cancel(w->ks->kv, w->cur);
}

static bool start_timer(megad_kvwait *w) {
  uint64_t now = uv_now(w->ks->b->loop);
  if (!(w->timer = malloc(sizeof *w->timer))) return false;
  uv_timer_init(w->ks->b->loop, w->timer);
  w->timer->data = w;
  uv_timer_start(w->timer, on_deadline, w->deadline > now ? w->deadline - now : 0, 0);
  return true;
}

megad_kvwait *megad_kvwait_start(megad_kvserve *ks, char *const *keys, size_t n, int timeout_ms,
                                 megad_kvwait_fn fn, void *arg) {
  megad_kvwait *w = calloc(1, sizeof *w);
  char **k = calloc(n ? n : 1, sizeof *k);
  if (!w || !k) {
    free(w);
    free(k);
    fn(arg, MEGA_ERR_NOMEM, "out of memory waiting for keys");
    return NULL;
  }
  w->ks = ks;
  w->keys = k;
  for (size_t i = 0; i < n; i++) {
    if (!(k[i] = strdup(keys[i] ? keys[i] : ""))) {
      kvwait_free(w);
      fn(arg, MEGA_ERR_NOMEM, "out of memory waiting for keys");
      return NULL;
    }
    w->n++;
  }
  w->fn = fn;
  w->arg = arg;
  w->timeout_ms = timeout_ms;
  if (timeout_ms > 0) w->deadline = uv_now(ks->b->loop) + (uint64_t)timeout_ms;
  if (step(w)) return NULL;
  if (timeout_ms > 0 && !start_timer(w)) {
    w->cancelled = true; /* fn is told below, not by the cancel */
    mega_kv_cancel(ks->kv, w->cur);
    fn(arg, MEGA_ERR_NOMEM, "out of memory waiting for keys");
    return NULL;
  }
  return w;
}

void megad_kvwait_cancel(megad_kvwait *w) {
  if (!w) return;
  w->cancelled = true;
  if (w->cur) mega_kv_cancel(w->ks->kv, w->cur);
}

/* ---- gathers ---- */

mega_status megad_kv_gather_check(const Mega__V1__KvGatherRequest *g, mega_err *err) {
  if (g->parts && g->n_part != g->n_keys)
    return mega_fail(err, MEGA_ERR_INVALID, "a gather of %zu keys in %u parts names %zu parts",
                     g->n_keys, g->parts, g->n_part);
  for (size_t i = 0; g->parts && i < g->n_part; i++)
    if (g->part[i] >= g->parts)
      return mega_fail(err, MEGA_ERR_INVALID, "a gather asks part %u of %u", g->part[i],
                       g->parts);
  return MEGA_OK;
}

mega_status megad_kv_gather_set(megad_kvserve *ks, const Mega__V1__KvGatherRequest *g,
                                mega_err *err) {
  if (!g->set) return MEGA_OK;
  const char *pre = g->prefix ? g->prefix : "", *key = g->set->key ? g->set->key : "";
  char *k = malloc(strlen(pre) + strlen(key) + 1);
  if (!k) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  strcpy(k, pre);
  strcat(k, key);
  mega_status s = mega_kv_set(ks->kv, k, g->set->value.data, g->set->value.len, err);
  free(k);
  return s;
}

char **megad_kv_gather_keys(const Mega__V1__KvGatherRequest *g) {
  const char *pre = g->prefix ? g->prefix : "";
  size_t plen = strlen(pre);
  char **k = calloc(g->n_keys ? g->n_keys : 1, sizeof *k);
  for (size_t i = 0; k && i < g->n_keys; i++) {
    size_t len = strlen(g->keys[i]);
    if (!(k[i] = malloc(plen + len + 1))) {
      megad_kv_gather_keys_free(k, i);
      return NULL;
    }
    memcpy(k[i], pre, plen);
    memcpy(k[i] + plen, g->keys[i], len + 1);
  }
  return k;
}

void megad_kv_gather_keys_free(char **keys, size_t n) {
  for (size_t i = 0; keys && i < n; i++) free(keys[i]);
  free(keys);
}

mega_status megad_kv_gather_values(megad_kvserve *ks, char *const *keys, size_t n,
                                   uint32_t parts, const uint32_t *part,
                                   ProtobufCBinaryData *out, mega_err *err) {
  for (size_t i = 0; i < n; i++) {
    const uint8_t *v;
    size_t len;
    if (!mega_kv_get(ks->kv, keys[i], &v, &len))
      return mega_fail(err, MEGA_ERR_NOT_FOUND,
                       "key '%s' vanished from the store (the job attempt ended?)", keys[i]);
    const uint8_t *s;
    size_t slen;
    if (mega_kv_slice(v, len, parts, parts ? part[i] : 0, &s, &slen, err) != MEGA_OK) {
      mega_err_prefix(err, "key '%s'", keys[i]);
      return err ? err->status : MEGA_ERR_INVALID;
    }
    out[i] = (ProtobufCBinaryData){slen, (uint8_t *)s};
  }
  return MEGA_OK;
}

/* ---- Peer Kv* ---- */

static void on_kv_set(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_kvserve *ks = data;
  const Mega__V1__KvSetRequest *req = (const void *)msg;
  mega_err e = {0};
  if (mega_kv_set(ks->kv, req->key, req->value.data, req->value.len, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  Mega__V1__KvSetResponse r = MEGA__V1__KV_SET_RESPONSE__INIT;
  mega_rpc_reply(call, &r.base);
}

static void reply_get(megad_kvserve *ks, mega_rpc_call *call, const char *key) {
  Mega__V1__KvGetResponse r = MEGA__V1__KV_GET_RESPONSE__INIT;
  const uint8_t *v;
  size_t len;
  if (mega_kv_get(ks->kv, key, &v, &len)) {
    r.found = true;
    r.value.data = (uint8_t *)v;
    r.value.len = len;
  }
  mega_rpc_reply(call, &r.base);
}

typedef struct peer_wait {
  megad_kvserve *ks;
  mega_rpc_call *call;
  megad_kvwait *w;
  char *get_key; /* a KvGet that waits: answered with this key's value */
  const Mega__V1__KvGatherRequest *gather; /* a KvGather: answered with the values */
  char **keys;                              /* its keys, prefixed */
  size_t nkeys;
} peer_wait;

static void peer_wait_free(peer_wait *p) {
  free(p->get_key);
  megad_kv_gather_keys_free(p->keys, p->nkeys);
  free(p);
}

static void reply_gather(peer_wait *p) {
  const Mega__V1__KvGatherRequest *g = p->gather;
  Mega__V1__KvGatherResponse r = MEGA__V1__KV_GATHER_RESPONSE__INIT;
  ProtobufCBinaryData *v = calloc(g->n_keys ? g->n_keys : 1, sizeof *v);
  mega_err e = {0};
  if (!v) {
    mega_rpc_fail(p->call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (megad_kv_gather_values(p->ks, p->keys, g->n_keys, g->parts, g->part, v, &e) != MEGA_OK) {
    mega_rpc_fail_err(p->call, &e);
  } else {
    r.values = v;
    r.n_values = g->n_keys;
    mega_rpc_reply(p->call, &r.base);
  }
  free(v);
}

static void peer_wait_done(void *arg, mega_status s, const char *msg) {
  peer_wait *p = arg;
  if (s == MEGA_OK && p->get_key) {
    reply_get(p->ks, p->call, p->get_key);
  } else if (s == MEGA_OK && p->gather) {
    reply_gather(p);
  } else if (s == MEGA_OK) {
    Mega__V1__KvWaitResponse r = MEGA__V1__KV_WAIT_RESPONSE__INIT;
    mega_rpc_reply(p->call, &r.base);
  } else {
    mega_rpc_fail(p->call,
                  s == MEGA_ERR_TIMEOUT     ? MEGA_RPC_DEADLINE_EXCEEDED
                  : s == MEGA_ERR_CANCELLED ? MEGA_RPC_CANCELLED
                                            : MEGA_RPC_INTERNAL,
                  "%s", msg);
  }
  peer_wait_free(p);
}

static void peer_wait_cancelled(mega_rpc_call *call, void *arg) {
  peer_wait *p = arg;
  megad_kvwait *w = p->w;
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "cancelled");
  peer_wait_free(p);
  megad_kvwait_cancel(w);
}

/* Answers p's call once every key exists: with get_key's value, the
 * gather's values, or nothing. p is freed by then. */
static void wait_then_answer(peer_wait *p, char *const *keys, size_t n, uint32_t timeout_ms) {
  int64_t left = mega_rpc_call_remaining_ms(p->call);
  int t = (int)timeout_ms;
  if (left >= 0 && (t <= 0 || left < t)) t = left > 0 ? (int)left : 1;
  /* NULL: answered at once, and p is gone */
  mega_rpc_call *call = p->call;
  megad_kvwait *w = megad_kvwait_start(p->ks, keys, n, t, peer_wait_done, p);
  if (w) {
    p->w = w;
    mega_rpc_call_on_cancel(call, peer_wait_cancelled, p);
  }
}

static peer_wait *peer_wait_new(megad_kvserve *ks, mega_rpc_call *call) {
  peer_wait *p = calloc(1, sizeof *p);
  if (!p) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  p->ks = ks;
  p->call = call;
  return p;
}

static void on_kv_get(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_kvserve *ks = data;
  const Mega__V1__KvGetRequest *req = (const void *)msg;
  const uint8_t *v;
  size_t len;
  if (!req->wait_ms || mega_kv_get(ks->kv, req->key, &v, &len)) {
    reply_get(ks, call, req->key);
    return;
  }
  peer_wait *p = peer_wait_new(ks, call);
  if (p && !(p->get_key = strdup(req->key))) {
    free(p);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (p) wait_then_answer(p, (char *const *)&req->key, 1, req->wait_ms);
}

/* msg stays the call's until it is answered, so the wait borrows it. */
static void on_kv_gather(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_kvserve *ks = data;
  const Mega__V1__KvGatherRequest *req = (const void *)msg;
  mega_err e = {0};
  if (megad_kv_gather_check(req, &e) != MEGA_OK || megad_kv_gather_set(ks, req, &e) != MEGA_OK) {
    mega_rpc_fail_err(call, &e);
    return;
  }
  peer_wait *p = peer_wait_new(ks, call);
  if (!p) return;
  p->gather = req;
  p->nkeys = req->n_keys;
  if (!(p->keys = megad_kv_gather_keys(req))) {
    free(p);
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  wait_then_answer(p, p->keys, req->n_keys, req->timeout_ms);
}

static void on_kv_wait(mega_rpc_call *call, const ProtobufCMessage *msg, void *data) {
  megad_kvserve *ks = data;
  const Mega__V1__KvWaitRequest *req = (const void *)msg;
  peer_wait *p = peer_wait_new(ks, call);
  if (p) wait_then_answer(p, req->keys, req->n_keys, req->timeout_ms);
}

mega_status megad_kvserve_init(megad_kvserve *ks, megad_base *b, mega_err *err) {
  ks->b = b;
  if (!(ks->kv = mega_kv_new(b->loop))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  return MEGA_OK;
}

void megad_kvserve_free(megad_kvserve *ks) {
  mega_kv_free(ks->kv);
  ks->kv = NULL;
}

void megad_kvserve_register(megad_kvserve *ks, mega_rpc_server *srv) {
  mega_rpc_server_handle(srv, &mega_peer_kv_set, on_kv_set, ks, NULL);
  mega_rpc_server_handle(srv, &mega_peer_kv_get, on_kv_get, ks, NULL);
  mega_rpc_server_handle(srv, &mega_peer_kv_wait, on_kv_wait, ks, NULL);
  mega_rpc_server_handle(srv, &mega_peer_kv_gather, on_kv_gather, ks, NULL);
}
