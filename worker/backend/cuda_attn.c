/* The cuda backend's attention (backend.h's attention ops): cuBLAS's
 * batched GEMMs around the softmax kernels (attn_gemm.c), or under --bf16
 * cuDNN's fused attention (cuda_sdpa.c) or else the flash kernels
 * (kernels/flash_mma.cu), on bf16 copies of q, k, v and dO. Attention
 * dropout runs only the batched GEMMs, its mask drawn by the kernel body
 * the cpu backend's bits come from (gpt_bodies.h's mega_kb_attn_dropout).
 * Part of cuda.c's backend; its state and helpers are cuda_impl.h's. */
#include <stdio.h>

#include "kernels/launch.h"
#include "worker/backend/attn_gemm.h"
#include "worker/backend/cuda_impl.h"

#define S(be) ((mega_cu_stream)impl_of(be)->stream)
/* cuda.c's helpers, by the names they have there */
#define note mega_cu__note
#define wrote mega_cu__wrote
#define grow mega_cu__grow
#define kept mega_cu__kept

static void cu_softmax(mega_backend *be, float *att, int64_t rows, int T) {
  note(be, mega_cu_causal_softmax(S(be), att, rows, T), "causal softmax");
}

static void cu_softmax_bwd(mega_backend *be, float *da, const float *att, int64_t rows, int T,
                           float scale) {
  note(be, mega_cu_causal_softmax_bwd(S(be), da, att, rows, T, scale), "softmax backward");
}

static void cu_dropout(mega_backend *be, float *dst, const float *src, const mega_attn_dims *d) {
  note(be, mega_cu_attn_dropout(S(be), dst, src, (int64_t)d->B * d->NH * d->T, d->NH, d->T,
                                &d->drop),
       "attention dropout");
}

static const mega_attn_softmax cu_sm = {
    .forward = cu_softmax, .backward = cu_softmax_bwd, .dropout = cu_dropout};

/* Under --bf16, for head sizes flash_mma.cu supports, T > hs and strides
 * its 16-byte loads can take (multiples of 8), attention is cuDNN's where
 * it takes the shape (cuda_sdpa.c), else the flash kernels: att then holds
 * the rows' log-sum-exp [B*NH*T] and a copy of the output [B*T, NH*hs]
 * (fp32 from flash, bf16 from cuDNN; they fit in [B,NH,T,T] when T > hs),
 * not the probabilities. Otherwise, and always with attention dropout
 * (neither cuDNN nor the flash kernels draw mega's mask), the batched
 * GEMMs. The forward and the backward decide alike: on the dims only
 * (mega_attn_flash_shape). */
static bool use_flash(mega_backend *be, const mega_attn_dims *d) {
  return impl_of(be)->bf16 && mega_attn_flash_shape(d) && mega_cu_flash_supported(d->hs);
}

/* The bf16 copies flash attention reads, in c->attn_buf: q, k and v with
 * their own strides (one copy when they are views of one fused [N, ld]
 * buffer, as GPT-2's qkv), and dout when given. Each copy starts on 16
 * bytes, for the kernels' vector loads. False after a failure. */
typedef struct attn16 {
  const uint16_t *q, *k, *v, *dout;
} attn16;

static size_t up8(size_t n) { return (n + 7) / 8 * 8; }

static bool attn_bf16(mega_backend *be, const float *q, const float *k, const float *v,
                      const float *dout, const mega_attn_dims *d, attn16 *o) {
  cuda_impl *c = impl_of(be);
  bool fused = mega_attn_fused_qkv(q, k, v, d);
  size_t nq = mega_attn_span(d, d->ldq, fused ? d->NH + 2 * d->G : d->NH);
  size_t nk = fused ? 0 : mega_attn_span(d, d->ldkv, d->G);
  size_t no = dout ? (size_t)d->B * d->T * d->NH * d->hs : 0;
  if (c->b16 && (o->q = kept(be, q, nq))) { /* the backward finds the forward's q, k, v */
    o->k = fused ? o->q + d->NH * d->hs : kept(be, k, nk);
    o->v = fused ? o->k + d->G * d->hs : kept(be, v, nk);
    o->dout = dout ? kept(be, dout, no) : NULL;
    if (o->k && o->v && (!dout || o->dout)) return true;
  }
  if (c->sticky != MEGA_OK) return false; /* else no room: the scratch below */
  size_t total = up8(nq) + 2 * up8(nk) + up8(no);
  uint16_t *b = grow(be, &c->attn_buf, &c->attn_cap, total * sizeof(uint16_t),
                     "allocating flash attention's bf16 inputs");
  if (!b) return false;
  note(be, mega_cu_to_bf16(S(be), b, q, (int64_t)nq), "rounding attention inputs to bf16");
  o->q = b;
  if (fused) {
    o->k = b + d->NH * d->hs;
    o->v = o->k + d->G * d->hs;
  } else {
    uint16_t *bk = b + up8(nq), *bv = bk + up8(nk);
    note(be, mega_cu_to_bf16(S(be), bk, k, (int64_t)nk), "rounding attention inputs to bf16");
    note(be, mega_cu_to_bf16(S(be), bv, v, (int64_t)nk), "rounding attention inputs to bf16");
    o->k = bk;
    o->v = bv;
  }
  o->dout = NULL;
  if (dout) {
    uint16_t *bo = b + up8(nq) + 2 * up8(nk);
    note(be, mega_cu_to_bf16(S(be), bo, dout, (int64_t)no), "rounding attention inputs to bf16");
    o->dout = bo;
  }
  return true;
}

void mega_cu__attention_sizes(mega_backend *be, const mega_attn_dims *d, size_t *att,
                               size_t *scratch) {
  size_t rows = (size_t)d->B * d->NH * d->T, out = (size_t)d->B * d->T * d->NH * d->hs;
  *att = use_flash(be, d) ? rows + out : rows * d->T;
  *scratch = use_flash(be, d) ? rows : rows * d->T + out;
}

/* Buffers sized for flash attention when the batched GEMMs run (set_bf16
 * turned off after sizing, or dims sized without the dropout mask they now
 * carry) would be overrun: refuse, so no path runs without the mask. */
static bool attn_fits(mega_backend *be, const mega_attn_dims *d) {
  size_t att, scratch;
  mega_cu__attention_sizes(be, d, &att, &scratch);
  if ((!d->att_cap || d->att_cap >= att) && (!d->scratch_cap || d->scratch_cap >= scratch))
    return true;
  cuda_impl *c = impl_of(be);
  if (c->sticky == MEGA_OK) {
    c->sticky = MEGA_ERR_INVALID;
    if (d->drop.scale != 0.0f)
      snprintf(c->why, sizeof c->why,
               "cuda backend: attention dropout runs the batched GEMMs (the flash kernels and "
               "cuDNN draw no dropout mask), which need %zu and %zu floats of att and scratch; "
               "the caller has %zu and %zu: size them with attention_sizes on dims that carry "
               "the mask",
               att, scratch, d->att_cap, d->scratch_cap);
    else
      snprintf(c->why, sizeof c->why,
               "cuda backend: attention needs %zu and %zu floats of att and scratch, the "
               "caller has %zu and %zu: size them with attention_sizes after set_bf16",
               att, scratch, d->att_cap, d->scratch_cap);
  }
  return false;
}

/* What attention writes: out (or dq, dk, dv), att and scratch. */
static void attn_wrote(mega_backend *be, const float *att, const float *scratch,
                       const mega_attn_dims *d) {
  size_t na, ns;
  mega_cu__attention_sizes(be, d, &na, &ns);
  wrote(be, att, d->att_cap > na ? d->att_cap : na);
  wrote(be, scratch, d->scratch_cap > ns ? d->scratch_cap : ns);
}

void mega_cu__attention_forward(mega_backend *be, float *out, float *att, float *scratch,
                                 const float *q, const float *k, const float *v,
                                 const mega_attn_dims *d) {
  attn16 h;
  float *ocopy = att + (size_t)d->B * d->NH * d->T;
  wrote(be, out, (size_t)d->B * d->T * d->NH * d->hs);
  attn_wrote(be, att, scratch, d);
  if (!attn_fits(be, d)) return;
  if (!use_flash(be, d)) {
    mega_attn_gemm_forward(be, &cu_sm, out, att, scratch, q, k, v, d);
    return;
  }
  if (!attn_bf16(be, q, k, v, NULL, d, &h)) return;
  if (mega_cu__sdpa_forward(be, out, att, h.q, h.k, h.v, d)) return;
  note(be, mega_cu_flash_fwd(S(be), out, att, ocopy, h.q, h.k, h.v, d->B, d->T, d->NH, d->G,
                             d->hs, d->ldq, d->ldkv),
       "flash attention");
}

void mega_cu__attention_backward(mega_backend *be, float *dq, float *dk, float *dv,
                                  float *scratch, const float *dout, const float *q,
                                  const float *k, const float *v, const float *att,
                                  const mega_attn_dims *d) {
  attn16 h;
  const float *ocopy = att + (size_t)d->B * d->NH * d->T;
  wrote(be, dq, mega_attn_span(d, d->ldq, d->NH));
  wrote(be, dk, mega_attn_span(d, d->ldkv, d->G));
  wrote(be, dv, mega_attn_span(d, d->ldkv, d->G));
  attn_wrote(be, NULL, scratch, d);
  if (!attn_fits(be, d)) return;
  if (!use_flash(be, d)) {
    mega_attn_gemm_backward(be, &cu_sm, dq, dk, dv, scratch, dout, q, k, v, att, d);
    return;
  }
  if (!attn_bf16(be, q, k, v, dout, d, &h)) return;
  if (mega_cu__sdpa_backward(be, dq, dk, dv, h.dout, h.q, h.k, h.v, att, d)) return;
  note(be, mega_cu_flash_bwd(S(be), dq, dk, dv, scratch, dout, h.dout, ocopy, att, h.q, h.k,
                             h.v, d->B, d->T, d->NH, d->G, d->hs, d->ldq, d->ldkv),
       "flash attention backward");
}

