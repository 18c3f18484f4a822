/* Tensor-parallel slices (tp_split.h). */
#include "worker/model/tp_split.h"

#include <string.h>

size_t mega_tp_full_index(const mega_tp_split *s, int tp, int rank, size_t i) {
  if (mega_tp_split_replicated(s) || tp <= 1) return i;
  size_t w = s->inner / (size_t)tp; /* a slice row's width */
  size_t row = i / w, col = i % w;  /* row runs over (outer, part) */
  return row * s->inner + (size_t)rank * w + col;
}

/* Copies slice rows between full and local; to_local picks the direction. */
static void copy_rows(const mega_tp_split *s, int tp, int rank, float *full, float *local,
                      bool to_local) {
  size_t w = s->inner / (size_t)tp, rows = s->outer * (size_t)s->parts;
  for (size_t r = 0; r < rows; r++) {
    float *f = full + r * s->inner + (size_t)rank * w, *l = local + r * w;
    if (to_local)
      memcpy(l, f, w * sizeof *l);
    else
      memcpy(f, l, w * sizeof *f);
  }
}

void mega_tp_cut(const mega_tp_split *s, int tp, int rank, const float *full, float *local) {
  if (mega_tp_split_replicated(s) || tp <= 1) {
    memcpy(local, full, s->outer * s->inner * sizeof *local);
    return;
  }
  copy_rows(s, tp, rank, (float *)full, local, true);
}

void mega_tp_place(const mega_tp_split *s, int tp, int rank, const float *local, float *full) {
  if (mega_tp_split_replicated(s) || tp <= 1) {
    memcpy(full, local, s->outer * s->inner * sizeof *full);
    return;
  }
  copy_rows(s, tp, rank, full, (float *)local, false);
}
