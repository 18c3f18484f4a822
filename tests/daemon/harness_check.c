/* The harness's checks that assert (cmocka): a reference run and the
 * comparison of a recovered job's losses with it, a job's ranks started,
 * a file written (harness.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"

/* Losses of an uninterrupted run of the same flags, by iteration. */
void hd_reference(hd *d, const Mega__V1__JobSpec *spec, hd_watch *ref) {
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(d, spec, id, sizeof id, &err), MEGA_OK);
  hd_watch_job(d, id, true, 120000, ref);
  assert_true(hd_succeeded(d, ref));
}

/* Every iteration within rtol of the uninterrupted run; and where a new
 * attempt takes over (restored from a checkpoint), within 1e-6 whatever
 * rtol: lost or wrong state shows there at once, while the drift of
 * another reduction order only grows over many iterations. */
void hd_same_losses(const hd_watch *got, const hd_watch *ref, int iters, double rtol) {
  for (int k = 1; k <= iters; k++) {
    char left_out[96]; /* megad says so when a node took an iteration's loss with it */
    snprintf(left_out, sizeof left_out, "iteration %d completed, but no rank that survived", k);
    if (!got->seen[k] && strstr(got->events_text, left_out)) {
      fprintf(stderr, "iteration %d: its loss died with the node (the event says so)\n", k);
      continue;
    }
    if (!got->seen[k]) fprintf(stderr, "iteration %d never seen; events:\n%s", k, got->events_text);
    assert_true(got->seen[k]);
    double a = got->loss[k], b = ref->loss[k];
    double tol = k > 1 && got->attempt[k] != got->attempt[k - 1] && rtol > 1e-6 ? 1e-6 : rtol;
    if (fabs(a - b) > tol * fabs(b)) {
      fprintf(stderr, "iteration %d: loss %.9g (attempt %u, world %u), uninterrupted %.9g\n", k, a,
              got->attempt[k], got->world[k], b);
      fail();
    }
  }
}

void hd_ranks_started(const hd *d, const char *job_id, int n, pid_t *pids) {
  if (!hd_wait_workers(d, n, 20000, pids)) {
    hd_dump_log(d);
    fail_msg("the workers of %s did not start", job_id);
  }
}

void hd_write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}
