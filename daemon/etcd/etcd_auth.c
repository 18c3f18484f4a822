/* The etcd client's channels, TLS and authentication: every endpoint's
 * channel carries hasleader and, with a user, the token Auth.Authenticate
 * gave; a token etcd refuses is replaced by authenticating again (etcd.h).
 * Authenticate goes over a channel of its own without a token, since etcd
 * checks a stale token even on that call. */
#include "daemon/etcd/etcd_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct etcd_auth_wait {
  etcd_auth_wait *next;
  void (*fn)(void *arg, const mega_err *err);
  void *arg;
};

static mega_status channel(const megad_etcd *e, size_t i, bool with_token,
                           mega_rpc_channel **out, mega_err *err) {
  /* hasleader: a member cut off from the quorum refuses calls at once, and
   * ends our watches after 3 election timeouts, instead of serving stale
   * reads or a watch that never fires; both then move to the next endpoint */
  mega_rpc_channel_opts o = {.peer_name = "etcd", .max_backoff_ms = 1000,
                             .header_key = "hasleader", .header_value = "true",
                             .auth = e->tls.tls_ca ? &e->tls : NULL,
                             .auth_hint = "give --etcd-user and --etcd-password-file"};
  if (with_token && e->token) {
    o.header2_key = "token";
    o.header2_value = e->token;
  }
  mega_status st = mega_rpc_channel_new(e->eps[i], &o, out, err);
  if (st != MEGA_OK) mega_err_prefix(err, "etcd endpoint %s", e->eps[i]);
  return st;
}

mega_status etcd_channels_build(megad_etcd *e, mega_err *err) {
  for (size_t i = 0; i < e->nep; i++) {
    mega_rpc_channel *ch;
    mega_status st = channel(e, i, true, &ch, err);
    if (st != MEGA_OK) return st;
    mega_rpc_channel_free(e->chans[i]); /* calls in flight keep the old one */
    e->chans[i] = ch;
  }
  return MEGA_OK;
}

static void auth_req(const megad_etcd *e, Etcdserverpb__AuthenticateRequest *r) {
  etcdserverpb__authenticate_request__init(r);
  r->name = e->user;
  r->password = e->password;
}

/* The token from an answer, into the channels. */
static mega_status take_token(megad_etcd *e, ProtobufCMessage *resp, mega_err *err) {
  const Etcdserverpb__AuthenticateResponse *a = (const void *)resp;
  mega_status st = MEGA_OK;
  if (!a->token || !a->token[0]) {
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "etcd gave no token for user %s (is its authentication on? `etcdctl auth "
                   "status`); give no --etcd-user then", e->user);
  } else {
    char *t = strdup(a->token);
    if (!t) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    } else {
      if (e->token) memset(e->token, 0, strlen(e->token));
      free(e->token);
      e->token = t;
      e->authed_ms = e->b->loop ? uv_now(e->b->loop) : 0;
      st = etcd_channels_build(e, err);
    }
  }
  protobuf_c_message_free_unpacked(resp, NULL);
  return st;
}

/* A refusal of the name or password is said as such. */
static void auth_failed(const megad_etcd *e, const char *ep, mega_err *err) {
  if (strstr(err->msg, "authentication failed"))
    mega_fail(err, MEGA_ERR_INVALID,
              "etcd at %s refused user %s: wrong name or password (--etcd-user, "
              "--etcd-password-file)", ep, e->user);
}

mega_status etcd_auth_sync(megad_etcd *e, mega_err *err) {
  Etcdserverpb__AuthenticateRequest r;
  auth_req(e, &r);
  mega_err e2 = {0};
  for (size_t tries = 0; tries < e->nep; tries++) {
    size_t ep = e->cur;
    mega_rpc_channel *ch;
    mega_err_clear(&e2);
    mega_status st = channel(e, ep, false, &ch, &e2);
    ProtobufCMessage *resp = NULL;
    if (st == MEGA_OK)
      st = mega_rpc_unary(ch, &etcd_auth_authenticate, &r.base, e->timeout_ms, &resp, &e2);
    mega_rpc_channel_free(ch);
    if (st == MEGA_OK) return take_token(e, resp, err);
    if (!etcd_err_failover(&e2)) break;
    etcd_endpoint_failed(e, ep);
  }
  auth_failed(e, e->eps_text, &e2);
  etcd_note(e, &e2);
  etcd_explain(e, &e2);
  if (err) *err = e2;
  return e2.status;
}

bool etcd_err_token(const megad_etcd *e, const mega_err *err) {
  /* UNAUTHENTICATED is "etcd requires a token" (proto/rpc_client.c): etcd's
   * "invalid auth token" */
  return e->user && err->status == MEGA_ERR_IO && strstr(err->msg, "etcd requires a token");
}

static void run_waits(megad_etcd *e, const mega_err *err) {
  etcd_auth_wait *w = e->auth_waits;
  e->auth_waits = NULL;
  while (w) {
    etcd_auth_wait *next = w->next;
    if (w->fn) w->fn(w->arg, err);
    free(w);
    w = next;
  }
}

typedef struct auth_call {
  megad_etcd *e; /* NULL once the client is freed: the answer is dropped */
  mega_rpc_channel *ch;
  mega_rpc_pending *p;
  size_t ep, tries;
} auth_call;

static void auth_send(auth_call *a);

static void on_auth(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  auth_call *a = arg;
  megad_etcd *e = a->e;
  mega_rpc_channel_free(a->ch);
  a->ch = NULL;
  a->p = NULL;
  if (!e) {
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    free(a);
    return;
  }
  mega_err e2 = *err;
  if (resp && take_token(e, resp, &e2) == MEGA_OK) {
    megad_log(e->b, "etcd: authenticated again as %s (the last token was refused)", e->user);
  } else if (!resp && etcd_err_failover(err) && ++a->tries < e->nep) {
    etcd_endpoint_failed(e, a->ep);
    auth_send(a);
    return;
  } else if (!resp) {
    auth_failed(e, e->eps[a->ep], &e2);
    megad_warn(e->b, "etcd: authenticating as %s: %s", e->user, e2.msg);
  }
  free(a);
  e->authing = false;
  e->auth_inflight = NULL;
  run_waits(e, &e2);
}

static void auth_send(auth_call *a) {
  megad_etcd *e = a->e;
  a->ep = e->cur;
  Etcdserverpb__AuthenticateRequest r;
  auth_req(e, &r);
  mega_err err = {0};
  if (channel(e, a->ep, false, &a->ch, &err) != MEGA_OK ||
      mega_rpc_unary_async(a->ch, e->b->cq, &etcd_auth_authenticate, &r.base, e->timeout_ms,
                           on_auth, a, &a->p, &err) != MEGA_OK) {
    mega_rpc_channel_free(a->ch);
    free(a);
    e->authing = false;
    e->auth_inflight = NULL;
    run_waits(e, &err);
  }
}

void etcd_auth_refresh(megad_etcd *e, void (*fn)(void *arg, const mega_err *err), void *arg) {
  etcd_auth_wait *w = calloc(1, sizeof *w);
  auth_call *a = e->authing ? NULL : calloc(1, sizeof *a);
  if (!w || (!e->authing && !a)) {
    free(w);
    free(a);
    mega_err oom;
    mega_fail(&oom, MEGA_ERR_NOMEM, "out of memory");
    if (fn) fn(arg, &oom);
    return;
  }
  *w = (etcd_auth_wait){e->auth_waits, fn, arg};
  e->auth_waits = w;
  if (e->authing) return;
  e->authing = true;
  e->auth_inflight = a;
  a->e = e;
  auth_send(a);
}

void etcd_explain(const megad_etcd *e, mega_err *err) {
  const char *hint = NULL;
  char buf[200];
  if (e->tls.tls_ca && !e->tls.tls_cert && etcd_err_failover(err))
    hint = "over TLS: if etcd runs with --client-cert-auth, give --etcd-cert and --etcd-key";
  else if (strstr(err->msg, "user name is empty"))
    hint = "etcd has authentication on: give --etcd-user and --etcd-password-file, or a client "
           "certificate (--etcd-cert, --etcd-key) whose CN is an etcd user";
  else if (strstr(err->msg, "permission denied")) {
    snprintf(buf, sizeof buf, "the etcd user%s%s may not use %s: grant its role readwrite on "
             "that prefix (etcdctl role grant-permission ROLE --prefix readwrite %s)",
             e->user ? " " : "", e->user ? e->user : "", e->prefix, e->prefix);
    hint = buf;
  }
  if (!hint) return;
  size_t n = strlen(err->msg);
  snprintf(err->msg + n, sizeof err->msg - n, " (%s)", hint);
}

void etcd_auth_free(megad_etcd *e) {
  auth_call *a = e->auth_inflight;
  if (a) { /* its answer comes back to nothing, and frees it */
    a->e = NULL;
    mega_rpc_pending_cancel(a->p);
  }
  mega_err c;
  mega_fail(&c, MEGA_ERR_CANCELLED, "the etcd client was closed");
  run_waits(e, &c);
}
