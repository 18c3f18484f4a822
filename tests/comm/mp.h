/* Multi-process helpers for the communicator tests: fork N ranks on
 * loopback, each with a fresh store directory, and reap them all.
 *
 * The parent never creates a communicator (it forks, and Gloo starts
 * threads). A child reports a failed check on stderr and exits 1. */
#ifndef MEGA_TESTS_COMM_MP_H
#define MEGA_TESTS_COMM_MP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "worker/comm/comm.h"

typedef struct mp_env {
  const char *dir;    /* a fresh directory, shared by the ranks */
  const char *prefix; /* a fresh store prefix */
  int nranks;
  void *arg;
} mp_env;

/* A rank's body: returns 0 when every check passed. */
typedef int (*mp_fn)(int rank, const mp_env *env);

/* Runs fn in n children and waits up to deadline_ms for all of them; kills
 * and reports the ones still running then. Children whose bit is set in
 * killed_ok may die of SIGKILL (a test's planned victim). Returns the number
 * of children that failed, after printing why. */
int mp_run(int n, mp_fn fn, void *arg, int deadline_ms, unsigned killed_ok);

/* Opens a store on env->dir: Gloo's FileStore, or (kv true) the C vtable
 * store below over the same directory. Returns NULL after printing why. */
mega_store *mp_store(const mp_env *env, bool kv);

/* A real key-value store for tests, behind mega_kv_ops: one file per key in
 * a directory (hex-encoded key names, written to a temporary file and
 * renamed), polled every 2 ms by get and wait. */
extern const mega_kv_ops mp_kv_dir_ops;

double mp_now_ms(void);
void mp_sleep_ms(int ms);
/* A planned victim (its bit in mp_run's killed_ok): sleeps, then SIGKILLs
 * itself, as a crash would end it. */
_Noreturn void mp_die_after_ms(int ms);

/* Deterministic test data: small integers as floats, so sums are exact. */
static inline float mp_val(int rank, size_t i) {
  return (float)((int)((i * 7 + (size_t)rank * 13) % 101) - 50);
}
static inline uint8_t mp_byte(int rank, size_t i) {
  return (uint8_t)(i * 31 + (size_t)rank * 17 + 5);
}

/* In a rank's body (a variable `rank` in scope): fail the rank with a
 * message unless cond holds. */
#define MP_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__,   \
              __LINE__, #cond);                                               \
      fprintf(stderr, __VA_ARGS__);                                           \
      fputc('\n', stderr);                                                    \
      return 1;                                                               \
    }                                                                         \
  } while (0)

#define MP_OK(expr, err)                                                      \
  do {                                                                        \
    mega_status mp_st_ = (expr);                                              \
    MP_CHECK(mp_st_ == MEGA_OK, "%s: %s", mega_status_str(mp_st_),            \
             (err).msg);                                                      \
  } while (0)

#endif
