/* Small matrix products for attention, without BLAS's packing: an 8 x 32
 * register tile (eight rows of A broadcast against 32 contiguous floats of
 * each row of B) that GCC turns into AVX-512 or AVX2 FMAs, plus a plain
 * loop for the edges. For the head-sized products of attention (64 x 256 x
 * 64) it runs well ahead of sgemm, whose packing costs as much as the
 * product at these sizes. */
#include <math.h>
#include <stdbool.h>

#include "worker/backend/cpu_internal.h"

#define MR 8
#define NR 32

/* C[MR x NR] = alpha * sum_k a(r, k) B[k][0:NR], with a(r, k) = A[r*ars + k*aks]:
 * (ars, aks) = (lda, 1) for A, (1, lda) for A^T. */
MEGA_CPU_CLONES
static void tile_full(int K, float alpha, const float *A, int ars, int aks, const float *B,
                      int ldb, float *C, int ldc, bool acc) {
  float c[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++) c[r][j] = 0.0f;
  for (int k = 0; k < K; k++) {
    const float *b = B + (size_t)k * ldb;
    const float *a = A + (size_t)k * aks;
    for (int r = 0; r < MR; r++) {
      float ar = a[(size_t)r * ars];
      for (int j = 0; j < NR; j++) c[r][j] = fmaf(ar, b[j], c[r][j]);
    }
  }
  for (int r = 0; r < MR; r++) {
    float *o = C + (size_t)r * ldc;
    if (acc)
      for (int j = 0; j < NR; j++) o[j] += alpha * c[r][j];
    else
      for (int j = 0; j < NR; j++) o[j] = alpha * c[r][j];
  }
}

/* The same for an R x W corner (R <= MR, W <= NR). */
MEGA_CPU_CLONES
static void tile_edge(int R, int W, int K, float alpha, const float *A, int ars, int aks,
                      const float *B, int ldb, float *C, int ldc, bool acc) {
  for (int r = 0; r < R; r++) {
    float c[NR] = {0};
    for (int k = 0; k < K; k++) {
      float ar = A[(size_t)r * ars + (size_t)k * aks];
      const float *b = B + (size_t)k * ldb;
      for (int j = 0; j < W; j++) c[j] = fmaf(ar, b[j], c[j]);
    }
    float *o = C + (size_t)r * ldc;
    if (acc)
      for (int j = 0; j < W; j++) o[j] += alpha * c[j];
    else
      for (int j = 0; j < W; j++) o[j] = alpha * c[j];
  }
}

static void tiles(int M, int N, int K, float alpha, const float *A, int ars, int aks,
                  const float *B, int ldb, float *C, int ldc, bool acc) {
  for (int i = 0; i < M; i += MR) {
    int R = M - i < MR ? M - i : MR;
    const float *Ai = A + (size_t)i * ars;
    for (int j = 0; j < N; j += NR) {
      int W = N - j < NR ? N - j : NR;
      float *Cij = C + (size_t)i * ldc + j;
      if (R == MR && W == NR)
        tile_full(K, alpha, Ai, ars, aks, B + j, ldb, Cij, ldc, acc);
      else
        tile_edge(R, W, K, alpha, Ai, ars, aks, B + j, ldb, Cij, ldc, acc);
    }
  }
}

void mega_cpu_tile_nn(int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc) {
  tiles(M, N, K, alpha, A, lda, 1, B, ldb, C, ldc, false);
}

void mega_cpu_tile_tn(int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float *C, int ldc) {
  tiles(M, N, K, alpha, A, 1, lda, B, ldb, C, ldc, false);
}

void mega_cpu_tile_tn_acc(int M, int N, int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float *C, int ldc) {
  tiles(M, N, K, alpha, A, 1, lda, B, ldb, C, ldc, true);
}
