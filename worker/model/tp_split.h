/* How a tensor splits over the ranks of a tensor-parallel group.
 *
 * The full tensor is viewed as [outer, parts, inner]; rank r of tp holds
 * [outer, parts, inner/tp], the columns [r*inner/tp, (r+1)*inner/tp) of
 * every (outer, part) row. That one shape covers every split the GPT uses:
 *
 *   replicated                 parts 0 (every rank holds the whole tensor)
 *   rows of [R, K]             outer 1, parts 1, inner R*K   (wte, the head,
 *                              row-parallel weights, c_fc's bias)
 *   columns of [R, K]          outer R, parts 1, inner K     (c_fc's weight)
 *   fused QKV [C, 3C]          outer C, parts 3, inner C     (c_attn's weight)
 *   fused QKV bias [3C]        outer 1, parts 3, inner C     (c_attn's bias)
 *
 * The fused QKV case is why this exists: Hugging Face stores c_attn as
 * [C, 3C] = q | k | v, and a rank's heads are a slice of each third, not
 * one contiguous block. A rank's local c_attn is then q_r | k_r | v_r, which
 * is again a fused QKV of its own heads, so attention runs unchanged on it.
 *
 * Every function here works on host memory. */
#ifndef MEGA_WORKER_TP_SPLIT_H
#define MEGA_WORKER_TP_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mega_tp_split {
  int parts;           /* 0: replicated */
  size_t outer, inner; /* inner: the full length, divisible by tp */
} mega_tp_split;

static inline bool mega_tp_split_replicated(const mega_tp_split *s) { return s->parts == 0; }

/* Index in the full tensor of element i of rank's slice. */
size_t mega_tp_full_index(const mega_tp_split *s, int tp, int rank, size_t i);

/* local (the slice's numel floats) = rank's slice of full. */
void mega_tp_cut(const mega_tp_split *s, int tp, int rank, const float *full, float *local);
/* rank's slice of full = local. */
void mega_tp_place(const mega_tp_split *s, int tp, int rank, const float *local, float *full);

#endif
