/* daemon/job: the job state machine, the Job message both ways, and the
 * journal: records round trip through a real journal file and replay into
 * the same job state (history included). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/model/job.h"
#include "daemon/model/journal.h"
#include "daemon/model/util.h"

static char *args[] = {"--num-layers", "2", "--train-iters", "3"};

static mega_job *new_job(const char *id) {
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "tiny";
  spec.args = args;
  spec.n_args = 4;
  spec.nnodes_min = 2;
  spec.nproc_per_node = 1;
  mega_job *j = NULL;
  assert_int_equal(mega_job_new(id, &spec, "n1", 1000, &j, NULL), MEGA_OK);
  return j;
}

static void test_transitions(void **state) {
  (void)state;
  const mega_job_state all[] = {MEGA_JOB_PENDING, MEGA_JOB_RUNNING, MEGA_JOB_SUCCEEDED,
                                MEGA_JOB_FAILED, MEGA_JOB_CANCELLED, MEGA_JOB_RESTARTING};
  /* allowed[from][to], in the order of `all` */
  const int allowed[6][6] = {
      {0, 1, 0, 1, 1, 0}, /* PENDING */
      {0, 0, 1, 1, 1, 1}, /* RUNNING */
      {0, 0, 0, 0, 0, 0}, /* SUCCEEDED */
      {0, 0, 0, 0, 0, 1}, /* FAILED: megactl resume */
      {0, 0, 0, 0, 0, 0}, /* CANCELLED */
      {0, 1, 0, 1, 1, 0}, /* RESTARTING */
  };
  for (int f = 0; f < 6; f++)
    for (int t = 0; t < 6; t++) {
      mega_job *j = new_job("j-1");
      j->state = all[f];
      mega_err err = {0};
      mega_status s = mega_job_transition(j, all[t], 5000, "why", &err);
      if (allowed[f][t]) {
        assert_int_equal(s, MEGA_OK);
        assert_int_equal(j->state, all[t]);
      } else {
        assert_int_equal(s, MEGA_ERR_INVALID);
        assert_int_equal(j->state, all[f]);
        assert_non_null(strstr(err.msg, "cannot go from"));
      }
      mega_job_free(j);
    }
}

static void test_times_and_error(void **state) {
  (void)state;
  mega_job *j = new_job("j-1");
  assert_int_equal(j->created_ms, 1000);
  assert_int_equal(mega_job_transition(j, MEGA_JOB_RUNNING, 2000, NULL, NULL), MEGA_OK);
  assert_int_equal(j->started_ms, 2000);
  assert_int_equal(j->ended_ms, 0);
  assert_int_equal(mega_job_transition(j, MEGA_JOB_RESTARTING, 2500, NULL, NULL), MEGA_OK);
  assert_int_equal(mega_job_transition(j, MEGA_JOB_RUNNING, 2600, NULL, NULL), MEGA_OK);
  assert_int_equal(j->started_ms, 2000); /* the first start stays */
  assert_int_equal(mega_job_transition(j, MEGA_JOB_FAILED, 3000, "rank 1 exited with signal 9 (Killed)",
                                       NULL), MEGA_OK);
  assert_int_equal(j->ended_ms, 3000);
  assert_string_equal(j->error, "rank 1 exited with signal 9 (Killed)");
  assert_true(mega_job_state_final(j->state));
  mega_job_free(j);
}

static void test_msg_round_trip(void **state) {
  (void)state;
  mega_job *j = new_job("j-7");
  mega_job_node nodes[] = {{"n1", 0, 2}, {"n2", 2, 2}};
  assert_int_equal(mega_job_place(j, nodes, 2, 4, 1, 2, 1, NULL), MEGA_OK);
  assert_int_equal(j->dp, 2);
  assert_string_equal(mega_job_node_of(j, 3)->node_id, "n2");
  assert_null(mega_job_node_of(j, 4));
  mega_job_msg m;
  assert_int_equal(mega_job_msg_init(&m, j, NULL), MEGA_OK);
  assert_int_equal(m.job.n_placement, 2);
  assert_int_equal(m.job.placement[1]->n_ranks, 2);
  assert_int_equal(m.job.placement[1]->ranks[1], 3);
  mega_job *back = NULL;
  assert_int_equal(mega_job_from_msg(&m.job, &back, NULL), MEGA_OK);
  mega_job_msg_free(&m);
  assert_string_equal(back->id, "j-7");
  assert_string_equal(back->name, "tiny");
  assert_int_equal(back->nargs, 4);
  assert_string_equal(back->args[3], "3");
  assert_int_equal(back->nnodes_min, 2);
  assert_int_equal(back->world, 4);
  assert_int_equal(back->pp, 2);
  assert_int_equal(back->nplaced, 2);
  assert_int_equal(back->placement[1].first_rank, 2);
  assert_string_equal(back->coordinator, "n1");
  mega_job_free(back);
  mega_job_free(j);
}

static void append_rec(mega_journal *jn, uint8_t *buf, size_t len) {
  assert_int_equal(mega_journal_append(jn, buf, len, NULL), MEGA_OK);
  free(buf);
}

static void journal_job(mega_journal *jn, const mega_job *j) {
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_job(j, &buf, &len, NULL), MEGA_OK);
  append_rec(jn, buf, len);
}

static void journal_event(mega_journal *jn, const char *id, Mega__V1__JobEventKind kind,
                          const char *msg) {
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = kind;
  ev.message = (char *)msg;
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_event(id, &ev, &buf, &len, NULL), MEGA_OK);
  append_rec(jn, buf, len);
}

static int apply(void *ctx, const uint8_t *rec, size_t len) {
  return mega_jobs_apply(ctx, rec, len, NULL) != MEGA_OK;
}


static void test_journal_replay(void **state) {
  (void)state;
  char dir[] = "/tmp/mega-jobs-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/journal", dir);

  mega_journal *jn;
  assert_int_equal(mega_journal_open(path, &jn, NULL), MEGA_OK);
  /* j-1 runs to the end; j-2 is still running when "the daemon dies";
   * j-3 waits. */
  mega_job *a = new_job("j-1"), *b = new_job("j-2"), *c = new_job("j-3");
  journal_job(jn, a);
  journal_event(jn, "j-1", MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED, "submitted");
  mega_job_node nodes[] = {{"n1", 0, 1}, {"n2", 1, 1}};
  assert_int_equal(mega_job_place(a, nodes, 2, 2, 1, 2, 1, NULL), MEGA_OK);
  assert_int_equal(mega_job_transition(a, MEGA_JOB_RUNNING, 2000, NULL, NULL), MEGA_OK);
  journal_job(jn, a);
  journal_job(jn, b);
  assert_int_equal(mega_job_transition(b, MEGA_JOB_RUNNING, 2100, NULL, NULL), MEGA_OK);
  journal_job(jn, b);
  journal_job(jn, c);
  Mega__V1__StepMetrics step = MEGA__V1__STEP_METRICS__INIT;
  step.iteration = 3;
  step.loss = 4.25;
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_step("j-1", &step, &buf, &len, NULL), MEGA_OK);
  append_rec(jn, buf, len);
  a->last_iteration = 3;
  a->ckpt_iteration = 3;
  a->ckpt_path = strdup("/ckpt/iter_0000003");
  assert_int_equal(mega_job_transition(a, MEGA_JOB_SUCCEEDED, 3000, NULL, NULL), MEGA_OK);
  journal_job(jn, a);
  journal_event(jn, "j-1", MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED, "done");
  journal_event(jn, "j-404", MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, "of no known job");
  mega_journal_close(jn);

  mega_jobs t;
  mega_jobs_init(&t);
  assert_int_equal(mega_journal_open(path, &jn, NULL), MEGA_OK);
  mega_journal_report rep = {.torn_bytes = 99};
  assert_int_equal(mega_journal_replay(jn, apply, &t, &rep, NULL), MEGA_OK);
  assert_int_equal(rep.torn_bytes, 0);
  mega_journal_close(jn);

  assert_int_equal(t.n, 3);
  mega_job *ra = mega_jobs_table_find(&t, "j-1");
  assert_non_null(ra);
  assert_int_equal(ra->state, MEGA_JOB_SUCCEEDED);
  assert_int_equal(ra->started_ms, 2000);
  assert_int_equal(ra->ended_ms, 3000);
  assert_int_equal(ra->last_iteration, 3);
  assert_int_equal(ra->ckpt_iteration, 3);
  assert_string_equal(ra->ckpt_path, "/ckpt/iter_0000003");
  assert_int_equal(ra->nplaced, 2);
  assert_string_equal(ra->placement[1].node_id, "n2");
  /* history: submitted, step 3, done (in journal order) */
  assert_int_equal(ra->hist.len, 3);
  assert_int_equal(mega_job_hist_at(&ra->hist, 0)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED);
  assert_int_equal(mega_job_hist_at(&ra->hist, 1)->step->iteration, 3);
  assert_string_equal(mega_job_hist_at(&ra->hist, 2)->event->message, "done");
  assert_non_null(ra->hist.last_step);
  assert_true(ra->hist.last_step->loss == 4.25);
  /* every event, apart from the watch history's ring */
  assert_int_equal(ra->hist.nevents, 2);
  assert_string_equal(ra->hist.events[1]->message, "done");
  /* records of a megad that did not number events are numbered as they come */
  assert_int_equal(ra->hist.events[1]->number, 2);
  assert_int_equal(mega_job_hist_events_left_out(&ra->hist), 0);
  /* the running job replays as it was: the coordinator decides what follows */
  assert_int_equal(mega_jobs_table_find(&t, "j-2")->state, MEGA_JOB_RUNNING);
  assert_int_equal(mega_jobs_table_find(&t, "j-3")->state, MEGA_JOB_PENDING);

  /* ids continue after the replayed ones */
  char id[32];
  mega_jobs_next_id(&t, "n1", id, sizeof id);
  assert_string_equal(id, "j-4-n1");

  /* garbage is refused */
  mega_err err = {0};
  const uint8_t junk[] = {0xff, 0xff, 0xff};
  assert_int_equal(mega_jobs_apply(&t, junk, sizeof junk, &err), MEGA_ERR_INVALID);

  mega_jobs_free(&t);
  mega_job_free(a);
  mega_job_free(b);
  mega_job_free(c);
  unlink(path);
  rmdir(dir);
}

static void push_step(mega_job *j, uint32_t attempt, uint64_t iteration) {
  Mega__V1__StepMetrics s = MEGA__V1__STEP_METRICS__INIT;
  s.attempt = attempt;
  s.iteration = iteration;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = &s;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

static void test_history_bound(void **state) {
  (void)state;
  mega_job *j = new_job("j-1");
  assert_int_equal(j->hist.cap, 0); /* a job that never ran holds no ring */
  for (uint64_t i = 1; i <= MEGA_JOB_HISTORY + 10; i++) push_step(j, 0, i);
  assert_int_equal(j->hist.len, MEGA_JOB_HISTORY);
  assert_int_equal(mega_job_hist_at(&j->hist, 0)->step->iteration, 11);
  assert_int_equal(mega_job_hist_at(&j->hist, MEGA_JOB_HISTORY - 1)->step->iteration,
                   MEGA_JOB_HISTORY + 10);
  assert_null(mega_job_hist_at(&j->hist, MEGA_JOB_HISTORY));
  assert_int_equal(j->hist.last_step->iteration, MEGA_JOB_HISTORY + 10);
  /* what the ring let go is counted, for a replay's gap marker */
  assert_int_equal(j->hist.lost_steps, 10);
  assert_int_equal(j->hist.lost_first, 1);
  assert_int_equal(j->hist.lost_last, 10);
  mega_job_free(j);
}
static void push_event(mega_job *j, uint32_t attempt, Mega__V1__JobEventKind kind) {
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.attempt = attempt;
  ev.kind = kind;
  ev.message = "";
  ev.node_id = "";
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

/* "a3" a step of attempt a, iteration 3; "E1" an event of attempt 1; "F" the final state. */
static void assert_order(const mega_job *j, const char *want) {
  char got[256] = "", one[32];
  for (size_t i = 0; i < j->hist.len; i++) {
    const Mega__V1__WatchJobResponse *it = mega_job_hist_at(&j->hist, i);
    if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP)
      snprintf(one, sizeof one, "%s%c%llu", i ? " " : "", 'a' + (int)it->step->attempt,
               (unsigned long long)it->step->iteration);
    else if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT)
      snprintf(one, sizeof one, "%sE%u", i ? " " : "", it->event->attempt);
    else
      snprintf(one, sizeof one, "%sF", i ? " " : "");
    strcat(got, one);
  }
  assert_string_equal(got, want);
}

/* A long job's steps never push its events out of the replay: only the
 * oldest steps go, counted, and the gap marker belongs before the first
 * step kept. Only a history of nothing but events loses events. */
static void test_history_keeps_events(void **state) {
  (void)state;
  mega_job *j = new_job("j-1");
  push_event(j, 0, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED);
  push_event(j, 0, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED);
  for (uint64_t i = 1; i <= 600; i++) push_step(j, 0, i);
  push_event(j, 0, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST);
  push_event(j, 1, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING);
  for (uint64_t i = 501; i <= 3000; i++) push_step(j, 1, i);
  assert_int_equal(j->hist.len, MEGA_JOB_HISTORY);
  /* the four events, in order, then the newest steps */
  int events = 0;
  for (size_t i = 0; i < j->hist.len; i++)
    events += mega_job_hist_at(&j->hist, i)->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  assert_int_equal(events, 4);
  assert_int_equal(mega_job_hist_at(&j->hist, 0)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED);
  assert_int_equal(mega_job_hist_at(&j->hist, 1)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED);
  assert_int_equal(mega_job_hist_at(&j->hist, 2)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST);
  assert_int_equal(mega_job_hist_at(&j->hist, 3)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING);
  assert_int_equal(mega_job_hist_at(&j->hist, 4)->step->iteration, 3000 - (MEGA_JOB_HISTORY - 5));
  assert_int_equal(mega_job_hist_at(&j->hist, MEGA_JOB_HISTORY - 1)->step->iteration, 3000);
  assert_int_equal(j->hist.lost_steps, 600 + 2500 - (MEGA_JOB_HISTORY - 4));
  assert_int_equal(j->hist.lost_first, 1);
  assert_int_equal(j->hist.lost_last, 3000 - (MEGA_JOB_HISTORY - 4)); /* attempt 1's, the greatest */
  assert_int_equal(j->hist.lost_other, 0);
  assert_int_equal(mega_job_hist_gap_at(&j->hist), 4);
  /* the end goes in after the steps; a step older than every step kept is let go */
  push_event(j, 1, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED);
  push_step(j, 1, 502);
  assert_int_equal(j->hist.lost_other, 0);
  assert_int_equal(mega_job_hist_at(&j->hist, MEGA_JOB_HISTORY - 1)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED);
  assert_int_equal(mega_job_hist_at(&j->hist, 3)->event->kind,
                   MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING);
  assert_int_equal(j->hist.lost_steps, 600 + 2500 - (MEGA_JOB_HISTORY - 4) + 2);
  mega_job_free(j);

  /* nothing but events: the oldest event goes, and a step finds no room */
  j = new_job("j-2");
  for (int i = 0; i < MEGA_JOB_HISTORY + 3; i++)
    push_event(j, (uint32_t)i, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING);
  assert_int_equal(j->hist.len, MEGA_JOB_HISTORY);
  assert_int_equal(j->hist.lost_other, 3);
  assert_int_equal(mega_job_hist_at(&j->hist, 0)->event->attempt, 3);
  push_step(j, MEGA_JOB_HISTORY + 3, 1);
  assert_int_equal(j->hist.lost_steps, 1);
  assert_int_equal(j->hist.lost_other, 3);
  assert_int_equal(mega_job_hist_gap_at(&j->hist), 0);
  /* GetJob's events: the first and the newest, the rest counted */
  assert_int_equal(j->hist.nevents, MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST);
  assert_int_equal(mega_job_hist_events_left_out(&j->hist),
                   MEGA_JOB_HISTORY + 3 - MEGA_JOB_EVENTS_FIRST - MEGA_JOB_EVENTS_LAST);
  mega_job_free(j);
}

/* An event numbered as megad_job_event numbers them: the next number. */
static void push_numbered(mega_job *j, uint64_t number, const char *msg) {
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO;
  ev.message = (char *)msg;
  ev.number = number;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

/* Applies job j's record and then each of its events as journal records
 * into t (a replay, or etcd's keys read by a new coordinator). */
static void apply_events(mega_jobs *t, const mega_job *j) {
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_jrec_job(j, &buf, &len, NULL), MEGA_OK);
  assert_int_equal(mega_jobs_apply(t, buf, len, NULL), MEGA_OK);
  free(buf);
  for (size_t i = 0; i < j->hist.nevents; i++) {
    assert_int_equal(mega_jrec_event(j->id, j->hist.events[i], &buf, &len, NULL), MEGA_OK);
    assert_int_equal(mega_jobs_apply(t, buf, len, NULL), MEGA_OK);
    free(buf);
  }
}

/* A job with thousands of events (restarts, rescales) keeps its first and
 * its newest for GetJob, and counts those between: its memory and GetJob's
 * answer stay bounded. What it kept, replayed (a compacted journal, etcd's
 * keys), is the same history with the same count. */
static void test_events_bound(void **state) {
  (void)state;
  const uint64_t n = 3000, keep = MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST;
  mega_job *j = new_job("j-1");
  char msg[32];
  for (uint64_t i = 1; i <= n; i++) {
    if (i % 7 == 0) push_step(j, (uint32_t)(i / 100), i);
    const Mega__V1__JobEvent *victim = mega_job_hist_event_victim(&j->hist);
    /* what goes is the oldest of the newest, once they are full */
    if (i <= keep) assert_null(victim);
    else assert_int_equal(victim->number, i - MEGA_JOB_EVENTS_LAST);
    snprintf(msg, sizeof msg, "event %llu", (unsigned long long)i);
    push_numbered(j, j->hist.events_total + 1, msg);
  }
  assert_int_equal(j->hist.nevents, keep);
  assert_true(j->hist.events_cap <= keep); /* memory too */
  assert_true(j->hist.len <= MEGA_JOB_HISTORY);
  assert_int_equal(j->hist.events_total, n);
  assert_int_equal(mega_job_hist_events_left_out(&j->hist), n - keep);
  for (size_t i = 0; i < MEGA_JOB_EVENTS_FIRST; i++) assert_int_equal(j->hist.events[i]->number, i + 1);
  for (size_t i = MEGA_JOB_EVENTS_FIRST; i < keep; i++)
    assert_int_equal(j->hist.events[i]->number, n - keep + i + 1);
  assert_string_equal(j->hist.events[0]->message, "event 1");
  assert_string_equal(j->hist.events[keep - 1]->message, "event 3000");

  /* delivered twice (a retried etcd write seen by a watch): nothing changes */
  push_numbered(j, n - 5, "again");
  assert_int_equal(j->hist.events_total, n);
  assert_string_equal(j->hist.events[keep - 6]->message, "event 2995");
  /* an event without a number (an older megad's record) takes the next */
  push_numbered(j, 0, "unnumbered");
  assert_int_equal(j->hist.events[keep - 1]->number, n + 1);
  assert_int_equal(mega_job_hist_events_left_out(&j->hist), n + 1 - keep);

  /* replayed from what was kept: the same events, numbers and count */
  mega_jobs t;
  mega_jobs_init(&t);
  apply_events(&t, j);
  mega_job *r = mega_jobs_table_find(&t, "j-1");
  assert_non_null(r);
  assert_int_equal(r->hist.nevents, keep);
  assert_int_equal(r->hist.events_total, n + 1);
  assert_int_equal(mega_job_hist_events_left_out(&r->hist), n + 1 - keep);
  /* WatchJob's replay of it says so too: those it never had are counted
   * with what its ring let go (none here), so its gap item names them */
  assert_int_equal(r->hist.lost_other, n + 1 - keep);
  assert_int_equal(r->hist.lost_steps, 0);
  for (size_t i = 0; i < keep; i++) {
    assert_int_equal(r->hist.events[i]->number, j->hist.events[i]->number);
    assert_string_equal(r->hist.events[i]->message, j->hist.events[i]->message);
  }
  /* and goes on numbering where the job was */
  push_numbered(r, r->hist.events_total + 1, "after a takeover");
  assert_int_equal(r->hist.events[keep - 1]->number, n + 2);
  assert_int_equal(r->hist.events[MEGA_JOB_EVENTS_FIRST - 1]->number, MEGA_JOB_EVENTS_FIRST);
  mega_jobs_free(&t);
  mega_job_free(j);
}

/* Steps sent again after a takeover come after the job moved on: they go
 * into the history in their attempt's order, before the next attempt and
 * before the end, and never stand as the job's last step. */
static void test_history_late_steps(void **state) {
  (void)state;
  mega_job *j = new_job("j-1");
  push_step(j, 0, 1);
  push_step(j, 0, 2);
  push_event(j, 0, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST);
  push_event(j, 1, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING);
  push_step(j, 1, 4);
  push_step(j, 1, 5);
  push_event(j, 1, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED);
  Mega__V1__Job job = MEGA__V1__JOB__INIT;
  job.attempt = 1;
  Mega__V1__WatchJobResponse fin = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  fin.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
  fin.final_state = &job;
  assert_int_equal(mega_job_hist_push(&j->hist, &fin, NULL), MEGA_OK);
  assert_order(j, "a1 a2 E0 E1 b4 b5 E1 F");
  push_step(j, 0, 3); /* after its attempt's failure: it came after it */
  assert_order(j, "a1 a2 E0 a3 E1 b4 b5 E1 F");
  push_step(j, 1, 3);
  assert_order(j, "a1 a2 E0 a3 E1 b3 b4 b5 E1 F");
  assert_int_equal(j->hist.last_step->attempt, 1);
  assert_int_equal(j->hist.last_step->iteration, 5);
  push_step(j, 1, 6); /* the attempt's own, after its end */
  assert_order(j, "a1 a2 E0 a3 E1 b3 b4 b5 b6 E1 F");
  assert_int_equal(j->hist.last_step->iteration, 6);
  assert_int_equal(j->hist.curve.n, 7); /* the curve keeps them as they came */
  mega_job_free(j);

  /* a full ring lets the oldest go: a late step older than all it keeps is
   * itself let go, and counted */
  j = new_job("j-2");
  for (uint64_t i = 1; i <= MEGA_JOB_HISTORY; i++) push_step(j, 1, 100 + i);
  push_step(j, 0, 7);
  assert_int_equal(j->hist.len, MEGA_JOB_HISTORY);
  assert_int_equal(mega_job_hist_at(&j->hist, 0)->step->iteration, 101);
  assert_int_equal(j->hist.lost_steps, 1);
  assert_int_equal(j->hist.lost_first, 7);
  assert_int_equal(j->hist.lost_last, 7);
  push_step(j, 1, 150); /* between two kept: the oldest goes */
  assert_int_equal(mega_job_hist_at(&j->hist, 0)->step->iteration, 102);
  assert_int_equal(mega_job_hist_at(&j->hist, 48)->step->iteration, 150);
  assert_int_equal(mega_job_hist_at(&j->hist, 49)->step->iteration, 150);
  assert_int_equal(mega_job_hist_at(&j->hist, 50)->step->iteration, 151);
  assert_int_equal(mega_job_hist_at(&j->hist, MEGA_JOB_HISTORY - 1)->step->iteration,
                   100 + MEGA_JOB_HISTORY);
  assert_int_equal(j->hist.lost_steps, 2);
  assert_int_equal(j->hist.lost_first, 7);
  assert_int_equal(j->hist.lost_last, 101);
  mega_job_free(j);
}

/* A later start of megad is a larger incarnation: peers drop "stale news
 * of an older incarnation" on that order (an address from a view included),
 * so it must hold across restarts (pids included, which may go down). */
static void test_incarnations_increase(void **state) {
  (void)state;
  uint64_t a = megad_new_incarnation();
  usleep(2000);
  uint64_t b = megad_new_incarnation();
  assert_true(b > a);
  assert_int_equal(a & 0xfffff, (uint64_t)getpid() & 0xfffff);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transitions),
      cmocka_unit_test(test_times_and_error),
      cmocka_unit_test(test_msg_round_trip),
      cmocka_unit_test(test_journal_replay),
      cmocka_unit_test(test_history_bound),
      cmocka_unit_test(test_history_late_steps),
      cmocka_unit_test(test_history_keeps_events),
      cmocka_unit_test(test_events_bound),
      cmocka_unit_test(test_incarnations_increase),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
