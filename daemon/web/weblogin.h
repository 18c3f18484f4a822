/* The web view's login, for a megad with a cluster token: a browser cannot
 * send `Authorization: Bearer`, so the page asks for the token once and
 * keeps a session cookie instead.
 *
 * The cookie holds a random session id (32 bytes from getrandom, in hex)
 * that megad keeps in memory, never the token nor anything computed from
 * it: a stolen cookie or a log line tells nothing about the token (an HMAC
 * of it could be tested against guesses offline), and logout really ends a
 * session (megad forgets the id) where a signed cookie would stay valid
 * until it expired. Sessions end with megad, after MEGAD_WEB_SESSION_S, or
 * when MEGAD_WEB_SESSIONS_MAX newer ones push them out.
 *
 * Pure but for getrandom; the clock is the caller's. Ids and tokens are
 * compared in constant time (mega_secret_equal). */
#ifndef MEGA_DAEMON_WEBLOGIN_H
#define MEGA_DAEMON_WEBLOGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MEGAD_WEB_COOKIE "mega_session"
#define MEGAD_WEB_SESSIONS_MAX 64
#define MEGAD_WEB_SESSION_S (7 * 24 * 3600) /* a week */

typedef struct megad_web_login megad_web_login;

/* For token (copied); NULL when out of memory. */
megad_web_login *megad_web_login_new(const char *token);
void megad_web_login_free(megad_web_login *l);

/* Whether cookie_header (the request's Cookie header; NULL: none) names a
 * live session. */
bool megad_web_session_ok(megad_web_login *l, const char *cookie_header, int64_t now_ms);

/* A POST to /login from peer (its address): form is its body
 * (token=...&next=...). Right token: a new session, *set_cookie its
 * Set-Cookie value (HttpOnly; SameSite=Strict; Path=/), *location where to
 * go (the page it came from), true. Wrong: false, and *refusals, when a log
 * line is due (at most one a second), how many refusals it covers (0: none
 * due). Both strings malloc'd. After MEGA_THROTTLE_FREE wrong tokens from
 * one address (core/throttle.h) its logins are not looked at for a while
 * that doubles with each further one (up to a minute): false, with
 * *retry_ms (may be NULL) how long that is (0: not held off); a right token
 * starts the address afresh. */
bool megad_web_login_post(megad_web_login *l, const char *form, const char *peer, int64_t now_ms,
                          char **set_cookie, char **location, uint64_t *refusals,
                          int64_t *retry_ms);
/* A POST to /logout: forgets the session the cookie names; *set_cookie
 * clears the cookie (malloc'd). */
void megad_web_logout(megad_web_login *l, const char *cookie_header, char **set_cookie);

/* The login form (malloc'd HTML, *len bytes) that returns to next (a path
 * of this megad; anything else returns to /); wrong says the last try was
 * refused. */
char *megad_web_login_form(const char *next, bool wrong, size_t *len);

#endif
