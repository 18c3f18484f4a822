/* mega_gpt_order's fields, shared by its builder (gpt_order.c) and its
 * on-disk cache (gpt_order_cache.c). Nothing else includes this. */
#ifndef MEGA_WORKER_GPT_ORDER_INTERNAL_H
#define MEGA_WORKER_GPT_ORDER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "worker/data/gpt_order.h"

struct mega_gpt_order {
  int epochs;
  int separate;
  int64_t ndoc_index;   /* epochs x documents */
  int32_t *doc_index;   /* sequence ids, as Megatron's int32 document index */
  int64_t samples;      /* S */
  int64_t *sample_pos;  /* S + 1 (position in doc_index, offset) pairs */
  int64_t *shuffle;     /* S */
  /* a cache file mapped read-only: the arrays point into it and are not
   * freed; NULL: they were built here and are malloc'd */
  void *map;
  size_t map_len;
};

/* What a key makes before anything is drawn (gpt_order.h): the epochs E,
 * the document index's length E x documents, the samples S, whether the
 * final epoch is kept apart and, if so, the samples before it S0. The
 * cache holds a file to it. */
typedef struct mega_gpt_order_shape {
  int64_t epochs, ndoc_index, samples, sans_final;
  int separate;
} mega_gpt_order_shape;

/* The shape of mega_gpt_order_build's arguments; fails as it does. */
mega_status mega_gpt_order_shape_of(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                    int64_t num_samples, mega_gpt_order_shape *out,
                                    mega_err *err);

/* build_sample_idx's step: the sample that starts at position *at, token
 * *at_off of o's document index ends T + 1 tokens on, at the (*at,
 * *at_off) this leaves. o's document ids index cum. */
void mega_gpt_order_step(const mega_gpt_order *o, const int64_t *cum, int T, int64_t *at,
                         int64_t *at_off);

#endif
