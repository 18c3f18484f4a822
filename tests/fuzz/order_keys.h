/* The keys fuzz_order_cache opens an order index for, shared with
 * fuzz_seeds, which writes each key's cache file as a seed. */
#ifndef MEGA_TESTS_FUZZ_ORDER_KEYS_H
#define MEGA_TESTS_FUZZ_ORDER_KEYS_H

#include <stdint.h>

/* Documents of 5, 0, 3, 8, 1, 0, 6 and 2 tokens: empty ones inside and at
 * the end of a range. */
static const int64_t order_cum[] = {0, 5, 5, 8, 16, 17, 17, 23, 25};

typedef struct order_key {
  int64_t doc0, doc1, samples;
  int T;
  uint32_t seed;
  const char *name;
} order_key;

/* Indexed by the input's first byte's low two bits. */
static const order_key order_keys[4] = {
    {0, 8, 3, 4, 1, "one_epoch"},
    {0, 8, 20, 3, 7, "final_apart"},      /* three epochs, the final one kept apart */
    {2, 7, 25, 2, 3, "epochs_together"},  /* three shuffled together, a split's range */
    {0, 6, 10, 1, 0, "empty_last"},       /* one epoch ending in an empty document */
};

#endif
