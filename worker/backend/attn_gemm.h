/* Causal attention as batched GEMMs around a softmax pass, on any backend's
 * gemm_batched: the cuda backend's attention (per batch element, its heads
 * as one strided batch). The softmax passes are the caller's, so the same
 * composition runs on the cpu backend in tests/gpu/test_kernel_bodies.c
 * with the kernel bodies, where its strides are checked against the cpu
 * backend's own attention. Shapes and the scratch size are backend.h's. */
#ifndef MEGA_WORKER_ATTN_GEMM_H
#define MEGA_WORKER_ATTN_GEMM_H

#include <stdint.h>

#include "worker/backend/backend.h"

typedef struct mega_attn_softmax {
  /* rows of [rows, T] scores, already scaled: causal softmax in place */
  void (*forward)(mega_backend *be, float *att, int64_t rows, int T);
  /* da = scale * a * (da - sum a*da) over the causal part, in place */
  void (*backward)(mega_backend *be, float *da, const float *att, int64_t rows, int T,
                   float scale);
} mega_attn_softmax;

void mega_attn_gemm_forward(mega_backend *be, const mega_attn_softmax *sm, float *out,
                            float *att, const float *q, const float *k, const float *v,
                            const mega_attn_dims *d);
void mega_attn_gemm_backward(mega_backend *be, const mega_attn_softmax *sm, float *dq,
                             float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *att,
                             const mega_attn_dims *d);

#endif
