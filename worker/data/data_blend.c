#include "worker/data/data_blend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVERY 1024 /* samples between kept counts */

struct mega_blend {
  int n;
  double *w;       /* normalized */
  int64_t nsnap;   /* counts kept at samples 0, EVERY, 2*EVERY, ... */
  int64_t *counts; /* nsnap x n */
};

/* One step of the rule at sample s: the dataset chosen; c is updated. */
static int step(const mega_blend *b, int64_t s, int64_t *c) {
  double si = s > 1 ? (double)s : 1.0;
  int best = 0;
  double best_err = b->w[0] * si - (double)c[0];
  for (int d = 1; d < b->n; d++) {
    double e = b->w[d] * si - (double)c[d];
    if (e > best_err) best_err = e, best = d;
  }
  c[best]++;
  return best;
}

mega_status mega_blend_create(const double *weights, int n, int64_t samples, mega_blend **out,
                              mega_err *err) {
  *out = NULL;
  double sum = 0;
  for (int d = 0; d < n; d++) {
    if (!(weights[d] > 0) || !isfinite(weights[d]))
      return mega_fail(err, MEGA_ERR_INVALID, "blend weight %d is %g; weights must be > 0", d,
                       weights[d]);
    sum += weights[d];
  }
  if (n < 1) return mega_fail(err, MEGA_ERR_INVALID, "a blend needs at least one dataset");
  if (samples < 1) samples = 1;
  mega_blend *b = calloc(1, sizeof *b);
  int64_t nsnap = (samples + EVERY - 1) / EVERY;
  if (b) {
    b->n = n;
    b->nsnap = nsnap;
    b->w = calloc((size_t)n, sizeof *b->w);
    b->counts = calloc((size_t)(nsnap * n), sizeof *b->counts);
  }
  if (!b || !b->w || !b->counts) {
    mega_blend_destroy(b);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the blend of %lld samples",
                     (long long)samples);
  }
  for (int d = 0; d < n; d++) b->w[d] = weights[d] / sum;
  int64_t *c = calloc((size_t)n, sizeof *c);
  if (!c) {
    mega_blend_destroy(b);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the blend");
  }
  for (int64_t k = 0; k < nsnap; k++) {
    memcpy(b->counts + k * n, c, (size_t)n * sizeof *c);
    if (k + 1 < nsnap)
      for (int64_t s = k * EVERY; s < (k + 1) * EVERY; s++) step(b, s, c);
  }
  free(c);
  *out = b;
  return MEGA_OK;
}

void mega_blend_destroy(mega_blend *b) {
  if (!b) return;
  free(b->w);
  free(b->counts);
  free(b);
}

void mega_blend_source(const mega_blend *b, int64_t s, int *dataset, int64_t *index) {
  int64_t k = s / EVERY < b->nsnap ? s / EVERY : b->nsnap - 1;
  int64_t c[b->n];
  memcpy(c, b->counts + k * b->n, (size_t)b->n * sizeof *c);
  for (int64_t t = k * EVERY; t < s; t++) step(b, t, c);
  int d = step(b, s, c);
  *dataset = d;
  *index = c[d] - 1;
}
