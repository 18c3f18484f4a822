/* The web view's JSON documents (web.h lists the endpoints). Each returns a
 * new jansson reference (NULL when out of memory). Pure. */
#ifndef MEGA_DAEMON_WEBJSON_H
#define MEGA_DAEMON_WEBJSON_H

#include <jansson.h>

#include "daemon/web.h"

json_t *megad_webjson_cluster(const megad_web_data *d);
json_t *megad_webjson_jobs(const mega_jobs *t);
json_t *megad_webjson_job(const mega_job *j);
json_t *megad_webjson_steps(const mega_job *j, uint64_t since);

#endif
