/* core/schedule's text form. What parses must validate or be refused with
 * a reason, and format back to text that parses to the same schedule. */
#include "core/schedule.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = fuzz_str(data, size);
  mega_schedule sc;
  mega_err err = {0};
  if (mega_sched_parse(s, &sc, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0]);
    free(s);
    return 0;
  }
  mega_err verr = {0};
  if (mega_sched_validate(&sc, &verr) == MEGA_OK) {
    for (int r = 0; r < sc.pp; r++) {
      mega_sched_phases(&sc, r);
      FUZZ_CHECK(mega_sched_peak_inflight(&sc, r) >= 0);
    }
  } else {
    FUZZ_CHECK(verr.msg[0]);
  }
  char *f = mega_sched_format(&sc);
  FUZZ_CHECK(f);
  mega_schedule back;
  FUZZ_CHECK(mega_sched_parse(f, &back, &err) == MEGA_OK);
  FUZZ_CHECK(mega_sched_equal(&sc, &back));
  mega_sched_free(&back);
  free(f);
  mega_sched_free(&sc);
  free(s);
  return 0;
}
