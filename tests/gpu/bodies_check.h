/* What the kernel-body tests share (test_kernel_bodies.c,
 * test_attn_bodies.c): random inputs, the comparison with the cpu backend,
 * and the lanes a row body runs in on the CPU. Include after cmocka.h. */
#ifndef MEGA_TESTS_GPU_BODIES_CHECK_H
#define MEGA_TESTS_GPU_BODIES_CHECK_H

#include <math.h>
#include <stdlib.h>

/* n floats in [-scale, scale) from seed, the caller's to free. */
static inline float *vec(size_t n, unsigned seed, float scale) {
  float *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    v[i] = ((float)((seed >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f) * scale;
  }
  return v;
}

static inline void near(const float *got, const float *want, size_t n, double tol,
                        const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol * (1.0 + fabs((double)want[i]))))
      fail_msg("%s[%zu]: body %.9g, cpu backend %.9g", what, i, (double)got[i], (double)want[i]);
}

/* Lanes per row (or row lanes per column): one, fewer than a row, more. */
static const int lane_counts[] = {1, 5, 32};
#define FOR_LANES(L) for (int li_ = 0, L; li_ < 3 && (L = lane_counts[li_], 1); li_++)

/* A row's partials combined as the kernels' shuffles do (in another order:
 * the tolerances allow for it). */
#define LANES_SUM(L, expr)                 \
  ({                                       \
    float acc_ = 0.0f;                     \
    for (int l = 0; l < (L); l++) acc_ += (expr); \
    acc_;                                  \
  })
#define LANES_MAX(L, expr)                                 \
  ({                                                       \
    float acc_ = -INFINITY;                                \
    for (int l = 0; l < (L); l++) {                        \
      float v_ = (expr);                                   \
      acc_ = v_ > acc_ ? v_ : acc_;                        \
    }                                                      \
    acc_;                                                  \
  })

#endif
