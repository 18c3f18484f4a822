/* Shared by the rpc_*.c files; not part of the API. */
#ifndef MEGA_PROTO_RPC_INTERNAL_H
#define MEGA_PROTO_RPC_INTERNAL_H

#include <stdbool.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "proto/rpc.h"
#include "proto/rpc_auth.h"
#include "proto/rpc_bridge.h"

/* Every tag given to gRPC on a bridged queue points at one of these, embedded
 * in the object that waits for it; the bridge calls fn(tag, ok) on the loop
 * thread. */
typedef struct mega_rpc_tag mega_rpc_tag;
struct mega_rpc_tag {
  void (*fn)(mega_rpc_tag *tag, bool ok);
};

#define MEGA_RPC_CONTAINER(ptr, type, member) \
  ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

grpc_completion_queue *mega_rpc_cq_raw(const mega_rpc_cq *cq);

/* Packs msg into a new byte buffer (the caller destroys it). Fails when the
 * packed size exceeds max or msg is not of type want. */
mega_status mega_rpc_pack(const ProtobufCMessage *msg, const ProtobufCMessageDescriptor *want,
                          size_t max, grpc_byte_buffer **out, mega_err *err);

/* Unpacks bb as desc; NULL when the bytes do not parse. */
ProtobufCMessage *mega_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc);

/* timeout_ms from now on the monotonic clock; 0 means no deadline. */
gpr_timespec mega_rpc_deadline(unsigned timeout_ms);

/* grpc_init / grpc_shutdown, plus the log hook installed once. */
void mega_rpc_lib_ref(void);
void mega_rpc_lib_unref(void);

/* The sentence a client shows for a failed call. target and peer_name come
 * from the channel ("127.0.0.1:7070", "megad"); details is what arrived. */
mega_status mega_rpc_client_error(mega_err *err, mega_rpc_code code, const char *details,
                                  size_t details_len, const char *peer_name,
                                  const char *target, const mega_rpc_method *m,
                                  unsigned timeout_ms);

/* ---- rpc_listen.c ---- */

/* MEGA_OK when a server could listen on addr (a port 0, or an address it
 * cannot look up, is left to gRPC); else why not, in the user's words. */
mega_status mega_rpc_probe_listen(const char *addr, mega_err *err);

/* ---- rpc_auth.c ---- */

/* Credentials for a (may be NULL): insecure without TLS files, SSL with.
 * The caller releases them. */
grpc_server_credentials *mega_rpc_server_creds(const mega_rpc_auth *a);
grpc_channel_credentials *mega_rpc_channel_creds(const mega_rpc_auth *a);

/* "Bearer TOKEN" (malloc'd), or NULL for no token. */
char *mega_rpc_bearer(const char *token);

/* Whether md holds exactly one authorization entry equal to want (the
 * whole "Bearer TOKEN"), compared in constant time. */
bool mega_rpc_token_matches(const char *want, size_t want_len, const grpc_metadata_array *md);
bool mega_rpc_has_authorization(const grpc_metadata_array *md);

#endif
