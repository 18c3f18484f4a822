/* The web view's router (see web.h). */
#include "daemon/web/web.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/web/webassets.h"
#include "daemon/web/webjson.h"

static const char T_TEXT[] = "text/plain; charset=utf-8";
static const char T_JSON[] = "application/json";

void megad_web_resp_free(megad_web_resp *r) {
  free(r->body);
  r->body = NULL;
  r->len = 0;
}

static void set_body(megad_web_resp *r, int status, const char *type, const void *p, size_t len) {
  r->status = status;
  r->type = type;
  r->body = malloc(len + 1);
  if (!r->body) { /* a body the server can always send */
    r->status = 503;
    r->type = T_TEXT;
    r->body = NULL;
    r->len = 0;
    return;
  }
  memcpy(r->body, p, len);
  r->body[len] = '\0';
  r->len = len;
}

static void text(megad_web_resp *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void text(megad_web_resp *r, int status, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n > sizeof buf - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  set_body(r, status, T_TEXT, buf, (size_t)n);
}

/* Takes doc's reference. */
static void json_resp(megad_web_resp *r, json_t *doc) {
  /* 7 significant digits: plenty for a plot, half the bytes of a full double */
  char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
  json_decref(doc);
  if (!s) {
    text(r, 503, "out of memory");
    return;
  }
  r->status = 200;
  r->type = T_JSON;
  r->body = s;
  r->len = strlen(s);
}

bool megad_web_owns(const char *path) {
  return !strcmp(path, "/") || !strcmp(path, "/page.js") || !strncmp(path, "/jobs/", 6) ||
         !strncmp(path, "/api/", 5);
}

/* Percent-decodes src[0, n) into dst (cap bytes), '+' a space when plus;
 * false when it does not fit or is malformed. */
static bool unescape(const char *src, size_t n, char *dst, size_t cap, bool plus) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (o + 1 >= cap) return false;
    char c = src[i];
    if (c == '+' && plus) c = ' ';
    if (c == '%') {
      unsigned v;
      if (i + 2 >= n || !isxdigit((unsigned char)src[i + 1]) ||
          !isxdigit((unsigned char)src[i + 2]) || sscanf(src + i + 1, "%2x", &v) != 1)
        return false;
      c = (char)v;
      i += 2;
    }
    if (c == '\0') return false;
    dst[o++] = c;
  }
  dst[o] = '\0';
  return true;
}

/* The value of key in a query ("a=1&since=5"), decoded into buf; false when
 * absent. */
static bool query_get(const char *q, const char *key, char *buf, size_t cap, bool plus) {
  size_t kl = strlen(key);
  for (const char *p = q; p && *p;) {
    const char *amp = strchr(p, '&');
    size_t len = amp ? (size_t)(amp - p) : strlen(p);
    if (len > kl && !strncmp(p, key, kl) && p[kl] == '=')
      return unescape(p + kl + 1, len - kl - 1, buf, cap, plus);
    p = amp ? amp + 1 : NULL;
  }
  return false;
}

bool megad_web_form_get(const char *form, const char *key, char *buf, size_t cap) {
  return query_get(form, key, buf, cap, true);
}

/* The cursor: a reconnecting stream's Last-Event-ID (the id of the last
 * steps event it got: newer than the since= of its URL), else since= in the
 * query, else 0. */
static bool since_of(megad_web_resp *r, const char *query, const char *last_id, uint64_t *since) {
  char v[32];
  *since = 0;
  if (last_id && strlen(last_id) < sizeof v)
    strcpy(v, last_id);
  else if (!query_get(query, "since", v, sizeof v, false))
    return true;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || errno || v[0] == '-') {
    text(r, 400, "since=%.30s: give the \"next\" of the previous answer (0 for every point)", v);
    return false;
  }
  *since = x;
  return true;
}

static void api(megad_web_resp *r, const megad_web_data *d, const char *rest, const char *query,
                bool head) {
  if (!strcmp(rest, "cluster")) {
    json_t *c = megad_webjson_cluster(d);
    if (c) json_object_set_new(c, "login", json_boolean(d->login));
    return json_resp(r, c);
  }
  if (!strcmp(rest, "jobs")) return json_resp(r, megad_webjson_jobs(d->jobs, d->mirror));
  if (strncmp(rest, "jobs/", 5)) return text(r, 404, "no such endpoint: /api/%.200s", rest);
  rest += 5;
  const char *slash = strchr(rest, '/');
  char id[256];
  if (!unescape(rest, slash ? (size_t)(slash - rest) : strlen(rest), id, sizeof id, false) ||
      !id[0])
    return text(r, 400, "a job id in /api/jobs/ID is malformed");
  const mega_job *j = mega_jobs_table_find(d->jobs, id);
  const mega_job *m = j || !d->mirror ? NULL : mega_jobs_table_find(d->mirror, id);
  if (m && !slash) return json_resp(r, megad_webjson_job(m)); /* record and events from etcd */
  if (m)
    return text(r, 404, "job %.200s is coordinated by node %.200s: its steps and trace are "
                        "there (open that node's web view)", id,
                m->coordinator && m->coordinator[0] ? m->coordinator : "?");
  if (!j)
    return text(r, 404, "no job %.200s on this megad (it shows the jobs it coordinates)", id);
  if (!slash) return json_resp(r, megad_webjson_job(j));
  uint64_t since;
  if (!strcmp(slash, "/steps")) {
    if (since_of(r, query, NULL, &since)) json_resp(r, megad_webjson_steps(j, since, SIZE_MAX));
    return;
  }
  if (!strcmp(slash, "/stream")) {
    if (!since_of(r, query, d->last_event_id, &since)) return;
    if (!d->open_stream) return text(r, 404, "this server has no live streams: poll /steps");
    /* HEAD: the headers a stream would have, and no stream held open */
    if (head) return set_body(r, 200, "text/event-stream; charset=utf-8", "", 0);
    d->open_stream(d->arg, j, since, d->peer ? d->peer : "?", r);
    return;
  }
  if (!strcmp(slash, "/trace")) {
    size_t len = 0;
    char *t = d->load_trace ? d->load_trace(d->arg, j->id, &len) : NULL;
    if (!t)
      return text(r, 404, "job %.200s has no trace%s: submit it with --trace-iteration K", j->id,
                  mega_job_state_final(j->state) ? "" : " yet");
    r->status = 200;
    r->type = T_JSON;
    r->body = t;
    r->len = len;
    return;
  }
  text(r, 404, "no such endpoint: /api/jobs/ID%.200s", slash);
}

void megad_web_handle(const megad_web_data *d, const char *method, const char *path,
                      const char *query, megad_web_resp *out) {
  memset(out, 0, sizeof *out);
  /* HEAD answers as GET does: the server sends the headers only */
  bool head = !strcmp(method, "HEAD");
  if (strcmp(method, "GET") && !head)
    return text(out, 405, "the web view is read-only: use GET (or HEAD)");
  if (!strcmp(path, "/") || !strncmp(path, "/jobs/", 6))
    return set_body(out, 200, "text/html; charset=utf-8", megad_web_page_html,
                    megad_web_page_html_len);
  if (!strcmp(path, "/page.js"))
    return set_body(out, 200, "text/javascript; charset=utf-8", megad_web_page_js,
                    megad_web_page_js_len);
  if (!strncmp(path, "/api/", 5)) return api(out, d, path + 5, query, head);
  text(out, 404, "no page %.200s", path);
}
