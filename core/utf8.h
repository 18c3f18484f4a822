/* UTF-8 as JSON (and jansson) wants it: RFC 3629, no overlong forms, no
 * surrogates, nothing past U+10FFFF. Text from outside (a path, a job name
 * over raw gRPC) may be anything; these say so, or make it printable. */
#ifndef MEGA_CORE_UTF8_H
#define MEGA_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes of the valid sequence at s (at most n), 0 when none starts there. */
size_t mega_utf8_seq(const unsigned char *s, size_t n);

/* Whether the NUL-terminated s is valid UTF-8. */
bool mega_utf8_valid(const char *s);

/* A copy of s with each byte that is not part of a valid sequence replaced
 * by U+FFFD (the caller frees); NULL when out of memory. */
char *mega_utf8_sanitize(const char *s);

#endif
