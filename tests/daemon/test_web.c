/* daemon/web and daemon/stepring: the web view's router and JSON documents
 * from a constructed jobs table (no daemon), and the step curve's thinning
 * and restart/rescale marks. The browser test (tests/daemon/test_web_page.sh)
 * loads the page from a real megad. */
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

#include "core/throttle.h"
#include "daemon/web/web.h"
#include "daemon/web/weblogin.h"
#include "daemon/web/websse.h"

#define HOSTILE "<img src=x onerror=alert(1)>\"&'</script>"

static char *args[] = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                       "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size",
                       "8", "--train-iters", "100", "--pipeline-model-parallel-size", "2"};

static void step(Mega__V1__StepMetrics *s, Mega__V1__RankMetrics *rm, Mega__V1__RankMetrics **rp,
                 uint64_t it, uint32_t attempt, uint32_t world) {
  *s = (Mega__V1__StepMetrics)MEGA__V1__STEP_METRICS__INIT;
  s->iteration = it;
  s->attempt = attempt;
  s->loss = 5.0 - (double)it / 100;
  s->tokens_per_s = 1000;
  s->step_time_s = 0.1;
  s->time_unix_ms = 1000 + (int64_t)it * 100;
  s->has_eval_loss = it % 10 == 0;
  s->eval_loss = 4.5;
  for (uint32_t r = 0; r < world; r++) {
    rm[r] = (Mega__V1__RankMetrics)MEGA__V1__RANK_METRICS__INIT;
    rm[r].rank = r;
    rm[r].pp_rank = r % 2;
    rm[r].step_time_s = 0.1;
    rm[r].bubble_s = 0.02;
    rm[r].bubble_warmup_s = 0.01;
    rm[r].bubble_cooldown_s = 0.01;
    rm[r].grad_sync_exposed_s = 0.001 * (r + 1);
    rp[r] = &rm[r];
  }
  s->ranks = rp;
  s->n_ranks = world;
}

static void push_step(mega_job *j, uint64_t it, uint32_t attempt, uint32_t world) {
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  step(&s, rm, rp, it, attempt, world);
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = &s;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

static void test_ring_thins_and_marks(void **state) {
  (void)state;
  mega_stepring r = {0};
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  for (uint64_t it = 1; it <= 100000; it++) {
    /* attempt 1 resumes at 40000 from a checkpoint at 39000; attempt 2 rescales */
    uint32_t attempt = it <= 40000 ? 0 : it <= 70000 ? 1 : 2;
    uint64_t iter = attempt == 0 ? it : it - 1000 * attempt;
    step(&s, rm, rp, iter, attempt, attempt == 2 ? 2 : 4);
    assert_int_equal(mega_stepring_push(&r, &s, NULL), MEGA_OK);
  }
  assert_true(r.n <= MEGA_STEPRING_CAP);
  assert_true(r.n > MEGA_STEPRING_CAP / 2);
  assert_int_equal(r.seq, 100000);
  assert_int_equal(r.thinned, 100000 - r.n);
  assert_int_equal(r.v[0].seq, 1); /* the start stays */
  assert_int_equal(r.v[r.n - 1].seq, 100000);
  for (size_t i = 1; i < r.n; i++) assert_true(r.v[i].seq > r.v[i - 1].seq);
  /* recent points at full resolution, old ones sparser */
  assert_int_equal(r.v[r.n - 1].seq - r.v[r.n - 100].seq, 99);
  assert_true(r.v[100].seq > 1000);
  /* both attempts' starts were kept and marked */
  assert_int_equal(r.nmarks, 2);
  assert_int_equal(r.marks[0].iteration, 39001);
  assert_int_equal(r.marks[0].attempt, 1);
  assert_int_equal(r.marks[0].world, r.marks[0].prev_world);
  assert_int_equal(r.marks[1].attempt, 2);
  assert_int_equal(r.marks[1].world, 2);
  assert_int_equal(r.marks[1].prev_world, 4);
  bool found[2] = {false, false};
  for (size_t i = 0; i < r.n; i++)
    for (int m = 0; m < 2; m++) found[m] |= r.v[i].seq == r.marks[m].seq;
  assert_true(found[0] && found[1]);
  /* the cursor */
  assert_int_equal(mega_stepring_after(&r, 0), 0);
  assert_int_equal(mega_stepring_after(&r, 100000), r.n);
  assert_int_equal(mega_stepring_after(&r, 99999), r.n - 1);
  /* a point's figures: the bubble is the ranks' mean, grad sync the most */
  assert_true(r.v[r.n - 1].bubble > 0.199 && r.v[r.n - 1].bubble < 0.201);
  assert_true(r.v[r.n - 1].grad_sync_s > 0.00199 && r.v[r.n - 1].grad_sync_s < 0.00201);
  mega_stepring_free(&r);
}

/* Eval loss on every iteration: pinning them all would leave no room, so
 * thinning drops them too, and the ring stays bounded. */
static void test_ring_dense_evals(void **state) {
  (void)state;
  mega_stepring r = {0};
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  for (uint64_t it = 1; it <= 20000; it++) {
    step(&s, rm, rp, it, 0, 2);
    s.has_eval_loss = true;
    assert_int_equal(mega_stepring_push(&r, &s, NULL), MEGA_OK);
  }
  assert_true(r.n <= MEGA_STEPRING_CAP);
  assert_int_equal(r.thinned + r.n, 20000);
  assert_int_equal(r.v[r.n - 1].iteration, 20000);
  mega_stepring_free(&r);
}

/* The curve is filled from the journal's step records too, and a job record
 * replayed over its job keeps it. */
static void test_ring_from_journal(void **state) {
  (void)state;
  mega_jobs t;
  mega_jobs_init(&t);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "j";
  spec.args = args;
  spec.n_args = sizeof args / sizeof args[0];
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-2-n1", &spec, "n1", 1000, &j, NULL), MEGA_OK);
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_job(j, &buf, &len, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK);
  for (uint64_t it = 1; it <= 3; it++) {
    Mega__V1__StepMetrics s;
    Mega__V1__RankMetrics rm[4];
    Mega__V1__RankMetrics *rp[4];
    step(&s, rm, rp, it, 0, 2);
    uint8_t *sb;
    size_t sl;
    assert_int_equal(mega_jrec_step("j-2-n1", &s, &sb, &sl, NULL), MEGA_OK);
    assert_int_equal(mega_jobs_apply(&t, sb, sl, NULL), MEGA_OK);
    free(sb);
  }
  assert_int_equal(mega_jobs_table_find(&t, "j-2-n1")->hist.curve.n, 3);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK); /* the job again */
  const mega_job *k = mega_jobs_table_find(&t, "j-2-n1");
  assert_int_equal(k->hist.curve.n, 3);
  assert_int_equal(k->hist.curve.v[2].iteration, 3);
  free(buf);
  mega_job_free(j);
  mega_jobs_free(&t);
}

/* ---- the router ---- */

typedef struct fixture {
  mega_jobs t;
  megad_node self;
  megad_node *nodes[1];
  megad_web_data d;
  const char *trace;
} fixture;

static char *load_trace(void *arg, const char *job_id, size_t *len) {
  fixture *f = arg;
  (void)job_id;
  if (!f->trace) return NULL;
  *len = strlen(f->trace);
  return strdup(f->trace);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  mega_jobs_init(&f->t);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = HOSTILE;
  spec.args = args;
  spec.n_args = sizeof args / sizeof args[0];
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 1000, &j, NULL), MEGA_OK);
  mega_job_node place = {.node_id = "n1", .first_rank = 0, .nranks = 2};
  assert_int_equal(mega_job_place(j, &place, 1, 2, 1, 2, 1, NULL), MEGA_OK);
  assert_int_equal(mega_job_transition(j, MEGA_JOB_RUNNING, 2000, NULL, NULL), MEGA_OK);
  for (uint64_t it = 1; it <= 25; it++) push_step(j, it, 0, 2);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST;
  ev.message = "node n2 " HOSTILE;
  ev.node_id = "n2";
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
  for (uint64_t it = 21; it <= 30; it++) push_step(j, it, 1, 2); /* restarted at 20 */
  j->last_iteration = 30;  /* megad_job_step's part */
  j->train_iters = 100;    /* the coordinator's, from the spec */
  assert_int_equal(mega_jobs_add(&f->t, j, NULL), MEGA_OK);
  static char *ids[] = {"j-1-n1"};
  f->self = (megad_node){.id = "n1", .address = "127.0.0.1:7000", .version = "0.1.0",
                         .backend = "cuda", .device_name = "2 x NVIDIA H100 80GB HBM3",
                         .state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE,
                         .slots = 4, .slots_used = 2, .job_ids = ids, .njob_ids = 1};
  f->nodes[0] = &f->self;
  f->d = (megad_web_data){.jobs = &f->t, .nodes = f->nodes, .nnodes = 1,
                          .load_trace = load_trace, .arg = f};
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  mega_jobs_free(&f->t);
  free(f);
  return 0;
}

/* GET path?query: the body as JSON when status is 200 and it is JSON. */
static json_t *get(fixture *f, const char *path, const char *query, int want_status) {
  megad_web_resp r;
  megad_web_handle(&f->d, "GET", path, query, &r);
  if (r.status != want_status) fail_msg("GET %s: %d, want %d: %s", path, r.status, want_status,
                                        r.body);
  json_t *doc = NULL;
  if (r.status == 200 && !strcmp(r.type, "application/json")) {
    json_error_t e;
    doc = json_loadb(r.body, r.len, 0, &e);
    if (!doc) fail_msg("GET %s: not JSON: %s", path, e.text);
  }
  megad_web_resp_free(&r);
  return doc;
}

/* etcd mode: another node's job, from the mirror: listed, its record and
 * events served, its steps sent to its coordinator. */
static void test_mirror_jobs(void **state) {
  fixture *f = *state;
  mega_jobs mirror;
  mega_jobs_init(&mirror);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.args = args;
  spec.n_args = sizeof args / sizeof args[0];
  mega_job *j = NULL, *dup = NULL;
  assert_int_equal(mega_job_new("j-7-n2", &spec, "n2", 3000, &j, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_add(&mirror, j, NULL), MEGA_OK);
  /* the mirror holds this node's jobs too: listed once */
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 1000, &dup, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_add(&mirror, dup, NULL), MEGA_OK);
  f->d.mirror = &mirror;
  json_t *doc = get(f, "/api/jobs", NULL, 200);
  json_t *jobs = json_object_get(doc, "jobs");
  assert_int_equal(json_array_size(jobs), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), "j-1-n1");
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 1), "id")), "j-7-n2");
  json_decref(doc);
  doc = get(f, "/api/jobs/j-7-n2", NULL, 200);
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
  fixture *f = *state;
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
  fixture *f = *state;
  json_t *c = get(f, "/api/cluster", NULL, 200);
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

  json_t *js = get(f, "/api/jobs", NULL, 200);
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
  fixture *f = *state;
  json_t *j = get(f, "/api/jobs/j-1-n1", NULL, 200);
  assert_string_equal(json_string_value(json_object_get(j, "name")), HOSTILE);
  assert_int_equal(json_array_size(json_object_get(j, "args")), sizeof args / sizeof args[0]);
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
  get(f, "/api/jobs/j-9-n1", NULL, 404);
  get(f, "/api/jobs/j-9-n1/steps", NULL, 404);
  get(f, "/api/jobs/j-1-n1/nope", NULL, 404);
  json_decref(get(f, "/api/jobs/j-1%2Dn1", NULL, 200)); /* percent-encoded ids */
  get(f, "/api/jobs/j%zz", NULL, 400);
  get(f, "/api/nope", NULL, 404);
  get(f, "/nope", NULL, 404);
}

static void test_steps_since(void **state) {
  fixture *f = *state;
  json_t *s = get(f, "/api/jobs/j-1-n1/steps", NULL, 200);
  json_t *pts = json_object_get(s, "points");
  assert_int_equal(json_array_size(pts), 35); /* one per reported iteration */
  assert_int_equal(json_integer_value(json_object_get(s, "next")), 35);
  json_t *p = json_array_get(pts, 9);
  assert_int_equal(json_integer_value(json_object_get(p, "it")), 10);
  assert_float_equal(json_real_value(json_object_get(p, "eval_loss")), 4.5, 0);
  assert_null(json_object_get(json_array_get(pts, 8), "eval_loss"));
  json_t *m = json_array_get(json_object_get(s, "marks"), 0);
  assert_string_equal(json_string_value(json_object_get(m, "kind")), "restart");
  assert_int_equal(json_integer_value(json_object_get(m, "it")), 21);
  assert_int_equal(json_integer_value(json_object_get(m, "attempt")), 1);
  json_decref(s);

  s = get(f, "/api/jobs/j-1-n1/steps", "x=1&since=30", 200);
  pts = json_object_get(s, "points");
  assert_int_equal(json_array_size(pts), 5);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(pts, 0), "seq")), 31);
  assert_int_equal(json_array_size(json_object_get(s, "marks")), 0); /* already seen */
  json_decref(s);
  s = get(f, "/api/jobs/j-1-n1/steps", "since=35", 200);
  assert_int_equal(json_array_size(json_object_get(s, "points")), 0);
  json_decref(s);
  get(f, "/api/jobs/j-1-n1/steps", "since=abc", 400);
  get(f, "/api/jobs/j-1-n1/steps", "since=-1", 400);
}

static void test_trace_and_methods(void **state) {
  fixture *f = *state;
  get(f, "/api/jobs/j-1-n1/trace", NULL, 404);
  f->trace = "{\"traceEvents\":[]}";
  json_t *t = get(f, "/api/jobs/j-1-n1/trace", NULL, 200);
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

/* ---- live streams ---- */

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
  fixture *f = *state;
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
  fixture *f = *state;
  mega_job *j = f->t.v[0];
  megad_sse_cursor c = {0};
  size_t len;
  /* first: the retry hint, the whole curve and the job */
  char *t = megad_sse_compose(j, &c, 10000, false, &len);
  assert_non_null(t);
  assert_int_equal(strlen(t), len);
  assert_int_equal(strncmp(t, "retry: 3000\n\n", 13), 0);
  assert_non_null(strstr(t, "event: steps\nid: 35\ndata: "));
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
  push_step(j, 31, 1, 2);
  push_step(j, 32, 1, 2);
  t = megad_sse_compose(j, &c, 10100, false, &len);
  st = sse_data(t, "steps");
  assert_int_equal(json_array_size(json_object_get(st, "points")), 2);
  assert_int_equal(json_integer_value(json_object_get(st, "next")), 37);
  assert_int_equal(json_array_size(json_object_get(st, "marks")), 0);
  json_decref(st);
  assert_null(strstr(t, "event: job"));
  free(t);
  t = megad_sse_compose(j, &c, 11000, false, &len);
  assert_non_null(strstr(t, "event: job\n"));
  assert_null(strstr(t, "event: steps"));
  free(t);
  /* a reader that fell far behind gets the newest points and is told */
  for (uint64_t it = 33; it < 33 + MEGAD_SSE_BATCH_MAX + 100; it++) push_step(j, it, 1, 2);
  t = megad_sse_compose(j, &c, 12000, false, &len);
  json_t *sk = sse_data(t, "skipped");
  assert_non_null(sk);
  assert_int_equal(json_integer_value(json_object_get(sk, "missed")), 100);
  assert_int_equal(json_integer_value(json_object_get(sk, "from_seq")), 38);
  assert_int_equal(json_integer_value(json_object_get(sk, "to_seq")), 137);
  json_decref(sk);
  st = sse_data(t, "steps");
  assert_int_equal(json_array_size(json_object_get(st, "points")), MEGAD_SSE_BATCH_MAX);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(st, "points"), 0), "seq")), 138);
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
  megad_sse_cursor c3 = {.seq = 100000};
  t = megad_sse_compose(j, &c3, 0, false, &len);
  st = sse_data(t, "steps");
  assert_true(json_is_true(json_object_get(st, "reset")));
  assert_int_equal(json_array_size(json_object_get(st, "points")), j->hist.curve.n);
  json_decref(st);
  free(t);
  megad_sse_cursor c4 = {.seq = 3};
  t = megad_sse_compose(j, &c4, 0, false, &len);
  st = sse_data(t, "steps");
  assert_null(json_object_get(st, "reset"));
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

/* ---- login ---- */

/* Wrong tokens from one address: a few are free, then that address's
 * logins are held off (not looked at, right token or not) for a second,
 * doubled by each further wrong one; another address is not, and the right
 * token once the hold is over starts the address afresh. */
static void test_login_guesses_held_off(void **state) {
  (void)state;
  megad_web_login *l = megad_web_login_new("Zm9vYmFy+c2VjcmV0/dG9rZW4=");
  const char *right = "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D";
  char *cookie, *loc;
  uint64_t refused;
  int64_t retry = -1, t = 1000;
  for (int i = 0; i < MEGA_THROTTLE_FREE; i++) {
    assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t++, &cookie, &loc, &refused,
                                      &retry));
    assert_int_equal(retry, 0);
  }
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, MEGA_THROTTLE_FIRST_MS);
  /* held: even the right token is not looked at */
  assert_false(megad_web_login_post(l, right, "10.0.0.9", t + 500, &cookie, &loc, &refused, &retry));
  assert_int_equal(retry, 500);
  assert_null(cookie);
  /* another address is not held */
  assert_true(megad_web_login_post(l, right, "10.0.0.7", t + 500, &cookie, &loc, &refused, &retry));
  assert_int_equal(retry, 0);
  free(cookie);
  free(loc);
  /* over: one more wrong one holds it twice as long */
  t += MEGA_THROTTLE_FIRST_MS;
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, 2 * MEGA_THROTTLE_FIRST_MS);
  t += 2 * MEGA_THROTTLE_FIRST_MS;
  assert_true(megad_web_login_post(l, right, "10.0.0.9", t, &cookie, &loc, &refused, &retry));
  free(cookie);
  free(loc);
  /* afresh: the next wrong one is free again */
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t + 1, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, 0);
  megad_web_login_free(l);
}

static void test_login(void **state) {
  (void)state;
  const char *token = "Zm9vYmFy+c2VjcmV0/dG9rZW4=";
  megad_web_login *l = megad_web_login_new(token);
  char *cookie, *loc;
  uint64_t refused;
  /* wrong tokens: refused; the log line is due at most once a second */
  assert_false(megad_web_login_post(l, "token=nope&next=/", "10.0.0.1", 1000, &cookie, &loc,
                                    &refused, NULL));
  assert_null(cookie);
  assert_int_equal(refused, 1);
  assert_false(megad_web_login_post(l, "token=Zm9vYmFy+c2VjcmV0/dG9rZW4=", "10.0.0.1", 1100,
                                    &cookie, &loc, &refused, NULL)); /* '+' is a space */
  assert_int_equal(refused, 0);
  assert_false(megad_web_login_post(l, "next=/", "10.0.0.1", 1200, &cookie, &loc, &refused, NULL));
  assert_false(megad_web_login_post(l, "", "10.0.0.1", 2100, &cookie, &loc, &refused, NULL));
  assert_int_equal(refused, 3);
  /* the right one: a session cookie, not the token */
  assert_true(megad_web_login_post(l, "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D&next=/jobs/j-1-n1",
                                   "10.0.0.1", 3000, &cookie, &loc, &refused, NULL));
  assert_string_equal(loc, "/jobs/j-1-n1");
  assert_int_equal(strncmp(cookie, "mega_session=", 13), 0);
  assert_non_null(strstr(cookie, "; HttpOnly"));
  assert_non_null(strstr(cookie, "; SameSite=Strict"));
  assert_non_null(strstr(cookie, "; Path=/"));
  assert_null(strstr(cookie, token));
  assert_null(strstr(cookie, "c2VjcmV0"));
  char hdr[256], id[80];
  sscanf(cookie, "mega_session=%70[0-9a-f]", id);
  assert_int_equal(strlen(id), 64);
  snprintf(hdr, sizeof hdr, "theme=dark; mega_session=%s; x=1", id);
  assert_true(megad_web_session_ok(l, hdr, 4000));
  assert_false(megad_web_session_ok(l, NULL, 4000));
  assert_false(megad_web_session_ok(l, "mega_session=", 4000));
  /* forged: one character off, a prefix, the token itself */
  char forged[256];
  snprintf(forged, sizeof forged, "mega_session=%s", id);
  forged[13] = forged[13] == 'a' ? 'b' : 'a';
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "mega_session=%.63s", id);
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "mega_session=%s", token);
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "other_session=%s", id);
  assert_false(megad_web_session_ok(l, forged, 4000));
  /* it expires */
  assert_false(megad_web_session_ok(l, hdr, 3000 + (int64_t)MEGAD_WEB_SESSION_S * 1000 + 1));
  free(cookie);
  free(loc);
  /* a next that leaves megad returns to / */
  const char *bad[] = {"//evil.example/", "http://evil.example/", "/a\"b", "/x?<y>", "jobs"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char form[256], enc[96];
    size_t o = 0;
    for (const char *p = bad[i]; *p; p++) o += (size_t)snprintf(enc + o, sizeof enc - o, "%%%02X", (unsigned char)*p);
    snprintf(form, sizeof form, "token=Zm9vYmFy%%2Bc2VjcmV0%%2FdG9rZW4%%3D&next=%s", enc);
    assert_true(megad_web_login_post(l, form, "10.0.0.1", 5000, &cookie, &loc, &refused, NULL));
    assert_string_equal(loc, "/");
    free(cookie);
    free(loc);
  }
  /* logout forgets the session and clears the cookie */
  assert_true(megad_web_login_post(l, "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D", "10.0.0.1", 6000,
                                   &cookie, &loc, &refused, NULL));
  sscanf(cookie, "mega_session=%70[0-9a-f]", id);
  snprintf(hdr, sizeof hdr, "mega_session=%s", id);
  free(cookie);
  free(loc);
  assert_true(megad_web_session_ok(l, hdr, 6001));
  megad_web_logout(l, hdr, &cookie);
  assert_non_null(strstr(cookie, "Max-Age=0"));
  free(cookie);
  assert_false(megad_web_session_ok(l, hdr, 6002));
  /* the form: no script, the next path kept only when plain */
  size_t len;
  char *page = megad_web_login_form("/jobs/j-1-n1", true, &len);
  assert_non_null(strstr(page, "name=\"next\" value=\"/jobs/j-1-n1\""));
  assert_non_null(strstr(page, "id=\"wrong\""));
  assert_null(strstr(page, "<script"));
  free(page);
  page = megad_web_login_form("/jobs/\"><script>", false, &len);
  assert_non_null(strstr(page, "name=\"next\" value=\"/\""));
  assert_null(strstr(page, "<script"));
  assert_null(strstr(page, "id=\"wrong\""));
  free(page);
  megad_web_login_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_thins_and_marks),
      cmocka_unit_test(test_ring_dense_evals),
      cmocka_unit_test(test_ring_from_journal),
      cmocka_unit_test(test_owns),
      cmocka_unit_test_setup_teardown(test_page_is_self_contained, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cluster_and_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_one_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mirror_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_steps_since, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trace_and_methods, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stream_route, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sse_compose, setup, teardown),
      cmocka_unit_test(test_login),
      cmocka_unit_test(test_login_guesses_held_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
