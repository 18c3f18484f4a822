/* The web view (daemon/web.h) over this megad's layers: the data it reads
 * and one call an HTTP server makes per request. Services layer. */
#ifndef MEGA_DAEMON_WEBSERVE_H
#define MEGA_DAEMON_WEBSERVE_H

#include "daemon/services.h"
#include "daemon/web.h"

/* The jobs, the membership view and the traces of sv (borrowed: valid until
 * the loop runs again). */
megad_web_data megad_web_data_of(megad_services *sv);
/* Answers method for target ("/api/jobs?x=1": the path with its query) when
 * megad_web_owns its path, and returns true; false (out untouched) when the
 * path is not the web view's. Free out with megad_web_resp_free. */
bool megad_web_serve(megad_services *sv, const char *method, const char *target,
                     megad_web_resp *out);

#endif
