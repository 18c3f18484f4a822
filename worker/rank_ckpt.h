/* Checkpoints of a parallel rank, on top of worker/checkpoint.h.
 *
 * Loading: every rank reads its own chunks' tensors (and their optimizer
 * state) by name from the same checkpoint directory, so a checkpoint can
 * be resumed under another pipeline or data-parallel layout.
 *
 * Saving: data-parallel replicas hold the same weights, so one writes.
 * With pipeline parallelism the stages would need one committer for their
 * shards, which is not built yet: such a job is refused at start with a
 * clear message rather than left unsaved. */
#ifndef MEGA_WORKER_RANK_CKPT_H
#define MEGA_WORKER_RANK_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "worker/chunks.h"
#include "worker/optim.h"

/* Refuses --save layouts that cannot be saved yet (see above). */
mega_status mega_rank_ckpt_check(const mega_jobspec *job, mega_err *err);

/* --load: fills the chunks and the optimizer, and *iteration (left at 0
 * when the directory holds no checkpoint yet, as Megatron starts fresh). */
mega_status mega_rank_ckpt_load(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, int64_t *iteration, const char **loaded,
                                mega_err *err);

/* Whether --save wants a checkpoint after `iteration` completed ones. */
bool mega_rank_ckpt_due(const mega_jobspec *job, int64_t iteration);

/* Writes the checkpoint of `iteration` when this rank is the writer
 * (*wrote tells); bytes gets the size written. */
mega_status mega_rank_ckpt_save(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, int64_t iteration, bool writer, bool *wrote,
                                uint64_t *bytes, mega_err *err);

#endif
