/* megad end to end: real daemons on 127.0.0.1 with ports and state dirs of
 * their own, real megaw workers training a tiny GPT, a small C client on
 * proto/rpc_client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

/* Three nodes joined with --peers; a job submitted to n1 runs its two
 * pipeline stages on two nodes and trains to SUCCEEDED. */
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

/* megad killed in the middle of a watch: the client says it lost megad,
 * without the hint for a TLS server, which closes a plaintext connection
 * before it is made (it was once added to any closed connection). */
static void stop_after_one(void *arg, const Mega__V1__WatchJobResponse *it) {
  hd *d = arg;
  if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && hd_pid_alive(d->pid)) hd_kill(d);
}

static void test_crash_mid_call_says_so(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "c1", 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 100000, NULL);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job_cb(&d, id, true, 60000, &w, stop_after_one, &d);
  fprintf(stderr, "watch when megad died: %s\n", w.err.msg);
  assert_int_not_equal(w.end, MEGA_OK);
  assert_null(strstr(w.err.msg, "tls"));
  hd_watch_free(&w);
  hd_cleanup(&d);
}

/* Unknown ids, bad specs, garbage on the port, a taken port. */
static void test_bad_input(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "solo", 2, NULL, NULL, NULL));
  mega_err err = {0};
  assert_null(hd_get_job(&d, "j-404-solo", &err));
  assert_int_equal(err.status, MEGA_ERR_NOT_FOUND);
  assert_non_null(strstr(err.msg, "j-404-solo"));

  /* an invalid spec: the reason comes back as INVALID_ARGUMENT */
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--num-attention-heads", "7", NULL}; /* 32 is not divisible by 7 */
  hd_tiny_spec(&spec, d.dir, 3, extra);
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "invalid job"));
  /* tensor parallelism megactl would refuse, sent raw: heads, the
   * sequence under --sequence-parallel, TP past the node's 2 slots */
  const char *tp_bad[][8] = {
      {"--tensor-model-parallel-size", "2", "--num-attention-heads", "1", "--hidden-size", "32",
       NULL},
      {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "15", NULL},
      {"--tensor-model-parallel-size", "4", "--num-attention-heads", "4", NULL},
  };
  const char *tp_why[] = {"not divisible by --tensor-model-parallel-size 2",
                          "--seq-length 15 is not divisible", "larger than the 2 processes"};
  for (int k = 0; k < 3; k++) {
    hd_tiny_spec(&spec, d.dir, 3, tp_bad[k]);
    assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
    if (!strstr(err.msg, tp_why[k])) fail_msg("case %d: %s", k, err.msg);
  }
  /* Llama's sizes, sent raw: megactl's words (tests/client/test_cli.sh) */
#define LLAMA "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu"
  const char *llama_bad[][12] = {
      {LLAMA, "--group-query-attention", "--num-query-groups", "3", NULL},
      {LLAMA, "--group-query-attention", "--tensor-model-parallel-size", "2", NULL},
      {LLAMA, "--hidden-size", "16", NULL},
      {LLAMA, "--rotary-percent", "1.5", NULL},
  };
#undef LLAMA
  const char *llama_why[] = {
      "invalid job: --num-attention-heads 2 is not divisible by --num-query-groups 3: each "
      "query group shares its key and value heads with the same number of query heads",
      "invalid job: --group-query-attention without --num-query-groups is one key/value head "
      "for all query heads (Megatron's default --num-query-groups 1), which "
      "--tensor-model-parallel-size 2 cannot split",
      "invalid job: --swiglu without --ffn-hidden-size takes Megatron's default int(4 x 16 x "
      "2/3 / 64) x 64 = 0 for --hidden-size 16; give --ffn-hidden-size N",
      "--rotary-percent must be at most 1 (got 1.5)"};
  for (int k = 0; k < 4; k++) {
    hd_tiny_spec(&spec, d.dir, 3, llama_bad[k]);
    assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
    if (!strstr(err.msg, llama_why[k])) fail_msg("llama case %d: %s", k, err.msg);
  }
  const char *bad_flag[] = {"--no-such-flag", NULL};
  hd_tiny_spec(&spec, d.dir, 3, bad_flag);
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--no-such-flag"));
  Mega__V1__CancelJobRequest creq = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  creq.job_id = "nope";
  ProtobufCMessage *resp = NULL;
  assert_int_equal(mega_rpc_unary(d.ch, &mega_control_cancel_job, &creq.base, 5000, &resp, &err),
                   MEGA_ERR_NOT_FOUND);

  /* garbage bytes on the gRPC port */
  int port = atoi(strrchr(d.addr, ':') + 1);
  for (int k = 0; k < 3; k++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof sa), 0);
    const char junk[] = "GET / HTTP/1.1\r\n\r\n\x00\xff\xfe garbage \x01\x02\x03";
    ssize_t wr = write(s, junk, sizeof junk);
    (void)wr;
    char buf[256];
    ssize_t rd = read(s, buf, sizeof buf); /* whatever it answers, or EOF */
    (void)rd;
    close(s);
  }
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(&d, &err);
  assert_non_null(ln); /* still serving */
  protobuf_c_message_free_unpacked(&ln->base, NULL);

  /* a second daemon on the same port: a clear error, non-zero exit */
  char dir2[128];
  hd_tmpdir(dir2, sizeof dir2);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' serve --listen %s --state-dir %s --slots 1 --worker '%s' 2>&1",
           getenv("MEGAD"), d.addr, dir2, getenv("MEGAW"));
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
  assert_non_null(strstr(out, "cannot listen on"));
  hd_rmdir(dir2);

  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

static void wait_running(hd *d, const char *id, int want_workers, pid_t *pids) {
  if (!hd_wait_workers(d, want_workers, 20000, pids)) {
    hd_dump_log(d);
    fail_msg("the workers of %s did not start", id);
  }
}

/* CancelJob answers once the workers are gone: none is left behind. */
static void test_cancel_leaves_no_worker(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "c1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, d.dir, 100000, extra);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t pids[64];
  wait_running(&d, id, 2, pids);
  usleep(500000);
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = id;
  req.reason = "test";
  ProtobufCMessage *resp = NULL;
  double t0 = hd_now_s();
  assert_int_equal(mega_rpc_unary(d.ch, &mega_control_cancel_job, &req.base, 20000, &resp, &err),
                   MEGA_OK);
  double took = hd_now_s() - t0;
  Mega__V1__Job *j = ((Mega__V1__CancelJobResponse *)resp)->job;
  assert_int_equal(j->state, STATE(CANCELLED));
  assert_non_null(strstr(j->error, "cancelled: test"));
  protobuf_c_message_free_unpacked(resp, NULL);
  for (int i = 0; i < 2; i++) assert_false(hd_pid_alive(pids[i]));
  assert_int_equal(hd_workers(&d, pids, 64), 0);
  fprintf(stderr, "cancel answered in %.2f s\n", took);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* A worker killed with SIGKILL fails the job within seconds, naming the
 * rank and the signal; its peers are aborted. */
static void test_killed_worker_fails_job(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "k1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, d.dir, 100000, extra);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t pids[64];
  wait_running(&d, id, 2, pids);
  usleep(800000);
  double t0 = hd_now_s();
  kill(pids[0], SIGKILL);
  hd_watch w;
  hd_watch_job(&d, id, false, 30000, &w);
  double took = hd_now_s() - t0;
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(FAILED));
  fprintf(stderr, "failed in %.2f s: %s\n", took, w.final->error);
  assert_non_null(strstr(w.final->error, "exited with signal 9 (Killed)"));
  assert_non_null(strstr(w.final->error, "rank "));
  assert_true(took < 10);
  assert_false(hd_pid_alive(pids[0]));
  assert_false(hd_pid_alive(pids[1]));
  hd_watch_free(&w);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

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
  wait_running(&d, run_id, 1, pids);
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

/* megad run --slots 2 --json: one well-formed object per iteration. */
static void test_run_json(void **state) {
  (void)state;
  char dir[128];
  hd_tmpdir(dir, sizeof dir);
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--eval-interval", "2",
                         "--eval-iters", "1", NULL};
  hd_tiny_spec(&spec, dir, 3, extra);
  char cmd[2048];
  int off = snprintf(cmd, sizeof cmd, "'%s' run --slots 2 --json --worker '%s'", getenv("MEGAD"),
                     getenv("MEGAW"));
  for (size_t i = 0; i < spec.n_args; i++)
    off += snprintf(cmd + off, sizeof cmd - (size_t)off, " '%s'", spec.args[i]);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[8192];
  int lines = 0;
  const char *keys[] = {"iteration", "attempt", "loss", "grad_norm", "lr", "step_time_s",
                        "tokens_per_s", "world_size", "ranks"};
  const char *rkeys[] = {"rank", "pp_rank", "dp_rank", "tp_rank", "compute_s", "tp_comm_s",
                         "bubble_s", "p2p_wait_s", "grad_sync_exposed_s", "peak_activation_bytes",
                         "param_bytes", "grad_bytes", "optimizer_state_bytes", "step_time_s",
                         "bubble_warmup_s", "bubble_steady_s", "bubble_cooldown_s",
                         "peak_inflight"};
  while (fgets(line, sizeof line, p)) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    assert_non_null(o);
    /* the evaluation after iteration 2 (--eval-interval 2) is in its line,
     * the one after training (no --split: no test set) in the last's */
    bool eval = lines + 1 == 2, end = lines + 1 == 3;
    size_t nkeys = sizeof keys / sizeof keys[0];
    assert_int_equal(json_object_size(o), eval || end ? nkeys + 1 : nkeys);
    for (size_t k = 0; k < nkeys; k++) assert_non_null(json_object_get(o, keys[k]));
    assert_int_equal(json_integer_value(json_object_get(o, "world_size")), 2);
    if (eval) assert_true(json_real_value(json_object_get(o, "eval_loss")) > 0);
    if (end) assert_true(json_real_value(json_object_get(o, "final_eval_loss")) > 0);
    assert_int_equal(json_integer_value(json_object_get(o, "iteration")), lines + 1);
    json_t *ranks = json_object_get(o, "ranks");
    assert_int_equal(json_array_size(ranks), 2);
    for (size_t r = 0; r < 2; r++) {
      json_t *ro = json_array_get(ranks, r);
      size_t nk = sizeof rkeys / sizeof rkeys[0];
      assert_int_equal(json_object_size(ro), nk);
      for (size_t k = 0; k < nk; k++) assert_non_null(json_object_get(ro, rkeys[k]));
      assert_int_equal(json_integer_value(json_object_get(ro, "pp_rank")), (json_int_t)r);
    }
    json_decref(o);
    lines++;
  }
  int st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(lines, 3);

  /* --simulate-compute computes no loss: each line's loss is null, not 0 */
  const char *sim[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "1:1", NULL};
  hd_tiny_spec(&spec, dir, 2, sim);
  off = snprintf(cmd, sizeof cmd, "'%s' run --slots 2 --json --worker '%s'", getenv("MEGAD"),
                 getenv("MEGAW"));
  for (size_t i = 0; i < spec.n_args; i++)
    off += snprintf(cmd + off, sizeof cmd - (size_t)off, " '%s'", spec.args[i]);
  p = popen(cmd, "r");
  assert_non_null(p);
  lines = 0;
  while (fgets(line, sizeof line, p)) {
    json_t *o = json_loads(line, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_null(json_object_get(o, "loss")));
    assert_true(json_real_value(json_object_get(o, "tokens_per_s")) > 0);
    json_decref(o);
    lines++;
  }
  st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(lines, 2);

  /* a job that fails in its worker: the cause once, exit 1, no temp dir left */
  char bad[256];
  snprintf(bad, sizeof bad, "%s/badckpt", dir);
  mkdir(bad, 0755);
  char latest[300];
  snprintf(latest, sizeof latest, "%s/latest_checkpointed_iteration.txt", bad);
  FILE *lf = fopen(latest, "w");
  fputs("garbage\n", lf);
  fclose(lf);
  const char *fails[] = {"--load", bad, NULL};
  hd_tiny_spec(&spec, dir, 3, fails);
  off = snprintf(cmd, sizeof cmd, "'%s' run --slots 1 --worker '%s'", getenv("MEGAD"),
                 getenv("MEGAW"));
  for (size_t i = 0; i < spec.n_args; i++)
    off += snprintf(cmd + off, sizeof cmd - (size_t)off, " '%s'", spec.args[i]);
  snprintf(cmd + off, sizeof cmd - (size_t)off, " 2>&1");
  p = popen(cmd, "r");
  char all[8192] = "";
  size_t got = fread(all, 1, sizeof all - 1, p);
  all[got] = '\0';
  st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
  const char *first = strstr(all, "one iteration number");
  if (!first) fprintf(stderr, "megad run said: %s\n", all);
  assert_non_null(first);
  assert_null(strstr(first + 1, "one iteration number")); /* said once */
  assert_non_null(strstr(all, "now removed"));
  char tmp[256] = "";
  const char *t = strstr(all, "/tmp/megad-run-");
  if (t) snprintf(tmp, sizeof tmp, "%.21s", t);
  struct stat sb;
  if (tmp[0]) assert_int_not_equal(stat(tmp, &sb), 0);

  /* a bad job: exit 2 with the reason */
  snprintf(cmd, sizeof cmd, "'%s' run --slots 2 --worker '%s' --num-layers 2 2>&1",
           getenv("MEGAD"), getenv("MEGAW"));
  p = popen(cmd, "r");
  char out[2048] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  st = pclose(p);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_non_null(strstr(out, "megad: "));
  hd_rmdir(dir);
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
  wait_running(&n1, id, 1, p1);
  wait_running(&n2, id, 1, p2);
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
      cmocka_unit_test_teardown(test_cluster_trains_across_nodes, teardown),
      cmocka_unit_test_teardown(test_bad_input, teardown),
      cmocka_unit_test_teardown(test_cancel_leaves_no_worker, teardown),
      cmocka_unit_test_teardown(test_killed_worker_fails_job, teardown),
      cmocka_unit_test_teardown(test_restart_replays_journal, teardown),
      cmocka_unit_test_teardown(test_run_json, teardown),
      cmocka_unit_test_teardown(test_node_death_fails_job, teardown),
      cmocka_unit_test_teardown(test_crash_mid_call_says_so, teardown),
      cmocka_unit_test_teardown(test_restarted_node_address_wins, teardown),
      cmocka_unit_test_teardown(test_other_megad_at_old_address, teardown),
  };
  /* one test by name: test_megad NAME (meson runs each as its own test) */
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
