/* daemon/http: libmicrohttpd on a libuv loop. Real sockets: a client thread
 * asks while the test's thread runs the loop. The bearer token, 404 and
 * 405, a slowloris connection timed out, the connection limit, a client
 * that leaves mid-request let go at once, and bad listen addresses refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/web/http.h"

typedef struct srv {
  uv_loop_t loop;
  uv_timer_t tick; /* wakes the loop so it sees the client finish */
  megad_http *h;
  int bodies;
  unsigned last_status;
} srv;

static char *body(void *arg, size_t *len) {
  srv *s = arg;
  s->bodies++;
  char *b = strdup("up 1\n");
  *len = b ? strlen(b) : 0;
  return b;
}

static void count(void *arg, unsigned status) { ((srv *)arg)->last_status = status; }

/* ---- a stream: /stream sends "n\n" for each tick the test adds ---- */

typedef struct feed {
  int ticks, sent, pulls;
  bool end, closed;
  megad_http_stream *s;
} feed;
static feed the_feed;

static long pull(void *arg, megad_http_stream *s, char *buf, size_t max) {
  feed *f = arg;
  f->s = s;
  f->pulls++;
  if (f->sent == f->ticks) return f->end ? -1 : 0;
  int n = snprintf(buf, max, "%d\n", ++f->sent);
  return n;
}

static void closed(void *arg) { ((feed *)arg)->closed = true; }

/* Owns /api/... (echoes the method, target, body and cookie; 401 without
 * the token) and /stream. */
static bool route(void *arg, const megad_http_req *req, megad_http_resp *out) {
  (void)arg;
  if (!strcmp(req->target, "/probe") || !strcmp(req->target, "/post-only")) {
    bool probe = req->target[1] == 'p' && req->target[2] == 'r';
    bool ok = probe ? !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD")
                    : !strcmp(req->method, "POST");
    *out = (megad_http_resp){.status = ok ? 200 : 405, .type = "text/plain",
                             .body = strdup(ok ? "fine\n" : "no\n"), .len = ok ? 5 : 3,
                             .allow = probe ? NULL : "POST"};
    return true;
  }
  if (!strcmp(req->target, "/stream")) {
    *out = (megad_http_resp){.status = 200, .type = "text/event-stream",
                             .stream = {.pull = pull, .closed = closed, .arg = &the_feed}};
    return true;
  }
  if (strncmp(req->target, "/api/", 5)) return false;
  if (!req->bearer_ok) {
    *out = (megad_http_resp){.status = 401, .type = "text/plain", .body = strdup("no\n"), .len = 3};
    return true;
  }
  char *b = NULL;
  const char *cookie = megad_http_header(req, "cookie");
  if (asprintf(&b, "routed %s %s body=[%s] cookie=[%s]\n", req->method, req->target, req->body,
               cookie ? cookie : "") < 0)
    return false;
  *out = (megad_http_resp){.status = 200, .type = "text/plain", .body = b, .len = strlen(b)};
  if (!strcmp(req->method, "POST")) {
    out->status = 303;
    out->set_cookie = strdup("k=v; HttpOnly");
    out->location = strdup("/next");
  }
  return true;
}

static void on_tick(uv_timer_t *t) { (void)t; }

static void on_log(void *arg, const char *msg) {
  (void)arg;
  fprintf(stderr, "http: %s\n", msg);
}

static const char *const probes[] = {"/probe", NULL};

static void start_with(srv *s, const char *token, unsigned conn_limit, unsigned timeout_s,
                       unsigned per_ip, unsigned head_ms) {
  memset(s, 0, sizeof *s);
  assert_int_equal(uv_loop_init(&s->loop), 0);
  uv_timer_init(&s->loop, &s->tick);
  uv_timer_start(&s->tick, on_tick, 10, 10);
  megad_http_opts o = {.listen = "127.0.0.1:0", .path = "/metrics",
                       .content_type = "text/plain; version=0.0.4", .token = token,
                       .conn_limit = conn_limit, .timeout_s = timeout_s, .body = body,
                       .count = count, .route = route, .log = on_log, .arg = s,
                       .per_ip_limit = per_ip, .probe_paths = probes,
                       .head_timeout_ms = head_ms};
  mega_err err = {0};
  assert_int_equal(megad_http_start(&s->loop, &o, &s->h, &err), MEGA_OK);
  assert_true(megad_http_port(s->h) > 0);
}

static void start_per_ip(srv *s, const char *token, unsigned conn_limit, unsigned timeout_s,
                         unsigned per_ip) {
  start_with(s, token, conn_limit, timeout_s, per_ip, 0);
}

static void start(srv *s, const char *token, unsigned conn_limit, unsigned timeout_s) {
  start_per_ip(s, token, conn_limit, timeout_s, 0);
}

static void stop(srv *s) {
  megad_http_stop(s->h);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&s->loop), 0);
}

static int dial(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* ---- a client on its own thread ---- */

typedef struct ask {
  unsigned port;
  const char *req;
  char resp[8192];
  atomic_bool done;
} ask;

static void *asker(void *arg) {
  ask *a = arg;
  int fd = dial(a->port);
  size_t n = strlen(a->req);
  if (write(fd, a->req, n) != (ssize_t)n) a->resp[0] = '\0';
  size_t got = 0;
  ssize_t r;
  while (got < sizeof a->resp - 1 && (r = read(fd, a->resp + got, sizeof a->resp - 1 - got)) > 0)
    got += (size_t)r;
  a->resp[got] = '\0';
  close(fd);
  atomic_store(&a->done, true);
  return NULL;
}

/* Sends req and returns the whole response, the loop running meanwhile. */
static const char *request(srv *s, ask *a, const char *req) {
  memset(a, 0, sizeof *a);
  a->port = megad_http_port(s->h);
  a->req = req;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, asker, a), 0);
  while (!atomic_load(&a->done)) uv_run(&s->loop, UV_RUN_ONCE);
  pthread_join(t, NULL);
  return a->resp;
}

static void run_for(srv *s, int ms) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    uv_run(&s->loop, UV_RUN_ONCE);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= ms) return;
  }
}

/* ---- the cases ---- */

static void test_open_server(void **state) {
  (void)state;
  srv s;
  start(&s, NULL, 0, 0);
  ask a;
  const char *r = request(&s, &a, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4\r\n"));
  assert_non_null(strstr(r, "\r\n\r\nup 1\n"));
  assert_int_equal(s.last_status, 200);
  /* a query string is still the path */
  r = request(&s, &a, "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  r = request(&s, &a, "GET /nope HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 404 "));
  assert_non_null(strstr(r, "X-Content-Type-Options: nosniff\r\n"));
  assert_non_null(strstr(r, "megad serves /metrics"));
  /* another owner's path goes to the route hook, the query as sent */
  r = request(&s, &a, "GET /api/x?since=3&a=%41 HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_non_null(strstr(r, "routed GET /api/x?since=3&a=%41 body=[] cookie=[]"));
  assert_non_null(strstr(r, "Cache-Control: no-store\r\n"));
  assert_non_null(strstr(r, "X-Content-Type-Options: nosniff\r\n"));
  assert_non_null(strstr(r, "X-Frame-Options: DENY\r\n"));
  /* a POST's body reaches the hook, and its headers come back */
  r = request(&s, &a, "POST /api/login HTTP/1.0\r\nCookie: a=1; b=2\r\n"
                      "Content-Type: application/x-www-form-urlencoded\r\n"
                      "Content-Length: 13\r\n\r\ntoken=abc%2B1");
  assert_non_null(strstr(r, " 303 "));
  assert_non_null(strstr(r, "Set-Cookie: k=v; HttpOnly\r\n"));
  assert_non_null(strstr(r, "Location: /next\r\n"));
  assert_non_null(strstr(r, "routed POST /api/login body=[token=abc%2B1] cookie=[a=1; b=2]"));
  /* a body over the limit is refused */
  char big[6000];
  int n = snprintf(big, sizeof big, "POST /api/x HTTP/1.0\r\nContent-Length: 5000\r\n\r\n");
  memset(big + n, 'x', 5000);
  big[n + 5000] = '\0';
  r = request(&s, &a, big);
  assert_non_null(strstr(r, " 413 "));
  r = request(&s, &a, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  assert_non_null(strstr(r, " 405 "));
  assert_non_null(strstr(r, "Allow: GET, HEAD\r\n"));
  r = request(&s, &a, "HEAD /metrics HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_null(strstr(r, "up 1"));
  /* a 405 from the route hook says what the path takes */
  r = request(&s, &a, "GET /post-only HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 405 "));
  assert_non_null(strstr(r, "Allow: POST\r\n"));
  r = request(&s, &a, "DELETE /probe HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, "Allow: GET, HEAD\r\n"));
  /* HEAD of a routed path: its headers, no body */
  r = request(&s, &a, "HEAD /probe HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_null(strstr(r, "fine"));
  /* garbage gets an error and a close, and the server goes on */
  r = request(&s, &a, "\x01\x02garbage\r\n\r\n");
  assert_null(strstr(r, " 200 "));
  r = request(&s, &a, "GET /metrics HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  stop(&s);
}

static void test_bearer_token(void **state) {
  (void)state;
  srv s;
  start(&s, "s3cret-token", 0, 0);
  ask a;
  const char *r = request(&s, &a, "GET /metrics HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 401 "));
  assert_non_null(strstr(r, "WWW-Authenticate: Bearer realm=\"megad\"\r\n"));
  assert_non_null(strstr(r, "Authorization: Bearer TOKEN"));
  assert_int_equal(s.last_status, 401);
  const char *wrong[] = {
      "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret-toke\r\n\r\n",
      "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret-token2\r\n\r\n",
      "GET /metrics HTTP/1.0\r\nAuthorization: Bearer \r\n\r\n",
      "GET /metrics HTTP/1.0\r\nAuthorization: Basic s3cret-token\r\n\r\n",
      "GET /metrics HTTP/1.0\r\nAuthorization: s3cret-token\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    r = request(&s, &a, wrong[i]);
    assert_non_null(strstr(r, " 401 "));
  }
  /* the route hook hears whether the token came, and decides */
  r = request(&s, &a, "GET /api/x HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 401 "));
  r = request(&s, &a, "GET /api/x HTTP/1.0\r\nAuthorization: Bearer s3cret-token\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_int_equal(s.bodies, 0);
  r = request(&s, &a, "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret-token\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_non_null(strstr(r, "up 1\n"));
  r = request(&s, &a, "GET /metrics HTTP/1.0\r\nauthorization: bearer s3cret-token\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_int_equal(s.bodies, 2);
  stop(&s);
}

/* Whether the server closed fd, running the loop up to ms meanwhile. */
static bool closed_within(srv *s, int fd, int ms) {
  for (int waited = 0; waited <= ms; waited += 50) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) == 1) {
      char c;
      return read(fd, &c, 1) <= 0;
    }
    run_for(s, 50);
  }
  return false;
}

/* A client that sends half a request and waits is closed after the
 * timeout; one over the connection limit waits in the backlog until a slot
 * frees, then is served. */
static void test_slow_and_too_many(void **state) {
  (void)state;
  srv s;
  start(&s, NULL, 2, 3);
  unsigned port = megad_http_port(s.h);
  int slow1 = dial(port), slow2 = dial(port);
  assert_int_equal(write(slow1, "GET /met", 8), 8);
  run_for(&s, 100);
  int third = dial(port);
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  assert_int_equal(write(third, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  run_for(&s, 300);
  struct pollfd p = {.fd = third, .events = POLLIN};
  assert_int_equal(poll(&p, 1, 0), 0); /* over the limit: not served yet */
  p.fd = slow1;
  assert_int_equal(poll(&p, 1, 0), 0); /* the timeout is 3 s: still open */
  /* the slow ones time out, and the third gets its answer */
  assert_true(closed_within(&s, slow1, 20000));
  assert_true(closed_within(&s, slow2, 20000));
  close(slow1);
  close(slow2);
  char resp[4096] = "";
  size_t got = 0;
  for (int waited = 0; waited < 20000 && !strstr(resp, "up 1"); waited += 50) {
    run_for(&s, 50);
    p.fd = third;
    if (poll(&p, 1, 0) == 1) {
      ssize_t r = read(third, resp + got, sizeof resp - 1 - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    resp[got] = '\0';
  }
  resp[got] = '\0';
  assert_non_null(strstr(resp, " 200 OK\r\n"));
  close(third);
  stop(&s);
}

/* Reads what fd has within ms (the loop running) into buf, appending. */
static size_t read_for(srv *s, int fd, char *buf, size_t got, size_t cap, int ms) {
  for (int waited = 0; waited < ms; waited += 20) {
    run_for(s, 20);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 0) == 1) {
      ssize_t r = read(fd, buf + got, cap - 1 - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    buf[got] = '\0';
  }
  return got;
}

/* A stream parks when it has nothing, sends when woken, ends when its
 * source says so; a client that leaves, or the server's stop, frees it. */
static void test_stream(void **state) {
  (void)state;
  srv s;
  start(&s, NULL, 0, 0);
  memset(&the_feed, 0, sizeof the_feed);
  int fd = dial(megad_http_port(s.h));
  const char req[] = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  char buf[4096];
  size_t got = read_for(&s, fd, buf, 0, sizeof buf, 300);
  assert_non_null(strstr(buf, " 200 OK\r\n"));
  assert_non_null(strstr(buf, "Content-Type: text/event-stream\r\n"));
  assert_non_null(strstr(buf, "Transfer-Encoding: chunked\r\n"));
  int pulls = the_feed.pulls;
  assert_true(pulls >= 1);
  run_for(&s, 300); /* parked: no busy pulling */
  assert_int_equal(the_feed.pulls, pulls);
  the_feed.ticks = 2;
  megad_http_stream_wake(the_feed.s);
  got = read_for(&s, fd, buf, got, sizeof buf, 300);
  assert_non_null(strstr(buf, "1\n"));
  assert_non_null(strstr(buf, "2\n"));
  assert_false(the_feed.closed);
  the_feed.end = true;
  megad_http_stream_wake(the_feed.s);
  got = read_for(&s, fd, buf, got, sizeof buf, 300);
  assert_non_null(strstr(buf, "\r\n0\r\n\r\n")); /* the last chunk */
  assert_true(the_feed.closed);
  close(fd);

  /* a client that left: the next wake's write fails and frees the stream */
  memset(&the_feed, 0, sizeof the_feed);
  fd = dial(megad_http_port(s.h));
  assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  read_for(&s, fd, buf, 0, sizeof buf, 200);
  close(fd);
  for (int i = 0; i < 50 && !the_feed.closed; i++) {
    the_feed.ticks++;
    megad_http_stream_wake(the_feed.s);
    run_for(&s, 20);
  }
  assert_true(the_feed.closed);

  /* the server's stop ends a parked stream */
  memset(&the_feed, 0, sizeof the_feed);
  fd = dial(megad_http_port(s.h));
  assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  read_for(&s, fd, buf, 0, sizeof buf, 200);
  assert_true(the_feed.pulls >= 1);
  stop(&s);
  assert_true(the_feed.closed);
  close(fd);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* A client that trickles its request a header line at a time never goes
 * idle, yet is closed once the request is late (slowloris: enough of them
 * held every slot, /healthz's too, for as long as they liked); a stream
 * that was answered lives on past that deadline. */
static void test_head_deadline(void **state) {
  (void)state;
  srv s;
  start_with(&s, NULL, 0, 3, 0, 1000);
  unsigned port = megad_http_port(s.h);
  int fd = dial(port);
  assert_int_equal(write(fd, "GET /metrics HTTP/1.1\r\n", 23), 23);
  double t0 = now_s(), closed_at = 0;
  while (!closed_at && now_s() - t0 < 5) {
    run_for(&s, 200);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    if ((poll(&p, 1, 0) == 1 && read(fd, &c, 1) <= 0) || send(fd, "X-A: b\r\n", 8, MSG_NOSIGNAL) != 8)
      closed_at = now_s();
  }
  fprintf(stderr, "trickling client closed after %.1f s\n", closed_at ? closed_at - t0 : -1);
  assert_true(closed_at > 0 && closed_at - t0 < 2.5);
  close(fd);

  memset(&the_feed, 0, sizeof the_feed);
  fd = dial(port);
  const char req[] = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  char buf[4096];
  size_t got = read_for(&s, fd, buf, 0, sizeof buf, 1500);
  assert_non_null(strstr(buf, " 200 OK\r\n"));
  the_feed.ticks = 1;
  megad_http_stream_wake(the_feed.s);
  read_for(&s, fd, buf, got, sizeof buf, 300);
  assert_non_null(strstr(buf, "1\n"));
  assert_false(the_feed.closed);
  close(fd);
  stop(&s);
}

/* One address holding its share of connections (live streams behind a
 * proxy) gets a 503 for anything more, never a reset, and its probes still
 * get in (it once could not reach /healthz or /metrics at all). */
static void test_per_address_cap(void **state) {
  (void)state;
  srv s;
  start_per_ip(&s, NULL, 0, 0, 2);
  unsigned port = megad_http_port(s.h);
  memset(&the_feed, 0, sizeof the_feed);
  /* its share: a live stream and a request half sent */
  int held[2];
  const char sreq[] = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
  char buf[4096];
  held[0] = dial(port);
  assert_int_equal(write(held[0], "GET /met", 8), 8);
  held[1] = dial(port);
  assert_int_equal(write(held[1], sreq, sizeof sreq - 1), (ssize_t)(sizeof sreq - 1));
  read_for(&s, held[1], buf, 0, sizeof buf, 200);
  assert_non_null(strstr(buf, " 200 OK\r\n"));
  ask a;
  const char *r = request(&s, &a, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  assert_non_null(strstr(r, " 503 "));
  assert_non_null(strstr(r, "at most 2 connections from one address"));
  assert_non_null(strstr(r, "Retry-After: 1\r\n"));
  r = request(&s, &a, "GET /api/x HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 503 "));
  r = request(&s, &a, "GET /metrics HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  assert_non_null(strstr(r, "up 1"));
  r = request(&s, &a, "HEAD /probe HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  /* the room for probes is bounded too: past it MHD closes the connection */
  int idle[MEGAD_HTTP_PROBE_ROOM];
  for (int i = 0; i < MEGAD_HTTP_PROBE_ROOM; i++) idle[i] = dial(port);
  run_for(&s, 200);
  int extra = dial(port);
  assert_true(closed_within(&s, extra, 2000));
  close(extra);
  for (int i = 0; i < MEGAD_HTTP_PROBE_ROOM; i++) close(idle[i]);
  /* a connection let go frees its place */
  close(held[0]);
  run_for(&s, 200);
  r = request(&s, &a, "GET /api/x HTTP/1.0\r\n\r\n");
  assert_non_null(strstr(r, " 200 OK\r\n"));
  close(held[1]);
  stop(&s);
}

/* Descriptors this process holds. */
static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* The kernel's state of the IPv4 socket from local port to remote port
 * (/proc/net/tcp: 5 FIN-WAIT-2, 6 TIME-WAIT, 8 CLOSE-WAIT), or -1. */
static int tcp_state(unsigned local, unsigned remote) {
  FILE *f = fopen("/proc/net/tcp", "r");
  assert_non_null(f);
  char line[512];
  int st = -1;
  while (st < 0 && fgets(line, sizeof line, f)) {
    unsigned lp, rp, s;
    if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lp, &rp, &s) == 3 && lp == local && rp == remote)
      st = (int)s;
  }
  fclose(f);
  return st;
}

/* A client that sends part of a request and closes at once is let go at
 * once: the FIN came with its bytes, MHD saw no edge of its own for it, and
 * the socket sat in CLOSE-WAIT (a descriptor, and a place in its address's
 * share) until the 10 s timeout. A whole request whose client half-closes
 * straight after is still answered. */
static void test_half_request_then_close(void **state) {
  (void)state;
  srv s;
  start(&s, NULL, 0, 10);
  unsigned port = megad_http_port(s.h);
  int before = open_fds();
  const char *halves[] = {"GET /met", "GET /metrics HTTP/1.1\r\nHost: x\r\n",
                          "POST /api/x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"};
  for (size_t i = 0; i < 2 * sizeof halves / sizeof halves[0]; i++) {
    const char *half = halves[i / 2];
    int fd = dial(port);
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&me, &len), 0);
    unsigned mine = ntohs(me.sin_port);
    assert_int_equal(write(fd, half, strlen(half)), (ssize_t)strlen(half));
    if (i % 2) shutdown(fd, SHUT_WR); /* a half-close: the client still listens */
    else close(fd);
    /* the server's end closed: the client's goes to TIME-WAIT */
    double t0 = now_s();
    bool released = false;
    while (!released && now_s() - t0 < 5) {
      run_for(&s, 10);
      released = tcp_state(port, mine) < 0 && tcp_state(mine, port) == 6;
    }
    fprintf(stderr, "part %zu then %s: released after %.2f s\n", i / 2,
            i % 2 ? "shutdown" : "close", now_s() - t0);
    assert_true(released);
    assert_true(now_s() - t0 < 1);
    assert_int_equal(megad_http_connections(s.h), 0);
    if (i % 2) close(fd);
    assert_int_equal(open_fds(), before);
  }
  /* a whole request, then a half-close: answered */
  int fd = dial(port);
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
  shutdown(fd, SHUT_WR);
  char buf[4096];
  read_for(&s, fd, buf, 0, sizeof buf, 300);
  assert_non_null(strstr(buf, " 200 OK\r\n"));
  assert_non_null(strstr(buf, "up 1\n"));
  close(fd);
  stop(&s);
}

static void test_bad_listen(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  const char *bad[] = {"127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:80x", "9100",
                       "localhost:9100", ":9100"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    megad_http_opts o = {.listen = bad[i], .path = "/metrics", .body = body};
    megad_http *h = NULL;
    mega_err err = {0};
    assert_int_equal(megad_http_start(&loop, &o, &h, &err), MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, bad[i]));
    assert_null(h);
  }
  /* a port taken */
  srv s;
  start(&s, NULL, 0, 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", megad_http_port(s.h));
  megad_http_opts o = {.listen = addr, .path = "/metrics", .body = body};
  megad_http *h = NULL;
  mega_err err = {0};
  assert_int_equal(megad_http_start(&loop, &o, &h, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, addr));
  stop(&s);
  /* IPv6 loopback, when the machine has it */
  o.listen = "[::1]:0";
  if (megad_http_start(&loop, &o, &h, &err) == MEGA_OK) megad_http_stop(h);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_server),
      cmocka_unit_test(test_bearer_token),
      cmocka_unit_test(test_slow_and_too_many),
      cmocka_unit_test(test_stream),
      cmocka_unit_test(test_head_deadline),
      cmocka_unit_test(test_per_address_cap),
      cmocka_unit_test(test_half_request_then_close),
      cmocka_unit_test(test_bad_listen),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
