/* Attention as batched GEMMs (attn_gemm.h). Head h of batch element b:
 * q, k, v are [T, hs] views of qkv at column h*hs (row stride 3C), so the
 * heads of one element are one strided batch (stride hs). */
#include "worker/backend/attn_gemm.h"

#include <math.h>

void mega_attn_gemm_forward(mega_backend *be, const mega_attn_softmax *sm, float *out,
                            float *att, const float *qkv, int B, int T, int C, int NH) {
  const mega_backend_ops *o = be->ops;
  int hs = C / NH, C3 = 3 * C;
  int64_t tt = (int64_t)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) { /* a_h = scale * q_h k_h^T */
    const float *q = qkv + (size_t)b * T * C3;
    o->gemm_batched(be, false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, 0.0f,
                    att + (size_t)b * NH * tt, T, tt, NH);
  }
  sm->forward(be, att, (int64_t)B * NH * T, T);
  for (int b = 0; b < B; b++) /* out_h = a_h v_h, into out's head columns */
    o->gemm_batched(be, false, false, T, hs, T, 1.0f, att + (size_t)b * NH * tt, T, tt,
                    qkv + (size_t)b * T * C3 + 2 * C, C3, hs, 0.0f, out + (size_t)b * T * C, C,
                    hs, NH);
}

void mega_attn_gemm_backward(mega_backend *be, const mega_attn_softmax *sm, float *dqkv,
                             float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH) {
  const mega_backend_ops *o = be->ops;
  int hs = C / NH, C3 = 3 * C;
  int64_t tt = (int64_t)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  float *da = scratch; /* [B, NH, T, T] */
  for (int b = 0; b < B; b++) /* da_h = dy_h v_h^T */
    o->gemm_batched(be, false, true, T, T, hs, 1.0f, dout + (size_t)b * T * C, C, hs,
                    qkv + (size_t)b * T * C3 + 2 * C, C3, hs, 0.0f, da + (size_t)b * NH * tt, T,
                    tt, NH);
  sm->backward(be, da, att, (int64_t)B * NH * T, T, scale);
  for (int b = 0; b < B; b++) {
    size_t off = (size_t)b * T * C3;
    const float *q = qkv + off, *k = q + C, *dy = dout + (size_t)b * T * C;
    float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    const float *dp = da + (size_t)b * NH * tt, *a = att + (size_t)b * NH * tt;
    /* dq_h = dpre_h k_h; dk_h = dpre_h^T q_h; dv_h = a_h^T dy_h */
    o->gemm_batched(be, false, false, T, hs, T, 1.0f, dp, T, tt, k, C3, hs, 0.0f, dq, C3, hs, NH);
    o->gemm_batched(be, true, false, T, hs, T, 1.0f, dp, T, tt, q, C3, hs, 0.0f, dk, C3, hs, NH);
    o->gemm_batched(be, true, false, T, hs, T, 1.0f, a, T, tt, dy, C, hs, 0.0f, dv, C3, hs, NH);
  }
}
