/* Saving and loading a checkpoint: model and optimizer tensors, config.json
 * and trainer_state.json. Writing is ckpt_writer.c's, the two JSON files
 * ckpt_json.c's, the directory protocol ckpt_dir.c's, the sharding
 * ckpt_shard.c's, completeness ckpt_manifest.c's and ckpt_resolve.c's. */
#include "worker/ckpt/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/version.h"
#include "worker/ckpt/ckpt_internal.h"
#include "worker/ckpt/ckpt_writer.h"

static const char *const moment_suffix[2] = {".exp_avg", ".exp_avg_sq"};

mega_status mega_ckpt_save(const char *save_dir, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_state *state,
                           const mega_ckpt_param *params, size_t n,
                           const mega_ckpt_save_opts *opts, mega_err *err) {
  mega_ckpt_writer_config wc = {.save_dir = save_dir, .cfg = cfg, .job = job,
                                .attempt = state->attempt,
                                .max_shard_bytes = opts ? opts->max_shard_bytes : 0};
  mega_ckpt_writer *w = NULL;
  mega_ckpt_write_result res;
  mega_status st = mega_ckpt_writer_create(&wc, params, n, &w, err);
  if (st == MEGA_OK) st = mega_ckpt_writer_stage(w, be, state, err);
  if (st == MEGA_OK) st = mega_ckpt_writer_write(w, &res, err);
  mega_ckpt_writer_destroy(w);
  return st;
}

/* ---- loading ---- */

static json_t *load_json(const char *dir, const char *name, mega_err *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  json_error_t jerr;
  json_t *j;
  mega_err why = {0};
  if (mega_ckpt_load_json(path, &j, &jerr, &why) != MEGA_OK) {
    if (why.status == MEGA_ERR_INVALID) { /* a link or not a plain file */
      if (err) *err = why;
    } else {
      mega_fail(err, MEGA_ERR_INVALID, "checkpoint %s has no %s", dir, name);
    }
    return NULL;
  }
  if (!j) {
    mega_fail(err, MEGA_ERR_INVALID, "%s is not valid JSON (line %d: %s)", path, jerr.line,
              jerr.text);
    return NULL;
  }
  if (!json_is_object(j)) {
    json_decref(j);
    mega_fail(err, MEGA_ERR_INVALID, "%s is not a JSON object", path);
    return NULL;
  }
  return j;
}

/* The flags a resumed job must share with the saved one: the model and the
 * data order. The LR schedule has its own check (mega_ckpt_check_sched). */
/* A key of the saved job that names no flag of this build's, or NULL. */
static const char *unknown_flag(const json_t *saved) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)saved, key, v) {
    bool known = false;
    for (int i = 0; i < mega_jobspec_flag_count() && !known; i++)
      known = !strcmp(mega_jobspec_flag(i)->key, key);
    if (!known) return key;
  }
  return NULL;
}

static mega_status check_job(const char *dir, const json_t *saved_json, const char *by,
                             const mega_jobspec *job, mega_err *err) {
  /* another build's flag: it may shape the model or the data, so no guess */
  const char *unknown = unknown_flag(saved_json);
  if (unknown)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s was written by %s with a job flag this megaw (mega %s) does "
                     "not know (\"%s\" in its %s); load it with a build of mega that knows it",
                     dir, by, mega_version(), unknown, MEGA_CKPT_STATE_FILE);
  mega_jobspec saved;
  mega_jobspec_defaults(&saved);
  mega_err jerr = {0};
  if (mega_jobspec_from_json(&saved, saved_json, &jerr) != MEGA_OK) {
    mega_jobspec_free(&saved);
    return mega_fail(err, MEGA_ERR_INVALID, "%s/%s: bad job record: %s", dir,
                     MEGA_CKPT_STATE_FILE, jerr.msg);
  }
  struct {
    const char *flag;
    double a, b;
  } f[] = {
      {"--num-layers", saved.num_layers, job->num_layers},
      {"--hidden-size", saved.hidden_size, job->hidden_size},
      {"--num-attention-heads", saved.num_attention_heads, job->num_attention_heads},
      {"--position-embedding-type", saved.position_embedding_type,
       job->position_embedding_type},
      {"--normalization", saved.normalization, job->normalization},
      {"--swiglu", saved.swiglu, job->swiglu},
      {"--ffn-hidden-size", mega_jobspec_ffn_hidden_size(&saved),
       mega_jobspec_ffn_hidden_size(job)},
      {"--num-query-groups", mega_jobspec_query_groups(&saved), mega_jobspec_query_groups(job)},
      {"--kv-channels", mega_jobspec_kv_channels(&saved), mega_jobspec_kv_channels(job)},
      {"--untie-embeddings-and-output-weights", saved.untie_embeddings_and_output_weights,
       job->untie_embeddings_and_output_weights},
      {"--disable-bias-linear", saved.disable_bias_linear, job->disable_bias_linear},
      {"--rotary-base", saved.rotary_base, job->rotary_base},
      {"--rotary-percent", saved.rotary_percent, job->rotary_percent},
      {"--norm-epsilon", saved.norm_epsilon, job->norm_epsilon},
      {"--seq-length", saved.seq_length, job->seq_length},
      {"--max-position-embeddings", mega_jobspec_max_position_embeddings(&saved),
       mega_jobspec_max_position_embeddings(job)},
      {"--global-batch-size", saved.global_batch_size, job->global_batch_size},
  };
  /* which samples come next: the order, and Megatron's shuffles' seed */
  static const char *const orders[] = {"file", "megatron"};
  int saved_order = saved.data_order, saved_seed = saved.seed;
  bool megatron = job->data_order == MEGA_DATA_ORDER_MEGATRON;
  /* the ramp decides which samples each iteration takes */
  bool same_ramp = saved.rampup_batch_size.n == job->rampup_batch_size.n;
  for (int k = 0; same_ramp && k < saved.rampup_batch_size.n; k++)
    same_ramp = !strcmp(saved.rampup_batch_size.v[k], job->rampup_batch_size.v[k]);
  mega_jobspec_free(&saved);
  if (!same_ramp)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s was saved with another --rampup-batch-size than this job's; "
                     "resume with the same one (it decides which samples each iteration takes)",
                     dir);
  if (saved_order != job->data_order)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s was saved with --data-order %s, but this job has %s; resume "
                     "with the same order (it decides which samples come next)", dir,
                     orders[saved_order == MEGA_DATA_ORDER_MEGATRON],
                     orders[megatron]);
  if (megatron && saved_seed != job->seed)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s was saved with --seed %d, but this job has %d; with "
                     "--data-order megatron the seed shuffles the data, so resume with the same "
                     "one", dir, saved_seed, job->seed);
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].a != f[i].b)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "checkpoint %s was saved with %s %.10g, but this job has %.10g; resume "
                       "with the same value", dir, f[i].flag, f[i].a, f[i].b);
  return MEGA_OK;
}

static mega_status get_i64(const json_t *j, const char *key, const char *dir, int64_t *out,
                           mega_err *err) {
  json_t *v = json_object_get(j, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return mega_fail(err, MEGA_ERR_INVALID, "%s/%s lacks a non-negative integer %s", dir,
                     MEGA_CKPT_STATE_FILE, key);
  *out = json_integer_value(v);
  return MEGA_OK;
}

/* The LR schedule in samples. A checkpoint from before samples were
 * counted records iterations: those convert by the global batch it trained
 * with (consumed samples / iteration; there was no rampup then). */
static mega_status read_sched(const char *dir, const json_t *l, const mega_jobspec *job,
                              mega_ckpt_state *state, mega_err *err) {
  state->has_sched = false;
  if (!l) return MEGA_OK;
  json_t *lr = json_object_get(l, "lr"), *min = json_object_get(l, "min_lr");
  json_t *wu = json_object_get(l, "warmup_samples"), *dec = json_object_get(l, "decay_samples");
  json_t *wsd = json_object_get(l, "wsd_decay_samples"), *init = json_object_get(l, "warmup_init");
  double per = 1;
  if (!wu && !dec) { /* the iteration-counted form */
    wu = json_object_get(l, "warmup_iters"), dec = json_object_get(l, "decay_iters");
    per = state->iteration > 0 ? (double)state->consumed_samples / (double)state->iteration
          : job                ? job->global_batch_size
                               : 1;
  }
  const char *style = json_string_value(json_object_get(l, "decay_style"));
  const char *wstyle = json_string_value(json_object_get(l, "wsd_decay_style"));
  int k = -1, w = wstyle ? -1 : MEGA_WSD_EXPONENTIAL;
  for (int i = 0; style && i <= MEGA_LR_WSD; i++)
    if (!strcmp(style, mega_lr_style_name((mega_lr_style)i))) k = i;
  for (int i = 0; wstyle && i <= MEGA_WSD_MINUS_SQRT; i++)
    if (!strcmp(wstyle, mega_wsd_style_name((mega_wsd_style)i))) w = i;
  if (!json_is_number(lr) || !json_is_number(min) || !json_is_number(wu) ||
      !json_is_number(dec) || (wsd && !json_is_number(wsd)) || (init && !json_is_number(init)) ||
      k < 0 || w < 0)
    return mega_fail(err, MEGA_ERR_INVALID, "%s/%s has a bad lr_schedule", dir,
                     MEGA_CKPT_STATE_FILE);
  state->sched = (mega_lr_sched){.lr = json_number_value(lr), .min_lr = json_number_value(min),
                                 .init_lr = init ? json_number_value(init) : 0,
                                 .warmup = json_number_value(wu) * per,
                                 .decay = json_number_value(dec) * per,
                                 .wsd_decay = wsd ? json_number_value(wsd) : 0,
                                 .style = (mega_lr_style)k, .wsd_style = (mega_wsd_style)w};
  state->has_sched = true;
  return MEGA_OK;
}

mega_status mega_ckpt_check_sched(const char *path, const mega_lr_sched *saved,
                                  const mega_lr_sched *mine, const mega_jobspec *job,
                                  mega_err *err) {
  char a[64], b[64];
  const char *flag = NULL;
  /* the lengths in the job's own unit: iterations of its (unramped) global
   * batch, or samples */
  bool iters = job && job->train_samples <= 0 && job->global_batch_size > 0;
  double per = iters ? job->global_batch_size : 1;
  struct {
    const char *flag;
    double a, b, per;
  } nums[] = {
      {"--lr", saved->lr, mine->lr, 1},
      {"--min-lr", saved->min_lr, mine->min_lr, 1},
      {"--lr-warmup-init", saved->init_lr, mine->init_lr, 1},
      {iters ? "--lr-warmup-iters (or --lr-warmup-fraction of the decay)"
             : "--lr-warmup-samples (or --lr-warmup-fraction of the decay)",
       saved->warmup, mine->warmup, per},
      {iters ? "--lr-decay-iters" : "--lr-decay-samples", saved->decay, mine->decay, per},
      {iters ? "--lr-wsd-decay-iters" : "--lr-wsd-decay-samples", saved->wsd_decay,
       mine->wsd_decay, per},
  };
  const char *from = "";
  for (size_t i = 0; !flag && i < sizeof nums / sizeof nums[0]; i++)
    if (nums[i].a != nums[i].b) {
      flag = nums[i].flag;
      /* a decay length not given is the training length: say which */
      if (i == 4 && job && (iters ? job->lr_decay_iters <= 0 : job->lr_decay_samples <= 0))
        from = iters ? " (its --train-iters: --lr-decay-iters defaults to it)"
                     : " (its --train-samples: --lr-decay-samples defaults to it)";
      snprintf(a, sizeof a, "%.10g", nums[i].a / nums[i].per);
      snprintf(b, sizeof b, "%.10g", nums[i].b / nums[i].per);
    }
  if (!flag && saved->style != mine->style) {
    flag = "--lr-decay-style";
    snprintf(a, sizeof a, "%s", mega_lr_style_name(saved->style));
    snprintf(b, sizeof b, "%s", mega_lr_style_name(mine->style));
  } else if (!flag && saved->style == MEGA_LR_WSD && saved->wsd_style != mine->wsd_style) {
    flag = "--lr-wsd-decay-style";
    snprintf(a, sizeof a, "%s", mega_wsd_style_name(saved->wsd_style));
    snprintf(b, sizeof b, "%s", mega_wsd_style_name(mine->wsd_style));
  }
  if (!flag) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INVALID,
                   "checkpoint %s was saved with %s %s, but this job has %s%s; resume with the "
                   "same LR schedule, or add --override-opt_param-scheduler (use this job's) or "
                   "--use-checkpoint-opt_param-scheduler (use the checkpoint's)",
                   path, flag, a, b, from);
}

static mega_status read_state(const char *dir, const mega_jobspec *job, mega_ckpt_state *state,
                              bool *has_opt, mega_err *err) {
  json_t *j = load_json(dir, MEGA_CKPT_STATE_FILE, err);
  if (!j) return err ? err->status : MEGA_ERR_INVALID;
  mega_status st = MEGA_OK;
  const char *fmt = json_string_value(json_object_get(j, "format"));
  json_t *ver = json_object_get(j, "version");
  char by[160];
  mega_ckpt_written_by(j, by, sizeof by);
  if (!fmt || strcmp(fmt, MEGA_CKPT_STATE_FORMAT) != 0 || !json_is_integer(ver)) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s is not a %s state file", dir,
                   MEGA_CKPT_STATE_FILE, MEGA_CKPT_STATE_FORMAT);
    goto out;
  }
  if (json_integer_value(ver) != MEGA_CKPT_STATE_VERSION) {
    st = mega_fail(err, MEGA_ERR_UNSUPPORTED,
                   "%s/%s is version %lld (written by %s), and this megaw (mega %s) reads "
                   "version %d; load it with a build of mega that reads it", dir,
                   MEGA_CKPT_STATE_FILE, (long long)json_integer_value(ver), by, mega_version(),
                   MEGA_CKPT_STATE_VERSION);
    goto out;
  }
  if ((st = get_i64(j, "iteration", dir, &state->iteration, err)) != MEGA_OK ||
      (st = get_i64(j, "consumed_samples", dir, &state->consumed_samples, err)) != MEGA_OK ||
      (st = get_i64(j, "optimizer_steps", dir, &state->optimizer_steps, err)) != MEGA_OK)
    goto out;
  *has_opt = json_is_true(json_object_get(j, "has_optimizer_state"));
  json_t *valid = json_object_get(j, "consumed_valid_samples");
  state->consumed_valid_samples = json_is_integer(valid) ? json_integer_value(valid) : -1;
  json_t *att = json_object_get(j, "attempt");
  state->attempt = json_is_integer(att) ? (int)json_integer_value(att) : 0;
  if ((st = read_sched(dir, json_object_get(j, "lr_schedule"), job, state, err)) != MEGA_OK)
    goto out;
  if (job) {
    json_t *saved = json_object_get(j, "job");
    if (!json_is_object(saved)) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s lacks the job's flags", dir,
                     MEGA_CKPT_STATE_FILE);
      goto out;
    }
    st = check_job(dir, saved, by, job, err);
  }
out:
  json_decref(j);
  return st;
}

/* Reads the whole tensor into host (numel floats) and copies p's part of
 * it (a TP slice, cut into host + numel) to dst. */
static mega_status load_tensor(mega_backend *be, const mega_ckpt_shards *sh, const char *dir,
                               const char *what, const char *name, const mega_ckpt_param *p,
                               float *dst, float *host, mega_err *err) {
  const mega_st_file *f = mega_ckpt_shards_find(sh, name);
  if (!f)
    return mega_fail(err, MEGA_ERR_INVALID, "checkpoint %s is missing %s tensor '%s'", dir, what,
                     name);
  mega_status st = mega_st_read_f32(f, name, host, p->numel, p->shape, p->ndim, err);
  if (st != MEGA_OK) return st;
  const float *src = host;
  if (p->tp_size > 1) {
    mega_tp_cut(&p->tp, p->tp_size, p->tp_rank, host, host + p->numel);
    src = host + p->numel;
  }
  return be->ops->memcpy(be, dst, src, mega_ckpt_param_local(p) * sizeof(float),
                         MEGA_COPY_H2D, err);
}

mega_status mega_ckpt_load(const char *path, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_param *params, size_t n,
                           mega_ckpt_state *state, mega_err *err) {
  mega_ckpt_state s = {0};
  bool has_opt = false, want_opt = false;
  mega_status st = mega_ckpt_check_config(path, cfg, err);
  if (st == MEGA_OK) st = read_state(path, job, &s, &has_opt, err);
  if (st != MEGA_OK) return st;
  for (size_t i = 0; i < n; i++) want_opt |= params[i].exp_avg != NULL;
  if (want_opt && !has_opt)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s holds no optimizer state to resume training from", path);

  size_t maxn = 1;
  for (size_t i = 0; i < n; i++)
    if (params[i].numel > maxn) maxn = params[i].numel;
  float *host = malloc(2 * maxn * sizeof(float)); /* a whole tensor and its slice */
  if (!host) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory loading %s", path);

  mega_ckpt_shards model = {0}, opt = {0};
  st = mega_ckpt_open_shards(path, "model", &model, err);
  if (st == MEGA_OK && want_opt) st = mega_ckpt_open_shards(path, "optimizer", &opt, err);
  char name[256];
  for (size_t i = 0; i < n && st == MEGA_OK; i++) {
    st = load_tensor(be, &model, path, "model", params[i].name, &params[i], params[i].param,
                     host, err);
    if (st != MEGA_OK || !params[i].exp_avg) continue;
    float *dst[2] = {params[i].exp_avg, params[i].exp_avg_sq};
    for (int k = 0; k < 2 && st == MEGA_OK; k++) {
      snprintf(name, sizeof name, "%s%s", params[i].name, moment_suffix[k]);
      st = load_tensor(be, &opt, path, "optimizer", name, &params[i], dst[k], host, err);
    }
  }
  mega_ckpt_close_shards(&model);
  mega_ckpt_close_shards(&opt);
  free(host);
  if (st == MEGA_OK) st = be->ops->synchronize(be, err);
  if (st == MEGA_OK) *state = s;
  return st;
}
