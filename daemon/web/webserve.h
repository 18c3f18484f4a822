/* The web view (daemon/web/web.h) over this megad's layers: the data it reads,
 * its live streams (websse.h), and with a cluster token its login
 * (weblogin.h), as the route hook of the HTTP server (http.h). Services
 * layer.
 *
 * With a token, a request is let in when it carries the token
 * (`Authorization: Bearer`) or a live session cookie; otherwise a page
 * (/, /jobs/ID) is the login form (401) and anything else a 401 saying how
 * to get in. POST /login checks the token (a wrong one: 401 and the form
 * again, logged at most once a second) and sets the cookie; POST /logout
 * ends the session. */
#ifndef MEGA_DAEMON_WEBSERVE_H
#define MEGA_DAEMON_WEBSERVE_H

#include "daemon/services/services.h"
#include "daemon/web/http.h"

typedef struct megad_webserve megad_webserve;

/* token: the cluster token (NULL or "": the page is open). Registers with
 * the jobs layer to hear of news for the live streams. NULL: out of memory. */
megad_webserve *megad_webserve_new(megad_services *sv, const char *token);
/* After the HTTP server stopped. */
void megad_webserve_free(megad_webserve *w);
/* The route hook (http.h): answers req when the path is the web view's. */
bool megad_webserve_route(megad_webserve *w, const megad_http_req *req, megad_http_resp *out);
/* Live streams open now. */
size_t megad_webserve_streams(const megad_webserve *w);

#endif
