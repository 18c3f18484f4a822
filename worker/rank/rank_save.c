/* A rank's saves: the save point every rank reaches together and the
 * writer's saver (rank_saver.h) set up; a distributed optimizer's moments
 * are made whole for a save (and, in rank_load.c, a load), as checkpoints
 * hold whole tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/rank/rank_internal.h"

void rank_whole_moments_free(rank_whole_moments *w) {
  for (int v = 0; v < w->vp; v++) {
    if (w->avg) free(w->avg[v]);
    if (w->sq) free(w->sq[v]);
  }
  free(w->avg);
  free(w->sq);
  *w = (rank_whole_moments){0};
}

mega_status rank_whole_moments_alloc(mega_rank *r, rank_whole_moments *w, mega_err *err) {
  int vp = r->chunks.vp;
  *w = (rank_whole_moments){.vp = vp, .avg = calloc((size_t)vp, sizeof(float *)),
                            .sq = calloc((size_t)vp, sizeof(float *))};
  bool ok = w->avg && w->sq;
  for (int v = 0; ok && v < vp; v++) {
    size_t n = mega_gpt_num_params(r->chunks.stages[v]);
    ok = (w->avg[v] = calloc(n, sizeof(float))) && (w->sq[v] = calloc(n, sizeof(float)));
  }
  if (ok) return MEGA_OK;
  rank_whole_moments_free(w);
  return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the optimizer's whole moments");
}

/* The tensors a stage saves, into out: the chunks' views, a loss stage's
 * tied copy of wte left out. */
static size_t fill_views(mega_rank *r, mega_ckpt_param *out) {
  size_t n = 0;
  for (size_t k = 0; k < r->chunks.nparams; k++)
    if (!r->chunks.tied_copy[k]) out[n++] = r->chunks.ckpt[k];
  return n;
}

/* Distributed optimizer: points views (out) at whole moments, which a save
 * reads only while it stages. */
static size_t point_moments(mega_rank *r, const rank_whole_moments *w, mega_ckpt_param *out) {
  if (w) mega_chunks_point_moments(&r->chunks, w->avg, w->sq);
  size_t n = fill_views(r, out);
  if (w) mega_chunks_point_moments(&r->chunks, NULL, NULL);
  return n;
}

/* Tensor parallelism: the ranks of dp 0 hand their slices to the writer,
 * which saves whole tensors (r->tp.whole). */
static bool tp_gathers(const mega_rank *r) {
  return r->topo.tp > 1 && r->me.dp == 0 && r->job->save;
}

mega_status mega_rank_save(mega_rank *r, mega_err *err) {
  if (!r->job->save) return mega_fail(err, MEGA_ERR_INVALID, "no --save directory given");
  rank_phase(r, "checkpoint");
  double t0 = mega_rank_saver_now();
  bool async = r->job->async_save;
  /* --overlap-param-gather may leave gathers in flight */
  mega_status st = mega_grads_wait_params(r->chunks.grads, -1, err);
  rank_whole_moments w = {0};
  if (st == MEGA_OK && r->job->use_distributed_optimizer) {
    /* every data-parallel rank takes part in the gather of the moments; the
     * writer stages whole tensors from them */
    st = rank_whole_moments_alloc(r, &w, err);
    if (st == MEGA_OK) st = mega_grads_gather_moments(r->chunks.grads, r->optim, w.avg, w.sq, err);
    if (st == MEGA_OK && r->saver && !tp_gathers(r)) point_moments(r, &w, r->save_params);
  }
  if (st == MEGA_OK && tp_gathers(r)) {
    size_t n = point_moments(r, r->job->use_distributed_optimizer ? &w : NULL, r->tp.local);
    st = rank_tp_gather(r, r->tp.local, n, err);
  }
  if (st != MEGA_OK) {
    /* nothing staged */
  } else if (!r->saver) { /* a replica: nothing of its own to write */
    char path[4096];
    mega_ckpt_iter_path(path, sizeof path, r->job->save, r->iteration);
    mega_rank_ckpt_report rep = {.iteration = r->iteration, .path = path};
    if (r->env.on_checkpoint) r->env.on_checkpoint(r->env.arg, &rep);
  } else {
    mega_ckpt_state s = {.iteration = r->iteration,
                         .consumed_samples = mega_jobspec_samples_before(r->job, r->iteration),
                         .optimizer_steps = mega_optim_steps(r->optim),
                         .consumed_valid_samples = r->eval_done * r->job->global_batch_size,
                         .attempt = r->env.attempt, .has_sched = true, .sched = r->lr};
    st = mega_rank_saver_stage(r->saver, r->be, &s, t0, err);
    if (st == MEGA_OK && !async) st = mega_rank_saver_write(r->saver, err);
  }
  rank_whole_moments_free(&w); /* staged: the writer has its host copies */
  /* Every rank leaves the save point together: the writers meet (with
   * --async-save before the write starts, so the training thread never
   * shares GROUP_CKPT with the checkpoint thread; without it once the
   * committer has committed), then the replicas meet their writer. The
   * wait for a save, or for the one before it, may outlast the
   * communicators' timeout that the next step's collectives would use, so
   * it happens here, under the writers' long bound. */
  if (st == MEGA_OK && r->hcomm[GROUP_CKPT])
    st = mega_comm_barrier(r->hcomm[GROUP_CKPT], MEGA_CKPT_WRITERS_TIMEOUT_MS, err);
  if (st == MEGA_OK && r->hcomm[GROUP_DP])
    st = mega_comm_barrier(r->hcomm[GROUP_DP], MEGA_CKPT_WRITERS_TIMEOUT_MS, err);
  if (st == MEGA_OK && r->saver && async) st = mega_rank_saver_write(r->saver, err);
  if (st != MEGA_OK) mega_err_prefix(err, "rank %d", r->env.rank);
  return st;
}

mega_status mega_rank_save_wait(mega_rank *r, mega_err *err) {
  if (!r->saver) return MEGA_OK;
  mega_status st = mega_rank_saver_wait(r->saver, err);
  if (st != MEGA_OK) mega_err_prefix(err, "rank %d", r->env.rank);
  return st;
}

/* The writer's tensors and its saver (after the optimizer and the groups). */
mega_status rank_build_saver(mega_rank *r, mega_err *err) {
  if (tp_gathers(r) && !(r->tp.local = calloc(r->chunks.nparams + 1, sizeof *r->tp.local)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the TP slices");
  if (!r->job->save || !rank_is_writer(r)) return MEGA_OK;
  r->save_params = calloc(r->chunks.nparams + 1, sizeof *r->save_params);
  if (!r->save_params) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the saver");
  /* A distributed optimizer's tensors have state too: the saver sees that
   * from their moments, which every save points at whole ones. */
  rank_whole_moments w = {0};
  mega_status st = MEGA_OK;
  if (r->job->use_distributed_optimizer) st = rank_whole_moments_alloc(r, &w, err);
  size_t n = point_moments(r, r->job->use_distributed_optimizer ? &w : NULL, r->save_params);
  /* with TP the writer saves whole copies, which every save gathers */
  if (st == MEGA_OK && tp_gathers(r)) {
    st = rank_tp_whole_build(r, r->save_params, n, err);
    if (st == MEGA_OK) memcpy(r->save_params, r->tp.whole, n * sizeof *r->save_params);
  }
  mega_rank_saver_config sc = {
      .writer = {.save_dir = r->job->save, .cfg = &r->chunks.cfg, .job = r->job,
                 .comm = r->hcomm[GROUP_CKPT], .attempt = r->env.attempt},
      .async = r->job->async_save, .rank = r->env.rank,
      .on_checkpoint = r->env.on_checkpoint, .await_commit = r->env.await_commit,
      .arg = r->env.arg};
  if (st == MEGA_OK) st = mega_rank_saver_create(&sc, r->save_params, n, &r->saver, err);
  rank_whole_moments_free(&w);
  return st;
}
