/* megactl plan's terminal drawing, called directly (so the sanitizer build
 * covers its index arithmetic). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include "client/render.h"

typedef struct drawn {
  mega_schedule s;
  mega_sim sim;
  mega_cost cost;
  char *text;
} drawn;

static drawn draw(mega_sched_kind kind, int pp, int vp, int m, double t_w, int width, bool color) {
  drawn d = {0};
  mega_err err = {0};
  mega_sched_params p = {.kind = kind, .pp = pp, .vp = vp, .microbatches = m};
  if (mega_sched_check_params(&p, &err) || mega_sched_generate(&p, &d.s, &err))
    fail_msg("%s", err.msg);
  d.cost = (mega_cost){.t_f = 1, .t_b = 1, .t_w = t_w};
  if (mega_sim_run(&d.s, &d.cost, &d.sim, &err)) fail_msg("%s", err.msg);
  size_t len = 0;
  FILE *f = open_memstream(&d.text, &len);
  assert_int_equal(plan_render_text(f, &d.s, &d.sim, &d.cost, width, color), 0);
  fclose(f);
  return d;
}

static void drawn_free(drawn *d) {
  free(d->text);
  mega_sim_free(&d->sim);
  mega_sched_free(&d->s);
}

/* The line that starts with prefix, without its newline (static buffer). */
static const char *line_starting(const char *text, const char *prefix) {
  static char buf[4096];
  for (const char *l = text; l && *l;) {
    const char *nl = strchr(l, '\n');
    size_t len = nl ? (size_t)(nl - l) : strlen(l);
    if (!strncmp(l, prefix, strlen(prefix)) && len < sizeof buf) {
      memcpy(buf, l, len);
      buf[len] = '\0';
      return buf;
    }
    l = nl ? nl + 1 : NULL;
  }
  fail_msg("no line starts with '%s' in:\n%s", prefix, text);
  return NULL;
}

static size_t longest_line(const char *text) {
  size_t best = 0;
  for (const char *l = text; *l;) {
    const char *nl = strchr(l, '\n');
    size_t len = nl ? (size_t)(nl - l) : strlen(l);
    if (len > best) best = len;
    l += len + (nl != NULL);
  }
  return best;
}

/* 1F1B, P=4, M=8 at one cell per time unit: every row is the rank's
 * simulated timeline, 22 cells of 3 characters. */
static void grid_1f1b(void **state) {
  (void)state;
  drawn d = draw(MEGA_SCHED_1F1B, 4, 1, 8, 0, 80, false);
  assert_string_equal(line_starting(d.text, "rank 0 "),
                      "rank 0 F0 F1 F2 F3 ........ B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7");
  assert_string_equal(line_starting(d.text, "rank 3 "),
                      "rank 3 ........ F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 ........");
  assert_non_null(strstr(d.text, "1f1b schedule, pp=4 vp=1 microbatches=8\n"));
  assert_non_null(strstr(d.text, "\ncost model: T_f=1 T_b=1 T_w=0 p2p latency=0\n"));
  const char *r0 = line_starting(d.text, "   0 ");
  char want[128];
  snprintf(want, sizeof want, "%4d  %6d  %6d  %8d  %14d  %8s  %8s  %6.2f%%", 0, 3, 5, 3, 4, "16",
           "6", 100.0 * 3 / 11);
  assert_string_equal(r0, want);
  assert_non_null(strstr(d.text, "makespan 22, mean bubble 27.27%"));
  assert_true(longest_line(d.text) <= 80);
  assert_null(strchr(d.text, '\033'));
  drawn_free(&d);
}

/* Labels carry the chunk when vp > 1; rows too long for one line wrap into
 * bands, each with its own time axis. */
static void interleaved_labels_and_bands(void **state) {
  (void)state;
  drawn d = draw(MEGA_SCHED_INTERLEAVED, 4, 2, 8, 0, 80, false);
  assert_non_null(strstr(d.text, "rank 0 F0.0 F1.0 F2.0 F3.0 F0.1 "));
  int axes = 0;
  for (const char *p = d.text; (p = strstr(p, "\ntime ")); p++) axes++;
  assert_true(axes >= 2);
  assert_true(longest_line(d.text) <= 80);
  drawn_free(&d);
}

/* Too long for labels even in bands: time scaled to the width, each column
 * summarised: the warmup's forwards, the steady phase's mix, the idle. */
static void scaled_letters(void **state) {
  (void)state;
  drawn d = draw(MEGA_SCHED_1F1B, 8, 1, 256, 0, 80, false);
  const char *r7 = line_starting(d.text, "rank 7 ");
  assert_true(strlen(r7) <= 80);
  assert_true(!strncmp(r7, "rank 7 .", 8)); /* the last stage waits for its first input */
  assert_non_null(strstr(r7, "++++++++++"));
  assert_true(!strncmp(line_starting(d.text, "rank 0 "), "rank 0 F", 8));
  assert_non_null(strstr(d.text, "one column is "));
  drawn_free(&d);

  d = draw(MEGA_SCHED_1F1B, 4, 1, 8, 0, 40, false);
  assert_true(longest_line(d.text) <= 76); /* the stats table is wider than 40 */
  line_starting(d.text, "rank 3 ");
  drawn_free(&d);
}

/* Zero bubble: W cells appear; color wraps spans in ANSI escapes and every
 * colored line ends reset. */
static void zero_bubble_in_color(void **state) {
  (void)state;
  drawn d = draw(MEGA_SCHED_ZB_H1, 4, 1, 8, 1, 80, true);
  assert_non_null(strstr(d.text, "W0"));
  assert_non_null(strstr(d.text, "\033[30;45m"));
  for (const char *l = d.text; *l;) {
    const char *nl = strchr(l, '\n');
    size_t len = nl ? (size_t)(nl - l) : strlen(l);
    if (!strncmp(l, "rank ", 5) && memchr(l, '\033', len))
      assert_true(len >= 4 && !strncmp(l + len - 4, "\033[0m", 4));
    l += len + (nl != NULL);
  }
  drawn_free(&d);
}

/* s simulated under cost into *sim and drawn 80 columns wide; the caller
 * frees the text and the simulation. */
static char *sim_and_draw(const mega_schedule *s, mega_cost cost, mega_sim *sim) {
  mega_err err = {0};
  if (mega_sim_run(s, &cost, sim, &err)) fail_msg("%s", err.msg);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_int_equal(plan_render_text(f, s, sim, &cost, 80, false), 0);
  fclose(f);
  return text;
}

/* Times past a double's range (megactl plan refuses them; the renderer must
 * not trust that): a makespan of inf once spun the time axis forever. Huge
 * but finite times draw as any others. */
static void times_past_any_number(void **state) {
  (void)state;
  alarm(20); /* a loop that never ends fails here, not at the suite's timeout */
  mega_err err = {0};
  mega_sched_params p = {.kind = MEGA_SCHED_1F1B, .pp = 4, .vp = 1, .microbatches = 8};
  mega_schedule s;
  if (mega_sched_check_params(&p, &err) || mega_sched_generate(&p, &s, &err)) fail_msg("%s", err.msg);
  double t[] = {1e308, 1e12};
  for (int k = 0; k < 2; k++) {
    mega_sim sim = {0};
    char *text = sim_and_draw(&s, (mega_cost){.t_f = t[k], .t_b = t[k]}, &sim);
    if (k == 0) {
      assert_false(isfinite(sim.makespan));
      assert_non_null(strstr(text, "not a time that can be drawn"));
    } else {
      assert_non_null(strstr(text, "rank 3 "));
      assert_non_null(strstr(text, "makespan 2.2e+13, "));
      assert_true(longest_line(text) <= 80);
    }
    free(text);
    mega_sim_free(&sim);
  }
  mega_sched_free(&s);
  alarm(0);
}

/* A backward a trillionth of the forward has no whole cell on the
 * forward's grid: the grid once drew rank 0 as "F0 F1 .." with both
 * backwards gone; it is drawn scaled, as any other, instead. */
static void no_grid_loses_an_action(void **state) {
  (void)state;
  mega_err err = {0};
  mega_sched_params p = {.kind = MEGA_SCHED_1F1B, .pp = 2, .vp = 1, .microbatches = 2};
  mega_schedule s;
  if (mega_sched_generate(&p, &s, &err)) fail_msg("%s", err.msg);
  mega_sim sim = {0};
  char *text = sim_and_draw(&s, (mega_cost){.t_f = 1e12, .t_b = 1}, &sim);
  if (strstr(text, "one cell is") && !strstr(line_starting(text, "rank 0 "), "B1"))
    fail_msg("a grid without rank 0's backwards:\n%s", text);
  assert_non_null(strstr(text, "a column mostly forward"));
  free(text);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(grid_1f1b),
      cmocka_unit_test(interleaved_labels_and_bands),
      cmocka_unit_test(scaled_letters),
      cmocka_unit_test(zero_bubble_in_color),
      cmocka_unit_test(times_past_any_number),
      cmocka_unit_test(no_grid_loses_an_action),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
