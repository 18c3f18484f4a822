/* Stopping early, as Megatron's training loop does after each iteration:
 * --exit-interval (the iteration alone decides, the same on every rank),
 * and --exit-signal-handler and --exit-duration-in-mins, which one rank
 * may see before the others (its SIGTERM, its clock): those flags go
 * through an all-reduce (max) over the rank's TP, DP and PP groups in turn,
 * which reaches every rank of the grid, so all stop at the same iteration.
 * Megatron all-gathers its signal flags each iteration for the same reason. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "worker/rank/rank_internal.h"

double rank_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void mega_rank_request_exit(mega_rank *r, const char *why) {
  if (!r->job->exit_signal_handler || atomic_exchange(&r->exit_claimed, true)) return;
  snprintf(r->exit_why, sizeof r->exit_why, "%s", why && why[0] ? why : "asked to stop");
  atomic_store(&r->exit_asked, true); /* after the text: readers check this first */
}

const char *mega_rank_stopped(const mega_rank *r) { return r->stopped[0] ? r->stopped : NULL; }

bool mega_rank_stop_was_mine(const mega_rank *r) { return r->stopped_mine; }

/* Every rank's flags, maxed over the whole grid. */
static mega_status agree(mega_rank *r, float *f, size_t n, mega_err *err) {
  static const int order[] = {GROUP_TP, GROUP_DP, GROUP_PP};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    mega_comm *c = r->hcomm[order[i]];
    if (!c) continue;
    mega_status st = mega_comm_all_reduce_max(c, f, n, 0, err);
    if (st != MEGA_OK) {
      mega_err_prefix(err, "agreeing whether to stop after iteration %lld",
                      (long long)r->iteration);
      return st;
    }
  }
  return MEGA_OK;
}

mega_status rank_exit_check(mega_rank *r, bool *stop, mega_err *err) {
  const mega_jobspec *j = r->job;
  *stop = false;
  /* checked at the last iteration too, as Megatron's checkpoint_and_decide_exit
   * is: there a stop skips the evaluation after training (rank_end) */
  if (j->exit_interval > 0 && r->iteration % j->exit_interval == 0) {
    snprintf(r->stopped, sizeof r->stopped, "--exit-interval %d", j->exit_interval);
    r->stopped_mine = true;
    *stop = true;
    return MEGA_OK;
  }
  if (!j->exit_signal_handler && j->exit_duration_in_mins <= 0) return MEGA_OK;
  bool asked = atomic_load(&r->exit_asked);
  double mins = (rank_now_s() - r->start_s) / 60;
  float f[2] = {asked ? 1.0f : 0.0f,
                j->exit_duration_in_mins > 0 && mins > j->exit_duration_in_mins ? 1.0f : 0.0f};
  mega_status st = agree(r, f, 2, err);
  if (st != MEGA_OK) return st;
  if (f[0] > 0) {
    snprintf(r->stopped, sizeof r->stopped, "%s",
             asked ? r->exit_why : "another rank was asked to stop (--exit-signal-handler)");
    r->stopped_mine = asked;
  } else if (f[1] > 0) {
    snprintf(r->stopped, sizeof r->stopped, "--exit-duration-in-mins %d (%.1f minutes ran)",
             j->exit_duration_in_mins, mins);
    r->stopped_mine = true;
  }
  *stop = f[0] > 0 || f[1] > 0;
  return MEGA_OK;
}
