/* The harness's checks that assert (cmocka): a reference run and the
 * comparison of a recovered job's losses with it (harness.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
