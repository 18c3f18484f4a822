/* A rank's loads: Megatron's load flags on the chunks and the optimizer
 * (rank_load.h), and --load into the rank, where a distributed optimizer's
 * moments are made whole for the load and resharded after it. */
#include "worker/rank/rank_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/rank/rank_internal.h"

mega_status mega_rank_ckpt_check(const mega_jobspec *job, mega_err *err) {
  /* A distributed optimizer's moments are gathered into whole tensors on
   * save (rank_save.c) and resharded on load (rank_load_checkpoint), so
   * every flag is honoured. */
  (void)job;
  (void)err;
  return MEGA_OK;
}

static mega_status check_resume(const char *path, const mega_jobspec *job,
                                const mega_ckpt_state *s, mega_err *err) {
  if (s->consumed_samples != mega_jobspec_samples_before(job, s->iteration) ||
      s->optimizer_steps > s->iteration)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: inconsistent state (iteration %lld, consumed samples %lld, optimizer "
                     "steps %lld)", path, (long long)s->iteration,
                     (long long)s->consumed_samples, (long long)s->optimizer_steps);
  return MEGA_OK;
}

/* Megatron's scheduler flags: check (the default), override or use the
 * checkpoint's values. */
static mega_status apply_sched(const char *path, const mega_jobspec *job,
                               const mega_ckpt_state *s, mega_lr_sched *lr, mega_err *err) {
  if (job->override_opt_param_scheduler) return MEGA_OK;
  if (!s->has_sched)
    return mega_fail(err, MEGA_ERR_INVALID, "%s records no LR schedule to check or use", path);
  if (!job->use_checkpoint_opt_param_scheduler)
    return mega_ckpt_check_sched(path, &s->sched, lr, job, err);
  *lr = s->sched;
  mega_status st = mega_lr_sched_check(lr, err);
  if (st != MEGA_OK) mega_err_prefix(err, "%s's LR schedule", path);
  return st;
}

/* Evaluation batches the checkpointed run took: evaluation goes on with
 * the next windows, as Megatron's consumed_valid_samples does. A checkpoint
 * that predates the record gets Megatron's own fallback for one without
 * it: every --eval-interval iterations, --eval-iters batches. */
static int64_t eval_done(const mega_jobspec *job, const mega_ckpt_state *s) {
  if (s->consumed_valid_samples >= 0) return s->consumed_valid_samples / job->global_batch_size;
  if (!mega_jobspec_evaluates(job)) return 0;
  return s->iteration / job->eval_interval * job->eval_iters;
}

mega_status mega_rank_ckpt_load(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, mega_lr_sched *lr, mega_rank_ckpt_loaded *out,
                                mega_err *err) {
  memset(out, 0, sizeof *out);
  char *path = NULL, *notice = NULL;
  /* --finetune and --no-load-optim leave Adam's state as created (zero),
   * so they load a checkpoint whose optimizer files are gone */
  bool fresh_optim = job->finetune || job->no_load_optim;
  mega_status st = fresh_optim ? mega_ckpt_resolve_weights(job->load, &path, &notice, err)
                               : mega_ckpt_resolve(job->load, &path, &notice, err);
  if (st == MEGA_ERR_NOT_FOUND && job->finetune) /* weights only: nothing to start from */
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--finetune starts from a checkpoint's weights, but --load %s holds no "
                     "checkpoint", job->load);
  /* Under megad a restart from a committed checkpoint sets the flag: a
   * --load gone (moved, or not mounted on this node) must not quietly
   * become a run from iteration 1 that the job calls a resume. An older
   * complete checkpoint there still loads (resolve falls back, and says). */
  if (st == MEGA_ERR_NOT_FOUND && job->exit_on_missing_checkpoint)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--load %s holds no checkpoint (no %s there, or no such directory), and "
                     "--exit-on-missing-checkpoint forbids starting from fresh weights; put "
                     "the checkpoint back where this node sees it, then resume", job->load,
                     MEGA_CKPT_LATEST_FILE);
  if (st == MEGA_ERR_NOT_FOUND) {
    mega_err_clear(err);
    return MEGA_OK;
  }
  if (st != MEGA_OK) return st;
  mega_ckpt_param *params = c->ckpt;
  if (fresh_optim) {
    params = malloc((c->nparams + 1) * sizeof *params);
    if (!params) st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory loading %s", path);
    for (size_t i = 0; params && i < c->nparams; i++) {
      params[i] = c->ckpt[i];
      params[i].exp_avg = params[i].exp_avg_sq = NULL;
    }
  }
  mega_ckpt_state s = {0};
  /* --finetune: a new run on old weights, so only the model must match. */
  if (st == MEGA_OK)
    st = mega_ckpt_load(path, be, &c->cfg, job->finetune ? NULL : job, params, c->nparams, &s,
                        err);
  if (st == MEGA_OK && !job->finetune) st = check_resume(path, job, &s, err);
  /* Megatron loads the scheduler with the optimizer. */
  if (st == MEGA_OK && !fresh_optim) st = apply_sched(path, job, &s, lr, err);
  if (st == MEGA_OK) {
    mega_optim_set_steps(o, fresh_optim ? 0 : s.optimizer_steps);
    out->loaded = true;
    out->iteration = job->finetune ? 0 : s.iteration;
    out->eval_done = job->finetune ? 0 : eval_done(job, &s);
    snprintf(out->path, sizeof out->path, "%s", path);
    if (notice) snprintf(out->notice, sizeof out->notice, "%s", notice);
  } else if (!strstr(err ? err->msg : "", job->load)) {
    mega_err_prefix(err, "--load %s", job->load);
  }
  if (params != c->ckpt) free(params);
  free(path);
  free(notice);
  return st;
}

/* --load: whole tensors by name, at any data-parallel size; a distributed
 * optimizer keeps its shards of the whole moments. */
mega_status rank_load_checkpoint(mega_rank *r, mega_err *err) {
  const mega_jobspec *j = r->job;
  if (!j->use_distributed_optimizer)
    return mega_rank_ckpt_load(r->be, j, &r->chunks, r->optim, &r->lr, &r->loaded, err);
  rank_whole_moments w;
  mega_status st = rank_whole_moments_alloc(r, &w, err);
  if (st != MEGA_OK) return st;
  mega_chunks_point_moments(&r->chunks, w.avg, w.sq);
  st = mega_rank_ckpt_load(r->be, j, &r->chunks, r->optim, &r->lr, &r->loaded, err);
  if (st == MEGA_OK && r->loaded.loaded && !j->finetune && !j->no_load_optim)
    st = mega_grads_scatter_moments(r->chunks.grads, r->optim, w.avg, w.sq, err);
  if (st == MEGA_OK && r->loaded.loaded && r->copy) {
    mega_optim_set_steps(r->copy, mega_optim_steps(r->optim));
    if (!j->finetune && !j->no_load_optim)
      st = mega_grads_scatter_copy_moments(r->chunks.grads, r->copy, w.avg, w.sq, err);
  }
  mega_chunks_point_moments(&r->chunks, NULL, NULL);
  rank_whole_moments_free(&w);
  return st;
}

