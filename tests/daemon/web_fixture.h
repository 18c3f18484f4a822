/* The web tests' shared pieces: a job's flags, made-up step metrics, and a
 * jobs table of one running job (restarted once, a node lost on the way, a
 * hostile name) served by daemon/web's router. Every helper fails the
 * running cmocka test. */
#ifndef MEGA_TESTS_WEB_FIXTURE_H
#define MEGA_TESTS_WEB_FIXTURE_H

#include <jansson.h>
#include <stdint.h>

#include "daemon/web/web.h"
#include "daemon/web/websse.h"

/* A job name that is markup and script: it must come back as text. */
#define HOSTILE "<img src=x onerror=alert(1)>\"&'</script>"

/* A small PP 2 job's flags, 100 iterations. */
extern char *wf_args[];
extern const size_t wf_nargs;

/* Iteration it of attempt on world ranks (at most 4): s points into rm and
 * rp, the caller's. Evaluated every 10 iterations. */
void wf_step(Mega__V1__StepMetrics *s, Mega__V1__RankMetrics *rm, Mega__V1__RankMetrics **rp,
             uint64_t it, uint32_t attempt, uint32_t world);
/* wf_step's metrics into j's history. */
void wf_push_step(mega_job *j, uint64_t it, uint32_t attempt, uint32_t world);

/* The router over job j-1-n1 (named HOSTILE, running on node n1, steps 1 to
 * 25, node n2 lost, then attempt 1's steps 21 to 30) and node n1 itself;
 * trace, when set, is what the job's trace reads. */
typedef struct wf {
  mega_jobs t;
  megad_node self;
  megad_node *nodes[1];
  megad_web_data d;
  const char *trace;
} wf;

/* cmocka setup and teardown: *state is the wf. */
int wf_setup(void **state);
int wf_teardown(void **state);
/* GET path?query, failing unless its status is want_status: the body as
 * JSON when it is 200 and JSON, else NULL. */
json_t *wf_get(wf *f, const char *path, const char *query, int want_status);

#endif
