/* The cpu op tests' shared pieces (cpu_ops_fixture.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cpu_ops_fixture.h"
#include "gpt_fixture.h"

mega_backend *cpu_be;

static int setup_threads(int threads) {
  mega_backend_cpu_opts o = {.threads = threads};
  printf("# cpu backend with %d thread(s)\n", threads);
  return mega_backend_cpu_create(&o, &cpu_be, NULL) == MEGA_OK ? 0 : -1;
}

int cpu_ops_setup1(void **state) {
  (void)state;
  return setup_threads(1);
}

int cpu_ops_setup3(void **state) {
  (void)state;
  return setup_threads(3);
}

int cpu_ops_teardown(void **state) {
  (void)state;
  mega_backend_destroy(cpu_be);
  return 0;
}

float *vec(size_t n, float std, uint64_t seed) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  fx_normals(p, n, std, seed);
  return p;
}

void near(const float *a, const double *b, size_t n, double tol, const char *what) {
  double scale = 1.0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n; i++)
    if (fabs(a[i] - b[i]) > tol * scale)
      fail_msg("%s[%zu]: backend %.9g, reference %.9g", what, i, a[i], b[i]);
}
