/* --simulate-compute's pacing (sim_compute.h). */
#include "worker/engine/sim_compute.h"

#include <errno.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(double ms) {
  struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms * 1e6) % 1000000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* Sleeps until t0 + ms (CLOCK_MONOTONIC seconds t0): an action split into
 * many sleeps lasts its whole time, not that plus each sleep's overshoot,
 * so data-parallel ranks do not drift apart. */
static void sleep_until(double t0, double ms) {
  double t = t0 + ms * 1e-3;
  struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

void mega_sim_backward(const mega_gpt_stage *stage, mega_grads *grads, int chunk, double ms,
                       bool ready) {
  int nu;
  const mega_gpt_unit *u = mega_gpt_units(stage, &nu);
  size_t total = 0;
  for (int k = 0; k < nu; k++) total += u[k].numel;
  if (!ready || !grads || nu == 0 || total == 0) {
    sleep_ms(ms);
    return;
  }
  double t0 = now_s();
  size_t done = 0;
  for (int k = 0; k < nu; k++) {
    done += u[k].numel;
    sleep_until(t0, ms * (double)done / (double)total);
    mega_grads_ready(grads, chunk, u[k].first, u[k].count);
  }
}

void mega_sim_forward(const mega_gpt_stage *stage, mega_grads *grads, int chunk, double ms) {
  int nu;
  const mega_gpt_unit *u = mega_gpt_units(stage, &nu);
  size_t total = 0;
  for (int k = 0; k < nu; k++) total += u[k].numel;
  if (!grads || nu == 0 || total == 0) {
    sleep_ms(ms);
    return;
  }
  double t0 = now_s();
  size_t done = 0;
  for (int k = nu - 1; k >= 0; k--) {
    mega_grads_need(grads, chunk, u[k].first, u[k].count);
    done += u[k].numel;
    sleep_until(t0, ms * (double)done / (double)total);
  }
}
