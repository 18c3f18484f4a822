/* Saving a parallel rank's checkpoints, on top of
 * worker/ckpt/ckpt_writer.h: when --save wants one, and the saver.
 * Loading is in rank_load.h; the save point every rank reaches together,
 * mega_rank_save, in rank_save.c.
 *
 * Data-parallel replicas hold equal weights, so the dp 0, tp 0 rank of each
 * pipeline stage writes (a writer) and global rank 0 commits. A
 * mega_rank_saver runs one writer's saves: the copy to host memory blocks
 * the caller; the write runs inline, or with --async-save on the saver's
 * thread while training goes on. A save waits for the one before it.
 *
 * Ownership: the saver borrows everything its config points to. */
#ifndef MEGA_WORKER_RANK_SAVER_H
#define MEGA_WORKER_RANK_SAVER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "worker/ckpt/ckpt_writer.h"
#include "worker/rank/rank.h"

/* Whether --save wants a checkpoint after `iteration` completed ones. */
bool mega_rank_ckpt_due(const mega_jobspec *job, int64_t iteration);

/* ---- the saver: one writer's saves ---- */

typedef struct mega_rank_saver_config {
  mega_ckpt_writer_config writer; /* its callbacks are the saver's own; leave them unset */
  bool async;                     /* --async-save */
  int rank;                       /* global rank, for messages */
  /* From mega_rank_env: the reports and the commit go-ahead. */
  void (*on_checkpoint)(void *arg, const mega_rank_ckpt_report *r);
  mega_status (*await_commit)(void *arg, int64_t iteration, mega_err *err);
  void *arg;
} mega_rank_saver_config;

typedef struct mega_rank_saver mega_rank_saver;

/* params: this writer's tensors (a loss stage's tied copy of wte left out). */
mega_status mega_rank_saver_create(const mega_rank_saver_config *cfg,
                                   const mega_ckpt_param *params, size_t n,
                                   mega_rank_saver **out, mega_err *err);

/* A save in two calls, so that the caller may align the ranks in between
 * (mega_rank_save in rank_save.c does, with barriers, while no write is
 * running):
 *
 *   stage: waits for the previous save (its failure is returned here) and
 *          copies the tensors of state->iteration to host memory; t0 is
 *          when the caller started blocking (mega_rank_saver_now).
 *   write: writes them, inline, or with async on the saver's thread (then
 *          returns at once; wait gives the result). */
mega_status mega_rank_saver_stage(mega_rank_saver *s, mega_backend *be,
                                  const mega_ckpt_state *state, double t0, mega_err *err);
mega_status mega_rank_saver_write(mega_rank_saver *s, mega_err *err);

/* Waits for the save in flight, if any; returns its status. */
mega_status mega_rank_saver_wait(mega_rank_saver *s, mega_err *err);

/* Waits, then frees. NULL is fine. */
void mega_rank_saver_destroy(mega_rank_saver *s);

double mega_rank_saver_now(void);

#endif
