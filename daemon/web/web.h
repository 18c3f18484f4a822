/* The web view: megad's page and its read-only JSON API, as a pure map from
 * a request (method, path, query) to a response (status, type, body), from
 * the data the daemon hands it. No socket, no loop: any HTTP server calls
 * megad_web_handle for the paths megad_web_owns says are its own.
 *
 * Every path answers GET and HEAD, and 405 to any other method.
 *
 *   GET /                      the cluster page (page.html, compiled in)
 *   GET /jobs/ID               the same page, showing job ID
 *   GET /page.js               its script
 *   GET /api/cluster           {self, nodes[], jobs[]}
 *   GET /api/jobs              {jobs[]}: every job this megad coordinates
 *   GET /api/jobs/ID           one job: summary, schedule and its closed-form
 *                              bubble per stage, the last step's ranks, events
 *   GET /api/jobs/ID/steps?since=SEQ
 *                              the curve's points after cursor SEQ (0: all
 *                              kept), with restart/rescale marks, and "next",
 *                              the cursor for the next call; a cursor of
 *                              another curve: all, with "reset"
 *   GET /api/jobs/ID/trace     the Chrome trace of --trace-iteration
 *   GET /api/jobs/ID/stream?since=SEQ
 *                              live updates as Server-Sent Events (opened by
 *                              the data's open_stream: daemon/web/websse.h)
 *
 * Live updates: the page listens to the stream, fed from the same merged
 * StepMetrics that WatchJob streams carry (daemon/model/stepring.h); scripts may
 * poll steps?since=next instead (each answer holds only what is new).
 *
 * Every string a user wrote (job names, messages) leaves as JSON through
 * jansson and reaches the page's DOM only as text, never as markup.
 *
 * Ownership: megad_web_handle fills a response whose body it allocates;
 * free it with megad_web_resp_free. The data is borrowed for the call. */
#ifndef MEGA_DAEMON_WEB_H
#define MEGA_DAEMON_WEB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/members/members.h"
#include "daemon/model/job.h"
#include "daemon/web/http.h"

typedef struct megad_web_resp megad_web_resp;

typedef struct megad_web_data {
  const mega_jobs *jobs;       /* the jobs this megad coordinates */
  const mega_jobs *mirror;     /* etcd mode: every job of the cluster as etcd has it (records
                                  and events; steps stay with the coordinator); NULL: none */
  megad_node *const *nodes;    /* the membership view; nodes[0] is this node */
  size_t nnodes;
  /* The Chrome trace of job_id (malloc'd, *len its size), or NULL when the
   * job has none. */
  char *(*load_trace)(void *arg, const char *job_id, size_t *len);
  /* A live stream of job j from cursor since into out, for the client at
   * address peer (NULL: 404). */
  void (*open_stream)(void *arg, const mega_job *j, uint64_t since, const char *peer,
                      megad_web_resp *out);
  void *arg;
  const char *last_event_id; /* the request's Last-Event-ID (a reconnecting stream's cursor) */
  const char *peer;          /* the client's address, or NULL */
  bool login;                /* a login guards the page (/api/cluster says so, for logout) */
} megad_web_data;

struct megad_web_resp {
  int status;       /* 200, 400, 404, 405 or 503 */
  const char *type; /* Content-Type (static) */
  char *body;       /* malloc'd; len bytes (NUL-terminated besides) */
  size_t len;
  megad_http_source stream; /* pull set: a stream instead of the body (open_stream's) */
};

/* Whether path (without its query) is the web view's: "/", "/page.js",
 * "/jobs/...", "/api/...". Anything else (/metrics) is the server's. */
bool megad_web_owns(const char *path);
/* Answers method ("GET", or "HEAD": the same answer, whose body the server
 * does not send, and no stream opened; anything else is 405, whose Allow is
 * "GET, HEAD") for path and query (the part
 * after '?'; NULL when none), both percent-encoded as sent: a job id in the
 * path is decoded here. Never fails: an error is a response with a status
 * and a plain-text reason. */
void megad_web_handle(const megad_web_data *d, const char *method, const char *path,
                      const char *query, megad_web_resp *out);
void megad_web_resp_free(megad_web_resp *r);

/* The value of key in a form body or query ("a=1&token=x%2By"), decoded
 * ('+' is a space) into buf; false when absent, malformed or too long. */
bool megad_web_form_get(const char *form, const char *key, char *buf, size_t cap);

#endif
