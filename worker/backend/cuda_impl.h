/* The cuda backend's state and the helpers its files share (cuda.c, the
 * backend; cuda_attn.c, its attention, and cuda_sdpa.c, cuDNN's; cuda_optim.c,
 * AdamW and the norm's sums; cuda_gelu.c, c_fc with its GELU; the helpers
 * are cuda_shared.c's). Inside the cuda module only; the mega_cu__ names
 * are private to it. */
#ifndef MEGA_WORKER_CUDA_IMPL_H
#define MEGA_WORKER_CUDA_IMPL_H

#include <cublas_v2.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/launch.h"
#include "worker/backend/cuda_b16.h"
#include "worker/backend/cuda_internal.h"
#include "worker/backend/cuda_lt.h"

/* A range table kept on the device by content (cuda_optim.c). */
#define MEGA_CU_TABLES 8
typedef struct mega_cu_table {
  void *host, *dev; /* host: what dev holds, to compare */
  size_t bytes, cap;
  uint64_t used; /* table_clock at the last use; 0: never */
} mega_cu_table;

typedef struct cuda_impl {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  double *partials; /* device, MEGA_CU_SUM_RANGES * MEGA_CU_SUM_BLOCKS */
  bool bf16;          /* set_bf16: the matmuls' GEMMs take bf16 copies of their inputs */
  void *bf16_buf[2];
  size_t bf16_cap[2]; /* bytes */
  void *sort_buf;     /* the embedding gradient's sort (encoder_backward) */
  size_t sort_cap;
  void *cols_buf;     /* the column sums' slices (bias and norm weight gradients) */
  size_t cols_cap;
  void *bgrad_buf;    /* cuBLASLt's bias gradient, before it is added on */
  size_t bgrad_cap;
  mega_cu_lt *lt;     /* --bf16's GEMMs with epilogues; NULL: cublasGemmEx */
  mega_cu_b16 *b16;   /* --bf16's kept copies (cuda_b16.h); NULL: scratch each time */
  void *attn_buf;     /* flash attention's bf16 inputs without b16 */
  struct mega_cu_sdpa *sdpa; /* attention through cuDNN (cuda_sdpa.c); NULL: not yet asked */
  size_t attn_cap;
  mega_cu_table tables[MEGA_CU_TABLES]; /* AdamW's range tables */
  uint64_t table_clock;
  mega_cu_adamw_range *adamw_host; /* the table being laid out */
  size_t adamw_cap;
  mega_status sticky;
  char why[480];
} cuda_impl;

static inline cuda_impl *impl_of(mega_backend *be) { return be->impl; }

/* cuda_shared.c: what the op files share. */
/* The first failure of an op that cannot return one, kept for the next op
 * that can: take_sticky returns it, check it or else e's. */
void mega_cu__note(mega_backend *be, int cuda_err, const char *what);
mega_status mega_cu__take_sticky(mega_backend *be, mega_err *err);
mega_status mega_cu__check(mega_backend *be, cudaError_t e, const char *what, mega_err *err);
/* n floats at p are about to be written (cuda_b16.h): every op says so
 * before it reads its bf16 copies. */
void mega_cu__wrote(mega_backend *be, const void *p, size_t n);
/* Where an op writes x's n floats, all of which a GEMM reads next: under
 * --bf16 the copy the op's kernel fills as it writes x, else NULL (x then
 * said written). After the launch, filled notes its error and drops the
 * copies of x and y (y may be NULL) if it did not run. */
uint16_t *mega_cu__produced(mega_backend *be, float *x, size_t n);
void mega_cu__filled(mega_backend *be, int cuda_err, const char *what, float *x, float *y,
                     size_t n);
/* cudaMalloc, after handing the kept copies' memory back when the device
 * is full; grow: *buf grown to at least bytes (scratch kept between
 * calls), NULL after a failure (noted). */
cudaError_t mega_cu__dev_malloc(mega_backend *be, void **p, size_t bytes);
void *mega_cu__grow(mega_backend *be, void **buf, size_t *cap, size_t bytes, const char *what);
/* x's n floats as bf16 from the kept copies; NULL when there are none or
 * no room for one (or after a failure, noted). bf16_copy: the kept copy,
 * or else rounded into scratch k (0 or 1). */
const uint16_t *mega_cu__kept(mega_backend *be, const float *x, size_t n);
const uint16_t *mega_cu__bf16_copy(mega_backend *be, int k, const float *x, size_t n);

/* The optimizer's ops (cuda_optim.c); destroy frees its tables. */
void mega_cu__adamw(mega_backend *be, float *params, const float *grads, float *m, float *v,
                    size_t n, const mega_adamw_params *hp);
void mega_cu__adamw_ranges(mega_backend *be, const mega_adamw_range *r, size_t count,
                           const mega_adamw_params *hp);
void mega_cu__sum_squares_post(mega_backend *be, const mega_sumsq_range *r, size_t count);
void mega_cu__optim_destroy(mega_backend *be);

/* GPT-2's c_fc with its GELU (cuda_gelu.c). */
void mega_cu__matmul_gelu_forward(mega_backend *be, float *out, float *pre, const float *inp,
                                  const float *w, const float *bias, int N, int C, int OC,
                                  mega_wlayout lay);
void mega_cu__matmul_gelu_backward_input(mega_backend *be, float *dpre, const float *dout,
                                         const float *w, const float *pre, int N, int C, int OC,
                                         mega_wlayout lay);

/* Attention through cuDNN (cuda_sdpa.c) on the bf16 copies: false where
 * it does not take the shape (the flash kernels then); failures noted. */
bool mega_cu__sdpa_forward(mega_backend *be, float *out, float *att, const uint16_t *q,
                           const uint16_t *k, const uint16_t *v, const mega_attn_dims *d);
bool mega_cu__sdpa_backward(mega_backend *be, float *dq, float *dk, float *dv,
                            const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                            const uint16_t *v, const float *att, const mega_attn_dims *d);
void mega_cu__sdpa_destroy(mega_backend *be);

void mega_cu__attention_sizes(mega_backend *be, const mega_attn_dims *d, size_t *att,
                              size_t *scratch);
void mega_cu__attention_forward(mega_backend *be, float *out, float *att, float *scratch,
                                const float *q, const float *k, const float *v,
                                const mega_attn_dims *d);
void mega_cu__attention_backward(mega_backend *be, float *dq, float *dk, float *dv,
                                 float *scratch, const float *dout, const float *q,
                                 const float *k, const float *v, const float *att,
                                 const mega_attn_dims *d);

#endif
