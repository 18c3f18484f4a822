/* One result type for the whole project, in the manner of ncclResult_t.
 *
 * A function that can fail returns mega_status and, when given a mega_err,
 * writes a sentence there that says what was wrong and how to fix it. The
 * caller owns the mega_err; it may be NULL when the message is not wanted. */
#ifndef MEGA_CORE_STATUS_H
#define MEGA_CORE_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mega_status {
  MEGA_OK = 0,
  MEGA_ERR_INVALID,     /* bad input: a flag, a string, a file's contents */
  MEGA_ERR_NOMEM,
  MEGA_ERR_IO,          /* the OS refused: open, read, write, bind */
  MEGA_ERR_NOT_FOUND,
  MEGA_ERR_TIMEOUT,
  MEGA_ERR_PEER,        /* another rank, worker or daemon failed */
  MEGA_ERR_UNSUPPORTED, /* valid, but not built or not possible here */
  MEGA_ERR_CANCELLED,
  MEGA_ERR_INTERNAL,    /* a bug in mega: report it */
} mega_status;

#define MEGA_ERR_MSG_MAX 512

typedef struct mega_err {
  mega_status status;
  char msg[MEGA_ERR_MSG_MAX];
} mega_err;

/* A short lowercase name: "invalid argument", "timed out", ... */
const char *mega_status_str(mega_status s);

/* Records s and the formatted message in err (if err is not NULL); returns s,
 * so a failing path can read `return mega_fail(err, MEGA_ERR_INVALID, ...);`. */
mega_status mega_fail(mega_err *err, mega_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
mega_status mega_vfail(mega_err *err, mega_status s, const char *fmt, va_list ap);

/* Puts "prefix: " in front of err's message, to add context on the way up. */
void mega_err_prefix(mega_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void mega_err_clear(mega_err *err);

#ifdef __cplusplus
}
#endif

#endif
