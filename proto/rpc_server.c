#include "proto/rpc_server.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "core/throttle.h"
#include "proto/rpc_internal.h"

typedef struct method_entry {
  const mega_rpc_method *m;
  mega_rpc_handler fn;
  void *data;
  void *registered; /* gRPC's handle for the path */
  uint64_t served;  /* calls handed to fn */
} method_entry;

typedef struct out_msg {
  struct out_msg *next;
  grpc_byte_buffer *bb;
} out_msg;

/* One accepted call, or one armed request waiting for a call. Each tag in
 * flight holds a reference, and so does the handler until it ends the call. */
struct mega_rpc_call {
  mega_rpc_server *srv;
  method_entry *me; /* NULL: the fallback that answers unknown paths */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_call_details details; /* fallback only */
  mega_rpc_tag t_new, t_close, t_send;
  int refs;
  int cancelled; /* written by RECV_CLOSE_ON_SERVER */
  bool linked;   /* on the server's list of accepted calls */
  bool closed;   /* RECV_CLOSE_ON_SERVER came back: nothing more goes out */
  bool held;     /* the handler has not ended it */
  bool sending;  /* one send batch in flight at a time */
  bool md_sent, status_due, status_sent;
  mega_rpc_code code;
  grpc_slice status_details;
  out_msg *head, *tail;
  size_t queued;
  grpc_byte_buffer *inflight;
  ProtobufCMessage *req;
  mega_rpc_cancel_fn on_cancel;
  void *cancel_arg;
  char *peer;
  mega_rpc_call *prev, *next;
};

struct mega_rpc_server {
  mega_rpc_cq *cq;
  grpc_server *server;
  size_t max_msg, max_req;
  char *bearer; /* "Bearer TOKEN"; NULL: calls need no token */
  size_t bearer_len;
  mega_throttle *guesses; /* wrong tokens per source address (with bearer) */
  char *peer_bearer; /* "Bearer PEER_TOKEN"; NULL: none (rpc_auth.h) */
  size_t peer_bearer_len;
  char *peer_prefix; /* the paths only peer_bearer may call; NULL: none */
  char *tls_ca, *tls_cert, *tls_key; /* copies, for the listening ports' credentials */
  bool tls_client_auth;
  mega_rpc_refused_fn on_refused;
  void *refused_arg;
  method_entry *methods;
  size_t n_methods;
  bool started, shutting_down, shutdown_seen, finishing;
  size_t armed; /* requests posted, not yet back */
  size_t live;  /* accepted calls not yet freed */
  mega_rpc_call *calls;
  mega_rpc_tag t_shutdown;
  uv_timer_t grace;
  void (*done)(void *);
  void *done_arg;
};

static void on_new(mega_rpc_tag *t, bool ok);
static void on_close(mega_rpc_tag *t, bool ok);
static void on_send(mega_rpc_tag *t, bool ok);
static void maybe_finish_shutdown(mega_rpc_server *s);

/* ---- call lifetime ---- */

static void drop_queue(mega_rpc_call *c) {
  while (c->head) {
    out_msg *o = c->head;
    c->head = o->next;
    grpc_byte_buffer_destroy(o->bb);
    free(o);
  }
  c->tail = NULL;
  c->queued = 0;
}

static void call_free(mega_rpc_call *c) {
  mega_rpc_server *s = c->srv;
  if (c->linked) {
    if (c->prev) c->prev->next = c->next;
    else s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    s->live--;
  }
  drop_queue(c);
  if (c->inflight) grpc_byte_buffer_destroy(c->inflight);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
  grpc_slice_unref(c->status_details);
  grpc_metadata_array_destroy(&c->md);
  if (!c->me) grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  gpr_free(c->peer);
  bool linked = c->linked;
  free(c);
  if (linked) maybe_finish_shutdown(s);
}

static void call_unref(mega_rpc_call *c) {
  if (--c->refs == 0) call_free(c);
}

/* Posts the next send batch: initial metadata with the first, the status
 * with the last message when the handler has already ended the call. */
static void pump(mega_rpc_call *c) {
  if (c->sending || c->status_sent) return;
  if (c->closed) {
    drop_queue(c);
    return;
  }
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  bool send_md = !c->md_sent && (c->head || c->status_due);
  if (send_md) ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  grpc_byte_buffer *bb = NULL;
  if (c->head) {
    out_msg *o = c->head;
    c->head = o->next;
    if (!c->head) c->tail = NULL;
    c->queued--;
    bb = o->bb;
    free(o);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
  }
  bool send_status = c->status_due && !c->head;
  if (send_status) {
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->code;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
  }
  if (n == 0) return;
  c->refs++;
  if (grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL) != GRPC_CALL_OK) {
    /* Only a bug in this file gets here; stop sending rather than crash. */
    c->refs--;
    if (bb) grpc_byte_buffer_destroy(bb);
    drop_queue(c);
    c->status_sent = true;
    return;
  }
  c->sending = true;
  c->inflight = bb;
  if (send_md) c->md_sent = true;
  if (send_status) c->status_sent = true;
}

static void on_send(mega_rpc_tag *t, bool ok) {
  mega_rpc_call *c = MEGA_RPC_CONTAINER(t, mega_rpc_call, t_send);
  c->sending = false;
  if (c->inflight) grpc_byte_buffer_destroy(c->inflight);
  c->inflight = NULL;
  if (ok) {
    pump(c);
  } else {
    /* The call broke (cancelled); RECV_CLOSE_ON_SERVER reports it. */
    drop_queue(c);
    c->status_sent = true;
  }
  call_unref(c);
}

static void on_close(mega_rpc_tag *t, bool ok) {
  (void)ok;
  mega_rpc_call *c = MEGA_RPC_CONTAINER(t, mega_rpc_call, t_close);
  c->closed = true;
  drop_queue(c);
  if (c->cancelled && c->held && c->on_cancel) {
    mega_rpc_cancel_fn fn = c->on_cancel;
    c->on_cancel = NULL;
    fn(c, c->cancel_arg);
  }
  call_unref(c);
}

static void set_status(mega_rpc_call *c, mega_rpc_code code, const char *msg) {
  c->status_due = true;
  c->code = code;
  grpc_slice_unref(c->status_details);
  c->status_details = msg && msg[0] ? grpc_slice_from_copied_string(msg) : grpc_empty_slice();
}

/* Ends the handler's hold: the status goes out after the queued messages. */
static void end_call(mega_rpc_call *c, mega_rpc_code code, const char *msg) {
  set_status(c, code, msg);
  pump(c);
  c->held = false;
  call_unref(c);
}

static void enqueue(mega_rpc_call *c, grpc_byte_buffer *bb) {
  out_msg *o = malloc(sizeof *o);
  if (!o) {
    grpc_byte_buffer_destroy(bb);
    return;
  }
  *o = (out_msg){NULL, bb};
  if (c->tail) c->tail->next = o;
  else c->head = o;
  c->tail = o;
  c->queued++;
}

static void arm(mega_rpc_server *s, method_entry *me) {
  mega_rpc_call *c = calloc(1, sizeof *c);
  if (!c) return; /* the method stays unreachable; nothing better to do without memory */
  c->srv = s;
  c->me = me;
  c->refs = 1;
  c->t_new.fn = on_new;
  c->t_close.fn = on_close;
  c->t_send.fn = on_send;
  c->status_details = grpc_empty_slice();
  grpc_metadata_array_init(&c->md);
  grpc_completion_queue *q = mega_rpc_cq_raw(s->cq);
  grpc_call_error e;
  if (me) {
    e = grpc_server_request_registered_call(s->server, me->registered, &c->call, &c->deadline,
                                            &c->md, &c->payload, q, q, &c->t_new);
  } else {
    grpc_call_details_init(&c->details);
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, q, q, &c->t_new);
  }
  if (e != GRPC_CALL_OK) {
    call_free(c);
    return;
  }
  s->armed++;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The path a call asked for: its method's, or for an unknown one what came. */
static void call_path(const mega_rpc_call *c, char *buf, size_t n) {
  if (c->me) {
    snprintf(buf, n, "%s", c->me->m->path);
    return;
  }
  snprintf(buf, n, "%.*s", (int)GRPC_SLICE_LENGTH(c->details.method),
           (const char *)GRPC_SLICE_START_PTR(c->details.method));
}

/* Why the call may not go on (its credentials), with the code and the
 * client's sentence in code and msg; NULL when it may. */
static const char *refusal(const mega_rpc_server *s, mega_rpc_call *c, mega_rpc_code *code,
                           char *msg, size_t n) {
  if (!s->bearer && !s->peer_bearer) return NULL;
  char path[256];
  call_path(c, path, sizeof path);
  bool peer_only = s->peer_bearer && !strncmp(path, s->peer_prefix, strlen(s->peer_prefix));
  bool peer_ok = s->peer_bearer && mega_rpc_token_matches(s->peer_bearer, s->peer_bearer_len, &c->md);
  bool client_ok = s->bearer && mega_rpc_token_matches(s->bearer, s->bearer_len, &c->md);
  if (peer_ok || (!peer_only && (client_ok || !s->bearer))) return NULL;
  if (client_ok) { /* a client that tries a peer's method */
    *code = MEGA_RPC_PERMISSION_DENIED;
    snprintf(msg, n, "the client token may not call %s: only the peer token may, which the "
             "servers alone hold (megad --peer-token-file); clients call the other services",
             path);
    return "the client token, on a method only peers may call";
  }
  const char *why = mega_rpc_has_authorization(&c->md) ? "wrong token" : "no token";
  /* A wrong token is a guess, counted per source address: past a few, the
   * answer is RESOURCE_EXHAUSTED for a while. The right token always passes,
   * so megads and megactls sharing an address with a guesser keep working. */
  int64_t hold = 0;
  char src[MEGA_THROTTLE_KEY_MAX];
  mega_throttle_source(mega_rpc_call_peer(c), src, sizeof src);
  if (!strcmp(why, "wrong token") && s->guesses)
    hold = mega_throttle_fail(s->guesses, src, mono_ms());
  *code = hold ? MEGA_RPC_RESOURCE_EXHAUSTED : MEGA_RPC_UNAUTHENTICATED;
  if (hold)
    snprintf(msg, n, "too many wrong tokens from %s: calls from there with a wrong token are "
             "refused for %lld s more; use the %s", src, (long long)((hold + 999) / 1000),
             peer_only ? "peer token (megad --peer-token-file)"
                       : "cluster token (megactl --token-file)");
  else
    snprintf(msg, n, "%s: the server requires `authorization: Bearer TOKEN` with the %s", why,
             peer_only ? "peer token (megad --peer-token-file)" : "cluster token");
  return why;
}

static void on_new(mega_rpc_tag *t, bool ok) {
  mega_rpc_call *c = MEGA_RPC_CONTAINER(t, mega_rpc_call, t_new);
  mega_rpc_server *s = c->srv;
  s->armed--;
  if (!ok) { /* shutdown took back the request */
    call_free(c);
    maybe_finish_shutdown(s);
    return;
  }
  if (!s->shutting_down) arm(s, c->me);
  c->linked = true;
  c->next = s->calls;
  if (s->calls) s->calls->prev = c;
  s->calls = c;
  s->live++;

  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  c->refs++;
  if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
    c->refs--;
    c->closed = true;
  }

  char msg[512];
  if (!c->me) c->deadline = c->details.deadline;
  mega_rpc_code code = MEGA_RPC_OK;
  const char *why = refusal(s, c, &code, msg, sizeof msg);
  if (why) {
    /* Nothing of the request is looked at: not even whether its method exists. */
    set_status(c, code, msg);
    pump(c);
    const char *path = c->me ? c->me->m->path : "(unknown method)";
    if (s->on_refused) s->on_refused(s->refused_arg, mega_rpc_call_peer(c), path, why);
  } else if (!c->me) {
    snprintf(msg, sizeof msg, "unknown method %.*s", (int)GRPC_SLICE_LENGTH(c->details.method),
             (const char *)GRPC_SLICE_START_PTR(c->details.method));
    set_status(c, MEGA_RPC_UNIMPLEMENTED, msg);
    pump(c);
  } else {
    const mega_rpc_method *m = c->me->m;
    if (c->payload) c->req = mega_rpc_unpack(c->payload, m->request);
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    if (!c->req) {
      snprintf(msg, sizeof msg, "the request to %s is not a valid %s", m->path,
               m->request->name);
      set_status(c, MEGA_RPC_INVALID_ARGUMENT, msg);
      pump(c);
    } else {
      c->held = true;
      c->refs++;
      c->me->served++;
      c->me->fn(c, c->req, c->me->data);
    }
  }
  call_unref(c);
}

/* ---- answering ---- */

void mega_rpc_reply(mega_rpc_call *c, const ProtobufCMessage *resp) {
  if (!c || !c->held) return;
  mega_err e;
  grpc_byte_buffer *bb;
  if (mega_rpc_pack(resp, c->me->m->response, c->srv->max_msg, &bb, &e) != MEGA_OK) {
    end_call(c, mega_rpc_code_from_status(e.status), e.msg);
    return;
  }
  if (!c->closed) enqueue(c, bb);
  else grpc_byte_buffer_destroy(bb);
  end_call(c, MEGA_RPC_OK, NULL);
}

void mega_rpc_fail(mega_rpc_call *c, mega_rpc_code code, const char *fmt, ...) {
  if (!c || !c->held) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  end_call(c, code, msg);
}

void mega_rpc_fail_err(mega_rpc_call *c, const mega_err *err) {
  if (!c || !c->held) return;
  if (!err || err->status == MEGA_OK) {
    end_call(c, MEGA_RPC_INTERNAL, "the server failed without saying why");
    return;
  }
  end_call(c, mega_rpc_code_from_status(err->status), err->msg);
}

mega_status mega_rpc_send(mega_rpc_call *c, const ProtobufCMessage *msg, mega_err *err) {
  if (!c || !c->held)
    return mega_fail(err, MEGA_ERR_INTERNAL, "send on a call that was already ended");
  if (c->closed)
    return mega_fail(err, MEGA_ERR_CANCELLED, "the client of %s went away", c->me->m->path);
  if (c->me->m->kind == MEGA_RPC_UNARY && (c->md_sent || c->queued))
    return mega_fail(err, MEGA_ERR_INTERNAL, "%s is unary: it answers once, with mega_rpc_reply",
                     c->me->m->path);
  grpc_byte_buffer *bb;
  mega_status st = mega_rpc_pack(msg, c->me->m->response, c->srv->max_msg, &bb, err);
  if (st != MEGA_OK) return st;
  size_t before = c->queued;
  enqueue(c, bb);
  if (c->queued == before)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory queueing a %s", msg->descriptor->name);
  pump(c);
  return MEGA_OK;
}

void mega_rpc_finish(mega_rpc_call *c) {
  if (!c || !c->held) return;
  end_call(c, MEGA_RPC_OK, NULL);
}

void mega_rpc_call_on_cancel(mega_rpc_call *c, mega_rpc_cancel_fn fn, void *arg) {
  c->on_cancel = fn;
  c->cancel_arg = arg;
}

bool mega_rpc_call_cancelled(const mega_rpc_call *c) { return c->closed && c->cancelled; }

size_t mega_rpc_call_queued(const mega_rpc_call *c) { return c->queued; }

const mega_rpc_method *mega_rpc_call_method(const mega_rpc_call *c) {
  return c->me ? c->me->m : NULL;
}

const char *mega_rpc_call_peer(mega_rpc_call *c) {
  if (!c->peer) c->peer = grpc_call_get_peer(c->call);
  return c->peer ? c->peer : "unknown";
}

int64_t mega_rpc_call_remaining_ms(const mega_rpc_call *c) {
  gpr_timespec d = c->deadline;
  if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return -1;
  gpr_timespec left = gpr_time_sub(d, gpr_now(d.clock_type)); /* same clock: see notes §8 */
  int64_t ms = left.tv_sec * 1000 + left.tv_nsec / 1000000;
  return ms < 0 ? 0 : ms;
}

/* ---- the server ---- */

static void free_server(mega_rpc_server *s) {
  free(s->methods);
  free(s->bearer);
  mega_throttle_free(s->guesses);
  free(s->peer_bearer);
  free(s->peer_prefix);
  free(s->tls_ca);
  free(s->tls_cert);
  free(s->tls_key);
  free(s);
}

mega_status mega_rpc_server_new(mega_rpc_cq *cq, const mega_rpc_server_opts *opts,
                                mega_rpc_server **out, mega_err *err) {
  *out = NULL;
  mega_rpc_server *s = calloc(1, sizeof *s);
  if (!s) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating a server");
  s->cq = cq;
  s->max_msg = opts && opts->max_message_bytes ? opts->max_message_bytes
                                               : MEGA_RPC_MAX_MESSAGE_DEFAULT;
  if (s->max_msg > INT_MAX) s->max_msg = INT_MAX;
  s->max_req = opts && opts->max_request_bytes ? opts->max_request_bytes : s->max_msg;
  if (s->max_req > INT_MAX) s->max_req = INT_MAX;
  const mega_rpc_auth *a = opts ? opts->auth : NULL;
  bool invalid = a && a->tls_client_auth && !(a->tls_ca && a->tls_cert && a->tls_key), oom = false;
  bool invalid_prefix = false;
  if (!invalid && a && a->token && a->token[0]) {
    oom |= !(s->bearer = mega_rpc_bearer(a->token));
    if (s->bearer) s->bearer_len = strlen(s->bearer);
    oom |= !(s->guesses = mega_throttle_new());
  }
  if (!invalid && a && a->peer_token && a->peer_token[0]) {
    invalid_prefix = !opts->peer_prefix || !opts->peer_prefix[0];
    if (!invalid_prefix) {
      oom |= !(s->peer_bearer = mega_rpc_bearer(a->peer_token)) ||
             !(s->peer_prefix = strdup(opts->peer_prefix));
      if (s->peer_bearer) s->peer_bearer_len = strlen(s->peer_bearer);
    }
  }
  if (!invalid && a && a->tls_cert && a->tls_key) {
    oom |= !(s->tls_cert = strdup(a->tls_cert)) || !(s->tls_key = strdup(a->tls_key));
    if (a->tls_ca) oom |= !(s->tls_ca = strdup(a->tls_ca));
    s->tls_client_auth = a->tls_client_auth;
  }
  if (invalid || invalid_prefix || oom) {
    free_server(s);
    if (invalid_prefix)
      return mega_fail(err, MEGA_ERR_INVALID, "a peer token needs the peer prefix: the paths "
                       "only it may call");
    if (invalid)
      return mega_fail(err, MEGA_ERR_INVALID, "requiring client certificates needs a CA (the one "
                       "that signs them) and the server's own certificate and key");
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating a server");
  }
  if (opts) {
    s->on_refused = opts->on_refused;
    s->refused_arg = opts->refused_arg;
  }
  s->t_shutdown.fn = NULL;
  int rc = uv_timer_init(mega_rpc_cq_loop(cq), &s->grace);
  if (rc != 0) {
    free_server(s);
    return mega_fail(err, MEGA_ERR_IO, "cannot create a libuv timer: %s", uv_strerror(rc));
  }
  mega_rpc_lib_ref();
#define OPT_MS(f, def) (opts && opts->f ? (int)(opts->f > INT_MAX ? INT_MAX : opts->f) : (def))
  /* Keepalive pings find half-open connections; idle and handshake limits
   * close connections that hold a socket and do nothing. Clients may ping
   * as often as every 10 s without being told off. */
  const struct { const char *key; int val; } kv[] = {
      {GRPC_ARG_ALLOW_REUSEPORT, 0}, /* a second server must fail to bind */
      {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)s->max_req},
      {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)s->max_msg},
      {GRPC_ARG_KEEPALIVE_TIME_MS, OPT_MS(keepalive_ms, 30000)},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, OPT_MS(keepalive_timeout_ms, 10000)},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000},
      {GRPC_ARG_MAX_CONNECTION_IDLE_MS, OPT_MS(idle_ms, 300000)},
      {GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, OPT_MS(handshake_ms, 10000)},
      {GRPC_ARG_MAX_CONCURRENT_STREAMS, OPT_MS(max_streams, 1000)},
  };
#undef OPT_MS
  enum { NARGS = sizeof kv / sizeof kv[0] };
  grpc_arg args[NARGS + 1];
  memset(args, 0, sizeof args);
  for (size_t i = 0; i < NARGS; i++) {
    args[i].type = GRPC_ARG_INTEGER;
    args[i].key = (char *)kv[i].key;
    args[i].value.integer = kv[i].val;
  }
  /* All connections together get this much memory: past it gRPC refuses
   * new connections and streams rather than let a flood of them grow the
   * process. */
  grpc_resource_quota *quota = grpc_resource_quota_create("mega server");
  grpc_resource_quota_resize(quota, opts && opts->memory_bytes ? opts->memory_bytes : 512u << 20);
  args[NARGS].type = GRPC_ARG_POINTER;
  args[NARGS].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
  args[NARGS].value.pointer.p = quota;
  args[NARGS].value.pointer.vtable = grpc_resource_quota_arg_vtable();
  grpc_channel_args ca = {NARGS + 1, args};
  s->server = grpc_server_create(&ca, NULL);
  grpc_resource_quota_unref(quota); /* the server holds its own reference */
  grpc_server_register_completion_queue(s->server, mega_rpc_cq_raw(cq), NULL);
  *out = s;
  return MEGA_OK;
}

mega_status mega_rpc_server_handle(mega_rpc_server *s, const mega_rpc_method *m,
                                   mega_rpc_handler fn, void *data, mega_err *err) {
  if (s->started)
    return mega_fail(err, MEGA_ERR_INTERNAL, "handler for %s added after the server started",
                     m->path);
  if (!fn || !m->request || !m->response || !m->path || m->path[0] != '/')
    return mega_fail(err, MEGA_ERR_INVALID, "incomplete method table entry for %s",
                     m->path ? m->path : "(no path)");
  for (size_t i = 0; i < s->n_methods; i++)
    if (strcmp(s->methods[i].m->path, m->path) == 0)
      return mega_fail(err, MEGA_ERR_INVALID, "two handlers for %s", m->path);
  method_entry *me = realloc(s->methods, (s->n_methods + 1) * sizeof *me);
  if (!me) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory adding a handler");
  s->methods = me;
  void *reg = grpc_server_register_method(s->server, m->path, NULL,
                                          GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  if (!reg) return mega_fail(err, MEGA_ERR_INVALID, "gRPC refused to register %s", m->path);
  s->methods[s->n_methods++] = (method_entry){m, fn, data, reg, 0};
  return MEGA_OK;
}

size_t mega_rpc_server_served(const mega_rpc_server *s, size_t i, const char **path,
                              uint64_t *served) {
  if (i < s->n_methods) {
    *path = s->methods[i].m->path;
    *served = s->methods[i].served;
  }
  return s->n_methods;
}

mega_status mega_rpc_server_listen(mega_rpc_server *s, const char *addr, int *port,
                                   mega_err *err) {
  if (port) *port = 0;
  if (s->started)
    return mega_fail(err, MEGA_ERR_INTERNAL, "listen on %s after the server started", addr);
  mega_status st = mega_rpc_probe_listen(addr, err);
  if (st != MEGA_OK) return st;
  mega_rpc_auth a = {.tls_ca = s->tls_ca, .tls_cert = s->tls_cert, .tls_key = s->tls_key,
                     .tls_client_auth = s->tls_client_auth};
  grpc_server_credentials *creds = mega_rpc_server_creds(&a);
  int p = grpc_server_add_http2_port(s->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (p == 0)
    return mega_fail(err, MEGA_ERR_IO,
                     "cannot listen on %s: gRPC could not bind it (expected host:port or "
                     "unix:/path)",
                     addr);
  if (port) *port = strncmp(addr, "unix:", 5) == 0 ? 0 : p;
  return MEGA_OK;
}

mega_status mega_rpc_server_start(mega_rpc_server *s, mega_err *err) {
  if (s->started || s->shutting_down)
    return mega_fail(err, MEGA_ERR_INTERNAL, "server started twice");
  grpc_server_start(s->server);
  s->started = true;
  for (size_t i = 0; i < s->n_methods; i++) arm(s, &s->methods[i]);
  arm(s, NULL);
  return MEGA_OK;
}

static void on_shutdown(mega_rpc_tag *t, bool ok) {
  (void)ok;
  mega_rpc_server *s = MEGA_RPC_CONTAINER(t, mega_rpc_server, t_shutdown);
  s->shutdown_seen = true;
  maybe_finish_shutdown(s);
}

static void on_grace(uv_timer_t *h) {
  mega_rpc_server *s = MEGA_RPC_CONTAINER(h, mega_rpc_server, grace);
  grpc_server_cancel_all_calls(s->server);
}

static void on_grace_closed(uv_handle_t *h) {
  mega_rpc_server *s = MEGA_RPC_CONTAINER(h, mega_rpc_server, grace);
  void (*done)(void *) = s->done;
  void *arg = s->done_arg;
  grpc_server_destroy(s->server);
  free_server(s);
  mega_rpc_lib_unref();
  if (done) done(arg);
}

static void maybe_finish_shutdown(mega_rpc_server *s) {
  if (!s->shutting_down || !s->shutdown_seen || s->armed || s->live || s->finishing) return;
  s->finishing = true;
  uv_timer_stop(&s->grace);
  uv_close((uv_handle_t *)&s->grace, on_grace_closed);
}

void mega_rpc_server_shutdown(mega_rpc_server *s, unsigned grace_ms, void (*done)(void *arg),
                              void *arg) {
  if (!s || s->shutting_down) return;
  s->shutting_down = true;
  s->done = done;
  s->done_arg = arg;
  s->t_shutdown.fn = on_shutdown;
  grpc_server_shutdown_and_notify(s->server, mega_rpc_cq_raw(s->cq), &s->t_shutdown);
  if (grace_ms == 0) grpc_server_cancel_all_calls(s->server);
  else uv_timer_start(&s->grace, on_grace, grace_ms, 0);
}
