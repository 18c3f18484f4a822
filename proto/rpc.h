/* A small wrapper over gRPC core's C API, bridged into libuv. It knows
 * nothing of mega's services: a method is a path plus the protobuf-c
 * descriptors of its request and response, and whether the server streams.
 *
 *   rpc_bridge.h  the completion queue -> libuv bridge (mega_rpc_cq)
 *   rpc_server.h  a server: unary and server-streaming handlers
 *   rpc_client.h  a channel: blocking calls (megactl) and async calls (megad)
 *
 * Status codes keep gRPC's numbers, so callers need no gRPC header. */
#ifndef MEGA_PROTO_RPC_H
#define MEGA_PROTO_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <protobuf-c/protobuf-c.h>

#include "core/status.h"

typedef enum mega_rpc_kind {
  MEGA_RPC_UNARY,          /* one request, one response */
  MEGA_RPC_SERVER_STREAM,  /* one request, a stream of responses */
} mega_rpc_kind;

/* A method. protoc-c's ProtobufCMethodDescriptor forgets `stream`, so this
 * table is written by hand next to the .proto (see mega_rpc.c) and tested
 * against protoc-c's service descriptors and against protoc's view. */
typedef struct mega_rpc_method {
  const char *path;  /* "/mega.v1.Control/GetJob" */
  const ProtobufCMessageDescriptor *request;
  const ProtobufCMessageDescriptor *response;
  mega_rpc_kind kind;
} mega_rpc_method;

/* gRPC status codes, with gRPC's numbers. */
typedef enum mega_rpc_code {
  MEGA_RPC_OK = 0,
  MEGA_RPC_CANCELLED = 1,
  MEGA_RPC_UNKNOWN = 2,
  MEGA_RPC_INVALID_ARGUMENT = 3,
  MEGA_RPC_DEADLINE_EXCEEDED = 4,
  MEGA_RPC_NOT_FOUND = 5,
  MEGA_RPC_ALREADY_EXISTS = 6,
  MEGA_RPC_PERMISSION_DENIED = 7,
  MEGA_RPC_RESOURCE_EXHAUSTED = 8,
  MEGA_RPC_FAILED_PRECONDITION = 9,
  MEGA_RPC_ABORTED = 10,
  MEGA_RPC_OUT_OF_RANGE = 11,
  MEGA_RPC_UNIMPLEMENTED = 12,
  MEGA_RPC_INTERNAL = 13,
  MEGA_RPC_UNAVAILABLE = 14,
  MEGA_RPC_DATA_LOSS = 15,
  MEGA_RPC_UNAUTHENTICATED = 16,
} mega_rpc_code;

/* Largest message either side accepts unless told otherwise. gRPC's own
 * default (4 MiB) is too small for a big placement or a trace chunk. */
#define MEGA_RPC_MAX_MESSAGE_DEFAULT (64u << 20)

/* "NOT_FOUND", "UNAVAILABLE", ... */
const char *mega_rpc_code_name(mega_rpc_code code);

/* How a failure crosses the wire. Each mega status maps to a code that maps
 * back to it, except MEGA_ERR_IO, which a client sees as MEGA_ERR_INTERNAL
 * (the server's disk is not the client's I/O):
 *   INVALID <-> INVALID_ARGUMENT   NOT_FOUND <-> NOT_FOUND
 *   TIMEOUT <-> DEADLINE_EXCEEDED  CANCELLED <-> CANCELLED
 *   NOMEM <-> RESOURCE_EXHAUSTED   UNSUPPORTED <-> UNIMPLEMENTED
 *   PEER <-> ABORTED               INTERNAL, IO -> INTERNAL
 * Other codes arriving: ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE ->
 * INVALID; UNAVAILABLE, PERMISSION_DENIED, UNAUTHENTICATED, DATA_LOSS -> IO
 * (cannot reach or use the peer); UNKNOWN -> INTERNAL. */
mega_rpc_code mega_rpc_code_from_status(mega_status s);
mega_status mega_rpc_status_from_code(mega_rpc_code code);

/* "GetJob" from "/mega.v1.Control/GetJob" (a pointer into path). */
const char *mega_rpc_method_name(const mega_rpc_method *m);

/* At the end of main, after every queue, server and channel is gone: waits
 * (up to timeout_ms) until gRPC has let go of its own threads and memory.
 * gRPC may finish freeing objects on its internal threads after our last
 * reference, and a process that exits meanwhile looks leaky to valgrind.
 * Returns false on timeout. */
bool mega_rpc_wait_released(unsigned timeout_ms);

/* gRPC core logs through gpr_log to stderr. A program that wants those lines
 * elsewhere (the journal) installs fn; NULL drops them. The severity is 0
 * debug, 1 info, 2 error. Call it before any other mega_rpc_ function; it is
 * global to the process. */
typedef void (*mega_rpc_log_fn)(int severity, const char *file, int line, const char *msg);
void mega_rpc_set_log(mega_rpc_log_fn fn);

#endif
