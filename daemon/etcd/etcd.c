/* The etcd client's top: endpoints, KV and Txn, and the replies handed to
 * callers; over the session (etcd_session.c) and watches (etcd_watch.c),
 * which stand on the calls with failover (etcd_call.c). */
#include "daemon/etcd/etcd_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/port.h"

bool megad_etcd_ok(const megad_etcd *e, const char **why) {
  /* A session whose keepalives go unanswered outweighs a call that got through. */
  if (e->session && !etcd_session_reachable(e->session, why)) return false;
  if (why) *why = e->ok ? NULL : e->why;
  return e->ok;
}

/* ---- endpoints ---- */

/* "http://127.0.0.1:2379/" -> "127.0.0.1:2379"; NULL (and err) if it is not
 * a host:port, or its scheme disagrees with whether TLS is on. */
static char *parse_endpoint(const char *s, size_t n, bool tls, mega_err *err) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  bool https = n >= 8 && !strncmp(s, "https://", 8), http = n >= 7 && !strncmp(s, "http://", 7);
  if (https && !tls) {
    mega_fail(err, MEGA_ERR_INVALID,
              "etcd endpoint '%.*s' is https: give --etcd-cacert FILE, the CA that signed "
              "etcd's certificates", (int)n, s);
    return NULL;
  }
  if (http && tls) {
    mega_fail(err, MEGA_ERR_INVALID,
              "etcd endpoint '%.*s' is http, but --etcd-cacert turns TLS on: write https://",
              (int)n, s);
    return NULL;
  }
  if (https) s += 8, n -= 8;
  if (http) s += 7, n -= 7;
  if (n && s[n - 1] == '/') n--;
  const char *colon = memrchr(s, ':', n);
  unsigned port;
  bool port_ok = colon && colon > s && mega_port_parse(colon + 1, (size_t)(s + n - colon - 1), &port);
  if (!port_ok || memchr(s, '/', n)) {
    mega_fail(err, MEGA_ERR_INVALID,
              "etcd endpoint '%.*s' is not host:port (expected e.g. http://127.0.0.1:2379, "
              "several separated by commas)", (int)n, s);
    return NULL;
  }
  return strndup(s, n);
}

/* A prefix two clusters can tell apart: printable, no spaces, ending in '/'. */
static mega_status check_prefix(const char *p, mega_err *err) {
  size_t n = strlen(p);
  bool ok = n > 0 && n <= 200 && p[n - 1] == '/' && p[0] != '/';
  for (size_t i = 0; ok && i < n; i++) ok = p[i] > ' ' && p[i] <= '~';
  if (!ok)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--etcd-prefix '%s': give printable characters without spaces that end "
                     "with '/' and do not begin with it (e.g. mega/ or teams/a/), at most 200",
                     p);
  return MEGA_OK;
}

static char *dup_or_null(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

mega_status megad_etcd_open(megad_base *b, const megad_etcd_opts *o, megad_etcd **out,
                            mega_err *err) {
  *out = NULL;
  const char *endpoints = o->endpoints;
  if (!endpoints || !endpoints[0])
    return mega_fail(err, MEGA_ERR_INVALID,
                     "no etcd endpoint given (expected e.g. http://127.0.0.1:2379)");
  const char *prefix = o->prefix ? o->prefix : MEGAD_ETCD_ROOT;
  mega_status st = check_prefix(prefix, err);
  if (st != MEGA_OK) return st;
  if (!o->cert != !o->key)
    return mega_fail(err, MEGA_ERR_INVALID, "--etcd-cert and --etcd-key go together");
  if (o->cert && !o->cacert)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--etcd-cert needs --etcd-cacert too: a client certificate goes over TLS");
  if (!o->user != !o->password)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--etcd-user and --etcd-password-file go together");
  megad_etcd *e = calloc(1, sizeof *e);
  if (!e) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  e->b = b;
  e->timeout_ms = o->timeout_ms ? o->timeout_ms : 2000;
  e->ok = true;
  bool oom = false;
  e->prefix = dup_or_null(prefix, &oom);
  e->prefix_len = strlen(prefix);
  e->tls.tls_ca = dup_or_null(o->cacert, &oom);
  e->tls.tls_cert = dup_or_null(o->cert, &oom);
  e->tls.tls_key = dup_or_null(o->key, &oom);
  e->user = dup_or_null(o->user, &oom);
  e->password = dup_or_null(o->password, &oom);
  size_t cap = 1;
  for (const char *p = endpoints; *p; p++) cap += *p == ',';
  e->eps = calloc(cap, sizeof *e->eps);
  e->chans = calloc(cap, sizeof *e->chans);
  e->eps_text = calloc(1, strlen(endpoints) + 1);
  st = e->eps && e->chans && e->eps_text && !oom ? MEGA_OK
                                                 : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (const char *p = endpoints; st == MEGA_OK && *p;) {
    const char *c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    char *ep = parse_endpoint(p, n, e->tls.tls_ca != NULL, err);
    if (!ep) {
      st = err && err->status != MEGA_OK ? err->status : MEGA_ERR_INVALID;
      break;
    }
    e->eps[e->nep] = ep;
    if (e->nep) strcat(e->eps_text, ",");
    strcat(e->eps_text, ep);
    e->nep++;
    p += n + (c != NULL);
  }
  if (st == MEGA_OK && e->nep == 0)
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "no etcd endpoint given (expected e.g. http://127.0.0.1:2379)");
  if (st == MEGA_OK) st = etcd_channels_build(e, err);
  if (st == MEGA_OK && e->user) st = etcd_auth_sync(e, err);
  if (st != MEGA_OK) {
    megad_etcd_free(e);
    return st;
  }
  *out = e;
  return MEGA_OK;
}

mega_status megad_etcd_new(megad_base *b, const char *endpoints, unsigned timeout_ms,
                           megad_etcd **out, mega_err *err) {
  megad_etcd_opts o = {.endpoints = endpoints, .timeout_ms = timeout_ms};
  return megad_etcd_open(b, &o, out, err);
}

static void free_secret(char *s) {
  if (s) memset(s, 0, strlen(s));
  free(s);
}

void megad_etcd_free(megad_etcd *e) {
  if (!e) return;
  e->closing = true;
  if (e->session) etcd_session_free(e->session);
  while (e->watches) etcd_watch_free(e->watches);
  etcd_calls_cancel_all(e);
  etcd_auth_free(e);
  for (size_t i = 0; i < e->nep; i++) {
    mega_rpc_channel_free(e->chans[i]); /* calls in flight keep theirs */
    free(e->eps[i]);
  }
  free(e->chans);
  free(e->eps);
  free(e->eps_text);
  free(e->prefix);
  free((char *)e->tls.tls_ca);
  free((char *)e->tls.tls_cert);
  free_secret((char *)e->tls.tls_key);
  free(e->user);
  free_secret(e->password);
  free_secret(e->token);
  free(e);
}


/* ---- replies ---- */

/* A reply and what it points into; r first, so megad_etcd_reply_free can
 * take the reply's address. */
typedef struct reply_buf {
  megad_etcd_reply r;
  megad_etcd_kv *kvs;
  char *keys;
  ProtobufCMessage *msg;
} reply_buf;

static int64_t header_rev(const Etcdserverpb__ResponseHeader *h) { return h ? h->revision : 0; }

static mega_status reply_kvs(const megad_etcd *e, reply_buf *rb, Mvccpb__KeyValue **kvs, size_t n,
                             mega_err *err) {
  size_t keybytes = 0;
  for (size_t i = 0; i < n; i++) keybytes += kvs[i]->key.len + ETCD_ROOT_LEN + 1;
  rb->kvs = calloc(n ? n : 1, sizeof *rb->kvs);
  rb->keys = malloc(keybytes ? keybytes : 1);
  if (!rb->kvs || !rb->keys) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  char *k = rb->keys;
  for (size_t i = 0; i < n; i++) {
    const Mvccpb__KeyValue *kv = kvs[i];
    size_t len = etcd_key_unmap(e, kv->key.data, kv->key.len, k);
    rb->kvs[i] = (megad_etcd_kv){.key = k, .value = kv->value.data, .value_len = kv->value.len,
                                 .create_revision = kv->create_revision,
                                 .mod_revision = kv->mod_revision, .version = kv->version,
                                 .lease = kv->lease};
    k += len + 1;
  }
  rb->r.kvs = rb->kvs;
  rb->r.nkvs = n;
  return MEGA_OK;
}

static void reply_buf_clear(reply_buf *rb) {
  free(rb->kvs);
  free(rb->keys);
  if (rb->msg) protobuf_c_message_free_unpacked(rb->msg, NULL);
  memset(rb, 0, sizeof *rb);
}

/* Fills rb from msg (taken: rb->msg). */
static mega_status reply_from(const megad_etcd *e, reply_buf *rb, ProtobufCMessage *msg,
                              mega_err *err) {
  memset(rb, 0, sizeof *rb);
  rb->msg = msg;
  const ProtobufCMessageDescriptor *d = msg->descriptor;
  if (d == &etcdserverpb__range_response__descriptor) {
    Etcdserverpb__RangeResponse *r = (Etcdserverpb__RangeResponse *)msg;
    rb->r.revision = header_rev(r->header);
    return reply_kvs(e, rb, r->kvs, r->n_kvs, err);
  }
  if (d == &etcdserverpb__put_response__descriptor) {
    rb->r.revision = header_rev(((Etcdserverpb__PutResponse *)msg)->header);
  } else if (d == &etcdserverpb__delete_range_response__descriptor) {
    rb->r.revision = header_rev(((Etcdserverpb__DeleteRangeResponse *)msg)->header);
  } else if (d == &etcdserverpb__txn_response__descriptor) {
    Etcdserverpb__TxnResponse *t = (Etcdserverpb__TxnResponse *)msg;
    rb->r.revision = header_rev(t->header);
    rb->r.succeeded = t->succeeded;
    for (size_t i = 0; i < t->n_responses; i++)
      if (t->responses[i]->response_case == ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE) {
        Etcdserverpb__RangeResponse *r = t->responses[i]->response_range;
        return reply_kvs(e, rb, r->kvs, r->n_kvs, err);
      }
  } else if (d == &etcdserverpb__lease_grant_response__descriptor) {
    Etcdserverpb__LeaseGrantResponse *g = (Etcdserverpb__LeaseGrantResponse *)msg;
    if (g->error && g->error[0])
      return mega_fail(err, MEGA_ERR_PEER, "etcd refused a lease: %s", g->error);
    rb->r.revision = header_rev(g->header);
    rb->r.lease = g->id;
    rb->r.ttl = g->ttl;
  }
  return MEGA_OK;
}

/* ---- KV ---- */

typedef struct op_ctx {
  megad_etcd *e;
  megad_etcd_cb cb;
  void *arg;
} op_ctx;

static void on_op_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  op_ctx o = *(op_ctx *)arg;
  free(arg);
  if (!resp) {
    o.cb(o.arg, NULL, err);
    return;
  }
  reply_buf rb;
  mega_err e2 = {0};
  if (reply_from(o.e, &rb, resp, &e2) != MEGA_OK) o.cb(o.arg, NULL, &e2);
  else o.cb(o.arg, &rb.r, &e2);
  reply_buf_clear(&rb);
}

static mega_status op_start(megad_etcd *e, const mega_rpc_method *m, const ProtobufCMessage *req,
                            megad_etcd_cb cb, void *arg, mega_err *err) {
  if (!cb) return mega_fail(err, MEGA_ERR_INVALID, "etcd %s without a callback", m->path);
  op_ctx *o = malloc(sizeof *o);
  if (!o) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  *o = (op_ctx){e, cb, arg};
  mega_status st = etcd_call_start(e, m, req, 0, on_op_done, o, NULL, err);
  if (st != MEGA_OK) free(o);
  return st;
}

static ProtobufCBinaryData bin(const void *p, size_t n) {
  return (ProtobufCBinaryData){n, (uint8_t *)p};
}

static ProtobufCBinaryData key_bin(const char *key) { return bin(key, strlen(key)); }

static mega_status check_key(const char *key, mega_err *err) {
  if (!key || !key[0]) return mega_fail(err, MEGA_ERR_INVALID, "an etcd key may not be empty");
  return MEGA_OK;
}

/* The range_end of key (empty: key alone) or of every key under it; end
 * is the caller's buffer of strlen(key) + 1 bytes. */
static ProtobufCBinaryData range_end(const char *key, bool prefix, char *end) {
  size_t n = 0;
  if (prefix) etcd_prefix_end(key, end, &n);
  return bin(end, n);
}

static void range_req(Etcdserverpb__RangeRequest *r, const char *key, bool prefix, char *end) {
  etcdserverpb__range_request__init(r);
  r->key = key_bin(key);
  r->range_end = range_end(key, prefix, end);
}

static void delete_req(Etcdserverpb__DeleteRangeRequest *r, const char *key, bool prefix,
                       char *end) {
  etcdserverpb__delete_range_request__init(r);
  r->key = key_bin(key);
  r->range_end = range_end(key, prefix, end);
}

/* key under the client's root (etcd_key_map), in a buffer of the caller's
 * scope named mk */
#define MAP_KEY(mk, e, key)                      \
  char mk[etcd_key_mapped_len((e), (key)) + 1]; \
  etcd_key_map((e), (key), mk)

mega_status megad_etcd_get(megad_etcd *e, const char *key, bool prefix, megad_etcd_cb cb,
                           void *arg, mega_err *err) {
  mega_status ks = check_key(key, err);
  if (ks != MEGA_OK) return ks;
  MAP_KEY(mk, e, key);
  key = mk;
  char end[strlen(key) + 1];
  Etcdserverpb__RangeRequest r;
  range_req(&r, key, prefix, end);
  return op_start(e, &etcd_kv_range, &r.base, cb, arg, err);
}

mega_status megad_etcd_put(megad_etcd *e, const char *key, const void *value, size_t len,
                           int64_t lease, megad_etcd_cb cb, void *arg, mega_err *err) {
  mega_status ks = check_key(key, err);
  if (ks != MEGA_OK) return ks;
  MAP_KEY(mk, e, key);
  key = mk;
  Etcdserverpb__PutRequest r = ETCDSERVERPB__PUT_REQUEST__INIT;
  r.key = key_bin(key);
  r.value = bin(value, len);
  r.lease = lease;
  return op_start(e, &etcd_kv_put, &r.base, cb, arg, err);
}

mega_status megad_etcd_delete(megad_etcd *e, const char *key, bool prefix, megad_etcd_cb cb,
                              void *arg, mega_err *err) {
  mega_status ks = check_key(key, err);
  if (ks != MEGA_OK) return ks;
  MAP_KEY(mk, e, key);
  key = mk;
  char end[strlen(key) + 1];
  Etcdserverpb__DeleteRangeRequest r;
  delete_req(&r, key, prefix, end);
  return op_start(e, &etcd_kv_delete_range, &r.base, cb, arg, err);
}

/* ---- Txn ---- */

/* The request's parts, allocated together so one free releases them. */
typedef struct txn_parts {
  Etcdserverpb__Compare *cmp, **cmpp;
  Etcdserverpb__RequestOp *ops, **opp;
  Etcdserverpb__RangeRequest *ranges;
  Etcdserverpb__PutRequest *puts;
  Etcdserverpb__DeleteRangeRequest *dels;
  char **ends;
  char **keys; /* [ncmp + nops]: the keys under the client's root */
  size_t nkeys;
} txn_parts;

static void txn_parts_free(txn_parts *t, size_t nops) {
  for (size_t i = 0; t->ends && i < nops; i++) free(t->ends[i]);
  free(t->ends);
  for (size_t i = 0; t->keys && i < t->nkeys; i++) free(t->keys[i]);
  free(t->keys);
  free(t->cmp);
  free(t->cmpp);
  free(t->ops);
  free(t->opp);
  free(t->ranges);
  free(t->puts);
  free(t->dels);
}

static const int cmp_targets[] = {
    [MEGAD_ETCD_CREATE] = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE,
    [MEGAD_ETCD_MOD] = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD,
    [MEGAD_ETCD_VERSION] = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION,
    [MEGAD_ETCD_VALUE] = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE,
};
static const int cmp_results[] = {
    [MEGAD_ETCD_EQUAL] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL,
    [MEGAD_ETCD_NOT_EQUAL] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL,
    [MEGAD_ETCD_LESS] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS,
    [MEGAD_ETCD_GREATER] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER,
};

/* key under the client's root, kept in t until the request is sent */
static const char *txn_key(const megad_etcd *e, txn_parts *t, size_t i, const char *key) {
  char *k = malloc(etcd_key_mapped_len(e, key) + 1);
  if (!k) return NULL;
  etcd_key_map(e, key, k);
  t->keys[i] = k;
  return k;
}

static mega_status txn_cmp(const megad_etcd *e, txn_parts *t, size_t i, const megad_etcd_cmp *m,
                           mega_err *err) {
  Etcdserverpb__Compare *c = &t->cmp[i];
  etcdserverpb__compare__init(c);
  mega_status ks = check_key(m->key, err);
  if (ks != MEGA_OK) return ks;
  const char *key = txn_key(e, t, i, m->key);
  if (!key) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  if ((unsigned)m->target > MEGAD_ETCD_VALUE || (unsigned)m->result > MEGAD_ETCD_GREATER)
    return mega_fail(err, MEGA_ERR_INVALID, "etcd txn: a compare on %s has no valid target or "
                     "result", m->key);
  c->key = key_bin(key);
  c->target = cmp_targets[m->target];
  c->result = cmp_results[m->result];
  switch (m->target) {
  case MEGAD_ETCD_CREATE:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
    c->create_revision = m->number;
    break;
  case MEGAD_ETCD_MOD:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
    c->mod_revision = m->number;
    break;
  case MEGAD_ETCD_VERSION:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
    c->version = m->number;
    break;
  case MEGAD_ETCD_VALUE:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
    c->value = bin(m->value, m->value_len);
    break;
  }
  return MEGA_OK;
}

static mega_status txn_op(const megad_etcd *e, txn_parts *t, size_t i, size_t ki,
                          const megad_etcd_op *o, mega_err *err) {
  Etcdserverpb__RequestOp *r = &t->ops[i];
  etcdserverpb__request_op__init(r);
  t->opp[i] = r;
  mega_status ks = check_key(o->key, err);
  if (ks != MEGA_OK) return ks;
  const char *key = txn_key(e, t, ki, o->key);
  if (!key) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  if ((o->kind == MEGAD_ETCD_GET || o->kind == MEGAD_ETCD_DELETE) &&
      !(t->ends[i] = malloc(strlen(key) + 1)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  switch (o->kind) {
  case MEGAD_ETCD_PUT:
    etcdserverpb__put_request__init(&t->puts[i]);
    t->puts[i].key = key_bin(key);
    t->puts[i].value = bin(o->value, o->value_len);
    t->puts[i].lease = o->lease;
    r->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
    r->request_put = &t->puts[i];
    return MEGA_OK;
  case MEGAD_ETCD_GET:
    range_req(&t->ranges[i], key, o->prefix, t->ends[i]);
    r->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
    r->request_range = &t->ranges[i];
    return MEGA_OK;
  case MEGAD_ETCD_DELETE:
    delete_req(&t->dels[i], key, o->prefix, t->ends[i]);
    r->request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
    r->request_delete_range = &t->dels[i];
    return MEGA_OK;
  }
  return mega_fail(err, MEGA_ERR_INVALID, "etcd txn: an op on %s has no valid kind", o->key);
}

mega_status megad_etcd_txn(megad_etcd *e, const megad_etcd_cmp *cmp, size_t ncmp,
                           const megad_etcd_op *then, size_t nthen,
                           const megad_etcd_op *otherwise, size_t nelse, megad_etcd_cb cb,
                           void *arg, mega_err *err) {
  size_t nops = nthen + nelse;
  txn_parts t = {0};
  size_t c1 = ncmp ? ncmp : 1, o1 = nops ? nops : 1;
  t.cmp = calloc(c1, sizeof *t.cmp);
  t.cmpp = calloc(c1, sizeof *t.cmpp);
  t.ops = calloc(o1, sizeof *t.ops);
  t.opp = calloc(o1, sizeof *t.opp);
  t.ranges = calloc(o1, sizeof *t.ranges);
  t.puts = calloc(o1, sizeof *t.puts);
  t.dels = calloc(o1, sizeof *t.dels);
  t.ends = calloc(o1, sizeof *t.ends);
  t.nkeys = ncmp + nops;
  t.keys = calloc(t.nkeys ? t.nkeys : 1, sizeof *t.keys);
  mega_status st = MEGA_OK;
  if (!t.cmp || !t.cmpp || !t.ops || !t.opp || !t.ranges || !t.puts || !t.dels || !t.ends ||
      !t.keys)
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; st == MEGA_OK && i < ncmp; i++) {
    st = txn_cmp(e, &t, i, &cmp[i], err);
    t.cmpp[i] = &t.cmp[i];
  }
  for (size_t i = 0; st == MEGA_OK && i < nops; i++)
    st = txn_op(e, &t, i, ncmp + i, i < nthen ? &then[i] : &otherwise[i - nthen], err);
  if (st == MEGA_OK) {
    Etcdserverpb__TxnRequest r = ETCDSERVERPB__TXN_REQUEST__INIT;
    r.n_compare = ncmp;
    r.compare = t.cmpp;
    r.n_success = nthen;
    r.success = t.opp;
    r.n_failure = nelse;
    r.failure = t.opp + nthen;
    st = op_start(e, &etcd_kv_txn, &r.base, cb, arg, err);
  }
  txn_parts_free(&t, nops);
  return st;
}

/* ---- blocking get ---- */

mega_status megad_etcd_get_sync(megad_etcd *e, const char *key, bool prefix,
                                megad_etcd_reply **out, mega_err *err) {
  *out = NULL;
  mega_status ks = check_key(key, err);
  if (ks != MEGA_OK) return ks;
  MAP_KEY(mk, e, key);
  key = mk;
  char end[strlen(key) + 1];
  Etcdserverpb__RangeRequest r;
  range_req(&r, key, prefix, end);
  mega_err e2 = {0};
  for (size_t tries = 0; tries < e->nep; tries++) {
    size_t ep = e->cur;
    ProtobufCMessage *resp;
    mega_err_clear(&e2);
    if (mega_rpc_unary(e->chans[ep], &etcd_kv_range, &r.base, e->timeout_ms, &resp, &e2) ==
        MEGA_OK) {
      etcd_note(e, &e2);
      reply_buf *rb = malloc(sizeof *rb);
      if (!rb) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
      }
      mega_status st = reply_from(e, rb, resp, err);
      if (st != MEGA_OK) {
        reply_buf_clear(rb);
        free(rb);
        return st;
      }
      *out = &rb->r;
      return MEGA_OK;
    }
    if (!etcd_err_failover(&e2)) break;
    etcd_endpoint_failed(e, ep);
  }
  etcd_note(e, &e2);
  etcd_explain(e, &e2);
  if (err) *err = e2;
  return e2.status;
}

void megad_etcd_reply_free(megad_etcd_reply *r) {
  if (!r) return;
  reply_buf *rb = (reply_buf *)r;
  reply_buf_clear(rb);
  free(rb);
}
