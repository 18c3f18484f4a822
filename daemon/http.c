/* GET /metrics: Prometheus text for the jobs this megad coordinates. A tiny
 * HTTP/1.0 responder on libuv: one request per connection, then close. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/services.h"
#include "daemon/webserve.h"

#define REQ_MAX 8192

typedef struct http_srv {
  megad_services *s;
  uv_tcp_t tcp;
  int conns;
  bool closing;
} http_srv;

typedef struct http_conn {
  http_srv *s;
  uv_tcp_t tcp;
  char req[REQ_MAX];
  size_t len;
  bool answered;
} http_conn;

typedef struct http_write {
  uv_write_t w;
  char *buf;
} http_write;

/* ---- the page ---- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
    char *p = realloc(b->p, cap);
    if (!p) return;
    b->p = p;
    b->cap = cap;
  }
}

/* Label values escape backslash, quote and newline. */
static void label(char *out, size_t cap, const char *s) {
  size_t o = 0;
  for (; s && *s && o + 3 < cap; s++) {
    if (*s == '\\' || *s == '"') out[o++] = '\\';
    if (*s == '\n') {
      out[o++] = '\\';
      out[o++] = 'n';
      continue;
    }
    out[o++] = *s;
  }
  out[o] = '\0';
}

static char *page(megad_services *sv) {
  const mega_jobs *jobs = &sv->jobs->t;
  sbuf b = {0};
  static const mega_job_state states[] = {MEGA_JOB_PENDING, MEGA_JOB_RUNNING, MEGA_JOB_SUCCEEDED,
                                          MEGA_JOB_FAILED, MEGA_JOB_CANCELLED, MEGA_JOB_RESTARTING};
  addf(&b, "# HELP mega_jobs Jobs this megad coordinates, by state.\n# TYPE mega_jobs gauge\n");
  for (size_t s = 0; s < sizeof states / sizeof states[0]; s++) {
    size_t n = 0;
    for (size_t i = 0; i < jobs->n; i++) n += jobs->v[i]->state == states[s];
    addf(&b, "mega_jobs{state=\"%s\"} %zu\n", mega_job_state_name(states[s]), n);
  }
  addf(&b, "# HELP mega_node_slots Worker slots of this node.\n# TYPE mega_node_slots gauge\n"
           "mega_node_slots %u\n# HELP mega_node_slots_used Slots running workers.\n"
           "# TYPE mega_node_slots_used gauge\nmega_node_slots_used %u\n",
       sv->L->o.slots, sv->L->slots_used);
  /* Prometheus wants each family's lines together: one pass per family. */
  size_t n = jobs->n;
  char (*ids)[256] = calloc(n ? n : 1, sizeof *ids);
  if (!ids) return b.p;
  for (size_t i = 0; i < n; i++) label(ids[i], sizeof ids[i], jobs->v[i]->id);
  addf(&b, "# HELP mega_job_last_iteration The last iteration every rank finished.\n"
           "# TYPE mega_job_last_iteration gauge\n");
  for (size_t i = 0; i < n; i++) {
    char name[256];
    label(name, sizeof name, jobs->v[i]->name);
    addf(&b, "mega_job_last_iteration{job=\"%s\",name=\"%s\",state=\"%s\"} %llu\n", ids[i],
         name, mega_job_state_name(jobs->v[i]->state),
         (unsigned long long)jobs->v[i]->last_iteration);
  }
  addf(&b, "# HELP mega_job_loss Loss of the last iteration.\n# TYPE mega_job_loss gauge\n");
  for (size_t i = 0; i < n; i++)
    if (jobs->v[i]->last_step)
      addf(&b, "mega_job_loss{job=\"%s\"} %.9g\n", ids[i], jobs->v[i]->last_step->loss);
  addf(&b, "# HELP mega_job_tokens_per_second Global tokens per second, last iteration.\n"
           "# TYPE mega_job_tokens_per_second gauge\n");
  for (size_t i = 0; i < n; i++)
    if (jobs->v[i]->last_step)
      addf(&b, "mega_job_tokens_per_second{job=\"%s\"} %.9g\n", ids[i],
           jobs->v[i]->last_step->tokens_per_s);
  addf(&b, "# HELP mega_job_bubble_fraction Pipeline bubble time over step time, all ranks.\n"
           "# TYPE mega_job_bubble_fraction gauge\n");
  for (size_t i = 0; i < n; i++) {
    const Mega__V1__StepMetrics *s = jobs->v[i]->last_step;
    if (!s) continue;
    double bubble = 0, time = 0;
    for (size_t r = 0; r < s->n_ranks; r++) {
      bubble += s->ranks[r]->bubble_s;
      time += s->ranks[r]->step_time_s;
    }
    addf(&b, "mega_job_bubble_fraction{job=\"%s\"} %.6f\n", ids[i], time > 0 ? bubble / time : 0.0);
  }
  addf(&b, "# HELP mega_rank_bubble_fraction One rank's bubble time over its step time.\n"
           "# TYPE mega_rank_bubble_fraction gauge\n");
  for (size_t i = 0; i < n; i++) {
    const Mega__V1__StepMetrics *s = jobs->v[i]->last_step;
    for (size_t r = 0; s && r < s->n_ranks; r++) {
      const Mega__V1__RankMetrics *m = s->ranks[r];
      addf(&b, "mega_rank_bubble_fraction{job=\"%s\",rank=\"%u\",pp_rank=\"%u\"} %.6f\n", ids[i],
           m->rank, m->pp_rank, m->step_time_s > 0 ? m->bubble_s / m->step_time_s : 0.0);
    }
  }
  addf(&b, "# HELP mega_job_step_report_delay_seconds From the slowest rank's step end to the "
           "coordinator's merge.\n# TYPE mega_job_step_report_delay_seconds summary\n");
  for (size_t i = 0; i < n; i++) {
    const mega_job *j = jobs->v[i];
    if (j->report_delay_n)
      addf(&b, "mega_job_step_report_delay_seconds_sum{job=\"%s\"} %.9g\n"
               "mega_job_step_report_delay_seconds_count{job=\"%s\"} %llu\n",
           ids[i], j->report_delay_sum_s, ids[i], (unsigned long long)j->report_delay_n);
  }
  free(ids);
  return b.p;
}

/* ---- the responder ---- */

static void conn_closed(uv_handle_t *h) {
  http_conn *c = h->data;
  http_srv *s = c->s;
  free(c);
  if (--s->conns == 0 && s->closing) free(s);
}

static void written(uv_write_t *w, int status) {
  (void)status;
  http_write *hw = (http_write *)w;
  http_conn *c = w->data;
  free(hw->buf);
  free(hw);
  if (!uv_is_closing((uv_handle_t *)&c->tcp)) uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void respond(http_conn *c, int code, const char *type, const char *body) {
  c->answered = true;
  uv_read_stop((uv_stream_t *)&c->tcp);
  http_write *hw = calloc(1, sizeof *hw);
  const char *reason = code == 200   ? "OK"
                       : code == 404 ? "Not Found"
                       : code == 405 ? "Method Not Allowed"
                       : code == 503 ? "Service Unavailable"
                                     : "Bad Request";
  if (!hw || asprintf(&hw->buf,
                      "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n%s",
                      code, reason, type, strlen(body), body) < 0) {
    free(hw);
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    return;
  }
  hw->w.data = c;
  uv_buf_t buf = uv_buf_init(hw->buf, (unsigned)strlen(hw->buf));
  if (uv_write(&hw->w, (uv_stream_t *)&c->tcp, &buf, 1, written)) {
    free(hw->buf);
    free(hw);
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
  }
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  http_conn *c = h->data;
  buf->base = c->req + c->len;
  buf->len = REQ_MAX - 1 - c->len;
}

/* The web view (daemon/web.h): "METHOD TARGET HTTP/1.x" for its paths. */
static bool web(http_conn *c) {
  char method[16], target[2048];
  if (sscanf(c->req, "%15s %2047s", method, target) != 2) return false;
  megad_web_resp r;
  if (!megad_web_serve(c->s->s, method, target, &r)) return false;
  respond(c, r.status, r.type, r.body ? r.body : "");
  megad_web_resp_free(&r);
  return true;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  http_conn *c = st->data;
  if (c->answered) return;
  if (n < 0) {
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    return;
  }
  c->len += (size_t)n;
  c->req[c->len] = '\0';
  if (!strstr(c->req, "\r\n\r\n") && !strstr(c->req, "\n\n")) {
    if (c->len >= REQ_MAX - 1) respond(c, 400, "text/plain", "request too large\n");
    return;
  }
  if (!strncmp(c->req, "GET /metrics ", 13) || !strncmp(c->req, "GET /metrics?", 13)) {
    char *body = page(c->s->s);
    respond(c, 200, "text/plain; version=0.0.4", body ? body : "");
    free(body);
  } else if (web(c)) {
  } else if (!strncmp(c->req, "GET ", 4)) {
    respond(c, 404, "text/plain", "megad serves /metrics and the web view at /\n");
  } else {
    respond(c, 400, "text/plain", "only GET is served\n");
  }
}

static void on_conn(uv_stream_t *server, int status) {
  http_srv *s = server->data;
  if (status < 0 || s->closing) return;
  http_conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->s = s;
  uv_tcp_init(s->s->b->loop, &c->tcp);
  c->tcp.data = c;
  s->conns++;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) ||
      uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read))
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void listener_closed(uv_handle_t *h) {
  http_srv *s = h->data;
  if (--s->conns == 0) free(s);
}

mega_status megad_http_start(megad_services *sv, const char *addr, mega_err *err) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr)
    return mega_fail(err, MEGA_ERR_INVALID, "--metrics-listen %s: give HOST:PORT", addr);
  snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
  int port = atoi(colon + 1);
  struct sockaddr_storage sa;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa))
    return mega_fail(err, MEGA_ERR_INVALID, "--metrics-listen %s: '%s' is not an IP address", addr,
                     host);
  http_srv *s = calloc(1, sizeof *s);
  if (!s) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  s->s = sv;
  s->conns = 1; /* the listener itself */
  uv_tcp_init(sv->b->loop, &s->tcp);
  s->tcp.data = s;
  int rc = uv_tcp_bind(&s->tcp, (struct sockaddr *)&sa, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&s->tcp, 64, on_conn);
  if (rc) {
    s->closing = true;
    uv_close((uv_handle_t *)&s->tcp, listener_closed);
    return mega_fail(err, MEGA_ERR_IO, "cannot serve /metrics on %s: %s", addr, uv_strerror(rc));
  }
  sv->http = s;
  return MEGA_OK;
}

void megad_http_stop(megad_services *sv) {
  http_srv *s = sv->http;
  if (!s) return;
  sv->http = NULL;
  s->closing = true;
  uv_close((uv_handle_t *)&s->tcp, listener_closed);
}
