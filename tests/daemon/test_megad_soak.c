/* A megad's long life: what it keeps (the journal, its descriptors) stays
 * bounded however many jobs, calls and connections it has seen. Each case
 * drives a real megad through many cheap jobs (waiting ones, cancelled:
 * no worker runs) and counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

/* Records in a journal file (u32 length | u32 crc | payload each), or -1. */
static long journal_records(const char *dir) {
  char path[256];
  snprintf(path, sizeof path, "%s/journal", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  long n = 0;
  unsigned char h[8];
  while (fread(h, 1, 8, f) == 8) {
    uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 |
                   (uint32_t)h[3] << 24;
    if (fseek(f, (long)len, SEEK_CUR)) break;
    n++;
  }
  fclose(f);
  return n;
}

/* A job that waits for a second node: it stays pending on one. */
static void submit_waiting(hd *d, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 2, NULL);
  spec.nnodes_min = 2;
  mega_err err = {0};
  if (hd_submit(d, &spec, id, len, &err) != MEGA_OK) fail_msg("SubmitJob: %s", err.msg);
}

#define JOBS 150

/* The journal was compacted only when megad started: one that ran for
 * weeks appended every record of every job (each job's records, then its
 * ForgetRecord) to a file retention never shrank, and read it all back on
 * its next start. Now it stays within a few times what its table holds. */
static void test_journal_stays_bounded(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "s1", 1, NULL, NULL, (const char *const[]){"--retain-jobs", "2", NULL}));
  char waiting[64], id[64], last[64] = "";
  submit_waiting(&d, waiting, sizeof waiting); /* pending throughout */
  for (int i = 0; i < JOBS; i++) {
    submit_waiting(&d, id, sizeof id);
    mega_err err = {0};
    if (hd_cancel(&d, id, NULL, &err) != MEGA_OK) fail_msg("CancelJob %s: %s", id, err.msg);
    snprintf(last, sizeof last, "%s", id);
  }
  assert_int_equal(hd_stop(&d), 0);
  long recs = journal_records(d.dir);
  /* a job costs about six records; three jobs are kept */
  if (recs < 0 || recs >= JOBS) {
    print_message("the journal holds %ld records after %d jobs\n", recs, JOBS + 1);
    hd_dump_log(&d);
  }
  assert_true(recs > 0 && recs < JOBS);
  /* what the rewrites kept is the table: the waiting job, the newest
   * ended one, and the next id */
  assert_true(hd_restart(&d, NULL));
  Mega__V1__Job *j = hd_get_job(&d, waiting, &(mega_err){0});
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_PENDING);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  j = hd_get_job(&d, last, &(mega_err){0});
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  submit_waiting(&d, id, sizeof id);
  char want[64];
  snprintf(want, sizeof want, "j-%d-s1", JOBS + 2);
  assert_string_equal(id, want);
  assert_false(hd_log_has(&d, "JOURNAL DAMAGED"));
  hd_cleanup(&d);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_journal_stays_bounded, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
