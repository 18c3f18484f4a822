/* What `megactl plan` costs: the time to generate, validate and simulate a
 * schedule, best of several runs, for a few shapes up to PP=64, VP=8,
 * M=1024. Prints figures; never fails on a time.
 *
 * usage: bench_plan [RUNS]   (default 5; the small shapes run 20 times more) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/sim.h"

typedef struct shape {
  mega_sched_kind kind;
  int pp, vp, m;
} shape;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long total_actions(const mega_schedule *s) {
  long n = 0;
  for (int r = 0; r < s->pp; r++) n += s->ranks[r].n;
  return n;
}

/* One run; fills the three phase times in seconds. Returns 0 on success. */
static int run_once(const shape *sh, double t[3], long *actions, double *bubble) {
  mega_err err = {0};
  mega_sched_params p = {.kind = sh->kind, .pp = sh->pp, .vp = sh->vp, .microbatches = sh->m};
  if (mega_sched_check_params(&p, &err) != MEGA_OK) {
    fprintf(stderr, "bench_plan: %s\n", err.msg);
    return -1;
  }
  mega_schedule s = {0};
  mega_sim sim = {0};
  mega_cost cost = {.t_f = 1, .t_b = 1, .t_w = sh->kind == MEGA_SCHED_ZB_H1 ? 1 : 0};
  int rc = -1;
  double t0 = now();
  if (mega_sched_generate(&p, &s, &err) != MEGA_OK) goto out;
  double t1 = now();
  if (mega_sched_validate(&s, &err) != MEGA_OK) goto out;
  double t2 = now();
  if (mega_sim_run(&s, &cost, &sim, &err) != MEGA_OK) goto out;
  double t3 = now();
  t[0] = t1 - t0;
  t[1] = t2 - t1;
  t[2] = t3 - t2;
  *actions = total_actions(&s);
  *bubble = sim.bubble_fraction;
  rc = 0;
out:
  if (rc) fprintf(stderr, "bench_plan: %s\n", err.msg);
  mega_sim_free(&sim);
  mega_sched_free(&s);
  return rc;
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 5;
  if (runs < 1) runs = 1;
  static const shape shapes[] = {
      {MEGA_SCHED_1F1B, 4, 1, 8},           {MEGA_SCHED_1F1B, 8, 1, 64},
      {MEGA_SCHED_INTERLEAVED, 8, 2, 64},   {MEGA_SCHED_ZB_H1, 16, 1, 256},
      {MEGA_SCHED_INTERLEAVED, 16, 4, 256}, {MEGA_SCHED_1F1B, 64, 1, 1024},
      {MEGA_SCHED_ZB_H1, 64, 1, 1024},      {MEGA_SCHED_INTERLEAVED, 64, 8, 1024},
  };
  printf("best of %d runs (small shapes: %d); times in milliseconds\n", runs, runs * 20);
  printf("%-12s %4s %3s %5s %9s %9s %9s %9s %9s %8s\n", "schedule", "pp", "vp", "M", "actions",
         "generate", "validate", "simulate", "total", "bubble");
  int status = 0;
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const shape *sh = &shapes[k];
    int n = (long)sh->pp * sh->vp * sh->m < 100000 ? runs * 20 : runs;
    double best[4] = {1e30, 1e30, 1e30, 1e30}, bubble = 0;
    long actions = 0;
    for (int i = 0; i < n; i++) {
      double t[3];
      if (run_once(sh, t, &actions, &bubble)) {
        status = 1;
        break;
      }
      for (int j = 0; j < 3; j++)
        if (t[j] < best[j]) best[j] = t[j];
      double total = t[0] + t[1] + t[2];
      if (total < best[3]) best[3] = total;
    }
    if (best[3] >= 1e30) continue;
    printf("%-12s %4d %3d %5d %9ld %9.3f %9.3f %9.3f %9.3f %7.3f%%\n",
           mega_sched_kind_name(sh->kind), sh->pp, sh->vp, sh->m, actions, best[0] * 1e3,
           best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, 100 * bubble);
  }
  printf("(each phase's best is taken on its own; total is the best whole run)\n");
  return status;
}
