/* The web view's live updates: GET /api/jobs/ID/stream as Server-Sent
 * Events, fed from the same merged StepMetrics that WatchJob streams carry
 * (the jobs layer tells megad_sse_notify of each item).
 *
 *   retry: 3000                      (first: how soon EventSource reconnects)
 *   event: steps / id: NEXT / data: {steps?since=SEQ's document, new points only;
 *                                     "reset": true when SEQ was past the curve, as
 *                                     after megad restarted: the whole curve follows}
 *   event: skipped / data: {missed, from_seq, to_seq, why}
 *   event: job / data: {/api/jobs/ID's document}   when it changed, at most once a second
 *   event: end / data: {"state": ...}              after the job ended; then the stream closes
 *   : ping                                          every MEGAD_SSE_PING_MS when idle
 *
 * Bounded: at most MEGAD_SSE_STREAMS_MAX streams, MEGAD_SSE_STREAMS_PER_ADDR
 * from one address (503 beyond: the page polls steps?since= instead); the server pulls a stream's next bytes only when its socket
 * takes them, so a slow reader queues nothing: once it reads again it gets
 * at most MEGAD_SSE_BATCH_MAX points, the newest, and a `skipped` event
 * saying how many it missed (they stay in steps?since=). A stream with
 * nothing to send is parked (no CPU, no timer of its own); news wakes it
 * after MEGAD_SSE_COALESCE_MS, so a fast job costs a page a few wakes a
 * second, not one per step. The ping finds closed tabs: the write fails and
 * the stream is freed.
 *
 * On the loop thread only. */
#ifndef MEGA_DAEMON_WEBSSE_H
#define MEGA_DAEMON_WEBSSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/model/job.h"
#include "daemon/web/web.h"

#define MEGAD_SSE_STREAMS_MAX 32 /* half the web server's connections */
/* half the web server's connections from one address (http.h's
 * per_ip_limit, 16), so the page's polls and the probes from an address
 * (a proxy's, all its browsers') still get in */
#define MEGAD_SSE_STREAMS_PER_ADDR 8
#define MEGAD_SSE_BATCH_MAX 512  /* points in one steps event after the first */
#define MEGAD_SSE_COALESCE_MS 100
#define MEGAD_SSE_JOB_MS 1000
#define MEGAD_SSE_PING_MS 5000

/* What a stream has sent. */
typedef struct megad_sse_cursor {
  uint64_t seq;         /* the newest point sent */
  uint64_t job_version; /* of the job document sent (megad_webjson_job_version); 0: none */
  uint64_t job_sent_ms;
  bool started, ended;
} megad_sse_cursor;

/* The next bytes of a stream at c on job j (NULL: megad forgot it) at
 * now_ms: new points, the job document when it changed and is due, the end
 * once the job ended and everything went; with nothing else, a ping when
 * ping. NULL (*len 0) when nothing is due. Advances c. Pure. */
char *megad_sse_compose(const mega_job *j, megad_sse_cursor *c, uint64_t now_ms, bool ping,
                        size_t *len);

typedef struct megad_sse megad_sse;

/* The hub on loop over the jobs table t (borrowed). NULL: out of memory. */
megad_sse *megad_sse_new(uv_loop_t *loop, const mega_jobs *t);
/* After the HTTP server stopped: its stop closes every stream first. */
void megad_sse_free(megad_sse *x);
/* A stream of j from cursor since, for the client at address peer, into
 * out: a stream source, or 503. */
void megad_sse_open(megad_sse *x, const mega_job *j, uint64_t since, const char *peer,
                    megad_web_resp *out);
/* News about j: its streams wake soon. */
void megad_sse_notify(megad_sse *x, const mega_job *j);
size_t megad_sse_streams(const megad_sse *x);

#endif
