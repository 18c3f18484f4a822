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
