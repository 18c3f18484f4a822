/* The web view over this megad's layers (see webserve.h). */
#include "daemon/web/webserve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/jobs/jobtrace.h"
#include "daemon/model/util.h"
#include "daemon/web/weblogin.h"
#include "daemon/web/websse.h"

struct megad_webserve {
  megad_services *sv;
  megad_web_login *login; /* NULL: no token */
  megad_sse *sse;
};

static char *load_trace(void *arg, const char *job_id, size_t *len) {
  return megad_trace_load(((megad_webserve *)arg)->sv->b, job_id, len);
}

static void open_stream(void *arg, const mega_job *j, uint64_t since, const char *peer,
                        megad_web_resp *out) {
  megad_sse_open(((megad_webserve *)arg)->sse, j, since, peer, out);
}

static void on_item(void *arg, const mega_job *j, const Mega__V1__WatchJobResponse *item) {
  (void)item;
  megad_sse_notify(((megad_webserve *)arg)->sse, j);
}

megad_webserve *megad_webserve_new(megad_services *sv, const char *token) {
  megad_webserve *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->sv = sv;
  w->sse = megad_sse_new(sv->b->loop, &sv->jobs->t);
  if (token && token[0]) w->login = megad_web_login_new(token);
  if (!w->sse || (token && token[0] && !w->login)) {
    megad_webserve_free(w);
    return NULL;
  }
  megad_jobs_listen(sv->jobs, on_item, w);
  return w;
}

void megad_webserve_free(megad_webserve *w) {
  if (!w) return;
  if (w->sv->jobs->on_item_arg == w) megad_jobs_listen(w->sv->jobs, NULL, NULL);
  megad_sse_free(w->sse);
  megad_web_login_free(w->login);
  free(w);
}

size_t megad_webserve_streams(const megad_webserve *w) { return megad_sse_streams(w->sse); }

static void plain(megad_http_resp *out, unsigned status, const char *msg) {
  *out = (megad_http_resp){.status = status, .type = "text/plain; charset=utf-8",
                           .body = strdup(msg), .len = strlen(msg)};
}

static void form(megad_http_resp *out, unsigned status, const char *next, bool wrong) {
  size_t len = 0;
  char *page = megad_web_login_form(next, wrong, &len);
  *out = (megad_http_resp){.status = status, .type = "text/html; charset=utf-8", .body = page,
                           .len = len};
}

static void see_other(megad_http_resp *out, char *location, char *cookie) {
  plain(out, 303, "see the Location header\n");
  out->location = location;
  out->set_cookie = cookie;
}

static bool is_page(const char *path) { return !strcmp(path, "/") || !strncmp(path, "/jobs/", 6); }

/* /login and /logout, and whether the request may go on to the view. */
static bool gate(megad_webserve *w, const megad_http_req *req, const char *path,
                 megad_http_resp *out) {
  bool post = !strcmp(req->method, "POST");
  bool get = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD");
  const char *cookies = megad_http_header(req, "Cookie");
  int64_t now = megad_unix_ms();
  if (!strcmp(path, "/login")) {
    if (!post && !get) {
      plain(out, 405, "the login form is GET /login, and the login POST /login\n");
      out->allow = "GET, HEAD, POST";
      return false;
    }
    if (!post) {
      form(out, 200, "/", false);
      return false;
    }
    char *cookie, *location;
    uint64_t refusals;
    int64_t retry_ms;
    if (megad_web_login_post(w->login, req->body, req->peer, now, &cookie, &location, &refusals,
                             &retry_ms)) {
      megad_log(w->sv->b, "web view: a login from %s", req->peer);
      see_other(out, location, cookie);
      return false;
    }
    if (refusals == 1)
      megad_warn(w->sv->b, "web view: refused a login from %s: wrong token", req->peer);
    else if (refusals)
      megad_warn(w->sv->b, "web view: refused %llu logins with a wrong token; the last from %s",
                 (unsigned long long)refusals, req->peer);
    if (retry_ms > 0) {
      unsigned secs = (unsigned)((retry_ms + 999) / 1000);
      char msg[160];
      snprintf(msg, sizeof msg, "too many wrong tokens from %s: try again in %u s\n", req->peer,
               secs);
      plain(out, 429, msg);
      out->retry_after_s = secs;
      return false;
    }
    char next[520];
    form(out, 401, megad_web_form_get(req->body, "next", next, sizeof next) ? next : "/", true);
    return false;
  }
  if (!strcmp(path, "/logout")) {
    if (!post) {
      plain(out, 405, "log out with POST /logout (the page's button)\n");
      out->allow = "POST";
      return false;
    }
    char *cookie;
    megad_web_logout(w->login, cookies, &cookie);
    see_other(out, strdup("/login"), cookie);
    return false;
  }
  if (req->bearer_ok || megad_web_session_ok(w->login, cookies, now)) return true;
  if (is_page(path))
    form(out, 401, path, false);
  else
    plain(out, 401,
          "megad wants its cluster token: log in at /login (a cookie), or send the header "
          "'Authorization: Bearer TOKEN'\n");
  return false;
}

bool megad_webserve_route(megad_webserve *w, const megad_http_req *req, megad_http_resp *out) {
  char path[1024];
  const char *q = strchr(req->target, '?');
  size_t n = q ? (size_t)(q - req->target) : strlen(req->target);
  if (n >= sizeof path) return false;
  memcpy(path, req->target, n);
  path[n] = '\0';
  bool login_path = !strcmp(path, "/login") || !strcmp(path, "/logout");
  if (!megad_web_owns(path) && !login_path) return false;
  if (w->login && !gate(w, req, path, out)) return true;
  if (login_path) {
    plain(out, 404, "this megad has no cluster token, so no login: the page is open at /\n");
    return true;
  }
  megad_services *sv = w->sv;
  /* etcd mode: the other nodes' loads are read, not watched; this page shows
   * them as of the last read, and asks for a new one for the next */
  megad_members_read_loads(sv->members, 1000, NULL, NULL);
  megad_web_data d = {.jobs = &sv->jobs->t,
                      .mirror = sv->jobs->etcd ? &sv->jobs->mirror : NULL,
                      .nodes = sv->members->nodes, .nnodes = sv->members->nnodes, .load_trace = load_trace,
                      .open_stream = open_stream, .arg = w,
                      .last_event_id = megad_http_header(req, "Last-Event-ID"),
                      .peer = req->peer,
                      .login = w->login != NULL};
  megad_web_resp r;
  megad_web_handle(&d, req->method, path, q ? q + 1 : NULL, &r);
  *out = (megad_http_resp){.status = (unsigned)r.status, .type = r.type, .body = r.body,
                           .len = r.len, .stream = r.stream};
  return true; /* the body is the server's now */
}
