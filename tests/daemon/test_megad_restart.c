/* megad restarted: its journal replayed (jobs listed, a running one run
 * again), and its address after a restart on another port, or another
 * megad at the address of a dead one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

/* A restarted megad replays its journal: the jobs are still listed, and one
 * that was running when the daemon died runs again as a new attempt (from
 * the start here: it saves no checkpoints). */
static void test_restart_replays_journal(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "r1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  char done_id[64], run_id[64];
  mega_err err = {0};
  spec.nproc_per_node = 1;
  assert_int_equal(hd_submit(&d, &spec, done_id, sizeof done_id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, done_id, false, 60000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  hd_watch_free(&w);
  const char *slow[] = {"--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, d.dir, 100000, slow);
  spec.nproc_per_node = 1;
  assert_int_equal(hd_submit(&d, &spec, run_id, sizeof run_id, &err), MEGA_OK);
  pid_t pids[64];
  hd_ranks_started(&d, run_id, 1, pids);
  hd_kill(&d); /* no clean shutdown: the worker dies with it (PR_SET_PDEATHSIG) */
  for (int i = 0; i < 100 && hd_pid_alive(pids[0]); i++) usleep(50000);
  assert_false(hd_pid_alive(pids[0]));

  hd d2 = d;
  assert_true(hd_restart(&d2, NULL));
  Mega__V1__Job *a = hd_get_job(&d2, done_id, &err);
  assert_non_null(a);
  assert_int_equal(a->state, STATE(SUCCEEDED));
  assert_int_equal(a->last_iteration, 2);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  Mega__V1__Job *b = NULL;
  for (int i = 0; i < 100; i++) {
    if (b) protobuf_c_message_free_unpacked(&b->base, NULL);
    b = hd_get_job(&d2, run_id, &err);
    assert_non_null(b);
    if (b->state == STATE(RUNNING)) break;
    usleep(50000);
  }
  assert_int_equal(b->state, STATE(RUNNING));
  assert_int_equal(b->attempt, 1);
  assert_int_equal(b->restarts, 0);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  assert_true(hd_wait_workers(&d2, 1, 10000, pids));
  Mega__V1__CancelJobRequest creq = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  creq.job_id = run_id;
  ProtobufCMessage *cresp = NULL;
  assert_int_equal(mega_rpc_unary(d2.ch, &mega_control_cancel_job, &creq.base, 30000, &cresp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(cresp, NULL);
  /* the finished job's history replays: its steps' last one and the end */
  hd_watch_job(&d2, done_id, true, 10000, &w);
  assert_int_equal(w.end, MEGA_OK);
  assert_non_null(w.final);
  assert_true(w.steps >= 1);
  assert_non_null(strstr(w.events_text, "succeeded"));
  hd_watch_free(&w);
  /* new ids continue after the old ones */
  hd_tiny_spec(&spec, d2.dir, 1, NULL);
  char id3[64];
  assert_int_equal(hd_submit(&d2, &spec, id3, sizeof id3, &err), MEGA_OK);
  assert_string_not_equal(id3, done_id);
  assert_string_not_equal(id3, run_id);
  assert_int_equal(hd_stop(&d2), 0);
  hd_cleanup(&d2);
}

/* The address d has for node id ("" when it lists none). */
static void address_of(hd *d, const char *id, char *out, size_t len) {
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(d, NULL);
  out[0] = 0;
  for (size_t i = 0; ln && i < ln->n_nodes; i++)
    if (!strcmp(ln->nodes[i]->id, id)) snprintf(out, len, "%s", ln->nodes[i]->address);
  if (ln) protobuf_c_message_free_unpacked(&ln->base, NULL);
}

static int state_of(hd *d, const char *id) {
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(d, NULL);
  int st = -1;
  for (size_t i = 0; ln && i < ln->n_nodes; i++)
    if (!strcmp(ln->nodes[i]->id, id)) st = ln->nodes[i]->state;
  if (ln) protobuf_c_message_free_unpacked(&ln->base, NULL);
  return st;
}

/* A node restarted on another port: its new address wins on every node and
 * stays. Its heartbeats used to carry only the new incarnation, so a peer
 * paired that with the old address and spread the pair in its views: the
 * coordinator then launched ranks at a dead port, attempt after attempt. */
static void test_restarted_node_address_wins(void **state) {
  (void)state;
  hd n[3];
  assert_true(hd_start(&n[0], "a1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "a2", 1, n[0].addr, NULL, NULL));
  assert_true(hd_start(&n[2], "a3", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 3, 10000));
  assert_true(hd_wait_alive(&n[1], 3, 10000));
  char old[64];
  snprintf(old, sizeof old, "%s", n[2].addr);
  hd_kill(&n[2]); /* dead on both first, as after a crash and a reboot */
  bool dead = false;
  for (int i = 0; i < 100 && !dead; i++) {
    usleep(100000);
    dead = state_of(&n[0], "a3") == MEGA__V1__NODE_STATE__NODE_STATE_DEAD &&
           state_of(&n[1], "a3") == MEGA__V1__NODE_STATE__NODE_STATE_DEAD;
  }
  assert_true(dead);
  assert_true(hd_restart(&n[2], NULL));
  assert_string_not_equal(old, n[2].addr);
  char got[2][64];
  bool agree = false;
  for (int i = 0; i < 200 && !agree; i++) {
    usleep(50000);
    address_of(&n[0], "a3", got[0], sizeof got[0]);
    address_of(&n[1], "a3", got[1], sizeof got[1]);
    agree = !strcmp(got[0], n[2].addr) && !strcmp(got[1], n[2].addr);
  }
  assert_true(agree);
  for (int i = 0; i < 30; i++) { /* and stays: a dozen heartbeat rounds */
    usleep(100000);
    address_of(&n[0], "a3", got[0], sizeof got[0]);
    address_of(&n[1], "a3", got[1], sizeof got[1]);
    assert_string_equal(got[0], n[2].addr);
    assert_string_equal(got[1], n[2].addr);
  }
  for (int i = 2; i >= 0; i--) hd_cleanup(&n[i]);
}

/* A megad with another --node-name started where a dead one listened: its
 * answers at that address used to keep the dead node alive (calls and
 * heartbeats go by address), both names stayed in every view, and jobs
 * were placed on the ghost. */
static void test_other_megad_at_old_address(void **state) {
  (void)state;
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", hd_free_port());
  const char *fixed[] = {"--listen", listen, NULL};
  hd n[3];
  assert_true(hd_start(&n[0], "g1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "g2", 1, n[0].addr, NULL, fixed));
  assert_true(hd_wait_alive(&n[0], 2, 10000));
  hd_kill(&n[1]);
  /* at once, before g1 counts g2 dead: a reboot under another name */
  assert_true(hd_start(&n[2], "g9", 1, n[0].addr, NULL, fixed));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) {
    usleep(100000);
    gone = state_of(&n[0], "g2") == MEGA__V1__NODE_STATE__NODE_STATE_DEAD &&
           state_of(&n[0], "g9") == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE &&
           state_of(&n[2], "g2") != MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  }
  if (!gone) {
    hd_dump_log(&n[0]);
    hd_dump_log(&n[2]);
  }
  assert_true(gone);
  assert_true(hd_log_has(&n[0], "node g2 is gone: its address"));
  for (int i = 0; i < 10; i++) { /* and stays so */
    usleep(100000);
    assert_int_equal(state_of(&n[0], "g2"), MEGA__V1__NODE_STATE__NODE_STATE_DEAD);
  }
  /* a job for two nodes runs on g1 and g9 */
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 5, NULL);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&n[0], id, true, 60000, &w);
  assert_true(hd_succeeded(&n[0], &w));
  assert_non_null(strstr(w.events_text, "on g9"));
  assert_null(strstr(w.events_text, "on g2"));
  hd_watch_free(&w);
  hd_cleanup(&n[2]);
  hd_cleanup(&n[1]);
  hd_cleanup(&n[0]);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_restart_replays_journal, teardown),
      cmocka_unit_test_teardown(test_restarted_node_address_wins, teardown),
      cmocka_unit_test_teardown(test_other_megad_at_old_address, teardown),
  };
  /* one test by name: test_megad_restart NAME (meson runs each as its own test) */
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
