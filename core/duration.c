#include "core/duration.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

mega_status mega_duration_parse(const char *flag, const char *s, unsigned min_ms, unsigned max_ms,
                                unsigned *out_ms, mega_err *err) {
  if (!s || !*s || isspace((unsigned char)*s))
    return mega_fail(err, MEGA_ERR_INVALID, "%s needs a duration such as 250ms or 1.5s", flag);
  /* Digits with at most one point: strtod alone would also take "0x1p3",
   * "+5", "1e3" and "inf", which nobody means in a timeout. */
  size_t digits = strspn(s, "0123456789."), points = 0;
  for (size_t i = 0; i < digits; i++) points += s[i] == '.';
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (!digits || points > 1 || (size_t)(end - s) != digits || errno || !isfinite(v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a duration (write 250ms or 1.5s)",
                     flag, s);
  static const struct {
    const char *unit;
    double ms;
  } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
  double scale = 0;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(end, units[i].unit)) scale = units[i].ms;
  if (!scale)
    return mega_fail(err, MEGA_ERR_INVALID,
                     *end ? "%s: '%s' has an unknown unit (use ms, s, m or h)"
                          : "%s: '%s' needs a unit: write %sms or %ss",
                     flag, s, s, s);
  double ms = round(v * scale);
  if (ms < min_ms || ms > max_ms)
    return mega_fail(err, MEGA_ERR_INVALID, "%s %s is out of range (%u ms to %u ms)", flag, s,
                     min_ms, max_ms);
  *out_ms = (unsigned)ms;
  return MEGA_OK;
}
