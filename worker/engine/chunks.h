/* A rank's model chunks: one GPT stage per virtual pipeline stage it owns,
 * built from the layout, plus the views of their parameters that the
 * optimizer, the gradient reductions and checkpoints need.
 *
 * Ownership: mega_chunks owns its stages and arrays; it borrows the backend. */
#ifndef MEGA_WORKER_CHUNKS_H
#define MEGA_WORKER_CHUNKS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/jobspec.h"
#include "core/layout.h"
#include "core/status.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/engine/grads.h"
#include "worker/model/gpt.h"
#include "worker/optim/optim.h"

typedef struct mega_chunks {
  int vp;
  mega_gpt_config cfg;
  mega_gpt_stage **stages;      /* [vp] */
  mega_optim_range *ranges;     /* one per parameter of every chunk */
  mega_ckpt_param *ckpt;        /* parallel to ranges */
  bool *tied_copy;              /* parallel to ranges: the loss stage's copy of wte */
  size_t nparams;
  float *wte_grad;              /* this rank's wte gradient (embedding or its copy), or NULL */
  size_t wte_numel;
  mega_grads *grads;            /* the chunks' param and grad buffers and their buckets */
} mega_chunks;

/* The model config a job describes. */
mega_status mega_chunks_config(const mega_jobspec *job, mega_gpt_config *cfg, mega_err *err);

/* Builds the stages of pipeline rank pp_rank from the layout, with tensor
 * parallelism tp (NULL: none), and moves their parameters and gradients
 * into worker/grads buffers laid out by grads (data-parallel size and rank,
 * buckets). no_init: the caller overwrites every parameter (mega_gpt_stage_desc). */
mega_status mega_chunks_build(mega_chunks *c, mega_backend *be, const mega_jobspec *job,
                              const mega_layout *layout, int pp_rank, const mega_gpt_tp *tp,
                              const mega_grads_opts *grads, bool no_init, mega_err *err);

/* Points the checkpoint views at the optimizer's moments (after
 * mega_optim_create over c->ranges). */
void mega_chunks_bind_optim(mega_chunks *c, mega_optim *o);

/* Points the checkpoint views' moments at whole-moment arrays laid out
 * like the chunks' buffers (one per chunk, as mega_grads_gather_moments
 * fills them), or back at nothing (NULL arrays): a distributed optimizer
 * holds only shards, so its checkpoints go through such arrays. */
void mega_chunks_point_moments(mega_chunks *c, float *const *exp_avg, float *const *exp_avg_sq);

void mega_chunks_free(mega_chunks *c);

#endif
