/* What every backend shares. */
#include "worker/backend/backend.h"

void mega_backend_destroy(mega_backend *be) {
  if (be) be->ops->destroy(be);
}

void mega_attention_sizes(mega_backend *be, const mega_attn_dims *d, size_t *att,
                          size_t *scratch) {
  if (be->ops->attention_sizes) {
    be->ops->attention_sizes(be, d, att, scratch);
    return;
  }
  *att = (size_t)d->B * d->NH * d->T * d->T;
  *scratch = *att + (size_t)d->B * d->T * d->NH * d->hs;
}

void mega_adamw_ranges(mega_backend *be, const mega_adamw_range *r, size_t count,
                       const mega_adamw_params *hp) {
  if (be->ops->adamw_ranges) {
    be->ops->adamw_ranges(be, r, count, hp);
    return;
  }
  mega_adamw_params one = *hp;
  for (size_t i = 0; i < count; i++) {
    if (r[i].n == 0) continue;
    one.weight_decay = r[i].weight_decay;
    be->ops->adamw(be, r[i].params, r[i].grads, r[i].m, r[i].v, r[i].n, &one);
  }
}

mega_status mega_sum_squares_post(mega_backend *be, const mega_sumsq_range *r, size_t count,
                                  mega_err *err) {
  if (be->ops->sum_squares_post) {
    be->ops->sum_squares_post(be, r, count);
    return MEGA_OK;
  }
  for (size_t i = 0; i < count; i++) {
    double s;
    mega_status st = be->ops->sum_squares(be, r[i].x, r[i].n, &s, err);
    if (st == MEGA_OK) st = be->ops->memcpy(be, r[i].out, &s, sizeof s, MEGA_COPY_H2D, err);
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}
