#include "proto/rpc_internal.h"

#include <stdio.h>
#include <string.h>

const char *mega_rpc_code_name(mega_rpc_code code) {
  static const char *const names[] = {
      "OK",        "CANCELLED",         "UNKNOWN",       "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",     "UNAVAILABLE",   "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
  return "UNKNOWN";
}

mega_rpc_code mega_rpc_code_from_status(mega_status s) {
  switch (s) {
  case MEGA_OK: return MEGA_RPC_OK;
  case MEGA_ERR_INVALID: return MEGA_RPC_INVALID_ARGUMENT;
  case MEGA_ERR_NOMEM: return MEGA_RPC_RESOURCE_EXHAUSTED;
  case MEGA_ERR_IO: return MEGA_RPC_INTERNAL;
  case MEGA_ERR_NOT_FOUND: return MEGA_RPC_NOT_FOUND;
  case MEGA_ERR_TIMEOUT: return MEGA_RPC_DEADLINE_EXCEEDED;
  case MEGA_ERR_PEER: return MEGA_RPC_ABORTED;
  case MEGA_ERR_UNSUPPORTED: return MEGA_RPC_UNIMPLEMENTED;
  case MEGA_ERR_CANCELLED: return MEGA_RPC_CANCELLED;
  case MEGA_ERR_INTERNAL: return MEGA_RPC_INTERNAL;
  }
  return MEGA_RPC_UNKNOWN;
}

mega_status mega_rpc_status_from_code(mega_rpc_code code) {
  switch (code) {
  case MEGA_RPC_OK: return MEGA_OK;
  case MEGA_RPC_CANCELLED: return MEGA_ERR_CANCELLED;
  case MEGA_RPC_INVALID_ARGUMENT:
  case MEGA_RPC_ALREADY_EXISTS:
  case MEGA_RPC_FAILED_PRECONDITION:
  case MEGA_RPC_OUT_OF_RANGE: return MEGA_ERR_INVALID;
  case MEGA_RPC_DEADLINE_EXCEEDED: return MEGA_ERR_TIMEOUT;
  case MEGA_RPC_NOT_FOUND: return MEGA_ERR_NOT_FOUND;
  case MEGA_RPC_RESOURCE_EXHAUSTED: return MEGA_ERR_NOMEM;
  case MEGA_RPC_ABORTED: return MEGA_ERR_PEER;
  case MEGA_RPC_UNIMPLEMENTED: return MEGA_ERR_UNSUPPORTED;
  case MEGA_RPC_UNAVAILABLE:
  case MEGA_RPC_PERMISSION_DENIED:
  case MEGA_RPC_UNAUTHENTICATED:
  case MEGA_RPC_DATA_LOSS: return MEGA_ERR_IO;
  case MEGA_RPC_UNKNOWN:
  case MEGA_RPC_INTERNAL: return MEGA_ERR_INTERNAL;
  }
  return MEGA_ERR_INTERNAL;
}

/* Core's UNAVAILABLE details are long ("failed to connect to all addresses;
 * last error: UNKNOWN: ipv4:127.0.0.1:7070: Failed to connect to remote host:
 * Connection refused"); users need the last words. d may hold a second line,
 * core's debug string, searched for a known reason too. */
static const char *unavailable_reason(const char *d, char *buf, size_t n) {
  static const struct {
    const char *needle, *reason;
  } known[] = {
      {"connection refused", "connection refused"},
      {"handshake", "the TLS handshake failed (is --tls-ca the CA that signed the server's "
                    "certificate, and does the server use TLS?)"},
      {"ssl", "the TLS handshake failed (is --tls-ca the CA that signed the server's "
              "certificate, and does the server use TLS?)"},
      {"no such file", "no such socket"},
      {"connection reset", "connection reset by peer"},
      {"broken pipe", "the connection broke"},
      {"socket closed", "the connection closed"},
      {"failed parsing http/2", "what answers there does not speak gRPC"},
      {"http1.x server", "what answers there does not speak gRPC"},
      {"dns resolution failed", "cannot resolve the host name"},
      {"name resolution", "cannot resolve the host name"},
      {"network is unreachable", "network is unreachable"},
      {"no route to host", "no route to host"},
      {"timed out", "connecting timed out"},
      {"shutdown", "the server is shutting down"},
      {"goaway", "the server is shutting down"},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcasestr(d, known[i].needle)) return known[i].reason;
  /* Unknown: the last clause of the first line. */
  size_t len = strcspn(d, "\n");
  const char *start = d;
  for (const char *p = d; p + 1 < d + len; p++)
    if (p[0] == ':' && p[1] == ' ') start = p + 2;
  snprintf(buf, n, "%.*s", (int)(d + len - start), start);
  if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z')) buf[0] += 'a' - 'A';
  return buf[0] ? buf : "unavailable";
}

mega_status mega_rpc_client_error(mega_err *err, mega_rpc_code code, const char *details,
                                  size_t details_len, const char *peer_name,
                                  const char *target, const mega_rpc_method *m,
                                  unsigned timeout_ms) {
  char d[MEGA_ERR_MSG_MAX];
  size_t n = details_len < sizeof d - 1 ? details_len : sizeof d - 1;
  if (details && n) memcpy(d, details, n);
  d[details ? n : 0] = '\0';
  mega_status s = mega_rpc_status_from_code(code);
  const char *who = peer_name && peer_name[0] ? peer_name : "the server";
  const char *method = mega_rpc_method_name(m);

  /* Something answered HTTP, but not gRPC (a proxy, a web server). */
  const char *http = strcasestr(d, "http2 header with status: ");
  if (http)
    return mega_fail(err, s, "%s at %s is not a gRPC server (it answered HTTP status %s)", who,
                     target, http + strlen("http2 header with status: "));

  switch (code) {
  case MEGA_RPC_UNAVAILABLE: {
    char reason[MEGA_ERR_MSG_MAX];
    return mega_fail(err, s, "cannot reach %s at %s: %s", who, target,
                     unavailable_reason(d, reason, sizeof reason));
  }
  case MEGA_RPC_DEADLINE_EXCEEDED:
    /* Core's own deadline says just this; a server's message says more. */
    if (!d[0] || strcmp(d, "Deadline Exceeded") == 0)
      return mega_fail(err, s, "%s at %s did not answer %s within %.1f s", who, target, method,
                       timeout_ms / 1000.0);
    return mega_fail(err, s, "%s", d);
  case MEGA_RPC_CANCELLED:
    if (!d[0] || strcmp(d, "Cancelled") == 0 || strcmp(d, "CANCELLED") == 0)
      return mega_fail(err, s, "%s call to %s at %s was cancelled", method, who, target);
    return mega_fail(err, s, "%s", d);
  case MEGA_RPC_UNIMPLEMENTED:
    /* The method is missing (our fallback, or grpcio's words), or the server
     * has it but cannot do this here (MEGA_ERR_UNSUPPORTED). */
    if (!d[0] || strcasestr(d, "unknown method") || strcasestr(d, "method not found"))
      return mega_fail(err, s, "%s at %s does not implement %s (is it another version of mega?)",
                       who, target, m->path);
    return mega_fail(err, s, "%s", d);
  default:
    if (!d[0])
      return mega_fail(err, s, "%s at %s failed %s: %s", who, target, method,
                       mega_rpc_code_name(code));
    return mega_fail(err, s, "%s", d);
  }
}
