/* Saving and loading a checkpoint: model and optimizer tensors, config.json
 * and trainer_state.json. The directory protocol is in ckpt_dir.c, the
 * sharding in ckpt_shard.c. */
#include "worker/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "worker/ckpt_internal.h"

#define STATE_FORMAT "mega-checkpoint"
#define STATE_VERSION 1

static const char *const moment_suffix[2] = {".exp_avg", ".exp_avg_sq"};

/* Host copies of the tensors being written; names for the optimizer's. */
typedef struct staging {
  mega_st_tensor *t;
  float **host;
  char **names;
  size_t n;
} staging;

static void staging_free(staging *s) {
  for (size_t i = 0; i < s->n; i++) {
    free(s->host[i]);
    if (s->names) free(s->names[i]);
  }
  free(s->t);
  free(s->host);
  free(s->names);
  memset(s, 0, sizeof *s);
}

/* which: -1 the params, 0 exp_avg, 1 exp_avg_sq (tensors without state are
 * skipped). */
static mega_status stage_tensors(mega_backend *be, const mega_ckpt_param *p, size_t n, int which,
                                 staging *s, mega_err *err) {
  memset(s, 0, sizeof *s);
  s->t = calloc(n ? n : 1, sizeof *s->t);
  s->host = calloc(n ? n : 1, sizeof *s->host);
  s->names = calloc(n ? n : 1, sizeof *s->names);
  if (!s->t || !s->host || !s->names) goto nomem;
  for (size_t i = 0; i < n; i++) {
    const float *src = which < 0 ? p[i].param : which == 0 ? p[i].exp_avg : p[i].exp_avg_sq;
    if (!src) continue;
    size_t k = s->n;
    s->host[k] = malloc((p[i].numel ? p[i].numel : 1) * sizeof(float));
    if (!s->host[k]) goto nomem;
    s->n++;
    if (which >= 0) {
      size_t len = strlen(p[i].name) + strlen(moment_suffix[which]) + 1;
      s->names[k] = malloc(len);
      if (!s->names[k]) goto nomem;
      snprintf(s->names[k], len, "%s%s", p[i].name, moment_suffix[which]);
    }
    mega_status st = be->ops->memcpy(be, s->host[k], src, p[i].numel * sizeof(float),
                                     MEGA_COPY_D2H, err);
    if (st != MEGA_OK) {
      staging_free(s);
      return st;
    }
    s->t[k].name = which >= 0 ? s->names[k] : p[i].name;
    s->t[k].ndim = p[i].ndim;
    for (int d = 0; d < p[i].ndim && d < 2; d++) s->t[k].shape[d] = p[i].shape[d];
    s->t[k].numel = p[i].numel;
    s->t[k].data = s->host[k];
  }
  return MEGA_OK;
nomem:
  staging_free(s);
  return mega_fail(err, MEGA_ERR_NOMEM, "out of memory staging the checkpoint's tensors");
}

/* A float as the shortest decimal that reads back as it, so 1e-5f is
 * written 1e-05 rather than 9.99999974738e-06. */
static double tidy(float x) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.9g", (double)x);
  for (int prec = 1; prec <= 9; prec++) {
    char b2[32];
    snprintf(b2, sizeof b2, "%.*g", prec, (double)x);
    if (strtof(b2, NULL) == x) return strtod(b2, NULL);
  }
  return strtod(buf, NULL);
}

static json_t *config_json(const mega_gpt_config *cfg) {
  json_t *archs = json_pack("[s]", "GPT2LMHeadModel");
  return json_pack(
      "{s:o, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:f, s:s, s:b, s:f, s:f, s:f, s:f, s:s}",
      "architectures", archs, "model_type", "gpt2", "vocab_size", cfg->vocab_size,
      "n_positions", cfg->max_seq_len, "n_ctx", cfg->max_seq_len, "n_embd", cfg->channels,
      "n_layer", cfg->num_layers, "n_head", cfg->num_heads, "n_inner", "layer_norm_epsilon",
      tidy(cfg->ln_eps), "activation_function", "gelu_new", "tie_word_embeddings", 1,
      "initializer_range", tidy(cfg->init_std),
      /* no dropout in mega, so an HF model in train mode computes the same */
      "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0, "torch_dtype", "float32");
}

static mega_status dump_json(json_t *j, const char *dir, const char *name, mega_err *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building %s", path);
  /* config.json reads better with 1e-05 than 1.0000000000000001e-05; the
   * state file keeps every digit, since resume compares its values exactly. */
  size_t flags = JSON_INDENT(2);
  if (!strcmp(name, MEGA_CKPT_CONFIG_FILE)) flags |= JSON_REAL_PRECISION(9);
  int rc = json_dump_file(j, path, flags);
  json_decref(j);
  if (rc != 0) return mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  return MEGA_OK;
}

static mega_status write_all(const char *tmp, mega_backend *be, const mega_gpt_config *cfg,
                             const mega_jobspec *job, const mega_ckpt_state *state,
                             const mega_ckpt_param *params, size_t n, uint64_t limit,
                             mega_err *err) {
  staging s;
  mega_status st = stage_tensors(be, params, n, -1, &s, err);
  if (st != MEGA_OK) return st;
  st = mega_ckpt_write_shards(tmp, "model", s.t, s.n, limit, NULL, err);
  staging_free(&s);
  if (st != MEGA_OK) return st;

  bool has_state = false;
  for (size_t i = 0; i < n; i++) has_state |= params[i].exp_avg != NULL;
  if (has_state) {
    staging m, v;
    st = stage_tensors(be, params, n, 0, &m, err);
    if (st != MEGA_OK) return st;
    st = stage_tensors(be, params, n, 1, &v, err);
    if (st != MEGA_OK) {
      staging_free(&m);
      return st;
    }
    /* Interleave NAME.exp_avg, NAME.exp_avg_sq per tensor. */
    mega_st_tensor *all = malloc((m.n + v.n + 1) * sizeof *all);
    if (!all) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory staging the optimizer state");
    } else {
      for (size_t i = 0; i < m.n; i++) {
        all[2 * i] = m.t[i];
        all[2 * i + 1] = v.t[i];
      }
      st = mega_ckpt_write_shards(tmp, "optimizer", all, m.n + v.n, limit, NULL, err);
      free(all);
    }
    staging_free(&m);
    staging_free(&v);
    if (st != MEGA_OK) return st;
  }

  st = dump_json(config_json(cfg), tmp, MEGA_CKPT_CONFIG_FILE, err);
  if (st != MEGA_OK) return st;
  json_t *js = json_pack("{s:s, s:i, s:I, s:I, s:I, s:b}", "format", STATE_FORMAT, "version",
                         STATE_VERSION, "iteration", (json_int_t)state->iteration,
                         "consumed_samples", (json_int_t)state->consumed_samples,
                         "optimizer_steps", (json_int_t)state->optimizer_steps,
                         "has_optimizer_state", has_state);
  if (js && job) {
    json_t *jj = mega_jobspec_to_json(job);
    if (!jj) {
      json_decref(js);
      js = NULL;
    } else {
      json_object_set_new(js, "job", jj);
    }
  }
  return dump_json(js, tmp, MEGA_CKPT_STATE_FILE, err);
}

mega_status mega_ckpt_save(const char *save_dir, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_state *state,
                           const mega_ckpt_param *params, size_t n,
                           const mega_ckpt_save_opts *opts, mega_err *err) {
  char tmp[4096];
  mega_status st = mega_ckpt_begin(save_dir, state->iteration, tmp, sizeof tmp, err);
  if (st != MEGA_OK) return st;
  uint64_t limit = opts && opts->max_shard_bytes ? opts->max_shard_bytes
                                                 : MEGA_CKPT_DEFAULT_SHARD_BYTES;
  st = write_all(tmp, be, cfg, job, state, params, n, limit, err);
  if (st == MEGA_OK) st = mega_ckpt_commit(save_dir, tmp, state->iteration, err);
  if (st != MEGA_OK) {
    mega_ckpt_abort(tmp);
    mega_err_prefix(err, "saving checkpoint of iteration %lld in %s",
                    (long long)state->iteration, save_dir);
  }
  return st;
}

/* ---- loading ---- */

static json_t *load_json(const char *dir, const char *name, mega_err *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  json_error_t jerr;
  json_t *j = json_load_file(path, 0, &jerr);
  if (!j) {
    FILE *f = fopen(path, "r");
    if (!f) {
      mega_fail(err, MEGA_ERR_INVALID, "checkpoint %s has no %s", dir, name);
      return NULL;
    }
    fclose(f);
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

static mega_status check_config(const char *dir, const mega_gpt_config *cfg, mega_err *err) {
  json_t *j = load_json(dir, MEGA_CKPT_CONFIG_FILE, err);
  if (!j) return err ? err->status : MEGA_ERR_INVALID;
  static const struct {
    const char *key, *flag;
    size_t off;
  } fields[] = {
      {"vocab_size", "vocabulary size", offsetof(mega_gpt_config, vocab_size)},
      {"n_positions", "--max-position-embeddings", offsetof(mega_gpt_config, max_seq_len)},
      {"n_embd", "--hidden-size", offsetof(mega_gpt_config, channels)},
      {"n_layer", "--num-layers", offsetof(mega_gpt_config, num_layers)},
      {"n_head", "--num-attention-heads", offsetof(mega_gpt_config, num_heads)},
  };
  mega_status st = MEGA_OK;
  const char *mt = json_string_value(json_object_get(j, "model_type"));
  if (!mt || strcmp(mt, "gpt2") != 0) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s: model_type is not \"gpt2\"", dir,
                   MEGA_CKPT_CONFIG_FILE);
    goto out;
  }
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    json_t *v = json_object_get(j, fields[i].key);
    int want = *(const int *)((const char *)cfg + fields[i].off);
    if (!json_is_integer(v)) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s lacks an integer %s", dir,
                     MEGA_CKPT_CONFIG_FILE, fields[i].key);
      goto out;
    }
    if (json_integer_value(v) != want) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s has %s %lld, but this job has %s %d",
                     dir, MEGA_CKPT_CONFIG_FILE, fields[i].key,
                     (long long)json_integer_value(v), fields[i].flag, want);
      goto out;
    }
  }
out:
  json_decref(j);
  return st;
}

/* The flags a resumed job must share with the saved one: the model, the
 * data order and the LR schedule (Megatron checks the same scheduler
 * values). */
static mega_status check_job(const char *dir, const json_t *saved_json, const mega_jobspec *job,
                             mega_err *err) {
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
      {"--seq-length", saved.seq_length, job->seq_length},
      {"--max-position-embeddings", mega_jobspec_max_position_embeddings(&saved),
       mega_jobspec_max_position_embeddings(job)},
      {"--global-batch-size", saved.global_batch_size, job->global_batch_size},
      {"--lr", saved.lr, job->lr},
      {"--min-lr", saved.min_lr, job->min_lr},
      {"--lr-warmup-iters", saved.lr_warmup_iters, job->lr_warmup_iters},
      {"--lr-decay-iters", mega_jobspec_lr_decay_iters(&saved), mega_jobspec_lr_decay_iters(job)},
      {"--lr-decay-style", saved.lr_decay_style, job->lr_decay_style},
  };
  mega_jobspec_free(&saved);
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

static mega_status read_state(const char *dir, const mega_jobspec *job, mega_ckpt_state *state,
                              bool *has_opt, mega_err *err) {
  json_t *j = load_json(dir, MEGA_CKPT_STATE_FILE, err);
  if (!j) return err ? err->status : MEGA_ERR_INVALID;
  mega_status st = MEGA_OK;
  const char *fmt = json_string_value(json_object_get(j, "format"));
  json_t *ver = json_object_get(j, "version");
  if (!fmt || strcmp(fmt, STATE_FORMAT) != 0 || !json_is_integer(ver) ||
      json_integer_value(ver) != STATE_VERSION) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s is not a %s version %d state file", dir,
                   MEGA_CKPT_STATE_FILE, STATE_FORMAT, STATE_VERSION);
    goto out;
  }
  if ((st = get_i64(j, "iteration", dir, &state->iteration, err)) != MEGA_OK ||
      (st = get_i64(j, "consumed_samples", dir, &state->consumed_samples, err)) != MEGA_OK ||
      (st = get_i64(j, "optimizer_steps", dir, &state->optimizer_steps, err)) != MEGA_OK)
    goto out;
  *has_opt = json_is_true(json_object_get(j, "has_optimizer_state"));
  if (job) {
    json_t *saved = json_object_get(j, "job");
    if (!json_is_object(saved)) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s/%s lacks the job's flags", dir,
                     MEGA_CKPT_STATE_FILE);
      goto out;
    }
    st = check_job(dir, saved, job, err);
  }
out:
  json_decref(j);
  return st;
}

static mega_status load_tensor(mega_backend *be, const mega_ckpt_shards *sh, const char *dir,
                               const char *what, const char *name, const mega_ckpt_param *p,
                               float *dst, float *host, mega_err *err) {
  const mega_st_file *f = mega_ckpt_shards_find(sh, name);
  if (!f)
    return mega_fail(err, MEGA_ERR_INVALID, "checkpoint %s is missing %s tensor '%s'", dir, what,
                     name);
  mega_status st = mega_st_read_f32(f, name, host, p->numel, p->shape, p->ndim, err);
  if (st != MEGA_OK) return st;
  return be->ops->memcpy(be, dst, host, p->numel * sizeof(float), MEGA_COPY_H2D, err);
}

mega_status mega_ckpt_load(const char *path, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_param *params, size_t n,
                           mega_ckpt_state *state, mega_err *err) {
  mega_ckpt_state s = {0};
  bool has_opt = false, want_opt = false;
  mega_status st = check_config(path, cfg, err);
  if (st == MEGA_OK) st = read_state(path, job, &s, &has_opt, err);
  if (st != MEGA_OK) return st;
  for (size_t i = 0; i < n; i++) want_opt |= params[i].exp_avg != NULL;
  if (want_opt && !has_opt)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint %s holds no optimizer state to resume training from", path);

  size_t maxn = 1;
  for (size_t i = 0; i < n; i++)
    if (params[i].numel > maxn) maxn = params[i].numel;
  float *host = malloc(maxn * sizeof(float));
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
