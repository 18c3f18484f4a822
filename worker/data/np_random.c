#include "worker/data/np_random.h"

#include <string.h>

#define N 624
#define M 397

void mega_np_random_seed(mega_np_random *r, uint32_t seed) {
  r->mt[0] = seed;
  for (int i = 1; i < N; i++)
    r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
  r->pos = N;
}

/* MT19937's regeneration of all 624 words. */
static void regenerate(mega_np_random *r) {
  static const uint32_t mag[2] = {0u, 0x9908b0dfu};
  uint32_t *mt = r->mt;
  int k;
  for (k = 0; k < N - M; k++) {
    uint32_t y = (mt[k] & 0x80000000u) | (mt[k + 1] & 0x7fffffffu);
    mt[k] = mt[k + M] ^ (y >> 1) ^ mag[y & 1u];
  }
  for (; k < N - 1; k++) {
    uint32_t y = (mt[k] & 0x80000000u) | (mt[k + 1] & 0x7fffffffu);
    mt[k] = mt[k + (M - N)] ^ (y >> 1) ^ mag[y & 1u];
  }
  uint32_t y = (mt[N - 1] & 0x80000000u) | (mt[0] & 0x7fffffffu);
  mt[N - 1] = mt[M - 1] ^ (y >> 1) ^ mag[y & 1u];
  r->pos = 0;
}

uint32_t mega_np_random_u32(mega_np_random *r) {
  if (r->pos == N) regenerate(r);
  uint32_t y = r->mt[r->pos++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t mega_np_random_interval(mega_np_random *r, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t v;
  if (max <= 0xffffffffu) {
    do v = mega_np_random_u32(r) & mask; while (v > max);
  } else {
    do {
      uint64_t hi = mega_np_random_u32(r);
      v = ((hi << 32) | mega_np_random_u32(r)) & mask;
    } while (v > max);
  }
  return v;
}

/* numpy's _shuffle_raw: the draws do not depend on the element type. */
static void shuffle_raw(mega_np_random *r, uint8_t *x, int64_t n, size_t size) {
  uint8_t t[8];
  for (int64_t i = n - 1; i >= 1; i--) {
    int64_t j = (int64_t)mega_np_random_interval(r, (uint64_t)i);
    memcpy(t, x + (size_t)i * size, size);
    memcpy(x + (size_t)i * size, x + (size_t)j * size, size);
    memcpy(x + (size_t)j * size, t, size);
  }
}

void mega_np_shuffle_i32(mega_np_random *r, int32_t *x, int64_t n) {
  shuffle_raw(r, (uint8_t *)x, n, sizeof *x);
}

void mega_np_shuffle_i64(mega_np_random *r, int64_t *x, int64_t n) {
  shuffle_raw(r, (uint8_t *)x, n, sizeof *x);
}
