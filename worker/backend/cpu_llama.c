/* The cpu backend's Llama kernels: RMSNorm, SwiGLU and rotary position
 * embeddings (backend.h). As cpu_ops.c: range functions over rows or
 * elements (channels for the weight gradient's sums over rows) run through
 * the thread pool, the element math shared with the CUDA kernels. */
#include <math.h>

#include "kernels/elementwise.h"
#include "worker/backend/cpu_internal.h"

static int64_t row_grain(int64_t width) {
  int64_t g = MEGA_CPU_GRAIN_ELEMS / (width > 0 ? width : 1);
  return g > 0 ? g : 1;
}

/* ---- RMSNorm ---- */

typedef struct rms_ctx {
  float *out, *rstd, *dinp, *dw;
  const float *inp, *w, *dout, *crstd, *dres;
  int N, C;
  float eps;
} rms_ctx;

MEGA_CPU_CLONES
static void rms_fwd_rows(void *vc, int64_t n0, int64_t n1) {
  const rms_ctx *c = vc;
  int C = c->C, C16 = C / MEGA_LANES * MEGA_LANES;
  for (int64_t n = n0; n < n1; n++) {
    const float *x = c->inp + n * C;
    float acc[MEGA_LANES] = {0};
    for (int i = 0; i < C16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] += x[i + k] * x[i + k];
    float ss = mega_lanes_sum(acc);
    for (int i = C16; i < C; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / C + c->eps);
    float *o = c->out + n * C;
    for (int i = 0; i < C; i++) o[i] = x[i] * r * c->w[i];
    c->rstd[n] = r;
  }
}

void mega_cpu_rmsnorm_forward(mega_backend *be, float *out, float *rstd, const float *inp,
                              const float *w, int N, int C, float eps) {
  rms_ctx c = {.out = out, .rstd = rstd, .inp = inp, .w = w, .N = N, .C = C, .eps = eps};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(C), rms_fwd_rows, &c);
}

/* dx = r * (dxhat - xhat * mean(dxhat * xhat)), dxhat = dout * w, xhat = x * r. */
MEGA_CPU_CLONES
static void rms_bwd_in_rows(void *vc, int64_t n0, int64_t n1) {
  const rms_ctx *c = vc;
  int C = c->C, C16 = C / MEGA_LANES * MEGA_LANES;
  const float *w = c->w;
  for (int64_t n = n0; n < n1; n++) {
    const float *x = c->inp + n * C, *d = c->dout + n * C;
    float r = c->crstd[n];
    float acc[MEGA_LANES] = {0};
    for (int i = 0; i < C16; i += MEGA_LANES)
      for (int k = 0; k < MEGA_LANES; k++) acc[k] += d[i + k] * w[i + k] * x[i + k] * r;
    float s = mega_lanes_sum(acc);
    for (int i = C16; i < C; i++) s += d[i] * w[i] * x[i] * r;
    s /= C;
    float *di = c->dinp + n * C;
    const float *dr = c->dres ? c->dres + n * C : NULL;
    if (dr)
      for (int i = 0; i < C; i++) di[i] = dr[i] + (d[i] * w[i] - x[i] * r * s) * r;
    else
      for (int i = 0; i < C; i++) di[i] = (d[i] * w[i] - x[i] * r * s) * r;
  }
}

void mega_cpu_rmsnorm_backward_input(mega_backend *be, float *dinp, const float *dres,
                                     const float *dout, const float *inp, const float *w,
                                     const float *rstd, int N, int C) {
  rms_ctx c = {.dinp = dinp, .dres = dres, .dout = dout, .inp = inp, .w = w, .crstd = rstd,
               .N = N, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), N, row_grain(C), rms_bwd_in_rows, &c);
}

/* Over a channel range: each thread sums its columns over all rows. */
MEGA_CPU_CLONES
static void rms_bwd_w_cols(void *vc, int64_t i0, int64_t i1) {
  const rms_ctx *c = vc;
  for (int64_t n = 0; n < c->N; n++) {
    const float *x = c->inp + n * c->C, *d = c->dout + n * c->C;
    float r = c->crstd[n];
    for (int64_t i = i0; i < i1; i++) c->dw[i] += d[i] * x[i] * r;
  }
}

void mega_cpu_rmsnorm_backward_weight(mega_backend *be, float *dw, const float *dout,
                                      const float *inp, const float *rstd, int N, int C) {
  rms_ctx c = {.dw = dw, .dout = dout, .inp = inp, .crstd = rstd, .N = N, .C = C};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), C, 64, rms_bwd_w_cols, &c);
}

/* ---- SwiGLU ---- */

typedef struct glu_ctx {
  float *out, *dgate, *dup;
  const float *gate, *up, *dout;
} glu_ctx;

MEGA_CPU_CLONES
static void glu_fwd_range(void *vc, int64_t i0, int64_t i1) {
  const glu_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) c->out[i] = mega_silu(c->gate[i]) * c->up[i];
}

void mega_cpu_swiglu_forward(mega_backend *be, float *out, const float *gate, const float *up,
                             size_t n) {
  glu_ctx c = {.out = out, .gate = gate, .up = up};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, glu_fwd_range,
                        &c);
}

MEGA_CPU_CLONES
static void glu_bwd_range(void *vc, int64_t i0, int64_t i1) {
  const glu_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++)
    mega_swiglu_grad(c->gate[i], c->up[i], c->dout[i], &c->dgate[i], &c->dup[i]);
}

void mega_cpu_swiglu_backward(mega_backend *be, float *dgate, float *dup, const float *dout,
                              const float *gate, const float *up, size_t n) {
  glu_ctx c = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)n, MEGA_CPU_GRAIN_ELEMS, glu_bwd_range,
                        &c);
}

/* ---- rotary position embedding ---- */

typedef struct rope_ctx {
  float *x;
  const float *cs;
  int T, heads, hs, ld, rot;
  float sign; /* 1: forward, -1: backward (the inverse rotation) */
} rope_ctx;

MEGA_CPU_CLONES
static void rope_rows(void *vc, int64_t n0, int64_t n1) {
  const rope_ctx *c = vc;
  int half = c->rot / 2;
  for (int64_t n = n0; n < n1; n++) {
    const float *cs = c->cs + (size_t)(n % c->T) * c->rot;
    for (int h = 0; h < c->heads; h++) {
      float *x = c->x + n * c->ld + (size_t)h * c->hs;
      for (int i = 0; i < half; i++)
        mega_rope_pair(&x[i], &x[i + half], cs[i], c->sign * cs[half + i]);
    }
  }
}

static void rope(mega_backend *be, float *x, const float *cs, int B, int T, int heads, int hs,
                 int ld, int rot, float sign) {
  rope_ctx c = {.x = x, .cs = cs, .T = T, .heads = heads, .hs = hs, .ld = ld, .rot = rot,
                .sign = sign};
  mega_cpu_parallel_for(mega_cpu_pool_of(be), (int64_t)B * T, row_grain((int64_t)heads * rot),
                        rope_rows, &c);
}

void mega_cpu_rope_forward(mega_backend *be, float *x, const float *cs, int B, int T,
                           int heads, int hs, int ld, int rot) {
  rope(be, x, cs, B, T, heads, hs, ld, rot, 1.0f);
}

void mega_cpu_rope_backward(mega_backend *be, float *dx, const float *cs, int B, int T,
                            int heads, int hs, int ld, int rot) {
  rope(be, dx, cs, B, T, heads, hs, ld, rot, -1.0f);
}
