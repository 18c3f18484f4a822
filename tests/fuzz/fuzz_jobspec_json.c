/* core/jobspec_json: a job spec from JSON (a checkpoint's trainer_state.json
 * holds one). What is accepted must check or be refused with a reason, and
 * go back to the same JSON. */
#include <jansson.h>

#include "core/jobspec.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t jerr;
  json_t *obj = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
  if (!obj) return 0;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_err err = {0};
  if (mega_jobspec_from_json(&s, obj, &err) == MEGA_OK) {
    mega_err cerr = {0};
    if (mega_jobspec_check_all(&s, 0, -1, &cerr) != MEGA_OK) FUZZ_CHECK(cerr.msg[0]);
    json_t *out = mega_jobspec_to_json(&s);
    FUZZ_CHECK(out);
    mega_jobspec back;
    mega_jobspec_defaults(&back);
    FUZZ_CHECK(mega_jobspec_from_json(&back, out, &err) == MEGA_OK);
    FUZZ_CHECK(mega_jobspec_equal(&s, &back));
    mega_jobspec_free(&back);
    json_decref(out);
  } else {
    FUZZ_CHECK(err.msg[0]);
  }
  mega_jobspec_free(&s);
  json_decref(obj);
  return 0;
}
