/* The web view over this megad's layers (see webserve.h). */
#include "daemon/webserve.h"

#include <stdio.h>
#include <string.h>

#include "daemon/jobtrace.h"

static char *load_trace(void *arg, const char *job_id, size_t *len) {
  return megad_trace_load(((megad_services *)arg)->b, job_id, len);
}

megad_web_data megad_web_data_of(megad_services *sv) {
  return (megad_web_data){.jobs = &sv->jobs->t,
                          .nodes = sv->members->nodes,
                          .nnodes = sv->members->nnodes,
                          .load_trace = load_trace,
                          .arg = sv};
}

bool megad_web_serve(megad_services *sv, const char *method, const char *target,
                     megad_web_resp *out) {
  char path[1024];
  const char *q = strchr(target, '?');
  size_t n = q ? (size_t)(q - target) : strlen(target);
  if (n >= sizeof path) return false;
  memcpy(path, target, n);
  path[n] = '\0';
  if (!megad_web_owns(path)) return false;
  megad_web_data d = megad_web_data_of(sv);
  megad_web_handle(&d, method, path, q ? q + 1 : NULL, out);
  return true;
}
