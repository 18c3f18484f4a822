/* numpy's legacy RandomState, as much of it as Megatron's GPTDataset uses:
 * numpy.random.RandomState(seed) for an integer seed, and its shuffle of a
 * one-dimensional array. Restated from numpy's C sources (numpy 1.17 and
 * later; the stream is frozen for RandomState), so a shuffle here
 * permutes an array exactly as numpy's does for the same seed and calls.
 *
 * The generator is MT19937. An integer seed s (0 <= s < 2^32) initializes
 * it with Matsumoto and Nishimura's init_genrand (mt[0] = s, mt[i] =
 * 1812433253 * (mt[i-1] ^ (mt[i-1] >> 30)) + i), not init_by_array.
 * shuffle(x) of n elements swaps x[i] with x[j] for i = n-1 down to 1, j
 * drawn by numpy's random_interval(i): the smallest all-ones mask >= i,
 * 32-bit words (64-bit ones, high word first, when i >= 2^32) masked
 * until one is <= i. The state is a plain value: copy it to fork. */
#ifndef MEGA_WORKER_NP_RANDOM_H
#define MEGA_WORKER_NP_RANDOM_H

#include <stdint.h>

typedef struct mega_np_random {
  uint32_t mt[624];
  int pos; /* next word of mt; 624: regenerate first */
} mega_np_random;

/* numpy.random.RandomState(seed). */
void mega_np_random_seed(mega_np_random *r, uint32_t seed);
/* The next 32-bit output (RandomState.randint(2**32, dtype=uint32)'s). */
uint32_t mega_np_random_u32(mega_np_random *r);
/* numpy's random_interval: uniform in [0, max]. */
uint64_t mega_np_random_interval(mega_np_random *r, uint64_t max);
/* RandomState.shuffle of a one-dimensional array of n elements. */
void mega_np_shuffle_i32(mega_np_random *r, int32_t *x, int64_t n);
void mega_np_shuffle_i64(mega_np_random *r, int64_t *x, int64_t n);

#endif
