/* mega_gpt_order's fields, shared by its builder (gpt_order.c) and its
 * on-disk cache (gpt_order_cache.c). Nothing else includes this. */
#ifndef MEGA_WORKER_GPT_ORDER_INTERNAL_H
#define MEGA_WORKER_GPT_ORDER_INTERNAL_H

#include <stddef.h>

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

#endif
