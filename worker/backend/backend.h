/* The math and memory backend: the narrow interface the model, the optimizer
 * and the engine compute through. The cpu backend (cpu*.c) uses OpenBLAS
 * for the linear layers and plain, vectorisable C loops for the rest
 * (attention's head-sized products included); a cuda backend implements the
 * same table with cuBLAS and the kernels in kernels/. Both share the
 * per-element math of the headers in kernels/ (elementwise.h, rng.h).
 *
 * Memory. Every float/int pointer an op takes is backend memory (from
 * ops->alloc), unless the comment says "host". On the cpu backend backend
 * memory is ordinary host memory. Ops are issued in order on one stream;
 * host-visible results (memcpy to host, sum, sum_squares) are complete when
 * the call returns, so each may wait for the stream: a loop of them waits
 * once per turn (sum_squares_post and one memcpy wait once in all).
 * synchronize waits for everything issued before it.
 *
 * Layout. Matrices are row-major. Activations are [N, C] with N = B*T rows.
 * A linear layer's weight is stored either as Hugging Face Conv1D does,
 * [in, out] (MEGA_W_IN_OUT: GPT-2's c_attn, c_proj, c_fc), or as nn.Linear /
 * an embedding does, [out, in] (MEGA_W_OUT_IN: Llama's projections, the
 * head [V, C]).
 *
 * Gradient conventions. Ops that produce an activation gradient overwrite
 * their output; layernorm_backward_input also adds the residual stream's
 * other path. Ops that produce a parameter gradient always add (+=), so
 * microbatches accumulate.
 *
 * Ownership. mega_backend_cpu_create returns a backend the caller frees with
 * mega_backend_destroy, after freeing every buffer it allocated. Compute ops
 * return nothing: their inputs are checked by the caller (the model checks
 * shapes once, at create time); only alloc, memcpy and the host-visible
 * reductions can fail. */
#ifndef MEGA_WORKER_BACKEND_H
#define MEGA_WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/dropout.h"

typedef struct mega_backend mega_backend;

typedef enum mega_copy_kind {
  MEGA_COPY_H2D, /* host -> backend */
  MEGA_COPY_D2H, /* backend -> host */
  MEGA_COPY_D2D, /* backend -> backend */
} mega_copy_kind;

typedef enum mega_wlayout {
  MEGA_W_IN_OUT, /* weight [C, OC]: out = inp @ W (HF Conv1D) */
  MEGA_W_OUT_IN, /* weight [OC, C]: out = inp @ W^T (nn.Linear, tied head) */
} mega_wlayout;

/* AdamW hyperparameters for one update of a flat range. step counts from 1;
 * bias correction uses it. grad_scale multiplies each gradient before use
 * (1.0, or the clipping coefficient). Weight decay is decoupled:
 * p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p). */
typedef struct mega_adamw_params {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  int step;
} mega_adamw_params;

/* One range of adamw_ranges: its own buffers, length and weight decay. */
typedef struct mega_adamw_range {
  float *params;
  const float *grads;
  float *m, *v;
  size_t n;
  float weight_decay;
} mega_adamw_range;

/* One range of sum_squares_post: the sum of squares of x's n floats goes
 * to *out (backend memory). */
typedef struct mega_sumsq_range {
  const float *x;
  size_t n;
  double *out;
} mega_sumsq_range;

/* The shape of one attention call (attention_forward). */
typedef struct mega_attn_dims {
  int B, T;
  int NH, G;     /* query heads; key/value heads (G divides NH) */
  int hs;        /* head size */
  int ldq, ldkv; /* row strides (floats) of q, and of k and v; their gradients' too */
  /* Floats the caller's att and scratch hold (attention_sizes); 0: the
   * full sizes, B*NH*T*T and B*NH*T*T + B*T*NH*hs. */
  size_t att_cap, scratch_cap;
  /* Attention dropout on the probabilities before they multiply v, both
   * directions; all zero (the default): none. Both backends draw the same
   * mask; it takes the cuda backend's batched GEMMs, not flash attention
   * (mega_attn_flash_shape), so attention_sizes must see it too. */
  mega_attn_dropout drop;
} mega_attn_dims;

/* Whether attention of d rounds as flash attention under --bf16
 * (set_bf16): head sizes the flash kernels have (64, 128), T > hs (their
 * statistics then fit where the probabilities would be), strides their
 * 16-byte loads take, and no attention dropout (neither the flash kernels
 * nor cuDNN draw its mask: the cuda backend runs fp32 batched GEMMs for
 * it, so the cpu backend stays fp32 too). Both backends decide with it, on
 * the dims alone. */
static inline bool mega_attn_flash_shape(const mega_attn_dims *d) {
  return (d->hs == 64 || d->hs == 128) && d->T > d->hs && d->ldq % 8 == 0 &&
         d->ldkv % 8 == 0 && d->drop.scale == 0.0f;
}

/* Floats from an attention view's first element to its last: B*T rows of
 * heads*hs, ld apart (what a rounded copy of q, k, v or dout must hold). */
static inline size_t mega_attn_span(const mega_attn_dims *d, int ld, int heads) {
  return ((size_t)d->B * d->T - 1) * ld + (size_t)heads * d->hs;
}

/* Whether q, k, v are views of one fused [N, ld] buffer, as GPT-2's qkv:
 * then one copy of the span serves all three. */
static inline bool mega_attn_fused_qkv(const float *q, const float *k, const float *v,
                                       const mega_attn_dims *d) {
  return k == q + (size_t)d->NH * d->hs && v == k + (size_t)d->G * d->hs && d->ldq == d->ldkv;
}

typedef struct mega_backend_ops {
  const char *name; /* "cpu", "cuda" */
  void (*destroy)(mega_backend *be); /* frees impl and be; via mega_backend_destroy */

  /* ---- memory ---- */
  /* Zero-filled, 64-byte aligned. *out is the caller's, for ops->free. */
  mega_status (*alloc)(mega_backend *be, size_t bytes, void **out, mega_err *err);
  void (*free)(mega_backend *be, void *p); /* NULL is fine */
  void (*memset0)(mega_backend *be, void *p, size_t bytes);
  mega_status (*memcpy)(mega_backend *be, void *dst, const void *src, size_t bytes,
                        mega_copy_kind kind, mega_err *err);
  mega_status (*synchronize)(mega_backend *be, mega_err *err);
  /* Threads one worker's math may use (on cpu: OpenBLAS's threads for the
   * GEMMs and the backend's own, which sleep between ops, for everything
   * else; ignored on cuda). n >= 1. */
  mega_status (*set_threads)(mega_backend *be, int n, mega_err *err);
  /* --bf16 (off by default): matmul_forward, matmul_backward_input and
   * matmul_backward_weight round both GEMM inputs to bf16 (to nearest,
   * ties to even: kernels/elementwise.h) and accumulate in fp32, as
   * cuBLAS's bf16 GEMMs with CUBLAS_COMPUTE_32F do. Their outputs, the
   * bias gradients (sums of the rounded output gradient) and every weight,
   * gradient and optimizer state stay fp32. gemm and gemm_batched stay fp32. Attention of the shapes
   * mega_attn_flash_shape accepts rounds as flash attention does: the cuda
   * backend runs cuDNN's fused attention or its own bf16 flash kernels and
   * the cpu backend rounds where the flash kernels do (attention_forward;
   * cuDNN also rounds the output and the gradients); other shapes stay
   * fp32 on both. */
  mega_status (*set_bf16)(mega_backend *be, bool on, mega_err *err);

  /* ---- GEMM: C = alpha * op(A) @ op(B) + beta * C, row-major ----
   * op(A) is [M, K], op(B) is [K, N], C is [M, N]; lda/ldb/ldc are the row
   * strides of A, B, C as stored. The batched form repeats it batch times,
   * stepping each pointer by its stride (in floats). */
  void (*gemm)(mega_backend *be, bool trans_a, bool trans_b, int M, int N, int K,
               float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);
  void (*gemm_batched)(mega_backend *be, bool trans_a, bool trans_b, int M, int N,
                       int K, float alpha, const float *A, int lda, int64_t stride_a,
                       const float *B, int ldb, int64_t stride_b, float beta, float *C,
                       int ldc, int64_t stride_c, int batch);

  /* ---- GPT kernels (llm.c's, with backward halves) ---- */
  /* out[b,t,:] = wte[tok[b,t]-v0,:] + wpe[t,:]. wte holds the rows of ids
   * [v0, v0+vn) (a vocabulary-parallel slice; 0, V when whole): an id
   * outside contributes zeros. wpe may be NULL (adds nothing). tok is
   * backend memory. */
  void (*encoder_forward)(mega_backend *be, float *out, const int32_t *tok,
                          const float *wte, int v0, int vn, const float *wpe, int B, int T,
                          int C);
  /* dwte[tok[b,t]-v0,:] += dout[b,t,:] for ids in the slice;
   * dwpe[t,:] += dout[b,t,:]. Either gradient may be NULL to skip it. */
  void (*encoder_backward)(mega_backend *be, float *dwte, int v0, int vn, float *dwpe,
                           const float *dout, const int32_t *tok, int B, int T, int C);

  /* out = (inp - mean) * rstd * w + b over each row of C; mean and rstd
   * ([N]) are saved for the backward. */
  void (*layernorm_forward)(mega_backend *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b, int N,
                            int C, float eps);
  /* dinp = dres + LN'(dout): the input part plus the residual's gradient
   * dres, which may be dinp itself (+=) or NULL (none). */
  void (*layernorm_backward_input)(mega_backend *be, float *dinp, const float *dres,
                                   const float *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int N, int C);
  /* dw += sum_n dout * xhat; db += sum_n dout: the weight part. */
  void (*layernorm_backward_weight)(mega_backend *be, float *dw, float *db,
                                    const float *dout, const float *inp,
                                    const float *mean, const float *rstd, int N, int C);

  /* out[N,OC] = inp[N,C] @ W + bias + residual[N,OC]; bias and residual
   * may be NULL, and residual may be out itself (+=). Folding the residual
   * in saves the separate add's pass over memory. */
  void (*matmul_forward)(mega_backend *be, float *out, const float *inp, const float *w,
                         const float *bias, const float *residual, int N, int C, int OC,
                         mega_wlayout lay);
  /* dinp[N,C] = dout[N,OC] @ W^T, overwriting dinp, or added to it when
   * accumulate (the input gradient of several linears that read one input:
   * Llama's q, k and v, or gate and up). */
  void (*matmul_backward_input)(mega_backend *be, float *dinp, const float *dout,
                                const float *w, int N, int C, int OC, mega_wlayout lay,
                                bool accumulate);
  /* dW += inp^T @ dout (in W's layout); dbias += sum_n dout (dbias may be
   * NULL). Under --bf16 the bias gradient sums dout rounded to bf16, the
   * values the GEMM reads (Megatron's bf16 gradient; the cuda backend's
   * cuBLASLt epilogue computes it inside the GEMM). */
  void (*matmul_backward_weight)(mega_backend *be, float *dw, float *dbias,
                                 const float *dout, const float *inp, int N, int C,
                                 int OC, mega_wlayout lay);

  /* Causal self-attention, grouped-query: NH query heads in q, G key and
   * value heads in k and v (G divides NH; query head h reads group
   * h / (NH/G); G = NH is plain multi-head attention), each head hs
   * contiguous floats of its row, softmax scale 1/sqrt(hs). q, k and v are
   * [B*T] rows with strides d->ldq and d->ldkv (GPT-2's fused qkv [B,T,3C]
   * is q = qkv, k = qkv + C, v = qkv + 2C, both strides 3C). Writes out
   * [B,T,NH*hs] and, for the backward, att [B,NH,T,T]: the probabilities
   * below the diagonal, or whatever else the backend's backward needs (the
   * cuda backend's flash attention keeps statistics and a copy of out).
   * att and scratch hold what attention_sizes says, for both directions.
   * With d->drop, out is (P * mask * scale) v and att keeps P undropped;
   * the backward draws the same mask again. */
  /* Floats att and scratch must hold for d's shape under the backend's
   * settings now (size them after set_bf16, on dims that carry the
   * dropout mask when the calls will, and pass them in d->att_cap and
   * d->scratch_cap): the full sizes above, or less where the backend
   * keeps less (the cuda backend's flash attention: the rows' log-sum-exp
   * and a copy of out in att, B*NH*T floats of scratch). NULL: the full
   * sizes; mega_attention_sizes says either. */
  void (*attention_sizes)(mega_backend *be, const mega_attn_dims *d, size_t *att,
                          size_t *scratch);
  void (*attention_forward)(mega_backend *be, float *out, float *att, float *scratch,
                            const float *q, const float *k, const float *v,
                            const mega_attn_dims *d);
  /* dq, dk, dv (strides as q, k, v) = attention'(dout), overwritten; a key
   * or value head's gradient sums its NH/G query heads'. They must not
   * overlap q, k, v, dout or att (the cuda backend reads those while it
   * writes them). */
  void (*attention_backward)(mega_backend *be, float *dq, float *dk, float *dv, float *scratch,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *att, const mega_attn_dims *d);

  /* ---- Llama's kernels ---- */
  /* RMSNorm: out = inp * rstd * w over each row of C, with rstd = 1 /
   * sqrt(mean(inp^2) + eps) ([N]) saved for the backward. */
  void (*rmsnorm_forward)(mega_backend *be, float *out, float *rstd, const float *inp,
                          const float *w, int N, int C, float eps);
  /* dinp = dres + RMSNorm'(dout), as layernorm_backward_input (dres may be
   * dinp itself or NULL). */
  void (*rmsnorm_backward_input)(mega_backend *be, float *dinp, const float *dres,
                                 const float *dout, const float *inp, const float *w,
                                 const float *rstd, int N, int C);
  /* dw += sum_n dout * inp * rstd. */
  void (*rmsnorm_backward_weight)(mega_backend *be, float *dw, const float *dout,
                                  const float *inp, const float *rstd, int N, int C);
  /* SwiGLU: out = silu(gate) * up, silu(x) = x * sigmoid(x), over n
   * elements. The backward writes dgate and dup (dgate may alias dout). */
  void (*swiglu_forward)(mega_backend *be, float *out, const float *gate, const float *up,
                         size_t n);
  void (*swiglu_backward)(mega_backend *be, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n);
  /* Rotary position embedding in place on x, [B*T] rows of stride ld
   * holding heads heads of hs floats from column 0; the row of token t of
   * its sequence rotates, in each head, the pairs (i, i + rot/2) for i <
   * rot/2 by the angle of (t, i): Hugging Face's rotate-half convention
   * (and Megatron's non-interleaved one); the channels past rot stay.
   * cs [T', rot] (T' >= T) holds cos at [t*rot + i] and sin at
   * [t*rot + rot/2 + i]. The backward rotates the gradient back (by -angle),
   * in place. */
  void (*rope_forward)(mega_backend *be, float *x, const float *cs, int B, int T, int heads,
                       int hs, int ld, int rot);
  void (*rope_backward)(mega_backend *be, float *dx, const float *cs, int B, int T, int heads,
                        int hs, int ld, int rot);

  /* GELU over n elements, tanh approximation (kernels/elementwise.h's
   * mega_gelu: GPT-2's "gelu_new"); the backward writes dinp = GELU'(inp)
   * * dout. dinp may alias dout. */
  void (*gelu_forward)(mega_backend *be, float *out, const float *inp, size_t n);
  void (*gelu_backward)(mega_backend *be, float *dinp, const float *inp,
                        const float *dout, size_t n);
  /* The same contract for the exact GELU, 0.5 x (1 + erf(x / sqrt 2))
   * (mega_gelu_erf: PyTorch's F.gelu, Hugging Face's "gelu"), which
   * Megatron runs without its bias-GELU fusion. */
  void (*gelu_erf_forward)(mega_backend *be, float *out, const float *inp, size_t n);
  void (*gelu_erf_backward)(mega_backend *be, float *dinp, const float *inp,
                            const float *dout, size_t n);
  /* matmul_forward (no residual) into pre and gelu_forward (the tanh form
   * only) of it into out, fused where the backend can (cuda under --bf16:
   * cuBLASLt's GELU epilogue, which is the tanh form, one pass over memory
   * fewer); and matmul_backward_input into dpre followed by gelu_backward
   * in place (dpre = (dout @ W^T) * GELU'(pre)). NULL: the caller runs the
   * two ops, as the cpu backend would. Megatron's --no-bias-gelu-fusion
   * keeps them apart (and the model then runs the erf form). */
  void (*matmul_gelu_forward)(mega_backend *be, float *out, float *pre, const float *inp,
                              const float *w, const float *bias, int N, int C, int OC,
                              mega_wlayout lay);
  void (*matmul_gelu_backward_input)(mega_backend *be, float *dpre, const float *dout,
                                     const float *w, const float *pre, int N, int C, int OC,
                                     mega_wlayout lay);

  /* out = a + b; out may alias a or b. (The GPT folds its residuals into
   * matmul_forward instead.) */
  void (*residual_forward)(mega_backend *be, float *out, const float *a, const float *b,
                           size_t n);
  /* out[N,C] = a + b + bias (bias [C] per row, may be NULL); out may alias
   * a or b: a row-parallel layer's residual and bias, added after its
   * reduction. */
  void (*bias_residual_forward)(mega_backend *be, float *out, const float *a, const float *b,
                                const float *bias, int N, int C);
  /* Megatron's bias-dropout-add over rows [rows, C] of a microbatch:
   * out = res + dropout(y + bias), the mask and scale of kernels/dropout.h
   * (d is host memory, read before the call returns; row r of the call is
   * d's row r). res and bias may be NULL (none); out may alias res or y.
   * With both NULL it is also dropout's backward (the mask is linear).
   * fp32 on every backend, with --bf16 or without. */
  void (*bias_dropout_add)(mega_backend *be, float *out, const float *res, const float *y,
                           const float *bias, int rows, int C, const mega_dropout *d);

  /* Fused softmax + cross-entropy over V classes for N rows, in place over
   * the logits (the model keeps no second [N,V] buffer):
   * forward: losses[n] = -log softmax(logits)[n, targets[n]], and each row
   *   of logits becomes its softmax, the probabilities p. targets is backend
   *   memory, each in [0, V).
   * backward: p = (p - onehot(targets - v0)) * scale, computed as p * scale
   *   and then, at the target, minus scale (the bits the model's tests keep);
   *   the one-hot only for targets in [v0, v0+V): the rows may be a
   *   vocabulary slice (v0 0 when whole). The scale waits for the backward
   *   because the model is given it there. */
  void (*crossentropy_forward)(mega_backend *be, float *losses, float *logits,
                               const int32_t *targets, int N, int V);
  void (*crossentropy_backward)(mega_backend *be, float *probs, const int32_t *targets, int v0,
                                float scale, int N, int V);

  /* Vocabulary-parallel cross-entropy (Megatron's): logits [N,V] are this
   * rank's slice of ids [v0, v0+V); the caller reduces between the steps,
   * so full logits are never gathered.
   * 1. rowmax[n] = max of the slice's row; the caller takes the max over
   *    ranks.
   * 2. sums[n] = sum exp(logits - rowmax); sums[N+n] = the target's logit
   *    if it is in the slice, else 0; the caller sums both over ranks.
   * 3. losses[n] = log sums[n] + rowmax[n] - sums[N+n]; in place, logits
   *    become exp(logits - rowmax) / sums[n] (the slice of the softmax),
   *    which crossentropy_backward takes with the slice's v0. */
  void (*crossentropy_rowmax)(mega_backend *be, float *rowmax, const float *logits, int N,
                              int V);
  void (*crossentropy_sums)(mega_backend *be, float *sums, const float *logits,
                            const float *rowmax, const int32_t *targets, int v0, int N, int V);
  void (*crossentropy_finish)(mega_backend *be, float *losses, float *logits,
                              const float *rowmax, const float *sums, int N, int V);

  /* The classifier fused with its backward (llm.c's), for a caller that
   * knows the scale at the forward: in one pass per row the logits become
   * dlogits, the probabilities never stored. forward_grad is
   * crossentropy_forward then crossentropy_backward(v0 0, scale), and
   * finish_grad is crossentropy_finish then crossentropy_backward(v0,
   * scale), the same losses and the same bits. */
  void (*crossentropy_forward_grad)(mega_backend *be, float *losses, float *logits,
                                    const int32_t *targets, float scale, int N, int V);
  void (*crossentropy_finish_grad)(mega_backend *be, float *losses, float *logits,
                                   const float *rowmax, const float *sums,
                                   const int32_t *targets, int v0, float scale, int N, int V);

  /* AdamW on a flat range of n elements; m and v are the moment buffers. */
  void (*adamw)(mega_backend *be, float *params, const float *grads, float *m, float *v,
                size_t n, const mega_adamw_params *hp);
  /* AdamW on count ranges at once (r is host memory, read before the call
   * returns), each with its own weight decay (hp's is not read): the same
   * bits as adamw on each in turn. Ranges must not overlap. A step's ranges
   * are many (one per tensor) and the same every step, so a backend may
   * keep their table. Optional: NULL makes mega_adamw_ranges loop over
   * adamw; the cuda backend runs one kernel over all of them. */
  void (*adamw_ranges)(mega_backend *be, const mega_adamw_range *r, size_t count,
                       const mega_adamw_params *hp);
  /* *out (host) = sum of x[i] (resp. x[i]^2), accumulated in double. */
  mega_status (*sum)(mega_backend *be, const float *x, size_t n, double *out,
                     mega_err *err);
  mega_status (*sum_squares)(mega_backend *be, const float *x, size_t n, double *out,
                             mega_err *err);
  /* Each range's sum of squares, the bits sum_squares gives, into its
   * out (backend memory), queued like a compute op: nothing waits, so the
   * gradient norm posts every range and reads all the outs back with one
   * memcpy instead of a wait per range (r is host memory, read before the
   * call returns). Optional: NULL makes mega_sum_squares_post take
   * sum_squares and copy each result up. */
  void (*sum_squares_post)(mega_backend *be, const mega_sumsq_range *r, size_t count);
  /* x *= s. */
  void (*scale)(mega_backend *be, float *x, size_t n, float s);
  /* A tensor's initial values, or a tensor-parallel slice of them, made
   * where they live: dst[i] = std * N(0, 1) drawn from kernels/rng.h's
   * stream key at the full tensor's index (i / w) * stride + off + i % w
   * (mega_rng_init_normal; w = stride, off 0: the whole tensor), i < n.
   * The bits are the same on every backend up to the last bit of its
   * double log and cos (the cpu backend's: the host's libm). w >= 1 when
   * n > 0. Queued like the other compute ops: errors surface at the next
   * op that can fail (synchronize). */
  void (*init_normal)(mega_backend *be, float *dst, size_t n, uint64_t key, double std,
                      size_t w, size_t stride, size_t off);
} mega_backend_ops;

/* The handle. ops is never NULL; impl is the backend's own state. */
struct mega_backend {
  const mega_backend_ops *ops;
  void *impl;
};

typedef struct mega_backend_cpu_opts {
  int threads; /* math threads (see set_threads); 0 means 1: workers share
                  the node's cores */
  bool track_memory; /* keep a list of live allocations for mega_backend_cpu_owns
                        (tests: proves which buffers are backend memory) */
} mega_backend_cpu_opts;

/* opts may be NULL (one thread). OpenBLAS picks its kernel set (Haswell,
 * SkylakeX, ...) once per process, from OPENBLAS_CORETYPE or its own CPU
 * detection. */
mega_status mega_backend_cpu_create(const mega_backend_cpu_opts *opts,
                                    mega_backend **out, mega_err *err);

/* Whether [p, p+bytes) lies inside one live allocation of a cpu backend
 * made with track_memory (false without it). */
bool mega_backend_cpu_owns(mega_backend *be, const void *p, size_t bytes);

/* The OpenBLAS kernel set in use ("Haswell", "SkylakeX", ...), for logs. */
const char *mega_backend_cpu_blas_core(void);

/* Frees the handle itself; NULL is fine. */
void mega_backend_destroy(mega_backend *be);

/* attention_sizes, or the full sizes where the backend has none. */
void mega_attention_sizes(mega_backend *be, const mega_attn_dims *d, size_t *att,
                          size_t *scratch);

/* adamw_ranges, or adamw on each range (those of n 0 skipped) where the
 * backend has none. */
void mega_adamw_ranges(mega_backend *be, const mega_adamw_range *r, size_t count,
                       const mega_adamw_params *hp);

/* sum_squares_post, or sum_squares and a copy to each out where the backend
 * has none (which can fail, hence the status; a posting backend's failure
 * comes with the memcpy that reads the outs). */
mega_status mega_sum_squares_post(mega_backend *be, const mega_sumsq_range *r, size_t count,
                                  mega_err *err);

#endif
