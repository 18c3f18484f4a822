#include "core/status.h"

#include <stdio.h>
#include <string.h>

const char *mega_status_str(mega_status s) {
  switch (s) {
  case MEGA_OK: return "ok";
  case MEGA_ERR_INVALID: return "invalid argument";
  case MEGA_ERR_NOMEM: return "out of memory";
  case MEGA_ERR_IO: return "i/o error";
  case MEGA_ERR_NOT_FOUND: return "not found";
  case MEGA_ERR_TIMEOUT: return "timed out";
  case MEGA_ERR_PEER: return "peer failed";
  case MEGA_ERR_UNSUPPORTED: return "unsupported";
  case MEGA_ERR_CANCELLED: return "cancelled";
  case MEGA_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

mega_status mega_vfail(mega_err *err, mega_status s, const char *fmt, va_list ap) {
  if (err) {
    err->status = s;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  }
  return s;
}

mega_status mega_fail(mega_err *err, mega_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mega_vfail(err, s, fmt, ap);
  va_end(ap);
  return s;
}

void mega_err_prefix(mega_err *err, const char *fmt, ...) {
  if (!err) return;
  char head[MEGA_ERR_MSG_MAX], old[MEGA_ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof old);
  /* Joined by hand: snprintf("%s: %s") of two full buffers trips -Wformat-truncation. */
  size_t n = strnlen(head, sizeof head - 1), m = strnlen(old, sizeof old - 1), cap = sizeof err->msg - 1;
  size_t at = n < cap ? n : cap;
  memcpy(err->msg, head, at);
  for (const char *sep = ": "; *sep && at < cap; sep++) err->msg[at++] = *sep;
  size_t rest = m < cap - at ? m : cap - at;
  memcpy(err->msg + at, old, rest);
  err->msg[at + rest] = '\0';
}

void mega_err_clear(mega_err *err) {
  if (!err) return;
  err->status = MEGA_OK;
  err->msg[0] = '\0';
}
