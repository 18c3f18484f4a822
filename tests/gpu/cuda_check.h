/* What test_cuda_backend's files share: the two backends, the failure
 * count, the shapes most checks use, and the helpers that move and compare
 * device memory (test_cuda_backend.c has them). */
#ifndef MEGA_TESTS_GPU_CUDA_CHECK_H
#define MEGA_TESTS_GPU_CUDA_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/backend/backend.h"
#include "worker/backend/cuda_module.h"

/* raw: a second cuda backend, to write device memory behind gpu's (or
 * another backend's) kept bf16 copies. */
extern mega_backend *cpu, *gpu, *raw;
extern int failures;

enum { Bt = 2, T = 33, C = 48, NH = 4, N = Bt * T, V = 70 };

/* n floats in [-scale, scale) from seed, the caller's to free. */
float *vec(size_t n, unsigned seed, float scale);
/* A device copy of bytes of host memory; zeros; a host copy of device
 * memory (the caller's to free). Each exits on a failure. */
void *up(const void *host, size_t bytes);
void *dev_zero(size_t bytes);
void *down(const void *dev, size_t bytes);
/* Each prints "ok" or "FAIL" (counted) with what. */
void same_bits(const char *what, const void *a, const void *b, size_t bytes);
void same(const char *what, const float *dev, const float *want, size_t n, double tol);

/* test_cuda_sums.c */
void test_classifier(void);
void test_column_sums(void);

/* test_cuda_bf16.c; produced_check: the op of be that just wrote src
 * (rows x cols, under --bf16) put the bf16 copy a matmul on be reads, and
 * it is src's floats rounded (cuda_b16.h). */
void produced_check(mega_backend *be, const char *what, float *src, int rows, int cols);
void test_bf16_matmuls(void);
void test_bf16_kept_copies(void);
void test_bf16_producers(void);
void test_matmul_gelu(void);
void test_bias_grad_epilogue(const mega_cuda_module *m);

/* test_cuda_backend.c: attention refuses buffers sized for flash
 * attention when the batched GEMMs must run (without --bf16, or with drop
 * a dropout mask), with want in its reason. */
void attention_sizes_guard(const mega_cuda_module *m, bool drop, const char *want);

/* test_cuda_dropout.c: attention with dropout against the cpu backend,
 * fp32 and --bf16, and the refusal of buffers sized without the mask. */
void test_attention_dropout(const mega_cuda_module *m);

#endif
