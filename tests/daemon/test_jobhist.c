/* daemon/model/jobhist: what a job's replay ring holds of its steps' ranks.
 * Only the newest MEGA_JOB_HISTORY_RANKS steps keep their per-rank entries;
 * older ones keep every job-level figure, world_size among them. A wide
 * job's full ring once held ~190 bytes per rank per step, for every
 * retained job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/model/jobhist.h"

#define WIDE 512

static Mega__V1__RankMetrics rank_v[WIDE];
static Mega__V1__RankMetrics *rank_p[WIDE];

/* A merged step of world ranks, as stepmerge makes it (world_size 0: a
 * record of an older megad, which set none). */
static void push_step(mega_job_hist *h, uint32_t attempt, uint64_t iteration, uint32_t world,
                      bool world_size) {
  for (uint32_t r = 0; r < world; r++) {
    mega__v1__rank_metrics__init(&rank_v[r]);
    rank_v[r].rank = r;
    rank_v[r].pp_rank = r % 4;
    rank_v[r].dp_rank = r / 4;
    rank_v[r].step_time_s = 0.25;
    rank_v[r].bubble_s = 0.05;
    rank_p[r] = &rank_v[r];
  }
  Mega__V1__StepMetrics s = MEGA__V1__STEP_METRICS__INIT;
  s.attempt = attempt;
  s.iteration = iteration;
  s.loss = 10.0 / (double)iteration;
  s.grad_norm = 1.5;
  s.lr = 1e-4;
  s.step_time_s = 0.25;
  s.tokens_per_s = 4096;
  s.time_unix_ms = 1000 + (int64_t)iteration;
  s.has_eval_loss = iteration % 10 == 0;
  s.eval_loss = 3.25;
  s.ranks = rank_p;
  s.n_ranks = world;
  s.world_size = world_size ? world : 0;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = &s;
  assert_int_equal(mega_job_hist_push(h, &item, NULL), MEGA_OK);
}

static void push_event(mega_job_hist *h, uint32_t attempt) {
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.attempt = attempt;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO;
  ev.message = "";
  ev.node_id = "";
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(h, &item, NULL), MEGA_OK);
}

/* The ring's rank entries, and that exactly its newest
 * MEGA_JOB_HISTORY_RANKS steps (in replay order) have theirs, each step
 * saying its world. */
static size_t check_ranks(const mega_job_hist *h, uint32_t world) {
  size_t entries = 0, newer = 0;
  for (size_t i = h->len; i-- > 0;) {
    const Mega__V1__WatchJobResponse *it = mega_job_hist_at(h, i);
    if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) continue;
    const Mega__V1__StepMetrics *s = it->step;
    entries += s->n_ranks;
    if (newer++ < MEGA_JOB_HISTORY_RANKS) assert_int_equal(s->n_ranks, world);
    else assert_int_equal(s->n_ranks, 0);
    if (!s->n_ranks) assert_null(s->ranks);
    assert_int_equal(s->world_size, world);
  }
  return entries;
}

static size_t heap_in_use(void) { return mallinfo2().uordblks; }

/* A 512-rank job's full ring holds the ranks of 64 steps, not 1,024; the
 * old steps keep everything a replay's line shows. */
static void test_ring_holds_newest_ranks_only(void **state) {
  (void)state;
  size_t before = heap_in_use();
  mega_job_hist h = {0};
  for (uint64_t i = 1; i <= MEGA_JOB_HISTORY + 100; i++) push_step(&h, 0, i, WIDE, true);
  size_t held = heap_in_use() - before;
  assert_int_equal(h.len, MEGA_JOB_HISTORY);
  assert_int_equal(check_ranks(&h, WIDE), (size_t)MEGA_JOB_HISTORY_RANKS * WIDE);
  /* an old step: the job-level figures as pushed */
  const Mega__V1__StepMetrics *old = mega_job_hist_at(&h, 0)->step;
  assert_int_equal(old->iteration, 101);
  assert_int_equal(old->attempt, 0);
  assert_true(old->loss == 10.0 / 101);
  assert_true(old->grad_norm == 1.5 && old->lr == 1e-4 && old->step_time_s == 0.25);
  assert_true(old->tokens_per_s == 4096 && old->time_unix_ms == 1101);
  const Mega__V1__StepMetrics *ev = mega_job_hist_at(&h, 9)->step; /* iteration 110 */
  assert_true(ev->has_eval_loss && ev->eval_loss == 3.25);
  /* the newest, and the last step, keep every rank's figures */
  const Mega__V1__StepMetrics *top = mega_job_hist_at(&h, MEGA_JOB_HISTORY - 1)->step;
  assert_int_equal(top->n_ranks, WIDE);
  assert_true(top->ranks[WIDE - 1]->bubble_s == 0.05);
  assert_int_equal(h.last_step->n_ranks, WIDE);
  /* the web view's curve never held ranks: its world and bubble were
   * taken as each step came */
  for (size_t i = 0; i < h.curve.n; i++) assert_int_equal(h.curve.v[i].world, WIDE);
  assert_true(h.curve.v[0].bubble > 0.19 && h.curve.v[0].bubble < 0.21);
  print_message("a %d-rank job's full history: %zu bytes on the heap (%.1f MB)\n", WIDE, held,
                (double)held / 1e6);
  /* a full ring of 1,024 steps with every rank was ~100 MB here */
  assert_true(held < 12 * 1000 * 1000);
  mega_job_hist_free(&h);
}

/* A late step (sent again after a takeover) goes where it belongs: older
 * than the newest 64, it keeps no ranks; among them, it pushes the oldest
 * of them out of the 64. Events in between count for nothing. */
static void test_late_steps_keep_the_bound(void **state) {
  (void)state;
  mega_job_hist h = {0};
  for (uint64_t i = 1; i <= 200; i++) {
    push_step(&h, 1, 100 + i, 4, true);
    if (i % 7 == 0) push_event(&h, 1);
  }
  check_ranks(&h, 4);
  push_step(&h, 0, 50, 4, true); /* an earlier attempt's: before them all */
  assert_int_equal(mega_job_hist_at(&h, 0)->step->iteration, 50);
  check_ranks(&h, 4);
  push_step(&h, 1, 290, 4, true); /* again: among the newest */
  check_ranks(&h, 4);
  push_step(&h, 1, 150, 4, true); /* among the old ones */
  check_ranks(&h, 4);
  mega_job_hist_free(&h);
}

/* A record of an older megad has no world_size: the step keeps its
 * number of ranks when they go. */
static void test_old_records_keep_their_world(void **state) {
  (void)state;
  mega_job_hist h = {0};
  for (uint64_t i = 1; i <= MEGA_JOB_HISTORY_RANKS + 5; i++) push_step(&h, 0, i, 3, false);
  const Mega__V1__StepMetrics *old = mega_job_hist_at(&h, 0)->step;
  assert_int_equal(old->n_ranks, 0);
  assert_int_equal(old->world_size, 3);
  assert_int_equal(mega_job_hist_at(&h, h.len - 1)->step->n_ranks, 3);
  assert_int_equal(h.curve.v[0].world, 3);
  mega_job_hist_free(&h);
}

int main(void) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_ring_holds_newest_ranks_only),
      cmocka_unit_test(test_late_steps_keep_the_bound),
      cmocka_unit_test(test_old_records_keep_their_world),
  };
  return cmocka_run_group_tests(all, NULL, NULL);
}
