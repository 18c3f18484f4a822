// The cuda backend's kernels: grid-stride wrappers around the bodies of
// gpt_bodies.h (the math tests/gpu/test_kernel_bodies.c checks on the CPU):
// element bodies one per thread, row bodies in lanes (a warp, or a block,
// per row) combined with shuffles, column bodies in row lanes combined in
// shared memory; and a block reduction for sums. GEMMs are cuBLAS's
// (worker/backend/cuda.c).
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/gpt_bodies.h"
#include "kernels/rng.h"
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

// ---- four items per thread, for the memory-bound element ops ----
// Where every array starts on 16 bytes, a thread moves four items with one
// 16-byte load per input and one store, and runs the body on local copies
// (body(k, out, in...) with k < 4): the same body the CPU tests, wider
// memory traffic. The items past the last whole four, or every item when an
// array is misaligned, go one per thread.

bool on16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

__device__ inline void unpack(float4 v, float *x) {
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}

// With out16 (--bf16's copy of out for the next GEMM, cuda_b16.h) the
// same kernel stores the bf16 bits of the very floats it writes.
template <typename F>
__global__ void x4_unary(int64_t n4, float4 *out, uint2 *out16, const float4 *a, F f) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[4], o[4];
    unpack(a[i], x);
    for (int k = 0; k < 4; k++) f(k, o, x);
    out[i] = make_float4(o[0], o[1], o[2], o[3]);
    if (out16) mega_stw16((uint16_t *)(out16 + i), 4, o);
  }
}

template <typename F>
__global__ void x4_binary(int64_t n4, float4 *out, uint2 *out16, const float4 *a,
                          const float4 *b, F f) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[4], y[4], o[4];
    unpack(a[i], x);
    unpack(b[i], y);
    for (int k = 0; k < 4; k++) f(k, o, x, y);
    out[i] = make_float4(o[0], o[1], o[2], o[3]);
    if (out16) mega_stw16((uint16_t *)(out16 + i), 4, o);
  }
}

// Four at a time where out, out16 (if any) and the inputs are aligned.
bool x4_ok(const float *out, const uint16_t *out16) {
  return on16(out) && ((uintptr_t)out16 & 7u) == 0;
}

// out[i] = f(i, out, a) over n items (and out16[i] its bf16 bits, the
// tail's read back by the thread that wrote them), four at a time where
// aligned.
template <typename F>
int launch_unary(mega_cu_stream s, int64_t n, float *out, uint16_t *out16, const float *a, F f) {
  int64_t n4 = x4_ok(out, out16) && on16(a) ? n / 4 : 0;
  if (n4 > 0) {
    x4_unary<<<blocks_for(n4), kThreads, 0, (cudaStream_t)s>>>(n4, (float4 *)out, (uint2 *)out16,
                                                                (const float4 *)a, f);
    int e = (int)cudaGetLastError();
    if (e) return e;
  }
  float *o = out + 4 * n4;
  uint16_t *o16 = out16 ? out16 + 4 * n4 : nullptr;
  const float *x = a + 4 * n4;
  return launch(s, n - 4 * n4, [=] __device__(int64_t i) {
    f(i, o, x);
    if (o16) o16[i] = mega_bf16_bits(o[i]);
  });
}

template <typename F>
int launch_binary(mega_cu_stream s, int64_t n, float *out, uint16_t *out16, const float *a,
                  const float *b, F f) {
  int64_t n4 = x4_ok(out, out16) && on16(a) && on16(b) ? n / 4 : 0;
  if (n4 > 0) {
    x4_binary<<<blocks_for(n4), kThreads, 0, (cudaStream_t)s>>>(
        n4, (float4 *)out, (uint2 *)out16, (const float4 *)a, (const float4 *)b, f);
    int e = (int)cudaGetLastError();
    if (e) return e;
  }
  float *o = out + 4 * n4;
  uint16_t *o16 = out16 ? out16 + 4 * n4 : nullptr;
  const float *x = a + 4 * n4, *y = b + 4 * n4;
  return launch(s, n - 4 * n4, [=] __device__(int64_t i) {
    f(i, o, x, y);
    if (o16) o16[i] = mega_bf16_bits(o[i]);
  });
}

// GEMM inputs rounded to bf16: four floats in (16 bytes), four bf16 out (8).
__global__ void to_bf16_x4(int64_t n4, uint2 *out, const float4 *in) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x[4];
    unpack(in[i], x);
    mega_stw16((uint16_t *)(out + i), 4, x);
  }
}

// ---- rows in lanes: L lanes per row, a warp (32) or the block (256..1024) ----

constexpr int kRowThreads = 256;

template <int L>
struct Lanes {
  static constexpr int kBlock = L > kRowThreads ? L : kRowThreads;
  static_assert((L == 32 || L == kBlock) && kBlock <= 1024, "lanes per row: a warp or a block");

  // The row's lanes' values combined (op: sum or max), the same in every
  // lane: xor shuffles within each warp, then across the block's warps.
  template <typename Op>
  __device__ static float all(float v, Op op) {
    for (int k = 16; k > 0; k >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, k));
    if (L == 32) return v;
    __shared__ float warp[L / 32];
    int w = threadIdx.x / 32;
    __syncthreads();  // the last call's readers are done
    if (threadIdx.x % 32 == 0) warp[w] = v;
    __syncthreads();
    v = warp[0];
    for (int i = 1; i < L / 32; i++) v = op(v, warp[i]);
    return v;
  }
  __device__ static float sum(float v) {
    return all(v, [] __device__(float a, float b) { return a + b; });
  }
  __device__ static float max(float v) {
    return all(v, [] __device__(float a, float b) { return a > b ? a : b; });
  }
};

// f(row, lane) for every row. A warp's lanes (L 32) or the whole block's
// (L = the block) share a row, so every lane that must join a combine runs
// the same iterations.
template <int L, typename F>
__global__ void row_lanes(int64_t rows, F f) {
  constexpr int per = Lanes<L>::kBlock / L;
  for (int64_t r = (int64_t)blockIdx.x * per + threadIdx.x / L; r < rows;
       r += (int64_t)gridDim.x * per)
    f(r, (int)(threadIdx.x % L));
}

template <int L, typename F>
int launch_rows(mega_cu_stream s, int64_t rows, F f) {
  if (rows <= 0) return 0;
  constexpr int per = Lanes<L>::kBlock / L;
  int64_t b = (rows + per - 1) / per;
  row_lanes<L><<<(int)(b > 65535 ? 65535 : b), Lanes<L>::kBlock, 0, (cudaStream_t)s>>>(rows, f);
  return (int)cudaGetLastError();
}

// ---- columns in row lanes (geometry: mega_kc_slices in gpt_bodies.h):
// part(c, r0, R) is a lane's partial (float2); a block's lanes are added in
// a fixed tree, each slice's sum goes to scratch, and done(c, total) gets
// the slices' sums added in slice order (deterministic, no atomics) ----

template <typename P, typename D>
__global__ void column_lanes(int64_t cols, float2 *slices, P part, D done) {
  __shared__ float2 acc[MEGA_KC_ROWS][MEGA_KC_TILE];
  int64_t c = (int64_t)blockIdx.x * MEGA_KC_TILE + threadIdx.x;
  int r0 = (int)(blockIdx.y * MEGA_KC_ROWS + threadIdx.y), R = (int)gridDim.y * MEGA_KC_ROWS;
  acc[threadIdx.y][threadIdx.x] = c < cols ? part(c, r0, R) : make_float2(0.0f, 0.0f);
  __syncthreads();
  for (int k = MEGA_KC_ROWS / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.y < k) {
      float2 a = acc[threadIdx.y][threadIdx.x], b = acc[threadIdx.y + k][threadIdx.x];
      acc[threadIdx.y][threadIdx.x] = make_float2(a.x + b.x, a.y + b.y);
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || c >= cols) return;
  if (gridDim.y == 1)
    done(c, acc[0][threadIdx.x]);
  else
    slices[blockIdx.y * cols + c] = acc[0][threadIdx.x];
}

template <typename D>
__global__ void column_slices(int64_t cols, int S, const float2 *slices, D done) {
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x) {
    float2 t = slices[c];
    for (int s = 1; s < S; s++) t = make_float2(t.x + slices[s * cols + c].x,
                                                 t.y + slices[s * cols + c].y);
    done(c, t);
  }
}

template <typename P, typename D>
int launch_columns(mega_cu_stream s, int64_t rows, int64_t cols, void *scratch, P part,
                   D done) {
  if (cols <= 0) return 0;
  int S = mega_kc_slices(rows, cols);
  if (S > 1 && !scratch) return (int)cudaErrorInvalidValue;
  float2 *slices = (float2 *)scratch;
  dim3 grid((unsigned)((cols + MEGA_KC_TILE - 1) / MEGA_KC_TILE), (unsigned)S);
  column_lanes<<<grid, dim3(MEGA_KC_TILE, MEGA_KC_ROWS), 0, (cudaStream_t)s>>>(cols, slices,
                                                                               part, done);
  if (S == 1) return (int)cudaGetLastError();
  int64_t b = (cols + kThreads - 1) / kThreads;
  column_slices<<<(int)(b > 65535 ? 65535 : b), kThreads, 0, (cudaStream_t)s>>>(cols, S, slices,
                                                                                 done);
  return (int)cudaGetLastError();
}

// Block b of nb of a sum over x (of x^2 when squares): its share of a
// grid-stride loop, reduced in shared memory in a fixed order, into *out.
// Both kernels below run it, so the norm's posted sums are sum_squares'
// bits (a float's square is exact in double: fused or not, the same).
__device__ void block_sum(double *out, const float *x, int64_t n, int squares, int64_t b,
                          int64_t nb) {
  __shared__ double acc[kThreads];
  double s = 0.0;
  for (int64_t i = b * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x) {
    double e = x[i];
    s += squares ? e * e : e;
  }
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) acc[threadIdx.x] += acc[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = acc[0];
}

__global__ void block_sums(double *partials, const float *x, int64_t n, int squares) {
  block_sum(&partials[blockIdx.x], x, n, squares, blockIdx.x, gridDim.x);
}

// Range blockIdx.y's partials, as block_sums' for that range alone.
__global__ void range_block_sums(double *partials, mega_cu_sum_ranges r) {
  int k = blockIdx.y;
  block_sum(&partials[(int64_t)k * MEGA_CU_SUM_BLOCKS + blockIdx.x], r.x[k], r.n[k], 1,
            blockIdx.x, gridDim.x);
}

// One thread per range adds its partials in index order, as the host does
// after mega_cu_sum.
__global__ void fold_sums(const double *partials, mega_cu_sum_ranges r) {
  int k = threadIdx.x;
  if (k >= r.count) return;
  double t = 0.0;
  for (int b = 0; b < MEGA_CU_SUM_BLOCKS; b++) t += partials[k * MEGA_CU_SUM_BLOCKS + b];
  *r.out[k] = t;
}

__global__ void adamw_ranges(const mega_cu_adamw_range *t, int count, int64_t total, float lr,
                             float b1, float b2, float eps, float gs, float bc1, float bc2) {
  int r = -1;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x)
    mega_kb_adamw_ranges(i, t, count, &r, lr, b1, b2, eps, gs, bc1, bc2);
}

// A vocabulary row is long (50,304 for GPT-2): a block of lanes per row,
// four floats a load where every row starts on 16 bytes.
constexpr int kVocabLanes = 512;

int xent_width(const float *x, int V) { return on16(x) && V % 4 == 0 ? 4 : 1; }

// Row body f(n, l, w) with w a constant, so the 128-bit path compiles apart.
template <typename F>
int launch_vocab_rows(mega_cu_stream s, int N, int w, F f) {
  if (w == 4)
    return launch_rows<kVocabLanes>(s, N, [=] __device__(int64_t n, int l) { f(n, l, 4); });
  return launch_rows<kVocabLanes>(s, N, [=] __device__(int64_t n, int l) { f(n, l, 1); });
}

// Row x's max and sum of e^(x - max) over the block's lanes, in one read
// (each lane's running pair, combined), the same in every lane; inlined, so
// w stays the caller's constant.
__device__ __forceinline__ void vocab_maxsum(const float *x, int V, int w, int l, float *mx,
                                             float *sum) {
  using G = Lanes<kVocabLanes>;
  float m, s;
  mega_kr_xent_maxsum(x, V, w, l, kVocabLanes, &m, &s);
  *mx = G::max(m);
  *sum = G::sum(mega_kr_xent_rescale(m, s, *mx));
}

}  // namespace

extern "C" {

int mega_cu_encoder_fwd(mega_cu_stream s, float *out, const int32_t *tok, const float *wte,
                        int v0, int vn, const float *wpe, int N, int T, int C) {
  return launch(s, (int64_t)N * C, [=] __device__(int64_t i) {
    mega_kb_encoder_fwd(i, out, tok, wte, v0, vn, wpe, T, C);
  });
}

// The embedding's gradient: a stable radix sort of (id, position) pairs
// (cub), then one writer per id (mega_kb_wte_bwd). scratch holds three int
// arrays of N and cub's temporary storage.
static size_t sort_bytes(int N) {
  size_t t = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, t, (const int32_t *)nullptr, (int32_t *)nullptr,
                                  (const int32_t *)nullptr, (int32_t *)nullptr, N);
  return t;
}

size_t mega_cu_columns_scratch(int64_t rows, int64_t cols) {
  int S = mega_kc_slices(rows, cols);
  return S > 1 ? (size_t)S * (size_t)cols * sizeof(float2) : 0;
}

size_t mega_cu_encoder_bwd_scratch(int N) {
  return 3 * (((size_t)N * sizeof(int32_t) + 255) / 256 * 256) + sort_bytes(N);
}

int mega_cu_encoder_bwd(mega_cu_stream s, float *dwte, int v0, int vn, float *dwpe,
                        const float *dout, const int32_t *tok, int N, int T, int C,
                        void *scratch) {
  int B = N / T;
  if (dwpe) {
    int e = launch(s, (int64_t)T * C, [=] __device__(int64_t i) {
      mega_kb_wpe_bwd(i, dwpe, dout, B, T, C);
    });
    if (e) return e;
  }
  if (!dwte || N <= 0) return 0;
  size_t a = ((size_t)N * sizeof(int32_t) + 255) / 256 * 256, tb = sort_bytes(N);
  int32_t *ids = (int32_t *)scratch, *pos0 = (int32_t *)((char *)scratch + a);
  int32_t *pos = (int32_t *)((char *)scratch + 2 * a);
  void *tmp = (char *)scratch + 3 * a;
  int e = launch(s, N, [=] __device__(int64_t i) { pos0[i] = (int32_t)i; });
  if (e) return e;
  cudaError_t ce = cub::DeviceRadixSort::SortPairs(tmp, tb, tok, ids, pos0, pos, N, 0,
                                                   (int)(sizeof(int32_t) * 8), (cudaStream_t)s);
  if (ce != cudaSuccess) return (int)ce;
  return launch(s, (int64_t)N * C, [=] __device__(int64_t i) {
    mega_kb_wte_bwd(i, dwte, v0, vn, dout, ids, pos, N, C);
  });
}

int mega_cu_layernorm_fwd(mega_cu_stream s, float *out, uint16_t *out16, float *mean,
                          float *rstd, const float *inp, const float *w, const float *b, int N,
                          int C, float eps) {
  return launch_rows<32>(s, N, [=] __device__(int64_t n, int l) {
    using G = Lanes<32>;
    const float *x = inp + n * C;
    float m = G::sum(mega_kr_sum(x, C, l, 32)) / C;
    float r = 1.0f / sqrtf(G::sum(mega_kr_sqdev(x, C, m, l, 32)) / C + eps);
    mega_kr_layernorm_fwd(n, l, 32, out, out16, mean, rstd, inp, w, b, C, m, r);
  });
}

int mega_cu_layernorm_bwd_in(mega_cu_stream s, float *dinp, uint16_t *dinp16,
                             const float *dres, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N,
                             int C) {
  return launch_rows<32>(s, N, [=] __device__(int64_t n, int l) {
    using G = Lanes<32>;
    float s1, s2;
    mega_kr_layernorm_bwd_dots(n, l, 32, &s1, &s2, dout, inp, w, mean, rstd, C);
    s1 = G::sum(s1) / C;
    s2 = G::sum(s2) / C;
    mega_kr_layernorm_bwd_in(n, l, 32, dinp, dinp16, dres, dout, inp, w, mean, rstd, C, s1,
                             s2);
  });
}

int mega_cu_layernorm_bwd_w(mega_cu_stream s, float *dw, float *db, const float *dout,
                            const float *inp, const float *mean, const float *rstd, int N,
                            int C, void *scratch) {
  return launch_columns(
      s, N, C, scratch,
      [=] __device__(int64_t c, int r0, int R) {
        float2 p;
        mega_kc_layernorm_bwd_w(c, r0, R, &p.x, &p.y, dout, inp, mean, rstd, N, C);
        return p;
      },
      [=] __device__(int64_t c, float2 t) {
        dw[c] += t.x;
        db[c] += t.y;
      });
}

int mega_cu_rmsnorm_fwd(mega_cu_stream s, float *out, uint16_t *out16, float *rstd,
                        const float *inp, const float *w, int N, int C, float eps) {
  return launch_rows<32>(s, N, [=] __device__(int64_t n, int l) {
    const float *x = inp + n * C;
    float r = 1.0f / sqrtf(Lanes<32>::sum(mega_kr_dot(x, x, C, l, 32)) / C + eps);
    mega_kr_rmsnorm_fwd(n, l, 32, out, out16, rstd, inp, w, C, r);
  });
}

int mega_cu_rmsnorm_bwd_in(mega_cu_stream s, float *dinp, uint16_t *dinp16, const float *dres,
                           const float *dout, const float *inp, const float *w,
                           const float *rstd, int N, int C) {
  return launch_rows<32>(s, N, [=] __device__(int64_t n, int l) {
    float d = Lanes<32>::sum(mega_kr_rmsnorm_bwd_dot(n, l, 32, dout, inp, w, rstd, C)) / C;
    mega_kr_rmsnorm_bwd_in(n, l, 32, dinp, dinp16, dres, dout, inp, w, rstd, C, d);
  });
}

int mega_cu_rmsnorm_bwd_w(mega_cu_stream s, float *dw, const float *dout, const float *inp,
                          const float *rstd, int N, int C, void *scratch) {
  return launch_columns(
      s, N, C, scratch,
      [=] __device__(int64_t c, int r0, int R) {
        return make_float2(mega_kc_rmsnorm_bwd_w(c, r0, R, dout, inp, rstd, N, C), 0.0f);
      },
      [=] __device__(int64_t c, float2 t) { dw[c] += t.x; });
}

// The bf16 copies from the floats read back by the thread that wrote them.
int mega_cu_swiglu_fwd(mega_cu_stream s, float *out, uint16_t *out16, const float *gate,
                       const float *up, int64_t n) {
  return launch(s, n, [=] __device__(int64_t i) {
    mega_kb_swiglu_fwd(i, out, gate, up);
    if (out16) out16[i] = mega_bf16_bits(out[i]);
  });
}

int mega_cu_swiglu_bwd(mega_cu_stream s, float *dgate, uint16_t *dgate16, float *dup,
                       uint16_t *dup16, const float *dout, const float *gate, const float *up,
                       int64_t n) {
  return launch(s, n, [=] __device__(int64_t i) {
    mega_kb_swiglu_bwd(i, dgate, dup, dout, gate, up);
    if (dgate16) dgate16[i] = mega_bf16_bits(dgate[i]);
    if (dup16) dup16[i] = mega_bf16_bits(dup[i]);
  });
}

int mega_cu_rope(mega_cu_stream s, float *x, const float *cs, int N, int T, int heads, int hs,
                 int ld, int rot, float sign) {
  return launch(s, (int64_t)N * heads * (rot / 2), [=] __device__(int64_t i) {
    mega_kb_rope(i, x, cs, T, heads, hs, ld, rot, sign);
  });
}

// erf: the exact GELU's body, else the tanh approximation's (a kernel each)
int mega_cu_gelu_fwd(mega_cu_stream s, float *out, uint16_t *out16, const float *inp, int64_t n,
                     bool erf) {
  if (erf)
    return launch_unary(s, n, out, out16, inp,
                        [] __device__(int64_t i, float *o, const float *x) {
                          mega_kb_gelu_erf_fwd(i, o, x);
                        });
  return launch_unary(s, n, out, out16, inp, [] __device__(int64_t i, float *o, const float *x) {
    mega_kb_gelu_fwd(i, o, x);
  });
}

int mega_cu_gelu_bwd(mega_cu_stream s, float *dinp, uint16_t *dinp16, const float *inp,
                     const float *dout, int64_t n, bool erf) {
  if (erf)
    return launch_binary(s, n, dinp, dinp16, inp, dout,
                         [] __device__(int64_t i, float *o, const float *x, const float *dy) {
                           mega_kb_gelu_erf_bwd(i, o, x, dy);
                         });
  return launch_binary(s, n, dinp, dinp16, inp, dout,
                       [] __device__(int64_t i, float *o, const float *x, const float *dy) {
                         mega_kb_gelu_bwd(i, o, x, dy);
                       });
}

int mega_cu_add(mega_cu_stream s, float *out, const float *a, const float *b,
                const float *bias, int64_t n, int C) {
  if (!bias)
    return launch_binary(s, n, out, nullptr, a, b,
                         [] __device__(int64_t i, float *o, const float *x, const float *y) {
                           mega_kb_add(i, o, x, y, nullptr, 1);
                         });
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_add(i, out, a, b, bias, C); });
}

int mega_cu_bias_dropout_add(mega_cu_stream s, float *out, const float *res, const float *y,
                             const float *bias, int64_t n, int C, const mega_dropout *d) {
  mega_dropout dd = *d; // by value: the host's struct is gone when the kernel runs
  return launch(s, n, [=] __device__(int64_t i) {
    mega_kb_bias_dropout_add(i, out, res, y, bias, C, dd);
  });
}

int mega_cu_bias_fill(mega_cu_stream s, float *out, const float *bias, const float *residual,
                      int64_t n, int OC) {
  return launch(s, n,
                [=] __device__(int64_t i) { mega_kb_bias_fill(i, out, bias, residual, OC); });
}

int mega_cu_bias_grad(mega_cu_stream s, float *dbias, const float *dout, int N, int OC,
                      int round16, void *scratch) {
  return launch_columns(
      s, N, OC, scratch,
      [=] __device__(int64_t j, int r0, int R) {
        return make_float2(mega_kc_bias_grad(j, r0, R, dout, N, OC, round16), 0.0f);
      },
      [=] __device__(int64_t j, float2 t) { dbias[j] += t.x; });
}

// One kernel per row: the target's logit, then the max and sum in one read
// (the lanes' running pairs combined), then the probabilities over the
// logits. The combines' barriers order every lane's read of the target's
// logit before any lane writes the row.
int mega_cu_xent_fwd(mega_cu_stream s, float *losses, float *logits, const int32_t *targets,
                     int N, int V) {
  return launch_vocab_rows(s, N, xent_width(logits, V), [=] __device__(int64_t n, int l, int w) {
    float target = logits[n * V + targets[n]], mx, sum;
    vocab_maxsum(logits + n * V, V, w, l, &mx, &sum);
    mega_kr_xent_write(n, l, kVocabLanes, w, losses, logits, V, mx, sum, target);
  });
}

// xent_fwd with the backward in its write (the fused classifier). The load
// width is xent_fwd's, from the logits alone, since it sets the order of
// the sums; the copy d16 (put's, on 256 bytes) must then take its stores.
int mega_cu_xent_fwd_grad(mega_cu_stream s, float *losses, float *logits, uint16_t *d16,
                          const int32_t *targets, float scale, int N, int V) {
  if (!x4_ok(logits, d16) && xent_width(logits, V) == 4) return (int)cudaErrorMisalignedAddress;
  return launch_vocab_rows(s, N, xent_width(logits, V), [=] __device__(int64_t n, int l, int w) {
    float target = logits[n * V + targets[n]], mx, sum;
    vocab_maxsum(logits + n * V, V, w, l, &mx, &sum);
    mega_kr_xent_write_grad(n, l, kVocabLanes, w, losses, logits, d16, V, mx, sum, target,
                            targets[n], scale);
  });
}

int mega_cu_xent_bwd(mega_cu_stream s, float *probs, uint16_t *probs16, const int32_t *targets,
                     int v0, float scale, int N, int V) {
  int width = x4_ok(probs, probs16) ? xent_width(probs, V) : 1;
  return launch_vocab_rows(s, N, width, [=] __device__(int64_t n, int l, int w) {
    mega_kr_xent_bwd(n, l, kVocabLanes, w, probs, probs16, targets, v0, scale, V);
  });
}

int mega_cu_xent_rowmax(mega_cu_stream s, float *rowmax, const float *logits, int N, int V) {
  return launch_vocab_rows(s, N, xent_width(logits, V), [=] __device__(int64_t n, int l, int w) {
    float mx = Lanes<kVocabLanes>::max(mega_kr_xent_max(logits + n * V, V, w, l, kVocabLanes));
    if (l == 0) rowmax[n] = mx;
  });
}

int mega_cu_xent_sums(mega_cu_stream s, float *sums, const float *logits, const float *rowmax,
                      const int32_t *targets, int v0, int N, int V) {
  return launch_vocab_rows(s, N, xent_width(logits, V), [=] __device__(int64_t n, int l, int w) {
    float sum = Lanes<kVocabLanes>::sum(
        mega_kr_xent_sumexp(logits + n * V, V, w, rowmax[n], l, kVocabLanes));
    if (l == 0) mega_kr_xent_sums(n, sums, logits, targets, v0, N, V, sum);
  });
}

int mega_cu_xent_finish(mega_cu_stream s, float *losses, float *logits, const float *rowmax,
                        const float *sums, int N, int V) {
  return launch_vocab_rows(s, N, xent_width(logits, V), [=] __device__(int64_t n, int l, int w) {
    mega_kr_xent_write(n, l, kVocabLanes, w, losses, logits, V, rowmax[n], sums[n], sums[N + n]);
  });
}

int mega_cu_xent_finish_grad(mega_cu_stream s, float *losses, float *logits, uint16_t *d16,
                             const float *rowmax, const float *sums, const int32_t *targets,
                             int v0, float scale, int N, int V) {
  int width = x4_ok(logits, d16) ? xent_width(logits, V) : 1;
  return launch_vocab_rows(s, N, width, [=] __device__(int64_t n, int l, int w) {
    mega_kr_xent_write_grad(n, l, kVocabLanes, w, losses, logits, d16, V, rowmax[n], sums[n],
                            sums[N + n], (int64_t)targets[n] - v0, scale);
  });
}

int mega_cu_causal_softmax(mega_cu_stream s, float *att, int64_t rows, int T) {
  return launch_rows<32>(s, rows, [=] __device__(int64_t r, int l) {
    using G = Lanes<32>;
    float *row = att + r * T;
    int n = (int)(r % T) + 1;  // columns 0..t
    float mx = G::max(mega_kr_max(row, n, l, 32));
    float sum = G::sum(mega_kr_sumexp(row, row, n, mx, l, 32));
    mega_kr_causal_softmax_scale(r, l, 32, att, T, sum);
  });
}

int mega_cu_causal_softmax_bwd(mega_cu_stream s, float *da, const float *att, int64_t rows,
                               int T, float scale) {
  return launch_rows<32>(s, rows, [=] __device__(int64_t r, int l) {
    int n = (int)(r % T) + 1;
    float dot = Lanes<32>::sum(mega_kr_dot(att + r * T, da + r * T, n, l, 32));
    mega_kr_causal_softmax_bwd(r, l, 32, da, att, T, scale, dot);
  });
}

int mega_cu_attn_dropout(mega_cu_stream s, float *dst, const float *src, int64_t rows, int NH,
                         int T, const mega_attn_dropout *d) {
  mega_attn_dropout dd = *d; // by value: the host's struct is gone when the kernel runs
  return launch(s, rows * T, [=] __device__(int64_t i) {
    mega_kb_attn_dropout(i, dst, src, NH, T, dd);
  });
}

int mega_cu_adamw(mega_cu_stream s, float *p, const float *g, float *m, float *v, int64_t n,
                  float lr, float b1, float b2, float eps, float wd, float gs, float bc1,
                  float bc2) {
  return launch(s, n, [=] __device__(int64_t i) {
    mega_kb_adamw(i, p, g, m, v, lr, b1, b2, eps, wd, gs, bc1, bc2);
  });
}

int mega_cu_adamw_ranges(mega_cu_stream s, const mega_cu_adamw_range *table, int count,
                         int64_t total, float lr, float b1, float b2, float eps, float gs,
                         float bc1, float bc2) {
  if (total <= 0 || count <= 0) return 0;
  adamw_ranges<<<blocks_for(total), kThreads, 0, (cudaStream_t)s>>>(table, count, total, lr, b1,
                                                                    b2, eps, gs, bc1, bc2);
  return (int)cudaGetLastError();
}

int mega_cu_scale(mega_cu_stream s, float *x, int64_t n, float a) {
  return launch(s, n, [=] __device__(int64_t i) { mega_kb_scale(i, x, a); });
}

int mega_cu_to_bf16(mega_cu_stream s, uint16_t *out, const float *in, int64_t n) {
  int64_t n4 = ((uintptr_t)out & 7u) == 0 && on16(in) ? n / 4 : 0;
  if (n4 > 0) {
    to_bf16_x4<<<blocks_for(n4), kThreads, 0, (cudaStream_t)s>>>(n4, (uint2 *)out,
                                                                  (const float4 *)in);
    int e = (int)cudaGetLastError();
    if (e) return e;
  }
  uint16_t *o = out + 4 * n4;
  const float *x = in + 4 * n4;
  return launch(s, n - 4 * n4, [=] __device__(int64_t i) { mega_kb_to_bf16(i, o, x); });
}

int mega_cu_from_bf16(mega_cu_stream s, float *out, uint16_t *out16, int64_t ldo,
                      const uint16_t *in, int64_t ldi, int64_t rows, int64_t cols) {
  return launch(s, rows * cols, [=] __device__(int64_t i) {
    mega_kb_from_bf16(i, out, out16, ldo, in, ldi, cols);
  });
}

int mega_cu_init_normal(mega_cu_stream s, float *dst, int64_t n, uint64_t key, double std,
                        int64_t w, int64_t stride, int64_t off) {
  return launch(s, n, [=] __device__(int64_t i) {
    mega_rng_init_normal(i, dst, key, std, w, stride, off);
  });
}

int mega_cu_sum(mega_cu_stream s, double *partials, const float *x, int64_t n, int squares) {
  block_sums<<<MEGA_CU_SUM_BLOCKS, kThreads, 0, (cudaStream_t)s>>>(partials, x, n, squares);
  return (int)cudaGetLastError();
}

int mega_cu_sumsq_ranges(mega_cu_stream s, double *partials, const mega_cu_sum_ranges *r) {
  if (r->count <= 0) return 0;
  range_block_sums<<<dim3(MEGA_CU_SUM_BLOCKS, r->count), kThreads, 0, (cudaStream_t)s>>>(partials,
                                                                                       *r);
  int e = (int)cudaGetLastError();
  if (e) return e;
  fold_sums<<<1, MEGA_CU_SUM_RANGES, 0, (cudaStream_t)s>>>(partials, *r);
  return (int)cudaGetLastError();
}

}  // extern "C"
