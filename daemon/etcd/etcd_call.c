/* The etcd client's unary calls, which fail over between endpoints and
 * authenticate again when etcd refuses the token (etcd_auth.c), and small
 * helpers etcd.c, etcd_session.c and etcd_watch.c share. */
#include "daemon/etcd/etcd_internal.h"

#include <stdlib.h>
#include <string.h>

struct etcd_call {
  megad_etcd *e; /* NULL once dropped: the answer is thrown away */
  etcd_call *prev, *next;
  const mega_rpc_method *m;
  uint8_t *req; /* packed, to send again on the next endpoint */
  size_t req_len;
  unsigned timeout_ms;
  size_t ep, tries;
  bool reauthed; /* sent again after a fresh token: not again */
  mega_rpc_pending *p;
  etcd_done_fn done;
  void *arg;
};

uint64_t etcd_now_ms(const megad_etcd *e) { return uv_now(e->b->loop); }

void etcd_prefix_end(const char *key, char *out, size_t *len) {
  size_t n = strlen(key);
  memcpy(out, key, n);
  while (n > 0 && (unsigned char)out[n - 1] == 0xff) n--;
  if (n == 0) { /* no key is past every key with this prefix */
    out[0] = 0;
    *len = 1;
    return;
  }
  out[n - 1] = (char)((unsigned char)out[n - 1] + 1);
  *len = n;
}

size_t etcd_key_mapped_len(const megad_etcd *e, const char *key) {
  size_t n = strlen(key);
  return strncmp(key, MEGAD_ETCD_ROOT, ETCD_ROOT_LEN) ? n : n - ETCD_ROOT_LEN + e->prefix_len;
}

void etcd_key_map(const megad_etcd *e, const char *key, char *out) {
  if (strncmp(key, MEGAD_ETCD_ROOT, ETCD_ROOT_LEN)) {
    strcpy(out, key);
    return;
  }
  memcpy(out, e->prefix, e->prefix_len);
  strcpy(out + e->prefix_len, key + ETCD_ROOT_LEN);
}

size_t etcd_key_unmap(const megad_etcd *e, const uint8_t *key, size_t len, char *out) {
  size_t n = 0;
  if (len >= e->prefix_len && !memcmp(key, e->prefix, e->prefix_len)) {
    memcpy(out, MEGAD_ETCD_ROOT, ETCD_ROOT_LEN);
    n = ETCD_ROOT_LEN;
    key += e->prefix_len;
    len -= e->prefix_len;
  }
  if (len) memcpy(out + n, key, len);
  out[n + len] = 0;
  return n + len;
}

mega_status etcd_closing(const megad_etcd *e, const char *what, mega_err *err) {
  if (!e->closing) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_CANCELLED, "%s not started: the etcd client is closing", what);
}

static void timer_closed(uv_handle_t *h) { free(h); }

uv_timer_t *etcd_timer_new(megad_etcd *e, void *data) {
  uv_timer_t *t = malloc(sizeof *t);
  if (!t) return NULL;
  uv_timer_init(e->b->loop, t);
  t->data = data;
  return t;
}

void etcd_timer_free(uv_timer_t *t) {
  if (t) uv_close((uv_handle_t *)t, timer_closed);
}


/* ---- unary calls with failover ---- */

static void call_unlink(etcd_call *c) {
  if (c->prev) c->prev->next = c->next;
  else c->e->calls = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static void call_free(etcd_call *c) {
  free(c->req);
  free(c);
}

static void on_call_done(void *arg, ProtobufCMessage *resp, const mega_err *err);

/* Sends c to eps[c->ep]. */
static mega_status call_send(etcd_call *c, mega_err *err) {
  megad_etcd *e = c->e;
  ProtobufCMessage *req = protobuf_c_message_unpack(c->m->request, NULL, c->req_len, c->req);
  if (!req) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  c->tries++;
  mega_status st = mega_rpc_unary_async(e->chans[c->ep], e->b->cq, c->m, req, c->timeout_ms,
                                        on_call_done, c, &c->p, err);
  protobuf_c_message_free_unpacked(req, NULL);
  return st;
}

/* The token came back (or not): c goes again, or ends with why. */
static void after_auth(void *arg, const mega_err *err) {
  etcd_call *c = arg;
  if (!c->e) { /* dropped meanwhile */
    call_free(c);
    return;
  }
  mega_err e2 = {0};
  if (err->status == MEGA_OK && call_send(c, &e2) == MEGA_OK) return;
  if (err->status != MEGA_OK) e2 = *err;
  call_unlink(c);
  c->done(c->arg, NULL, &e2);
  call_free(c);
}

static void on_call_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  etcd_call *c = arg;
  c->p = NULL;
  megad_etcd *e = c->e;
  if (!e) { /* dropped */
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    call_free(c);
    return;
  }
  if (err->status != MEGA_OK && etcd_err_token(e, err) && !c->reauthed) {
    c->reauthed = true;
    c->tries = 0;
    etcd_auth_refresh(e, after_auth, c);
    return;
  }
  if (err->status != MEGA_OK && etcd_err_failover(err)) {
    etcd_endpoint_failed(e, c->ep);
    if (c->tries < e->nep) {
      c->ep = (c->ep + 1) % e->nep;
      mega_err e2 = {0};
      if (call_send(c, &e2) == MEGA_OK) return;
      call_unlink(c); /* could not even start it: that is the answer */
      c->done(c->arg, NULL, &e2);
      call_free(c);
      return;
    }
  }
  etcd_note(e, err);
  call_unlink(c);
  mega_err why = *err;
  if (err->status != MEGA_OK) etcd_explain(e, &why);
  c->done(c->arg, resp, &why);
  call_free(c);
}

mega_status etcd_call_start(megad_etcd *e, const mega_rpc_method *m, const ProtobufCMessage *req,
                            unsigned timeout_ms, etcd_done_fn done, void *arg, etcd_call **out,
                            mega_err *err) {
  if (out) *out = NULL;
  mega_status closing = etcd_closing(e, m->path, err);
  if (closing != MEGA_OK) return closing;
  etcd_call *c = calloc(1, sizeof *c);
  if (!c) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  c->req_len = protobuf_c_message_get_packed_size(req);
  c->req = malloc(c->req_len ? c->req_len : 1);
  if (!c->req) {
    free(c);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  protobuf_c_message_pack(req, c->req);
  c->e = e;
  c->m = m;
  c->timeout_ms = timeout_ms ? timeout_ms : e->timeout_ms;
  c->ep = e->cur;
  c->done = done;
  c->arg = arg;
  mega_status st = call_send(c, err);
  if (st != MEGA_OK) {
    call_free(c);
    return st;
  }
  c->next = e->calls;
  if (e->calls) e->calls->prev = c;
  e->calls = c;
  if (out) *out = c;
  return MEGA_OK;
}

void etcd_call_drop(etcd_call *c) {
  if (!c || !c->e) return;
  call_unlink(c);
  c->e = NULL;
  c->done = NULL;
  mega_rpc_pending_cancel(c->p); /* its answer comes back and frees c */
}

void etcd_calls_cancel_all(megad_etcd *e) {
  while (e->calls) {
    etcd_call *c = e->calls;
    etcd_done_fn done = c->done;
    void *arg = c->arg;
    etcd_call_drop(c);
    mega_err cancelled;
    mega_fail(&cancelled, MEGA_ERR_CANCELLED, "the etcd client was closed");
    if (done) done(arg, NULL, &cancelled);
  }
}
