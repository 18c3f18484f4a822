/* The cpu backend's element and row kernels: encoder, layernorm, GELU,
 * residual, softmax cross-entropy, and the bf16 rounding of GEMM and
 * attention inputs. Each is a range function over rows (or elements, or
 * channels for the reductions over rows, so threads never write the same
 * float) run through the backend's thread pool. Inner loops run along the
 * contiguous channel axis so they vectorise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

/* Rows per chunk: about MEGA_CPU_GRAIN_ELEMS floats. */
static int64_t row_grain(int64_t width) {
  int64_t g = MEGA_CPU_GRAIN_ELEMS / (width > 0 ? width : 1);
  return g > 0 ? g : 1;
}

/* ---- encoder ---- */

typedef struct enc_ctx {
  float *out, *dwte, *dwpe;
  const float *wte, *wpe, *dout;
  const int32_t *tok;
  int v0, vn, B, T, C;
} enc_ctx;

/* This slice's row of token r's id, or NULL when the id is outside it. */
static inline int64_t enc_row(const enc_ctx *c, int64_t r) {
  int64_t id = (int64_t)c->tok[r] - c->v0;
  return id >= 0 && id < c->vn ? id : -1;
}

MEGA_CPU_CLONES
static void enc_fwd_rows(void *vc, int64_t r0, int64_t r1) {
  const enc_ctx *c = vc;
  for (int64_t r = r0; r < r1; r++) {
    float *o = c->out + r * c->C;
    int64_t id = enc_row(c, r);
    const float *p = c->wpe ? c->wpe + (r % c->T) * c->C : NULL;
    if (id >= 0 && p) {
      const float *e = c->wte + id * c->C;
      for (int i = 0; i < c->C; i++) o[i] = e[i] + p[i];
    } else if (id >= 0) {
      memcpy(o, c->wte + id * c->C, (size_t)c->C * sizeof *o);
    } else if (p) {
      memcpy(o, p, (size_t)c->C * sizeof *o);
    } else {
      memset(o, 0, (size_t)c->C * sizeof *o);
    }
  }
}

void mega_cpu_encoder_forward(mega_backend *be, float *out, const int32_t *tok,
                              const float *wte, int v0, int vn, const float *wpe, int B, int T,
                              int C) {
  enc_ctx c = {.out = out, .wte = wte, .wpe = wpe, .tok = tok, .v0 = v0, .vn = vn,
               .B = B, .T = T, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)B * T, row_grain(C), enc_fwd_rows, &c);
}

/* Threads own channel ranges, so two rows with the same token never race. */
MEGA_CPU_CLONES
static void enc_bwd_cols(void *vc, int64_t c0, int64_t c1) {
  const enc_ctx *c = vc;
  for (int64_t r = 0; r < (int64_t)c->B * c->T; r++) {
    const float *d = c->dout + r * c->C;
    int64_t id = c->dwte ? enc_row(c, r) : -1;
    if (id >= 0) {
      float *e = c->dwte + id * c->C;
      for (int64_t i = c0; i < c1; i++) e[i] += d[i];
    }
    if (c->dwpe) {
      float *p = c->dwpe + (r % c->T) * c->C;
      for (int64_t i = c0; i < c1; i++) p[i] += d[i];
    }
  }
}

void mega_cpu_encoder_backward(mega_backend *be, float *dwte, int v0, int vn, float *dwpe,
                               const float *dout, const int32_t *tok, int B, int T, int C) {
  enc_ctx c = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .tok = tok, .v0 = v0, .vn = vn,
               .B = B, .T = T, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), C, 64, enc_bwd_cols, &c);
}

/* ---- layernorm ---- */

typedef struct ln_ctx {
  float *out, *mean, *rstd, *dinp, *dw, *db;
  const float *inp, *w, *b, *dout, *cmean, *crstd, *dres;
  int N, C;
  float eps;
} ln_ctx;

MEGA_CPU_CLONES
static void ln_fwd_rows(void *vc, int64_t n0, int64_t n1) {
  const ln_ctx *c = vc;
  int C = c->C;
  int C16 = C / MEGA_LANES * MEGA_LANES;
  for (int64_t n = n0; n < n1; n++) {
    const float *x = c->inp + n * C;
    float acc[MEGA_LANES] = {0};
    for (int i = 0; i < C16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] += x[i + k];
    float s = mega_lanes_sum(acc);
    for (int i = C16; i < C; i++) s += x[i];
    float m = s / C;
    for (int k = 0; k < MEGA_LANES; k++) acc[k] = 0.0f;
    for (int i = 0; i < C16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) {
        float d = x[i + k] - m;
        acc[k] += d * d;
      }
    float v = mega_lanes_sum(acc);
    for (int i = C16; i < C; i++) v += (x[i] - m) * (x[i] - m);
    float r = 1.0f / sqrtf(v / C + c->eps);
    float *o = c->out + n * C;
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * r * c->w[i] + c->b[i];
    c->mean[n] = m;
    c->rstd[n] = r;
  }
}

void mega_cpu_layernorm_forward(mega_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *w, const float *b, int N,
                                int C, float eps) {
  ln_ctx c = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .w = w, .b = b, .N = N,
              .C = C, .eps = eps};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(C), ln_fwd_rows, &c);
}

MEGA_CPU_CLONES
static void ln_bwd_in_rows(void *vc, int64_t n0, int64_t n1) {
  const ln_ctx *c = vc;
  int C = c->C, C16 = C / MEGA_LANES * MEGA_LANES;
  const float *w = c->w;
  for (int64_t n = n0; n < n1; n++) {
    const float *x = c->inp + n * C, *d = c->dout + n * C;
    float m = c->cmean[n], r = c->crstd[n];
    /* dxhat = d * w; dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
    float a1[MEGA_LANES] = {0}, a2[MEGA_LANES] = {0};
    for (int i = 0; i < C16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) {
        float dn = d[i + k] * w[i + k];
        a1[k] += dn;
        a2[k] += dn * (x[i + k] - m) * r;
      }
    float s1 = mega_lanes_sum(a1), s2 = mega_lanes_sum(a2);
    for (int i = C16; i < C; i++) {
      float dn = d[i] * w[i];
      s1 += dn;
      s2 += dn * (x[i] - m) * r;
    }
    s1 /= C;
    s2 /= C;
    float *di = c->dinp + n * C;
    const float *dr = c->dres ? c->dres + n * C : NULL;
    if (dr) {
      for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * r;
        di[i] = dr[i] + (d[i] * w[i] - s1 - xhat * s2) * r;
      }
    } else {
      for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * r;
        di[i] = (d[i] * w[i] - s1 - xhat * s2) * r;
      }
    }
  }
}

void mega_cpu_layernorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                       const float *dout, const float *inp, const float *w,
                                       const float *mean, const float *rstd, int N, int C) {
  ln_ctx c = {.dinp = dinp, .dres = dres, .dout = dout, .inp = inp, .w = w, .cmean = mean,
              .crstd = rstd, .N = N, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(C), ln_bwd_in_rows, &c);
}

/* Over a channel range: each thread sums its columns over all rows. */
MEGA_CPU_CLONES
static void ln_bwd_w_cols(void *vc, int64_t i0, int64_t i1) {
  const ln_ctx *c = vc;
  for (int64_t n = 0; n < c->N; n++) {
    const float *x = c->inp + n * c->C, *d = c->dout + n * c->C;
    float m = c->cmean[n], r = c->crstd[n];
    for (int64_t i = i0; i < i1; i++) {
      c->dw[i] += d[i] * (x[i] - m) * r;
      c->db[i] += d[i];
    }
  }
}

void mega_cpu_layernorm_backward_weight(mega_backend *be, float *dw, float *db,
                                        const float *dout, const float *inp,
                                        const float *mean, const float *rstd, int N,
                                        int C) {
  ln_ctx c = {.dw = dw, .db = db, .dout = dout, .inp = inp, .cmean = mean, .crstd = rstd,
              .N = N, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), C, 64, ln_bwd_w_cols, &c);
}

/* ---- element-wise ---- */

typedef struct elem_ctx {
  float *out;
  const float *a, *b;
  bool erf; /* GELU: the exact form, else the tanh approximation */
} elem_ctx;

/* one loop per form, so each vectorises */
MEGA_CPU_CLONES
static void gelu_fwd_range(void *vc, int64_t i0, int64_t i1) {
  const elem_ctx *c = vc;
  if (c->erf)
    for (int64_t i = i0; i < i1; i++) c->out[i] = mega_gelu_erf(c->a[i]);
  else
    for (int64_t i = i0; i < i1; i++) c->out[i] = mega_gelu(c->a[i]);
}

static void gelu_fwd(mega_backend *be, float *out, const float *inp, size_t n, bool erf) {
  elem_ctx c = {.out = out, .a = inp, .erf = erf};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS,
                        gelu_fwd_range, &c);
}

void mega_cpu_gelu_forward(mega_backend *be, float *out, const float *inp, size_t n) {
  gelu_fwd(be, out, inp, n, false);
}

void mega_cpu_gelu_erf_forward(mega_backend *be, float *out, const float *inp, size_t n) {
  gelu_fwd(be, out, inp, n, true);
}

/* a = inp, b = dout */
MEGA_CPU_CLONES
static void gelu_bwd_range(void *vc, int64_t i0, int64_t i1) {
  const elem_ctx *c = vc;
  if (c->erf)
    for (int64_t i = i0; i < i1; i++) c->out[i] = mega_gelu_erf_grad(c->a[i]) * c->b[i];
  else
    for (int64_t i = i0; i < i1; i++) c->out[i] = mega_gelu_grad(c->a[i]) * c->b[i];
}

static void gelu_bwd(mega_backend *be, float *dinp, const float *inp, const float *dout,
                     size_t n, bool erf) {
  elem_ctx c = {.out = dinp, .a = inp, .b = dout, .erf = erf};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS,
                        gelu_bwd_range, &c);
}

void mega_cpu_gelu_backward(mega_backend *be, float *dinp, const float *inp,
                            const float *dout, size_t n) {
  gelu_bwd(be, dinp, inp, dout, n, false);
}

void mega_cpu_gelu_erf_backward(mega_backend *be, float *dinp, const float *inp,
                                const float *dout, size_t n) {
  gelu_bwd(be, dinp, inp, dout, n, true);
}

MEGA_CPU_CLONES
static void add_range(void *vc, int64_t i0, int64_t i1) {
  const elem_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) c->out[i] = c->a[i] + c->b[i];
}

void mega_cpu_residual_forward(mega_backend *be, float *out, const float *a,
                               const float *b, size_t n) {
  elem_ctx c = {.out = out, .a = a, .b = b};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, add_range,
                        &c);
}

typedef struct bias_ctx {
  float *out;
  const float *a, *b, *bias;
  int C;
} bias_ctx;

MEGA_CPU_CLONES
static void bias_add_rows(void *vc, int64_t n0, int64_t n1) {
  const bias_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    float *o = c->out + n * c->C;
    const float *x = c->a + n * c->C, *y = c->b + n * c->C;
    if (c->bias)
      for (int i = 0; i < c->C; i++) o[i] = x[i] + y[i] + c->bias[i];
    else
      for (int i = 0; i < c->C; i++) o[i] = x[i] + y[i];
  }
}

void mega_cpu_bias_residual_forward(mega_backend *be, float *out, const float *a,
                                    const float *b, const float *bias, int N, int C) {
  bias_ctx c = {.out = out, .a = a, .b = b, .bias = bias, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(C), bias_add_rows, &c);
}

typedef struct drop_ctx {
  float *out;
  const float *res, *y, *bias;
  int C;
  const mega_dropout *d;
} drop_ctx;

static void drop_rows(void *vc, int64_t n0, int64_t n1) {
  const drop_ctx *c = vc;
  for (int64_t n = n0; n < n1; n++) {
    float *o = c->out + n * c->C;
    const float *y = c->y + n * c->C, *r = c->res ? c->res + n * c->C : NULL;
    uint64_t key = mega_dropout_row(c->d, n);
    for (int i = 0; i < c->C; i++) {
      float v = mega_dropout_apply(c->d, key, i, y[i] + (c->bias ? c->bias[i] : 0.0f));
      o[i] = r ? r[i] + v : v;
    }
  }
}

void mega_cpu_bias_dropout_add(mega_backend *be, float *out, const float *res, const float *y,
                               const float *bias, int rows, int C, const mega_dropout *d) {
  drop_ctx c = {.out = out, .res = res, .y = y, .bias = bias, .C = C, .d = d};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), rows, row_grain(C), drop_rows, &c);
}

/* ---- bf16 inputs (set_bf16) ---- */

typedef struct round_ctx {
  float *out;
  const float *in;
} round_ctx;

MEGA_CPU_CLONES
static void round_range(void *vc, int64_t i0, int64_t i1) {
  const round_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) c->out[i] = mega_bf16_round(c->in[i]);
}

const float *mega_cpu_bf16_copy(mega_backend *be, int k, const float *x, size_t n) {
  mega_cpu_impl *impl = be->impl;
  if (!impl->bf16) return x;
  if (impl->bf16_cap[k] < n) {
    float *p = realloc(impl->bf16_buf[k], n * sizeof(float));
    if (!p) {
      if (!impl->failed)
        snprintf(impl->why, sizeof impl->why,
                 "cpu backend: cannot allocate %zu bytes to round an input to bf16",
                 n * sizeof(float));
      impl->failed = true;
      return NULL;
    }
    impl->bf16_buf[k] = p;
    impl->bf16_cap[k] = n;
  }
  round_ctx c = {.out = impl->bf16_buf[k], .in = x};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, round_range, &c);
  return impl->bf16_buf[k];
}

/* ---- softmax cross-entropy ---- */

typedef struct xent_ctx {
  float *losses, *x; /* x: the logits, then the probabilities, then dlogits */
  const int32_t *targets;
  int v0, V;
  float scale;
  bool grad; /* the forward writes dlogits (crossentropy_forward_grad) */
} xent_ctx;

/* loss = logsumexp(logits) - logits[target], computed from the max-shifted
 * row so it is exact to float rounding even when probs[target] underflows.
 * In place: the target's logit is read before the row becomes exp(x - mx). */
MEGA_CPU_CLONES
static void xent_fwd_rows(void *vc, int64_t n0, int64_t n1) {
  const xent_ctx *c = vc;
  int V = c->V, V16 = V / MEGA_LANES * MEGA_LANES;
  for (int64_t n = n0; n < n1; n++) {
    float *p = c->x + n * V;
    float acc[MEGA_LANES], target = p[c->targets[n]];
    for (int k = 0; k < MEGA_LANES; k++) acc[k] = -INFINITY;
    for (int i = 0; i < V16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] = p[i + k] > acc[k] ? p[i + k] : acc[k];
    float mx = mega_lanes_max(acc);
    for (int i = V16; i < V; i++) mx = p[i] > mx ? p[i] : mx;
    for (int k = 0; k < MEGA_LANES; k++) acc[k] = 0.0f;
    for (int i = 0; i < V16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) {
        p[i + k] = mega_expf(p[i + k] - mx);
        acc[k] += p[i + k];
      }
    float s = mega_lanes_sum(acc);
    for (int i = V16; i < V; i++) {
      p[i] = mega_expf(p[i] - mx);
      s += p[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < V; i++) p[i] *= inv;
    c->losses[n] = logf(s) + mx - target;
    if (c->grad) mega_cpu_xent_grad_row(p, V, c->targets[n], c->scale);
  }
}

void mega_cpu_crossentropy_forward(mega_backend *be, float *losses, float *logits,
                                   const int32_t *targets, int N, int V) {
  xent_ctx c = {.losses = losses, .x = logits, .targets = targets, .V = V};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(V), xent_fwd_rows, &c);
}

void mega_cpu_crossentropy_forward_grad(mega_backend *be, float *losses, float *logits,
                                        const int32_t *targets, float scale, int N, int V) {
  xent_ctx c = {.losses = losses, .x = logits, .targets = targets, .V = V, .scale = scale,
                .grad = true};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(V), xent_fwd_rows, &c);
}

MEGA_CPU_CLONES
static void xent_bwd_rows(void *vc, int64_t n0, int64_t n1) {
  const xent_ctx *c = vc;
  int V = c->V;
  for (int64_t n = n0; n < n1; n++)
    mega_cpu_xent_grad_row(c->x + n * V, V, (int64_t)c->targets[n] - c->v0, c->scale);
}

void mega_cpu_crossentropy_backward(mega_backend *be, float *probs, const int32_t *targets,
                                    int v0, float scale, int N, int V) {
  xent_ctx c = {.x = probs, .targets = targets, .v0 = v0, .V = V, .scale = scale};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(V), xent_bwd_rows, &c);
}
