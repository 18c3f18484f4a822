// Causal flash attention for --bf16 on the cuda backend (FlashAttention-2's
// tiling): never materialises the [T, T] scores. Tiles of 64 queries by 64
// keys; q, k, v (given as bf16 copies), dO and the probabilities go through
// the tensor cores as bf16 (WMMA 16x16x16, fp32 accumulation); the online
// softmax, its statistics and every output stay fp32. Four warps per block, each owning 16 rows of the tile.
//
// The forward saves, per query row, the log-sum-exp of its scaled scores,
// and a copy of the output; the backward recomputes the probabilities from
// them. The backward is two kernels, so that no gradient is summed with
// atomics and results are deterministic: dK and dV per key tile (looping
// over the query tiles and, for grouped-query attention, the query heads of
// the group), and dQ per query tile.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "kernels/launch.h"

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64, kThreads = 128;
constexpr int kLdS = kTile + 4;  // float rows of a score tile (padded against bank conflicts)
constexpr int kLdP = kTile + 8;  // bf16 rows of a probability tile

struct Dims {
  int T, NH, G, ldq, ldkv, ldo;
  float scale;
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int HS>
struct Shape {
  static constexpr int kLdH = HS + 8;  // bf16 rows of a q, k, v or dO tile
  static constexpr int kLdO = HS + 4;  // float rows of an output tile
  static constexpr int kHalf = kTile * kLdH;          // bf16 elements of one such tile
  static constexpr int kFloats = 2 * kTile * kLdS > kTile * kLdO ? 2 * kTile * kLdS
                                                                  : kTile * kLdO;
};

// Rows [r0, r0 + 64) of a [T, ld] bf16 head view into rows of ldh, zeros
// past T: 16 bytes at a time where the rows allow.
template <int HS>
__device__ void load_tile(bf16 *dst, const bf16 *src, int ld, int r0, int T) {
  constexpr int ldh = Shape<HS>::kLdH;
  if ((ld & 7) == 0 && ((uintptr_t)src & 15) == 0) {
    for (int i = threadIdx.x; i < kTile * HS / 8; i += kThreads) {
      int r = i / (HS / 8), c = (i % (HS / 8)) * 8;
      uint4 x = r0 + r < T ? *(const uint4 *)(src + (int64_t)(r0 + r) * ld + c)
                           : make_uint4(0u, 0u, 0u, 0u);
      *(uint4 *)(dst + r * ldh + c) = x;
    }
    return;
  }
  for (int i = threadIdx.x; i < kTile * HS; i += kThreads) {
    int r = i / HS, c = i % HS;
    dst[r * ldh + c] = r0 + r < T ? src[(int64_t)(r0 + r) * ld + c] : __float2bfloat16_rn(0.0f);
  }
}

// S[16 rows of the warp][64] = A[the warp's 16 rows][HS] . Bt[64][HS]^T.
template <int HS>
__device__ void rows_by_keys(float *S, const bf16 *A, const bf16 *Bt, int warp) {
  constexpr int ldh = Shape<HS>::kLdH;
  FragC acc[4];
  for (int n = 0; n < 4; n++) wmma::fill_fragment(acc[n], 0.0f);
  for (int kk = 0; kk < HS; kk += 16) {
    FragA a;
    wmma::load_matrix_sync(a, A + warp * 16 * ldh + kk, ldh);
    for (int n = 0; n < 4; n++) {
      FragBT b;
      wmma::load_matrix_sync(b, Bt + n * 16 * ldh + kk, ldh);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
  for (int n = 0; n < 4; n++)
    wmma::store_matrix_sync(S + warp * 16 * kLdS + n * 16, acc[n], kLdS, wmma::mem_row_major);
}

// The warp's accumulators, [16][HS] as fragments, out to fp32 rows of ldo
// in shared memory.
template <int HS>
__device__ void stage(float *dst, FragC *acc, int warp) {
  for (int n = 0; n < HS / 16; n++)
    wmma::store_matrix_sync(dst + warp * 16 * Shape<HS>::kLdO + n * 16, acc[n], Shape<HS>::kLdO,
                            wmma::mem_row_major);
}

// Staged rows [r0, r0 + 64) out to a [T, ld] head view (overwriting), a warp
// per row so the stores coalesce.
template <int HS>
__device__ void store_rows(float *dst, int ld, const float *st, int r0, int T) {
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kTile && r0 + r < T; r += kThreads / 32)
    for (int c = lane; c < HS; c += 32)
      dst[(int64_t)(r0 + r) * ld + c] = st[r * Shape<HS>::kLdO + c];
}

// ---- forward: a block per (query tile, batch element and head) ----

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_fwd(float *out, float *lse, float *ocopy, const bf16 *q, const bf16 *k,
              const bf16 *v, Dims d) {
  using Sh = Shape<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Qs = (bf16 *)smem, *Ks = Qs + Sh::kHalf, *Vs = Ks + Sh::kHalf, *Ps = Vs + Sh::kHalf;
  float *Ss = (float *)(Ps + kTile * kLdP), *Os = Ss + kTile * kLdS;
  int T = d.T, nqt = (T + kTile - 1) / kTile;
  int qt = nqt - 1 - blockIdx.x;  // the longest rows first
  int b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, g = h / (d.NH / d.G);
  int q0 = qt * kTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16 *kb = k + (int64_t)b * T * d.ldkv + g * HS, *vb = v + (int64_t)b * T * d.ldkv + g * HS;
  load_tile<HS>(Qs, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
  for (int i = threadIdx.x; i < kTile * Sh::kLdO; i += kThreads) Os[i] = 0.0f;
  // a lane pair per row: this lane's row, and its half of the columns
  int row = warp * 16 + lane / 2, half = lane & 1, tq = q0 + row;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; kt++) {
    int k0 = kt * kTile;
    __syncthreads();  // the last tile's readers are done
    load_tile<HS>(Ks, kb, d.ldkv, k0, T);
    load_tile<HS>(Vs, vb, d.ldkv, k0, T);
    __syncthreads();
    rows_by_keys<HS>(Ss, Qs, Ks, warp);
    __syncwarp();
    float *s = Ss + row * kLdS;
    float mx = -INFINITY;
    for (int c = half; c < kTile; c += 2) {  // the pair's lanes read adjacent banks
      int tk = k0 + c;
      float x = tk <= tq && tk < T ? s[c] * d.scale : -INFINITY;
      s[c] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float mn = fmaxf(m, mx);
    float base = mn == -INFINITY ? 0.0f : mn;  // a row with nothing yet
    float alpha = __expf(m - base), sum = 0.0f;
    for (int c = half; c < kTile; c += 2) {
      float p = __expf(s[c] - base);
      Ps[row * kLdP + c] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    for (int c = half; c < HS; c += 2) Os[row * Sh::kLdO + c] *= alpha;
    m = mn;
    l = l * alpha + sum;
    __syncwarp();
    for (int n = 0; n < HS / 16; n++) {  // O += P V, the warp's rows
      FragC acc;
      float *o = Os + warp * 16 * Sh::kLdO + n * 16;
      wmma::load_matrix_sync(acc, o, Sh::kLdO, wmma::mem_row_major);
      for (int kk = 0; kk < kTile; kk += 16) {
        FragA a;
        FragB bv;
        wmma::load_matrix_sync(a, Ps + warp * 16 * kLdP + kk, kLdP);
        wmma::load_matrix_sync(bv, Vs + kk * Sh::kLdH + n * 16, Sh::kLdH);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(o, acc, Sh::kLdO, wmma::mem_row_major);
    }
  }
  __syncwarp();
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (half == 0 && tq < T) lse[(int64_t)blockIdx.y * T + tq] = m + logf(l);
  for (int r = 0; r < 16; r++) {  // the warp's rows, a row at a time
    float ir = __shfl_sync(0xffffffffu, inv, r * 2);
    int t = q0 + warp * 16 + r;
    if (t >= T) break;
    int64_t at = ((int64_t)b * T + t) * d.ldo + h * HS;
    for (int c = lane; c < HS; c += 32) {
      float o = Os[(warp * 16 + r) * Sh::kLdO + c] * ir;
      out[at + c] = o;
      ocopy[at + c] = o;
    }
  }
}

// ---- backward ----

// D[(b*NH + h)*T + t] = sum_c dO * O over the head's columns: a warp per row.
template <int HS>
__global__ void flash_bwd_dot(float *D, const float *dout, const float *ocopy, int B, Dims d) {
  int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (w >= (int64_t)B * d.NH * d.T) return;
  int t = (int)(w % d.T), h = (int)(w / d.T % d.NH);
  int64_t b = w / d.T / d.NH, at = (b * d.T + t) * d.ldo + h * HS;
  float s = 0.0f;
  for (int c = lane; c < HS; c += 32) s += dout[at + c] * ocopy[at + c];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) D[w] = s;
}

// Probabilities and their gradient for the warp's 16 query rows of a tile
// pair, by lane pairs: P = exp(scale S - lse) (zero where masked) into Pf
// (fp32) and Pb (bf16), after rows_by_keys left S in Pf; then, once dP is in
// dPf, dS = scale P (dP - D) into dSb (bf16).
__device__ void probs(float *Pf, bf16 *Pb, int row, int half, int tq, int k0, int T,
                      float scale, float lse_row) {
  float *s = Pf + row * kLdS;
  for (int c = half; c < kTile; c += 2) {
    int tk = k0 + c;
    float p = tk <= tq && tk < T && tq < T ? __expf(s[c] * scale - lse_row) : 0.0f;
    s[c] = p;
    Pb[row * kLdP + c] = __float2bfloat16_rn(p);
  }
}

__device__ void dscores(bf16 *dSb, const float *Pf, const float *dPf, int row, int half,
                        float scale, float D_row) {
  for (int c = half; c < kTile; c += 2) {
    float p = Pf[row * kLdS + c];
    dSb[row * kLdP + c] = __float2bfloat16_rn(scale * p * (dPf[row * kLdS + c] - D_row));
  }
}

// dK and dV: a block per (key tile, batch element and key/value head); the
// group's query heads and the query tiles at or after the key tile are
// summed in order.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_kv(float *dk, float *dv, const bf16 *dout, const float *lse, const float *D,
                 const bf16 *q, const bf16 *k, const bf16 *v, Dims d) {
  using Sh = Shape<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Ks = (bf16 *)smem, *Vs = Ks + Sh::kHalf, *Qs = Vs + Sh::kHalf, *dOs = Qs + Sh::kHalf;
  bf16 *Pb = dOs + Sh::kHalf, *dSb = Pb + kTile * kLdP;
  float *Pf = (float *)(dSb + kTile * kLdP), *dPf = Pf + kTile * kLdS;
  float *rows = Pf + Sh::kFloats;  // lse[64], D[64]
  int T = d.T, nqt = (T + kTile - 1) / kTile, rep = d.NH / d.G;
  int kt = blockIdx.x, b = blockIdx.y / d.G, g = blockIdx.y % d.G, k0 = kt * kTile;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = warp * 16 + lane / 2, half = lane & 1;
  load_tile<HS>(Ks, k + (int64_t)b * T * d.ldkv + g * HS, d.ldkv, k0, T);
  load_tile<HS>(Vs, v + (int64_t)b * T * d.ldkv + g * HS, d.ldkv, k0, T);
  FragC dK[HS / 16], dV[HS / 16];
  for (int n = 0; n < HS / 16; n++) {
    wmma::fill_fragment(dK[n], 0.0f);
    wmma::fill_fragment(dV[n], 0.0f);
  }
  for (int r = 0; r < rep; r++) {
    int h = g * rep + r;
    int64_t bh = (int64_t)b * d.NH + h;
    for (int qt = kt; qt < nqt; qt++) {
      int q0 = qt * kTile, tq = q0 + row;
      __syncthreads();  // the last tile's readers are done
      load_tile<HS>(Qs, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
      load_tile<HS>(dOs, dout + (int64_t)b * T * d.ldo + h * HS, d.ldo, q0, T);
      for (int i = threadIdx.x; i < kTile; i += kThreads) {
        rows[i] = q0 + i < T ? lse[bh * T + q0 + i] : 0.0f;
        rows[kTile + i] = q0 + i < T ? D[bh * T + q0 + i] : 0.0f;
      }
      __syncthreads();
      rows_by_keys<HS>(Pf, Qs, Ks, warp);   // S, the warp's query rows
      rows_by_keys<HS>(dPf, dOs, Vs, warp);  // dP = dO V^T
      __syncwarp();
      probs(Pf, Pb, row, half, tq, k0, T, d.scale, rows[row]);
      __syncwarp();
      dscores(dSb, Pf, dPf, row, half, d.scale, rows[kTile + row]);
      __syncthreads();  // every warp's rows of P and dS
      for (int kk = 0; kk < kTile; kk += 16) {  // dV += P^T dO, dK += dS^T Q: the warp's keys
        FragAT pt, st;
        wmma::load_matrix_sync(pt, Pb + kk * kLdP + warp * 16, kLdP);
        wmma::load_matrix_sync(st, dSb + kk * kLdP + warp * 16, kLdP);
        for (int n = 0; n < HS / 16; n++) {
          FragB o, x;
          wmma::load_matrix_sync(o, dOs + kk * Sh::kLdH + n * 16, Sh::kLdH);
          wmma::load_matrix_sync(x, Qs + kk * Sh::kLdH + n * 16, Sh::kLdH);
          wmma::mma_sync(dV[n], pt, o, dV[n]);
          wmma::mma_sync(dK[n], st, x, dK[n]);
        }
      }
    }
  }
  __syncthreads();
  int64_t base = (int64_t)b * T * d.ldkv + g * HS;
  stage<HS>(Pf, dK, warp);
  __syncthreads();
  store_rows<HS>(dk + base, d.ldkv, Pf, k0, T);
  __syncthreads();
  stage<HS>(Pf, dV, warp);
  __syncthreads();
  store_rows<HS>(dv + base, d.ldkv, Pf, k0, T);
}

// dQ: a block per (query tile, batch element and head), over the key tiles
// at or before it.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_q(float *dq, const bf16 *dout, const float *lse, const float *D, const bf16 *q,
                const bf16 *k, const bf16 *v, Dims d) {
  using Sh = Shape<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Ks = (bf16 *)smem, *Vs = Ks + Sh::kHalf, *Qs = Vs + Sh::kHalf, *dOs = Qs + Sh::kHalf;
  bf16 *Pb = dOs + Sh::kHalf, *dSb = Pb + kTile * kLdP;
  float *Pf = (float *)(dSb + kTile * kLdP), *dPf = Pf + kTile * kLdS;
  int T = d.T, nqt = (T + kTile - 1) / kTile;
  int qt = nqt - 1 - blockIdx.x;
  int b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, g = h / (d.NH / d.G);
  int q0 = qt * kTile, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int row = warp * 16 + lane / 2, half = lane & 1, tq = q0 + row;
  load_tile<HS>(Qs, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
  load_tile<HS>(dOs, dout + (int64_t)b * T * d.ldo + h * HS, d.ldo, q0, T);
  float lse_row = tq < T ? lse[(int64_t)blockIdx.y * T + tq] : 0.0f;
  float D_row = tq < T ? D[(int64_t)blockIdx.y * T + tq] : 0.0f;
  const bf16 *kb = k + (int64_t)b * T * d.ldkv + g * HS, *vb = v + (int64_t)b * T * d.ldkv + g * HS;
  FragC dQ[HS / 16];
  for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dQ[n], 0.0f);
  for (int kt = 0; kt <= qt; kt++) {
    int k0 = kt * kTile;
    __syncthreads();
    load_tile<HS>(Ks, kb, d.ldkv, k0, T);
    load_tile<HS>(Vs, vb, d.ldkv, k0, T);
    __syncthreads();
    rows_by_keys<HS>(Pf, Qs, Ks, warp);
    rows_by_keys<HS>(dPf, dOs, Vs, warp);
    __syncwarp();
    probs(Pf, Pb, row, half, tq, k0, T, d.scale, lse_row);
    __syncwarp();
    dscores(dSb, Pf, dPf, row, half, d.scale, D_row);
    __syncwarp();
    for (int kk = 0; kk < kTile; kk += 16) {  // dQ += dS K, the warp's rows
      FragA a;
      wmma::load_matrix_sync(a, dSb + warp * 16 * kLdP + kk, kLdP);
      for (int n = 0; n < HS / 16; n++) {
        FragB kf;
        wmma::load_matrix_sync(kf, Ks + kk * Sh::kLdH + n * 16, Sh::kLdH);
        wmma::mma_sync(dQ[n], a, kf, dQ[n]);
      }
    }
  }
  __syncthreads();
  stage<HS>(Pf, dQ, warp);
  __syncthreads();
  store_rows<HS>(dq + (int64_t)b * T * d.ldq + h * HS, d.ldq, Pf, q0, T);
}

template <int HS>
constexpr size_t fwd_bytes() {
  return 3 * Shape<HS>::kHalf * sizeof(bf16) + kTile * kLdP * sizeof(bf16) + (kTile * kLdS + kTile * Shape<HS>::kLdO) * sizeof(float);
}

template <int HS>
constexpr size_t bwd_bytes() {
  return 4 * Shape<HS>::kHalf * sizeof(bf16) + 2 * kTile * kLdP * sizeof(bf16) +
         (Shape<HS>::kFloats + 2 * kTile) * sizeof(float);
}

template <int HS>
int fwd(cudaStream_t s, float *out, float *lse, float *ocopy, const bf16 *q, const bf16 *k,
        const bf16 *v, int B, Dims d) {
  size_t bytes = fwd_bytes<HS>();
  cudaError_t e = cudaFuncSetAttribute(flash_fwd<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes);
  if (e != cudaSuccess) return (int)e;
  dim3 grid((d.T + kTile - 1) / kTile, B * d.NH);
  flash_fwd<HS><<<grid, kThreads, bytes, s>>>(out, lse, ocopy, q, k, v, d);
  return (int)cudaGetLastError();
}

template <int HS>
int bwd(cudaStream_t s, float *dq, float *dk, float *dv, float *D, const float *dout,
        const bf16 *dout16, const float *ocopy, const float *lse, const bf16 *q, const bf16 *k,
        const bf16 *v, int B, Dims d) {
  int64_t rows = (int64_t)B * d.NH * d.T;
  flash_bwd_dot<HS><<<(unsigned)((rows * 32 + 255) / 256), 256, 0, s>>>(D, dout, ocopy, B, d);
  size_t bytes = bwd_bytes<HS>();
  cudaError_t e;
  if ((e = cudaFuncSetAttribute(flash_bwd_kv<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes)) != cudaSuccess ||
      (e = cudaFuncSetAttribute(flash_bwd_q<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes)) != cudaSuccess)
    return (int)e;
  int nt = (d.T + kTile - 1) / kTile;
  flash_bwd_kv<HS><<<dim3(nt, B * d.G), kThreads, bytes, s>>>(dk, dv, dout16, lse, D, q, k, v,
                                                              d);
  flash_bwd_q<HS><<<dim3(nt, B * d.NH), kThreads, bytes, s>>>(dq, dout16, lse, D, q, k, v, d);
  return (int)cudaGetLastError();
}

Dims dims(int T, int NH, int G, int hs, int ldq, int ldkv) {
  return Dims{T, NH, G, ldq, ldkv, NH * hs, 1.0f / sqrtf((float)hs)};
}

}  // namespace

extern "C" int mega_cu_flash_supported(int hs) { return hs == 64 || hs == 128; }

extern "C" int mega_cu_flash_fwd(mega_cu_stream s, float *out, float *lse, float *ocopy,
                                 const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                                 int T, int NH, int G, int hs, int ldq, int ldkv) {
  Dims d = dims(T, NH, G, hs, ldq, ldkv);
  cudaStream_t cs = (cudaStream_t)s;
  const bf16 *q16 = (const bf16 *)q, *k16 = (const bf16 *)k, *v16 = (const bf16 *)v;
  if (B <= 0 || T <= 0) return 0;
  return hs == 64 ? fwd<64>(cs, out, lse, ocopy, q16, k16, v16, B, d)
                  : fwd<128>(cs, out, lse, ocopy, q16, k16, v16, B, d);
}

extern "C" int mega_cu_flash_bwd(mega_cu_stream s, float *dq, float *dk, float *dv, float *D,
                                 const float *dout, const uint16_t *dout16, const float *ocopy,
                                 const float *lse, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, int B, int T, int NH, int G, int hs, int ldq,
                                 int ldkv) {
  Dims d = dims(T, NH, G, hs, ldq, ldkv);
  cudaStream_t cs = (cudaStream_t)s;
  const bf16 *q16 = (const bf16 *)q, *k16 = (const bf16 *)k, *v16 = (const bf16 *)v;
  const bf16 *o16 = (const bf16 *)dout16;
  if (B <= 0 || T <= 0) return 0;
  return hs == 64 ? bwd<64>(cs, dq, dk, dv, D, dout, o16, ocopy, lse, q16, k16, v16, B, d)
                  : bwd<128>(cs, dq, dk, dv, D, dout, o16, ocopy, lse, q16, k16, v16, B, d);
}
