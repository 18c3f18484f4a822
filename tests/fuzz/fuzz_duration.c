/* core/duration: durations as people type them in flags (megad's timeouts,
 * megactl's --step-timeout). The first byte picks the limits, among those
 * the flags use and the widest; the rest is the text. What parses is in
 * the limits, has a unit (a bare number is refused), and written back in
 * whole milliseconds or in seconds parses to the same value. A refusal
 * says why. */
#include <limits.h>

#include "core/duration.h"
#include "fuzz.h"

static const struct {
  unsigned min, max;
} limits[] = {
    {0, UINT_MAX},   {10, 60000},   {20, 600000},  {1000, 3600000},
    {1000, 120000},  {1000, 30 * 86400000u}, {2000, 60000}, {100, 86400000},
};

static void same(const char *text, unsigned min, unsigned max, unsigned want) {
  unsigned got = 0;
  mega_err err = {0};
  FUZZ_CHECK(mega_duration_parse("--fuzz", text, min, max, &got, &err) == MEGA_OK);
  FUZZ_CHECK(got == want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t nl = sizeof limits / sizeof limits[0];
  unsigned min = limits[data[0] % nl].min, max = limits[data[0] % nl].max;
  char *s = fuzz_str(data + 1, size - 1);
  unsigned ms = 0;
  mega_err err = {0};
  if (mega_duration_parse("--fuzz", s, min, max, &ms, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0] && strstr(err.msg, "--fuzz"));
    free(s);
    return 0;
  }
  FUZZ_CHECK(ms >= min && ms <= max);
  size_t len = strlen(s);
  FUZZ_CHECK(len > 0 && (s[len - 1] == 's' || s[len - 1] == 'm' || s[len - 1] == 'h'));
  char back[64];
  snprintf(back, sizeof back, "%ums", ms);
  same(back, min, max, ms);
  snprintf(back, sizeof back, "%u.%03us", ms / 1000, ms % 1000);
  same(back, min, max, ms);
  free(s);
  return 0;
}
