/* Per-element math shared by the cpu backend and the CUDA kernels. */
#ifndef MEGA_KERNELS_ELEMENTWISE_H
#define MEGA_KERNELS_ELEMENTWISE_H

#include <math.h>
#include <stdint.h>

#include "kernels/hd.h"

/* e^x in float, vectorisable (no table, no libm call): Cody-Waite range
 * reduction x = n ln2 + r and a degree-6 polynomial (Cephes' expf), about
 * 2 ulp. Inputs are clamped to [-87, 88]: below, the result is ~1e-38 rather
 * than 0 or a denormal. NaN propagates. */
static inline MEGA_HD float mega_expf(float x) {
  if (x != x) return x;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  /* n = round(x / ln2) by the 1.5 * 2^23 trick: no libm call, so it
   * vectorises. */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  union {
    int32_t i;
    float f;
  } scale;
  scale.i = (int32_t)((uint32_t)((int32_t)n + 127) << 23); /* n in [-126, 127] */
  return p * scale.f;
}

/* bf16 (--bf16): the top 16 bits of a float, rounded to nearest, ties to
 * even, as cuBLAS's and PyTorch's conversions do. Overflow rounds to
 * infinity; a NaN stays a (quiet) NaN rather than rounding into infinity. */
static inline MEGA_HD uint16_t mega_bf16_bits(float x) {
  union {
    float f;
    uint32_t u;
  } v = {x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  uint32_t lsb = (v.u >> 16) & 1u;
  return (uint16_t)((v.u + 0x7fffu + lsb) >> 16);
}

static inline MEGA_HD float mega_bf16_to_float(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)b << 16};
  return v.f;
}

/* x rounded to the nearest bf16, kept in a float (the cpu backend's GEMM
 * inputs under --bf16: the products of two such values are exact in fp32). */
static inline MEGA_HD float mega_bf16_round(float x) { return mega_bf16_to_float(mega_bf16_bits(x)); }

#define MEGA_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define MEGA_GELU_CUBE 0.044715f

/* GELU, tanh approximation (GPT-2's "gelu_new", Megatron's bias-GELU fusion
 * and --openai-gelu):
 * 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x * sigmoid(2u) = x / (1 + e^{-2u}): one exp and one division, and no
 * cancellation near the tails. The exponent is capped at 80 so nothing in
 * it or its gradient goes denormal. */
static inline MEGA_HD float mega_gelu_exp(float x) {
  float t = -2.0f * MEGA_GELU_SCALE * (x + MEGA_GELU_CUBE * x * x * x);
  return mega_expf(t > 80.0f ? 80.0f : t);
}

static inline MEGA_HD float mega_gelu(float x) { return x / (1.0f + mega_gelu_exp(x)); }

/* d gelu(x) / dx = s + 2 x u'(x) e s^2, with e = e^{-2u} and s = 1 / (1 + e)
 * (so that 1 - s = e s without cancellation). */
static inline MEGA_HD float mega_gelu_grad(float x) {
  float e = mega_gelu_exp(x);
  float s = 1.0f / (1.0f + e);
  float du = MEGA_GELU_SCALE * (1.0f + 3.0f * MEGA_GELU_CUBE * x * x);
  return s + 2.0f * x * du * (e * s) * s;
}

/* GELU, exact (erf) form (PyTorch's F.gelu, Hugging Face's "gelu"):
 * x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2), where
 * Megatron runs it (--no-bias-gelu-fusion, or --disable-bias-linear, without
 * --openai-gelu). erfc(z) for z >= 0 is Numerical Recipes' erfcc,
 * t e^{-z^2 + P(t)} with t = 1 / (1 + z/2) and P a degree-9 polynomial:
 * fractional error below 1.2e-7 everywhere, one exp and one division, no
 * libm call (so it vectorises, and the host and the device compute the
 * same). x < 0 takes the erfc directly, so the left tail keeps its relative
 * precision; x >= 0 takes 1 - erfc(x / sqrt 2) / 2. The exponent is capped
 * at -80 so nothing in it or its gradient goes denormal (as mega_gelu's). */
#define MEGA_GELU_RSQRT2 0.7071067811865476f   /* 1 / sqrt(2) */
#define MEGA_GELU_RSQRT2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

/* erfc(|x| / sqrt 2) */
static inline MEGA_HD float mega_gelu_erfc(float x) {
  float z = (x < 0.0f ? -x : x) * MEGA_GELU_RSQRT2;
  float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float a = p - 0.5f * x * x; /* z^2, with one rounding */
  return t * mega_expf(a < -80.0f ? -80.0f : a);
}

/* Phi(x), the standard normal's distribution function */
static inline MEGA_HD float mega_gelu_phi_cdf(float x) {
  float c = 0.5f * mega_gelu_erfc(x);
  return x < 0.0f ? c : 1.0f - c;
}

static inline MEGA_HD float mega_gelu_erf(float x) { return x * mega_gelu_phi_cdf(x); }

/* d gelu(x) / dx = Phi(x) + x phi(x), phi(x) = e^{-x^2/2} / sqrt(2 pi) */
static inline MEGA_HD float mega_gelu_erf_grad(float x) {
  float a = -0.5f * x * x;
  float pdf = MEGA_GELU_RSQRT2PI * mega_expf(a < -80.0f ? -80.0f : a);
  return mega_gelu_phi_cdf(x) + x * pdf;
}

/* sigmoid(x) = 1 / (1 + e^-x); e^-x saturates (mega_expf's clamp), so no
 * infinity or NaN for finite x. */
static inline MEGA_HD float mega_sigmoid(float x) { return 1.0f / (1.0f + mega_expf(-x)); }

/* SiLU (Llama's MLP activation, PyTorch's F.silu): x * sigmoid(x). */
static inline MEGA_HD float mega_silu(float x) { return x * mega_sigmoid(x); }

/* SwiGLU's gradients at one element: h = silu(g) * u, d = dL/dh:
 * du = d silu(g); dg = d u silu'(g), silu'(g) = s (1 + g (1 - s)) with
 * s = sigmoid(g) and 1 - s = e^-g s (no cancellation). d is read before
 * either write, so dg may alias the caller's d. */
static inline MEGA_HD void mega_swiglu_grad(float g, float u, float d, float *dg, float *du) {
  float e = mega_expf(-g), s = 1.0f / (1.0f + e);
  float silu = g * s;
  *du = d * silu;
  *dg = d * u * s * (1.0f + g * (e * s));
}

/* One rotary pair (x_i, x_{i+rot/2}) rotated by the angle whose cosine and
 * sine are c and s: Hugging Face's x cos + rotate_half(x) sin (s negated:
 * the inverse rotation, the backward). */
static inline MEGA_HD void mega_rope_pair(float *a, float *b, float c, float s) {
  float x1 = *a, x2 = *b;
  *a = x1 * c - x2 * s;
  *b = x2 * c + x1 * s;
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
