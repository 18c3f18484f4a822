#include "proto/rpc_client.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "proto/rpc_internal.h"

struct mega_rpc_channel {
  grpc_channel *ch;
  char *target;
  char *peer_name;
  char *auth_hint;
  char *unreachable_hint; /* NULL: none */
  size_t max_msg;
  grpc_metadata md; /* authorization: Bearer TOKEN */
  grpc_metadata header[2]; /* opts->header_key: opts->header_value, header2 */
  int nheaders;
  bool has_token, tls;
  atomic_int refs;
};

/* The state of one client call, shared by the blocking and async forms. */
typedef struct ccall {
  mega_rpc_channel *ch;
  const mega_rpc_method *m;
  unsigned timeout_ms;
  grpc_call *call;
  grpc_metadata md[3]; /* the channel's token and headers; a copy per call, since
                          gRPC may write into a grpc_metadata while a call uses it */
  grpc_byte_buffer *send_bb;
  grpc_metadata_array md_initial, md_trailing;
  grpc_byte_buffer *recv_bb;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
} ccall;

static void channel_ref(mega_rpc_channel *ch) { atomic_fetch_add(&ch->refs, 1); }

static void channel_unref(mega_rpc_channel *ch) {
  if (atomic_fetch_sub(&ch->refs, 1) != 1) return;
  grpc_channel_destroy(ch->ch);
  if (ch->has_token) {
    grpc_slice_unref(ch->md.key);
    grpc_slice_unref(ch->md.value);
  }
  for (int i = 0; i < ch->nheaders; i++) {
    grpc_slice_unref(ch->header[i].key);
    grpc_slice_unref(ch->header[i].value);
  }
  free(ch->target);
  free(ch->peer_name);
  free(ch->auth_hint);
  free(ch->unreachable_hint);
  free(ch);
  mega_rpc_lib_unref();
}

mega_status mega_rpc_channel_new(const char *target, const mega_rpc_channel_opts *opts,
                                 mega_rpc_channel **out, mega_err *err) {
  *out = NULL;
  if (!target || !target[0])
    return mega_fail(err, MEGA_ERR_INVALID, "no address given (expected host:port or unix:/path)");
  mega_rpc_channel *ch = calloc(1, sizeof *ch);
  if (!ch) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating a channel");
  ch->target = strdup(target);
  ch->peer_name = strdup(opts && opts->peer_name ? opts->peer_name : "the server");
  ch->auth_hint = strdup(opts && opts->auth_hint ? opts->auth_hint : "give it the cluster token");
  bool hint = opts && opts->unreachable_hint;
  ch->unreachable_hint = hint ? strdup(opts->unreachable_hint) : NULL;
  const mega_rpc_auth *a = opts ? opts->auth : NULL;
  char *bearer = a ? mega_rpc_bearer(a->token) : NULL;
  if (!ch->target || !ch->peer_name || !ch->auth_hint || (hint && !ch->unreachable_hint) ||
      (a && a->token && a->token[0] && !bearer)) {
    free(ch->target);
    free(ch->peer_name);
    free(ch->auth_hint);
    free(ch->unreachable_hint);
    free(bearer);
    free(ch);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating a channel");
  }
  mega_rpc_lib_ref(); /* slices need the library */
  if (bearer) {
    ch->md.key = grpc_slice_from_static_string("authorization");
    ch->md.value = grpc_slice_from_copied_string(bearer);
    ch->has_token = true;
    free(bearer);
  }
  const char *hk[2] = {opts ? opts->header_key : NULL, opts ? opts->header2_key : NULL};
  const char *hv[2] = {opts ? opts->header_value : NULL, opts ? opts->header2_value : NULL};
  for (int i = 0; i < 2; i++)
    if (hk[i] && hv[i]) {
      ch->header[ch->nheaders].key = grpc_slice_from_copied_string(hk[i]);
      ch->header[ch->nheaders].value = grpc_slice_from_copied_string(hv[i]);
      ch->nheaders++;
    }
  ch->tls = a && a->tls_ca;
  ch->max_msg = opts && opts->max_message_bytes ? opts->max_message_bytes
                                                : MEGA_RPC_MAX_MESSAGE_DEFAULT;
  if (ch->max_msg > INT_MAX) ch->max_msg = INT_MAX;
  unsigned backoff = opts && opts->max_backoff_ms ? opts->max_backoff_ms : 2000;
  atomic_init(&ch->refs, 1);
  grpc_arg args[5];
  memset(args, 0, sizeof args);
  const char *keys[5] = {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                         GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                         GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                         GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL};
  int vals[5] = {(int)ch->max_msg, (int)ch->max_msg, (int)(backoff > INT_MAX ? INT_MAX : backoff),
                 (int)(backoff < 100 ? backoff : 100), 1};
  size_t nargs = opts && opts->own_connection ? 5 : 4;
  for (size_t i = 0; i < nargs; i++) {
    args[i].type = GRPC_ARG_INTEGER;
    args[i].key = (char *)keys[i];
    args[i].value.integer = vals[i];
  }
  grpc_channel_args ca = {nargs, args};
  grpc_channel_credentials *creds = mega_rpc_channel_creds(a);
  ch->ch = grpc_channel_create(target, creds, &ca);
  grpc_channel_credentials_release(creds);
  *out = ch;
  return MEGA_OK;
}

void mega_rpc_channel_free(mega_rpc_channel *ch) {
  if (ch) channel_unref(ch);
}

const char *mega_rpc_channel_target(const mega_rpc_channel *ch) { return ch->target; }

/* ---- one call ---- */

static mega_status ccall_create(ccall *c, mega_rpc_channel *ch, const mega_rpc_method *m,
                                mega_rpc_kind kind, const ProtobufCMessage *req,
                                unsigned timeout_ms, grpc_completion_queue *cq, mega_err *err) {
  memset(c, 0, sizeof *c);
  c->details = grpc_empty_slice();
  grpc_metadata_array_init(&c->md_initial);
  grpc_metadata_array_init(&c->md_trailing);
  if (m->kind != kind)
    return mega_fail(err, MEGA_ERR_INTERNAL, "%s is %s streaming call", m->path,
                     kind == MEGA_RPC_UNARY ? "a" : "not a");
  mega_status st = mega_rpc_pack(req, m->request, ch->max_msg, &c->send_bb, err);
  if (st != MEGA_OK) return st;
  channel_ref(ch);
  c->ch = ch;
  c->m = m;
  c->timeout_ms = timeout_ms;
  c->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                     grpc_slice_from_static_string(m->path), NULL,
                                     mega_rpc_deadline(timeout_ms), NULL);
  return MEGA_OK;
}

static void ccall_destroy(ccall *c) {
  if (c->call) grpc_call_unref(c->call);
  if (c->send_bb) grpc_byte_buffer_destroy(c->send_bb);
  if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
  grpc_metadata_array_destroy(&c->md_initial);
  grpc_metadata_array_destroy(&c->md_trailing);
  grpc_slice_unref(c->details);
  gpr_free((void *)c->error_string);
  if (c->ch) channel_unref(c->ch);
}

/* The send half and the initial metadata, which every call posts first. */
static size_t send_ops(ccall *c, grpc_op *ops) {
  memset(ops, 0, 6 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  size_t n = 0; /* the slices stay the channel's, which outlives the call */
  if (c->ch->has_token) c->md[n++] = c->ch->md;
  for (int i = 0; i < c->ch->nheaders; i++) c->md[n++] = c->ch->header[i];
  ops[0].data.send_initial_metadata.count = n;
  ops[0].data.send_initial_metadata.metadata = n ? c->md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = c->send_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_initial;
  return 4;
}

static void status_op(ccall *c, grpc_op *op) {
  memset(op, 0, sizeof *op);
  op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op->data.recv_status_on_client.trailing_metadata = &c->md_trailing;
  op->data.recv_status_on_client.status = &c->status;
  op->data.recv_status_on_client.status_details = &c->details;
  op->data.recv_status_on_client.error_string = &c->error_string;
}

static void message_op(ccall *c, grpc_op *op) {
  memset(op, 0, sizeof *op);
  op->op = GRPC_OP_RECV_MESSAGE;
  op->data.recv_message.recv_message = &c->recv_bb;
}

/* The call's outcome once its status arrived. */
static mega_status ccall_result(const ccall *c, mega_err *err) {
  if (c->status == GRPC_STATUS_OK) return MEGA_OK;
  const char *d = (const char *)GRPC_SLICE_START_PTR(c->details);
  size_t n = GRPC_SLICE_LENGTH(c->details);
  char both[MEGA_ERR_MSG_MAX];
  if (c->status == GRPC_STATUS_UNAVAILABLE && c->error_string) {
    /* The reason ("Connection refused") may be only in the debug string. */
    snprintf(both, sizeof both, "%.*s\n%s", (int)n, d, c->error_string);
    d = both;
    n = strlen(both);
  }
  if (c->status == GRPC_STATUS_UNAUTHENTICATED) {
    if (!c->ch->has_token)
      return mega_fail(err, MEGA_ERR_IO, "%s requires a token: %s", c->ch->peer_name,
                       c->ch->auth_hint);
    size_t k = 0; /* the server's reason is what comes before its first colon */
    while (k < n && d[k] != ':') k++;
    return mega_fail(err, MEGA_ERR_IO, "%s at %s refused the token (%.*s): %s",
                     c->ch->peer_name, c->ch->target, (int)k, d, c->ch->auth_hint);
  }
  if (c->status == GRPC_STATUS_PERMISSION_DENIED) /* a token that this method does not take */
    return mega_fail(err, MEGA_ERR_IO, "%s at %s denied %s (PERMISSION_DENIED): %.*s",
                     c->ch->peer_name, c->ch->target, mega_rpc_method_name(c->m), (int)n, d);
  mega_status st = mega_rpc_client_error(err, (mega_rpc_code)c->status, d, n, c->ch->peer_name,
                                         c->ch->target, c->m, c->timeout_ms);
  if (err && c->ch->unreachable_hint && c->status == GRPC_STATUS_UNAVAILABLE &&
      !strncmp(err->msg, "cannot reach ", 13)) {
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof err->msg - len, "; %s", c->ch->unreachable_hint);
  }
  /* A TLS server closes a plaintext connection without a word, before the
   * connection is made; a server that dies mid-call closes it too, but
   * after ("failed to connect" is core's word for the first). */
  if (err && !c->ch->tls && c->status == GRPC_STATUS_UNAVAILABLE &&
      strstr(err->msg, "the connection closed") && c->error_string &&
      strcasestr(c->error_string, "failed to connect")) {
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof err->msg - len, " (if %s uses TLS, pass --tls-ca)",
             c->ch->peer_name);
  }
  return st;
}

/* Takes the received message as m->response; NULL (and err) if it does not parse. */
static ProtobufCMessage *ccall_take(ccall *c, mega_err *err) {
  ProtobufCMessage *msg = mega_rpc_unpack(c->recv_bb, c->m->response);
  grpc_byte_buffer_destroy(c->recv_bb);
  c->recv_bb = NULL;
  if (!msg)
    mega_fail(err, MEGA_ERR_PEER, "%s at %s answered %s with bytes that are not a valid %s",
              c->ch->peer_name, c->ch->target, mega_rpc_method_name(c->m), c->m->response->name);
  return msg;
}

static mega_status batch_failed(mega_err *err, const mega_rpc_method *m, grpc_call_error e) {
  return mega_fail(err, MEGA_ERR_INTERNAL, "gRPC refused to start %s (call error %d)", m->path,
                   (int)e);
}

/* ---- blocking ---- */

static void pluck(grpc_completion_queue *cq, void *tag) {
  grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
}

static void cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
}

mega_status mega_rpc_unary(mega_rpc_channel *ch, const mega_rpc_method *m,
                           const ProtobufCMessage *req, unsigned timeout_ms,
                           ProtobufCMessage **resp, mega_err *err) {
  *resp = NULL;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  ccall c;
  mega_status st = ccall_create(&c, ch, m, MEGA_RPC_UNARY, req, timeout_ms, cq, err);
  if (st == MEGA_OK) {
    grpc_op ops[6];
    size_t n = send_ops(&c, ops);
    message_op(&c, &ops[n++]);
    status_op(&c, &ops[n++]);
    grpc_call_error e = grpc_call_start_batch(c.call, ops, n, &c, NULL);
    if (e != GRPC_CALL_OK) {
      st = batch_failed(err, m, e);
    } else {
      pluck(cq, &c);
      st = ccall_result(&c, err);
      if (st == MEGA_OK && !c.recv_bb)
        st = mega_fail(err, MEGA_ERR_PEER, "%s at %s answered %s without a message",
                       ch->peer_name, ch->target, mega_rpc_method_name(m));
      if (st == MEGA_OK && !(*resp = ccall_take(&c, err))) st = MEGA_ERR_PEER;
    }
  }
  ccall_destroy(&c);
  cq_destroy(cq);
  return st;
}

struct mega_rpc_stream {
  ccall c;
  grpc_completion_queue *cq;
  char tag_send, tag_status, tag_msg; /* their addresses are the tags */
  bool send_pending, status_pending, msg_pending, ended;
  mega_err result;
};

mega_status mega_rpc_stream_open(mega_rpc_channel *ch, const mega_rpc_method *m,
                                 const ProtobufCMessage *req, unsigned timeout_ms,
                                 mega_rpc_stream **out, mega_err *err) {
  *out = NULL;
  mega_rpc_stream *s = calloc(1, sizeof *s);
  if (!s) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening a stream");
  s->cq = grpc_completion_queue_create_for_pluck(NULL);
  mega_status st = ccall_create(&s->c, ch, m, MEGA_RPC_SERVER_STREAM, req, timeout_ms, s->cq, err);
  grpc_op ops[6];
  if (st == MEGA_OK) {
    size_t n = send_ops(&s->c, ops);
    grpc_call_error e = grpc_call_start_batch(s->c.call, ops, n, &s->tag_send, NULL);
    if (e != GRPC_CALL_OK) st = batch_failed(err, m, e);
    else s->send_pending = true;
  }
  if (st == MEGA_OK) {
    status_op(&s->c, &ops[0]);
    grpc_call_error e = grpc_call_start_batch(s->c.call, ops, 1, &s->tag_status, NULL);
    if (e != GRPC_CALL_OK) st = batch_failed(err, m, e);
    else s->status_pending = true;
  }
  if (st != MEGA_OK) {
    mega_rpc_stream_close(s);
    return st;
  }
  *out = s;
  return MEGA_OK;
}

static mega_status stream_end(mega_rpc_stream *s, mega_err *err) {
  if (s->status_pending) {
    pluck(s->cq, &s->tag_status);
    s->status_pending = false;
    if (s->result.status == MEGA_OK) ccall_result(&s->c, &s->result);
  }
  s->ended = true;
  if (err) *err = s->result;
  return s->result.status;
}

mega_status mega_rpc_stream_next(mega_rpc_stream *s, ProtobufCMessage **msg, mega_err *err) {
  *msg = NULL;
  if (s->ended) {
    if (err) *err = s->result;
    return s->result.status;
  }
  grpc_op op;
  message_op(&s->c, &op);
  grpc_call_error e = grpc_call_start_batch(s->c.call, &op, 1, &s->tag_msg, NULL);
  if (e != GRPC_CALL_OK) {
    batch_failed(&s->result, s->c.m, e);
    grpc_call_cancel(s->c.call, NULL);
    return stream_end(s, err);
  }
  pluck(s->cq, &s->tag_msg);
  if (!s->c.recv_bb) return stream_end(s, err); /* the server ended the stream */
  *msg = ccall_take(&s->c, &s->result);
  if (!*msg) { /* garbage from the server: stop the stream, keep that reason */
    grpc_call_cancel(s->c.call, NULL);
    return stream_end(s, err);
  }
  return MEGA_OK;
}

void mega_rpc_stream_close(mega_rpc_stream *s) {
  if (!s) return;
  if (s->c.call && (s->status_pending || s->send_pending)) grpc_call_cancel(s->c.call, NULL);
  if (s->send_pending) pluck(s->cq, &s->tag_send);
  if (s->status_pending) pluck(s->cq, &s->tag_status);
  ccall_destroy(&s->c);
  cq_destroy(s->cq);
  free(s);
}

/* ---- async ---- */

struct mega_rpc_pending {
  ccall c;
  mega_rpc_cq *cq;
  mega_rpc_tag t_send, t_status, t_msg;
  int refs; /* one per batch in flight */
  bool stream;
  bool cancelled; /* by mega_rpc_pending_cancel: no read is posted again */
  mega_rpc_reply_fn done;
  mega_rpc_item_fn on_item;
  mega_rpc_end_fn on_end;
  void *arg;
  ProtobufCMessage *resp;
  mega_err local; /* a failure seen here (garbage), which wins over the status */
};

static void pending_finish(mega_rpc_pending *p) {
  mega_err e = {0};
  mega_status st = p->local.status;
  if (st != MEGA_OK) e = p->local;
  else st = ccall_result(&p->c, &e);
  if (!p->stream && st == MEGA_OK && !p->c.recv_bb)
    st = mega_fail(&e, MEGA_ERR_PEER, "%s at %s answered %s without a message",
                   p->c.ch->peer_name, p->c.ch->target, mega_rpc_method_name(p->c.m));
  if (!p->stream && st == MEGA_OK) {
    p->resp = ccall_take(&p->c, &e);
    if (!p->resp) st = MEGA_ERR_PEER;
  }
  e.status = st;
  if (p->stream) {
    if (p->on_end) p->on_end(p->arg, &e);
  } else if (p->done) {
    p->done(p->arg, p->resp, &e);
  } else if (p->resp) {
    protobuf_c_message_free_unpacked(p->resp, NULL);
  }
  ccall_destroy(&p->c);
  free(p);
}

static void pending_unref(mega_rpc_pending *p) {
  if (--p->refs == 0) pending_finish(p);
}

static void on_unary_done(mega_rpc_tag *t, bool ok) {
  mega_rpc_pending *p = MEGA_RPC_CONTAINER(t, mega_rpc_pending, t_send);
  if (!ok && p->local.status == MEGA_OK)
    mega_fail(&p->local, MEGA_ERR_INTERNAL, "gRPC failed the batch of %s", p->c.m->path);
  pending_unref(p);
}

static void on_stream_send(mega_rpc_tag *t, bool ok) {
  (void)ok; /* a failed send shows in the status */
  pending_unref(MEGA_RPC_CONTAINER(t, mega_rpc_pending, t_send));
}

static void on_stream_status(mega_rpc_tag *t, bool ok) {
  (void)ok;
  pending_unref(MEGA_RPC_CONTAINER(t, mega_rpc_pending, t_status));
}

static void post_read(mega_rpc_pending *p) {
  grpc_op op;
  message_op(&p->c, &op);
  p->refs++;
  if (grpc_call_start_batch(p->c.call, &op, 1, &p->t_msg, NULL) != GRPC_CALL_OK) {
    p->refs--;
    if (p->local.status == MEGA_OK)
      mega_fail(&p->local, MEGA_ERR_INTERNAL, "gRPC refused a read on %s", p->c.m->path);
    grpc_call_cancel(p->c.call, NULL);
  }
}

static void on_stream_msg(mega_rpc_tag *t, bool ok) {
  mega_rpc_pending *p = MEGA_RPC_CONTAINER(t, mega_rpc_pending, t_msg);
  if (ok && p->c.recv_bb) {
    ProtobufCMessage *msg = ccall_take(&p->c, &p->local);
    if (msg) {
      if (p->on_item) p->on_item(p->arg, msg);
      else protobuf_c_message_free_unpacked(msg, NULL);
    }
    /* A message can arrive after the call was cancelled and its queue
     * closed (a client freed at shutdown): its status may already be in,
     * leaving gRPC nothing pending, and a read started then aborts the
     * process. Such a call only ends, through its status batch. */
    if (msg && !p->cancelled && !mega_rpc_cq_closing(p->cq)) post_read(p);
    else grpc_call_cancel(p->c.call, NULL);
  }
  pending_unref(p);
}

/* p arrives with its callbacks set; on failure it is freed (or, past the
 * point of no return, left to its in-flight batch with the callbacks off). */
static mega_status start_async(mega_rpc_pending *p, mega_rpc_channel *ch, mega_rpc_cq *cq,
                               const mega_rpc_method *m, const ProtobufCMessage *req,
                               unsigned timeout_ms, mega_rpc_pending **out, mega_err *err) {
  bool stream = p->stream;
  if (mega_rpc_cq_closing(cq)) { /* gRPC would abort on a batch there */
    free(p);
    return mega_fail(err, MEGA_ERR_CANCELLED, "%s not started: its completion queue is closing "
                     "(the process is shutting down)", m->path);
  }
  p->cq = cq;
  mega_status st = ccall_create(&p->c, ch, m, stream ? MEGA_RPC_SERVER_STREAM : MEGA_RPC_UNARY,
                                req, timeout_ms, mega_rpc_cq_raw(cq), err);
  grpc_op ops[6];
  grpc_call_error e = GRPC_CALL_OK;
  if (st == MEGA_OK) {
    size_t n = send_ops(&p->c, ops);
    if (!stream) {
      message_op(&p->c, &ops[n++]);
      status_op(&p->c, &ops[n++]);
    }
    p->t_send.fn = stream ? on_stream_send : on_unary_done;
    e = grpc_call_start_batch(p->c.call, ops, n, &p->t_send, NULL);
    if (e == GRPC_CALL_OK) p->refs++;
  }
  if (st == MEGA_OK && e == GRPC_CALL_OK && stream) {
    status_op(&p->c, &ops[0]);
    p->t_status.fn = on_stream_status;
    p->t_msg.fn = on_stream_msg;
    e = grpc_call_start_batch(p->c.call, ops, 1, &p->t_status, NULL);
    if (e == GRPC_CALL_OK) {
      p->refs++;
      post_read(p);
    } else {
      /* The send batch is in flight: cancel, and let its return free p. */
      grpc_call_cancel(p->c.call, NULL);
      p->on_end = NULL;
      p->on_item = NULL;
      return batch_failed(err, m, e);
    }
  }
  if (st == MEGA_OK && e != GRPC_CALL_OK) st = batch_failed(err, m, e);
  if (st != MEGA_OK) {
    ccall_destroy(&p->c);
    free(p);
    return st;
  }
  if (out) *out = p;
  return MEGA_OK;
}

mega_status mega_rpc_unary_async(mega_rpc_channel *ch, mega_rpc_cq *cq, const mega_rpc_method *m,
                                 const ProtobufCMessage *req, unsigned timeout_ms,
                                 mega_rpc_reply_fn done, void *arg, mega_rpc_pending **handle,
                                 mega_err *err) {
  if (handle) *handle = NULL;
  mega_rpc_pending *p = calloc(1, sizeof *p);
  if (!p) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory starting %s", m->path);
  p->done = done;
  p->arg = arg;
  return start_async(p, ch, cq, m, req, timeout_ms, handle, err);
}

mega_status mega_rpc_stream_async(mega_rpc_channel *ch, mega_rpc_cq *cq,
                                  const mega_rpc_method *m, const ProtobufCMessage *req,
                                  unsigned timeout_ms, mega_rpc_item_fn on_item,
                                  mega_rpc_end_fn on_end, void *arg, mega_rpc_pending **handle,
                                  mega_err *err) {
  if (handle) *handle = NULL;
  mega_rpc_pending *p = calloc(1, sizeof *p);
  if (!p) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory starting %s", m->path);
  p->stream = true;
  p->on_item = on_item;
  p->on_end = on_end;
  p->arg = arg;
  return start_async(p, ch, cq, m, req, timeout_ms, handle, err);
}

void mega_rpc_pending_cancel(mega_rpc_pending *p) {
  if (!p) return;
  p->cancelled = true;
  grpc_call_cancel(p->c.call, NULL);
}
