/* megactl ls, status and nodes output from constructed messages, and the
 * JSON forms (proto/pb_json) that watch/status/ls/nodes --json print. */
#include <setjmp.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "client/tables.h"
#include "client/view.h"
#include "proto/pb_json.h"

#define NOW 1700000000000LL /* 2023-11-14 22:13:20 UTC */

typedef struct job_fx {
  Mega__V1__Job job;
  Mega__V1__JobSpec spec;
  Mega__V1__NodeRanks nr[2], *nrp[2];
  uint32_t r0[2], r1[2];
  char *args[4];
} job_fx;

static void make_job(job_fx *fx, const char *id, const char *name, Mega__V1__JobState state) {
  mega__v1__job__init(&fx->job);
  mega__v1__job_spec__init(&fx->spec);
  fx->job.id = (char *)id;
  fx->job.name = (char *)name;
  fx->job.state = state;
  fx->job.spec = &fx->spec;
  fx->job.train_iters = 1000;
  fx->job.created_unix_ms = NOW - 125 * 1000;
  fx->args[0] = "--num-layers";
  fx->args[1] = "2";
  fx->args[2] = "--train-iters";
  fx->args[3] = "1000";
  fx->spec.args = fx->args;
  fx->spec.n_args = 4;
  fx->spec.nproc_per_node = 2;
  fx->spec.nnodes_min = 2;
}

static void place(job_fx *fx) {
  fx->job.world_size = 4;
  fx->job.tp = 1;
  fx->job.pp = 2;
  fx->job.dp = 2;
  fx->job.vp = 1;
  fx->job.last_iteration = 120;
  fx->job.started_unix_ms = NOW - 65 * 1000;
  fx->job.coordinator_node_id = "n1";
  for (int i = 0; i < 2; i++) {
    mega__v1__node_ranks__init(&fx->nr[i]);
    fx->nrp[i] = &fx->nr[i];
  }
  fx->r0[0] = 0, fx->r0[1] = 1, fx->r1[0] = 2, fx->r1[1] = 3;
  fx->nr[0].node_id = "n1";
  fx->nr[0].ranks = fx->r0;
  fx->nr[0].n_ranks = 2;
  fx->nr[1].node_id = "n2";
  fx->nr[1].ranks = fx->r1;
  fx->nr[1].n_ranks = 2;
  fx->job.placement = fx->nrp;
  fx->job.n_placement = 2;
}

static void test_jobs_table(void **state) {
  (void)state;
  job_fx a, b;
  make_job(&a, "j-2", "tiny", MEGA__V1__JOB_STATE__JOB_STATE_RUNNING);
  place(&a);
  make_job(&b, "j-1", "", MEGA__V1__JOB_STATE__JOB_STATE_PENDING);
  b.job.created_unix_ms = NOW - 3 * 86400 * 1000LL;
  Mega__V1__Job *jobs[] = {&a.job, &b.job};
  char *buf = NULL;
  size_t len;
  FILE *f = open_memstream(&buf, &len);
  tables_jobs(f, jobs, 2, NOW);
  tables_jobs(f, jobs, 0, NOW);
  fclose(f);
  assert_string_equal(buf,
                      "ID   NAME  STATE    WORLD  TP/PP/DP  ITER      AGE\n"
                      "j-2  tiny  running  4      1/2/2     120/1000  2m\n"
                      "j-1  -     pending  -      -         0/1000    3d\n"
                      "no jobs\n");
  free(buf);
}

/* Text from megad reaches the terminal escaped: a name or an error with a
 * newline or an escape sequence cannot forge lines or colors. */
static void test_control_characters_escaped(void **state) {
  (void)state;
  job_fx a;
  make_job(&a, "j-1", "bad\nname\x1b[31mred", MEGA__V1__JOB_STATE__JOB_STATE_FAILED);
  a.job.error = "boom\r\x7f\xc2\x9b" "2J";
  Mega__V1__Job *jobs[] = {&a.job};
  char *buf = NULL;
  size_t len;
  FILE *f = open_memstream(&buf, &len);
  tables_jobs(f, jobs, 1, NOW);
  tables_job_detail(f, &a.job, NOW);
  fclose(f);
  assert_null(strchr(buf, '\x1b'));
  assert_null(strchr(buf, '\r'));
  assert_null(strchr(buf, '\x7f'));
  assert_null(strstr(buf, "\xc2\x9b"));
  assert_non_null(strstr(buf, "j-1  bad\\nname\\x1b[31mred  failed"));
  assert_non_null(strstr(buf, "name         bad\\nname\\x1b[31mred\n"));
  assert_non_null(strstr(buf, "error        boom\\r\\x7f\\u009b2J\n"));
  free(buf);
  char small[8];
  assert_string_equal(view_escape("a\x1b[31m", small, sizeof small), "a\\x1b[3");
  assert_string_equal(view_escape("h\xc3\xa9llo", small, sizeof small), "h\xc3\xa9llo");
}

static void test_job_detail(void **state) {
  (void)state;
  setenv("TZ", "UTC", 1);
  tzset();
  job_fx a;
  make_job(&a, "j-2", "tiny", MEGA__V1__JOB_STATE__JOB_STATE_FAILED);
  place(&a);
  a.job.error = "rank 3 exited with signal 9";
  a.job.ended_unix_ms = NOW - 5000;
  a.job.attempt = 1;
  a.job.vp = 2;
  char *buf = NULL;
  size_t len;
  FILE *f = open_memstream(&buf, &len);
  tables_job_detail(f, &a.job, NOW);
  fclose(f);
  assert_string_equal(buf,
                      "job          j-2\n"
                      "name         tiny\n"
                      "state        failed\n"
                      "error        rank 3 exited with signal 9\n"
                      "world        4 = TP 1 x PP 2 x DP 2, VP 2\n"
                      "progress     120/1000 iterations\n"
                      "attempt      1\n"
                      "created      2023-11-14 22:11:15 (2m ago)\n"
                      "started      2023-11-14 22:12:15 (65s ago)\n"
                      "ended        2023-11-14 22:13:15 (5s ago)\n"
                      "runtime      1m00s\n"
                      "coordinator  n1\n"
                      "placement    n1: ranks 0-1\n"
                      "             n2: ranks 2-3\n"
                      "nodes        2, 2 ranks each\n"
                      "args         --num-layers 2 --train-iters 1000\n");
  free(buf);
}

static void test_nodes_table(void **state) {
  (void)state;
  Mega__V1__Node n1 = MEGA__V1__NODE__INIT, n2 = MEGA__V1__NODE__INIT;
  n1.id = "n1";
  n1.address = "10.0.0.1:7070";
  n1.state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  n1.slots = 8;
  n1.slots_used = 4;
  n1.backend = "cuda";
  n1.device_name = "NVIDIA H100 80GB HBM3";
  n1.last_heartbeat_unix_ms = NOW - 1000;
  n1.version = "0.1.0+ef1e627abcd1";
  char *jobs[] = {"j-1", "j-2"};
  n1.job_ids = jobs;
  n1.n_job_ids = 2;
  n2.id = "n2";
  n2.address = "10.0.0.2:7070";
  n2.state = MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT;
  n2.slots = 4;
  n2.backend = "cpu";
  n2.version = n1.version;
  Mega__V1__Node *nodes[] = {&n1, &n2};
  char *buf = NULL;
  size_t len;
  FILE *f = open_memstream(&buf, &len);
  tables_nodes(f, nodes, 2, "n2", NOW);
  fclose(f);
  assert_string_equal(buf,
                      "ID   ADDRESS        STATE    BACKEND  SLOTS  DEVICE                 "
                      "HEARTBEAT  VERSION             JOBS\n"
                      "n1   10.0.0.1:7070  alive    cuda     4/8    NVIDIA H100 80GB HBM3  "
                      "1s         0.1.0+ef1e627abcd1  j-1,j-2\n"
                      "*n2  10.0.0.2:7070  suspect  cpu      0/4    -                      "
                      "-          0.1.0+ef1e627abcd1  -\n");
  free(buf);
  /* half way through a rolling upgrade: a line says what that means */
  n2.version = "0.1.0";
  f = open_memstream(&buf, &len);
  tables_nodes(f, nodes, 2, "n2", NOW);
  fclose(f);
  assert_non_null(strstr(buf, "  -\n2 builds of mega run here: a job's ranks run one "
                              "build, on nodes of its coordinator's"));
  free(buf);
}

/* What megactl adds to megad's refusal of a job when they are two builds. */
static void test_other_build_hint(void **state) {
  (void)state;
  char b[400];
  tables_other_build("0.1.0+abc", "0.1.0+abc", b, sizeof b);
  assert_string_equal(b, "");
  tables_other_build("0.1.0", "0.1.0+abc", b, sizeof b);
  assert_string_equal(b, " (megad is mega 0.1.0, and this megactl mega 0.1.0+abc: a flag one "
                         "build takes and the other does not is refused; use the megactl of "
                         "megad's build, or upgrade megad)");
  tables_other_build("", "0.1.0+abc", b, sizeof b);
  assert_non_null(strstr(b, "megad is mega of a build that does not name its version"));
}

static void test_ranks_and_ages(void **state) {
  (void)state;
  char b[64];
  uint32_t r[] = {0, 1, 2, 3, 6, 8, 9};
  tables_ranks(r, 7, b, sizeof b);
  assert_string_equal(b, "0-3,6,8-9");
  tables_ranks(r, 0, b, sizeof b);
  assert_string_equal(b, "");
  tables_ranks(r, 7, b, 5); /* cut, still terminated */
  assert_int_equal(strlen(b), 4);
  tables_age(0, NOW, b, sizeof b);
  assert_string_equal(b, "-");
  tables_age(NOW + 5000, NOW, b, sizeof b); /* a clock ahead of ours */
  assert_string_equal(b, "0s");
  tables_age(NOW - 3 * 3600 * 1000LL, NOW, b, sizeof b);
  assert_string_equal(b, "3h");
}

/* ---- JSON ---- */

static void test_step_metrics_json_keys(void **state) {
  (void)state;
  Mega__V1__StepMetrics m = MEGA__V1__STEP_METRICS__INIT;
  Mega__V1__RankMetrics r = MEGA__V1__RANK_METRICS__INIT, *rp = &r;
  m.iteration = 3;
  m.loss = NAN;
  m.grad_norm = 0.5;
  m.lr = 1e-4;
  m.step_time_s = 0.25;
  m.tokens_per_s = 256;
  m.attempt = 2;          /* which attempt merged it: a restart redoes iterations */
  m.time_unix_ms = 12345; /* nor this */
  m.ranks = &rp;
  m.n_ranks = 1;
  r.rank = 1;
  r.pp_rank = 1;
  r.dp_rank = 0;
  r.tp_rank = 0;
  r.compute_s = 0.2;
  r.bubble_s = 0.05;
  r.bubble_warmup_s = 0.05;
  r.step_time_s = 0.25;
  r.peak_inflight = 2;
  r.p2p_wait_s = 0.01;
  r.grad_sync_exposed_s = 0.002;
  r.peak_activation_bytes = 1ull << 40;
  r.param_bytes = 4000;
  r.grad_bytes = 4000;
  r.optimizer_state_bytes = 4000;
  json_t *j = mega_step_metrics_json(&m);
  assert_non_null(j);
  char *s = json_dumps(j, JSON_COMPACT);
  assert_string_equal(s,
                      "{\"iteration\":3,\"attempt\":2,\"loss\":null,\"grad_norm\":0.5,\"lr\":0.0001,"
                      "\"step_time_s\":0.25,\"tokens_per_s\":256.0,\"world_size\":1,"
                      "\"ranks\":[{\"rank\":1,"
                      "\"pp_rank\":1,\"dp_rank\":0,\"tp_rank\":0,\"compute_s\":0.20000000000000001,"
                      "\"tp_comm_s\":0.0,\"bubble_s\":0.050000000000000003,\"p2p_wait_s\":0.01,"
                      "\"grad_sync_exposed_s\":0.002,\"peak_activation_bytes\":1099511627776,"
                      "\"param_bytes\":4000,\"grad_bytes\":4000,\"optimizer_state_bytes\":4000,"
                      "\"step_time_s\":0.25,\"bubble_warmup_s\":0.050000000000000003,"
                      "\"bubble_steady_s\":0.0,\"bubble_cooldown_s\":0.0,\"peak_inflight\":2}]}");
  free(s);
  json_decref(j);

  /* an evaluation's loss and a skipped step are there when they happened, as
   * in megaw --json (the watcher of a job would not see its eval loss) */
  m.has_eval_loss = true;
  m.eval_loss = 2.5;
  m.skipped = true;
  j = mega_step_metrics_json(&m);
  assert_non_null(j);
  assert_true(json_real_value(json_object_get(j, "eval_loss")) == 2.5);
  assert_true(json_is_true(json_object_get(j, "skipped")));
  json_decref(j);
  m.has_eval_loss = false;
  m.skipped = false;
  /* no rank computed a loss (--simulate-compute): null, not 0 */
  m.loss = 0;
  m.no_loss = true;
  j = mega_step_metrics_json(&m);
  assert_non_null(j);
  assert_true(json_is_null(json_object_get(j, "loss")));
  json_decref(j);
  m.no_loss = false;

  char *line = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&line, &len);
  assert_true(mega_step_metrics_write(f, &m));
  fclose(f);
  assert_int_equal(line[len - 1], '\n');
  assert_null(strchr(line, ' '));
  json_t *back = json_loads(line, 0, NULL);
  assert_non_null(back);
  assert_true(json_real_value(json_object_get(json_array_get(json_object_get(back, "ranks"), 0),
                                              "compute_s")) == 0.2);
  json_decref(back);
  free(line);
}

static void test_generic_json(void **state) {
  (void)state;
  job_fx a;
  make_job(&a, "j-2", "tiny", MEGA__V1__JOB_STATE__JOB_STATE_RUNNING);
  place(&a);
  json_t *j = mega_pb_json(&a.job.base);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "id")), "j-2");
  assert_string_equal(json_string_value(json_object_get(j, "state")), "JOB_STATE_RUNNING");
  assert_int_equal(json_integer_value(json_object_get(j, "created_unix_ms")), NOW - 125000);
  assert_string_equal(json_string_value(json_object_get(j, "error")), ""); /* defaults too */
  json_t *spec = json_object_get(j, "spec");
  assert_int_equal(json_array_size(json_object_get(spec, "args")), 4);
  assert_string_equal(json_string_value(json_array_get(json_object_get(spec, "args"), 0)),
                      "--num-layers");
  json_t *pl = json_object_get(j, "placement");
  assert_int_equal(json_array_size(pl), 2);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(json_array_get(pl, 1), "ranks"), 1)), 3);
  json_decref(j);

  /* A oneof shows only its member; an unset message field is null. */
  Mega__V1__WatchJobResponse w = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  Mega__V1__JobEvent e = MEGA__V1__JOB_EVENT__INIT;
  e.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED;
  e.message = "ok";
  w.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  w.event = &e;
  j = mega_pb_json(&w.base);
  char *s = json_dumps(j, JSON_COMPACT);
  assert_string_equal(s,
                      "{\"event\":{\"time_unix_ms\":0,\"kind\":\"JOB_EVENT_KIND_PLACED\","
                      "\"message\":\"ok\",\"node_id\":\"\",\"has_rank\":false,\"rank\":0,"
                      "\"attempt\":0,\"number\":0}}");
  free(s);
  json_decref(j);
  Mega__V1__GetJobResponse g = MEGA__V1__GET_JOB_RESPONSE__INIT;
  j = mega_pb_json(&g.base);
  assert_true(json_is_null(json_object_get(j, "job")));
  json_decref(j);

  /* Bytes as base64, for every length modulo 3. */
  Mega__V1__TraceChunk c = MEGA__V1__TRACE_CHUNK__INIT;
  const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; i++) {
    c.data.data = (uint8_t *)in[i];
    c.data.len = strlen(in[i]);
    j = mega_pb_json(&c.base);
    assert_string_equal(json_string_value(json_object_get(j, "data")), out[i]);
    json_decref(j);
  }
}

/* Found by fuzzing (fuzz_pb_json): a string that is not UTF-8 (protobuf-c
 * does not check what the wire brings) made mega_pb_json return NULL, as if
 * out of memory. It is shown with U+FFFD for the bad bytes. */
static void test_json_bad_utf8(void **state) {
  (void)state;
  Mega__V1__JobEvent e = MEGA__V1__JOB_EVENT__INIT;
  e.message = "attemp\x8c\xdf\xce\xe9" "ended";
  json_t *j = mega_pb_json(&e.base);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "message")),
                      "attemp\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "ended");
  json_decref(j);
  e.message = "caf\xc3\xa9"; /* valid: kept as it is */
  j = mega_pb_json(&e.base);
  assert_string_equal(json_string_value(json_object_get(j, "message")), "caf\xc3\xa9");
  json_decref(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jobs_table),
      cmocka_unit_test(test_job_detail),
      cmocka_unit_test(test_control_characters_escaped),
      cmocka_unit_test(test_nodes_table),
      cmocka_unit_test(test_other_build_hint),
      cmocka_unit_test(test_ranks_and_ages),
      cmocka_unit_test(test_step_metrics_json_keys),
      cmocka_unit_test(test_generic_json),
      cmocka_unit_test(test_json_bad_utf8),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
