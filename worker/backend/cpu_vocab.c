/* The cpu backend's vocabulary-parallel cross-entropy (backend.h): the
 * three row passes between which the model reduces over its TP group. */
#include <math.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

typedef struct vce_ctx {
  float *rowmax, *sums, *losses, *x; /* x: finish's logits, then probabilities */
  const float *logits, *crowmax, *csums;
  const int32_t *targets;
  int v0, N, V;
  float scale;
  bool grad; /* finish writes dlogits (crossentropy_finish_grad) */
} vce_ctx;

static int64_t grain(int V) {
  int64_t g = MEGA_CPU_GRAIN_ELEMS / (V > 0 ? V : 1);
  return g > 0 ? g : 1;
}

MEGA_CPU_CLONES
static void max_rows(void *vc, int64_t n0, int64_t n1) {
  const vce_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    const float *l = c->logits + n * c->V;
    float mx = -INFINITY;
    for (int i = 0; i < c->V; i++) mx = l[i] > mx ? l[i] : mx;
    c->rowmax[n] = mx;
  }
}

void mega_cpu_crossentropy_rowmax(mega_backend *be, float *rowmax, const float *logits, int N,
                                  int V) {
  vce_ctx c = {.rowmax = rowmax, .logits = logits, .N = N, .V = V};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, grain(V), max_rows, &c);
}

MEGA_CPU_CLONES
static void sum_rows(void *vc, int64_t n0, int64_t n1) {
  const vce_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    const float *l = c->logits + n * c->V;
    float mx = c->crowmax[n], s = 0.0f;
    for (int i = 0; i < c->V; i++) s += mega_expf(l[i] - mx);
    int64_t t = (int64_t)c->targets[n] - c->v0;
    c->sums[n] = s;
    c->sums[c->N + n] = t >= 0 && t < c->V ? l[t] : 0.0f;
  }
}

void mega_cpu_crossentropy_sums(mega_backend *be, float *sums, const float *logits,
                                const float *rowmax, const int32_t *targets, int v0, int N,
                                int V) {
  vce_ctx c = {.sums = sums, .logits = logits, .crowmax = rowmax, .targets = targets,
               .v0 = v0, .N = N, .V = V};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, grain(V), sum_rows, &c);
}

MEGA_CPU_CLONES
static void finish_rows(void *vc, int64_t n0, int64_t n1) {
  const vce_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    float *p = c->x + n * c->V;
    float mx = c->crowmax[n], s = c->csums[n], inv = 1.0f / s;
    for (int i = 0; i < c->V; i++) p[i] = mega_expf(p[i] - mx) * inv;
    c->losses[n] = logf(s) + mx - c->csums[c->N + n];
    if (c->grad) mega_cpu_xent_grad_row(p, c->V, (int64_t)c->targets[n] - c->v0, c->scale);
  }
}

void mega_cpu_crossentropy_finish(mega_backend *be, float *losses, float *logits,
                                  const float *rowmax, const float *sums, int N, int V) {
  vce_ctx c = {.losses = losses, .x = logits, .crowmax = rowmax, .csums = sums, .N = N,
               .V = V};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, grain(V), finish_rows, &c);
}

void mega_cpu_crossentropy_finish_grad(mega_backend *be, float *losses, float *logits,
                                       const float *rowmax, const float *sums,
                                       const int32_t *targets, int v0, float scale, int N,
                                       int V) {
  vce_ctx c = {.losses = losses, .x = logits, .crowmax = rowmax, .csums = sums,
               .targets = targets, .v0 = v0, .N = N, .V = V, .scale = scale, .grad = true};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, grain(V), finish_rows, &c);
}
