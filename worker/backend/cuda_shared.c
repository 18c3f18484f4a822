/* What the cuda backend's op files share (cuda_impl.h): the first failure
 * of an op that cannot return one (kept for the next op that can), device
 * scratch that grows, and --bf16's copies (cuda_b16.h) that an op reads,
 * says it overwrites, or produces as it writes. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "kernels/launch.h"
#include "worker/backend/cuda_b16.h"
#include "worker/backend/cuda_impl.h"

void mega_cu__note(mega_backend *be, int cuda_err, const char *what) {
  cuda_impl *c = impl_of(be);
  if (cuda_err == 0 || c->sticky != MEGA_OK) return;
  c->sticky = MEGA_ERR_INTERNAL;
  snprintf(c->why, sizeof c->why, "cuda backend: %s: %s", what,
           cudaGetErrorString((cudaError_t)cuda_err));
}

mega_status mega_cu__take_sticky(mega_backend *be, mega_err *err) {
  cuda_impl *c = impl_of(be);
  if (c->sticky == MEGA_OK) return MEGA_OK;
  return mega_fail(err, c->sticky, "%s", c->why);
}

mega_status mega_cu__check(mega_backend *be, cudaError_t e, const char *what, mega_err *err) {
  mega_status st = mega_cu__take_sticky(be, err);
  if (st != MEGA_OK) return st;
  if (e == cudaSuccess) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INTERNAL, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

void mega_cu__wrote(mega_backend *be, const void *p, size_t n) {
  if (p) mega_cu_b16_wrote(impl_of(be)->b16, p, n * sizeof(float));
}

uint16_t *mega_cu__produced(mega_backend *be, float *x, size_t n) {
  cuda_impl *c = impl_of(be);
  if (!c->bf16 || !c->b16) {
    mega_cu__wrote(be, x, n);
    return NULL;
  }
  int e;
  uint16_t *b = mega_cu_b16_put(c->b16, x, n, &e);
  mega_cu__note(be, e, "allocating a bf16 copy");
  return b;
}

void mega_cu__filled(mega_backend *be, int cuda_err, const char *what, float *x, float *y,
                     size_t n) {
  mega_cu__note(be, cuda_err, what);
  if (cuda_err) mega_cu__wrote(be, x, n), mega_cu__wrote(be, y, n);
}

cudaError_t mega_cu__dev_malloc(mega_backend *be, void **p, size_t bytes) {
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 64);
  if (e != cudaErrorMemoryAllocation || !impl_of(be)->b16) return e;
  cudaGetLastError();
  mega_cu_b16_release(impl_of(be)->b16);
  return cudaMalloc(p, bytes ? bytes : 64);
}

void *mega_cu__grow(mega_backend *be, void **buf, size_t *cap, size_t bytes, const char *what) {
  cuda_impl *c = impl_of(be);
  if (*cap >= bytes && *buf) return *buf;
  if (*buf) { /* the stream may still read it */
    mega_cu__note(be, cudaStreamSynchronize(c->stream), what);
    mega_cu__note(be, cudaFree(*buf), what);
  }
  *buf = NULL;
  *cap = 0;
  cudaError_t e = mega_cu__dev_malloc(be, buf, bytes);
  if (e != cudaSuccess) {
    *buf = NULL;
    mega_cu__note(be, e, what);
    return NULL;
  }
  *cap = bytes;
  return *buf;
}

const uint16_t *mega_cu__kept(mega_backend *be, const float *x, size_t n) {
  cuda_impl *c = impl_of(be);
  if (!c->b16) return NULL;
  int e;
  const uint16_t *b = mega_cu_b16_get(c->b16, x, n, &e);
  mega_cu__note(be, e, "rounding to bf16");
  return b;
}

const uint16_t *mega_cu__bf16_copy(mega_backend *be, int k, const float *x, size_t n) {
  cuda_impl *c = impl_of(be);
  const uint16_t *kb = mega_cu__kept(be, x, n);
  if (kb || c->sticky != MEGA_OK) return kb;
  uint16_t *b = mega_cu__grow(be, &c->bf16_buf[k], &c->bf16_cap[k], n * sizeof(uint16_t),
                              "allocating bf16 GEMM inputs");
  if (b) mega_cu__note(be, mega_cu_to_bf16((mega_cu_stream)c->stream, b, x, (int64_t)n),
                       "rounding to bf16");
  return b;
}
