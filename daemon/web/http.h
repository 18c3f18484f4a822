/* A small HTTP server on the daemon's libuv loop: libmicrohttpd in its
 * external-polling mode, its epoll fd watched by a uv_poll_t and its next
 * timeout on a uv_timer_t, so it runs on the loop thread like everything
 * else (no thread of its own). It serves GET (and HEAD) of one path, the
 * body made by a callback the layer above registers; other paths go to a
 * route hook (404 without one), other methods 405 with an Allow header. With a token set, the path wants
 * `Authorization: Bearer TOKEN` (compared in constant time) and answers 401
 * otherwise; the route hook is told whether a request carried it.
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

/* A request for another path's owner (the route hook). */
#define MEGAD_HTTP_BODY_MAX 4096 /* a POST's body; a bigger one is 413 */
typedef struct megad_http_req {
  const char *method;
  const char *target; /* the path, then '?' and the query when there is one, as sent */
  const char *body;   /* a POST's body as sent (NUL-terminated; "" when none) */
  size_t body_len;
  bool bearer_ok;     /* no token is set, or `Authorization: Bearer TOKEN` carries it */
  const char *peer;   /* the client's address, for log lines */
  void *conn;         /* the server's, for megad_http_header */
} megad_http_req;
/* A request header's value (the name is case-blind), or NULL. */
const char *megad_http_header(const megad_http_req *r, const char *name);

/* A response that streams (Server-Sent Events): the server pulls bytes while
 * the client reads, and a pull with nothing ready parks the connection (no
 * CPU, no timeout) until megad_http_stream_wake. */
typedef struct megad_http_stream megad_http_stream;
typedef struct megad_http_source {
  /* Up to max bytes into buf: how many (> 0); 0 when nothing is ready; -1
   * at the end (the connection then closes). s is the stream to wake. */
  long (*pull)(void *arg, megad_http_stream *s, char *buf, size_t max);
  /* Once, when the connection is gone (the client left, an error, the
   * server's stop): arg is the source's to free. */
  void (*closed)(void *arg);
  void *arg;
} megad_http_source;
/* A parked stream pulls again soon. On the loop thread. */
void megad_http_stream_wake(megad_http_stream *s);

/* A response from the route hook. */
typedef struct megad_http_resp {
  unsigned status;
  const char *type;  /* static */
  char *body;        /* malloc'd; the server frees it */
  size_t len;
  char *set_cookie;  /* malloc'd or NULL: a Set-Cookie header */
  char *location;    /* malloc'd or NULL: a Location header (for a 303) */
  megad_http_source stream; /* pull set: a stream instead of the body */
  const char *allow; /* static or NULL: a 405's Allow header (NULL: "GET, HEAD") */
  unsigned retry_after_s; /* a 429's Retry-After header */
} megad_http_resp;
/* Another path's owner: answers req into *out and returns true, or returns
 * false for a 404. It decides who may see what (req->bearer_ok): the web
 * view is opened by a browser, which cannot send the header. */
typedef bool (*megad_http_route_fn)(void *arg, const megad_http_req *req, megad_http_resp *out);
/* Told of every answered request's status (may be NULL). */
typedef void (*megad_http_count_fn)(void *arg, unsigned status);

typedef struct megad_http_opts {
  const char *listen;       /* "HOST:PORT", HOST an IPv4 or IPv6 address; port 0 picks one */
  const char *path;         /* "/metrics" */
  const char *content_type; /* of the body */
  const char *token;        /* bearer token wanted; NULL or "": open */
  unsigned conn_limit;      /* connections at once; 0: 64 */
  /* Connections from one address; 0: 16. A request on a connection past it
   * gets 503 (and the connection closes), except for path and probe_paths:
   * an address has MEGAD_HTTP_PROBE_ROOM more connections for those, so a
   * client holding its share (live streams behind a proxy) does not lock
   * the probes out. Past that room a connection is closed unanswered. */
  unsigned per_ip_limit;
  const char *const *probe_paths; /* besides path, the probes' paths (/healthz); NULL-terminated,
                                     may be NULL */
  unsigned timeout_s;       /* an idle or half-sent connection closes; 0: 10 */
  /* a request (its head, and a POST's body) must arrive whole within this
   * long of the connection's start or the last answer, however it trickles
   * in; 0: timeout_s */
  unsigned head_timeout_ms;
  megad_http_body_fn body;
  megad_http_count_fn count;
  megad_http_route_fn route; /* may be NULL */
  void *arg;
  /* log lines from the server (may be NULL) */
  void (*log)(void *arg, const char *msg);
} megad_http_opts;

#define MEGAD_HTTP_PROBE_ROOM 4

typedef struct megad_http megad_http;

/* Binds and starts serving. A bad address or a taken port is an error
 * naming it. */
mega_status megad_http_start(uv_loop_t *loop, const megad_http_opts *o, megad_http **out,
                             mega_err *err);
/* The port bound (useful after port 0). */
unsigned megad_http_port(const megad_http *h);
/* Connections open now (MHD's count). */
unsigned megad_http_connections(const megad_http *h);
/* Closes the listener and every connection; h is freed once its handles
 * have closed. NULL is a no-op. */
void megad_http_stop(megad_http *h);

#endif
