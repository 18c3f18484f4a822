/* The web view's job document for a job with more events than megad keeps:
 * the first and the newest, numbered, with how many were left out between,
 * and a version that still moves with each new event (the live stream
 * sends the document again only when it does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>

#include "daemon/model/job.h"
#include "daemon/web/webjson.h"

static char *args[] = {"--num-layers", "2", "--train-iters", "3"};

static void push_event(mega_job *j, const char *msg) {
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING;
  ev.message = (char *)msg;
  ev.number = j->hist.events_total + 1; /* as megad_job_event numbers them */
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

static void test_long_history(void **state) {
  (void)state;
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.args = args;
  spec.n_args = sizeof args / sizeof args[0];
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 1000, &j, NULL), MEGA_OK);
  const size_t kept = MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST, n = 2 * kept;
  char msg[32];
  uint64_t version = megad_webjson_job_version(j);
  for (size_t i = 1; i <= n; i++) {
    snprintf(msg, sizeof msg, "restart %zu", i);
    push_event(j, msg);
    uint64_t v = megad_webjson_job_version(j);
    assert_true(v != version); /* past the bound too */
    version = v;
  }
  json_t *doc = megad_webjson_job(j);
  assert_non_null(doc);
  json_t *evs = json_object_get(doc, "events");
  assert_int_equal(json_array_size(evs), kept);
  assert_int_equal(json_integer_value(json_object_get(doc, "events_left_out")), n - kept);
  json_t *last_first = json_array_get(evs, MEGA_JOB_EVENTS_FIRST - 1);
  json_t *first_last = json_array_get(evs, MEGA_JOB_EVENTS_FIRST);
  /* the page draws its row where the numbers jump */
  assert_int_equal(json_integer_value(json_object_get(last_first, "number")),
                   MEGA_JOB_EVENTS_FIRST);
  assert_int_equal(json_integer_value(json_object_get(first_last, "number")),
                   n - MEGA_JOB_EVENTS_LAST + 1);
  snprintf(msg, sizeof msg, "restart %zu", n);
  assert_string_equal(json_string_value(json_object_get(json_array_get(evs, kept - 1), "message")),
                      msg);
  json_decref(doc);
  mega_job_free(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_long_history),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
