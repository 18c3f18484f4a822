/* A counter-based RNG: every draw is a pure function of (key, counter), so
 * any slice of a tensor can be generated alone and equals the same slice of
 * the whole (pipeline and tensor-parallel shards initialise identically).
 * splitmix64 mixes; Box-Muller turns two uniforms into a normal. */
#ifndef MEGA_KERNELS_RNG_H
#define MEGA_KERNELS_RNG_H

#include <math.h>
#include <stdint.h>

#include "kernels/hd.h"

static inline MEGA_HD uint64_t mega_splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* FNV-1a of a NUL-terminated string: turns a tensor's name into a key. */
static inline MEGA_HD uint64_t mega_hash_str(const char *s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001B3ull;
  }
  return h;
}

/* The stream key of (seed, tensor name). */
static inline MEGA_HD uint64_t mega_rng_key(uint64_t seed, const char *name) {
  return mega_splitmix64(seed ^ mega_splitmix64(mega_hash_str(name)));
}

/* Uniform in (0, 1): 53 random bits, never 0. */
static inline MEGA_HD double mega_rng_uniform(uint64_t key, uint64_t counter) {
  uint64_t r = mega_splitmix64(key ^ mega_splitmix64(counter));
  return ((double)(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal number i of the stream key (Box-Muller, cosine branch). */
static inline MEGA_HD double mega_rng_normal(uint64_t key, uint64_t i) {
  double u1 = mega_rng_uniform(key, 2 * i), u2 = mega_rng_uniform(key, 2 * i + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Element i of a tensor's initial values, std * N(0, 1) drawn at the full
 * tensor's index (i / w) * stride + off + i % w: a tensor-parallel slice's
 * rows of width w out of rows of stride, from column off (w = stride, off
 * 0: the whole tensor; worker/model/tp_split.h's mapping). The backends'
 * init_normal runs it over every i. */
static inline MEGA_HD void mega_rng_init_normal(int64_t i, float *dst, uint64_t key, double std,
                                                int64_t w, int64_t stride, int64_t off) {
  int64_t full = i / w * stride + off + i % w;
  dst[i] = (float)(std * mega_rng_normal(key, (uint64_t)full));
}

#endif
