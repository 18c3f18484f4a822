/* No single point of failure, end to end: megad on a real etcd (loopback),
 * real workers, real kills. The job's coordinator is killed for good, or
 * frozen and let go again after the takeover; another node takes the job
 * over from etcd, and the job finishes on the uninterrupted loss curve
 * (rescaled to the survivors when its --nnodes range allows).
 * Skipped (77) where etcd is not installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd_fixture.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k
#define ITERS 40

static etcd_fx fx;

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Three megad on the etcd cluster, one slot each, no --peers. */
static void start_nodes(hd *n, const char *prefix) {
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "%s%d", prefix, i + 1);
    assert_true(hd_start(&n[i], name, 1, NULL, NULL, extra));
  }
  assert_true(hd_wait_alive(&n[1], 3, 15000));
}

/* The job: DP over `lo` to `hi` nodes (1 rank each), checkpoints every 5
 * iterations. */
static void job_spec(Mega__V1__JobSpec *spec, const char *dir, const char *ckpt, uint32_t lo,
                     uint32_t hi) {
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12",
                         "--save", ckpt, "--save-interval", "5", NULL};
  hd_tiny_spec(spec, dir, ITERS, extra);
  spec->nproc_per_node = 1;
  spec->nnodes_min = lo;
  spec->nnodes_max = hi;
  spec->max_restarts = 3;
}

/* Losses of the same job run without interruption (1 rank, the same
 * global batch). */
static void reference(hd *d, hd_watch *ref) {
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, ITERS, extra);
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch_job(d, id, true, 120000, ref);
  assert_true(hd_succeeded(d, ref));
}

/* Waits until d sees want nodes with every slot free (a job that just
 * ended frees its node's slots in d's view a moment later). */
static bool wait_idle(hd *d, int want, int ms) {
  for (int t = 0; t < ms; t += 100) {
    Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
    int idle = 0;
    for (size_t i = 0; r && i < r->n_nodes; i++)
      idle += r->nodes[i]->slots_used == 0;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    if (idle >= want) return true;
    usleep(100000);
  }
  return false;
}

/* Every iteration either watch saw (the later one wins) within rtol of the
 * uninterrupted run. */
static void same_losses(const hd_watch *before, const hd_watch *after, const hd_watch *ref) {
  for (int k = 1; k <= ITERS; k++) {
    const hd_watch *w = after->seen[k] ? after : before;
    assert_true(w->seen[k]);
    double a = w->loss[k], b = ref->loss[k];
    if (fabs(a - b) > 2e-5 * fabs(b)) {
      fprintf(stderr, "iteration %d: loss %.9g (attempt %u), uninterrupted %.9g\n", k, a,
              w->attempt[k], b);
      fail();
    }
  }
}

/* Polls node n[asked] until job_id's coordinator is no longer `old`;
 * returns the new coordinator's index in n (of nn; -1: not in time). */
static int wait_takeover_of(hd *n, int nn, int asked, const char *job_id, const char *old,
                            int ms) {
  for (int t = 0; t < ms; t += 200) {
    Mega__V1__Job *j = hd_get_job(&n[asked], job_id, NULL);
    int who = -1;
    for (int i = 0; j && i < nn; i++)
      if (strcmp(j->coordinator_node_id, old) && !strcmp(j->coordinator_node_id, n[i].name))
        who = i;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    if (who >= 0) return who;
    usleep(200000);
  }
  return -1;
}

static int wait_takeover(hd *n, int asked, const char *job_id, const char *old, int ms) {
  return wait_takeover_of(n, 3, asked, job_id, old, ms);
}

/* ---- kill -9 the coordinator's node for good ---- */

typedef struct killer {
  hd *victim;
  uint64_t at;     /* kill at this iteration or later, */
  uint32_t world;  /* once the job runs on this many ranks */
  uint64_t iteration;
  int64_t when_ms;
} killer;

static void kill_coordinator(void *arg, const Mega__V1__WatchJobResponse *it) {
  killer *k = arg;
  if (k->when_ms || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < k->at || it->step->n_ranks != k->world)
    return;
  k->iteration = it->step->iteration;
  k->when_ms = unix_ms();
  hd_kill(k->victim); /* megad and (PR_SET_PDEATHSIG) its workers */
}

typedef struct first_step {
  uint32_t after_attempt;
  int64_t when_ms;
} first_step;

static void note_first_step(void *arg, const Mega__V1__WatchJobResponse *it) {
  first_step *f = arg;
  if (!f->when_ms && it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP &&
      it->step->attempt > f->after_attempt)
    f->when_ms = unix_ms();
}

static void test_coordinator_killed_is_taken_over(void **state) {
  (void)state;
  hd n[3];
  start_nodes(n, "t");
  hd_watch ref;
  reference(&n[1], &ref);
  assert_true(wait_idle(&n[0], 3, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  Mega__V1__JobSpec spec;
  job_spec(&spec, n[0].dir, ckpt, 2, 3); /* DP 3, then DP 2 on the survivors */
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);

  /* watched at t1 (the coordinator) until it dies at iteration 12 or later,
   * on 3 nodes (a node still counted busy by the reference job's end may
   * join at a checkpoint) */
  killer k = {.victim = &n[0], .at = 12, .world = 3};
  hd_watch before;
  hd_watch_job_cb(&n[0], id, true, 120000, &before, kill_coordinator, &k);
  assert_true(k.when_ms > 0);
  uint32_t old_attempt = before.attempt[k.iteration];

  /* any survivor knows the job, and one of them takes it over */
  int who = wait_takeover(n, 1, id, n[0].name, 20000);
  if (who < 0) {
    hd_dump_log(&n[1]);
    hd_dump_log(&n[2]);
  }
  assert_true(who == 1 || who == 2);
  int64_t took_ms = hd_event_ms(&n[who], id, KIND(RESTARTING), 0, "took the job over");
  assert_true(took_ms > 0);
  first_step f = {.after_attempt = old_attempt};
  hd_watch after;
  hd_watch_job_cb(&n[3 - who], id, true, 120000, &after, note_first_step, &f);
  assert_true(hd_succeeded(&n[who], &after));
  assert_int_equal(after.final->world_size, 2);
  assert_true(after.final->attempt > old_attempt);
  assert_non_null(strstr(after.events_text, "rescaled from DP 3 to DP 2"));
  assert_int_equal(after.last_iteration, ITERS);
  same_losses(&before, &after, &ref);
  fprintf(stderr, "coordinator kill -9: taken over by %s within %.3f s; first iteration of the "
                  "new attempt %.3f s after the kill\n", n[who].name,
          (double)(took_ms - k.when_ms) / 1000, (double)(f.when_ms - k.when_ms) / 1000);
  assert_true(took_ms - k.when_ms < 15000);
  /* the whole history, from either survivor: submitted at t1, taken over */
  for (int i = 1; i < 3; i++) {
    assert_true(hd_event_ms(&n[i], id, KIND(SUBMITTED), 0, NULL) > 0);
    assert_true(
        hd_event_ms(&n[i], id, KIND(RESTARTING), 0, "took the job over from node t1") > 0);
  }
  hd_watch_free(&before);
  hd_watch_free(&after);
  hd_watch_free(&ref);
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- recovery from replicas through a takeover: PP 2 x DP 2 on four
 * nodes, --save but no checkpoint before the end; kill -9 the coordinator's
 * node. The node that takes the job over asks the others what their ranks
 * kept and goes on at DP 1 from it: at most one iteration redone, the
 * uninterrupted run's losses ---- */

static void test_replicas_after_coordinator_kill(void **state) {
  (void)state;
  hd n[4];
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "q%d", i + 1);
    assert_true(hd_start(&n[i], name, 1, NULL, NULL, extra));
  }
  assert_true(hd_wait_alive(&n[1], 4, 15000));
  hd_watch ref;
  reference(&n[1], &ref);
  assert_true(wait_idle(&n[0], 4, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *job_extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12",
                             "--pipeline-model-parallel-size", "2", "--save", ckpt,
                             "--save-interval", "1000", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, ITERS, job_extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = 2;
  spec.nnodes_max = 4;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  killer k = {.victim = &n[0], .at = 12, .world = 4};
  hd_watch before;
  hd_watch_job_cb(&n[0], id, true, 120000, &before, kill_coordinator, &k);
  assert_true(k.when_ms > 0);
  uint32_t old_attempt = before.attempt[k.iteration];
  int who = wait_takeover_of(n, 4, 1, id, n[0].name, 20000);
  if (who < 0)
    for (int i = 1; i < 4; i++) hd_dump_log(&n[i]);
  assert_true(who >= 1 && who <= 3);
  int64_t took_ms = hd_event_ms(&n[who], id, KIND(RESTARTING), 0, "took the job over");
  first_step f = {.after_attempt = old_attempt};
  hd_watch after;
  int ask = who == 1 ? 2 : 1;
  hd_watch_job_cb(&n[ask], id, true, 120000, &after, note_first_step, &f);
  assert_true(hd_succeeded(&n[who], &after));
  if (!strstr(after.events_text, "recovered iteration")) fprintf(stderr, "%s", after.events_text);
  assert_non_null(strstr(after.events_text, "asking its nodes what their ranks kept"));
  assert_non_null(strstr(after.events_text, "restarting from the replicas' state at iteration"));
  assert_non_null(strstr(after.events_text, "rescaled from DP 2 to DP 1"));
  assert_non_null(strstr(after.events_text, "recovered iteration"));
  assert_int_equal(after.final->world_size, 2);
  assert_int_equal(after.last_iteration, ITERS);
  /* at most one iteration merged before the kill is merged again */
  int redone = 0;
  for (int i = 1; i <= ITERS; i++) redone += before.seen[i] && after.seen[i];
  assert_true(redone <= 1);
  same_losses(&before, &after, &ref);
  fprintf(stderr, "replicas, coordinator kill -9 (etcd): taken over by %s within %.3f s; first "
                  "iteration of the new attempt %.3f s after the kill; %d iteration(s) redone\n",
          n[who].name, (double)(took_ms - k.when_ms) / 1000,
          (double)(f.when_ms - k.when_ms) / 1000, redone);
  hd_watch_free(&before);
  hd_watch_free(&after);
  hd_watch_free(&ref);
  for (int i = 1; i < 4; i++) assert_true(hd_workers_gone(n[i].pid, 5000));
  for (int i = 3; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- a frozen coordinator comes back after the takeover and stands down ---- */

static void test_partitioned_coordinator_stands_down(void **state) {
  (void)state;
  hd n[3];
  start_nodes(n, "p");
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  Mega__V1__JobSpec spec;
  job_spec(&spec, n[0].dir, ckpt, 2, 2);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_checkpoint(&n[0], id, 5, 60000) >= 5);

  /* p1 freezes (megad only: its workers stop on their own when its pings
   * stop); its lease runs out and another node takes the job over */
  kill(n[0].pid, SIGSTOP);
  int64_t stopped_ms = unix_ms();
  int who = wait_takeover(n, 1, id, n[0].name, 20000);
  if (who < 0) hd_dump_log(&n[1]);
  assert_true(who == 1 || who == 2);
  int64_t took_ms = hd_event_ms(&n[who], id, KIND(RESTARTING), 0, "took the job over");
  assert_true(took_ms > 0);
  fprintf(stderr, "frozen coordinator: taken over by %s %.3f s after SIGSTOP\n", n[who].name,
          (double)(took_ms - stopped_ms) / 1000);

  /* what a stale coordinator would send is refused: a launch and a
   * checkpoint go-ahead under an older fence */
  Mega__V1__LaunchRanksRequest lr = MEGA__V1__LAUNCH_RANKS_REQUEST__INIT;
  lr.job_id = id;
  lr.attempt = 99;
  lr.coordinator_fence = 1;
  ProtobufCMessage *resp = NULL;
  mega_err e = {0};
  assert_int_not_equal(mega_rpc_unary(n[1].ch, &mega_peer_launch_ranks, &lr.base, 5000, &resp, &e),
                       MEGA_OK);
  assert_non_null(strstr(e.msg, "from a coordinator that lost it"));
  Mega__V1__CommitCheckpointRequest cr = MEGA__V1__COMMIT_CHECKPOINT_REQUEST__INIT;
  cr.job_id = id;
  cr.coordinator_fence = 1;
  assert_int_not_equal(mega_rpc_unary(n[2].ch, &mega_peer_commit_checkpoint, &cr.base, 5000,
                                      &resp, &e), MEGA_OK);
  assert_non_null(strstr(e.msg, "from a coordinator that lost it"));

  /* p1 comes back: it stands down, its stale workers are gone, and it
   * rejoins as a plain node that sees the job under its new coordinator */
  kill(n[0].pid, SIGCONT);
  for (int t = 0; t < 100 && !hd_log_has(&n[0], "standing down"); t++) usleep(100000);
  if (!hd_log_has(&n[0], "standing down")) hd_dump_log(&n[0]);
  assert_true(hd_log_has(&n[0], "standing down"));
  assert_true(hd_wait_alive(&n[who], 3, 15000));
  hd_watch w;
  hd_watch_job(&n[0], id, true, 120000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  assert_string_equal(w.final->coordinator_node_id, n[who].name);
  assert_int_equal(w.last_iteration, ITERS);
  hd_watch_free(&w);
  assert_true(hd_workers_gone(n[0].pid, 10000));
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- etcd away: jobs go on, new ones are refused until it is back ---- */

static uint64_t iteration_of(hd *d, const char *id) {
  Mega__V1__Job *j = hd_get_job(d, id, NULL);
  uint64_t it = j ? j->last_iteration : 0;
  if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
  return it;
}

static void test_etcd_away_refuses_new_jobs(void **state) {
  (void)state;
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  hd d;
  assert_true(hd_start(&d, "a1", 2, NULL, NULL, extra));
  assert_true(hd_wait_alive(&d, 1, 10000));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 20000, NULL);
  spec.nproc_per_node = 1;
  char id[64], id2[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  for (int t = 0; t < 100 && iteration_of(&d, id) < 5; t++) usleep(100000);
  etcd_fx_kill(&fx, 0);
  mega_status st = MEGA_OK;
  for (int t = 0; t < 100 && st == MEGA_OK; t++) { /* refused once a keepalive is a TTL late */
    st = hd_submit(&d, &spec, id2, sizeof id2, &err);
    if (st == MEGA_OK) usleep(100000);
  }
  assert_int_not_equal(st, MEGA_OK);
  if (!strstr(err.msg, "takes no new jobs while etcd is unreachable")) { fprintf(stderr, "refused: %s\n", err.msg); hd_dump_log(&d); }
  assert_non_null(strstr(err.msg, "takes no new jobs while etcd is unreachable"));
  uint64_t it = iteration_of(&d, id);
  usleep(1500000);
  assert_true(iteration_of(&d, id) > it); /* the running job trains on */
  assert_true(etcd_fx_restart(&fx, 0));
  st = !MEGA_OK;
  for (int t = 0; t < 100 && st != MEGA_OK; t++) {
    st = hd_submit(&d, &spec, id2, sizeof id2, &err);
    if (st != MEGA_OK) usleep(100000);
  }
  assert_int_equal(st, MEGA_OK);
  Mega__V1__Job *j = hd_get_job(&d, id, NULL);
  assert_non_null(j);
  assert_int_equal(j->attempt, 0); /* the same attempt throughout */
  assert_int_equal(j->state, STATE(RUNNING));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup(&d);
}

static int setup(void **state) {
  (void)state;
  return etcd_fx_start(&fx, 1) ? 0 : -1;
}

/* The setting: three etcd members, as production runs it. */
static int setup3(void **state) {
  (void)state;
  return etcd_fx_start(&fx, 3) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  etcd_fx_stop(&fx);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  etcd_fx_require();
  const struct CMUnitTest all[] = {
      cmocka_unit_test_setup_teardown(test_coordinator_killed_is_taken_over, setup3, teardown),
      cmocka_unit_test_setup_teardown(test_replicas_after_coordinator_kill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_partitioned_coordinator_stands_down, setup, teardown),
      cmocka_unit_test_setup_teardown(test_etcd_away_refuses_new_jobs, setup, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
