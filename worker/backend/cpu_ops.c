/* The cpu backend's element and row kernels: encoder, layernorm, GELU,
 * residual, softmax cross-entropy. Loops run along the contiguous channel
 * axis so they vectorise. */
#include <math.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

MEGA_CPU_CLONES
void mega_cpu_encoder_forward(mega_backend *be, float *out, const int32_t *tok,
                              const float *wte, const float *wpe, int B, int T, int C) {
  (void)be;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((size_t)b * T + t) * C;
      const float *e = wte + (size_t)tok[b * T + t] * C, *p = wpe + (size_t)t * C;
      for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
    }
}

MEGA_CPU_CLONES
void mega_cpu_encoder_backward(mega_backend *be, float *dwte, float *dwpe,
                               const float *dout, const int32_t *tok, int B, int T, int C) {
  (void)be;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((size_t)b * T + t) * C;
      if (dwte) {
        float *e = dwte + (size_t)tok[b * T + t] * C;
        for (int i = 0; i < C; i++) e[i] += d[i];
      }
      if (dwpe) {
        float *p = dwpe + (size_t)t * C;
        for (int i = 0; i < C; i++) p[i] += d[i];
      }
    }
}

MEGA_CPU_CLONES
void mega_cpu_layernorm_forward(mega_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *w, const float *b, int N,
                                int C, float eps) {
  (void)be;
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int i = 0; i < C; i++) s += x[i];
    float m = s / C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
      float d = x[i] - m;
      v += d * d;
    }
    float r = 1.0f / sqrtf(v / C + eps);
    float *o = out + (size_t)n * C;
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * r * w[i] + b[i];
    mean[n] = m;
    rstd[n] = r;
  }
}

MEGA_CPU_CLONES
void mega_cpu_layernorm_backward_input(mega_backend *be, float *dinp, const float *dout,
                                       const float *inp, const float *w,
                                       const float *mean, const float *rstd, int N, int C) {
  (void)be;
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    /* dxhat = d * w; dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = 0; i < C; i++) {
      float dn = d[i] * w[i];
      s1 += dn;
      s2 += dn * (x[i] - m) * r;
    }
    s1 /= C;
    s2 /= C;
    float *di = dinp + (size_t)n * C;
    for (int i = 0; i < C; i++) {
      float xhat = (x[i] - m) * r;
      di[i] += (d[i] * w[i] - s1 - xhat * s2) * r;
    }
  }
}

MEGA_CPU_CLONES
void mega_cpu_layernorm_backward_weight(mega_backend *be, float *dw, float *db,
                                        const float *dout, const float *inp,
                                        const float *mean, const float *rstd, int N,
                                        int C) {
  (void)be;
  for (int n = 0; n < N; n++) {
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    for (int i = 0; i < C; i++) {
      dw[i] += d[i] * (x[i] - m) * r;
      db[i] += d[i];
    }
  }
}

MEGA_CPU_CLONES
void mega_cpu_gelu_forward(mega_backend *be, float *out, const float *inp, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) out[i] = mega_gelu(inp[i]);
}

MEGA_CPU_CLONES
void mega_cpu_gelu_backward(mega_backend *be, float *dinp, const float *inp,
                            const float *dout, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) dinp[i] = mega_gelu_grad(inp[i]) * dout[i];
}

MEGA_CPU_CLONES
void mega_cpu_residual_forward(mega_backend *be, float *out, const float *a,
                               const float *b, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

MEGA_CPU_CLONES
void mega_cpu_add_inplace(mega_backend *be, float *out, const float *a, size_t n) {
  (void)be;
  for (size_t i = 0; i < n; i++) out[i] += a[i];
}

/* loss = logsumexp(logits) - logits[target], computed from the max-shifted
 * row so it is exact to float rounding even when probs[target] underflows. */
MEGA_CPU_CLONES
void mega_cpu_crossentropy_forward(mega_backend *be, float *losses, float *probs,
                                   const float *logits, const int32_t *targets, int N,
                                   int V) {
  (void)be;
  for (int n = 0; n < N; n++) {
    const float *l = logits + (size_t)n * V;
    float *p = probs + (size_t)n * V;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    float s = 0.0f;
    for (int i = 0; i < V; i++) {
      p[i] = mega_expf(l[i] - mx);
      s += p[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < V; i++) p[i] *= inv;
    losses[n] = logf(s) + mx - l[targets[n]];
  }
}

MEGA_CPU_CLONES
void mega_cpu_crossentropy_backward(mega_backend *be, float *dlogits, const float *probs,
                                    const int32_t *targets, float scale, int N, int V) {
  (void)be;
  for (int n = 0; n < N; n++) {
    const float *p = probs + (size_t)n * V;
    float *d = dlogits + (size_t)n * V;
    for (int i = 0; i < V; i++) d[i] = p[i] * scale;
    d[targets[n]] -= scale;
  }
}
