/* daemon/web's live streams: the router's /stream with its cursor, and
 * daemon/web/websse's events (the curve, the job, pings, a reader far
 * behind, the end, a reconnect past the curve or of another curve, a
 * forgotten job). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web_fixture.h"

static const char *opened_job;
static uint64_t opened_since;
static const char *opened_peer;
static void open_stream(void *arg, const mega_job *j, uint64_t since, const char *peer,
                        megad_web_resp *out) {
  (void)arg;
  opened_peer = peer;
  opened_job = j->id;
  opened_since = since;
  out->status = 200;
  out->type = "text/event-stream";
}

/* The router hands /stream to open_stream with the cursor: since=, else a
 * reconnect's Last-Event-ID, else 0. */
static void test_stream_route(void **state) {
  wf *f = *state;
  megad_web_resp r;
  megad_web_handle(&f->d, "GET", "/api/jobs/j-1-n1/stream", NULL, &r);
  assert_int_equal(r.status, 404); /* no streams in this server */
  megad_web_resp_free(&r);
  f->d.open_stream = open_stream;
  megad_web_handle(&f->d, "GET", "/api/jobs/j-1-n1/stream", "since=7", &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(opened_job, "j-1-n1");
  assert_int_equal(opened_since, 7);
  f->d.last_event_id = "12";
  megad_web_handle(&f->d, "GET", "/api/jobs/j-1-n1/stream", NULL, &r);
  assert_int_equal(opened_since, 12);
  f->d.last_event_id = "x";
  megad_web_handle(&f->d, "GET", "/api/jobs/j-1-n1/stream", NULL, &r);
  assert_int_equal(r.status, 400);
  megad_web_resp_free(&r);
  /* the client's address goes with it (streams are capped per address) */
  f->d.last_event_id = NULL;
  f->d.peer = "10.0.0.7";
  opened_job = NULL;
  megad_web_handle(&f->d, "GET", "/api/jobs/j-1-n1/stream", NULL, &r);
  assert_string_equal(opened_peer, "10.0.0.7");
  /* HEAD: a stream's headers, and no stream held open */
  opened_job = NULL;
  megad_web_handle(&f->d, "HEAD", "/api/jobs/j-1-n1/stream", NULL, &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.type, "text/event-stream; charset=utf-8");
  assert_null(opened_job);
  assert_null(r.stream.pull);
  megad_web_resp_free(&r);
  megad_web_handle(&f->d, "GET", "/api/jobs/j-9-n1/stream", NULL, &r);
  assert_int_equal(r.status, 404);
  megad_web_resp_free(&r);
}

/* The data of the one event named name in text (NULL when none), parsed. */
static json_t *sse_data(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "event: %s\n", name);
  const char *e = strstr(text, key);
  if (!e) return NULL;
  const char *d = strstr(e, "data: ");
  assert_non_null(d);
  d += 6;
  const char *nl = strchr(d, '\n');
  assert_non_null(nl);
  assert_int_equal(nl[1], '\n'); /* one line of data, then the blank line */
  json_error_t err;
  json_t *doc = json_loadb(d, (size_t)(nl - d), 0, &err);
  if (!doc) fail_msg("event %s: not JSON: %s", name, err.text);
  return doc;
}

static void test_sse_compose(void **state) {
  wf *f = *state;
  mega_job *j = f->t.v[0];
  megad_sse_cursor c = {0};
  size_t len;
  uint64_t b = j->hist.curve.base; /* the curve's points are numbered after it */
  /* first: the retry hint, the whole curve and the job */
  char *t = megad_sse_compose(j, &c, 10000, false, &len);
  assert_non_null(t);
  assert_int_equal(strlen(t), len);
  assert_int_equal(strncmp(t, "retry: 3000\n\n", 13), 0);
  char want[64];
  snprintf(want, sizeof want, "event: steps\nid: %llu\ndata: ", (unsigned long long)b + 35);
  assert_non_null(strstr(t, want));
  json_t *st = sse_data(t, "steps");
  assert_int_equal(json_array_size(json_object_get(st, "points")), 35);
  assert_int_equal(json_array_size(json_object_get(st, "marks")), 1);
  json_decref(st);
  json_t *jd = sse_data(t, "job");
  assert_string_equal(json_string_value(json_object_get(jd, "name")), HOSTILE); /* JSON, not markup */
  json_decref(jd);
  assert_null(strstr(t, "event: end"));
  free(t);
  /* nothing new: nothing, or a ping */
  assert_null(megad_sse_compose(j, &c, 10100, false, &len));
  t = megad_sse_compose(j, &c, 10100, true, &len);
  assert_string_equal(t, ": ping\n\n");
  free(t);
  /* two new steps: only they; the job changed but went 100 ms ago: later */
  wf_push_step(j, 31, 1, 2);
  wf_push_step(j, 32, 1, 2);
  t = megad_sse_compose(j, &c, 10100, false, &len);
  st = sse_data(t, "steps");
  assert_int_equal(json_array_size(json_object_get(st, "points")), 2);
  assert_int_equal(json_integer_value(json_object_get(st, "next")), b + 37);
  assert_int_equal(json_array_size(json_object_get(st, "marks")), 0);
  json_decref(st);
  assert_null(strstr(t, "event: job"));
  free(t);
  t = megad_sse_compose(j, &c, 11000, false, &len);
  assert_non_null(strstr(t, "event: job\n"));
  assert_null(strstr(t, "event: steps"));
  free(t);
  /* a reader that fell far behind gets the newest points and is told */
  for (uint64_t it = 33; it < 33 + MEGAD_SSE_BATCH_MAX + 100; it++) wf_push_step(j, it, 1, 2);
  t = megad_sse_compose(j, &c, 12000, false, &len);
  json_t *sk = sse_data(t, "skipped");
  assert_non_null(sk);
  assert_int_equal(json_integer_value(json_object_get(sk, "missed")), 100);
  assert_int_equal(json_integer_value(json_object_get(sk, "from_seq")), b + 38);
  assert_int_equal(json_integer_value(json_object_get(sk, "to_seq")), b + 137);
  json_decref(sk);
  st = sse_data(t, "steps");
  assert_int_equal(json_array_size(json_object_get(st, "points")), MEGAD_SSE_BATCH_MAX);
  json_t *p0 = json_array_get(json_object_get(st, "points"), 0);
  assert_int_equal(json_integer_value(json_object_get(p0, "seq")), b + 138);
  json_decref(st);
  assert_true(strstr(t, "event: skipped") < strstr(t, "event: steps"));
  free(t);
  /* the end: the last job document, then end, then nothing ever */
  assert_int_equal(mega_job_transition(j, MEGA_JOB_SUCCEEDED, 3000, NULL, NULL), MEGA_OK);
  t = megad_sse_compose(j, &c, 13000, false, &len);
  jd = sse_data(t, "job");
  assert_string_equal(json_string_value(json_object_get(jd, "state")), "succeeded");
  json_decref(jd);
  jd = sse_data(t, "end");
  assert_string_equal(json_string_value(json_object_get(jd, "state")), "succeeded");
  json_decref(jd);
  assert_true(c.ended);
  free(t);
  assert_null(megad_sse_compose(j, &c, 14000, true, &len));
  /* a reconnect whose cursor is past the curve (megad restarted) gets it all */
  megad_sse_cursor c3 = {.seq = b + 100000};
  t = megad_sse_compose(j, &c3, 0, false, &len);
  st = sse_data(t, "steps");
  assert_true(json_is_true(json_object_get(st, "reset")));
  assert_int_equal(json_array_size(json_object_get(st, "points")), j->hist.curve.n);
  json_decref(st);
  free(t);
  megad_sse_cursor c4 = {.seq = b + 3};
  t = megad_sse_compose(j, &c4, 0, false, &len);
  st = sse_data(t, "steps");
  assert_null(json_object_get(st, "reset"));
  json_decref(st);
  free(t);
  /* a plain number (an older megad's cursor) is reset, though it is short */
  megad_sse_cursor c5 = {.seq = 3};
  t = megad_sse_compose(j, &c5, 0, false, &len);
  st = sse_data(t, "steps");
  assert_true(json_is_true(json_object_get(st, "reset")));
  assert_int_equal(json_array_size(json_object_get(st, "points")), j->hist.curve.n);
  json_decref(st);
  free(t);
  /* a job megad forgot ends its streams */
  megad_sse_cursor c2 = {.seq = 5};
  t = megad_sse_compose(NULL, &c2, 0, false, &len);
  jd = sse_data(t, "end");
  assert_string_equal(json_string_value(json_object_get(jd, "state")), "forgotten");
  json_decref(jd);
  free(t);
}

/* The points of the steps event in text, and whether it says reset. */
static size_t steps_of(const char *text, bool *reset) {
  json_t *st = sse_data(text, "steps");
  assert_non_null(st);
  *reset = json_is_true(json_object_get(st, "reset"));
  size_t n = json_array_size(json_object_get(st, "points"));
  json_decref(st);
  return n;
}

/* The job's curve is made anew (megad restarted and the job's steps came
 * again, or its record was rebuilt) and grows past a reader's cursor before
 * the reader comes back: the cursor is another curve's, so the reader gets
 * the whole new curve with reset, on a reconnect (Last-Event-ID), on the
 * stream it held all along and from steps?since=, never the new curve's
 * tail after the old one's points. */
static void test_curve_made_anew(void **state) {
  wf *f = *state;
  mega_job *j = f->t.v[0];
  megad_sse_cursor c = {0};
  size_t len;
  bool reset;
  char *t = megad_sse_compose(j, &c, 10000, false, &len);
  assert_int_equal(steps_of(t, &reset), 35);
  free(t);
  uint64_t old = c.seq;
  mega_stepring_free(&j->hist.curve);
  for (uint64_t it = 1; it <= 60; it++) wf_push_step(j, it, 2, 2);
  /* the reconnect */
  megad_sse_cursor back = {.seq = old};
  t = megad_sse_compose(j, &back, 12000, false, &len);
  assert_int_equal(steps_of(t, &reset), 60);
  assert_true(reset);
  free(t);
  assert_int_equal(back.seq, j->hist.curve.seq);
  /* the stream that stayed open */
  t = megad_sse_compose(j, &c, 12000, false, &len);
  assert_int_equal(steps_of(t, &reset), 60);
  assert_true(reset);
  free(t);
  t = megad_sse_compose(j, &c, 12000, false, &len); /* then only what is new */
  assert_true(!t || !strstr(t, "event: steps"));
  free(t);
  /* the fallback */
  char q[64];
  snprintf(q, sizeof q, "since=%llu", (unsigned long long)old);
  json_t *st = wf_get(f, "/api/jobs/j-1-n1/steps", q, 200);
  assert_true(json_is_true(json_object_get(st, "reset")));
  assert_int_equal(json_array_size(json_object_get(st, "points")), 60);
  assert_int_equal(json_integer_value(json_object_get(st, "next")), j->hist.curve.seq);
  json_decref(st);
  snprintf(q, sizeof q, "since=%llu", (unsigned long long)j->hist.curve.seq - 10);
  st = wf_get(f, "/api/jobs/j-1-n1/steps", q, 200);
  assert_null(json_object_get(st, "reset"));
  assert_int_equal(json_array_size(json_object_get(st, "points")), 10);
  json_decref(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_route, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_sse_compose, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_curve_made_anew, wf_setup, wf_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
