/* The client side: a channel to one server, and calls on it in two forms.
 *
 * Blocking (megactl; each call has its own completion queue):
 *
 *   mega_rpc_channel *ch;
 *   mega_rpc_channel_new("127.0.0.1:7070", &(mega_rpc_channel_opts){.peer_name = "megad"},
 *                        &ch, &err);
 *   Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
 *   req.job_id = "j-1";
 *   ProtobufCMessage *resp;
 *   if (mega_rpc_unary(ch, &mega_control_get_job, &req.base, 5000, &resp, &err) != MEGA_OK)
 *     ... err.msg is e.g. "cannot reach megad at 127.0.0.1:7070: connection refused"
 *   protobuf_c_message_free_unpacked(resp, NULL);
 *
 * Async (megad calling peers from its loop; callbacks run on the loop
 * thread through the mega_rpc_cq bridge): mega_rpc_unary_async and
 * mega_rpc_stream_async.
 *
 * Threads: a channel may be shared; blocking calls may run on any thread
 * (never on a loop thread that must keep running meanwhile); async calls are
 * started, cancelled and called back on their cq's loop thread.
 *
 * Every response message handed to the caller is the caller's to free with
 * protobuf_c_message_free_unpacked(msg, NULL). Errors come as a mega_status
 * plus a sentence; the mapping from gRPC codes is in rpc.h. */
#ifndef MEGA_PROTO_RPC_CLIENT_H
#define MEGA_PROTO_RPC_CLIENT_H

#include "proto/rpc.h"
#include "proto/rpc_auth.h"
#include "proto/rpc_bridge.h"

typedef struct mega_rpc_channel mega_rpc_channel;

typedef struct mega_rpc_channel_opts {
  const char *peer_name;         /* for messages: "megad"; NULL: "the server" */
  size_t max_message_bytes;      /* 0: MEGA_RPC_MAX_MESSAGE_DEFAULT */
  unsigned max_backoff_ms;       /* reconnect backoff cap; 0: 2000, so a restarted
                                    peer is seen again within seconds */
  const mega_rpc_auth *auth;     /* the token every call carries, and TLS (rpc_auth.h);
                                    NULL: none, plaintext. Copied. */
  const char *auth_hint;         /* how to give a token, for UNAUTHENTICATED's message:
                                    "pass --token-file or set MEGA_TOKEN_FILE" */
  const char *unreachable_hint;  /* what to do when nothing answers at the target, added
                                    to "cannot reach ..."; NULL: nothing. Copied. */
  const char *header_key, *header_value; /* one more metadata entry every call carries
                                    (lowercase key; etcd's "hasleader": "true"); NULL:
                                    none. Copied. */
  const char *header2_key, *header2_value; /* and another (etcd's "token"); NULL: none */
  bool own_connection;           /* a connection of its own, not shared with other channels
                                    to the same target (gRPC shares them by default): a
                                    load generator that plays many nodes in one process */
} mega_rpc_channel_opts;

/* target is "host:port" or "unix:/path". Connects lazily: a wrong or dead
 * target shows in the first call's error. opts may be NULL. */
mega_status mega_rpc_channel_new(const char *target, const mega_rpc_channel_opts *opts,
                                 mega_rpc_channel **out, mega_err *err);

/* Drops the caller's reference; async calls in flight keep the channel
 * until they call back. */
void mega_rpc_channel_free(mega_rpc_channel *ch);

const char *mega_rpc_channel_target(const mega_rpc_channel *ch);

/* ---- blocking ---- */

/* One unary call. timeout_ms 0 means no deadline. On MEGA_OK *resp is a
 * message of type m->response; otherwise it is NULL and err says why. */
mega_status mega_rpc_unary(mega_rpc_channel *ch, const mega_rpc_method *m,
                           const ProtobufCMessage *req, unsigned timeout_ms,
                           ProtobufCMessage **resp, mega_err *err);

typedef struct mega_rpc_stream mega_rpc_stream;

/* Starts a server-streaming call; the deadline covers the whole stream. */
mega_status mega_rpc_stream_open(mega_rpc_channel *ch, const mega_rpc_method *m,
                                 const ProtobufCMessage *req, unsigned timeout_ms,
                                 mega_rpc_stream **out, mega_err *err);

/* Waits for the next message. *msg is NULL with MEGA_OK at the stream's
 * clean end; an error status means the stream failed (or was cancelled).
 * After the end or an error, further calls repeat the same result. */
mega_status mega_rpc_stream_next(mega_rpc_stream *s, ProtobufCMessage **msg, mega_err *err);

/* Cancels the stream if it has not ended, and frees it. */
void mega_rpc_stream_close(mega_rpc_stream *s);

/* ---- async, on a bridged queue ---- */

typedef struct mega_rpc_pending mega_rpc_pending;

/* Unary result: resp (the callee's) on success with err->status MEGA_OK;
 * NULL and err set otherwise. err is valid only during the callback. */
typedef void (*mega_rpc_reply_fn)(void *arg, ProtobufCMessage *resp, const mega_err *err);

/* Stream item (the callee's) and stream end (MEGA_OK when the server ended
 * the stream with OK). */
typedef void (*mega_rpc_item_fn)(void *arg, ProtobufCMessage *msg);
typedef void (*mega_rpc_end_fn)(void *arg, const mega_err *err);

/* Starts a unary call whose result arrives through done on cq's loop thread.
 * *handle (may be NULL) identifies it for mega_rpc_pending_cancel until done
 * runs. On a non-OK return nothing was started and done never runs. */
mega_status mega_rpc_unary_async(mega_rpc_channel *ch, mega_rpc_cq *cq, const mega_rpc_method *m,
                                 const ProtobufCMessage *req, unsigned timeout_ms,
                                 mega_rpc_reply_fn done, void *arg, mega_rpc_pending **handle,
                                 mega_err *err);

/* Starts a server-streaming call: on_item for each message, in order, then
 * on_end exactly once. The same rules for handle and a non-OK return. */
mega_status mega_rpc_stream_async(mega_rpc_channel *ch, mega_rpc_cq *cq,
                                  const mega_rpc_method *m, const ProtobufCMessage *req,
                                  unsigned timeout_ms, mega_rpc_item_fn on_item,
                                  mega_rpc_end_fn on_end, void *arg, mega_rpc_pending **handle,
                                  mega_err *err);

/* Cancels a call that has not called back yet; its callback still runs, with
 * MEGA_ERR_CANCELLED unless the answer was already there. */
void mega_rpc_pending_cancel(mega_rpc_pending *p);

#endif
