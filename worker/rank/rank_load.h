/* Loading a checkpoint into a parallel rank's chunks, on top of
 * worker/ckpt/checkpoint.h. Every rank reads its own chunks' tensors (and
 * their optimizer state) by name from the same checkpoint directory, so a
 * checkpoint loads into any pipeline, virtual-pipeline or data-parallel
 * layout. Megatron's load flags apply: --finetune (weights only, from
 * iteration 0), --no-load-optim (fresh Adam state), and for the LR schedule
 * the default check, --override-opt_param-scheduler or
 * --use-checkpoint-opt_param-scheduler. Saving is in rank_saver.h. */
#ifndef MEGA_WORKER_RANK_LOAD_H
#define MEGA_WORKER_RANK_LOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "worker/engine/chunks.h"
#include "worker/optim/lr_sched.h"
#include "worker/optim/optim.h"

/* Refuses checkpoint flags this build cannot honour. */
mega_status mega_rank_ckpt_check(const mega_jobspec *job, mega_err *err);

/* What --load found. */
typedef struct mega_rank_ckpt_loaded {
  bool loaded;          /* false: --load held no checkpoint yet (start fresh) */
  char path[4096];      /* the checkpoint directory loaded */
  char notice[1024];    /* "" or why an incomplete newer one was passed over */
  int64_t iteration;    /* where training resumes (0 with --finetune) */
  int64_t eval_done;    /* evaluation batches run before it (0 with --finetune) */
} mega_rank_ckpt_loaded;

/* --load: fills the chunks, the optimizer (unless --finetune or
 * --no-load-optim) and out; *lr becomes the checkpoint's schedule with
 * --use-checkpoint-opt_param-scheduler, and is checked against it unless
 * --override-opt_param-scheduler, --finetune or --no-load-optim. A
 * directory with no checkpoint yet is not an error (Megatron starts
 * fresh), unless --exit-on-missing-checkpoint (then MEGA_ERR_INVALID). */
mega_status mega_rank_ckpt_load(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, mega_lr_sched *lr, mega_rank_ckpt_loaded *out,
                                mega_err *err);

#endif
