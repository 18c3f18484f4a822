#include "worker/generate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "kernels/rng.h"
#include "worker/ckpt/checkpoint.h"

/* dir/name parsed into *out; path gets the file's path for messages. */
static mega_status load_json(const char *dir, const char *name, char *path, size_t cap,
                             json_t **out, mega_err *err) {
  snprintf(path, cap, "%s/%s", dir, name);
  json_error_t je;
  *out = json_load_file(path, 0, &je);
  return *out ? MEGA_OK : mega_fail(err, MEGA_ERR_INVALID, "%s: %s", path, je.text);
}

/* The tokenizer from the job flags trainer_state.json recorded. */
static mega_status read_tokenizer(const char *dir, mega_gen_model *m, mega_err *err) {
  char path[4200];
  json_t *j;
  if (load_json(dir, "trainer_state.json", path, sizeof path, &j, err) != MEGA_OK)
    return err->status;
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  mega_err sub = {0};
  json_t *flags = json_object_get(j, "job");
  mega_status st = flags ? mega_jobspec_from_json(&job, flags, &sub) : MEGA_OK;
  if (st != MEGA_OK)
    st = mega_fail(err, MEGA_ERR_INVALID, "%s: bad job record: %s", path, sub.msg);
  m->tokenizer = mega_jobspec_tokenizer(&job);
  m->vocab = mega_jobspec_tokenizer_vocab(&job); /* GPT-2's: 0 until its files are read */
  m->eod = job.tokenizer_type == MEGA_TOKENIZER_NULL ? job.vocab_size : -1;
  if (st == MEGA_OK && m->tokenizer == MEGA_TOKENIZER_GPT2BPE && job.vocab_file &&
      job.merge_file && (!(m->vocab_file = strdup(job.vocab_file)) ||
                         !(m->merge_file = strdup(job.merge_file))))
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  mega_jobspec_free(&job);
  json_decref(j);
  if (st == MEGA_OK && m->vocab > m->cfg.vocab_size)
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "%s: the tokenizer has %d ids but the model's vocabulary only %d", path,
                   m->vocab, m->cfg.vocab_size);
  return st;
}

mega_status mega_gen_load(const char *load_dir, mega_backend *be, mega_gen_model *m,
                          mega_err *err) {
  *m = (mega_gen_model){0};
  mega_status st = mega_ckpt_resolve_weights(load_dir, &m->path, &m->notice, err);
  struct stat sb;
  if (st == MEGA_ERR_NOT_FOUND && stat(load_dir, &sb) != 0)
    return mega_fail(err, MEGA_ERR_INVALID, "--load %s: %s; give the --save directory of a "
                     "training run", load_dir, strerror(errno));
  if (st == MEGA_ERR_NOT_FOUND)
    return mega_fail(err, MEGA_ERR_INVALID, "--load %s holds no checkpoint to generate from",
                     load_dir);
  if (st == MEGA_OK) st = mega_ckpt_read_config(m->path, &m->cfg, err);
  /* generation never drops: sized without attention dropout's mask, the
   * cuda backend's attention keeps flash's small buffers under --bf16 */
  m->cfg.hidden_dropout = m->cfg.attention_dropout = 0;
  if (st == MEGA_OK) st = read_tokenizer(m->path, m, err);
  mega_gpt_stage_desc whole = {.embedding = true, .loss = true, .num_layers = m->cfg.num_layers};
  if (st == MEGA_OK) st = mega_gpt_stage_create(be, &m->cfg, &whole, &m->stage, err);
  mega_ckpt_shards sh = {0};
  if (st == MEGA_OK) st = mega_ckpt_open_shards(m->path, "model", &sh, err);
  if (st == MEGA_OK) {
    st = mega_gpt_load_safetensors(m->stage, (const mega_st_file *const *)sh.files, sh.nfiles,
                                   err);
    mega_ckpt_close_shards(&sh);
  }
  if (st != MEGA_OK) mega_gen_free(m);
  return st;
}

void mega_gen_free(mega_gen_model *m) {
  mega_gpt_stage_destroy(m->stage);
  free(m->path);
  free(m->notice);
  free(m->vocab_file);
  free(m->merge_file);
  *m = (mega_gen_model){0};
}

mega_status mega_gen_use_vocab(mega_gen_model *m, int vocab, int eod, mega_err *err) {
  if (vocab < 1 || vocab > m->cfg.vocab_size)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the tokenizer has %d ids, but the model of %s has a vocabulary of %d",
                     vocab, m->path, m->cfg.vocab_size);
  m->vocab = vocab;
  m->eod = eod;
  return MEGA_OK;
}

int32_t mega_gen_pick(const float *logits, int vocab, const mega_gen_opts *o, uint64_t step) {
  int best = 0;
  for (int v = 1; v < vocab; v++)
    if (logits[v] > logits[best]) best = v;
  if (o->temperature <= 0) return best;
  /* the k-th largest logit is the cut: ids below it are out */
  double cut = -INFINITY;
  if (o->top_k > 0 && o->top_k < vocab) {
    float *sorted = malloc((size_t)vocab * sizeof *sorted);
    if (!sorted) return best;
    memcpy(sorted, logits, (size_t)vocab * sizeof *sorted);
    /* partial selection: the top_k largest to the front */
    for (int i = 0; i < o->top_k; i++) {
      int m = i;
      for (int v = i + 1; v < vocab; v++)
        if (sorted[v] > sorted[m]) m = v;
      float t = sorted[i];
      sorted[i] = sorted[m];
      sorted[m] = t;
    }
    cut = sorted[o->top_k - 1];
    free(sorted);
  }
  double sum = 0, top = logits[best];
  for (int v = 0; v < vocab; v++)
    if (logits[v] >= cut) sum += exp((logits[v] - top) / o->temperature);
  double u = mega_rng_uniform(mega_splitmix64(o->seed), step) * sum, acc = 0;
  int last = best;
  for (int v = 0; v < vocab; v++) {
    if (logits[v] < cut) continue;
    acc += exp((logits[v] - top) / o->temperature);
    last = v;
    if (u <= acc) return v;
  }
  return last; /* rounding: u a hair above the sum */
}

mega_status mega_gen_run(const mega_gen_model *m, const int32_t *prompt, int n,
                         const mega_gen_opts *o, int32_t *out, int *nout, mega_err *err) {
  *nout = 0;
  if (n < 1) return mega_fail(err, MEGA_ERR_INVALID, "the prompt is empty");
  for (int i = 0; i < n; i++)
    if (prompt[i] < 0 || prompt[i] >= m->vocab)
      return mega_fail(err, MEGA_ERR_INVALID, "prompt token %d is %d, outside the ids 0..%d", i,
                       prompt[i], m->vocab - 1);
  int cap = n + (o->max_new_tokens > 0 ? o->max_new_tokens : 0);
  int32_t *ctx = malloc((size_t)cap * sizeof *ctx);
  float *row = malloc((size_t)m->cfg.vocab_size * sizeof *row);
  if (!ctx || !row) {
    free(ctx);
    free(row);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for generation");
  }
  memcpy(ctx, prompt, (size_t)n * sizeof *ctx);
  mega_backend *be = mega_gpt_stage_backend(m->stage);
  mega_status st = MEGA_OK;
  int len = n;
  for (int k = 0; k < o->max_new_tokens && st == MEGA_OK; k++) {
    int T = len < m->cfg.max_seq_len ? len : m->cfg.max_seq_len;
    mega_gpt_acts *a = NULL;
    st = mega_gpt_acts_create(m->stage, 1, T, &a, err);
    if (st == MEGA_OK)
      st = mega_gpt_forward(m->stage, a, ctx + len - T, NULL, NULL, NULL, NULL, err);
    if (st == MEGA_OK) {
      const float *logits = mega_gpt_acts_logits(a) + (size_t)(T - 1) * m->cfg.vocab_size;
      st = be->ops->memcpy(be, row, logits, (size_t)m->cfg.vocab_size * sizeof *row,
                           MEGA_COPY_D2H, err);
    }
    mega_gpt_acts_destroy(a);
    if (st != MEGA_OK) break;
    for (int v = 0; v < m->vocab; v++)
      if (!isfinite(row[v])) {
        st = mega_fail(err, MEGA_ERR_INVALID,
                       "the model of %s gives a %s logit (token %d, at new token %d): its "
                       "weights are not finite, or overflowed",
                       m->path, isnan(row[v]) ? "NaN" : "infinite", v, k + 1);
        break;
      }
    if (st != MEGA_OK) break;
    int32_t next = mega_gen_pick(row, m->vocab, o, (uint64_t)k);
    ctx[len++] = next;
    out[(*nout)++] = next;
    if (next == m->eod) break;
  }
  free(ctx);
  free(row);
  return st;
}
