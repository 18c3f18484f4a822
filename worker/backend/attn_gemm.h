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
  /* dst = d->drop's mask and scale on src, the call's [B, NH, T, T]
   * probabilities (or their gradient), zeros above the diagonal; dst may
   * be src. Called only when d->drop has a mask. */
  void (*dropout)(mega_backend *be, float *dst, const float *src, const mega_attn_dims *d);
} mega_attn_softmax;

/* With attention dropout (d->drop), att keeps the undropped probabilities
 * (the softmax backward needs them) and the dropped ones that multiply v
 * are made in scratch, which the forward uses for nothing else; the
 * backward draws the mask again, for dv and for the probabilities'
 * gradient (cpu_attention.c's math). */
void mega_attn_gemm_forward(mega_backend *be, const mega_attn_softmax *sm, float *out,
                            float *att, float *scratch, const float *q, const float *k,
                            const float *v, const mega_attn_dims *d);
void mega_attn_gemm_backward(mega_backend *be, const mega_attn_softmax *sm, float *dq,
                             float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *att,
                             const mega_attn_dims *d);

#endif
