/* The web view's JSON documents (web.h lists the endpoints). Each returns a
 * new jansson reference (NULL when out of memory). Pure. */
#ifndef MEGA_DAEMON_WEBJSON_H
#define MEGA_DAEMON_WEBJSON_H

#include <jansson.h>

#include "daemon/web/web.h"

json_t *megad_webjson_cluster(const megad_web_data *d);
/* The jobs of t, newest first, then those of mirror (may be NULL) that t
 * does not hold. */
json_t *megad_webjson_jobs(const mega_jobs *t, const mega_jobs *mirror);
json_t *megad_webjson_job(const mega_job *j);
/* The points after cursor since, at most max of them: past max only the
 * newest go, and "skipped" counts the ones left out (0: none). */
json_t *megad_webjson_steps(const mega_job *j, uint64_t since, size_t max);
/* What the job document shows changes when this does (a cheap hash). */
uint64_t megad_webjson_job_version(const mega_job *j);

#endif
