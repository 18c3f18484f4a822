/* megactl plan's gradient reductions, run as a user runs it (plan_run.h):
 * GS and GW placed by the flags, the exposed part predicted (buckets,
 * lanes, latency, bucket sizes, measured slowdowns), and every flag of the
 * reductions refused where it would change nothing. */
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

/* Seed 003 in the plan: GS/GW placed by the flags, the reduction drawn on
 * a row of its own, the exposed part predicted. */
static void grad_sync(void **state) {
  (void)state;
  result r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
                  "--overlap-grad-reduce", "--format", "schedule", NULL);
  assert_int_equal(r.status, 0);
  assert_non_null(strstr(r.out, "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0 GW0.0\n"));
  assert_non_null(strstr(r.out, "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 GS0.0 SB1.0 GW0.0\n"));
  result_free(&r);
  /* 1F1B P=2 M=2: rank 0's work ends at 6; a reduction of 1 in 4 buckets,
   * 3 of them launched during its last backward, leaves 0.25 exposed; rank
   * 1's ends in the drain (its norm does not wait for the tied sum). */
  json_t *j;
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
           "--overlap-grad-reduce", "--t-grad-sync", "1", "--grad-buckets", "4", "--format",
           "json", NULL);
  ok_json(&r, &j);
  assert_true(fabs(num(j, "grad_sync_exposed") - 0.125) < 1e-9);
  assert_true(fabs(num(j, "makespan") - 6.25) < 1e-9);
  json_t *r0 = json_array_get(json_object_get(j, "ranks"), 0);
  assert_true(fabs(num(r0, "grad_sync_exposed") - 0.25) < 1e-9);
  json_decref(j);
  result_free(&r);
  /* Two stages' reductions at once on one lane run at half speed: more
   * of rank 0's is exposed than on links of its own. */
  double own = 0;
  for (int shared = 0; shared < 2; shared++) {
    const char *lanes = shared ? "--grad-sync-lanes=1" : "--grad-buckets=4";
    r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
             "--overlap-grad-reduce", "--t-grad-sync", "4", "--grad-buckets", "4", "--format",
             "json", lanes, NULL);
    ok_json(&r, &j);
    json_t *cost = json_object_get(j, "cost");
    assert_true(fabs(num(cost, "grad_sync_lanes") - shared) < 1e-9);
    double e = num(json_array_get(json_object_get(j, "ranks"), 0), "grad_sync_exposed");
    if (!shared) own = e;
    else assert_true(e > own + 0.5);
    json_decref(j);
    result_free(&r);
  }
  refused(plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
               "--grad-sync-lanes", "0.5", NULL),
          "under 1");
  /* after the schedule: all of it exposed on rank 0, none on rank 1 */
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2", "--t-grad-sync", "1",
           "--format", "json", NULL);
  ok_json(&r, &j);
  assert_true(fabs(num(j, "grad_sync_exposed") - 0.5) < 1e-9);
  json_decref(j);
  result_free(&r);
  /* a latency per collective: rank 0's one bucket, 0.25 on top (the tied
   * embedding's sum is in its bucket; core/sim's test has the cases) */
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2", "--t-grad-sync", "1",
           "--grad-sync-latency", "0.25", "--format", "json", NULL);
  ok_json(&r, &j);
  assert_true(fabs(num(json_object_get(j, "cost"), "grad_sync_latency") - 0.25) < 1e-9);
  assert_true(fabs(num(json_array_get(json_object_get(j, "ranks"), 0), "grad_sync_exposed") -
                   1.25) < 1e-9);
  json_decref(j);
  result_free(&r);
  /* the engine's bucket sizes: 3:1 exposes rank 0's last quarter after
   * what is left of its first (0.75; core/sim's test has the cases) */
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
           "--overlap-grad-reduce", "--t-grad-sync", "1", "--grad-bucket-sizes", "3000,1000",
           "--format", "json", NULL);
  ok_json(&r, &j);
  json_t *cost = json_object_get(j, "cost");
  assert_int_equal(json_integer_value(json_object_get(cost, "grad_buckets")), 2);
  assert_true(fabs(json_real_value(json_array_get(json_object_get(cost, "grad_bucket_sizes"), 1)) -
                   1000) < 1e-9);
  assert_true(
      fabs(num(json_array_get(json_object_get(j, "ranks"), 0), "grad_sync_exposed") - 0.75) < 1e-9);
  json_decref(j);
  result_free(&r);
  const char *bad[][2] = {{"1,,2", "not a list of sizes"},
                          {"1,-2", "not a list of sizes"},
                          {"0,0", "adds up to nothing"}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    refused(
        plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
             "--overlap-grad-reduce", "--t-grad-sync", "1", "--grad-bucket-sizes", bad[k][0], NULL),
        bad[k][1]);
  }
  refused(plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
               "--overlap-grad-reduce", "--t-grad-sync", "1", "--grad-bucket-sizes", "1,2",
               "--grad-buckets", "3", NULL),
          "disagree");
  /* sharing as measured: {1, 2} is one lane's; {1, 1.5} slows two at once
   * less (core/sim's test has the cases); given with lanes, refused */
  const char *slow[][2] = {{"1,2", "2.75"}, {"1,1.5", "2.25"}};
  for (size_t k = 0; k < 2; k++) {
    r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
             "--overlap-grad-reduce", "--t-grad-sync", "2", "--grad-bucket-sizes", "3,1",
             "--grad-sync-slowdown", slow[k][0], "--format", "json", NULL);
    ok_json(&r, &j);
    assert_int_equal(
        json_array_size(json_object_get(json_object_get(j, "cost"), "grad_sync_slowdown")), 2);
    assert_true(fabs(num(json_array_get(json_object_get(j, "ranks"), 0), "grad_sync_exposed") -
                     atof(slow[k][1])) < 1e-9);
    json_decref(j);
    result_free(&r);
  }
  refused(
      plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
           "--overlap-grad-reduce", "--t-grad-sync", "2", "--grad-sync-slowdown", "1,0.5", NULL),
      "not a list of slowdowns");
  refused(plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
               "--overlap-grad-reduce", "--t-grad-sync", "2", "--grad-sync-slowdown", "1,2",
               "--grad-sync-lanes", "2", NULL),
          "give one of them");
  refused(plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
               "--grad-bucket-sizes", "1,2", NULL),
          "divides the gradient reductions");
  /* with no reduction in the schedule it would cost nothing: refused */
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
           "--grad-sync-latency", "0.25", NULL);
  assert_int_equal(r.status, 2);
  assert_non_null(strstr(r.err, "give --t-grad-sync or --overlap-grad-reduce"));
  result_free(&r);
  /* so is every other flag of the reductions: each once changed nothing */
  const char *idle[][2] = {{"--grad-buckets", "4"}, {"--grad-sync-lanes", "2"},
                           {"--grad-sync-slowdown", "1,2"}};
  for (size_t k = 0; k < sizeof idle / sizeof idle[0]; k++) {
    r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2", idle[k][0],
             idle[k][1], NULL);
    assert_int_equal(r.status, 2);
    assert_true(!strncmp(r.err + strlen("megactl plan: "), idle[k][0], strlen(idle[k][0])));
    assert_non_null(strstr(r.err, "this schedule has none: give --t-grad-sync"));
    result_free(&r);
  }
  /* a schedule file places its own reductions: the flags that would add
   * them to a generated one cannot add them to a file without */
  char *file = tmp_path("nosync.txt");
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2", "--format",
           "schedule", "--output", file, NULL);
  assert_int_equal(r.status, 0);
  result_free(&r);
  const char *placing[][2] = {{"--overlap-grad-reduce", NULL}, {"--t-grad-sync", "2"}};
  for (size_t k = 0; k < sizeof placing / sizeof placing[0]; k++) {
    r = plan("--schedule-file", file, placing[k][0], placing[k][1], NULL);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, placing[k][0]));
    assert_non_null(strstr(r.err, "add GS and GW actions to the --schedule-file"));
    result_free(&r);
  }
  r = plan("--pipeline-model-parallel-size", "4", "--num-microbatches", "8",
           "--virtual-pipeline-model-parallel-size", "2", "--overlap-grad-reduce",
           "--align-grad-reduce", "--t-grad-sync", "2", NULL);
  assert_int_equal(r.status, 0);
  assert_non_null(strstr(r.out, "\n    dp "));
  assert_non_null(strstr(r.out, "="));
  assert_non_null(strstr(r.out, "mean exposed grad sync "));
  for (const char *line = r.out; *line;) {
    const char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    if (len > 80) fail_msg("a line of %zu columns: %.*s", len, (int)len, line);
    line += len + (nl != NULL);
  }
  result_free(&r);
  r = plan("--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
           "--align-grad-reduce", NULL);
  assert_int_equal(r.status, 2);
  assert_non_null(strstr(r.err, "--align-grad-reduce needs --overlap-grad-reduce"));
  result_free(&r);
}

int main(int argc, char **argv) {
  if (plan_init(argc, argv)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(grad_sync),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  return failed + plan_cleanup();
}
