/* megad end to end across nodes joined with --peers: a job's stages on
 * several nodes, every megad answering and listing for every job, and a
 * node that dies taking its job with it. */
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

/* ListJobs on d (every job it can list, at most limit; 0: no limit). */
static Mega__V1__ListJobsResponse *list_jobs_limit(hd *d, uint32_t limit) {
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  req.limit = limit;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(d->ch, &mega_control_list_jobs, &req.base, 10000, &resp, &err) != MEGA_OK)
    fail_msg("ListJobs on %s: %s", d->name, err.msg);
  return (Mega__V1__ListJobsResponse *)resp;
}

static Mega__V1__ListJobsResponse *list_jobs(hd *d) { return list_jobs_limit(d, 0); }

/* Waits up to ms until d's view has node id in state st. */
static bool wait_node_state(hd *d, const char *id, Mega__V1__NodeState st, int ms) {
  for (int t = 0; t < ms; t += 100) {
    Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
    bool there = false;
    for (size_t i = 0; r && i < r->n_nodes; i++)
      there |= !strcmp(r->nodes[i]->id, id) && r->nodes[i]->state == st;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    if (there) return true;
    usleep(100000);
  }
  return false;
}

/* Three nodes joined with --peers; a job submitted to n1 runs its two
 * pipeline stages on two nodes and trains to SUCCEEDED. */
static void test_cluster_trains_across_nodes(void **state) {
  (void)state;
  hd n1, n2, n3;
  assert_true(hd_start(&n1, "n1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "n2", 1, n1.addr, NULL, NULL));
  assert_true(hd_start(&n3, "n3", 1, n1.addr, NULL, NULL));
  /* every daemon sees all three */
  assert_true(hd_wait_alive(&n1, 3, 10000));
  assert_true(hd_wait_alive(&n2, 3, 10000));
  assert_true(hd_wait_alive(&n3, 3, 10000));
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(&n2, NULL);
  assert_non_null(ln);
  assert_string_equal(ln->self_node_id, "n2");
  assert_int_equal(ln->n_nodes, 3);
  for (size_t i = 0; i < ln->n_nodes; i++) assert_int_equal(ln->nodes[i]->slots, 1);
  protobuf_c_message_free_unpacked(&ln->base, NULL);

  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, n1.dir, 3, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  if (!w.final || w.final->state != STATE(SUCCEEDED)) {
    fprintf(stderr, "watch: %s\nevents:\n%s", w.err.msg, w.events_text);
    hd_dump_log(&n1);
    hd_dump_log(&n2);
  }
  assert_int_equal(w.end, MEGA_OK);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  assert_int_equal(w.steps, 3);
  assert_int_equal(w.last_iteration, 3);
  assert_int_equal(w.ranks, 2);
  assert_true(w.last_loss > 0 && w.last_loss < 10);
  assert_int_equal(w.final->world_size, 2);
  assert_int_equal(w.final->pp, 2);
  assert_int_equal(w.final->n_placement, 2);
  assert_string_equal(w.final->placement[0]->node_id, "n1"); /* the coordinator first */
  assert_string_not_equal(w.final->placement[1]->node_id, "n1");
  assert_non_null(strstr(w.events_text, "placed"));
  hd_watch_free(&w);

  /* every megad answers for every job: n2 and n3 forward to n1 */
  Mega__V1__Job *j2 = hd_get_job(&n2, id, &err);
  assert_non_null(j2);
  assert_int_equal(j2->state, STATE(SUCCEEDED));
  assert_string_equal(j2->coordinator_node_id, "n1");
  protobuf_c_message_free_unpacked(&j2->base, NULL);
  hd_watch_job(&n3, id, true, 10000, &w);
  assert_int_equal(w.end, MEGA_OK);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  assert_int_equal(w.steps, 3);
  hd_watch_free(&w);
  assert_null(hd_get_job(&n2, "j-99-n1", &err));
  assert_int_equal(err.status, MEGA_ERR_NOT_FOUND);

  /* and every megad lists every job: ls on a node that ran ranks of n1's
   * job once said "no jobs"; a node that does not answer is named */
  Mega__V1__ListJobsResponse *lj = list_jobs(&n2);
  assert_int_equal(lj->n_jobs, 1);
  assert_string_equal(lj->jobs[0]->id, id);
  assert_int_equal(lj->jobs[0]->state, STATE(SUCCEEDED));
  assert_int_equal(lj->n_unanswered, 0);
  protobuf_c_message_free_unpacked(&lj->base, NULL);
  kill(n1.pid, SIGSTOP);
  lj = list_jobs(&n3);
  kill(n1.pid, SIGCONT);
  assert_int_equal(lj->n_jobs, 0);
  assert_int_equal(lj->n_unanswered, 1);
  assert_string_equal(lj->unanswered[0], "n1");
  protobuf_c_message_free_unpacked(&lj->base, NULL);

  /* --limit holds for the merged list: n2 coordinates a job too, and a
   * limit of 1 on n3 is the cluster's newest job (it was once every job) */
  Mega__V1__JobSpec one;
  hd_tiny_spec(&one, n2.dir, 2, NULL);
  one.nproc_per_node = 1;
  char id2[64];
  assert_int_equal(hd_submit(&n2, &one, id2, sizeof id2, &err), MEGA_OK);
  hd_watch_job(&n2, id2, true, 60000, &w);
  assert_int_equal(w.end, MEGA_OK);
  hd_watch_free(&w);
  lj = list_jobs_limit(&n3, 1);
  assert_int_equal(lj->n_jobs, 1);
  assert_string_equal(lj->jobs[0]->id, id2);
  protobuf_c_message_free_unpacked(&lj->base, NULL);
  lj = list_jobs(&n3);
  assert_int_equal(lj->n_jobs, 2);
  protobuf_c_message_free_unpacked(&lj->base, NULL);

  /* a dead coordinator is named too, not silently left out with its jobs */
  hd_kill(&n1);
  assert_true(wait_node_state(&n3, "n1", MEGA__V1__NODE_STATE__NODE_STATE_DEAD, 20000));
  lj = list_jobs(&n3);
  assert_int_equal(lj->n_jobs, 1);
  assert_string_equal(lj->jobs[0]->id, id2);
  assert_int_equal(lj->n_unanswered, 1);
  assert_string_equal(lj->unanswered[0], "n1");
  protobuf_c_message_free_unpacked(&lj->base, NULL);

  assert_int_equal(hd_stop(&n3), 0);
  assert_int_equal(hd_stop(&n2), 0);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
  hd_cleanup(&n3);
}

/* A node that dies takes its jobs with it, with that cause; the surviving
 * ranks are aborted. */
static void test_node_death_fails_job(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "d1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "d2", 1, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, n1.dir, 100000, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t p1[64], p2[64];
  hd_ranks_started(&n1, id, 1, p1);
  hd_ranks_started(&n2, id, 1, p2);
  usleep(800000);
  double t0 = hd_now_s();
  hd_kill(&n2);
  hd_watch w;
  hd_watch_job(&n1, id, false, 30000, &w);
  double took = hd_now_s() - t0;
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(FAILED));
  fprintf(stderr, "failed in %.2f s: %s\n", took, w.final->error);
  assert_non_null(strstr(w.final->error, "node d2 missed heartbeats for"));
  assert_true(took < 10); /* 1.5 s of heartbeats, and the ranks aborted */
  for (int i = 0; i < 100 && (hd_pid_alive(p1[0]) || hd_pid_alive(p2[0])); i++) usleep(50000);
  assert_false(hd_pid_alive(p1[0]));
  assert_false(hd_pid_alive(p2[0])); /* PR_SET_PDEATHSIG */
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(&n1, NULL);
  for (size_t i = 0; ln && i < ln->n_nodes; i++)
    if (!strcmp(ln->nodes[i]->id, "d2")) {
      assert_int_equal(ln->nodes[i]->state, MEGA__V1__NODE_STATE__NODE_STATE_DEAD);
      assert_int_equal(ln->nodes[i]->n_job_ids, 0); /* its ranks died with it */
    }
  if (ln) protobuf_c_message_free_unpacked(&ln->base, NULL);
  hd_watch_free(&w);
  assert_int_equal(hd_stop(&n1), 0);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_cluster_trains_across_nodes, teardown),
      cmocka_unit_test_teardown(test_node_death_fails_job, teardown),
  };
  /* one test by name: test_megad_cluster NAME (meson runs each as its own test) */
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
