/* daemon/web's router and JSON documents from a constructed jobs table (no
 * daemon): what it owns, the self-contained page, the cluster, the jobs and
 * one job, another node's jobs from the mirror, steps since a cursor, the
 * trace and the methods. The browser test (tests/daemon/test_web_page.sh)
 * loads the page from a real megad; the streams are in test_websse.c, the
 * login in test_weblogin.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web_fixture.h"

/* etcd mode: another node's job, from the mirror: listed, its record and
 * events served, its steps sent to its coordinator. */
static void test_mirror_jobs(void **state) {
  wf *f = *state;
  mega_jobs mirror;
  mega_jobs_init(&mirror);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.args = wf_args;
  spec.n_args = wf_nargs;
  mega_job *j = NULL, *dup = NULL;
  assert_int_equal(mega_job_new("j-7-n2", &spec, "n2", 3000, &j, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_add(&mirror, j, NULL), MEGA_OK);
  /* the mirror holds this node's jobs too: listed once */
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 1000, &dup, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_add(&mirror, dup, NULL), MEGA_OK);
  f->d.mirror = &mirror;
  json_t *doc = wf_get(f, "/api/jobs", NULL, 200);
  json_t *jobs = json_object_get(doc, "jobs");
  assert_int_equal(json_array_size(jobs), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), "j-1-n1");
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 1), "id")), "j-7-n2");
  json_decref(doc);
  doc = wf_get(f, "/api/jobs/j-7-n2", NULL, 200);
  assert_non_null(doc);
  json_decref(doc);
  megad_web_resp r;
  megad_web_handle(&f->d, "GET", "/api/jobs/j-7-n2/steps", NULL, &r);
  assert_int_equal(r.status, 404);
  assert_non_null(strstr(r.body, "coordinated by node n2"));
  megad_web_resp_free(&r);
  f->d.mirror = NULL;
  mega_jobs_free(&mirror);
}

static void test_owns(void **state) {
  (void)state;
  assert_true(megad_web_owns("/"));
  assert_true(megad_web_owns("/jobs/j-1-n1"));
  assert_true(megad_web_owns("/api/jobs"));
  assert_true(megad_web_owns("/page.js"));
  assert_false(megad_web_owns("/metrics"));
  assert_false(megad_web_owns("/favicon.ico"));
}

/* The page loads nothing from outside megad: no URL with a scheme or a host
 * in the served HTML and script (the SVG namespace is a name, never fetched). */
static void test_page_is_self_contained(void **state) {
  wf *f = *state;
  const char *paths[] = {"/", "/jobs/j-1-n1", "/page.js"};
  regex_t re;
  assert_int_equal(regcomp(&re, "(https?|ftp|wss?):|[\"'(=]//|@import", REG_EXTENDED | REG_ICASE), 0);
  for (size_t i = 0; i < 3; i++) {
    megad_web_resp r;
    megad_web_handle(&f->d, "GET", paths[i], NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(r.len > 1000);
    assert_int_equal(strlen(r.body), r.len);
    char *body = strdup(r.body);
    for (char *p; (p = strstr(body, "http://www.w3.org/2000/svg"));) memset(p, '_', 26);
    regmatch_t m;
    if (!regexec(&re, body, 1, &m, 0))
      fail_msg("%s refers outside megad: ...%.60s", paths[i], body + m.rm_so);
    free(body);
    if (i < 2) {
      assert_string_equal(r.type, "text/html; charset=utf-8");
      assert_non_null(strstr(r.body, "<script src=\"/page.js\"></script>"));
      assert_non_null(strstr(r.body, "Content-Security-Policy"));
    } else {
      assert_string_equal(r.type, "text/javascript; charset=utf-8");
      assert_null(strstr(r.body, "innerHTML")); /* user text only ever as DOM text */
    }
    megad_web_resp_free(&r);
  }
  regfree(&re);
}

static void test_cluster_and_jobs(void **state) {
  wf *f = *state;
  json_t *c = wf_get(f, "/api/cluster", NULL, 200);
  assert_string_equal(json_string_value(json_object_get(c, "self")), "n1");
  json_t *n = json_array_get(json_object_get(c, "nodes"), 0);
  assert_string_equal(json_string_value(json_object_get(n, "state")), "alive");
  assert_int_equal(json_integer_value(json_object_get(n, "slots")), 4);
  assert_string_equal(json_string_value(json_object_get(n, "backend")), "cuda");
  assert_string_equal(json_string_value(json_object_get(n, "devices")), "2 x NVIDIA H100 80GB HBM3");
  assert_int_equal(json_integer_value(json_object_get(n, "slots_used")), 2);
  assert_string_equal(json_string_value(json_array_get(json_object_get(n, "job_ids"), 0)), "j-1-n1");
  assert_true(json_is_true(json_object_get(n, "self")));
  assert_int_equal(json_array_size(json_object_get(c, "jobs")), 1);
  json_decref(c);

  json_t *js = wf_get(f, "/api/jobs", NULL, 200);
  json_t *j = json_array_get(json_object_get(js, "jobs"), 0);
  assert_string_equal(json_string_value(json_object_get(j, "id")), "j-1-n1");
  assert_string_equal(json_string_value(json_object_get(j, "name")), HOSTILE); /* intact */
  assert_string_equal(json_string_value(json_object_get(j, "state")), "running");
  assert_int_equal(json_integer_value(json_object_get(j, "world")), 2);
  assert_int_equal(json_integer_value(json_object_get(j, "pp")), 2);
  assert_int_equal(json_integer_value(json_object_get(j, "dp")), 1);
  assert_int_equal(json_integer_value(json_object_get(j, "last_iteration")), 30);
  assert_int_equal(json_integer_value(json_object_get(j, "train_iters")), 100);
  assert_true(json_is_real(json_object_get(j, "loss")));
  assert_true(json_is_real(json_object_get(j, "tokens_per_s")));
  assert_true(json_is_null(json_object_get(j, "error")));
  json_decref(js);
}

static void test_one_job(void **state) {
  wf *f = *state;
  json_t *j = wf_get(f, "/api/jobs/j-1-n1", NULL, 200);
  assert_string_equal(json_string_value(json_object_get(j, "name")), HOSTILE);
  assert_int_equal(json_array_size(json_object_get(j, "args")), wf_nargs);
  /* 1F1B, P = 2, M = 8 / 2 = 4: (P-1)/(M+P-1) = 1/5 on every stage */
  json_t *cf = json_object_get(j, "closed_form");
  assert_string_equal(json_string_value(json_object_get(cf, "schedule")), "1f1b");
  assert_int_equal(json_integer_value(json_object_get(cf, "microbatches")), 4);
  assert_float_equal(json_real_value(json_object_get(cf, "bubble_fraction")), 0.2, 1e-12);
  json_t *st = json_object_get(cf, "stages");
  assert_int_equal(json_array_size(st), 2);
  assert_float_equal(json_real_value(json_array_get(st, 1)), 0.2, 1e-12);
  json_t *ls = json_object_get(j, "last_step");
  assert_int_equal(json_integer_value(json_object_get(ls, "iteration")), 30);
  json_t *r1 = json_array_get(json_object_get(ls, "ranks"), 1);
  assert_int_equal(json_integer_value(json_object_get(r1, "pp_rank")), 1);
  assert_float_equal(json_real_value(json_object_get(r1, "bubble_warmup_s")), 0.01, 1e-12);
  assert_float_equal(json_real_value(json_object_get(r1, "grad_sync_exposed_s")), 0.002, 1e-12);
  json_t *ev = json_array_get(json_object_get(j, "events"), 0);
  assert_string_equal(json_string_value(json_object_get(ev, "kind")), "node_lost");
  assert_string_equal(json_string_value(json_object_get(ev, "message")), "node n2 " HOSTILE);
  assert_true(json_is_null(json_object_get(ev, "rank")));
  json_decref(j);
  wf_get(f, "/api/jobs/j-9-n1", NULL, 404);
  wf_get(f, "/api/jobs/j-9-n1/steps", NULL, 404);
  wf_get(f, "/api/jobs/j-1-n1/nope", NULL, 404);
  json_decref(wf_get(f, "/api/jobs/j-1%2Dn1", NULL, 200)); /* percent-encoded ids */
  wf_get(f, "/api/jobs/j%zz", NULL, 400);
  wf_get(f, "/api/nope", NULL, 404);
  wf_get(f, "/nope", NULL, 404);
}

/* A name over raw gRPC and a rank's error may hold bytes that are not UTF-8
 * (megad refuses only control characters): the fields stay, the bad bytes
 * shown as U+FFFD, where jansson alone would drop them. */
static void test_text_not_utf8(void **state) {
  wf *f = *state;
  mega_job *j = f->t.v[0];
  free(j->name);
  j->name = strdup("run \xff\xfe 7");
  j->error = strdup("rank 1: \xc3(");
  json_t *doc = wf_get(f, "/api/jobs/j-1-n1", NULL, 200);
  assert_string_equal(json_string_value(json_object_get(doc, "name")),
                      "run \xef\xbf\xbd\xef\xbf\xbd 7");
  assert_string_equal(json_string_value(json_object_get(doc, "error")), "rank 1: \xef\xbf\xbd(");
  json_decref(doc);
  doc = wf_get(f, "/api/jobs", NULL, 200);
  json_t *x = json_array_get(json_object_get(doc, "jobs"), 0);
  assert_string_equal(json_string_value(json_object_get(x, "name")),
                      "run \xef\xbf\xbd\xef\xbf\xbd 7");
  json_decref(doc);
}

static void test_steps_since(void **state) {
  wf *f = *state;
  json_t *s = wf_get(f, "/api/jobs/j-1-n1/steps", NULL, 200);
  json_t *pts = json_object_get(s, "points");
  assert_int_equal(json_array_size(pts), 35); /* one per reported iteration */
  uint64_t b = f->t.v[0]->hist.curve.base; /* numbered after the curve's epoch */
  assert_true(b > 0);
  assert_int_equal(json_integer_value(json_object_get(s, "next")), b + 35);
  assert_null(json_object_get(s, "reset"));
  json_t *p = json_array_get(pts, 9);
  assert_int_equal(json_integer_value(json_object_get(p, "it")), 10);
  assert_float_equal(json_real_value(json_object_get(p, "eval_loss")), 4.5, 0);
  assert_null(json_object_get(json_array_get(pts, 8), "eval_loss"));
  json_t *m = json_array_get(json_object_get(s, "marks"), 0);
  assert_string_equal(json_string_value(json_object_get(m, "kind")), "restart");
  assert_int_equal(json_integer_value(json_object_get(m, "it")), 21);
  assert_int_equal(json_integer_value(json_object_get(m, "attempt")), 1);
  json_decref(s);

  char q[64];
  snprintf(q, sizeof q, "x=1&since=%llu", (unsigned long long)b + 30);
  s = wf_get(f, "/api/jobs/j-1-n1/steps", q, 200);
  pts = json_object_get(s, "points");
  assert_int_equal(json_array_size(pts), 5);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(pts, 0), "seq")), b + 31);
  assert_int_equal(json_array_size(json_object_get(s, "marks")), 0); /* already seen */
  json_decref(s);
  snprintf(q, sizeof q, "since=%llu", (unsigned long long)b + 35);
  s = wf_get(f, "/api/jobs/j-1-n1/steps", q, 200);
  assert_int_equal(json_array_size(json_object_get(s, "points")), 0);
  assert_null(json_object_get(s, "reset"));
  json_decref(s);
  /* a plain number (an older megad's cursor, or one made up) is another
   * curve's: the whole curve, with reset */
  s = wf_get(f, "/api/jobs/j-1-n1/steps", "since=30", 200);
  assert_true(json_is_true(json_object_get(s, "reset")));
  assert_int_equal(json_array_size(json_object_get(s, "points")), 35);
  assert_int_equal(json_array_size(json_object_get(s, "marks")), 1);
  json_decref(s);
  wf_get(f, "/api/jobs/j-1-n1/steps", "since=abc", 400);
  wf_get(f, "/api/jobs/j-1-n1/steps", "since=-1", 400);
}

static void test_trace_and_methods(void **state) {
  wf *f = *state;
  wf_get(f, "/api/jobs/j-1-n1/trace", NULL, 404);
  f->trace = "{\"traceEvents\":[]}";
  json_t *t = wf_get(f, "/api/jobs/j-1-n1/trace", NULL, 200);
  assert_non_null(json_object_get(t, "traceEvents"));
  json_decref(t);
  megad_web_resp r;
  megad_web_handle(&f->d, "POST", "/api/jobs", NULL, &r);
  assert_int_equal(r.status, 405);
  megad_web_resp_free(&r);
  megad_web_handle(&f->d, "DELETE", "/api/jobs/j-1-n1", NULL, &r);
  assert_int_equal(r.status, 405);
  megad_web_resp_free(&r);
  /* HEAD answers wherever GET does, as GET does (the server drops the body) */
  const char *paths[] = {"/", "/jobs/j-1-n1", "/page.js", "/api/cluster", "/api/jobs",
                         "/api/jobs/j-1-n1", "/api/jobs/j-1-n1/steps", "/api/jobs/j-1-n1/trace"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    megad_web_resp g;
    megad_web_handle(&f->d, "GET", paths[i], NULL, &g);
    megad_web_handle(&f->d, "HEAD", paths[i], NULL, &r);
    if (r.status != g.status || strcmp(r.type, g.type))
      fail_msg("HEAD %s: %d %s, GET: %d %s", paths[i], r.status, r.type, g.status, g.type);
    assert_int_equal(r.status, 200);
    megad_web_resp_free(&r);
    megad_web_resp_free(&g);
  }
  megad_web_handle(&f->d, "HEAD", "/api/jobs/j-9-n1", NULL, &r);
  assert_int_equal(r.status, 404);
  megad_web_resp_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_owns),
      cmocka_unit_test_setup_teardown(test_page_is_self_contained, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_cluster_and_jobs, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_one_job, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_mirror_jobs, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_text_not_utf8, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_steps_since, wf_setup, wf_teardown),
      cmocka_unit_test_setup_teardown(test_trace_and_methods, wf_setup, wf_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
