/* Surviving the coordinator's own failures, end to end: its megad killed
 * and started again, stopped (SIGTERM), frozen, or its node lost for good,
 * with real workers training a tiny GPT. Each case runs as a test of its
 * own (meson) and checks that no process of the job is left.
 * (test_megad_ft.c: workers, checkpoints and other nodes failing.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define KIND(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

/* ---- kill -9 the coordinator; started again on its state dir, it resumes
 * the job from its newest checkpoint ---- */

static void test_coordinator_restart_resumes(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "c1", 2, NULL, NULL, NULL));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "5", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 500, extra);
  spec.nproc_per_node = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  uint64_t ck = hd_wait_checkpoint(&d, id, 1, 10000);
  assert_true(ck > 0);
  pid_t old = d.pid;
  hd_kill(&d);
  assert_true(hd_workers_gone(old, 5000)); /* PR_SET_PDEATHSIG, and the pipe's silence */
  double t0 = hd_now_s();
  assert_true(hd_restart(&d, NULL));
  hd_watch w;
  hd_watch_job(&d, id, true, 120000, &w);
  assert_true(hd_succeeded(&d, &w));
  fprintf(stderr, "coordinator restart: resumed from iteration %llu and finished in %.2f s\n",
          (unsigned long long)ck, hd_now_s() - t0);
  assert_int_equal(w.final->attempt, 1);
  assert_int_equal(w.final->restarts, 0); /* a restart of megad is not the job's failure */
  assert_non_null(strstr(w.events_text, "restarted while attempt 0 ran; resuming from the "
                                        "checkpoint of iteration"));
  assert_int_equal(w.last_iteration, 500);
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&d, 5000));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* The replicas tests' jobs: the coordinator goes once the watch has seen
 * iteration 12. A two-node tiny job trains an iteration in about half a
 * millisecond, and a loaded machine once delayed the other node's first
 * step report until 40 iterations were done: the job had ended before the
 * kill, with nothing left to recover. */
#define REPLICA_ITERS 400

/* ---- the coordinator's megad restarts (kill -9, then start again) while
 * DP 2 runs on it and another node, no checkpoint written: its own rank
 * dies with it, the other node's keeps its state, and the restarted
 * coordinator asks for it and goes on from there, not from the start ---- */

static void test_coordinator_restart_recovers_from_replicas(void **state) {
  (void)state;
  hd n[2];
  assert_true(hd_start(&n[0], "k1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "k2", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 2, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *ref_extra[] = {"--global-batch-size", "8", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, REPLICA_ITERS, ref_extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 2; /* DP 2 as the job: the same sums */
  hd_watch ref;
  hd_reference(&n[0], &spec, &ref);

  const char *extra[] = {"--global-batch-size", "8", "--save", ckpt, "--save-interval", "1000",
                         NULL};
  hd_tiny_spec(&spec, n[0].dir, REPLICA_ITERS, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  hd_node_stopper k = {.victim = &n[0], .at = 12};
  hd_watch first;
  hd_watch_job_cb(&n[0], id, true, 120000, &first, hd_stop_node_at, &k);
  hd_watch_free(&first);
  assert_true(k.done);
  /* as a unit file would: the same state dir, the other node to join */
  snprintf(n[0].peers, sizeof n[0].peers, "%s", n[1].addr);
  assert_true(hd_restart(&n[0], NULL));
  double t0 = hd_now_s();
  hd_watch w;
  hd_watch_job(&n[0], id, true, 120000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  if (!strstr(w.events_text, "recovered iteration")) fprintf(stderr, "%s", w.events_text);
  assert_non_null(strstr(w.events_text, "restarted while attempt 0 ran; asking its nodes what "
                                        "their ranks kept"));
  assert_non_null(strstr(w.events_text, "restarting from the replicas' state at iteration"));
  assert_non_null(strstr(w.events_text, "recovered iteration"));
  assert_int_equal(w.final->restarts, 0);
  assert_int_equal(w.final->dp, 2);
  assert_true(w.final->checkpoint_iteration == 0 ||
              w.final->checkpoint_iteration == REPLICA_ITERS);
  assert_true(w.redone <= 1);
  /* from the iteration the replicas held on, the uninterrupted run's
   * losses (what came before is merged from k2's ranks alone) */
  int from = 0;
  for (int it = REPLICA_ITERS; it >= 1 && w.seen[it] && w.attempt[it] == w.final->attempt; it--)
    from = it;
  fprintf(stderr, "coordinator restart: went on from the replicas at iteration %d (%d redone), finished "
                  "%.2f s after megad started again\n", from - 1, w.redone, hd_now_s() - t0);
  /* the replicas held the iteration the survivor had finished when megad
   * died: at least the one the watcher saw, maybe more, as the watch stream
   * lags the ranks under load */
  const char *plan = strstr(w.events_text, "restarting from the replicas' state at iteration ");
  int held = plan ? atoi(plan + strlen("restarting from the replicas' state at iteration ")) : -1;
  assert_true(held >= 12);
  assert_int_equal(from, held + 1);
  /* and before it, attempt 0's steps the survivor kept (its last 256):
   * megad's history died with it, so they come only from k2, sent again
   * once the restarted megad asks what k2's ranks hold */
  for (int it = held > 256 ? held - 255 : 1; it <= held; it++)
    if (!w.seen[it] || w.attempt[it] != 0)
      fail_msg("iteration %d of attempt 0 (k2 kept it) is missing from the history", it);
  for (int it = from; it <= REPLICA_ITERS; it++)
    if (fabs(w.loss[it] - ref.loss[it]) > 2e-5 * fabs(ref.loss[it]))
      fail_msg("iteration %d: loss %.9g after the restart, uninterrupted %.9g", it, w.loss[it],
               ref.loss[it]);
  hd_watch_free(&w);
  hd_watch_free(&ref);
  for (int i = 0; i < 2; i++) assert_true(hd_node_workers_gone(&n[i], 5000));
  for (int i = 1; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- the coordinator's node dies: the other nodes stop the job's ranks at
 * once; started again, it resumes the job on both ---- */

static void test_coordinator_loss_stops_remote_ranks(void **state) {
  (void)state;
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", hd_free_port());
  const char *fixed[] = {"--listen", listen, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "k1", 1, NULL, NULL, fixed));
  assert_true(hd_start(&n2, "k2", 1, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n1.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "5", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n1.dir, 600, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_checkpoint(&n1, id, 1, 10000) > 0);
  pid_t remote[64];
  assert_true(hd_wait_workers(&n2, 1, 5000, remote));
  double t0 = hd_now_s();
  hd_kill(&n1);
  /* n2 must not go on training without the job's coordinator: its rank
   * stops and keeps its state for the coordinator's restart */
  assert_true(hd_wait_log(&n2, "holds the state of iteration", 10000));
  fprintf(stderr, "coordinator lost: the other node's rank held its state %.2f s after "
                  "kill -9\n", hd_now_s() - t0);
  /* asked about the job meanwhile, k2 answers itself, naming the node it
   * cannot reach (it once read "cannot reach megad at <k2>: ... which is
   * down", as if k2 had not answered) */
  Mega__V1__Job *j = hd_get_job(&n2, id, &err);
  assert_null(j);
  fprintf(stderr, "GetJob on k2: %s\n", err.msg);
  assert_int_equal(err.status, MEGA_ERR_PEER);
  assert_non_null(strstr(err.msg, "node k2 cannot reach node k1, the coordinator of job"));
  assert_null(strstr(err.msg, n2.addr));
  assert_true(hd_restart(&n1, fixed));
  /* through the other node; a call right after k1's restart may meet the
   * old channel's backoff and is tried again, as megactl watch does */
  hd_watch w;
  for (int i = 0; i < 20; i++) {
    hd_watch_job(&n2, id, true, 120000, &w);
    if (w.final) break;
    hd_watch_free(&w);
    usleep(500000);
  }
  if (!w.final) hd_dump_log(&n2);
  assert_true(hd_succeeded(&n1, &w));
  assert_true(w.final->attempt >= 1);
  assert_int_equal(w.last_iteration, 600);
  /* the restarted coordinator went on from what k2's rank held */
  assert_non_null(strstr(w.events_text, "restarting from the replicas' state at iteration"));
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&n1, 5000));
  assert_true(hd_node_workers_gone(&n2, 5000));
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* ---- the coordinator killed for good: the other node's rank keeps its
 * state for --held-state-timeout, then lets go ---- */
static void test_held_state_let_go_without_coordinator(void **state) {
  (void)state;
  const char *held[] = {"--held-state-timeout", "1s", NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "g1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "g2", 1, n1.addr, NULL, held));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n1.dir, 100000, NULL);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t remote[64];
  assert_true(hd_wait_workers(&n2, 1, 5000, remote));
  /* a few steps: a rank killed before its first has no state to hold (a
   * fixed 0.3 s was too short for a loaded CI machine once) */
  uint64_t done = 0;
  for (int i = 0; i < 200 && done < 3; i++) {
    Mega__V1__Job *j = hd_get_job(&n1, id, &err);
    if (j) done = j->last_iteration, protobuf_c_message_free_unpacked(&j->base, NULL);
    if (done < 3) usleep(50000);
  }
  assert_true(done >= 3);
  double t0 = hd_now_s();
  hd_kill(&n1);
  assert_true(hd_wait_log(&n2, "holds the state of iteration", 10000));
  /* lost after the heartbeat timeout (1.5 s), then held 1 s */
  assert_true(hd_wait_log(&n2, "no coordinator asked for its held ranks in 1.0 s", 10000));
  assert_true(hd_node_workers_gone(&n2, 5000));
  fprintf(stderr, "coordinator gone for good: the other node's held rank went %.2f s after "
                  "kill -9\n", hd_now_s() - t0);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* ---- the coordinator frozen for 5 s (heartbeat mode) ---- */

/* SIGSTOP of the coordinator's megad for 5 s: on waking, its clock said
 * every peer and its own worker had been silent all along, so the events
 * blamed rank 0 for no progress and named a healthy node as lost, and a
 * step the failed attempt still completed was logged as "training again".
 * The cause is the coordinator's own stall; the restart is not counted. */
static void test_coordinator_freeze(void **state) {
  (void)state;
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", hd_free_port());
  const char *fixed[] = {"--listen", listen, NULL};
  hd n[3];
  assert_true(hd_start(&n[0], "f1", 1, NULL, NULL, fixed));
  assert_true(hd_start(&n[1], "f2", 1, n[0].addr, NULL, NULL));
  assert_true(hd_start(&n[2], "f3", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 3, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "12",
                         "--save", ckpt, "--save-interval", "5", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 300, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 3;
  spec.max_restarts = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_checkpoint(&n[0], id, 10, 60000) >= 10);
  kill(n[0].pid, SIGSTOP);
  sleep(5);
  kill(n[0].pid, SIGCONT);
  hd_watch w;
  hd_watch_job(&n[0], id, true, 180000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  /* f2 and f3 were fine (no missed heartbeats), so was rank 0 (progress) */
  assert_true(hd_text_ok("events", w.events_text,
                         HD_ALL("node f1, the job's coordinator, stalled for"),
                         HD_ALL("missed heartbeats", "made no progress",
                                "training again: attempt 0 ")));
  assert_int_equal(w.last_iteration, 300);
  assert_true(w.final->attempt >= 1);
  assert_int_equal(w.final->restarts, 0); /* the coordinator's stall is no failure of the job */
  assert_false(hd_log_has(&n[0], "missed heartbeats"));
  hd_watch_free(&w);
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- the coordinator frozen (heartbeat mode): the held replicas survive ---- */

/* PP 2 x DP 3, two ranks a node: h1's own ranks are both of stage 0. While
 * h1's megad was stopped 4 s, h2 and h3 took it for lost and held their
 * ranks' state (both stages). On waking h1 told them to let go (its own
 * stall ended the attempt without hold), waited seconds for exits their
 * nodes no longer relayed, and planned from its own ranks alone: "no
 * replica of pipeline stage 1 holds iteration N", back to the checkpoint. */
static void test_coordinator_freeze_keeps_replicas(void **state) {
  (void)state;
  hd n[3];
  assert_true(hd_start(&n[0], "h1", 2, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "h2", 2, n[0].addr, NULL, NULL));
  assert_true(hd_start(&n[2], "h3", 2, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 3, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
                         "--global-batch-size", "6", "--save", ckpt, "--save-interval", "10",
                         NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 100000, extra);
  spec.nproc_per_node = 2;
  spec.nnodes_min = 2;
  spec.nnodes_max = 3;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_checkpoint(&n[0], id, 10, 60000) >= 10);
  usleep(200 * 1000); /* past the checkpoint: its iteration is not what the replicas hold */
  kill(n[0].pid, SIGSTOP);
  assert_true(hd_wait_log(&n[1], "holds the state of iteration", 10000));
  assert_true(hd_wait_log(&n[2], "holds the state of iteration", 10000));
  sleep(2);
  kill(n[0].pid, SIGCONT);
  int64_t woke = hd_unix_ms();
  int64_t restart = 0, recovered = 0;
  for (int i = 0; i < 300 && !recovered; i++) {
    usleep(50000);
    restart = hd_event_ms(&n[0], id, KIND(RESTARTING), 0, NULL);
    recovered = hd_event_ms(&n[0], id, KIND(INFO), 0, "from replicas;");
  }
  /* it asks the nodes what their ranks kept, and goes on from that */
  bool from_replicas =
      hd_event_ms(&n[0], id, KIND(INFO), 0, "kept their state: restarting from the replicas'") >
      0;
  bool none_redone = hd_event_ms(&n[0], id, KIND(INFO), 0, "; 0 iterations redone") > 0;
  if (!restart || !recovered || !from_replicas || !none_redone) { /* about to fail: why */
    Mega__V1__GetJobResponse *h = hd_get_job_history(&n[0], id, &err);
    for (size_t i = 0; h && i < h->n_events; i++) fprintf(stderr, "%s\n", h->events[i]->message);
    if (h) protobuf_c_message_free_unpacked(&h->base, NULL);
    hd_dump_log(&n[0]);
    hd_dump_log(&n[1]);
  }
  assert_true(restart > 0);
  fprintf(stderr, "restart decided %.2f s after the coordinator woke\n",
          (double)(restart - woke) / 1000);
  assert_true(from_replicas);
  assert_true(recovered > 0);
  assert_true(none_redone);
  /* the ranks that kept the state told the coordinator: no wait for exits */
  assert_false(hd_log_has(&n[0], "did not report an exit in time"));
  Mega__V1__Job *j = hd_get_job(&n[0], id, &err);
  assert_non_null(j);
  assert_int_equal(j->restarts, 0);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_int_equal(hd_cancel(&n[0], id, "test", &err), MEGA_OK);
  for (int i = 2; i >= 0; i--) assert_true(hd_node_workers_gone(&n[i], 10000));
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* ---- the coordinator's megad stopped (SIGTERM) and started again ---- */

/* Its graceful stop ended the attempt without hold: the other node's rank
 * let go of its state and the restart went back to the checkpoint (here
 * the start), where a kill -9 and restart go on from the replicas. */
static void test_coordinator_stop_recovers_from_replicas(void **state) {
  (void)state;
  hd n[2];
  assert_true(hd_start(&n[0], "m1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "m2", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 2, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  const char *extra[] = {"--global-batch-size", "8", "--save", ckpt, "--save-interval", "1000",
                         NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, REPLICA_ITERS, extra);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  hd_node_stopper k = {.victim = &n[0], .at = 12, .sig = SIGTERM};
  hd_watch first;
  hd_watch_job_cb(&n[0], id, true, 120000, &first, hd_stop_node_at, &k);
  hd_watch_free(&first);
  assert_true(k.done);
  assert_int_equal(hd_stop(&n[0]), 0);
  snprintf(n[0].peers, sizeof n[0].peers, "%s", n[1].addr);
  assert_true(hd_restart(&n[0], NULL));
  hd_watch w;
  hd_watch_job(&n[0], id, true, 120000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  assert_true(hd_text_ok("events", w.events_text,
                         HD_ALL("started again; asking the nodes of attempt 0 what their ranks "
                                "kept",
                                "kept its state: restarting from the replicas' state",
                                "recovered iteration"),
                         NULL));
  assert_int_equal(w.final->restarts, 0);
  assert_true(w.redone <= 1);
  hd_watch_free(&w);
  for (int i = 1; i >= 0; i--) assert_true(hd_node_workers_gone(&n[i], 5000));
  for (int i = 1; i >= 0; i--) hd_cleanup(&n[i]);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_coordinator_restart_resumes, teardown),
      cmocka_unit_test_teardown(test_coordinator_restart_recovers_from_replicas, teardown),
      cmocka_unit_test_teardown(test_coordinator_loss_stops_remote_ranks, teardown),
      cmocka_unit_test_teardown(test_held_state_let_go_without_coordinator, teardown),
      cmocka_unit_test_teardown(test_coordinator_freeze, teardown),
      cmocka_unit_test_teardown(test_coordinator_freeze_keeps_replicas, teardown),
      cmocka_unit_test_teardown(test_coordinator_stop_recovers_from_replicas, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
