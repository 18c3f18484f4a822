/* A journal written by another build of megad, replayed by this one (a
 * restart after an upgrade or a downgrade): the other build's records are
 * made here as it would have packed them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/jobspec.h"
#include "daemon/model/job.h"
#include "daemon/model/megad.pb-c.h"
#include "daemon/model/recovery.h"

/* A JournalRecord of job id, running, with args; the caller frees *buf. */
static void job_record(const char *id, char **args, size_t nargs, uint8_t **buf, size_t *len) {
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "old";
  spec.args = args;
  spec.n_args = nargs;
  Mega__V1__Job job = MEGA__V1__JOB__INIT;
  job.id = (char *)id;
  job.state = MEGA__V1__JOB_STATE__JOB_STATE_RUNNING;
  job.spec = &spec;
  Megad__V1__JobRecord jr = MEGAD__V1__JOB_RECORD__INIT;
  jr.job = &job;
  Megad__V1__JournalRecord r = MEGAD__V1__JOURNAL_RECORD__INIT;
  r.rec_case = MEGAD__V1__JOURNAL_RECORD__REC_JOB;
  r.job = &jr;
  *len = protobuf_c_message_get_packed_size(&r.base);
  *buf = malloc(*len);
  assert_non_null(*buf);
  protobuf_c_message_pack(&r.base, *buf);
}

/* A job whose flags this build does not take (an older build's flag since
 * removed, or a newer one's): kept, and its restart fails saying which
 * flag, where it once said only "its flags no longer parse". */
static void test_flags_that_do_not_parse_are_named(void **state) {
  (void)state;
  char *args[] = {"--num-layers", "2", "--a-flag-this-build-lacks", "1"};
  uint8_t *buf;
  size_t len;
  job_record("j-1-old", args, 4, &buf, &len);
  mega_jobs t;
  mega_jobs_init(&t);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK);
  free(buf);
  mega_job *j = mega_jobs_table_find(&t, "j-1-old");
  assert_non_null(j);
  assert_false(j->spec_ok);
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_err err = {0};
  assert_int_equal(mega_recovery_attempt_spec(j, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "job j-1-old: its flags do not parse in this megad"));
  assert_non_null(strstr(err.msg, "unknown flag '--a-flag-this-build-lacks'"));
  mega_jobspec_free(&s);
  mega_jobs_free(&t);
}

/* A record of a kind this build does not know (a newer megad's JournalRecord
 * with a field of its own): skipped, counted, the jobs beside it kept. */
static void test_newer_record_kind_is_counted(void **state) {
  (void)state;
  /* field 9, length-delimited, 3 bytes: a record kind of a newer build */
  static const uint8_t newer[] = {(9 << 3) | 2, 3, 'n', 'e', 'w'};
  mega_jobs t;
  mega_jobs_init(&t);
  mega_err err = {0};
  assert_int_equal(mega_jobs_apply(&t, newer, sizeof newer, &err), MEGA_OK);
  char *args[] = {"--num-layers", "2"};
  uint8_t *buf;
  size_t len;
  job_record("j-2-old", args, 2, &buf, &len);
  assert_int_equal(mega_jobs_apply(&t, buf, len, NULL), MEGA_OK);
  free(buf);
  assert_int_equal(t.unknown_records, 1);
  assert_int_equal(t.n, 1);
  assert_true(mega_jobs_table_find(&t, "j-2-old")->spec_ok);
  mega_jobs_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flags_that_do_not_parse_are_named),
      cmocka_unit_test(test_newer_record_kind_is_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
