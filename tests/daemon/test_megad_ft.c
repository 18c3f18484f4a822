/* Surviving failure, end to end: real megad processes on loopback, real
 * workers training a tiny GPT, real kills. Each case runs as a test of its
 * own (meson), prints the detection and recovery times it saw, and checks
 * that no process of the job is left. (test_megad_coord_ft.c: the
 * coordinator's own failures; test_megad_elastic.c: jobs that shrink and
 * grow; test_megad_guards.c: what megad refuses and keeps safe.) */
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

/* ---- kill -9 one worker: the job restarts and its losses are exact ---- */

typedef struct killer {
  hd *d;
  uint64_t at;      /* kill when this iteration is merged */
  int sig;
  bool done;
  pid_t victim;
  int64_t when_ms;
} killer;

static void kill_a_worker(void *arg, const Mega__V1__WatchJobResponse *it) {
  killer *k = arg;
  if (k->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < k->at)
    return;
  pid_t pids[64];
  if (hd_workers(k->d, pids, 64) < 1) return;
  k->victim = pids[0];
  k->when_ms = hd_unix_ms();
  kill(k->victim, k->sig);
  k->done = true;
}

/* The first "training again" event's time, 0 if none. */
static int64_t back_ms(hd *d, const char *id) {
  int64_t back = 0;
  for (int i = 0; i < 8 && !back; i++) {
    Mega__V1__GetJobResponse *r = hd_get_job_history(d, id, NULL);
    for (size_t e = 0; r && e < r->n_events && !back; e++)
      if (strstr(r->events[e]->message, "training again")) back = r->events[e]->time_unix_ms;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return back;
}

/* DP 2 on one node, kill -9 of one worker. replicas: the survivor hands
 * its state to the next attempt (nothing redone, the very same numbers);
 * else (--no-replica-recovery) the checkpoint. The kill comes once the
 * watch has seen iteration 25, checkpoints every 20: the workers may run
 * ahead of a loaded watch, and with checkpoints every 10 they once reached
 * 30 and committed it before the kill, leaving nothing to redo. */
static void worker_kill(bool replicas) {
  hd d;
  assert_true(hd_start(&d, "w1", 2, NULL, NULL, NULL));
  char ckpt[256], ref_ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  snprintf(ref_ckpt, sizeof ref_ckpt, "%s/ref-ckpt", d.dir);
  const char *ref_extra[] = {"--save", ref_ckpt, "--save-interval", "20", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 80, ref_extra);
  spec.nproc_per_node = 2; /* DP 2 */
  hd_watch ref;
  hd_reference(&d, &spec, &ref);

  const char *extra[] = {"--save", ckpt, "--save-interval", "20",
                         replicas ? NULL : "--no-replica-recovery", NULL};
  hd_tiny_spec(&spec, d.dir, 80, extra);
  spec.nproc_per_node = 2;
  spec.max_restarts = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  killer k = {.d = &d, .at = 25, .sig = SIGKILL};
  hd_watch w;
  hd_watch_job_cb(&d, id, true, 120000, &w, kill_a_worker, &k);
  assert_true(hd_succeeded(&d, &w));
  assert_true(k.done);
  assert_int_equal(w.final->restarts, 1);
  assert_int_equal(w.final->attempt, 1);
  assert_non_null(strstr(w.events_text, "exited with signal 9 (Killed)"));
  if (replicas) {
    if (!strstr(w.events_text, "recovered iteration")) {
      /* the survivor's stderr says why it kept no state */
      fprintf(stderr, "%s", w.events_text);
      char cmd[600];
      snprintf(cmd, sizeof cmd, "find '%s' -name 'rank-*.log' -exec sh -c "
               "'echo \"---- $1\"; tail -n 15 \"$1\"' _ {} \\; >&2", d.dir);
      if (system(cmd) != 0) fprintf(stderr, "(no rank logs under %s)\n", d.dir);
    }
    assert_non_null(strstr(w.events_text, "restarting from the replicas' state at iteration"));
    assert_non_null(strstr(w.events_text, "recovered iteration"));
    assert_true(w.redone <= 1);
  } else {
    if (w.redone == 0) fprintf(stderr, "nothing redone:\n%s", w.events_text);
    assert_true(w.redone > 0);
    assert_non_null(strstr(w.events_text, "restarting from the checkpoint of iteration"));
    assert_non_null(strstr(w.events_text, "not from replicas: --no-replica-recovery"));
  }
  /* same topology, data order and state: the very same numbers */
  hd_same_losses(&w, &ref, 80, 0.0);
  int64_t detected = hd_event_ms(&d, id, KIND(RANK_FAILED), 0, NULL);
  int64_t back = back_ms(&d, id);
  fprintf(stderr, "worker kill (%s): detected %.3f s after the kill, training again %.3f s after "
                  "detection; %d iteration(s) redone\n", replicas ? "replicas" : "checkpoint",
          (double)(detected - k.when_ms) / 1000, (double)(back - detected) / 1000, w.redone);
  assert_true(detected >= k.when_ms);
  assert_true(back > detected);
  hd_watch_free(&w);
  hd_watch_free(&ref);
  assert_true(hd_node_workers_gone(&d, 5000));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

static void test_worker_kill_restarts_exactly(void **state) {
  (void)state;
  worker_kill(false);
}

static void test_worker_kill_recovers_from_replicas(void **state) {
  (void)state;
  worker_kill(true);
}

/* ---- the newest checkpoint is damaged when a restart needs it: the
 * restart loads the one before, and the job's history says so ---- */

typedef struct truncater {
  hd *d;
  const char *ckpt;
  bool done;
  unsigned long long damaged;
} truncater;

static void truncate_then_kill(void *arg, const Mega__V1__WatchJobResponse *it) {
  truncater *t = arg;
  if (t->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < 22)
    return;
  /* A tiny job saves every few ms: stop its workers, so that the checkpoint
   * latest names (what a restart tries first) stays the one damaged. */
  pid_t pids[64];
  int n = hd_workers(t->d, pids, 64);
  if (n <= 0) return;
  for (int i = 0; i < n; i++) kill(pids[i], SIGSTOP);
  usleep(200 * 1000); /* every write under way has returned */
  char path[512];
  unsigned long long latest = 0;
  snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", t->ckpt);
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%llu", &latest) != 1) latest = 0;
    fclose(f);
  }
  /* cut its model file in half, then the failure: every worker killed */
  struct stat st;
  snprintf(path, sizeof path, "%s/iter_%07llu/model.safetensors", t->ckpt, latest);
  if (latest >= 20 && stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0) {
    t->damaged = latest;
    t->done = true;
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    return;
  }
  for (int i = 0; i < n; i++) kill(pids[i], SIGCONT);
}

static void test_damaged_checkpoint_falls_back(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "t1", 2, NULL, NULL, NULL));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "10", "--no-replica-recovery", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 150, extra); /* the damage comes at iteration 22 seen */
  spec.nproc_per_node = 2;
  spec.max_restarts = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  truncater t = {.d = &d, .ckpt = ckpt};
  hd_watch w;
  hd_watch_job_cb(&d, id, true, 120000, &w, truncate_then_kill, &t);
  assert_true(hd_succeeded(&d, &w));
  assert_true(t.done);
  char want[128];
  snprintf(want, sizeof want, "checkpoint iteration %llu in", t.damaged);
  if (!strstr(w.events_text, want))
    fprintf(stderr, "wanted \"%s\"; events:\n%s", want, w.events_text);
  assert_non_null(strstr(w.events_text, want)); /* rank 0's note: which, why, what instead */
  assert_non_null(strstr(w.events_text, "is incomplete"));
  /* The redone iterations began at the checkpoint the note names: the one
   * before the damaged one, or a newer one that rank 0 had finished when it
   * was stopped but not yet named in latest. */
  const char *loading = strstr(strstr(w.events_text, want), "; loading iteration ");
  assert_non_null(loading);
  unsigned long long from = strtoull(loading + strlen("; loading iteration "), NULL, 10);
  assert_true(from != t.damaged && from >= 10 && from < HD_MAX_ITERS);
  if (w.attempt[from + 1] != 1)
    fprintf(stderr, "iteration %llu: attempt %u; events:\n%s", from + 1, w.attempt[from + 1],
            w.events_text);
  assert_int_equal(w.attempt[from + 1], 1);
  /* From then on the job's checkpoint is the one loaded, older or newer;
   * an older one makes the redo's own save of the damaged iteration count
   * again (it was passed over as no newer than the damaged one). */
  char now[128], again[128];
  snprintf(now, sizeof now, "the job's checkpoint is now iteration %llu's", from);
  snprintf(again, sizeof again, "checkpoint of iteration %llu committed", t.damaged);
  /* The coordinator may not have recorded the damaged iteration's commit
   * before the kill (the ranks had written latest, its commit was on the
   * way): then its checkpoint was already the one loaded, and nothing moves. */
  const char *note = strstr(w.events_text, want);
  const char *committed = strstr(w.events_text, again);
  bool had_damaged = committed && committed < note;
  const char *moved = had_damaged ? strstr(w.events_text, now) : note;
  bool redone = from < t.damaged;
  if (!moved || (redone && !strstr(moved, again)))
    fprintf(stderr, "wanted \"%s\"%s%s; events:\n%s", had_damaged ? now : want,
            redone ? ", then " : "", redone ? again : "", w.events_text);
  assert_non_null(moved);
  if (redone) assert_non_null(strstr(moved, again));
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&d, 5000));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* ---- the committed checkpoint is gone when a restart needs it (the
 * directory moved, a node that does not see the shared storage): the
 * attempt fails and says so, never trains from iteration 1 under the name
 * of a resume; with the directory back, megactl resume goes on from it ---- */

typedef struct mover {
  hd *d;
  const char *ckpt, *moved;
  bool done;
} mover;

static void move_then_kill(void *arg, const Mega__V1__WatchJobResponse *it) {
  mover *m = arg;
  if (m->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < 22)
    return;
  pid_t pids[64];
  int n = hd_workers(m->d, pids, 64);
  if (n <= 0) return;
  for (int i = 0; i < n; i++) kill(pids[i], SIGSTOP);
  usleep(200 * 1000); /* every write under way has returned */
  if (rename(m->ckpt, m->moved) != 0) {
    for (int i = 0; i < n; i++) kill(pids[i], SIGCONT);
    return;
  }
  m->done = true;
  for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
}

static void test_missing_checkpoint_fails_restart(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "m1", 2, NULL, NULL, NULL));
  char ckpt[256], moved[272];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  snprintf(moved, sizeof moved, "%s/ckpt.moved", d.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "10", "--no-replica-recovery", NULL};
  Mega__V1__JobSpec spec;
  /* the move comes when the watch shows iteration 22: a loaded watch must
   * not lag the whole job, so it is 120 iterations, not 40 */
  hd_tiny_spec(&spec, d.dir, 120, extra);
  spec.nproc_per_node = 2;
  spec.max_restarts = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  mover m = {.d = &d, .ckpt = ckpt, .moved = moved};
  hd_watch w;
  hd_watch_job_cb(&d, id, true, 120000, &w, move_then_kill, &m);
  assert_true(m.done);
  if (w.final->state != STATE(FAILED)) fprintf(stderr, "events:\n%s", w.events_text);
  assert_int_equal(w.final->state, STATE(FAILED));
  assert_non_null(strstr(w.events_text, "restarting from the checkpoint of iteration"));
  assert_non_null(strstr(w.events_text, "--exit-on-missing-checkpoint"));
  assert_non_null(strstr(w.final->error, ckpt));
  /* a bad job: the rest of the budget is not spent on it */
  assert_int_equal(w.final->restarts, 1);
  for (int i = 1; i <= HD_MAX_ITERS; i++) assert_true(!w.seen[i] || w.attempt[i] == 0);
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&d, 5000));

  /* the directory back: resume goes on from its checkpoint, not the start */
  assert_int_equal(rename(moved, ckpt), 0);
  Mega__V1__ResumeJobRequest req = MEGA__V1__RESUME_JOB_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(mega_rpc_unary(d.ch, &mega_control_resume_job, &req.base, 10000, &resp, &err),
                   MEGA_OK);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  hd_watch_job(&d, id, true, 120000, &w);
  assert_true(hd_succeeded(&d, &w));
  assert_int_equal(w.last_iteration, 120);
  assert_int_equal(w.attempt[120], 2);
  assert_true(w.attempt[1] == 0); /* iteration 1 was never trained again */
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&d, 5000));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* ---- a rank that hangs (SIGSTOP) is caught by the hang check ---- */

static void test_hung_worker_restarts(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "h1", 2, NULL, NULL, NULL));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "10", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 60, extra);
  spec.nproc_per_node = 2;
  spec.max_restarts = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  killer k = {.d = &d, .at = 20, .sig = SIGSTOP};
  hd_watch w;
  hd_watch_job_cb(&d, id, true, 120000, &w, kill_a_worker, &k);
  assert_true(hd_succeeded(&d, &w));
  assert_true(k.done);
  assert_int_equal(w.final->restarts, 1);
  assert_non_null(strstr(w.events_text, "made no progress for"));
  assert_non_null(strstr(w.events_text, "is stopped; killed it"));
  int64_t detected = hd_event_ms(&d, id, KIND(RANK_FAILED), 0, NULL);
  fprintf(stderr, "hung worker: detected %.3f s after SIGSTOP\n",
          (double)(detected - k.when_ms) / 1000);
  assert_false(hd_pid_alive(k.victim));
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(&d, 5000));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* ---- recovery from replicas: PP 2 x DP 2 (x TP) on four nodes, with
 * --save but no checkpoint before the end; kill -9 one node mid-run. The
 * job goes on at DP 1 from the survivors' state: at most one iteration
 * redone, the losses of the uninterrupted run ---- */

static void replicas_node_kill(int tp, const char *flag) {
  hd n[4];
  char slots[8];
  snprintf(slots, sizeof slots, "%d", tp);
  assert_true(hd_start(&n[0], "r1", tp, NULL, NULL, NULL));
  for (int i = 1; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof name, "r%d", i + 1);
    assert_true(hd_start(&n[i], name, tp, n[0].addr, NULL, NULL));
  }
  assert_true(hd_wait_alive(&n[0], 4, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", n[0].dir);
  /* the uninterrupted run: one rank, the same global batch */
  const char *ref_extra[] = {"--global-batch-size", "8", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 40, ref_extra);
  spec.nproc_per_node = 1;
  hd_watch ref;
  hd_reference(&n[0], &spec, &ref);

  const char *extra[] = {"--global-batch-size", "8", "--pipeline-model-parallel-size", "2",
                         "--tensor-model-parallel-size", slots, "--save", ckpt,
                         "--save-interval", "1000", flag, NULL};
  hd_tiny_spec(&spec, n[0].dir, 40, extra);
  spec.nproc_per_node = (uint32_t)tp;
  spec.nnodes_min = 2;
  spec.nnodes_max = 4;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  hd_node_stopper k = {.victim = &n[3], .at = 12};
  hd_watch w;
  hd_watch_job_cb(&n[0], id, true, 180000, &w, hd_stop_node_at, &k);
  assert_true(hd_succeeded(&n[0], &w));
  assert_true(k.done);
  if (!strstr(w.events_text, "recovered iteration")) fprintf(stderr, "%s", w.events_text);
  assert_int_equal(w.final->dp, 1);
  assert_int_equal(w.final->restarts, 0);
  /* nothing on disk to go back to: the only checkpoint is the last iteration's */
  assert_true(w.final->checkpoint_iteration == 0 || w.final->checkpoint_iteration == 40);
  assert_non_null(strstr(w.events_text, "node r4 missed heartbeats"));
  assert_non_null(strstr(w.events_text, "restarting from the replicas' state at iteration"));
  assert_non_null(strstr(w.events_text, "rescaled from DP 2 to DP 1 as attempt 1, from the "
                                        "replicas' state at iteration"));
  assert_non_null(strstr(w.events_text, "recovered iteration"));
  assert_true(w.redone <= 1);
  assert_int_equal(w.world[40], 2 * tp);
  hd_same_losses(&w, &ref, 40, 2e-5);
  int64_t lost = hd_event_ms(&n[0], id, KIND(NODE_LOST), 0, NULL);
  int64_t back = back_ms(&n[0], id);
  fprintf(stderr, "replicas, node kill (TP %d%s%s): detected %.3f s after kill -9, training "
                  "again %.3f s after detection; %d iteration(s) redone\n", tp, flag ? ", " : "",
          flag ? flag : "", (double)(lost - k.when_ms) / 1000, (double)(back - lost) / 1000,
          w.redone);
  hd_watch_free(&w);
  hd_watch_free(&ref);
  for (int i = 0; i < 3; i++) assert_true(hd_node_workers_gone(&n[i], 5000));
  for (int i = 3; i >= 0; i--) hd_cleanup(&n[i]);
}

static void test_replicas_node_kill(void **state) {
  (void)state;
  replicas_node_kill(1, NULL);
}

static void test_replicas_node_kill_distopt(void **state) {
  (void)state;
  replicas_node_kill(1, "--use-distributed-optimizer");
}

static void test_replicas_node_kill_tp2(void **state) {
  (void)state;
  replicas_node_kill(2, NULL);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_worker_kill_restarts_exactly, teardown),
      cmocka_unit_test_teardown(test_worker_kill_recovers_from_replicas, teardown),
      cmocka_unit_test_teardown(test_replicas_node_kill, teardown),
      cmocka_unit_test_teardown(test_replicas_node_kill_distopt, teardown),
      cmocka_unit_test_teardown(test_replicas_node_kill_tp2, teardown),
      cmocka_unit_test_teardown(test_damaged_checkpoint_falls_back, teardown),
      cmocka_unit_test_teardown(test_missing_checkpoint_fails_restart, teardown),
      cmocka_unit_test_teardown(test_hung_worker_restarts, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
