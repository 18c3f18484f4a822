// Causal flash attention for --bf16 with the tensor cores' mma.sync
// (m16n8k16, bf16 in, fp32 accumulate) and everything between the two
// products in registers: the scores' accumulators are re-packed as the
// next product's A operand (FlashAttention-2's layout trick), so no score,
// probability or output tile goes through shared memory; only k, v
// (forward) and the other side's tiles (backward) do, read as fragments
// with ldmatrix. Ncu finds the kernels latency-bound (few warps, issue
// slots idle), so registers go to occupancy first: launch bounds, and a
// warp keeps its own rows' fragments in registers only where that costs no
// block (dQ at head size 64). Only tiles on the diagonal or past T are masked. Blocks of 64 query rows
// (or keys), four warps of 16; the tiles a loop walks come in with
// cp.async, the next one while this one is used (two buffers). The forward
// saves each row's log-sum-exp and a copy of the output, from which the
// backward recomputes the probabilities. The backward is two kernels, dK/dV
// per key tile and dQ per query tile, so no gradient is summed with atomics
// and results do not depend on timing. (A first version with WMMA through
// shared memory took 2.9 times as long on an H200: README.)
//
// Fragments of m16n8k16, lane = 4 * g + t (g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major): {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]}
//   B (16 x 8):             {B[2t..][g], B[2t+8..][g]}
//   C (16 x 8, fp32):       C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// Two C tiles side by side (16 x 16) hold exactly one A fragment's values.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/launch.h"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64, kThreads = 128;

struct Dims {
  int T, NH, G, ldq, ldkv, ldo;
  float scale;
};

template <int HS>
struct Sh {
  static constexpr int kLd = HS + 8;  // bf16 row of a shared tile: conflict-free 32-bit loads
  static constexpr int kElems = kTile * kLd;
};

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&v;
}

// ldmatrix.x4: four 8 x 8 bf16 matrices of shared memory, lane l giving
// the address of row l % 8 of matrix l / 8 (16-byte aligned: kLd keeps it).
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const bf16 *row) {
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment of rows [m0, m0+16) and columns [k0, k0+16) of a row-major
// tile, one ldmatrix: matrices (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8).
template <int HS>
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16 *X, int m0, int k0) {
  int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
  ldsm4(a, X + (m0 + (mi & 1) * 8 + r) * Sh<HS>::kLd + k0 + (mi >> 1) * 8);
}

// A warp's A fragments of its 16 rows of a tile that stays put for the
// whole loop (the forward's Q, the backward's K and V or Q and dO): kept in
// registers (HS / 4 of them) or re-read from shared memory each time.
template <int HS, bool kKeep = HS == 64>
struct RowFrags {
  uint32_t a[kKeep ? HS / 16 : 1][4];
  const bf16 *X;
  int m0;
  // once the tile is in shared memory and the block has synchronized
  __device__ __forceinline__ void load(const bf16 *X_, int m0_) {
    X = X_, m0 = m0_;
    if (kKeep)
#pragma unroll
      for (int kk = 0; kk < HS / 16; kk++) frag_a<HS>(a[kk], X, m0, 16 * kk);
  }
  __device__ __forceinline__ void get(uint32_t (&out)[4], int kk) const {
    if (kKeep) {
#pragma unroll
      for (int i = 0; i < 4; i++) out[i] = a[kKeep ? kk : 0][i];
    } else {
      frag_a<HS>(out, X, m0, 16 * kk);
    }
  }
};

// S[16 rows][64] (8 C tiles) = the rows A holds times Y^T, Y's 64 rows
// being the columns of S (row-major, HS columns). Y's B fragments come two
// n-tiles per ldmatrix: matrices (rows 8j, cols +0), (8j, +8), (8j+8, +0), (8j+8, +8).
template <int HS, bool kKeep>
__device__ __forceinline__ void rows_by_rows(float (&s)[8][4], const RowFrags<HS, kKeep> &A,
                                             const bf16 *Y) {
  int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    uint32_t a[4];
    A.get(a, kk);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t b[4];
      ldsm4(b, Y + (8 * (j + (mi >> 1)) + r) * Sh<HS>::kLd + 16 * kk + (mi & 1) * 8);
      mma(s[j], a, b[0], b[1]);
      mma(s[j + 1], a, b[2], b[3]);
    }
  }
}

// acc[HS/8][4] += P (16 x 64, as C tiles p) times Z (64 x HS, row-major):
// Z's B fragments through ldmatrix.trans, two n-tiles per load.
template <int HS>
__device__ __forceinline__ void probs_by_tile(float (&acc)[HS / 8][4], const float (&p)[8][4],
                                              const bf16 *Z) {
  int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    uint32_t a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                     pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                     pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < HS / 16; n++) {
      const bf16 *row = Z + (16 * kk + (mi & 1) * 8 + r) * Sh<HS>::kLd + 16 * n + (mi >> 1) * 8;
      uint32_t b[4], addr = (uint32_t)__cvta_generic_to_shared(row);
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                   : "r"(addr));
      mma(acc[2 * n], a, b[0], b[1]);
      mma(acc[2 * n + 1], a, b[2], b[3]);
    }
  }
}

// cp.async (sm_80 on): global to shared without a trip through registers,
// so a block's next tile arrives while it computes on this one. n source
// bytes are read and the rest of the 16 (or 4) filled with zeros.
__device__ __forceinline__ void cp16(void *dst, const void *src, int n) {
  uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n)
               : "memory");
}

__device__ __forceinline__ void cp4(void *dst, const void *src, int n) {
  uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(n)
               : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are in flight;
// a __syncthreads after it makes every thread's copies visible.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [r0, r0+64) of a [T, ld] bf16 head view into a shared tile, zeros
// past T, 16 bytes at a time (the caller's copies are laid out for it):
// issued only, as cp.async; the caller commits and waits.
template <int HS>
__device__ void load_tile(bf16 *dst, const bf16 *src, int ld, int r0, int T) {
  for (int i = threadIdx.x; i < kTile * HS / 8; i += kThreads) {
    int r = i / (HS / 8), c = (i % (HS / 8)) * 8;
    bool in = r0 + r < T;
    cp16(dst + r * Sh<HS>::kLd + c, src + (int64_t)(in ? r0 + r : 0) * ld + c, in ? 16 : 0);
  }
}

// n floats of a row's statistics from src[r0..] into shared, zeros past T.
__device__ void load_stats(float *dst, const float *src, int r0, int T) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    bool in = r0 + i < T;
    cp4(dst + i, src + (in ? r0 + i : 0), in ? 4 : 0);
  }
}

// The warp's accumulators (rows [m0, m0+16) of a tile at row r0) out to a
// [T, ld] fp32 head view, overwriting; and to a second one when given.
template <int HS>
__device__ void store_acc(float *dst, float *dst2, int ld, const float (&acc)[HS / 8][4],
                          int r0, int T, float mul0, float mul1) {
  int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4, m0 = threadIdx.x / 32 * 16;
  for (int half = 0; half < 2; half++) {
    int row = r0 + m0 + g + 8 * half;
    if (row >= T) continue;
    float mul = half ? mul1 : mul0;
    for (int n = 0; n < HS / 8; n++) {
      // two floats apart: the outputs need not start on 8 bytes
      float v0 = acc[n][2 * half] * mul, v1 = acc[n][2 * half + 1] * mul;
      int64_t at = (int64_t)row * ld + 8 * n + 2 * t;
      dst[at] = v0;
      dst[at + 1] = v1;
      if (dst2) {
        dst2[at] = v0;
        dst2[at + 1] = v1;
      }
    }
  }
}

// ---- forward: a block per (query tile, batch element and head) ----

// 2^x in one instruction (MUFU.EX2; __expf is this after a multiply).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scores times scale * log2(e), and the row maxima. Only the diagonal tile
// has keys after a query (and keys past T: T's last tile is the diagonal):
// kMask, and nothing to test in the others. Maxima and sums go through four
// partials a row: one chain of 16 dependent instructions stalled the warp.
template <bool kMask>
__device__ __forceinline__ void scale_scores(float (&s)[8][4], float (&mx)[2], float scale,
                                             int k0, int row0, int row1, int T) {
  int t = threadIdx.x % 4;
  float part[2][4];
#pragma unroll
  for (int i = 0; i < 2; i++) part[i][0] = part[i][1] = part[i][2] = part[i][3] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x = s[j][e] * scale;
      if (kMask) {
        int col = k0 + 8 * j + 2 * t + (e & 1), row = e < 2 ? row0 : row1;
        x = col <= row && col < T ? x : -INFINITY;
      }
      s[j][e] = x;
      float &p = part[e / 2][(j & 1) * 2 + (e & 1)];
      p = fmaxf(p, x);
    }
#pragma unroll
  for (int i = 0; i < 2; i++)
    mx[i] = fmaxf(fmaxf(part[i][0], part[i][1]), fmaxf(part[i][2], part[i][3]));
}

// Four blocks an SM at head size 64 (128 registers, Q re-read); at 128
// shared memory (85 KB a block) leaves room for two.
template <int HS>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 4 : 2)
    fwd_kernel(float *out, float *lse, float *ocopy, const bf16 *q, const bf16 *k, const bf16 *v,
               Dims d) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int E = Sh<HS>::kElems;
  bf16 *Qs = (bf16 *)smem;  // then two buffers of a K and a V tile
  int T = d.T, nqt = (T + kTile - 1) / kTile, qt = nqt - 1 - blockIdx.x;
  int b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, grp = h / (d.NH / d.G);
  int q0 = qt * kTile, m0 = threadIdx.x / 32 * 16, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  int row0 = q0 + m0 + g, row1 = row0 + 8;
  const float scale2 = d.scale * 1.44269504f;  // the softmax in base 2
  const bf16 *kb = k + (int64_t)b * T * d.ldkv + grp * HS;
  const bf16 *vb = v + (int64_t)b * T * d.ldkv + grp * HS;
  load_tile<HS>(Qs, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
  cp_commit();
  load_tile<HS>(Qs + E, kb, d.ldkv, 0, T);
  load_tile<HS>(Qs + 2 * E, vb, d.ldkv, 0, T);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  RowFrags<HS, false> Q;
  Q.load(Qs, m0);
  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in base 2
  for (int kt = 0; kt <= qt; kt++) {
    int k0 = kt * kTile;
    bf16 *Ks = Qs + E * (1 + 2 * (kt & 1)), *Vs = Ks + E;
    if (kt < qt) {  // the next tiles into the other buffer, used two iterations ago
      bf16 *Kn = Qs + E * (1 + 2 * ((kt + 1) & 1));
      load_tile<HS>(Kn, kb, d.ldkv, k0 + kTile, T);
      load_tile<HS>(Kn + E, vb, d.ldkv, k0 + kTile, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    float s[8][4];
    rows_by_rows<HS>(s, Q, Ks);
    float mx[2] = {-INFINITY, -INFINITY};
    if (kt == qt)
      scale_scores<true>(s, mx, scale2, k0, row0, row1, T);
    else
      scale_scores<false>(s, mx, scale2, k0, row0, row1, T);
    float alpha[2], base[2];
    for (int i = 0; i < 2; i++) {  // the quad shares a row
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      float mn = fmaxf(m[i], mx[i]);
      base[i] = mn == -INFINITY ? 0.0f : mn;  // a row with nothing yet
      alpha[i] = ex2(m[i] - base[i]);
      m[i] = mn;
    }
    float sum[2][4] = {};
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = ex2(s[j][e] - base[e / 2]);
        s[j][e] = p;
        sum[e / 2][(j & 1) * 2 + (e & 1)] += p;
      }
    for (int i = 0; i < 2; i++)  // this lane's part; the quad's are summed at the end
      l[i] = l[i] * alpha[i] + ((sum[i][0] + sum[i][1]) + (sum[i][2] + sum[i][3]));
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    probs_by_tile<HS>(o, s, Vs);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  const float ln2 = 0.69314718f;  // the backward reads natural-log statistics
  if (t == 0) {
    if (row0 < T) lse[(int64_t)blockIdx.y * T + row0] = m[0] * ln2 + logf(l[0]);
    if (row1 < T) lse[(int64_t)blockIdx.y * T + row1] = m[1] * ln2 + logf(l[1]);
  }
  int64_t base_o = (int64_t)b * T * d.ldo + h * HS;
  store_acc<HS>(out + base_o, ocopy + base_o, d.ldo, o, q0, T, l[0] > 0 ? 1.0f / l[0] : 0.0f,
                l[1] > 0 ? 1.0f / l[1] : 0.0f);
}

// ---- backward ----

// P and dS of a 16 x 64 tile pair in C tiles: s holds the scores, dp the
// products dO V^T; (rows, cols) are (ri, cj) in the tile's own order, and
// row_is_q says which of them is the query (the key/value kernel works on
// the transpose). lse_at and D_at give a query's statistics. kMask: the
// pair is on the diagonal or reaches past T; the others need no test.
template <bool kRowIsQuery, bool kMask, typename Lse, typename Dq>
__device__ __forceinline__ void grads(float (&s)[8][4], float (&dp)[8][4], int r_base, int c_base,
                                      int T, float scale, Lse lse_at, Dq D_at) {
  int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int r = r_base + g + (e < 2 ? 0 : 8), c = c_base + 8 * j + 2 * t + (e & 1);
      int tq = kRowIsQuery ? r : c, tk = kRowIsQuery ? c : r;
      float p = !kMask || (tk <= tq && tq < T && tk < T) ? __expf(s[j][e] * scale - lse_at(tq))
                                                         : 0.0f;
      s[j][e] = p;
      dp[j][e] = scale * p * (dp[j][e] - D_at(tq));
    }
}

// D[(b*NH + h)*T + t] = sum_c dO * O over the head's columns: a warp per row.
template <int HS>
__global__ void dot_kernel(float *D, const float *dout, const float *ocopy, int B, Dims d) {
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

// dK and dV: a block per (key tile, batch element and key/value head), each
// warp 16 keys (their K and V fragments re-read: at head size 64 that
// leaves three blocks an SM, 168 registers, where keeping them held 254
// and two, and ncu found the kernel waiting on latency with 8 warps); the group's query heads and the query tiles at or after the
// key tile are summed in order. Works on transposed tiles: S^T = K Q^T,
// dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q.
template <int HS>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 3 : 1)
    kv_kernel(float *dk, float *dv, const bf16 *dout, const float *lse, const float *D,
              const bf16 *q, const bf16 *k, const bf16 *v, Dims d) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int E = Sh<HS>::kElems;
  // K, V, then two buffers of a Q and a dO tile, then two of lse and D rows
  bf16 *Ks = (bf16 *)smem, *Vs = Ks + E, *buf = Vs + E;
  float *stats = (float *)(buf + 4 * E);
  int T = d.T, nqt = (T + kTile - 1) / kTile, rep = d.NH / d.G;
  int kt = blockIdx.x, b = blockIdx.y / d.G, grp = blockIdx.y % d.G, k0 = kt * kTile;
  int m0 = threadIdx.x / 32 * 16;
  // iteration it: query head grp * rep + it / nq, query tile kt + it % nq
  int nq = nqt - kt, total = rep * nq;
  auto issue = [&](int it) {
    int h = grp * rep + it / nq, q0 = (kt + it % nq) * kTile, j = it & 1;
    int64_t bh = (int64_t)b * d.NH + h;
    load_tile<HS>(buf + 2 * j * E, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
    load_tile<HS>(buf + (2 * j + 1) * E, dout + (int64_t)b * T * d.ldo + h * HS, d.ldo, q0, T);
    load_stats(stats + 2 * j * kTile, lse + bh * T, q0, T);
    load_stats(stats + (2 * j + 1) * kTile, D + bh * T, q0, T);
  };
  load_tile<HS>(Ks, k + (int64_t)b * T * d.ldkv + grp * HS, d.ldkv, k0, T);
  load_tile<HS>(Vs, v + (int64_t)b * T * d.ldkv + grp * HS, d.ldkv, k0, T);
  cp_commit();
  issue(0);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  RowFrags<HS, false> Kf, Vf;
  Kf.load(Ks, m0);
  Vf.load(Vs, m0);
  float dK[HS / 8][4] = {}, dV[HS / 8][4] = {};
  for (int it = 0; it < total; it++) {
    int q0 = (kt + it % nq) * kTile, j = it & 1;
    if (it + 1 < total) {
      issue(it + 1);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const bf16 *Qs = buf + 2 * j * E, *dOs = buf + (2 * j + 1) * E;
    const float *lse_s = stats + 2 * j * kTile, *D_s = stats + (2 * j + 1) * kTile;
    float s[8][4], dp[8][4];
    rows_by_rows<HS>(s, Kf, Qs);
    rows_by_rows<HS>(dp, Vf, dOs);
    auto lse_at = [&](int tq) { return lse_s[tq - q0]; };
    auto D_at = [&](int tq) { return D_s[tq - q0]; };
    if (q0 == k0 || q0 + kTile > T || k0 + kTile > T)
      grads<false, true>(s, dp, k0 + m0, q0, T, d.scale, lse_at, D_at);
    else
      grads<false, false>(s, dp, k0 + m0, q0, T, d.scale, lse_at, D_at);
    probs_by_tile<HS>(dV, s, dOs);
    probs_by_tile<HS>(dK, dp, Qs);
    __syncthreads();  // every warp is done with buffer j before it is refilled
  }
  int64_t base = (int64_t)b * T * d.ldkv + grp * HS;
  store_acc<HS>(dk + base, nullptr, d.ldkv, dK, k0, T, 1.0f, 1.0f);
  store_acc<HS>(dv + base, nullptr, d.ldkv, dV, k0, T, 1.0f, 1.0f);
}

// dQ: a block per (query tile, batch element and head), each warp 16 query
// rows, over the key tiles at or before it: dQ += dS K. At head size 64,
// three blocks an SM (168 registers; free, 172 and two).
template <int HS>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 3 : 1)
    q_kernel(float *dq, const bf16 *dout, const float *lse, const float *D, const bf16 *q,
             const bf16 *k, const bf16 *v, Dims d) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int E = Sh<HS>::kElems;
  bf16 *Qs = (bf16 *)smem, *dOs = Qs + E;  // then two buffers of a K and a V tile
  int T = d.T, nqt = (T + kTile - 1) / kTile, qt = nqt - 1 - blockIdx.x;
  int b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, grp = h / (d.NH / d.G);
  int q0 = qt * kTile, m0 = threadIdx.x / 32 * 16, g = threadIdx.x % 32 / 4;
  int row0 = q0 + m0 + g, row1 = row0 + 8;
  load_tile<HS>(Qs, q + (int64_t)b * T * d.ldq + h * HS, d.ldq, q0, T);
  load_tile<HS>(dOs, dout + (int64_t)b * T * d.ldo + h * HS, d.ldo, q0, T);
  cp_commit();
  const float *lr = lse + (int64_t)blockIdx.y * T, *Dr = D + (int64_t)blockIdx.y * T;
  float lse0 = row0 < T ? lr[row0] : 0.0f, lse1 = row1 < T ? lr[row1] : 0.0f;
  float D0 = row0 < T ? Dr[row0] : 0.0f, D1 = row1 < T ? Dr[row1] : 0.0f;
  const bf16 *kb = k + (int64_t)b * T * d.ldkv + grp * HS;
  const bf16 *vb = v + (int64_t)b * T * d.ldkv + grp * HS;
  load_tile<HS>(Qs + 2 * E, kb, d.ldkv, 0, T);
  load_tile<HS>(Qs + 3 * E, vb, d.ldkv, 0, T);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  RowFrags<HS> Qf, dOf;
  Qf.load(Qs, m0);
  dOf.load(dOs, m0);
  float dQ[HS / 8][4] = {};
  for (int kt = 0; kt <= qt; kt++) {
    int k0 = kt * kTile;
    bf16 *Ks = Qs + E * (2 + 2 * (kt & 1)), *Vs = Ks + E;
    if (kt < qt) {
      bf16 *Kn = Qs + E * (2 + 2 * ((kt + 1) & 1));
      load_tile<HS>(Kn, kb, d.ldkv, k0 + kTile, T);
      load_tile<HS>(Kn + E, vb, d.ldkv, k0 + kTile, T);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    float s[8][4], dp[8][4];
    rows_by_rows<HS>(s, Qf, Ks);
    rows_by_rows<HS>(dp, dOf, Vs);
    auto lse_at = [&](int tq) { return tq == row0 ? lse0 : lse1; };
    auto D_at = [&](int tq) { return tq == row0 ? D0 : D1; };
    if (kt == qt || q0 + kTile > T)
      grads<true, true>(s, dp, q0 + m0, k0, T, d.scale, lse_at, D_at);
    else
      grads<true, false>(s, dp, q0 + m0, k0, T, d.scale, lse_at, D_at);
    probs_by_tile<HS>(dQ, dp, Ks);
    __syncthreads();
  }
  store_acc<HS>(dq + (int64_t)b * T * d.ldq + h * HS, nullptr, d.ldq, dQ, q0, T, 1.0f, 1.0f);
}

// Six tiles (two kept, two double-buffered) and, for dK/dV, two buffers
// of two rows of statistics; the dQ kernel asks the same.
template <int HS>
constexpr int bwd_bytes() {
  return 6 * Sh<HS>::kElems * (int)sizeof(bf16) + 4 * kTile * (int)sizeof(float);
}

template <int HS>
int fwd(cudaStream_t s, float *out, float *lse, float *ocopy, const bf16 *q, const bf16 *k,
        const bf16 *v, int B, Dims d) {
  int bytes = 5 * Sh<HS>::kElems * (int)sizeof(bf16);
  cudaError_t e = cudaFuncSetAttribute(fwd_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       bytes);
  if (e != cudaSuccess) return (int)e;
  dim3 grid((d.T + kTile - 1) / kTile, B * d.NH);
  fwd_kernel<HS><<<grid, kThreads, bytes, s>>>(out, lse, ocopy, q, k, v, d);
  return (int)cudaGetLastError();
}

template <int HS>
int bwd(cudaStream_t s, float *dq, float *dk, float *dv, float *D, const float *dout,
        const bf16 *dout16, const float *ocopy, const float *lse, const bf16 *q, const bf16 *k,
        const bf16 *v, int B, Dims d) {
  int64_t rows = (int64_t)B * d.NH * d.T;
  dot_kernel<HS><<<(unsigned)((rows * 32 + 255) / 256), 256, 0, s>>>(D, dout, ocopy, B, d);
  int bytes = bwd_bytes<HS>();
  cudaError_t e;
  if ((e = cudaFuncSetAttribute(kv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                bytes)) != cudaSuccess ||
      (e = cudaFuncSetAttribute(q_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                bytes)) != cudaSuccess)
    return (int)e;
  int nt = (d.T + kTile - 1) / kTile;
  kv_kernel<HS><<<dim3(nt, B * d.G), kThreads, bytes, s>>>(dk, dv, dout16, lse, D, q, k, v, d);
  q_kernel<HS><<<dim3(nt, B * d.NH), kThreads, bytes, s>>>(dq, dout16, lse, D, q, k, v, d);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" int mega_cu_flash_supported(int hs) { return hs == 64 || hs == 128; }

extern "C" int mega_cu_flash_fwd(mega_cu_stream s, float *out, float *lse, float *ocopy,
                                 const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
                                 int T, int NH, int G, int hs, int ldq, int ldkv) {
  Dims d = {T, NH, G, ldq, ldkv, NH * hs, 1.0f / sqrtf((float)hs)};
  const bf16 *q16 = (const bf16 *)q, *k16 = (const bf16 *)k, *v16 = (const bf16 *)v;
  if (B <= 0 || T <= 0) return 0;
  return hs == 64 ? fwd<64>((cudaStream_t)s, out, lse, ocopy, q16, k16, v16, B, d)
                  : fwd<128>((cudaStream_t)s, out, lse, ocopy, q16, k16, v16, B, d);
}

extern "C" int mega_cu_flash_bwd(mega_cu_stream s, float *dq, float *dk, float *dv, float *D,
                                 const float *dout, const uint16_t *dout16, const float *ocopy,
                                 const float *lse, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, int B, int T, int NH, int G, int hs, int ldq,
                                 int ldkv) {
  Dims d = {T, NH, G, ldq, ldkv, NH * hs, 1.0f / sqrtf((float)hs)};
  const bf16 *q16 = (const bf16 *)q, *k16 = (const bf16 *)k, *v16 = (const bf16 *)v;
  const bf16 *o16 = (const bf16 *)dout16;
  if (B <= 0 || T <= 0) return 0;
  return hs == 64 ? bwd<64>((cudaStream_t)s, dq, dk, dv, D, dout, o16, ocopy, lse, q16, k16, v16,
                            B, d)
                  : bwd<128>((cudaStream_t)s, dq, dk, dv, D, dout, o16, ocopy, lse, q16, k16,
                             v16, B, d);
}
