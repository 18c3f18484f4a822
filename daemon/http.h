/* A small HTTP server on the daemon's libuv loop: libmicrohttpd in its
 * external-polling mode, its epoll fd watched by a uv_poll_t and its next
 * timeout on a uv_timer_t, so it runs on the loop thread like everything
 * else (no thread of its own). It serves GET of one path, the body made by
 * a callback the layer above registers; other paths get 404, other methods
 * 405. With a token set, the path wants `Authorization: Bearer TOKEN`
 * (compared in constant time) and answers 401 otherwise.
 *
 *   megad_http_opts o = {.listen = "127.0.0.1:9100", .path = "/metrics",
 *                        .body = render, .arg = me};
 *   megad_http_start(loop, &o, &h, &err);
 *   ...
 *   megad_http_stop(h);   // the sockets close now; memory once the loop lets go
 *
 * On the loop thread only. */
#ifndef MEGA_DAEMON_HTTP_H
#define MEGA_DAEMON_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

#include "core/status.h"

/* The body for one GET of the path (malloc'd; the server frees it), or NULL
 * for a 500. */
typedef char *(*megad_http_body_fn)(void *arg, size_t *len);
/* A response from the route hook. */
typedef struct megad_http_resp {
  unsigned status;
  const char *type; /* static */
  char *body;       /* malloc'd; the server frees it */
  size_t len;
} megad_http_resp;
/* Another path's owner: answers method for target (the path, then '?' and
 * the query when there is one) into *out and returns true, or returns false
 * for a 404. Not behind the token (the web view is opened by a browser). */
typedef bool (*megad_http_route_fn)(void *arg, const char *method, const char *target,
                                    megad_http_resp *out);
/* Told of every answered request's status (may be NULL). */
typedef void (*megad_http_count_fn)(void *arg, unsigned status);

typedef struct megad_http_opts {
  const char *listen;       /* "HOST:PORT", HOST an IPv4 or IPv6 address; port 0 picks one */
  const char *path;         /* "/metrics" */
  const char *content_type; /* of the body */
  const char *token;        /* bearer token wanted; NULL or "": open */
  unsigned conn_limit;      /* connections at once; 0: 64 */
  unsigned per_ip_limit;    /* from one address; 0: 16 */
  unsigned timeout_s;       /* an idle or half-sent connection closes; 0: 10 */
  megad_http_body_fn body;
  megad_http_count_fn count;
  megad_http_route_fn route; /* may be NULL */
  void *arg;
  /* log lines from the server (may be NULL) */
  void (*log)(void *arg, const char *msg);
} megad_http_opts;

typedef struct megad_http megad_http;

/* Binds and starts serving. A bad address or a taken port is an error
 * naming it. */
mega_status megad_http_start(uv_loop_t *loop, const megad_http_opts *o, megad_http **out,
                             mega_err *err);
/* The port bound (useful after port 0). */
unsigned megad_http_port(const megad_http *h);
/* Closes the listener and every connection; h is freed once its handles
 * have closed. NULL is a no-op. */
void megad_http_stop(megad_http *h);

#endif
