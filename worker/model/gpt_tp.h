/* A stage's tensor-parallel linears over one microbatch's stream (see
 * gpt_acts.h for the shapes): the TP group's gathers and reductions, every
 * one a no-op without tensor parallelism, and hidden dropout
 * (kernels/dropout.h) at the sites around them. For gpt_pass.c; not a
 * public header. */
#ifndef MEGA_WORKER_GPT_TP_H
#define MEGA_WORKER_GPT_TP_H

#include "worker/model/gpt_acts.h"

static inline bool gpt_tp_on(const mega_gpt_stage *s) { return s->desc.tp.size > 1; }
static inline bool gpt_sp_on(const mega_gpt_stage *s) {
  return s->desc.tp.sequence_parallel && gpt_tp_on(s);
}

/* This rank's rows of a whole [N,C] tensor: where a layernorm writes
 * before gpt_gather_rows fills in the others. */
static inline float *gpt_my_rows(const mega_gpt_stage *s, const mega_gpt_acts *a, float *whole) {
  return gpt_sp_on(s) ? whole + (size_t)s->desc.tp.rank * a->R * s->cfg.channels : whole;
}

/* Where a row-parallel result of [N,C] is written before gpt_reduce_rows
 * sums it over the group into out [R,C]: out itself when the sum is an
 * all-reduce in place. */
static inline float *gpt_partial_for(const mega_gpt_stage *s, const mega_gpt_acts *a,
                                     float *out) {
  return gpt_sp_on(s) ? a->partial : out;
}

/* Sequence parallelism: the other ranks' rows of whole, in place. */
mega_status gpt_gather_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *whole, mega_err *err);
/* Sequence parallelism: whole [N,C] = every rank's rows [R,C]. */
mega_status gpt_gather_into(mega_gpt_stage *s, mega_gpt_acts *a, const float *rows,
                            float *whole, mega_err *err);
/* out [R,C] = the sum over the group of gpt_partial_for(out): an all-reduce
 * in place, or a reduce-scatter with sequence parallelism. */
mega_status gpt_reduce_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *out, mega_err *err);

/* ---- hidden dropout ---- */

/* Whether the acts' last forward trains with dropout (it was given its
 * samples and the model has a probability). */
static inline bool gpt_drop_on(const mega_gpt_stage *s, const mega_gpt_acts *a) {
  return s->cfg.hidden_dropout > 0 && a->fwd_sample >= 0;
}

/* The first row of the stream this rank holds. */
static inline int64_t gpt_stream_row0(const mega_gpt_stage *s, const mega_gpt_acts *a) {
  return gpt_sp_on(s) ? (int64_t)s->desc.tp.rank * a->R : 0;
}

/* The dropout of a site of local block l (-1: the embeddings) over rows
 * from row0 of the microbatch's [N,C]. */
mega_dropout gpt_drop_of(const mega_gpt_stage *s, const mega_gpt_acts *a, int l, int site,
                         int64_t row0);

/* ---- the linears ---- */

/* out [R,C] = x + dropout(W(in) + bias) for a row-parallel GEMM of K local
 * inputs, at dropout site `site` of block l: without dropout fused into
 * the GEMM alone; with TP the residual and the bias come after the
 * reduction, so they count once, and dropout (Megatron's bias-dropout-add)
 * after it too, on this rank's rows. */
mega_status gpt_row_parallel_forward(mega_gpt_stage *s, mega_gpt_acts *a, float *out,
                                     const float *in, const float *w, const float *bias,
                                     const float *x, int K, int l, int site, mega_err *err);

/* dall [N,C] = the whole output gradient of block l's row-parallel GEMM at
 * dropout site `site` from this rank's rows dy [R,C]: gathered with
 * sequence parallelism, then times the site's mask (the same the forward
 * drew: the mask is linear, so its backward is itself). A no-op when dall
 * is dy (no sequence parallelism, no dropout: gpt_acts.c aliases them). */
mega_status gpt_out_grad(mega_gpt_stage *s, mega_gpt_acts *a, const float *dy, float *dall,
                         int l, int site, mega_err *err);

/* One column-parallel linear of K local outputs: its output gradient and
 * weight. */
typedef struct gpt_col_grad {
  const float *dout;
  size_t w;
  int K;
} gpt_col_grad;

/* din [R,C] = the input gradient of n column-parallel GEMMs that read the
 * same input (W^T dout, summed over them), summed over the group. */
mega_status gpt_column_parallel_backward(mega_gpt_stage *s, mega_gpt_acts *a, float *din,
                                         const gpt_col_grad *g, int n, mega_err *err);

#endif
