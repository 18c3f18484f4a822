/* megad end to end, one daemon and its client: real megad on 127.0.0.1
 * with a port and state dir of its own, real megaw workers training a tiny
 * GPT, a small C client on proto/rpc_client. Bad input, cancel, a killed
 * worker, a crash in the middle of a call, and `megad run --json`.
 * Several nodes: test_megad_cluster.c; restarts: test_megad_restart.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
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
  hd_ranks_started(&d, id, 2, pids);
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
 * rank and the signal, and what sends a SIGKILL megad did not (the kernel's
 * out-of-memory killer); its peers are aborted. */
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
  hd_ranks_started(&d, id, 2, pids);
  usleep(800000);
  double t0 = hd_now_s();
  kill(pids[0], SIGKILL);
  hd_watch w;
  hd_watch_job(&d, id, false, 30000, &w);
  double took = hd_now_s() - t0;
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(FAILED));
  fprintf(stderr, "failed in %.2f s: %s\n", took, w.final->error);
  assert_true(hd_text_ok("the job's error", w.final->error,
                         HD_ALL("rank ", "exited with signal 9 (Killed)", "out-of-memory killer",
                                "journalctl -k", "a smaller --micro-batch-size)"),
                         NULL));
  assert_true(took < 10);
  assert_false(hd_pid_alive(pids[0]));
  assert_false(hd_pid_alive(pids[1]));
  hd_watch_free(&w);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* megad run --slots 2 --json: one well-formed object per iteration. */
/* `megad run` of spec's flags on one slot; its stdout and stderr in out,
 * its exit status returned (-1 if it did not exit). */
static int megad_run(const Mega__V1__JobSpec *spec, char *out, size_t len) {
  char cmd[4096];
  int off = snprintf(cmd, sizeof cmd, "'%s' run --slots 1 --worker '%s'", getenv("MEGAD"),
                     getenv("MEGAW"));
  for (size_t i = 0; i < spec->n_args; i++)
    off += snprintf(cmd + off, sizeof cmd - (size_t)off, " '%s'", spec->args[i]);
  snprintf(cmd + off, sizeof cmd - (size_t)off, " 2>&1");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t got = fread(out, 1, len - 1, p);
  out[got] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

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
  char all[8192];
  assert_int_equal(megad_run(&spec, all, sizeof all), 1);
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

/* A job whose --load is already at --train-iters trains nothing and ends
 * well; its history says so, rather than a bare "after 0 iterations". */
static void test_run_nothing_to_train_says_so(void **state) {
  (void)state;
  char dir[128], ckpt[256];
  hd_tmpdir(dir, sizeof dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  const char *extra[] = {"--save", ckpt, "--load", ckpt, NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, dir, 2, extra);
  char out[8192];
  assert_int_equal(megad_run(&spec, out, sizeof out), 0);
  assert_null(strstr(out, "nothing to train"));
  assert_int_equal(megad_run(&spec, out, sizeof out), 0);
  char want[512];
  snprintf(want, sizeof want, "already at iteration 2 of 2 in %s/iter_0000002: nothing to train",
           ckpt);
  if (!strstr(out, want)) fprintf(stderr, "megad run said:\n%s", out);
  assert_non_null(strstr(out, want));
  hd_rmdir(dir);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_bad_input, teardown),
      cmocka_unit_test_teardown(test_cancel_leaves_no_worker, teardown),
      cmocka_unit_test_teardown(test_killed_worker_fails_job, teardown),
      cmocka_unit_test_teardown(test_run_json, teardown),
      cmocka_unit_test_teardown(test_run_nothing_to_train_says_so, teardown),
      cmocka_unit_test_teardown(test_crash_mid_call_says_so, teardown),
  };
  /* one test by name: test_megad NAME (meson runs each as its own test) */
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
