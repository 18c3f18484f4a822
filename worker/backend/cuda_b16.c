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
  uint64_t used; /* tick of the last get or of the put */
} b16_entry;

struct mega_cu_b16 {
  /* Ops and NCCL operations are posted from the rank's training thread: a
   * copy handed out is pinned (below) only against its own thread. The
   * mutex keeps the table whole should another thread post. */
  pthread_mutex_t mu;
  int device;
  cudaStream_t stream;
  size_t budget, bytes;
  b16_entry e[B16_MAX];
  int count;
  uint64_t tick;
};

mega_cu_b16 *mega_cu_b16_create(int device, cudaStream_t stream, size_t budget) {
  int pools = 0;
  cudaMemPool_t pool;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
      !pools || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess)
    return NULL;
  mega_cu_b16 *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  /* the pool keeps what it frees, up to the budget, for the same sizes the
   * next step asks; past that it gives memory back at synchronizations */
  uint64_t keep = budget;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  pthread_mutex_init(&c->mu, NULL);
  c->device = device;
  c->stream = stream;
  c->budget = budget;
  return c;
}

static void drop(mega_cu_b16 *c, int i) {
  cudaFreeAsync(c->e[i].b, c->stream); /* after the queued readers */
  c->bytes -= c->e[i].n * sizeof(uint16_t);
  c->e[i] = c->e[--c->count];
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

static void drop_overlapping(mega_cu_b16 *c, uintptr_t lo, uintptr_t hi) {
  for (int i = c->count - 1; i >= 0; i--) {
    uintptr_t a = c->e[i].src, z = a + c->e[i].n * sizeof(float);
    if (a < hi && lo < z) drop(c, i);
  }
}

void mega_cu_b16_wrote(mega_cu_b16 *c, const void *p, size_t bytes) {
  if (!c || !bytes) return;
  pthread_mutex_lock(&c->mu);
  drop_overlapping(c, (uintptr_t)p, (uintptr_t)p + bytes);
  pthread_mutex_unlock(&c->mu);
}

/* Never the copies of the last few gets and puts: one op takes up to five
 * before its work is queued (cuDNN attention's backward: q, k, v and dO,
 * then the put its gradients go to), a producer's kernel is not queued yet
 * when put returns. Past the budget rather than that. */
#define B16_PINNED 5

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

/* Every unpinned copy out, and the pool trimmed to what is left. */
static void squeeze(mega_cu_b16 *c) {
  for (int i = c->count - 1; i >= 0; i--)
    if (c->e[i].used + B16_PINNED <= c->tick) drop(c, i);
  cudaMemPool_t pool;
  cudaStreamSynchronize(c->stream); /* the frees above, done */
  if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
}

void mega_cu_b16_release(mega_cu_b16 *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  squeeze(c); /* not the pinned: an op may hold one whose GEMM is not queued yet */
  pthread_mutex_unlock(&c->mu);
}

/* A new entry for (x, n), pinned as the tick's, its memory unfilled; NULL
 * with *cuda_err 0 when there is no room even after squeezing. */
static uint16_t *add(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err) {
  size_t bytes = n * sizeof(uint16_t);
  make_room(c, bytes);
  void *b = NULL;
  cudaError_t e = c->count < B16_MAX ? cudaMallocAsync(&b, bytes, c->stream)
                                     : cudaErrorMemoryAllocation;
  if (e == cudaErrorMemoryAllocation) { /* the model's own memory left too little */
    cudaGetLastError();
    squeeze(c);
    b = NULL;
    e = c->count < B16_MAX ? cudaMallocAsync(&b, bytes, c->stream) : cudaErrorMemoryAllocation;
    if (e == cudaErrorMemoryAllocation) { /* no room: the caller does without */
      cudaGetLastError();
      return NULL;
    }
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    *cuda_err = (int)e;
    return NULL;
  }
  c->e[c->count++] = (b16_entry){.src = (uintptr_t)x, .n = n, .b = b, .used = c->tick};
  c->bytes += bytes;
  return b;
}

const uint16_t *mega_cu_b16_get(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err) {
  *cuda_err = 0;
  if (!n) return NULL; /* nothing to keep */
  pthread_mutex_lock(&c->mu);
  c->tick++;
  uint16_t *b = NULL;
  for (int i = 0; i < c->count && !b; i++)
    if (c->e[i].src == (uintptr_t)x && c->e[i].n == n) {
      b = c->e[i].b;
      c->e[i].used = c->tick;
    }
  if (!b && (b = add(c, x, n, cuda_err))) {
    cudaError_t e = (cudaError_t)mega_cu_to_bf16(c->stream, b, x, (int64_t)n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      *cuda_err = (int)e;
      drop(c, c->count - 1); /* add's */
      b = NULL;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return b;
}

uint16_t *mega_cu_b16_put(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err) {
  *cuda_err = 0;
  if (!c || !n) return NULL;
  pthread_mutex_lock(&c->mu);
  drop_overlapping(c, (uintptr_t)x, (uintptr_t)(x + n));
  c->tick++;
  uint16_t *b = add(c, x, n, cuda_err);
  pthread_mutex_unlock(&c->mu);
  return b;
}
