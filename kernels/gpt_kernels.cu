// The cuda backend's kernels: grid-stride wrappers around the per-thread
// bodies of gpt_bodies.h (the math the cpu backend tests), and a block
// reduction for sums. GEMMs are cuBLAS's (worker/backend/cuda.c).
#include <cuda_runtime.h>

#include "kernels/gpt_bodies.h"
#include "kernels/launch.h"

namespace {

constexpr int kThreads = 256;

// Enough blocks to fill an H100 (132 SMs) several times; the grid-stride
// loop covers the rest.
int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (int)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

// One kernel per body: item i of n runs body(i, args...).
template <typename F>
__global__ void grid_stride(int64_t n, F f) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    f(i);
}

template <typename F>
int launch(mega_cu_stream s, int64_t n, F f) {
  if (n <= 0) return 0;
  grid_stride<<<blocks_for(n), kThreads, 0, (cudaStream_t)s>>>(n, f);
  return (int)cudaGetLastError();
}

__global__ void block_sums(double *partials, const float *x, int64_t n, int squares) {
  __shared__ double acc[kThreads];
  double s = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double e = x[i];
    s += squares ? e * e : e;
  }
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) acc[threadIdx.x] += acc[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = acc[0];
}

}  // namespace

extern "C" {

int mega_cu_encoder_fwd(mega_cu_stream s, float *out, const int32_t *tok, const float *wte,
                        int v0, int vn, const float *wpe, int N, int T, int C) {
  return launch(s, (int64_t)N * C, [=] __device__(int64_t i) {
    mega_kb_encoder_fwd(i, out, tok, wte, v0, vn, wpe, T, C);
  });
}

int mega_cu_encoder_bwd(mega_cu_stream s, float *dwte, int v0, int vn, float *dwpe,
                        const float *dout, const int32_t *tok, int N, int T, int C) {
  return launch(s, C, [=] __device__(int64_t c) {
    mega_kb_encoder_bwd(c, dwte, v0, vn, dwpe, dout, tok, N, T, C);
  });
}

int mega_cu_layernorm_fwd(mega_cu_stream s, float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b, int N, int C,
                          float eps) {
  return launch(s, N, [=] __device__(int64_t n) {
    mega_kb_layernorm_fwd(n, out, mean, rstd, inp, w, b, C, eps);
  });
}

int mega_cu_layernorm_bwd_in(mega_cu_stream s, float *dinp, const float *dres,
                             const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int N, int C) {
  return launch(s, N, [=] __device__(int64_t n) {
    mega_kb_layernorm_bwd_in(n, dinp, dres, dout, inp, w, mean, rstd, C);
  });
}

int mega_cu_layernorm_bwd_w(mega_cu_stream s, float *dw, float *db, const float *dout,
                            const float *inp, const float *mean, const float *rstd, int N,
                            int C) {
  return launch(s, C, [=] __device__(int64_t c) {
    mega_kb_layernorm_bwd_w(c, dw, db, dout, inp, mean, rstd, N, C);
  });
}

int mega_cu_gelu_fwd(mega_cu_stream s, float *out, const float *inp, int64_t n) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_gelu_fwd(i, out, inp); });
}

int mega_cu_gelu_bwd(mega_cu_stream s, float *dinp, const float *inp, const float *dout,
                     int64_t n) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_gelu_bwd(i, dinp, inp, dout); });
}

int mega_cu_add(mega_cu_stream s, float *out, const float *a, const float *b,
                const float *bias, int64_t n, int C) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_add(i, out, a, b, bias, C); });
}

int mega_cu_bias_fill(mega_cu_stream s, float *out, const float *bias, const float *residual,
                      int64_t n, int OC) {
  return launch(s, n,
                [=] __device__(int64_t i) { mega_kb_bias_fill(i, out, bias, residual, OC); });
}

int mega_cu_bias_grad(mega_cu_stream s, float *dbias, const float *dout, int N, int OC) {
  return launch(s, OC, [=] __device__(int64_t j) { mega_kb_bias_grad(j, dbias, dout, N, OC); });
}

int mega_cu_xent_fwd(mega_cu_stream s, float *losses, float *probs, const float *logits,
                     const int32_t *targets, int N, int V) {
  return launch(s, N, [=] __device__(int64_t n) {
    mega_kb_xent_fwd(n, losses, probs, logits, targets, V);
  });
}

int mega_cu_xent_bwd(mega_cu_stream s, float *dlogits, const float *probs,
                     const int32_t *targets, int v0, float scale, int N, int V) {
  return launch(s, (int64_t)N * V, [=] __device__(int64_t i) {
    mega_kb_xent_bwd(i, dlogits, probs, targets, v0, scale, V);
  });
}

int mega_cu_xent_rowmax(mega_cu_stream s, float *rowmax, const float *logits, int N, int V) {
  return launch(s, N, [=] __device__(int64_t n) { mega_kb_xent_rowmax(n, rowmax, logits, V); });
}

int mega_cu_xent_sums(mega_cu_stream s, float *sums, const float *logits, const float *rowmax,
                      const int32_t *targets, int v0, int N, int V) {
  return launch(s, N, [=] __device__(int64_t n) {
    mega_kb_xent_sums(n, sums, logits, rowmax, targets, v0, N, V);
  });
}

int mega_cu_xent_finish(mega_cu_stream s, float *losses, float *probs, const float *logits,
                        const float *rowmax, const float *sums, int N, int V) {
  return launch(s, N, [=] __device__(int64_t n) {
    mega_kb_xent_finish(n, losses, probs, logits, rowmax, sums, N, V);
  });
}

int mega_cu_causal_softmax(mega_cu_stream s, float *att, int64_t rows, int T) {
  return launch(s, rows, [=] __device__(int64_t r) { mega_kb_causal_softmax(r, att, T); });
}

int mega_cu_causal_softmax_bwd(mega_cu_stream s, float *da, const float *att, int64_t rows,
                               int T, float scale) {
  return launch(s, rows,
                [=] __device__(int64_t r) { mega_kb_causal_softmax_bwd(r, da, att, T, scale); });
}

int mega_cu_adamw(mega_cu_stream s, float *p, const float *g, float *m, float *v, int64_t n,
                  float lr, float b1, float b2, float eps, float wd, float gs, float bc1,
                  float bc2) {
  return launch(s, n, [=] __device__(int64_t i) {
    mega_kb_adamw(i, p, g, m, v, lr, b1, b2, eps, wd, gs, bc1, bc2);
  });
}

int mega_cu_scale(mega_cu_stream s, float *x, int64_t n, float a) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_scale(i, x, a); });
}

int mega_cu_to_bf16(mega_cu_stream s, uint16_t *out, const float *in, int64_t n) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_to_bf16(i, out, in); });
}

int mega_cu_sum(mega_cu_stream s, double *partials, const float *x, int64_t n, int squares) {
  block_sums<<<MEGA_CU_SUM_BLOCKS, kThreads, 0, (cudaStream_t)s>>>(partials, x, n, squares);
  return (int)cudaGetLastError();
}

}  // extern "C"
