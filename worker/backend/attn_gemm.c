/* Attention as batched GEMMs (attn_gemm.h). Query head h = g * rep + r of
 * batch element b (rep = NH / G query heads per key/value head g): q_h is
 * the [T, hs] view of q at column h * hs (row stride ldq), k_g and v_g of k
 * and v at column g * hs (stride ldkv). For each (b, r) the G heads
 * g * rep + r are one strided batch: q steps rep * hs, k and v hs, the
 * probabilities rep * T * T. A key or value head's gradient sums its rep
 * query heads': the first writes it (beta 0), the others add (beta 1).
 * Attention dropout: attn_gemm.h. */
#include "worker/backend/attn_gemm.h"

#include <math.h>

void mega_attn_gemm_forward(mega_backend *be, const mega_attn_softmax *sm, float *out,
                            float *att, float *scratch, const float *q, const float *k,
                            const float *v, const mega_attn_dims *d) {
  const mega_backend_ops *o = be->ops;
  int T = d->T, hs = d->hs, NH = d->NH, G = d->G, rep = NH / G, ldo = NH * hs;
  int64_t tt = (int64_t)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < d->B; b++)
    for (int r = 0; r < rep; r++) { /* a_h = scale * q_h k_g^T */
      const float *qb = q + (size_t)b * T * d->ldq + (size_t)r * hs;
      o->gemm_batched(be, false, true, T, T, hs, scale, qb, d->ldq, (int64_t)rep * hs,
                      k + (size_t)b * T * d->ldkv, d->ldkv, hs, 0.0f,
                      att + ((size_t)b * NH + r) * tt, T, rep * tt, G);
    }
  sm->forward(be, att, (int64_t)d->B * NH * T, T);
  const float *pa = att; /* the probabilities that multiply v */
  if (d->drop.scale != 0.0f) {
    sm->dropout(be, scratch, att, d);
    pa = scratch;
  }
  for (int b = 0; b < d->B; b++)
    for (int r = 0; r < rep; r++) /* out_h = a_h v_g, into out's head columns */
      o->gemm_batched(be, false, false, T, hs, T, 1.0f, pa + ((size_t)b * NH + r) * tt, T,
                      rep * tt, v + (size_t)b * T * d->ldkv, d->ldkv, hs, 0.0f,
                      out + (size_t)b * T * ldo + (size_t)r * hs, ldo, (int64_t)rep * hs, G);
}

void mega_attn_gemm_backward(mega_backend *be, const mega_attn_softmax *sm, float *dq,
                             float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *att,
                             const mega_attn_dims *d) {
  const mega_backend_ops *o = be->ops;
  int T = d->T, hs = d->hs, NH = d->NH, G = d->G, rep = NH / G, ldo = NH * hs;
  int ldq = d->ldq, ldkv = d->ldkv;
  int64_t tt = (int64_t)T * T, sq = (int64_t)rep * hs, sa = rep * tt;
  float scale = 1.0f / sqrtf((float)hs);
  bool drop = d->drop.scale != 0.0f;
  float *da = scratch; /* [B, NH, T, T] */
  /* dv_g += a_h^T dy_h first, a as the forward multiplied v: with dropout
   * the dropped probabilities, made in da before it holds the gradient */
  const float *pa = att;
  if (drop) {
    sm->dropout(be, da, att, d);
    pa = da;
  }
  for (int b = 0; b < d->B; b++)
    for (int r = 0; r < rep; r++)
      o->gemm_batched(be, true, false, T, hs, T, 1.0f, pa + ((size_t)b * NH + r) * tt, T, sa,
                      dout + (size_t)b * T * ldo + (size_t)r * hs, ldo, sq,
                      r == 0 ? 0.0f : 1.0f, dv + (size_t)b * T * ldkv, ldkv, hs, G);
  for (int b = 0; b < d->B; b++)
    for (int r = 0; r < rep; r++) /* da_h = dy_h v_g^T */
      o->gemm_batched(be, false, true, T, T, hs, 1.0f, dout + (size_t)b * T * ldo + (size_t)r * hs,
                      ldo, sq, v + (size_t)b * T * ldkv, ldkv, hs, 0.0f,
                      da + ((size_t)b * NH + r) * tt, T, sa, G);
  /* the dropped probabilities' gradient, times the mask and scale: the
   * probabilities' own */
  if (drop) sm->dropout(be, da, da, d);
  sm->backward(be, da, att, (int64_t)d->B * NH * T, T, scale);
  for (int b = 0; b < d->B; b++) {
    size_t qo = (size_t)b * T * ldq, ko = (size_t)b * T * ldkv;
    for (int r = 0; r < rep; r++) {
      size_t h0 = (size_t)r * hs;
      const float *dp = da + ((size_t)b * NH + r) * tt;
      float beta = r == 0 ? 0.0f : 1.0f;
      /* dq_h = dpre_h k_g; dk_g += dpre_h^T q_h */
      o->gemm_batched(be, false, false, T, hs, T, 1.0f, dp, T, sa, k + ko, ldkv, hs, 0.0f,
                      dq + qo + h0, ldq, sq, G);
      o->gemm_batched(be, true, false, T, hs, T, 1.0f, dp, T, sa, q + qo + h0, ldq, sq, beta,
                      dk + ko, ldkv, hs, G);
    }
  }
}
