#include "worker/rank_ckpt.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

mega_status mega_rank_ckpt_check(const mega_jobspec *job, mega_err *err) {
  if (job->save && job->pipeline_model_parallel_size > 1)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "--save with --pipeline-model-parallel-size %d: saving a pipelined model "
                     "needs one committer for the stages' shards, which mega does not have "
                     "yet; save from a run with --pipeline-model-parallel-size 1 (its "
                     "checkpoints load into any pipeline layout)",
                     job->pipeline_model_parallel_size);
  return MEGA_OK;
}

mega_status mega_rank_ckpt_load(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, int64_t *iteration, const char **loaded,
                                mega_err *err) {
  static char loaded_path[4096];
  *iteration = 0;
  if (loaded) *loaded = NULL;
  char *path = NULL;
  mega_status st = mega_ckpt_resolve(job->load, &path, err);
  if (st == MEGA_ERR_NOT_FOUND) {
    mega_err_clear(err);
    return MEGA_OK;
  }
  if (st != MEGA_OK) return st;
  mega_ckpt_state s;
  st = mega_ckpt_load(path, be, &c->cfg, job, c->ckpt, c->nparams, &s, err);
  if (st == MEGA_OK && (s.consumed_samples != s.iteration * (int64_t)job->global_batch_size ||
                        s.optimizer_steps != s.iteration))
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "inconsistent state (iteration %lld, consumed samples %lld, optimizer steps "
                   "%lld)", (long long)s.iteration, (long long)s.consumed_samples,
                   (long long)s.optimizer_steps);
  if (st == MEGA_OK) {
    mega_optim_set_steps(o, s.optimizer_steps);
    *iteration = s.iteration;
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    if (loaded) *loaded = loaded_path;
  } else {
    mega_err_prefix(err, "--load %s", job->load);
  }
  free(path);
  return st;
}

bool mega_rank_ckpt_due(const mega_jobspec *job, int64_t iteration) {
  if (!job->save) return false;
  if (iteration == job->train_iters) return true;
  return job->save_interval > 0 && iteration % job->save_interval == 0;
}

static uint64_t dir_bytes(const char *dir) {
  uint64_t total = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));) {
    char p[4352];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (e->d_name[0] != '.' && !stat(p, &st) && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
  }
  closedir(d);
  return total;
}

mega_status mega_rank_ckpt_save(mega_backend *be, const mega_jobspec *job, mega_chunks *c,
                                mega_optim *o, int64_t iteration, bool writer, bool *wrote,
                                uint64_t *bytes, mega_err *err) {
  *wrote = false;
  *bytes = 0;
  if (!writer) return MEGA_OK;
  mega_status st = be->ops->synchronize(be, err);
  if (st != MEGA_OK) return st;
  mega_ckpt_state s = {.iteration = iteration,
                       .consumed_samples = iteration * (int64_t)job->global_batch_size,
                       .optimizer_steps = mega_optim_steps(o)};
  st = mega_ckpt_save(job->save, be, &c->cfg, job, &s, c->ckpt, c->nparams, NULL, err);
  if (st != MEGA_OK) return st;
  *wrote = true;
  char path[4096];
  if (mega_ckpt_iter_path(path, sizeof path, job->save, iteration)) *bytes = dir_bytes(path);
  return MEGA_OK;
}
