#include "proto/step_bubble.h"

#include <math.h>

/* A rank's time for the step: its own, else the merged step's (0: none). */
static double rank_time(const Mega__V1__StepMetrics *m, const Mega__V1__RankMetrics *r) {
  double d = r->step_time_s > 0 ? r->step_time_s : m->step_time_s;
  return d > 0 ? d : 0;
}

static double share(double part, double whole) { return fmin(fmax(part / whole, 0), 1); }

int mega_step_stage_bubbles(const Mega__V1__StepMetrics *m, mega_stage_bubble *out, int max) {
  int n = 0;
  for (size_t i = 0; i < m->n_ranks; i++)
    if ((int)m->ranks[i]->pp_rank + 1 > n) n = (int)m->ranks[i]->pp_rank + 1;
  if (n > max) n = max;
  for (int s = 0; s < n; s++) out[s] = (mega_stage_bubble){0};
  for (size_t i = 0; i < m->n_ranks; i++) {
    const Mega__V1__RankMetrics *r = m->ranks[i];
    double d = rank_time(m, r);
    if ((int)r->pp_rank >= n || !(d > 0)) continue;
    mega_stage_bubble *st = &out[r->pp_rank];
    st->ranks++;
    st->bubble += share(r->bubble_s, d);
    st->warmup += share(r->bubble_warmup_s, d);
    st->steady += share(r->bubble_steady_s, d);
    st->cooldown += share(r->bubble_cooldown_s, d);
    if (r->bubble_warmup_s > 0 || r->bubble_steady_s > 0 || r->bubble_cooldown_s > 0)
      st->split = true;
  }
  for (int s = 0; s < n; s++)
    if (out[s].ranks) {
      out[s].bubble /= out[s].ranks;
      out[s].warmup /= out[s].ranks;
      out[s].steady /= out[s].ranks;
      out[s].cooldown /= out[s].ranks;
    }
  return n;
}

double mega_step_bubble(const Mega__V1__StepMetrics *m) {
  double sum = 0;
  size_t timed = 0;
  for (size_t i = 0; i < m->n_ranks; i++) {
    double d = rank_time(m, m->ranks[i]);
    if (!(d > 0)) continue;
    sum += share(m->ranks[i]->bubble_s, d);
    timed++;
  }
  return timed ? sum / (double)timed : 0;
}

uint32_t mega_step_world(const Mega__V1__StepMetrics *m) {
  return m->world_size ? m->world_size : (uint32_t)m->n_ranks;
}
