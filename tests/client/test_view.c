/* megactl watch's drawing, from constructed messages: per-stage bubble
 * averages, the live block (widths, colors, ASCII fallback, many stages,
 * no step yet), plain lines and event lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "client/view.h"

#define MAXR 128

/* A step of pp stages × dp replicas (tp 1); rank = pp_rank*dp + dp_rank. */
typedef struct fixture {
  Mega__V1__StepMetrics step;
  Mega__V1__RankMetrics rm[MAXR];
  Mega__V1__RankMetrics *rp[MAXR];
} fixture;

static void make_step(fixture *fx, int pp, int dp) {
  mega__v1__step_metrics__init(&fx->step);
  fx->step.iteration = 120;
  fx->step.loss = 2.5;
  fx->step.grad_norm = 0.75;
  fx->step.lr = 1.5e-4;
  fx->step.step_time_s = 0.2;
  fx->step.tokens_per_s = 12345;
  for (int s = 0; s < pp; s++)
    for (int d = 0; d < dp; d++) {
      int r = s * dp + d;
      Mega__V1__RankMetrics *m = &fx->rm[r];
      mega__v1__rank_metrics__init(m);
      m->rank = (uint32_t)r;
      m->pp_rank = (uint32_t)s;
      m->dp_rank = (uint32_t)d;
      m->step_time_s = 0.2;
      m->bubble_s = 0.02 * (s + 1); /* stage s: 10%·(s+1) */
      m->compute_s = 0.2 - m->bubble_s;
      fx->rp[r] = m;
    }
  fx->step.n_ranks = (size_t)(pp * dp);
  fx->step.ranks = fx->rp;
}

static view_model model_for(const Mega__V1__StepMetrics *step) {
  view_model v = {0};
  v.job_id = "j-7";
  v.name = "tiny";
  v.state = MEGA__V1__JOB_STATE__JOB_STATE_RUNNING;
  v.world = 4;
  v.tp = 1;
  v.pp = 2;
  v.dp = 2;
  v.vp = 1;
  v.train_iters = 1000;
  v.started_ms = 1700000000000;
  v.step = step;
  return v;
}

/* Renders into a string (the caller frees it); *lines gets the count. */
static char *render(const view_model *v, const view_opts *o, int *lines) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  *lines = view_render(f, v, 1700000012345, o);
  fclose(f);
  return buf;
}

/* Visible columns of each line (escapes skipped, a UTF-8 character one
 * column); fails past width. Returns the number of lines. */
static int check_widths(const char *s, int width) {
  int lines = 0, cols = 0;
  for (size_t i = 0; s[i]; i++) {
    if (s[i] == '\x1b') {
      assert_int_equal(s[i + 1], '[');
      i += 2;
      while (s[i] && !(s[i] >= 0x40 && s[i] <= 0x7e)) i++;
      continue;
    }
    if (s[i] == '\n') {
      lines++;
      cols = 0;
      continue;
    }
    if (((unsigned char)s[i] & 0xC0) != 0x80) cols++;
    if (cols > width) fail_msg("line %d is wider than %d columns: %s", lines + 1, width, s);
  }
  return lines;
}

static void test_stage_bubbles_average_over_replicas(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 3, 2);
  /* One replica of stage 0 idles more: the stage shows the mean. */
  fx.rm[1].bubble_s = 0.06;
  /* Stage 2 reports a phase split on one rank. */
  fx.rm[4].bubble_warmup_s = 0.02;
  fx.rm[4].bubble_steady_s = 0.01;
  fx.rm[4].bubble_cooldown_s = 0.03;
  fx.rm[4].bubble_s = 0.06;
  /* A rank whose own step time is unknown is measured against the step's. */
  fx.rm[5].step_time_s = 0;
  view_stage st[8];
  int n = view_stage_bubbles(&fx.step, st, 8);
  assert_int_equal(n, 3);
  assert_int_equal(st[0].ranks, 2);
  assert_float_equal(st[0].bubble, (0.1 + 0.3) / 2, 1e-12);
  assert_false(st[0].split);
  assert_float_equal(st[1].bubble, 0.2, 1e-12);
  assert_float_equal(st[2].bubble, 0.3, 1e-12);
  assert_true(st[2].split);
  assert_float_equal(st[2].warmup, 0.1 / 2, 1e-12);
  assert_float_equal(st[2].steady, 0.05 / 2, 1e-12);
  assert_float_equal(st[2].cooldown, 0.15 / 2, 1e-12);

  /* max caps the stages; a step with no ranks has none. */
  assert_int_equal(view_stage_bubbles(&fx.step, st, 2), 2);
  fx.step.n_ranks = 0;
  assert_int_equal(view_stage_bubbles(&fx.step, st, 8), 0);
}

static void test_stage_without_step_time_has_no_report(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 2, 1);
  fx.step.step_time_s = 0;
  fx.rm[1].step_time_s = 0;
  view_stage st[4];
  assert_int_equal(view_stage_bubbles(&fx.step, st, 4), 2);
  assert_int_equal(st[0].ranks, 1);
  assert_int_equal(st[1].ranks, 0);
  view_model v = model_for(&fx.step);
  view_opts o = {.width = 80};
  int lines;
  char *s = render(&v, &o, &lines);
  assert_non_null(strstr(s, "no report"));
  free(s);
}

static void test_render_block(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 2, 2);
  view_model v = model_for(&fx.step);
  view_opts o = {.width = 100, .unicode = true};
  int lines;
  char *s = render(&v, &o, &lines);
  assert_int_equal(check_widths(s, 100), lines);
  assert_int_equal(lines, 6); /* header, progress, metrics, bubble title, 2 stages */
  assert_null(strchr(s, '\x1b'));
  assert_non_null(strstr(s, "job j-7 tiny  running  world 4 = TP 1 × PP 2 × DP 2  12.35 s\n"));
  assert_non_null(strstr(s, "iteration 120/1000 ["));
  assert_non_null(strstr(s, "]  12.0%\n"));
  assert_non_null(
      strstr(s, "loss 2.5000  grad norm 0.75  lr 1.500e-04  step 200 ms  tokens/s 12.3k\n"));
  assert_non_null(strstr(s, "bubble per stage\n"));
  assert_non_null(strstr(s, "  stage 0 ["));
  assert_non_null(strstr(s, "]  10.0%\n"));
  assert_non_null(strstr(s, "]  20.0%\n"));
  /* Stage 1's bar is twice stage 0's. */
  const char *s0 = strstr(s, "  stage 0 ["), *s1 = strstr(s, "  stage 1 [");
  int b0 = 0, b1 = 0;
  for (const char *p = s0; *p != ']'; p++) b0 += !strncmp(p, "█", strlen("█"));
  for (const char *p = s1; *p != ']'; p++) b1 += !strncmp(p, "█", strlen("█"));
  assert_true(b0 > 0);
  assert_int_equal(b1, 2 * b0);
  free(s);
}

static void test_render_split_legend_and_colors(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 2, 1);
  fx.rm[0].bubble_warmup_s = 0.01;
  fx.rm[0].bubble_steady_s = 0.005;
  fx.rm[0].bubble_cooldown_s = 0.005;
  view_model v = model_for(&fx.step);
  v.vp = 2;
  v.attempt = 1;
  view_opts o = {.width = 120, .unicode = true, .color = true};
  int lines;
  char *s = render(&v, &o, &lines);
  assert_int_equal(check_widths(s, 120), lines);
  assert_non_null(strstr(s, "\x1b["));
  assert_non_null(strstr(s, "warmup"));
  assert_non_null(strstr(s, "cooldown"));
  assert_non_null(strstr(s, "(VP 2)  attempt 1"));
  assert_non_null(strstr(s, "  w  5.0% s  2.5% c  2.5%"));
  free(s);
}

static void test_render_fits_narrow_terminals_and_ascii(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 4, 2);
  fx.rm[0].bubble_warmup_s = 0.01;
  for (int width = 20; width <= 200; width += 7) {
    view_model v = model_for(&fx.step);
    fx.step.skipped = width % 2 == 1;
    view_opts o = {.width = width, .unicode = width % 2 == 0, .color = width % 3 == 0};
    int lines;
    char *s = render(&v, &o, &lines);
    assert_int_equal(check_widths(s, width < 40 ? 40 : width), lines);
    if (!o.unicode)
      for (const char *p = s; *p; p++) assert_true((unsigned char)*p < 0x80);
    free(s);
  }
}

static void test_render_many_stages_are_summed_up(void **state) {
  (void)state;
  static fixture fx;
  make_step(&fx, 40, 2);
  for (int r = 0; r < 80; r++) fx.rm[r].bubble_s = 0.2 * 0.02 * (fx.rm[r].pp_rank + 1);
  view_model v = model_for(&fx.step);
  v.pp = 40;
  view_opts o = {.width = 80};
  int lines;
  char *s = render(&v, &o, &lines);
  assert_int_equal(lines, 4 + 15 + 1);
  assert_non_null(strstr(s, "  stage 14 ["));
  assert_null(strstr(s, "  stage 15 ["));
  /* Stages 15..39: 32%..80% in steps of 2; mean 56%, max at 39. */
  assert_non_null(strstr(s, "... 25 more stages: mean 56.0%, max 80.0% (stage 39)\n"));
  free(s);
}

static void test_render_before_the_first_step(void **state) {
  (void)state;
  view_model v = model_for(NULL);
  v.state = MEGA__V1__JOB_STATE__JOB_STATE_PENDING;
  v.world = 0;
  v.started_ms = 0;
  view_opts o = {.width = 80};
  int lines;
  char *s = render(&v, &o, &lines);
  assert_int_equal(lines, 2);
  assert_string_equal(s, "job j-7 tiny  pending\niteration -/1000  waiting for the first step\n");
  free(s);
}

static void test_plain_step_line(void **state) {
  (void)state;
  fixture fx;
  make_step(&fx, 2, 2);
  fx.step.skipped = true;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  view_step_line(f, &fx.step, 1000);
  fx.step.skipped = false;
  fx.step.n_ranks = 0;
  view_step_line(f, &fx.step, 0);
  fclose(f);
  assert_string_equal(buf,
                      "iter 120/1000 loss 2.5000 grad_norm 0.75 lr 1.500e-04 step 0.2000s "
                      "tokens/s 12345 bubble 10.0% 20.0% skipped\n"
                      "iter 120 loss 2.5000 grad_norm 0.75 lr 1.500e-04 step 0.2000s "
                      "tokens/s 12345\n");
  free(buf);
}

static void test_event_lines_and_model(void **state) {
  (void)state;
  setenv("TZ", "UTC", 1);
  tzset();
  Mega__V1__JobEvent e = MEGA__V1__JOB_EVENT__INIT;
  e.time_unix_ms = 1700000001000; /* 22:13:21 UTC */
  e.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RANK_FAILED;
  e.message = "worker exited with signal 9";
  e.has_rank = true;
  e.rank = 3;
  e.node_id = "n1";
  e.attempt = 1;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  view_opts o = {.width = 80};
  view_event_line(f, &e, &o);
  Mega__V1__JobEvent started = MEGA__V1__JOB_EVENT__INIT;
  started.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STARTED;
  started.message = "every rank said hello";
  view_event_line(f, &started, &o);
  fclose(f);
  assert_string_equal(buf,
                      "22:13:21 rank failed worker exited with signal 9 [rank 3, node n1]\n"
                      "--:--:-- started     every rank said hello\n");
  free(buf);

  view_model v = model_for(NULL);
  v.state = MEGA__V1__JOB_STATE__JOB_STATE_PENDING;
  v.started_ms = 0;
  started.time_unix_ms = 5000;
  view_model_event(&v, &started);
  assert_int_equal(v.state, MEGA__V1__JOB_STATE__JOB_STATE_RUNNING);
  assert_int_equal(v.started_ms, 5000);
  view_model_event(&v, &e);
  assert_int_equal(v.attempt, 1);
  e.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING;
  view_model_event(&v, &e);
  assert_int_equal(v.state, MEGA__V1__JOB_STATE__JOB_STATE_RESTARTING);
  e.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED;
  e.time_unix_ms = 9000;
  view_model_event(&v, &e);
  assert_int_equal(v.state, MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
  assert_int_equal(v.ended_ms, 9000);
}

/* A reconnect replays the history: nothing shown twice. A step sent again
 * after a takeover comes after a later attempt's and is still shown. */
static void test_seen_steps(void **state) {
  (void)state;
  view_seen s = {0};
  assert_false(view_seen_step(&s, 0, 1));
  assert_false(view_seen_step(&s, 0, 2));
  assert_false(view_seen_step(&s, 1, 3));
  assert_false(view_seen_step(&s, 0, 3)); /* attempt 0's, late */
  assert_true(view_seen_step(&s, 0, 2));  /* the replay */
  assert_true(view_seen_step(&s, 0, 3));
  assert_true(view_seen_step(&s, 1, 3));
  assert_false(view_seen_step(&s, 1, 4));
  /* past VIEW_SEEN_ATTEMPTS attempts the oldest is forgotten */
  for (uint32_t a = 2; a < VIEW_SEEN_ATTEMPTS; a++) assert_false(view_seen_step(&s, a, 1));
  assert_int_equal(s.n, VIEW_SEEN_ATTEMPTS);
  assert_true(view_seen_step(&s, 0, 3));
  assert_false(view_seen_step(&s, VIEW_SEEN_ATTEMPTS, 1));
  assert_int_equal(s.n, VIEW_SEEN_ATTEMPTS);
  assert_true(view_seen_step(&s, 1, 4));
  assert_false(view_seen_step(&s, 0, 3)); /* forgotten: shown again */
}

/* A gap marker says what went: steps, events, or both. */
static void test_gap_lines(void **state) {
  (void)state;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  Mega__V1__WatchGap g = MEGA__V1__WATCH_GAP__INIT;
  g.missed_steps = 12;
  g.first_iteration = 1;
  g.last_iteration = 12;
  view_gap_line(f, &g, "why");
  g.missed_events = 1;
  view_gap_line(f, &g, "why");
  g.missed_steps = 0;
  g.missed_events = 3;
  view_gap_line(f, &g, "why");
  g.missed_events = 0;
  g.missed_steps = 1;
  g.first_iteration = g.last_iteration = 7;
  view_gap_line(f, &g, "why");
  fclose(f);
  assert_string_equal(text, "missed 12 steps (iterations 1..12): why\n"
                            "missed 12 steps (iterations 1..12) and 1 event: why\n"
                            "missed 3 events: why\n"
                            "missed 1 step (iterations 7..7): why\n");
  free(text);
}

static void test_short_numbers(void **state) {
  (void)state;
  char b[32];
  view_duration(0.0042, b, sizeof b);
  assert_string_equal(b, "4.20 ms");
  view_duration(0.212, b, sizeof b);
  assert_string_equal(b, "212 ms");
  view_duration(12.345, b, sizeof b);
  assert_string_equal(b, "12.35 s");
  view_duration(125, b, sizeof b);
  assert_string_equal(b, "2m05s");
  view_duration(3 * 3600 + 120, b, sizeof b);
  assert_string_equal(b, "3h02m");
  view_si(512, b, sizeof b);
  assert_string_equal(b, "512");
  view_si(12345, b, sizeof b);
  assert_string_equal(b, "12.3k");
  view_si(4.56e6, b, sizeof b);
  assert_string_equal(b, "4.56M");
  assert_string_equal(view_event_kind_name(MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST),
                      "node lost");
  assert_string_equal(view_state_name(MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED), "cancelled");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage_bubbles_average_over_replicas),
      cmocka_unit_test(test_stage_without_step_time_has_no_report),
      cmocka_unit_test(test_render_block),
      cmocka_unit_test(test_render_split_legend_and_colors),
      cmocka_unit_test(test_render_fits_narrow_terminals_and_ascii),
      cmocka_unit_test(test_render_many_stages_are_summed_up),
      cmocka_unit_test(test_render_before_the_first_step),
      cmocka_unit_test(test_plain_step_line),
      cmocka_unit_test(test_event_lines_and_model),
      cmocka_unit_test(test_seen_steps),
      cmocka_unit_test(test_gap_lines),
      cmocka_unit_test(test_short_numbers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
