/* The web view's login (see weblogin.h). */
#include "daemon/web/weblogin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "core/secret.h"
#include "core/throttle.h"
#include "daemon/web/http.h"
#include "daemon/web/web.h"

#define ID_BYTES 32

typedef struct session {
  char id[2 * ID_BYTES + 1]; /* "" : a free slot */
  int64_t created_ms;
} session;

struct megad_web_login {
  char *token;
  size_t token_len;
  session s[MEGAD_WEB_SESSIONS_MAX];
  mega_throttle *guesses;  /* wrong tokens per address */
  uint64_t refused;        /* refusals since the last log line */
  int64_t refused_log_ms;  /* when that line was */
};

megad_web_login *megad_web_login_new(const char *token) {
  megad_web_login *l = calloc(1, sizeof *l);
  if (!l || !(l->token = strdup(token)) || !(l->guesses = mega_throttle_new())) {
    if (l) free(l->token);
    free(l);
    return NULL;
  }
  l->token_len = strlen(token);
  return l;
}

void megad_web_login_free(megad_web_login *l) {
  if (!l) return;
  free(l->token);
  mega_throttle_free(l->guesses);
  free(l);
}

/* The value of our cookie in a Cookie header ("a=1; mega_session=ID"), or
 * false. */
static bool cookie_value(const char *hdr, char *buf, size_t cap) {
  const size_t kl = strlen(MEGAD_WEB_COOKIE);
  for (const char *p = hdr; p && *p;) {
    while (*p == ' ') p++;
    const char *semi = strchr(p, ';');
    size_t len = semi ? (size_t)(semi - p) : strlen(p);
    if (len > kl && !strncmp(p, MEGAD_WEB_COOKIE, kl) && p[kl] == '=') {
      len -= kl + 1;
      if (len >= cap) return false;
      memcpy(buf, p + kl + 1, len);
      buf[len] = '\0';
      return true;
    }
    p = semi ? semi + 1 : NULL;
  }
  return false;
}

/* The slot of the live session cookie_header names, or -1. Every slot is
 * compared in full, so timing says nothing of which or how close. */
static int find(megad_web_login *l, const char *cookie_header, int64_t now_ms) {
  char v[2 * ID_BYTES + 8];
  if (!cookie_value(cookie_header, v, sizeof v)) return -1;
  size_t vl = strlen(v);
  int found = -1;
  for (int i = 0; i < MEGAD_WEB_SESSIONS_MAX; i++) {
    session *s = &l->s[i];
    if (!s->id[0]) continue;
    if (now_ms - s->created_ms > (int64_t)MEGAD_WEB_SESSION_S * 1000) {
      s->id[0] = '\0'; /* expired */
      continue;
    }
    if (mega_secret_equal(v, vl, s->id, 2 * ID_BYTES)) found = i;
  }
  return found;
}

bool megad_web_session_ok(megad_web_login *l, const char *cookie_header, int64_t now_ms) {
  return find(l, cookie_header, now_ms) >= 0;
}

/* next when it is a path of this megad made of plain characters (so it is
 * safe in a header and an HTML attribute), else "/". Never "//host". */
static const char *safe_next(const char *next) {
  if (!next || next[0] != '/' || next[1] == '/' || strlen(next) > 512) return "/";
  for (const char *p = next; *p; p++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-_.~%", *p))
      return "/";
  return next;
}

static char *cookie(const char *id, long max_age) {
  char *c = NULL;
  if (asprintf(&c, "%s=%s; HttpOnly; SameSite=Strict; Path=/; Max-Age=%ld", MEGAD_WEB_COOKIE, id,
               max_age) < 0)
    return NULL;
  return c;
}

bool megad_web_login_post(megad_web_login *l, const char *form, const char *peer, int64_t now_ms,
                          char **set_cookie, char **location, uint64_t *refusals,
                          int64_t *retry_ms) {
  *set_cookie = *location = NULL;
  *refusals = 0;
  int64_t hold_ms = 0;
  if (!retry_ms) retry_ms = &hold_ms;
  char sent[4097], next[520], src[MEGA_THROTTLE_KEY_MAX];
  mega_throttle_source(peer, src, sizeof src);
  /* held off: not looked at, so a guesser learns nothing until then */
  if ((*retry_ms = mega_throttle_wait(l->guesses, src, now_ms)) > 0) return false;
  bool ok = megad_web_form_get(form, "token", sent, sizeof sent);
  /* compared even when absent, so a refusal takes the same time */
  ok = mega_secret_equal(sent, ok ? strlen(sent) : 0, l->token, l->token_len) && ok;
  if (!ok) {
    *retry_ms = mega_throttle_fail(l->guesses, src, now_ms);
    l->refused++;
    if (!l->refused_log_ms || now_ms - l->refused_log_ms >= 1000) {
      *refusals = l->refused;
      l->refused = 0;
      l->refused_log_ms = now_ms;
    }
    return false;
  }
  mega_throttle_forget(l->guesses, src);
  unsigned char raw[ID_BYTES];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return false;
  int slot = 0; /* a free one, else the oldest */
  for (int i = 0; i < MEGAD_WEB_SESSIONS_MAX; i++) {
    if (!l->s[i].id[0]) {
      slot = i;
      break;
    }
    if (l->s[i].created_ms < l->s[slot].created_ms) slot = i;
  }
  session *s = &l->s[slot];
  for (int i = 0; i < ID_BYTES; i++) snprintf(s->id + 2 * i, 3, "%02x", raw[i]);
  s->created_ms = now_ms;
  if (!megad_web_form_get(form, "next", next, sizeof next)) next[0] = '\0';
  *set_cookie = cookie(s->id, MEGAD_WEB_SESSION_S);
  *location = strdup(safe_next(next));
  return true;
}

void megad_web_logout(megad_web_login *l, const char *cookie_header, char **set_cookie) {
  int i = find(l, cookie_header, 0);
  if (i >= 0) l->s[i].id[0] = '\0';
  *set_cookie = cookie("", 0);
}

char *megad_web_login_form(const char *next, bool wrong, size_t *len) {
  char *page = NULL;
  int n = asprintf(
      &page,
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; form-action 'self'\">\n"
      "<title>mega · log in</title>\n<style>body{font:14px/1.4 system-ui,sans-serif;"
      "background:#f6f7f9;margin:0}form{max-width:360px;margin:12vh auto;background:#fff;"
      "border:1px solid #d8dde3;border-radius:6px;padding:1.2em}input{width:100%%;"
      "padding:.4em;margin:.4em 0;font:inherit}.err{color:#c92a2a}</style></head>\n"
      "<body><form id=\"login\" method=\"post\" action=\"/login\">\n"
      "<h1 style=\"font-size:18px\">mega</h1>\n"
      "<p>This megad wants its cluster token (the contents of its --token-file).</p>\n%s"
      "<input type=\"password\" name=\"token\" autocomplete=\"current-password\" "
      "autofocus required>\n<input type=\"hidden\" name=\"next\" value=\"%s\">\n"
      "<input type=\"submit\" value=\"Log in\">\n</form></body></html>\n",
      wrong ? "<p class=\"err\" id=\"wrong\">That is not the token.</p>\n" : "", safe_next(next));
  if (n < 0) return NULL;
  *len = (size_t)n;
  return page;
}
