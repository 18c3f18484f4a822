#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/trace.h"

/* Dumps t and parses it back; fails the test when it is not JSON. */
static json_t *round_trip(const mega_trace *t) {
  char *text = mega_trace_dump(t);
  assert_non_null(text);
  json_error_t jerr;
  json_t *doc = json_loads(text, 0, &jerr);
  if (!doc) fail_msg("trace is not JSON: %s at line %d: %s", jerr.text, jerr.line, text);
  free(text);
  assert_true(json_is_object(doc));
  assert_string_equal(json_string_value(json_object_get(doc, "displayTimeUnit")), "ms");
  assert_true(json_is_array(json_object_get(doc, "traceEvents")));
  return doc;
}

static double num(const json_t *ev, const char *key) {
  json_t *v = json_object_get(ev, key);
  assert_true(json_is_number(v));
  return json_number_value(v);
}

static const char *str(const json_t *ev, const char *key) {
  json_t *v = json_object_get(ev, key);
  assert_true(json_is_string(v));
  return json_string_value(v);
}

/* The metadata event `what` for tid, or NULL. */
static json_t *find_meta(json_t *events, const char *what, int tid) {
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    if (!strcmp(str(ev, "ph"), "M") && !strcmp(str(ev, "name"), what) && num(ev, "tid") == tid)
      return ev;
  }
  return NULL;
}

static void spans_and_metadata(void **state) {
  (void)state;
  mega_trace *t = mega_trace_new("mega test");
  assert_non_null(t);
  mega_trace_track(t, 0, "rank 0");
  mega_trace_track(t, 3, "rank 3 (pp 3, dp 0)");
  mega_trace_span(t, 3, "F2.1", "compute", 1500, 250.5);
  json_t *doc = round_trip(t);
  json_t *events = json_object_get(doc, "traceEvents");

  json_t *proc = find_meta(events, "process_name", 0);
  assert_non_null(proc);
  assert_string_equal(json_string_value(json_object_get(json_object_get(proc, "args"), "name")),
                      "mega test");
  json_t *th = find_meta(events, "thread_name", 3);
  assert_non_null(th);
  assert_string_equal(json_string_value(json_object_get(json_object_get(th, "args"), "name")),
                      "rank 3 (pp 3, dp 0)");
  assert_int_equal(num(th, "pid"), num(proc, "pid"));
  json_t *sort = find_meta(events, "thread_sort_index", 3);
  assert_non_null(sort);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(sort, "args"), "sort_index")),
                   3);

  int spans = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    if (strcmp(str(ev, "ph"), "X")) continue;
    spans++;
    assert_string_equal(str(ev, "name"), "F2.1");
    assert_string_equal(str(ev, "cat"), "compute");
    assert_true(num(ev, "ts") == 1500);
    assert_true(num(ev, "dur") == 250.5);
    assert_int_equal(num(ev, "tid"), 3);
    assert_int_equal(num(ev, "pid"), num(proc, "pid"));
  }
  assert_int_equal(spans, 1);
  json_decref(doc);
  mega_trace_free(t);
}

static void names_are_escaped(void **state) {
  (void)state;
  const char *odd = "a \"quoted\"\\ name\nwith a line break";
  mega_trace *t = mega_trace_new(odd);
  assert_non_null(t);
  mega_trace_track(t, 1, odd);
  mega_trace_span(t, 1, odd, odd, 0, 1);
  json_t *doc = round_trip(t);
  json_t *events = json_object_get(doc, "traceEvents");
  json_t *th = find_meta(events, "thread_name", 1);
  assert_non_null(th);
  assert_string_equal(json_string_value(json_object_get(json_object_get(th, "args"), "name")), odd);
  json_decref(doc);
  mega_trace_free(t);
}

static void null_trace_is_harmless(void **state) {
  (void)state;
  mega_trace_track(NULL, 0, "x");
  mega_trace_span(NULL, 0, "x", "y", 0, 1);
  assert_null(mega_trace_dump(NULL));
  mega_trace_free(NULL);
}

/* Pushes a rank's actions written in the text form's tokens. */
static void push(mega_schedule *s, int rank, const mega_action *acts, int n) {
  mega_err err = {0};
  for (int i = 0; i < n; i++)
    if (mega_sched_push(s, rank, acts[i], &err) != MEGA_OK) fail_msg("%s", err.msg);
}

typedef struct span {
  char name[32], cat[16];
  double ts, dur;
  int tid;
} span;

/* The X events of a trace, in order. */
static int collect(json_t *doc, span *out, int cap) {
  int n = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(json_object_get(doc, "traceEvents"), i, ev) {
    if (strcmp(str(ev, "ph"), "X")) continue;
    assert_true(n < cap);
    snprintf(out[n].name, sizeof out[n].name, "%s", str(ev, "name"));
    snprintf(out[n].cat, sizeof out[n].cat, "%s", str(ev, "cat"));
    out[n].ts = num(ev, "ts");
    out[n].dur = num(ev, "dur");
    out[n].tid = (int)num(ev, "tid");
    n++;
  }
  return n;
}

static void expect_span(const span *s, int tid, const char *name, const char *cat, double ts,
                        double dur) {
  assert_int_equal(s->tid, tid);
  assert_string_equal(s->name, name);
  assert_string_equal(s->cat, cat);
  assert_true(fabs(s->ts - ts) < 1e-6);
  assert_true(fabs(s->dur - dur) < 1e-6);
}

/* Two ranks, one microbatch, T_f = T_b = 1: rank 0 waits 2 units for the
 * gradient, rank 1 waits 1 unit for its input and idles 1 unit at the end. */
static void hand_built_schedule_layout(void **state) {
  (void)state;
  mega_err err = {0};
  mega_schedule s = {0};
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_CUSTOM, 2, 1, 1, 2, &err), MEGA_OK);
  const mega_action r0[] = {{MEGA_ACT_F, 0, 0}, {MEGA_ACT_SEND_F, 0, 0}, {MEGA_ACT_RECV_B, 0, 0},
                            {MEGA_ACT_B, 0, 0}};
  const mega_action r1[] = {{MEGA_ACT_RECV_F, 0, 0}, {MEGA_ACT_F, 0, 0}, {MEGA_ACT_B, 0, 0},
                            {MEGA_ACT_SEND_B, 0, 0}};
  push(&s, 0, r0, 4);
  push(&s, 1, r1, 4);
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_OK);
  mega_cost cost = {.t_f = 1, .t_b = 1};
  mega_sim sim = {0};
  assert_int_equal(mega_sim_run(&s, &cost, &sim, &err), MEGA_OK);
  assert_true(fabs(sim.makespan - 4) < 1e-9);

  mega_trace *t = mega_trace_new("plan");
  mega_trace_add_sim(t, &s, &sim, 1000);
  json_t *doc = round_trip(t);
  span sp[16];
  int n = collect(doc, sp, 16);
  assert_int_equal(n, 9);
  expect_span(&sp[0], 0, "F0.0", "compute", 0, 1000);
  expect_span(&sp[1], 0, "bubble", "bubble", 1000, 2000);
  expect_span(&sp[2], 0, "RB0.0", "p2p", 1000, 2000);
  expect_span(&sp[3], 0, "B0.0", "compute", 3000, 1000);
  expect_span(&sp[4], 1, "bubble", "bubble", 0, 1000);
  expect_span(&sp[5], 1, "RF0.0", "p2p", 0, 1000);
  expect_span(&sp[6], 1, "F0.0", "compute", 1000, 1000);
  expect_span(&sp[7], 1, "B0.0", "compute", 2000, 1000);
  expect_span(&sp[8], 1, "bubble", "bubble", 3000, 1000); /* done at 3 of 4 */
  json_decref(doc);
  mega_trace_free(t);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

/* 1F1B, P=4, M=8: per track, the compute spans are the rank's F and B, the
 * bubble spans add up to the simulator's idle time, and every p2p span sits
 * inside a bubble (properly nested, as the Trace Event Format needs). */
static void simulated_1f1b_adds_up(void **state) {
  (void)state;
  mega_err err = {0};
  mega_sched_params p = {.kind = MEGA_SCHED_1F1B, .pp = 4, .vp = 1, .microbatches = 8};
  assert_int_equal(mega_sched_check_params(&p, &err), MEGA_OK);
  mega_schedule s = {0};
  assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
  mega_cost cost = {.t_f = 1, .t_b = 1};
  mega_sim sim = {0};
  assert_int_equal(mega_sim_run(&s, &cost, &sim, &err), MEGA_OK);

  mega_trace *t = mega_trace_new("plan");
  mega_trace_add_sim(t, &s, &sim, 1000);
  json_t *doc = round_trip(t);
  span *sp = calloc(512, sizeof *sp);
  int n = collect(doc, sp, 512);
  for (int r = 0; r < 4; r++) {
    assert_non_null(find_meta(json_object_get(doc, "traceEvents"), "thread_name", r));
    int compute = 0;
    double bubble = 0, busy = 0, bub_from = -1, bub_to = -1;
    for (int i = 0; i < n; i++) {
      if (sp[i].tid != r) continue;
      if (!strcmp(sp[i].cat, "compute")) {
        compute++;
        busy += sp[i].dur;
        assert_true(sp[i].name[0] == 'F' || sp[i].name[0] == 'B');
      } else if (!strcmp(sp[i].cat, "bubble")) {
        bubble += sp[i].dur;
        bub_from = sp[i].ts;
        bub_to = sp[i].ts + sp[i].dur;
      } else {
        assert_string_equal(sp[i].cat, "p2p");
        assert_true(sp[i].dur > 0);
        assert_true(sp[i].ts >= bub_from - 1e-6 && sp[i].ts + sp[i].dur <= bub_to + 1e-6);
      }
    }
    assert_int_equal(compute, 16);
    assert_true(fabs(busy - 1000 * sim.ranks[r].busy) < 1e-6);
    assert_true(fabs(bubble - 1000 * sim.ranks[r].idle) < 1e-6);
    assert_true(fabs(bubble - 6000) < 1e-6); /* (P-1)(T_f+T_b) */
  }
  free(sp);
  json_decref(doc);
  mega_trace_free(t);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(spans_and_metadata),
      cmocka_unit_test(names_are_escaped),
      cmocka_unit_test(null_trace_is_harmless),
      cmocka_unit_test(hand_built_schedule_layout),
      cmocka_unit_test(simulated_1f1b_adds_up),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
