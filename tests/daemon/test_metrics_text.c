/* daemon/metrics_text: the /metrics page follows Prometheus' text format
 * (checked line by line here) and its practice: counters end in _total,
 * base units, only running jobs get series and at most
 * MEGAD_METRICS_JOBS_MAX of them, no user-given name as a label, label
 * values escaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/metrics_text.h"
#include "daemon/model/stepring.h"

/* ---- a checker of the exposition format (version 0.0.4) ---- */

static bool name_ok(const char *s, size_t n) {
  if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':')) return false;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':')) return false;
  return true;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* Families seen, in order, with their type. */
typedef struct fam {
  char name[128], type[16];
  int samples;
} fam;

/* Checks every line; returns the number of samples. Fails the test on a
 * line Prometheus would refuse or on a family split, retyped or typed after
 * its samples. */
static int check_format(const char *page, fam *fams, int *nfams) {
  assert_true(page[0] && page[strlen(page) - 1] == '\n'); /* the last line ends in \n */
  int nf = 0, samples = 0;
  char cur[128] = "";
  for (const char *line = page; *line;) {
    const char *eol = strchr(line, '\n');
    assert_non_null(eol);
    char l[1024];
    size_t n = (size_t)(eol - line);
    assert_true(n < sizeof l);
    memcpy(l, line, n);
    l[n] = '\0';
    line = eol + 1;
    if (!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7)) {
      char name[128], rest[512] = "";
      assert_true(sscanf(l + 7, "%127s %511[^\n]", name, rest) >= 1);
      assert_true(name_ok(name, strlen(name)));
      if (!strncmp(l, "# HELP ", 7)) {
        for (int i = 0; i < nf; i++) assert_true(strcmp(fams[i].name, name) != 0); /* once */
        snprintf(fams[nf].name, sizeof fams[nf].name, "%s", name);
        fams[nf].type[0] = '\0';
        fams[nf].samples = 0;
        nf++;
        snprintf(cur, sizeof cur, "%s", name);
      } else {
        assert_string_equal(name, cur); /* TYPE right after its HELP, before samples */
        assert_int_equal(fams[nf - 1].samples, 0);
        assert_true(!strcmp(rest, "counter") || !strcmp(rest, "gauge") ||
                    !strcmp(rest, "summary") || !strcmp(rest, "histogram") ||
                    !strcmp(rest, "untyped"));
        snprintf(fams[nf - 1].type, sizeof fams[nf - 1].type, "%.15s", rest);
        /* Prometheus practice: counters and only counters end in _total */
        assert_int_equal(!strcmp(rest, "counter"), ends_with(name, "_total"));
      }
      continue;
    }
    assert_true(l[0] != '#' && l[0] != '\0');
    /* name{labels} value */
    size_t nl = strcspn(l, "{ ");
    assert_true(name_ok(l, nl));
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)nl, l);
    /* the sample belongs to the current family (summaries add _sum, _count) */
    size_t cl = strlen(cur);
    assert_true(!strncmp(name, cur, cl) &&
                (!name[cl] || !strcmp(name + cl, "_sum") || !strcmp(name + cl, "_count")));
    const char *p = l + nl;
    if (*p == '{') {
      p++;
      while (*p != '}') {
        size_t ln = strcspn(p, "=");
        assert_true(name_ok(p, ln));
        assert_false(ln == 4 && !strncmp(p, "name", 4)); /* no user-given names */
        p += ln;
        assert_true(p[0] == '=' && p[1] == '"');
        p += 2;
        for (; *p != '"'; p++) {
          assert_true(*p && *p != '\n');
          if (*p == '\\') {
            p++;
            assert_true(*p == '\\' || *p == '"' || *p == 'n');
          }
        }
        p++;
        if (*p == ',') p++;
      }
      p++;
    }
    assert_true(*p == ' ');
    p++;
    if (strcmp(p, "NaN") && strcmp(p, "+Inf") && strcmp(p, "-Inf")) {
      char *end;
      strtod(p, &end);
      assert_true(end != p && *end == '\0');
    }
    fams[nf - 1].samples++;
    samples++;
  }
  *nfams = nf;
  return samples;
}

static const fam *find_fam(const fam *f, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(f[i].name, name)) return &f[i];
  return NULL;
}

/* ---- jobs to render ---- */

typedef struct tjob {
  mega_job j;
  Mega__V1__StepMetrics step;
  Mega__V1__RankMetrics rm[4], *rmp[4];
} tjob;

static void make_job(tjob *t, const char *id, mega_job_state state, bool with_step) {
  memset(t, 0, sizeof *t);
  t->j.id = (char *)id;
  t->j.name = (char *)"secret \"user\" name";
  t->j.state = state;
  t->j.last_iteration = 7;
  t->j.train_iters = 100;
  t->j.attempt = 1;
  if (!with_step) return;
  mega__v1__step_metrics__init(&t->step);
  t->step.loss = 3.25;
  t->step.tokens_per_s = 1000;
  t->step.time_unix_ms = 1700000123500;
  for (int r = 0; r < 4; r++) {
    mega__v1__rank_metrics__init(&t->rm[r]);
    t->rm[r].rank = (uint32_t)r;
    t->rm[r].pp_rank = (uint32_t)r / 2;
    t->rm[r].bubble_s = 0.25;
    t->rm[r].step_time_s = 1.0;
    t->rmp[r] = &t->rm[r];
  }
  t->step.ranks = t->rmp;
  t->step.n_ranks = 4;
  t->j.hist.last_step = &t->step;
  t->j.coord.report_delay_sum_s = 0.5;
  t->j.coord.report_delay_n = 5;
}

static char *render(const megad_metrics *m) {
  size_t len = 0;
  char *page = megad_metrics_render(m, &len);
  assert_non_null(page);
  assert_int_equal(len, strlen(page));
  return page;
}

/* A page with a bit of everything: four jobs in four states (one id that
 * needs escaping), counters, process figures. */
static char *sample_page(void) {
  static tjob t[4];
  make_job(&t[0], "j-1-a", MEGA_JOB_RUNNING, true);
  make_job(&t[1], "j-2-a", MEGA_JOB_SUCCEEDED, true);
  make_job(&t[2], "j-3-a", MEGA_JOB_PENDING, false);
  make_job(&t[3], "j-4-\"x\\y\nz", MEGA_JOB_RESTARTING, false);
  static const mega_job *jobs[4];
  for (int i = 0; i < 4; i++) jobs[i] = &t[i].j;
  static megad_rpc_count rpcs[2] = {{"/mega.v1.Control/SubmitJob", 3},
                                    {"/mega.v1.Control/GetJob", 9}};
  megad_metrics m = {.proc = {12.5, 1.7e9, 4096 * 1024.0, 1e8, 12, 1024},
                     .version = "0.1.0", .slots = 4, .slots_used = 2, .rpcs = rpcs, .nrpcs = 2,
                     .jobs = jobs, .njobs = 4};
  m.c.jobs_submitted = 4;
  m.c.jobs_finished[0] = 1;
  m.c.job_events[7] = 2; /* RESTARTING */
  m.c.steps_merged = 70;
  m.c.steps_relayed = 140;
  m.c.watchers_dropped = 1;
  m.web_streams = 3;
  m.c.http_requests[0] = 5;
  m.c.report_delay_sum_s = 0.25;
  m.c.report_delay_n = 10;
  return render(&m);
}

static void test_page_follows_the_format(void **state) {
  (void)state;
  char *page = sample_page();
  fam f[128];
  int nf = 0;
  assert_true(check_format(page, f, &nf) > 30);

  /* the process, in base units */
  assert_non_null(strstr(page, "\nprocess_cpu_seconds_total 12.5\n"));
  assert_non_null(strstr(page, "\nprocess_resident_memory_bytes 4194304\n"));
  assert_non_null(strstr(page, "\nprocess_open_fds 12\n"));
  assert_non_null(strstr(page, "\nprocess_start_time_seconds 1700000000\n"));
  /* counters */
  assert_string_equal(find_fam(f, nf, "mega_jobs_submitted_total")->type, "counter");
  assert_non_null(strstr(page, "\nmega_jobs_submitted_total 4\n"));
  assert_non_null(strstr(page, "\nmega_jobs_finished_total{state=\"succeeded\"} 1\n"));
  assert_non_null(strstr(page, "\nmega_job_restarts_total 2\n"));
  assert_non_null(strstr(page, "\nmega_steps_merged_total 70\n"));
  assert_non_null(strstr(page, "\nmega_worker_steps_relayed_total 140\n"));
  assert_non_null(strstr(page, "\nmega_watchers_dropped_total 1\n"));
  assert_non_null(strstr(page, "\nmega_web_streams 3\n"));
  assert_non_null(
      strstr(page, "\nmega_rpc_served_total{method=\"/mega.v1.Control/GetJob\"} 9\n"));
  assert_non_null(strstr(page, "\nmega_http_requests_total{code=\"200\"} 5\n"));
  assert_non_null(strstr(page, "\nmega_step_report_delay_seconds_sum 0.25\n"));
  assert_non_null(strstr(page, "\nmega_step_report_delay_seconds_count 10\n"));
  /* gauges of now */
  assert_non_null(strstr(page, "\nmega_jobs{state=\"pending\"} 1\n"));
  assert_non_null(strstr(page, "\nmega_jobs{state=\"succeeded\"} 1\n"));
  assert_non_null(strstr(page, "\nmega_node_slots_used 2\n"));
  /* the running job by id; the finished and the pending one not at all */
  assert_non_null(strstr(page, "\nmega_job_iteration{job=\"j-1-a\"} 7\n"));
  assert_non_null(strstr(page, "\nmega_job_loss{job=\"j-1-a\"} 3.25\n"));
  /* when its last step merged, for an alert on a job that stopped stepping */
  assert_non_null(
      strstr(page, "\nmega_job_last_step_timestamp_seconds{job=\"j-1-a\"} 1700000123.5\n"));
  /* the attempt is the job's (proto: 0 for the first run), and its help says so */
  assert_non_null(strstr(page, "\nmega_job_attempt{job=\"j-1-a\"} 1\n"));
  assert_non_null(strstr(page, "\n# HELP mega_job_attempt The job's current attempt (0: the first,"));
  assert_non_null(strstr(page, "\nmega_job_stage_bubble_ratio{job=\"j-1-a\",stage=\"1\"} 0.25\n"));
  assert_non_null(strstr(page, "\nmega_job_step_report_delay_seconds_count{job=\"j-1-a\"} 5\n"));
  assert_null(strstr(page, "j-2-a"));
  assert_null(strstr(page, "j-3-a"));
  assert_null(strstr(page, "secret"));
  /* an id with a quote, a backslash and a newline is escaped */
  assert_non_null(strstr(page, "mega_job_iteration{job=\"j-4-\\\"x\\\\y\\nz\"} 7\n"));
  free(page);
}

/* Thousands of running jobs still make a page of bounded size. */
static void test_jobs_are_bounded(void **state) {
  (void)state;
  size_t n = 5000;
  tjob *t = calloc(n, sizeof *t);
  const mega_job **jobs = calloc(n, sizeof *jobs);
  char (*ids)[32] = calloc(n, sizeof *ids);
  assert_true(t && jobs && ids);
  for (size_t i = 0; i < n; i++) {
    snprintf(ids[i], sizeof ids[i], "j-%zu-a", i + 1);
    make_job(&t[i], ids[i], MEGA_JOB_RUNNING, true);
    jobs[i] = &t[i].j;
  }
  megad_metrics m = {.proc = {-1, -1, -1, -1, -1, -1}, .jobs = jobs, .njobs = n};
  char *page = render(&m);
  fam f[128];
  int nf = 0;
  check_format(page, f, &nf);
  assert_int_equal(find_fam(f, nf, "mega_job_iteration")->samples, MEGAD_METRICS_JOBS_MAX);
  char want[64];
  snprintf(want, sizeof want, "\nmega_jobs_unlisted %zu\n", n - MEGAD_METRICS_JOBS_MAX);
  assert_non_null(strstr(page, want));
  assert_true(strlen(page) < 64 * 1024);
  /* what the system did not tell is left out, not made up */
  assert_null(strstr(page, "process_"));
  free(page);
  free(t);
  free(jobs);
  free(ids);
}

/* NaN and infinities in the format's spelling. */
static void test_special_values(void **state) {
  (void)state;
  tjob t;
  make_job(&t, "j-1-a", MEGA_JOB_RUNNING, true);
  t.step.loss = NAN;
  t.step.tokens_per_s = INFINITY;
  const mega_job *jobs[1] = {&t.j};
  megad_metrics m = {.proc = {-1, -1, -1, -1, -1, -1}, .jobs = jobs, .njobs = 1};
  char *page = render(&m);
  fam f[128];
  int nf = 0;
  check_format(page, f, &nf);
  assert_non_null(strstr(page, "mega_job_loss{job=\"j-1-a\"} NaN\n"));
  assert_non_null(strstr(page, "mega_job_tokens_per_second{job=\"j-1-a\"} +Inf\n"));
  free(page);
  /* a step without a loss (--simulate-compute) has no loss sample, not 0 */
  t.step.loss = 0;
  t.step.no_loss = true;
  page = render(&m);
  check_format(page, f, &nf);
  assert_null(strstr(page, "mega_job_loss{"));
  assert_non_null(strstr(page, "mega_job_tokens_per_second{job=\"j-1-a\"} +Inf\n"));
  free(page);
}

/* The value of one sample of the page (fails when it is not there). */
static double sample_of(const char *page, const char *series) {
  char want[160];
  snprintf(want, sizeof want, "\n%s ", series);
  const char *at = strstr(page, want);
  if (!at) fail_msg("no sample %s", series);
  return strtod(at + strlen(want), NULL);
}

/* The bubble /metrics gives is the one the web view's curve and megactl
 * watch give for the same step: each rank's bubble over its own step time,
 * averaged over a stage's ranks and over the job's; with the replicas'
 * times apart, time summed over ranks would say otherwise (0.25 and 0.4/3
 * for the stages, 0.2 for the job). */
static void test_bubble_is_the_curves(void **state) {
  (void)state;
  tjob t;
  make_job(&t, "j-1-a", MEGA_JOB_RUNNING, true);
  const double bubble[4] = {0.1, 0.9, 0.2, 0.2}, time[4] = {1.0, 3.0, 1.0, 2.0};
  for (int r = 0; r < 4; r++) {
    t.rm[r].bubble_s = bubble[r];
    t.rm[r].step_time_s = time[r];
  }
  t.step.step_time_s = 3.0;
  const mega_job *jobs[1] = {&t.j};
  megad_metrics m = {.proc = {-1, -1, -1, -1, -1, -1}, .jobs = jobs, .njobs = 1};
  char *page = render(&m);
  assert_float_equal(sample_of(page, "mega_job_stage_bubble_ratio{job=\"j-1-a\",stage=\"0\"}"),
                     (0.1 + 0.3) / 2, 1e-12);
  assert_float_equal(sample_of(page, "mega_job_stage_bubble_ratio{job=\"j-1-a\",stage=\"1\"}"),
                     (0.2 + 0.1) / 2, 1e-12);
  double job = sample_of(page, "mega_job_bubble_ratio{job=\"j-1-a\"}");
  assert_float_equal(job, (0.1 + 0.3 + 0.2 + 0.1) / 4, 1e-12);
  mega_stepring ring = {0};
  mega_err err = {0};
  assert_int_equal(mega_stepring_push(&ring, &t.step, &err), MEGA_OK);
  assert_float_equal(ring.v[0].bubble, job, 1e-12);
  mega_stepring_free(&ring);
  free(page);
}

/* --print: the sample page on stdout, for check_metrics.py (Prometheus'
 * own parser). */
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--print")) {
    char *page = sample_page();
    fputs(page, stdout);
    free(page);
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_page_follows_the_format),
      cmocka_unit_test(test_jobs_are_bounded),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_bubble_is_the_curves),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
