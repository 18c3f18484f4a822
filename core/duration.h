/* Durations as people type them in flags: "250ms", "1.5s", "2m", "1h".
 * A bare number is refused (is "250" seconds or milliseconds?), with a
 * message that says how to write it. */
#ifndef MEGA_CORE_DURATION_H
#define MEGA_CORE_DURATION_H

#include "core/status.h"

/* Parses s into whole milliseconds (rounded), at least min_ms and at most
 * max_ms; flag names the flag in messages. */
mega_status mega_duration_parse(const char *flag, const char *s, unsigned min_ms, unsigned max_ms,
                                unsigned *out_ms, mega_err *err);

#endif
