#include "worker/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/checkpoint.h"
#include "worker/data.h"
#include "worker/lr_sched.h"
#include "worker/model/gpt.h"
#include "worker/optim.h"

struct mega_trainer {
  mega_jobspec job;
  mega_backend *be;
  mega_trainer_opts opts;
  mega_data *data;
  mega_batch_plan plan;
  mega_lr_sched sched;
  mega_gpt_config cfg;
  mega_gpt_stage *stage;
  mega_gpt_acts *acts;
  mega_optim *optim;
  mega_ckpt_param *ckpt; /* one per param, names borrowed from the stage */
  size_t nckpt;
  int32_t *tokens, *targets; /* host, micro_batch * T */
  int64_t iteration;         /* completed */
  char *loaded_path;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static mega_status build_model(mega_trainer *t, mega_err *err) {
  const mega_jobspec *j = &t->job;
  mega_gpt_config_default(&t->cfg);
  t->cfg.vocab_size = MEGA_VOCAB_SIZE;
  t->cfg.max_seq_len = mega_jobspec_max_position_embeddings(j);
  t->cfg.num_layers = j->num_layers;
  t->cfg.num_heads = j->num_attention_heads;
  t->cfg.channels = j->hidden_size;
  t->cfg.init_std = (float)j->init_method_std;
  t->cfg.ln_eps = 1e-5f;
  t->cfg.seed = (uint64_t)j->seed;
  mega_status st = mega_gpt_config_check(&t->cfg, err);
  if (st != MEGA_OK) return st;
  mega_gpt_stage_desc desc = {.embedding = true, .loss = true, .first_layer = 0,
                              .num_layers = j->num_layers};
  st = mega_gpt_stage_create(t->be, &t->cfg, &desc, &t->stage, err);
  if (st != MEGA_OK) return st;
  return mega_gpt_acts_create(t->stage, j->micro_batch_size, j->seq_length, &t->acts, err);
}

static mega_status build_optim(mega_trainer *t, mega_err *err) {
  int count = 0;
  const mega_param_info *info = mega_gpt_params(t->stage, &count);
  float *p = mega_gpt_param_data(t->stage), *g = mega_gpt_grad_data(t->stage);
  mega_optim_range *ranges = calloc((size_t)count + 1, sizeof *ranges);
  t->ckpt = calloc((size_t)count + 1, sizeof *t->ckpt);
  if (!ranges || !t->ckpt) {
    free(ranges);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building the optimizer");
  }
  for (int i = 0; i < count; i++)
    ranges[i] = (mega_optim_range){.params = p + info[i].offset, .grads = g + info[i].offset,
                                   .numel = info[i].numel, .decay = info[i].decay};
  mega_optim_hparams hp = {.beta1 = t->job.adam_beta1, .beta2 = t->job.adam_beta2,
                           .eps = t->job.adam_eps, .weight_decay = t->job.weight_decay,
                           .clip_grad = t->job.clip_grad};
  mega_status st = mega_optim_create(t->be, ranges, (size_t)count, &hp, &t->optim, err);
  free(ranges);
  if (st != MEGA_OK) return st;
  t->nckpt = (size_t)count;
  for (int i = 0; i < count; i++) {
    mega_ckpt_param *c = &t->ckpt[i];
    c->name = info[i].name;
    c->ndim = info[i].ndim;
    for (int d = 0; d < info[i].ndim; d++) c->shape[d] = info[i].shape[d];
    c->numel = info[i].numel;
    c->param = p + info[i].offset;
    c->exp_avg = mega_optim_exp_avg(t->optim, (size_t)i);
    c->exp_avg_sq = mega_optim_exp_avg_sq(t->optim, (size_t)i);
  }
  return MEGA_OK;
}

static mega_status resume(mega_trainer *t, bool *resumed, mega_err *err) {
  char *path = NULL;
  mega_status st = mega_ckpt_resolve(t->job.load, &path, err);
  if (st == MEGA_ERR_NOT_FOUND) {
    mega_err_clear(err);
    return MEGA_OK;
  }
  if (st != MEGA_OK) return st;
  mega_ckpt_state s;
  st = mega_ckpt_load(path, t->be, &t->cfg, &t->job, t->ckpt, t->nckpt, &s, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "--load %s", t->job.load);
    free(path);
    return st;
  }
  if (s.consumed_samples != s.iteration * (int64_t)t->job.global_batch_size ||
      s.optimizer_steps != s.iteration) {
    mega_fail(err, MEGA_ERR_INVALID,
              "--load %s: inconsistent state (iteration %lld, consumed samples %lld, optimizer "
              "steps %lld)", path, (long long)s.iteration, (long long)s.consumed_samples,
              (long long)s.optimizer_steps);
    free(path);
    return MEGA_ERR_INVALID;
  }
  mega_optim_set_steps(t->optim, s.optimizer_steps);
  t->iteration = s.iteration;
  t->loaded_path = path;
  if (resumed) *resumed = true;
  return MEGA_OK;
}

mega_status mega_trainer_create(const mega_jobspec *job, mega_backend *be,
                                const mega_trainer_opts *opts, mega_trainer **out,
                                bool *resumed, mega_err *err) {
  *out = NULL;
  if (resumed) *resumed = false;
  mega_trainer *t = calloc(1, sizeof *t);
  if (!t) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating the trainer");
  mega_jobspec_defaults(&t->job);
  t->be = be;
  if (opts) t->opts = *opts;
  mega_status st = mega_jobspec_copy(&t->job, job, err);
  if (st == MEGA_OK)
    st = mega_batch_plan_init(&t->plan, job->global_batch_size, job->micro_batch_size, 1, err);
  if (st == MEGA_OK) {
    t->sched = mega_lr_sched_from_job(job);
    st = mega_lr_sched_check(&t->sched, err);
  }
  if (st == MEGA_OK) st = mega_data_open(job->data_path, job->seq_length, &t->data, err);
  if (st == MEGA_OK) st = build_model(t, err);
  if (st == MEGA_OK) st = build_optim(t, err);
  if (st == MEGA_OK) {
    size_t n = (size_t)job->micro_batch_size * (size_t)job->seq_length;
    t->tokens = malloc(n * sizeof *t->tokens);
    t->targets = malloc(n * sizeof *t->targets);
    if (!t->tokens || !t->targets)
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the token buffers");
  }
  if (st == MEGA_OK && job->save) st = mega_ckpt_clean_temps(job->save, NULL, err);
  if (st == MEGA_OK && job->load) st = resume(t, resumed, err);
  if (st != MEGA_OK) {
    mega_trainer_destroy(t);
    return st;
  }
  *out = t;
  return MEGA_OK;
}

void mega_trainer_destroy(mega_trainer *t) {
  if (!t) return;
  mega_gpt_acts_destroy(t->acts);
  mega_optim_destroy(t->optim);
  mega_gpt_stage_destroy(t->stage);
  mega_data_close(t->data);
  free(t->ckpt);
  free(t->tokens);
  free(t->targets);
  free(t->loaded_path);
  mega_jobspec_free(&t->job);
  free(t);
}

int64_t mega_trainer_iteration(const mega_trainer *t) { return t->iteration; }
size_t mega_trainer_num_params(const mega_trainer *t) { return mega_gpt_num_params(t->stage); }
const char *mega_trainer_loaded_path(const mega_trainer *t) { return t->loaded_path; }

mega_status mega_trainer_step(mega_trainer *t, mega_step_report *rep, mega_err *err) {
  double t0 = now_s();
  const int G = t->job.global_batch_size, T = t->job.seq_length;
  const double tokens = (double)G * (double)T;
  mega_gpt_zero_grad(t->stage);
  double loss_sum = 0.0;
  for (int m = 0; m < t->plan.num_micro; m++) {
    mega_status st = mega_data_microbatch(t->data, &t->plan, t->iteration, 0, m, t->tokens,
                                          t->targets, err);
    double mb_loss = 0.0;
    if (st == MEGA_OK)
      st = mega_gpt_forward(t->stage, t->acts, t->tokens, NULL, t->targets, NULL, &mb_loss, err);
    if (st == MEGA_OK)
      st = mega_gpt_backward_input(t->stage, t->acts, NULL, (float)(1.0 / tokens), NULL, err);
    if (st == MEGA_OK) st = mega_gpt_backward_weight(t->stage, t->acts, err);
    if (st != MEGA_OK) {
      mega_err_prefix(err, "iteration %lld, microbatch %d", (long long)t->iteration + 1, m);
      return st;
    }
    loss_sum += mb_loss;
  }
  double sumsq;
  mega_status st = mega_optim_grad_sumsq(t->optim, &sumsq, err);
  double lr = mega_lr_at(&t->sched, t->iteration);
  mega_optim_result res;
  if (st == MEGA_OK) st = mega_optim_step(t->optim, sumsq, lr, &res, err);
  if (st == MEGA_OK) st = t->be->ops->synchronize(t->be, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "iteration %lld", (long long)t->iteration + 1);
    return st;
  }
  t->iteration++;
  double dt = now_s() - t0;
  if (rep) {
    rep->iteration = t->iteration;
    rep->loss = loss_sum / tokens;
    rep->grad_norm = res.grad_norm;
    rep->clip_coef = res.clip_coef;
    rep->lr = lr;
    rep->step_time_s = dt;
    rep->tokens_per_s = dt > 0 ? tokens / dt : 0.0;
  }
  return MEGA_OK;
}

bool mega_trainer_save_due(const mega_trainer *t) {
  if (!t->job.save) return false;
  if (t->iteration == t->job.train_iters) return true;
  return t->job.save_interval > 0 && t->iteration % t->job.save_interval == 0;
}

mega_status mega_trainer_save(mega_trainer *t, mega_err *err) {
  if (!t->job.save) return mega_fail(err, MEGA_ERR_INVALID, "no --save directory given");
  mega_ckpt_state s = {.iteration = t->iteration,
                       .consumed_samples = t->iteration * (int64_t)t->job.global_batch_size,
                       .optimizer_steps = mega_optim_steps(t->optim)};
  mega_ckpt_save_opts o = {.max_shard_bytes = t->opts.max_shard_bytes};
  mega_status st = t->be->ops->synchronize(t->be, err);
  if (st != MEGA_OK) return st;
  return mega_ckpt_save(t->job.save, t->be, &t->cfg, &t->job, &s, t->ckpt, t->nckpt, &o, err);
}

mega_status mega_trainer_param_sumsq(const mega_trainer *t, double *out, mega_err *err) {
  return t->be->ops->sum_squares(t->be, mega_gpt_param_data(t->stage),
                                 mega_gpt_num_params(t->stage), out, err);
}
