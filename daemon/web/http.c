/* libmicrohttpd driven from libuv. MHD runs in external polling mode with
 * epoll: all its sockets sit in one epoll fd, which a uv_poll_t watches;
 * MHD_get_timeout says when it next needs a turn (a connection to time out,
 * or 0 when it has work left that no fd will announce, as epoll is
 * edge-triggered inside MHD), which a uv_timer_t keeps. Every MHD_run is on
 * the loop thread, so no locks. */
#include "daemon/web/http.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "core/port.h"
#include "core/secret.h"

/* Connections open from one address (http.h: per_ip_limit). */
typedef struct addr_count {
  struct addr_count *next;
  unsigned n;
  char addr[64];
} addr_count;

/* A connection: its address's count, and since when it has owed a request
 * (its head, and a POST's body) that has not come whole. */
typedef struct conn {
  struct conn *next, **prev;
  addr_count *a;
  int fd;
  uint64_t owing_since; /* uv_now; 0: a request is being answered */
} conn;

struct megad_http {
  megad_http_opts o;
  addr_count *addrs; /* the addresses with a connection open */
  conn *conns_open;  /* every connection, for the head deadline */
  uint64_t head_ms;  /* how long a request may take to arrive */
  unsigned per_ip;   /* the per-address cap for anything but the probes */
  char *token, *path, *content_type; /* owned copies */
  size_t token_len;
  struct MHD_Daemon *d;
  uv_poll_t poll;
  uv_timer_t timer;
  int open_handles;
  unsigned port;
  unsigned conns; /* connections after the last turn */
  megad_http_stream *streams; /* open ones, for the stop */
  char last_log[256]; /* MHD's last complaint, for the start error */
};

/* One streaming response (http.h: megad_http_source). */
struct megad_http_stream {
  megad_http_stream *next, **prev;
  megad_http *h;
  struct MHD_Connection *c;
  megad_http_source src;
  bool parked, stopping;
};

/* A request's own state: the POST body as it arrives. */
typedef struct conn_state {
  char body[MEGAD_HTTP_BODY_MAX + 1];
  size_t len;
  bool too_big, answered;
} conn_state;

/* ---- answering ---- */

static bool authorized(megad_http *h, struct MHD_Connection *c) {
  if (!h->token) return true;
  const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!v || strncasecmp(v, "Bearer ", 7)) return false; /* the scheme is case-blind (RFC 7235) */
  v += 7;
  while (*v == ' ') v++;
  return mega_secret_equal(v, strlen(v), h->token, h->token_len);
}

const char *megad_http_header(const megad_http_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

static enum MHD_Result queue(megad_http *h, struct MHD_Connection *c, unsigned code,
                             const char *type, struct MHD_Response *r, const megad_http_resp *x) {
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  /* text that echoes a request (a 404 naming the path) is never read as
   * HTML, and no other site may frame the page (its log-out button) */
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "X-Frame-Options", "DENY");
  if (code == MHD_HTTP_UNAUTHORIZED)
    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"megad\"");
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, x && x->allow ? x->allow : "GET, HEAD");
  if (code == MHD_HTTP_TOO_MANY_REQUESTS && x) {
    char secs[24];
    snprintf(secs, sizeof secs, "%u", x->retry_after_s);
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, secs);
  }
  if (x && x->set_cookie) MHD_add_response_header(r, MHD_HTTP_HEADER_SET_COOKIE, x->set_cookie);
  if (x && x->location) MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, x->location);
  if (x) MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  enum MHD_Result ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  if (ret == MHD_YES && h->o.count) h->o.count(h->o.arg, code);
  return ret;
}

static enum MHD_Result answer(megad_http *h, struct MHD_Connection *c, unsigned code,
                              const char *type, char *body, size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  return queue(h, c, code, type, r, NULL);
}

static enum MHD_Result answer_text(megad_http *h, struct MHD_Connection *c, unsigned code,
                                   const char *text) {
  char *body = strdup(text);
  if (!body) return MHD_NO;
  return answer(h, c, code, "text/plain; charset=utf-8", body, strlen(body));
}

/* ---- streams ---- */

static void drive(megad_http *h);
static void on_timer(uv_timer_t *t);

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  megad_http_stream *s = cls;
  if (s->stopping) return MHD_CONTENT_READER_END_WITH_ERROR;
  long n = s->src.pull(s->src.arg, s, buf, max);
  if (n > 0) return n;
  if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
  /* nothing now: park (MHD allows it from here) until megad_http_stream_wake */
  s->parked = true;
  MHD_suspend_connection(s->c);
  return 0;
}

/* The response is gone with its connection. */
static void stream_free(void *cls) {
  megad_http_stream *s = cls;
  if (s->h) {
    *s->prev = s->next;
    if (s->next) s->next->prev = s->prev;
  }
  s->src.closed(s->src.arg);
  free(s);
}

void megad_http_stream_wake(megad_http_stream *s) {
  if (!s || !s->parked) return;
  s->parked = false;
  MHD_resume_connection(s->c);
  uv_timer_start(&s->h->timer, on_timer, 0, 0); /* MHD wants a turn after a resume */
}

static enum MHD_Result answer_stream(megad_http *h, struct MHD_Connection *c,
                                     const megad_http_resp *x) {
  megad_http_stream *s = calloc(1, sizeof *s);
  if (!s) {
    x->stream.closed(x->stream.arg);
    return MHD_NO;
  }
  s->c = c;
  s->src = x->stream;
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
  if (!r) {
    stream_free(s);
    return MHD_NO;
  }
  s->h = h;
  s->next = h->streams;
  if (s->next) s->next->prev = &s->next;
  s->prev = &h->streams;
  h->streams = s;
  return queue(h, c, x->status, x->type, r, x);
}

/* ---- requests ---- */

/* The query as sent (MHD keeps it raw: see raw_unescape), re-joined. */
typedef struct query {
  char buf[2048];
  size_t len;
} query;

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value) {
  (void)kind;
  query *q = cls;
  int n = snprintf(q->buf + q->len, sizeof q->buf - q->len, "%s%s%s%s", q->len ? "&" : "?", key,
                   value ? "=" : "", value ? value : "");
  if (n > 0 && q->len + (size_t)n < sizeof q->buf) q->len += (size_t)n;
  return MHD_YES;
}

static void peer_of(struct MHD_Connection *c, char *buf, size_t cap) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  snprintf(buf, cap, "?");
  if (!ci || !ci->client_addr) return;
  const struct sockaddr *sa = ci->client_addr;
  if (sa->sa_family == AF_INET)
    uv_ip4_name((const struct sockaddr_in *)sa, buf, cap);
  else if (sa->sa_family == AF_INET6)
    uv_ip6_name((const struct sockaddr_in6 *)sa, buf, cap);
}

/* ---- connections per address ---- */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  megad_http *h = cls;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    conn *k = calloc(1, sizeof *k);
    *socket_context = k;
    if (!k) return;
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = fi ? fi->connect_fd : -1;
    k->owing_since = uv_now(h->timer.loop);
    k->next = h->conns_open;
    if (k->next) k->next->prev = &k->next;
    k->prev = &h->conns_open;
    h->conns_open = k;
    char peer[64];
    peer_of(c, peer, sizeof peer);
    addr_count *a = h->addrs;
    while (a && strcmp(a->addr, peer)) a = a->next;
    if (!a && (a = calloc(1, sizeof *a))) {
      snprintf(a->addr, sizeof a->addr, "%s", peer);
      a->next = h->addrs;
      h->addrs = a;
    }
    if (a) a->n++;
    k->a = a;
    return;
  }
  conn *k = *socket_context;
  *socket_context = NULL;
  if (!k) return;
  *k->prev = k->next;
  if (k->next) k->next->prev = k->prev;
  addr_count *a = k->a;
  free(k);
  if (!a || --a->n) return;
  for (addr_count **p = &h->addrs; *p; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      free(a);
      return;
    }
}

static conn *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* Connections open from c's address, c included (0: not known). */
static unsigned from_same_address(struct MHD_Connection *c) {
  const conn *k = conn_of(c);
  return k && k->a ? k->a->n : 0;
}

/* Whether the client closed its end with nothing left unread: what a
 * request it owes would need can never come. MHD (epoll, edge-triggered)
 * takes a read shorter than its buffer for a drained socket, so a FIN that
 * came with the last bytes (a client that writes part of a request and
 * closes at once) raises no edge of its own, and MHD would hold the socket
 * in CLOSE-WAIT until its timeout. */
static bool client_gone(int fd) {
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* MHD's timeout counts idleness only, so a client sending a byte now and
 * then would hold its connection for ever (slowloris: enough of them fill
 * every slot, the probes' too). A request must arrive whole within head_ms
 * of the connection's start or the last answer: past it the socket is shut
 * down, which MHD sees as the client gone (the shutdown is an edge). So is
 * one whose client closed its end without the whole request (client_gone).
 * Returns the ms until the next deadline (UINT64_MAX: none). */
static uint64_t enforce_head_deadline(megad_http *h) {
  uint64_t now = uv_now(h->timer.loop), next = UINT64_MAX;
  for (conn *k = h->conns_open; k; k = k->next) {
    if (!k->owing_since || k->fd < 0) continue;
    uint64_t due = k->owing_since + h->head_ms;
    if (now >= due || client_gone(k->fd)) {
      shutdown(k->fd, SHUT_RDWR);
      k->owing_since = 0;
    } else if (due - now < next) {
      next = due - now;
    }
  }
  return next;
}

static bool is_probe(const megad_http *h, const char *url) {
  if (!strcmp(url, h->path)) return true;
  for (const char *const *p = h->o.probe_paths; p && *p; p++)
    if (!strcmp(url, *p)) return true;
  return false;
}

/* A request past the per-address cap: 503, and the connection closes. */
static enum MHD_Result too_many(megad_http *h, struct MHD_Connection *c, unsigned n) {
  char peer[64], msg[320];
  peer_of(c, peer, sizeof peer);
  snprintf(msg, sizeof msg,
           "megad serves at most %u connections from one address, and %s has %u open: close "
           "some (a page polls instead of holding a live stream)\n",
           h->per_ip, peer, n);
  char *body = strdup(msg);
  struct MHD_Response *r =
      body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  return queue(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", r, NULL);
}

static enum MHD_Result routed(megad_http *h, struct MHD_Connection *c, const char *url,
                              const char *method, const conn_state *cs) {
  query q = {.len = 0};
  q.buf[0] = '\0';
  MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_arg, &q);
  size_t ul = strlen(url);
  char *target = malloc(ul + q.len + 1);
  if (!target) return MHD_NO;
  memcpy(target, url, ul);
  memcpy(target + ul, q.buf, q.len + 1);
  char peer[64];
  peer_of(c, peer, sizeof peer);
  megad_http_req req = {.method = method, .target = target, .body = cs->body,
                        .body_len = cs->len, .bearer_ok = authorized(h, c), .peer = peer,
                        .conn = c};
  megad_http_resp r = {0};
  bool mine = h->o.route && h->o.route(h->o.arg, &req, &r);
  free(target);
  if (!mine) {
    char msg[320];
    snprintf(msg, sizeof msg, "megad serves %s and the web view at /\n", h->path);
    return answer_text(h, c, MHD_HTTP_NOT_FOUND, msg);
  }
  enum MHD_Result ret;
  if (r.stream.pull) {
    ret = answer_stream(h, c, &r);
  } else if (!r.body) {
    ret = answer_text(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  } else {
    struct MHD_Response *x = MHD_create_response_from_buffer(r.len, r.body, MHD_RESPMEM_MUST_FREE);
    if (!x) free(r.body);
    ret = x ? queue(h, c, r.status, r.type, x, &r) : MHD_NO;
  }
  free(r.set_cookie);
  free(r.location);
  return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  (void)version;
  megad_http *h = cls;
  conn_state *cs = *con_cls;
  bool mine = !strcmp(url, h->path);
  if (!cs) {
    /* past its address's share only the probes are served (from the room
     * MHD's own cap leaves them) */
    unsigned n = from_same_address(c);
    if (n > h->per_ip && !is_probe(h, url)) return too_many(h, c, n);
    cs = calloc(1, sizeof *cs);
    if (!cs) return MHD_NO;
    *con_cls = cs;
    /* a POST to the route hook is answered once its body is in */
    if (!mine && !strcmp(method, MHD_HTTP_METHOD_POST)) return MHD_YES;
  } else if (*upload_data_size) { /* a piece of the body: kept for a POST, else dropped */
    size_t n = *upload_data_size;
    if (!cs->answered && !cs->too_big && cs->len + n <= MEGAD_HTTP_BODY_MAX) {
      memcpy(cs->body + cs->len, upload_data, n);
      cs->len += n;
      cs->body[cs->len] = '\0';
    } else {
      cs->too_big = !cs->answered;
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (cs->answered) return MHD_YES; /* the body's end after an answer */
  cs->answered = true;
  conn *k = conn_of(c);
  if (k) k->owing_since = 0;
  if (cs->too_big) {
    char msg[128];
    snprintf(msg, sizeof msg, "a request body is at most %d bytes here\n", MEGAD_HTTP_BODY_MAX);
    return answer_text(h, c, MHD_HTTP_CONTENT_TOO_LARGE, msg);
  }
  if (!mine) return routed(h, c, url, method, cs);
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
    return answer_text(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "megad serves only GET\n");
  if (!authorized(h, c))
    return answer_text(h, c, MHD_HTTP_UNAUTHORIZED,
                       "megad wants a token here: send the header "
                       "'Authorization: Bearer TOKEN' with megad's cluster token\n");
  size_t len = 0;
  char *body = h->o.body(h->o.arg, &len);
  if (!body) return answer_text(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  return answer(h, c, MHD_HTTP_OK, h->content_type, body, len);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  megad_http *h = cls;
  (void)toe;
  conn *k = conn_of(c); /* a kept-alive connection owes the next request */
  if (k) k->owing_since = uv_now(h->timer.loop);
  free(*con_cls);
  *con_cls = NULL;
}

/* Leaves the path and query as sent: the route hook decodes what it owns. */
static size_t raw_unescape(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls;
  (void)c;
  return strlen(s);
}

/* ---- the loop ---- */

/* One turn of MHD, then its next deadline on the timer. A connection that
 * closed may have freed a slot: MHD puts its listening socket back into
 * epoll only at the start of its next turn, so that turn comes at once (a
 * client waiting in the backlog makes no new edge to wake us). */
static void drive(megad_http *h) {
  MHD_run(h->d);
  uint64_t head_next = enforce_head_deadline(h);
  const union MHD_DaemonInfo *ci = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  unsigned conns = ci ? ci->num_connections : 0;
  bool freed = conns < h->conns;
  h->conns = conns;
  MHD_UNSIGNED_LONG_LONG ms;
  bool mhd_wants = MHD_get_timeout(h->d, &ms) == MHD_YES;
  uint64_t wait = mhd_wants && ms < 60000 ? (uint64_t)ms : 60000;
  if (head_next < wait) wait = head_next;
  if (freed)
    uv_timer_start(&h->timer, on_timer, 0, 0);
  else if (mhd_wants || head_next != UINT64_MAX)
    uv_timer_start(&h->timer, on_timer, wait, 0);
  else
    uv_timer_stop(&h->timer);
}

static void on_timer(uv_timer_t *t) { drive(t->data); }

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  drive(p->data);
}

static void on_log(void *arg, const char *fmt, va_list ap) {
  megad_http *h = arg;
  vsnprintf(h->last_log, sizeof h->last_log, fmt, ap);
  size_t n = strlen(h->last_log);
  while (n && (h->last_log[n - 1] == '\n' || h->last_log[n - 1] == '.')) h->last_log[--n] = '\0';
  if (h->o.log) h->o.log(h->o.arg, h->last_log);
}

/* ---- start, stop ---- */

/* HOST:PORT or [V6]:PORT into sa; false when it is not that. */
static bool parse_addr(const char *addr, struct sockaddr_storage *sa, bool *v6, char *why,
                       size_t whylen) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr) {
    snprintf(why, whylen, "give HOST:PORT");
    return false;
  }
  char host[256];
  const char *hs = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && hs[0] == '[' && hs[hl - 1] == ']') {
    hs++;
    hl -= 2;
  }
  if (hl >= sizeof host) {
    snprintf(why, whylen, "the host is too long");
    return false;
  }
  memcpy(host, hs, hl);
  host[hl] = '\0';
  unsigned port;
  if (!mega_port_parse(colon + 1, strlen(colon + 1), &port)) {
    snprintf(why, whylen, "the port must be a number from 0 to 65535");
    return false;
  }
  memset(sa, 0, sizeof *sa);
  *v6 = false;
  if (!uv_ip4_addr(host, (int)port, (struct sockaddr_in *)sa)) return true;
  if (!uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)sa)) {
    *v6 = true;
    return true;
  }
  snprintf(why, whylen, "'%s' is not an IP address", host);
  return false;
}

static void free_http(megad_http *h) {
  while (h->addrs) {
    addr_count *a = h->addrs;
    h->addrs = a->next;
    free(a);
  }
  free(h->token);
  free(h->path);
  free(h->content_type);
  free(h);
}

mega_status megad_http_start(uv_loop_t *loop, const megad_http_opts *o, megad_http **out,
                             mega_err *err) {
  struct sockaddr_storage sa;
  bool v6;
  char why[320];
  if (!o->listen || !parse_addr(o->listen, &sa, &v6, why, sizeof why))
    return mega_fail(err, MEGA_ERR_INVALID, "listen address %s: %s", o->listen ? o->listen : "",
                     why);
  megad_http *h = calloc(1, sizeof *h);
  if (!h) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  h->o = *o;
  h->per_ip = o->per_ip_limit ? o->per_ip_limit : 16;
  h->head_ms = o->head_timeout_ms ? o->head_timeout_ms : 1000u * (o->timeout_s ? o->timeout_s : 10);
  h->path = strdup(o->path ? o->path : "/");
  h->content_type = strdup(o->content_type ? o->content_type : "text/plain");
  h->token = o->token && o->token[0] ? strdup(o->token) : NULL;
  h->token_len = h->token ? strlen(h->token) : 0;
  if (!h->path || !h->content_type || (o->token && o->token[0] && !h->token)) {
    free_http(h);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  /* the address is MHD_OPTION_SOCK_ADDR's; MHD's messages name the port
   * argument ("Failed to bind to port 0"), so it gets the real one */
  uint16_t port = ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                           : ((struct sockaddr_in *)&sa)->sin_port);
  h->d = MHD_start_daemon(
      MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | (v6 ? MHD_USE_IPv6 : 0), port,
      NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION,
      on_connection, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o->conn_limit ? o->conn_limit : 64),
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, h->per_ip + MEGAD_HTTP_PROBE_ROOM,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(o->timeout_s ? o->timeout_s : 10),
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 64u, MHD_OPTION_UNESCAPE_CALLBACK, raw_unescape, NULL,
      MHD_OPTION_END);
  const union MHD_DaemonInfo *ep = h->d ? MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
  if (!ep) {
    mega_status s = mega_fail(err, MEGA_ERR_IO, "cannot serve HTTP on %s: %s", o->listen,
                              h->last_log[0] ? h->last_log : "libmicrohttpd would not start");
    if (h->d) MHD_stop_daemon(h->d);
    free_http(h);
    return s;
  }
  const union MHD_DaemonInfo *pi = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = pi ? pi->port : 0;
  uv_timer_init(loop, &h->timer);
  uv_poll_init(loop, &h->poll, ep->epoll_fd);
  h->timer.data = h->poll.data = h;
  h->open_handles = 2;
  uv_poll_start(&h->poll, UV_READABLE, on_poll);
  drive(h);
  *out = h;
  return MEGA_OK;
}

unsigned megad_http_port(const megad_http *h) { return h->port; }

unsigned megad_http_connections(const megad_http *h) {
  const union MHD_DaemonInfo *ci = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
  return ci ? ci->num_connections : 0;
}

static void handle_closed(uv_handle_t *hd) {
  megad_http *h = hd->data;
  if (--h->open_handles == 0) free_http(h);
}

void megad_http_stop(megad_http *h) {
  if (!h) return;
  /* libuv lets go of the epoll fd before MHD closes it */
  uv_poll_stop(&h->poll);
  uv_close((uv_handle_t *)&h->poll, handle_closed);
  uv_close((uv_handle_t *)&h->timer, handle_closed);
  /* MHD must not stop with a parked connection: every stream ends first
   * (their closed callbacks run inside MHD_stop_daemon) */
  for (megad_http_stream *s = h->streams; s; s = s->next) {
    s->stopping = true;
    if (s->parked) {
      s->parked = false;
      MHD_resume_connection(s->c);
    }
  }
  if (h->streams) MHD_run(h->d);
  MHD_stop_daemon(h->d);
  h->d = NULL;
}
