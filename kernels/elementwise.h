/* Per-element math shared by the cpu backend and the CUDA kernels. */
#ifndef MEGA_KERNELS_ELEMENTWISE_H
#define MEGA_KERNELS_ELEMENTWISE_H

#include <math.h>

#include "kernels/hd.h"

#define MEGA_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define MEGA_GELU_CUBE 0.044715f

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
static inline MEGA_HD float mega_gelu(float x) {
  float cube = MEGA_GELU_CUBE * x * x * x;
  return 0.5f * x * (1.0f + tanhf(MEGA_GELU_SCALE * (x + cube)));
}

/* d gelu(x) / dx. */
static inline MEGA_HD float mega_gelu_grad(float x) {
  float cube = MEGA_GELU_CUBE * x * x * x;
  float th = tanhf(MEGA_GELU_SCALE * (x + cube));
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) +
         0.5f * x * sech2 * MEGA_GELU_SCALE * (1.0f + 3.0f * MEGA_GELU_CUBE * x * x);
}

/* One AdamW element update with decoupled weight decay. g is the gradient
 * already multiplied by any clipping scale; bc1 = 1 - beta1^step and
 * bc2 = 1 - beta2^step are the bias corrections. Updates *p, *m, *v. */
static inline MEGA_HD void mega_adamw_elem(float *p, float *m, float *v, float g,
                                           float lr, float beta1, float beta2,
                                           float eps, float wd, float bc1, float bc2) {
  float mi = beta1 * *m + (1.0f - beta1) * g;
  float vi = beta2 * *v + (1.0f - beta2) * g * g;
  *m = mi;
  *v = vi;
  float mhat = mi / bc1, vhat = vi / bc2;
  *p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * *p);
}

#endif
