/* The cpu op tests' shared pieces: the cpu backend each test group runs on,
 * once with one thread and once with three (the pool's uneven splits, and
 * sgemm from several threads), random inputs, and the comparison with a
 * double-precision reference. Every helper fails the running cmocka test. */
#ifndef MEGA_TESTS_WORKER_CPU_OPS_FIXTURE_H
#define MEGA_TESTS_WORKER_CPU_OPS_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend/backend.h"

/* The running group's backend. */
extern mega_backend *cpu_be;

/* cmocka group setups (cpu_be with one or three threads) and teardown. */
int cpu_ops_setup1(void **state);
int cpu_ops_setup3(void **state);
int cpu_ops_teardown(void **state);
/* Runs a CMUnitTest array at one thread, then at three: the failures. */
#define CPU_OPS_RUN(tests)                                                                \
  (cmocka_run_group_tests_name("one thread", tests, cpu_ops_setup1, cpu_ops_teardown) +  \
   cmocka_run_group_tests_name("three threads", tests, cpu_ops_setup3, cpu_ops_teardown))

/* n normals of standard deviation std (malloc'd; at least one float). */
float *vec(size_t n, float std, uint64_t seed);
/* Fails unless max |a - b| <= tol * max(1, max |b|); what names a. */
void near(const float *a, const double *b, size_t n, double tol, const char *what);

#endif
