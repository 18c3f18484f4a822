/* megactl plan, run as a user runs it (plan_run.h): the JSON's closed
 * forms, the seed tables, the text form read back, the trace, 80 columns,
 * the errors, a job's whole flag set and --help. The gradient reductions
 * are in test_plan_grad_sync.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_run.h"

/* 1F1B, P=4, M=8, T_f = T_b = 1: makespan (M+P-1)(T_f+T_b) = 22, bubble
 * (P-1)/(M+P-1) = 3/11 on every rank, Megatron's warmup P-rank-1. */
static void json_1f1b_closed_forms(void **state) {
  (void)state;
  result r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                  "--format", "json", NULL);
  json_t *j;
  ok_json(&r, &j);
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "1f1b");
  assert_int_equal(num(j, "pp"), 4);
  assert_int_equal(num(j, "vp"), 1);
  assert_int_equal(num(j, "microbatches"), 8);
  assert_true(fabs(num(j, "makespan") - 22) < 1e-9);
  assert_true(fabs(num(j, "bubble_fraction") - 3.0 / 11) < 1e-9);
  assert_int_equal(json_array_size(json_object_get(j, "schedule_table")), 0);
  json_t *ranks = json_object_get(j, "ranks");
  assert_int_equal(json_array_size(ranks), 4);
  for (int k = 0; k < 4; k++) {
    json_t *rk = json_array_get(ranks, (size_t)k);
    assert_int_equal(num(rk, "rank"), k);
    assert_int_equal(num(rk, "warmup"), 3 - k);
    assert_int_equal(num(rk, "steady"), 8 - (3 - k));
    assert_int_equal(num(rk, "cooldown"), 3 - k);
    assert_int_equal(num(rk, "peak_inflight"), 4 - k);
    assert_true(fabs(num(rk, "busy") - 16) < 1e-9);
    assert_true(fabs(num(rk, "idle") - 6) < 1e-9);
    assert_true(fabs(num(rk, "bubble_fraction") - 3.0 / 11) < 1e-9);
    const char *acts = json_string_value(json_object_get(rk, "actions"));
    assert_non_null(acts);
    assert_non_null(strstr(acts, "F7.0"));
    assert_non_null(strstr(acts, "B7.0"));
  }
  json_decref(j);
  result_free(&r);
}

/* Interleaved, P=4, V=2, M=8 (group N = P): bubble (P-1)/(V*M+P-1) = 3/19,
 * warmup (P-rank-1)*2 + (V-1)*N virtual microbatches, and Megatron's table. */
static void json_interleaved(void **state) {
  (void)state;
  result r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                  "--virtual-pipeline-model-parallel-size", "2", "--format", "json", NULL);
  json_t *j;
  ok_json(&r, &j);
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "interleaved");
  assert_int_equal(num(j, "vp"), 2);
  assert_true(fabs(num(j, "bubble_fraction") - 3.0 / 19) < 1e-9);
  json_t *table = json_object_get(j, "schedule_table");
  assert_int_equal(json_array_size(table), 16);
  static const int want[16][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1},
                                  {4, 0}, {5, 0}, {6, 0}, {7, 0}, {4, 1}, {5, 1}, {6, 1}, {7, 1}};
  for (size_t k = 0; k < 16; k++) {
    json_t *e = json_array_get(table, k);
    assert_int_equal(json_integer_value(json_array_get(e, 0)), want[k][0]);
    assert_int_equal(json_integer_value(json_array_get(e, 1)), want[k][1]);
  }
  json_t *ranks = json_object_get(j, "ranks");
  for (int k = 0; k < 4; k++) {
    json_t *rk = json_array_get(ranks, (size_t)k);
    int warmup = (4 - k - 1) * 2 + (2 - 1) * 4;
    assert_int_equal(num(rk, "warmup"), warmup);
    assert_int_equal(num(rk, "steady"), 16 - warmup);
    assert_int_equal(num(rk, "cooldown"), warmup);
  }
  json_decref(j);
  result_free(&r);
}

/* Each rank's reductions come out in launch order, one per bucket, and the
 * last one's end against the pipeline's drain is the rank's exposed sync. */
static void json_reductions(void **state) {
  (void)state;
  result r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                  "--overlap-grad-reduce", "--t-grad-sync", "12", "--grad-buckets", "3",
                  "--format", "json", NULL);
  json_t *j;
  ok_json(&r, &j);
  json_t *ranks = json_object_get(j, "ranks");
  double drained = 0;
  for (size_t k = 0; k < 4; k++) {
    double w = num(json_array_get(ranks, k), "work_end");
    if (w > drained) drained = w;
  }
  assert_true(drained > 0 && drained <= num(j, "makespan"));
  for (size_t k = 0; k < 4; k++) {
    json_t *rk = json_array_get(ranks, k), *red = json_object_get(rk, "reductions");
    assert_int_equal(json_array_size(red), 3);
    double prev = 0, last = 0;
    for (size_t b = 0; b < 3; b++) {
      double s = json_real_value(json_array_get(json_array_get(red, b), 0));
      double e = json_real_value(json_array_get(json_array_get(red, b), 1));
      assert_true(s >= prev - 1e-9 && e > s);
      prev = e;
      last = e;
    }
    double exposed = last > drained ? last - drained : 0;
    assert_true(fabs(num(rk, "grad_sync_exposed") - exposed) < 1e-9);
  }
  assert_true(num(json_array_get(ranks, 0), "grad_sync_exposed") > 0); /* stage 0's last bucket */
  json_decref(j);
  result_free(&r);
}

/* Seed 000's table: P=2, M=5, V=2, N=3. */
static void seed_schedule_table(void **state) {
  (void)state;
  result r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "5",
                  "--virtual-pipeline-model-parallel-size", "2",
                  "--microbatch-group-size-per-vp-stage", "3", "--format", "json", NULL);
  json_t *j;
  ok_json(&r, &j);
  static const int mb[10] = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4}, ch[10] = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
  json_t *table = json_object_get(j, "schedule_table");
  assert_int_equal(json_array_size(table), 10);
  for (size_t k = 0; k < 10; k++) {
    assert_int_equal(json_integer_value(json_array_get(json_array_get(table, k), 0)), mb[k]);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(table, k), 1)), ch[k]);
  }
  json_decref(j);
  result_free(&r);
}

/* --format schedule, saved and given back with --load, is the same schedule
 * and simulates to the same figures; its rank lines are the JSON actions. */
static void text_form_round_trip(void **state) {
  (void)state;
  const char *kinds[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const char *vp = strcmp(kinds[k], "interleaved") ? "1" : "2";
    result a = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--virtual-pipeline-model-parallel-size", vp, "--schedule", kinds[k],
                    "--format", "schedule", NULL);
    if (a.status) fail_msg("%s: exit %d: %s", kinds[k], a.status, a.err);
    assert_true(!strncmp(a.out, "mega-schedule v1", 16));
    char *file = tmp_path("saved.txt");
    spit(file, a.out);

    result b = plan("--schedule-file", file, "--format", "schedule", NULL);
    assert_int_equal(b.status, 0);
    assert_string_equal(b.out, a.out);

    result gen = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                      "--virtual-pipeline-model-parallel-size", vp, "--schedule", kinds[k],
                      "--format", "json", NULL);
    result load = plan("--schedule-file", file, "--pipeline-model-parallel-size", "4",
                       "--format", "json",
                       NULL);
    json_t *jg, *jl;
    ok_json(&gen, &jg);
    ok_json(&load, &jl);
    assert_true(fabs(num(jg, "makespan") - num(jl, "makespan")) < 1e-9);
    assert_true(fabs(num(jg, "bubble_fraction") - num(jl, "bubble_fraction")) < 1e-9);
    json_t *ranks = json_object_get(jl, "ranks");
    for (size_t i = 0; i < json_array_size(ranks); i++) {
      char line[64];
      snprintf(line, sizeof line, "\n%zu: ", i);
      const char *at = strstr(a.out, line);
      assert_non_null(at);
      at += strlen(line);
      const char *acts = json_string_value(json_object_get(json_array_get(ranks, i), "actions"));
      assert_true(!strncmp(at, acts, strlen(acts)));
      assert_true(at[strlen(acts)] == '\n' || at[strlen(acts)] == '\0');
    }
    json_decref(jg);
    json_decref(jl);
    result_free(&a);
    result_free(&b);
    result_free(&gen);
    result_free(&load);
  }
}

static void trace_parses(void **state) {
  (void)state;
  char *file = tmp_path("trace.json");
  result r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8", "--schedule",
                  "zb-h1", "--format", "trace", "--output", file, NULL);
  if (r.status) fail_msg("exit %d: %s", r.status, r.err);
  assert_string_equal(r.out, "");
  char *text = slurp(file);
  json_t *j = parse_json(text);
  json_t *events = json_object_get(j, "traceEvents");
  assert_true(json_is_array(events));
  int compute = 0, weight = 0, names = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    const char *name = json_string_value(json_object_get(ev, "name"));
    assert_non_null(ph);
    if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) names++;
    if (strcmp(ph, "X")) continue;
    const char *cat = json_string_value(json_object_get(ev, "cat"));
    assert_true(!strcmp(cat, "compute") || !strcmp(cat, "p2p") || !strcmp(cat, "bubble"));
    assert_true(num(ev, "dur") > 0);
    if (!strcmp(cat, "compute")) {
      compute++;
      if (name[0] == 'W') weight++;
      assert_true(json_is_integer(json_object_get(json_object_get(ev, "args"), "microbatch")));
    }
  }
  assert_int_equal(names, 4);
  assert_int_equal(compute, 4 * 8 * 3); /* F, B and W per microbatch and rank */
  assert_int_equal(weight, 4 * 8);
  json_decref(j);
  free(text);
  result_free(&r);
}

static void text_fits_80_columns(void **state) {
  (void)state;
  const char *shapes[][6] = {
      {"4", "8", "1", "1f1b"},  {"4", "8", "2", "interleaved"}, {"4", "8", "1", "zb-h1"},
      {"8", "64", "1", "1f1b"}, {"16", "64", "4", "interleaved"}, {"2", "3", "1", "gpipe"},
      {"1", "4", "1", "no-pipelining"},
  };
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    result r = plan("--pipeline-model-parallel-size", shapes[k][0], "--num-microbatches",
                    shapes[k][1], "--virtual-pipeline-model-parallel-size", shapes[k][2],
                    "--schedule", shapes[k][3], NULL);
    if (r.status) fail_msg("%s: exit %d: %s", shapes[k][3], r.status, r.err);
    assert_non_null(strstr(r.out, "\nrank "));
    assert_non_null(strstr(r.out, "makespan "));
    assert_non_null(strstr(r.out, "mean bubble "));
    for (const char *line = r.out; *line;) {
      const char *nl = strchr(line, '\n');
      size_t len = nl ? (size_t)(nl - line) : strlen(line);
      if (len > 80) fail_msg("%s: a line of %zu columns: %.*s", shapes[k][3], len, (int)len, line);
      line += len + (nl != NULL);
    }
    result_free(&r);
  }
  /* P=4, M=8 fits at one cell per time unit: rank 0 starts with its warmup. */
  result r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8", NULL);
  assert_int_equal(r.status, 0);
  assert_non_null(strstr(r.out, "\nrank 0 F0 F1 F2 F3 "));
  assert_non_null(strstr(r.out, "\nrank 3 ........ F0 B0 F1 B1 "));
  assert_non_null(strstr(r.out, "makespan 22, mean bubble 27.27%"));
  result_free(&r);
}

static void errors(void **state) {
  (void)state;
  expect_error(plan("--pipeline-model-parallel-size", "1", "--num-microbatches", "4",
                    "--virtual-pipeline-model-parallel-size", "2", NULL),
               2, "--virtual-pipeline-model-parallel-size");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--schedule", "pipedream", NULL),
               2, "'pipedream'");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "2",
                    "--virtual-pipeline-model-parallel-size", "2", NULL),
               2, "microbatches");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "eight", NULL),
               2, "--num-microbatches: 'eight' is not a whole number");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "0", NULL), 2,
               "--num-microbatches: '0'");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--t-forward", "-1", NULL),
               2, "--t-forward: '-1'");
  /* a time too large to add up once spun the drawing forever */
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--t-forward", "1e308", NULL),
               2, "--t-forward: '1e308' is not a time (a number from 0 to 1e+12)");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--t-backward", "inf", NULL),
               2, "--t-backward: 'inf' is not a time");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--t-grad-sync", "1e12", "--grad-sync-slowdown", "1e300,1e300", NULL),
               2, "the times given add up past any number");
  /* a typo of a bucket count is refused at once, not a minute and 19 GB later */
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--t-grad-sync", "1", "--grad-buckets", "1000000000", NULL),
               2, "--grad-buckets 1000000000: pp 4 x vp 1 x 1000000000 buckets is 4000000000 "
                  "reductions, more than this planner handles (1048576)");
  /* a plan refused after its schedule is built leaves --output as it was */
  char *kept = tmp_path("kept.json");
  spit(kept, "an earlier plan\n");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--grad-buckets", "4", "--format", "json", "--output", kept, NULL),
               2, "--grad-buckets divides the gradient reductions");
  char *text = slurp(kept);
  assert_string_equal(text, "an earlier plan\n");
  free(text);
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8", "--output",
                    tmp_path("no-such-dir/plan.txt"), NULL),
               1, "cannot write");
  expect_error(plan("--pipeline-model-parallel-size", "4", NULL), 2,
               "--num-microbatches is required");
  expect_error(plan("--num-microbatches", "8", NULL), 2,
               "--pipeline-model-parallel-size is required");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8", "--pp",
                    "2", NULL),
               2, "unknown flag '--pp'");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", NULL), 2,
               "--num-microbatches needs a value");
  expect_error(plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
                    "--format", "svg", NULL),
               2, "--format: 'svg'");
  expect_error(plan("4", NULL), 2, "unexpected argument '4'");
  expect_error(plan("--schedule-file", tmp_path("no-such-file"), NULL), 1,
               "No such file or directory");

  char *bad = tmp_path("bad.txt");
  spit(bad, "mega-schedule v1 kind=custom pp=2 vp=1 microbatches=1 group=2\n"
            "0: F0.0 SF0.0 RB0.0 B0.0\n"
            "1: RF0.0 F0.0 X0.0 SB0.0\n");
  expect_error(plan("--schedule-file", bad, NULL), 1, "line 3");

  /* Parses, but rank 1 never sends the gradient rank 0 waits for. */
  spit(bad, "mega-schedule v1 kind=custom pp=2 vp=1 microbatches=1 group=2\n"
            "0: F0.0 SF0.0 RB0.0 B0.0\n"
            "1: RF0.0 F0.0 B0.0\n");
  expect_error(plan("--schedule-file", bad, NULL), 1, "is not a valid schedule");

  spit(bad, "mega-schedule v1 kind=custom pp=2 vp=1 microbatches=1 group=2\n"
            "0: F0.0 SF0.0 RB0.0 B0.0\n"
            "1: RF0.0 F0.0 B0.0 SB0.0\n");
  expect_error(plan("--schedule-file", bad, "--pipeline-model-parallel-size", "4", NULL), 2,
               "--pipeline-model-parallel-size 4 disagrees with");
  result ok = plan("--schedule-file", bad, "--format", "json", NULL);
  assert_int_equal(ok.status, 0);
  result_free(&ok);
}

/* A job's whole flag set (issue 24): plan takes PP, VP and the
 * microbatches from the batch sizes and DP, ignores model, data and
 * checkpoint flags, and --load stays the checkpoint. */
static void job_flags(void **state) {
  (void)state;
  /* Megatron's pretrain_gpt_distributed_with_mp.sh on 8 GPUs: TP 2 x PP 2,
   * DP 2, 16 / (4 x 2) = 2 microbatches */
  result r = plan("--nnodes", "1", "--nproc-per-node", "8", "--tensor-model-parallel-size", "2",
                  "--pipeline-model-parallel-size", "2", "--num-layers", "24", "--hidden-size",
                  "1024", "--num-attention-heads", "16", "--micro-batch-size", "4",
                  "--global-batch-size", "16", "--seq-length", "1024", "--train-iters", "500000",
                  "--lr-decay-iters", "320000", "--save", "/ckpt", "--load", "/ckpt",
                  "--data-path", "corpus_text_document", "--vocab-file", "gpt2-vocab.json",
                  "--merge-file", "gpt2-merges.txt", "--split", "949,50,1", "--lr", "0.00015",
                  "--distributed-backend", "nccl", "--format", "json", NULL);
  json_t *j;
  ok_json(&r, &j);
  assert_int_equal(num(j, "pp"), 2);
  assert_int_equal(num(j, "microbatches"), 2);
  json_decref(j);
  result_free(&r);
  /* without a world, DP 1; VP from the job's flags */
  r = plan("--pipeline-model-parallel-size", "2", "--num-layers", "8",
           "--num-layers-per-virtual-pipeline-stage", "2", "--micro-batch-size", "1",
           "--global-batch-size", "4", "--format", "json", NULL);
  ok_json(&r, &j);
  assert_int_equal(num(j, "vp"), 2);
  assert_int_equal(num(j, "microbatches"), 4);
  assert_string_equal(json_string_value(json_object_get(j, "schedule")), "interleaved");
  json_decref(j);
  result_free(&r);
  expect_error(plan("--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
                    "--global-batch-size", "4", "--num-microbatches", "3", NULL),
               2, "--num-microbatches 3 disagrees with --global-batch-size 4");
  expect_error(plan("--pipeline-model-parallel-size", "2", "--global-batch-size", "4", NULL), 2,
               "--global-batch-size needs --micro-batch-size");
  char *file = tmp_path("sched.txt");
  spit(file, "x\n");
  expect_error(plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "4", "--load",
                    file, NULL),
               2, "give a schedule's text form with --schedule-file FILE");
  expect_error(plan("--pipeline-parallel-size", "2", NULL), 2,
               "did you mean --pipeline-model-parallel-size?");
  expect_error(plan("--fp16", NULL), 2, "use --bf16");
}

static void help(void **state) {
  (void)state;
  result r = plan("--help", NULL);
  assert_int_equal(r.status, 0);
  assert_true(!strncmp(r.out, "usage: megactl plan", 19));
  result_free(&r);
}

int main(int argc, char **argv) {
  if (plan_init(argc, argv)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(json_1f1b_closed_forms), cmocka_unit_test(json_interleaved),
      cmocka_unit_test(json_reductions),
      cmocka_unit_test(seed_schedule_table),    cmocka_unit_test(text_form_round_trip),
      cmocka_unit_test(trace_parses),           cmocka_unit_test(text_fits_80_columns),
      cmocka_unit_test(errors),                 cmocka_unit_test(help),
      cmocka_unit_test(job_flags),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return failed + plan_cleanup();
}
