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
#include <sys/wait.h>
#include <unistd.h>

#include "etcd_fixture.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k
#define ITERS 40

static etcd_fx fx;

/* Three megad on the etcd cluster, one slot each, no --peers. */
static void start_nodes(hd *n, const char *prefix) {
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "%s%d", prefix, i + 1);
    assert_true(hd_start(&n[i], name, 1, NULL, NULL, extra));
  }
  /* each node learns of the others from etcd in its own time: the one a
   * job goes to may not know the third yet when another already does */
  for (int i = 0; i < 3; i++) assert_true(hd_wait_alive(&n[i], 3, 15000));
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

/* The job reached its last iteration, and the history holds it. Not "the
 * last step item is the last iteration": a live watch gets the steps a node
 * sends again after a takeover when they arrive, which under load can be
 * after the new attempt's last one (a frozen coordinator's queued reports,
 * once it comes back); the history puts them in their attempt's place
 * (jobhist.h, test_jobs). */
static void reached_end(const hd_watch *w) {
  if (w->last_iteration != ITERS)
    fprintf(stderr, "the history's last step is iteration %llu of attempt %u (the job's: %d)\n",
            (unsigned long long)w->last_iteration,
            w->last_iteration <= HD_MAX_ITERS ? w->attempt[w->last_iteration] : 0, ITERS);
  assert_int_equal(w->final->last_iteration, ITERS);
  if (!w->seen[ITERS]) fprintf(stderr, "iteration %d is missing from the history\n", ITERS);
  assert_true(w->seen[ITERS]);
}

/* Every iteration's loss is the uninterrupted run's, in the history the
 * new coordinator tells (after: watched with replay): the iterations the
 * survivors completed while the coordinator died, or reported only to it,
 * are there too, sent again by their nodes after the takeover. */
static void same_losses(const hd_watch *after, const hd_watch *ref) {
  for (int k = 1; k <= ITERS; k++) {
    if (!after->seen[k]) fprintf(stderr, "iteration %d is missing from the history\n", k);
    assert_true(after->seen[k]);
    double a = after->loss[k], b = ref->loss[k];
    if (fabs(a - b) > 2e-5 * fabs(b)) {
      fprintf(stderr, "iteration %d: loss %.9g (attempt %u), uninterrupted %.9g\n", k, a,
              after->attempt[k], b);
      fail();
    }
  }
}

/* Every survivor's kept steps reached the new coordinator (n[who]) before
 * the new attempt's ranks recovered, so before its first step: they came a
 * retry (250 ms) later when the claim reached a node from etcd before the
 * new coordinator had adopted the job (always so on the node that took it
 * over), and a job that ended meanwhile left them out of what its
 * watchers saw ("iteration 13 is missing from the history"). */
static void resent_before_recovery(hd *n, int nn, int who) {
  int recovered = hd_log_line(&n[who], "recovered iteration");
  assert_true(recovered >= 0);
  for (int i = 1; i < nn; i++) {
    char sent[96];
    snprintf(sent, sizeof sent, "node %s sent again", n[i].name);
    int at = hd_log_line(&n[who], sent);
    if (at < 0 || at > recovered) {
      fprintf(stderr, "%s's kept steps came %s the new attempt recovered (log line %d, %d)\n",
              n[i].name, at < 0 ? "never: not before" : "after", at, recovered);
      hd_dump_log(&n[who]);
      hd_dump_log(&n[i]);
    }
    assert_true(at >= 0 && at < recovered);
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
  int sig;         /* 0 (kill -9) or SIGTERM, a graceful stop */
  uint64_t iteration;
  int64_t when_ms;
} killer;

static void stop_victim(void *arg, const Mega__V1__WatchJobResponse *it) {
  killer *k = arg;
  if (k->when_ms || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < k->at || it->step->n_ranks != k->world)
    return;
  k->iteration = it->step->iteration;
  k->when_ms = hd_unix_ms();
  if (k->sig)
    kill(k->victim->pid, k->sig);
  else
    hd_kill(k->victim); /* megad and (PR_SET_PDEATHSIG) its workers */
}

/* Watch the job at d until it ends, killing k's victim on the way; a kill
 * that never came says which steps and events the job had instead. */
static void watch_and_kill(hd *d, const char *id, hd_watch *w, killer *k) {
  hd_watch_job_cb(d, id, true, 120000, w, stop_victim, k);
  if (!k->when_ms) {
    fprintf(stderr, "no step of %u ranks at iteration %llu or later; events:\n%s", k->world,
            (unsigned long long)k->at, w->events_text);
    hd_dump_log(d);
  }
  assert_true(k->when_ms > 0);
}

/* When the new attempt merged its first step, and which attempts merged
 * each iteration: one attempt's iteration twice is a duplicate. */
typedef struct first_step {
  uint32_t after_attempt;
  int64_t when_ms;
  uint8_t merged[ITERS + 1][8]; /* [iteration][attempt % 8]: times */
  int dups, redone;             /* redone: iterations merged by two attempts */
} first_step;

static void note_first_step(void *arg, const Mega__V1__WatchJobResponse *it) {
  first_step *f = arg;
  if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) return;
  if (!f->when_ms && it->step->attempt > f->after_attempt) f->when_ms = hd_unix_ms();
  uint64_t k = it->step->iteration;
  if (k > ITERS) return;
  uint8_t *m = f->merged[k];
  int attempts = 0;
  for (int a = 0; a < 8; a++) attempts += m[a] > 0;
  if (m[it->step->attempt % 8]++) f->dups++;
  else if (attempts == 1) f->redone++;
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
  watch_and_kill(&n[0], id, &before, &k);
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
  reached_end(&after);
  same_losses(&after, &ref);
  assert_int_equal(f.dups, 0);
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
 * node, or stop its megad gracefully (SIGTERM). The node that takes the job
 * over asks the others what their ranks kept and goes on at DP 1 from it:
 * at most one iteration redone, the uninterrupted run's losses. A graceful
 * stop used to end the attempt without hold: every rank let go of its
 * state, and the job went back to its checkpoint (here: iteration 0) where
 * a kill -9 lost nothing. ---- */

static void replicas_after_coordinator(int sig, const char *prefix) {
  hd n[4];
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "%s%d", prefix, i + 1);
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
  killer k = {.victim = &n[0], .at = 12, .world = 4, .sig = sig};
  hd_watch before;
  watch_and_kill(&n[0], id, &before, &k);
  uint32_t old_attempt = before.attempt[k.iteration];
  if (sig) assert_int_equal(hd_stop(&n[0]), 0);
  int who = wait_takeover_of(n, 4, 1, id, n[0].name, 20000);
  if (who < 0)
    for (int i = 1; i < 4; i++) hd_dump_log(&n[i]);
  assert_true(who >= 1 && who <= 3);
  int64_t took_ms = hd_event_ms(&n[who], id, KIND(RESTARTING), 0, "took the job over");
  first_step f = {.after_attempt = old_attempt};
  hd_watch after;
  int ask = who == 1 ? 2 : 1;
  hd_watch_job_cb(&n[ask], id, true, 120000, &after, note_first_step, &f);
  if (!strstr(after.events_text, "recovered iteration")) {
    fprintf(stderr, "%s", after.events_text);
    for (int i = 1; i < 4; i++) hd_dump_log(&n[i]);
  }
  assert_true(hd_succeeded(&n[who], &after));
  if (!sig) {
    assert_non_null(strstr(after.events_text, "asking its nodes what their ranks kept"));
    assert_non_null(strstr(after.events_text, "rescaled from DP 2 to DP 1"));
    assert_int_equal(after.final->world_size, 2);
  }
  assert_non_null(strstr(after.events_text, "restarting from the replicas' state at iteration"));
  assert_non_null(strstr(after.events_text, "recovered iteration"));
  assert_null(strstr(after.events_text, "no rank kept its state"));
  reached_end(&after);
  /* at most one iteration merged before the kill is merged again, and
   * none twice by one attempt */
  assert_true(f.redone <= 1);
  assert_int_equal(f.dups, 0);
  resent_before_recovery(n, 4, who);
  same_losses(&after, &ref);
  /* a SIGTERM leaves the job restarting, whose takeover is an INFO event,
   * not the RESTARTING one looked for: no takeover time to print then */
  char took[48] = "";
  if (took_ms > 0) snprintf(took, sizeof took, " within %.3f s", (double)(took_ms - k.when_ms) / 1000);
  fprintf(stderr, "replicas, coordinator %s (etcd): taken over by %s%s; first "
                  "iteration of the new attempt %.3f s after it; %d iteration(s) redone\n",
          sig ? "SIGTERM" : "kill -9", n[who].name, took,
          (double)(f.when_ms - k.when_ms) / 1000, f.redone);
  hd_watch_free(&before);
  hd_watch_free(&after);
  hd_watch_free(&ref);
  for (int i = 1; i < 4; i++) assert_true(hd_node_workers_gone(&n[i], 5000));
  for (int i = 3; i >= 0; i--) hd_cleanup(&n[i]);
}

static void test_replicas_after_coordinator_kill(void **state) {
  (void)state;
  replicas_after_coordinator(0, "q");
}

static void test_replicas_after_coordinator_sigterm(void **state) {
  (void)state;
  replicas_after_coordinator(SIGTERM, "s");
}


/* ---- a node that does not coordinate the job stopped gracefully ---- */

/* Its ranks' ends reached the coordinator before its LEFT record did, as
 * rank failures: an elastic job without --max-restarts failed. */
static void test_stopped_node_is_a_lost_node(void **state) {
  (void)state;
  hd n[3];
  start_nodes(n, "l");
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12", NULL};
  Mega__V1__JobSpec spec;
  /* 3 x ITERS: the stop comes when the watch shows iteration 12 of three
   * ranks, and a loaded watch must not lag the whole job */
  hd_tiny_spec(&spec, n[0].dir, 3 * ITERS, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = 2;
  spec.nnodes_max = 3;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  killer k = {.victim = &n[2], .at = 12, .world = 3, .sig = SIGTERM};
  hd_watch w;
  hd_watch_job_cb(&n[0], id, true, 120000, &w, stop_victim, &k);
  if (!k.when_ms || !strstr(w.events_text, "recovered iteration") || w.redone)
    fprintf(stderr, "stopped at %lld ms (iteration %llu), %d redone; events:\n%s",
            (long long)k.when_ms, (unsigned long long)k.iteration, w.redone, w.events_text);
  assert_true(k.when_ms > 0);
  assert_true(hd_succeeded(&n[0], &w));
  assert_int_equal(hd_stop(&n[2]), 0);
  assert_int_equal(w.final->restarts, 0);
  assert_int_equal(w.final->dp, 2);
  assert_non_null(strstr(w.events_text, "node l3 left the cluster"));
  assert_non_null(strstr(w.events_text, "recovered iteration"));
  assert_int_equal(w.redone, 0);
  hd_watch_free(&w);
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
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
  int64_t stopped_ms = hd_unix_ms();
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
  assert_true(hd_wait_log(&n[0], "standing down", 10000));
  assert_true(hd_wait_alive(&n[who], 3, 15000));
  hd_watch w;
  hd_watch_job(&n[0], id, true, 120000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  assert_string_equal(w.final->coordinator_node_id, n[who].name);
  reached_end(&w);
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&n[0], 10000));
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- an elastic job started small because a node was busy grows once its
 * slots free up (etcd mode: the load comes from the nodes' records) ---- */

typedef struct freer {
  hd *d;
  const char *job_id;
  bool done;
} freer;

/* Cancels the busy node's job at the elastic job's third iteration. */
static void free_busy_node(void *arg, const Mega__V1__WatchJobResponse *it) {
  freer *f = arg;
  if (f->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < 3)
    return;
  f->done = true;
  mega_err err = {0};
  if (hd_cancel(f->d, f->job_id, NULL, &err) != MEGA_OK)
    fprintf(stderr, "cancelling the busy job: %s\n", err.msg);
}

static void test_grows_when_slots_free_up(void **state) {
  (void)state;
  hd n[3];
  start_nodes(n, "b");
  Mega__V1__JobSpec busy;
  hd_tiny_spec(&busy, n[2].dir, 1000000, NULL); /* until cancelled */
  busy.nproc_per_node = 1;
  char busy_id[64], id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[2], &busy, busy_id, sizeof busy_id, &err), MEGA_OK);
  assert_true(hd_wait_workers(&n[2], 1, 10000, (pid_t[64]){0}));
  /* b1 reads b3's load from etcd once b3 has put it there: a fixed 0.6 s
   * was too short for a loaded machine (the job then went on 3 nodes) */
  assert_true(hd_wait_node_busy(&n[0], "b3", 1, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "6",
                         "--save", ckpt, "--save-interval", "10", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 300, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = 2;
  spec.nnodes_max = 3;
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  /* b3's job ends once this one trains on two nodes */
  freer f = {.d = &n[2], .job_id = busy_id};
  hd_watch w;
  hd_watch_job_cb(&n[0], id, true, 180000, &w, free_busy_node, &f);
  assert_true(f.done);
  if (!strstr(w.events_text, "re-planning on 3 nodes (was 2)"))
    fprintf(stderr, "events:\n%s", w.events_text);
  assert_true(hd_succeeded(&n[0], &w));
  assert_non_null(strstr(w.events_text, "placed: world 2"));
  assert_non_null(strstr(w.events_text, "re-planning on 3 nodes (was 2)"));
  assert_int_equal(w.final->world_size, 3);
  hd_watch_free(&w);
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- the coordinator dead, its lease not yet expired: survivors answer ---- */

/* kill -9 of the coordinator's node: before its lease expires (and long
 * after, through the takeover) every survivor answers for the job: status
 * from its copy in etcd, saying the coordinator does not answer and since
 * when; ls marks the copy; watch on a survivor follows the job to its end
 * through the takeover; megactl given several servers moves past the dead
 * one. None of it names the dead coordinator's address as if it were the
 * server megactl was given. */
static void test_survivors_answer_for_a_dead_coordinator(void **state) {
  (void)state;
  hd n[3];
  start_nodes(n, "v");
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12",
                         "--save", ckpt, "--save-interval", "5", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 300, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = 2;
  spec.nnodes_max = 3;
  spec.max_restarts = 3;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_checkpoint(&n[0], id, 10, 60000) >= 10);
  char dead_addr[64];
  snprintf(dead_addr, sizeof dead_addr, "%s", n[0].addr);
  hd_kill(&n[0]);
  int64_t killed_ms = hd_unix_ms();

  /* at once, within the lease's 2 s: from the survivor's copy */
  Mega__V1__GetJobResponse *h = hd_get_job_history(&n[1], id, &err);
  if (!h) fprintf(stderr, "GetJob on a survivor: %s\n", err.msg);
  assert_non_null(h);
  bool copy = h->job->coordinator_unreachable_unix_ms > 0;
  fprintf(stderr, "GetJob on v2 %.3f s after the kill: coordinator %s%s\n",
          (double)(hd_unix_ms() - killed_ms) / 1000, h->job->coordinator_node_id,
          copy ? ", unreachable: answered from v2's copy" : "");
  if (!strcmp(h->job->coordinator_node_id, "v1")) {
    assert_true(copy);
    assert_string_equal(h->job->answered_by, "v2");
    assert_true(h->job->coordinator_unreachable_unix_ms >= killed_ms - 1000);
    assert_true(h->n_events > 0); /* the history too */
  }
  protobuf_c_message_free_unpacked(&h->base, NULL);
  char out[16384], args[1024];
  if (copy) { /* ls on the same survivor marks the copy */
    snprintf(args, sizeof args, "--server %s ls", n[1].addr);
    int rc = hd_megactl(out, sizeof out, args);
    bool marked = !strstr(out, "running?") || strstr(out, "node v2's copy");
    if (rc || !marked) fprintf(stderr, "megactl ls on v2:\n%s", out);
    assert_int_equal(rc, 0);
    assert_true(marked);
  }

  /* megactl given the dead node first moves on to the next */
  snprintf(args, sizeof args, "--server %s,%s status %s", dead_addr, n[2].addr, id);
  int rc = hd_megactl(out, sizeof out, args);
  if (rc || !strstr(out, id) || strstr(out, "cannot reach"))
    fprintf(stderr, "megactl status (%s first):\n%s", dead_addr, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, id));
  assert_null(strstr(out, "cannot reach"));

  /* watch on a survivor follows the job through the takeover to its end */
  snprintf(args, sizeof args, "--server %s watch %s --plain", n[1].addr, id);
  bool named_dead = false;
  char as_server[128];
  snprintf(as_server, sizeof as_server, "cannot reach megad at %s", dead_addr);
  rc = hd_megactl_seen(out, sizeof out, args, as_server, &named_dead);
  const char *tail = strlen(out) > 1500 ? out + strlen(out) - 1500 : out;
  if (rc || !strstr(out, "succeeded") || named_dead)
    fprintf(stderr, "megactl watch on v2 (its end):\n%s", tail);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "succeeded"));
  assert_false(named_dead); /* never the dead coordinator as the server */

  /* every server named dead: the sentence names each */
  snprintf(args, sizeof args, "--server %s,%s status %s", dead_addr, dead_addr, id);
  rc = hd_megactl(out, sizeof out, args);
  if (rc != 1 || !strstr(out, "no megad answered"))
    fprintf(stderr, "megactl status, both dead: %s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "no megad answered"));
  for (int i = 2; i >= 1; i--) hd_cleanup(&n[i]);
  hd_cleanup(&n[0]);
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
      cmocka_unit_test_setup_teardown(test_replicas_after_coordinator_sigterm, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stopped_node_is_a_lost_node, setup, teardown),
      cmocka_unit_test_setup_teardown(test_partitioned_coordinator_stands_down, setup, teardown),
      cmocka_unit_test_setup_teardown(test_survivors_answer_for_a_dead_coordinator, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_grows_when_slots_free_up, setup, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
