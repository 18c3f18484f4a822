/* --bf16's kept copies (cuda_b16.h): a small table scanned linearly (a
 * GPT's step keeps a few hundred), least recently used out first. */
#include <pthread.h>
#include <stdlib.h>

#include "kernels/launch.h"
#include "worker/backend/cuda_b16.h"

#define B16_MAX 1024 /* copies; past it the oldest go, as past the budget */

typedef struct b16_entry {
  uintptr_t src;
  size_t n; /* floats */
  uint16_t *b;
  uint64_t used; /* tick of the last get */
} b16_entry;

struct mega_cu_b16 {
  pthread_mutex_t mu; /* NCCL operations may be posted from another thread */
  cudaStream_t stream;
  size_t budget, bytes;
  b16_entry e[B16_MAX];
  int count;
  uint64_t tick;
  mega_cu_b16_stats st;
};

mega_cu_b16 *mega_cu_b16_create(int device, cudaStream_t stream, size_t budget) {
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
      !pools)
    return NULL;
  /* keep freed blocks in the pool: the same sizes come back every step */
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  mega_cu_b16 *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  c->stream = stream;
  c->budget = budget;
  return c;
}

static void drop(mega_cu_b16 *c, int i) {
  cudaFreeAsync(c->e[i].b, c->stream); /* after the queued readers */
  c->bytes -= c->e[i].n * sizeof(uint16_t);
  c->e[i] = c->e[--c->count];
  c->st.dropped++;
}

void mega_cu_b16_clear(mega_cu_b16 *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  while (c->count > 0) drop(c, c->count - 1);
  pthread_mutex_unlock(&c->mu);
}

void mega_cu_b16_destroy(mega_cu_b16 *c) {
  if (!c) return;
  mega_cu_b16_clear(c);
  cudaStreamSynchronize(c->stream);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void mega_cu_b16_wrote(mega_cu_b16 *c, const void *p, size_t bytes) {
  if (!c || !bytes) return;
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  pthread_mutex_lock(&c->mu);
  for (int i = c->count - 1; i >= 0; i--) {
    uintptr_t a = c->e[i].src, z = a + c->e[i].n * sizeof(float);
    if (a < hi && lo < z) drop(c, i);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Never the copies of the last few gets: one op takes up to four (q, k, v
 * and dO) and its GEMM is not queued yet. Past the budget rather than that. */
#define B16_PINNED 4

static void make_room(mega_cu_b16 *c, size_t bytes) {
  while (c->count == B16_MAX || c->bytes + bytes > c->budget) {
    int old = -1;
    for (int i = 0; i < c->count; i++)
      if (c->e[i].used + B16_PINNED <= c->tick && (old < 0 || c->e[i].used < c->e[old].used))
        old = i;
    if (old < 0) return;
    drop(c, old);
  }
}

const uint16_t *mega_cu_b16_get(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err) {
  *cuda_err = 0;
  pthread_mutex_lock(&c->mu);
  c->tick++;
  for (int i = 0; i < c->count; i++)
    if (c->e[i].src == (uintptr_t)x && c->e[i].n == n) {
      uint16_t *b = c->e[i].b;
      c->e[i].used = c->tick;
      c->st.hits++;
      pthread_mutex_unlock(&c->mu);
      return b;
    }
  size_t bytes = n * sizeof(uint16_t);
  make_room(c, bytes);
  void *b = NULL;
  cudaError_t e = c->count < B16_MAX ? cudaMallocAsync(&b, bytes ? bytes : 64, c->stream)
                                     : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = (cudaError_t)mega_cu_to_bf16(c->stream, b, x, (int64_t)n);
  if (e != cudaSuccess) {
    if (b) cudaFreeAsync(b, c->stream);
    *cuda_err = (int)e;
    pthread_mutex_unlock(&c->mu);
    return NULL;
  }
  c->e[c->count++] = (b16_entry){.src = (uintptr_t)x, .n = n, .b = b, .used = c->tick};
  c->bytes += bytes;
  c->st.misses++;
  pthread_mutex_unlock(&c->mu);
  return b;
}

mega_cu_b16_stats mega_cu_b16_stats_of(const mega_cu_b16 *c) {
  mega_cu_b16_stats s = {0};
  if (!c) return s;
  pthread_mutex_lock((pthread_mutex_t *)&c->mu);
  s = c->st;
  s.copies = (size_t)c->count;
  s.bytes = c->bytes;
  pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
  return s;
}
