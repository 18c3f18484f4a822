/* A gRPC server on a mega_rpc_cq: unary and server-streaming handlers that
 * may answer at once or much later, on the loop thread.
 *
 *   mega_rpc_server *srv;
 *   mega_rpc_server_new(cq, NULL, &srv, &err);
 *   mega_rpc_server_handle(srv, &mega_control_get_job, on_get_job, daemon, &err);
 *   mega_rpc_server_listen(srv, "127.0.0.1:7070", &port, &err);
 *   mega_rpc_server_start(srv, &err);
 *   ...
 *   mega_rpc_server_shutdown(srv, 2000, on_down, daemon);
 *
 * The call contract. A handler gets a mega_rpc_call and its request and
 * holds the call until it ends it with exactly one of mega_rpc_reply,
 * mega_rpc_fail, mega_rpc_fail_err or mega_rpc_finish, either inside the
 * handler or later from any loop callback. After ending it, it must not touch
 * the call or the request again. A call whose client cancels, or whose
 * deadline passes, or which the server's shutdown cancels, is still the
 * handler's to end: the cancel callback (mega_rpc_call_on_cancel) tells it
 * so, and ending a cancelled call only releases it. A handler that answers
 * later must set a cancel callback, or shutdown waits for its answer.
 *
 * Methods not given a handler, and paths the server does not know, get
 * the status UNIMPLEMENTED at once. With a token (opts.auth) every call
 * without it, known path or not, gets UNAUTHENTICATED before anything else.
 * With a peer token too, a path under opts.peer_prefix takes only the peer
 * token (the token gets PERMISSION_DENIED, naming the credential needed),
 * and every other path either token.
 * Every function here runs on the cq's loop thread. */
#ifndef MEGA_PROTO_RPC_SERVER_H
#define MEGA_PROTO_RPC_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/rpc.h"
#include "proto/rpc_auth.h"
#include "proto/rpc_bridge.h"

typedef struct mega_rpc_server mega_rpc_server;
typedef struct mega_rpc_call mega_rpc_call;

/* req is of type method->request, owned by the call, valid until the
 * handler ends the call. data is what mega_rpc_server_handle was given. */
typedef void (*mega_rpc_handler)(mega_rpc_call *call, const ProtobufCMessage *req, void *data);

/* Runs at most once, on the loop thread, when the call was cancelled before
 * the handler ended it. The handler still ends the call (here or later). */
typedef void (*mega_rpc_cancel_fn)(mega_rpc_call *call, void *arg);

/* A call refused before any handler saw it (no or a wrong token): peer is
 * the client's address, method its path. Runs on the loop thread; a
 * server logs it (rate-limited: a flood of bad calls must not flood the
 * log). */
typedef void (*mega_rpc_refused_fn)(void *arg, const char *peer, const char *method,
                                    const char *why);

typedef struct mega_rpc_server_opts {
  size_t max_message_bytes; /* 0: MEGA_RPC_MAX_MESSAGE_DEFAULT: what the server sends */
  size_t max_request_bytes; /* 0: max_message_bytes: the largest message a client may send */
  const mega_rpc_auth *auth; /* NULL: no token, plaintext. Copied. */
  const char *peer_prefix;   /* with auth->peer_token: the paths only it may call
                                ("/mega.v1.Peer/"); NULL: none. Copied. */
  mega_rpc_refused_fn on_refused; /* may be NULL */
  void *refused_arg;
  /* Connections: a client that is silent this long is pinged, and dropped
   * when the ping goes unanswered for keepalive_timeout_ms (half-open
   * connections); a connection with no call this long is closed; a
   * connection must finish its handshake within handshake_ms. 0: the
   * defaults (30 s, 10 s, 5 min, 10 s). */
  unsigned keepalive_ms, keepalive_timeout_ms, idle_ms, handshake_ms;
  unsigned max_streams; /* concurrent calls per connection; 0: 1000 */
  size_t memory_bytes;  /* memory every connection together may take; 0: 512 MiB */
} mega_rpc_server_opts;

/* opts may be NULL. The server posts its events to cq, which must outlive it. */
mega_status mega_rpc_server_new(mega_rpc_cq *cq, const mega_rpc_server_opts *opts,
                                mega_rpc_server **out, mega_err *err);

/* Before start. The method table entry must outlive the server. */
mega_status mega_rpc_server_handle(mega_rpc_server *srv, const mega_rpc_method *m,
                                   mega_rpc_handler fn, void *data, mega_err *err);

/* Before start; may be called more than once. addr is "host:port" (port 0
 * picks a free one) or "unix:/path". *port (may be NULL) gets the bound port
 * (0 for unix sockets). A taken address fails with a sentence such as
 * "cannot listen on 127.0.0.1:7070: address already in use". */
mega_status mega_rpc_server_listen(mega_rpc_server *srv, const char *addr, int *port,
                                   mega_err *err);

mega_status mega_rpc_server_start(mega_rpc_server *srv, mega_err *err);

/* Stops accepting calls, gives calls in flight grace_ms to end, then cancels
 * the rest (their cancel callbacks run). When gRPC has let go of every call,
 * the server is destroyed and freed and done(arg) runs (done may be NULL).
 * Also frees a server that never started. The loop must keep running. */
void mega_rpc_server_shutdown(mega_rpc_server *srv, unsigned grace_ms, void (*done)(void *arg),
                              void *arg);

/* Method i's path and how many calls went to its handler so far (a counter
 * for /metrics); returns how many methods have handlers (i past them sets
 * nothing). */
size_t mega_rpc_server_served(const mega_rpc_server *srv, size_t i, const char **path,
                              uint64_t *served);

/* ---- answering ---- */

/* Sends resp and ends the call with OK (unary, or a one-message stream). */
void mega_rpc_reply(mega_rpc_call *call, const ProtobufCMessage *resp);

/* Ends the call with code and a sentence for the user (code is not OK). */
void mega_rpc_fail(mega_rpc_call *call, mega_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Ends the call with err's status mapped to a code (rpc.h) and err's message. */
void mega_rpc_fail_err(mega_rpc_call *call, const mega_err *err);

/* Streams: queues one message. Messages go out in order, one in flight at a
 * time. Fails (the call stays the handler's to end) when the call was
 * cancelled or msg is too large or of the wrong type. */
mega_status mega_rpc_send(mega_rpc_call *call, const ProtobufCMessage *msg, mega_err *err);

/* Streams: ends the call with OK once the queued messages are out. */
void mega_rpc_finish(mega_rpc_call *call);

/* ---- about a call ---- */

/* Set it in the handler itself: a cancel that arrived before it was set is
 * not replayed (mega_rpc_call_cancelled still tells). */
void mega_rpc_call_on_cancel(mega_rpc_call *call, mega_rpc_cancel_fn fn, void *arg);
bool mega_rpc_call_cancelled(const mega_rpc_call *call);

/* Messages queued and not yet written: a slow watcher shows here. */
size_t mega_rpc_call_queued(const mega_rpc_call *call);

const mega_rpc_method *mega_rpc_call_method(const mega_rpc_call *call);

/* The client's address, e.g. "ipv4:127.0.0.1:51234"; owned by the call. */
const char *mega_rpc_call_peer(mega_rpc_call *call);

/* Milliseconds left before the client's deadline; -1 when it set none. */
int64_t mega_rpc_call_remaining_ms(const mega_rpc_call *call);

#endif
