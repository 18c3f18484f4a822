#include "count_backend.h"

#include <stdlib.h>

typedef struct counting {
  mega_backend be; /* first: the ops get &be */
  mega_backend_ops ops;
  mega_backend *cpu;
  fx_counts *n;
} counting;

static counting *of(mega_backend *be) { return (counting *)be; }

static void destroy(mega_backend *be) { free(of(be)); }

static mega_status count_memcpy(mega_backend *be, void *dst, const void *src, size_t bytes,
                                mega_copy_kind kind, mega_err *err) {
  if (kind == MEGA_COPY_D2H) of(be)->n->d2h++;
  return of(be)->cpu->ops->memcpy(of(be)->cpu, dst, src, bytes, kind, err);
}

static mega_status count_sum_squares(mega_backend *be, const float *x, size_t n, double *out,
                                     mega_err *err) {
  of(be)->n->sum_squares++;
  return of(be)->cpu->ops->sum_squares(of(be)->cpu, x, n, out, err);
}

static void count_adamw(mega_backend *be, float *params, const float *grads, float *m, float *v,
                        size_t n, const mega_adamw_params *hp) {
  of(be)->n->adamw++;
  of(be)->cpu->ops->adamw(of(be)->cpu, params, grads, m, v, n, hp);
}

static void count_adamw_ranges(mega_backend *be, const mega_adamw_range *r, size_t count,
                               const mega_adamw_params *hp) {
  of(be)->n->adamw_ranges++;
  mega_adamw_ranges(of(be)->cpu, r, count, hp); /* cpu has none: its loop */
}

/* Backend memory is host memory: each sum lands in its out directly. */
static void count_sum_squares_post(mega_backend *be, const mega_sumsq_range *r, size_t count) {
  of(be)->n->sum_squares_post++;
  mega_backend *cpu = of(be)->cpu;
  for (size_t i = 0; i < count; i++) cpu->ops->sum_squares(cpu, r[i].x, r[i].n, r[i].out, NULL);
}

mega_backend *fx_counting(mega_backend *cpu, fx_counts *counts, bool ranges) {
  counting *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->cpu = cpu;
  c->n = counts;
  c->ops = *cpu->ops;
  c->ops.destroy = destroy;
  c->ops.memcpy = count_memcpy;
  c->ops.sum_squares = count_sum_squares;
  c->ops.adamw = count_adamw;
  c->ops.adamw_ranges = ranges ? count_adamw_ranges : NULL;
  c->ops.sum_squares_post = ranges ? count_sum_squares_post : NULL;
  c->be = (mega_backend){.ops = &c->ops, .impl = cpu->impl};
  return &c->be;
}
