/* Several writers, one checkpoint: host copies, shards numbered across
 * writers, the file lists gathered to the committer, and the commit. */
#include "worker/ckpt/ckpt_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/ckpt_internal.h"

static const char *const moment_suffix[2] = {".exp_avg", ".exp_avg_sq"};

struct mega_ckpt_writer {
  mega_ckpt_writer_config c;
  const mega_ckpt_param *params; /* borrowed */
  size_t n;
  int rank, size;                /* writer index and count */
  float **host;                  /* [3n]: param, exp_avg, exp_avg_sq copies (NULL: no state) */
  mega_st_tensor *model, *opt;   /* views of the host copies */
  size_t nmodel, nopt;
  char **opt_names;              /* [nopt] */
  bool staged;
  mega_ckpt_state state;
};

void mega_ckpt_writer_destroy(mega_ckpt_writer *w) {
  if (!w) return;
  for (size_t i = 0; w->host && i < 3 * w->n; i++) free(w->host[i]);
  for (size_t i = 0; w->opt_names && i < w->nopt; i++) free(w->opt_names[i]);
  free(w->host);
  free(w->model);
  free(w->opt);
  free(w->opt_names);
  free(w);
}

static mega_st_tensor view(const mega_ckpt_param *p, const char *name, const float *data) {
  mega_st_tensor t = {.name = name, .ndim = p->ndim, .numel = p->numel, .data = data};
  for (int d = 0; d < p->ndim && d < 2; d++) t.shape[d] = p->shape[d];
  return t;
}

mega_status mega_ckpt_writer_create(const mega_ckpt_writer_config *cfg,
                                    const mega_ckpt_param *params, size_t n,
                                    mega_ckpt_writer **out, mega_err *err) {
  *out = NULL;
  mega_ckpt_writer *w = calloc(1, sizeof *w);
  if (!w) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a checkpoint writer");
  w->c = *cfg;
  if (!w->c.timeout_ms) w->c.timeout_ms = MEGA_CKPT_WRITERS_TIMEOUT_MS;
  w->params = params;
  w->n = n;
  w->rank = cfg->comm ? mega_comm_rank(cfg->comm) : 0;
  w->size = cfg->comm ? mega_comm_size(cfg->comm) : 1;
  size_t m = n ? n : 1;
  w->host = calloc(3 * m, sizeof *w->host);
  w->model = calloc(m, sizeof *w->model);
  w->opt = calloc(2 * m, sizeof *w->opt);
  w->opt_names = calloc(2 * m, sizeof *w->opt_names);
  if (!w->host || !w->model || !w->opt || !w->opt_names) goto nomem;
  for (size_t i = 0; i < n; i++) {
    const mega_ckpt_param *p = &params[i];
    size_t bytes = (p->numel ? p->numel : 1) * sizeof(float);
    if (!(w->host[3 * i] = malloc(bytes))) goto nomem;
    w->model[w->nmodel++] = view(p, p->name, w->host[3 * i]);
    if (!p->exp_avg) continue;
    /* NAME.exp_avg, NAME.exp_avg_sq, tensor by tensor */
    for (int k = 0; k < 2; k++) {
      size_t len = strlen(p->name) + strlen(moment_suffix[k]) + 1;
      char *name = malloc(len);
      float *h = malloc(bytes);
      if (!name || !h) {
        free(name);
        free(h);
        goto nomem;
      }
      snprintf(name, len, "%s%s", p->name, moment_suffix[k]);
      w->host[3 * i + 1 + k] = h;
      w->opt_names[w->nopt] = name;
      w->opt[w->nopt++] = view(p, name, h);
    }
  }
  *out = w;
  return MEGA_OK;
nomem:
  mega_ckpt_writer_destroy(w);
  return mega_fail(err, MEGA_ERR_NOMEM,
                   "out of memory for the checkpoint's host copies of %zu tensors", n);
}

mega_status mega_ckpt_writer_stage(mega_ckpt_writer *w, mega_backend *be,
                                   const mega_ckpt_state *state, mega_err *err) {
  w->staged = false;
  mega_status st = be->ops->synchronize(be, err);
  for (size_t i = 0; i < w->n && st == MEGA_OK; i++) {
    const mega_ckpt_param *p = &w->params[i];
    const float *src[3] = {p->param, p->exp_avg, p->exp_avg_sq};
    for (int k = 0; k < 3 && st == MEGA_OK; k++)
      if (src[k])
        st = be->ops->memcpy(be, w->host[3 * i + k], src[k], p->numel * sizeof(float),
                             MEGA_COPY_D2H, err);
  }
  if (st == MEGA_OK) st = be->ops->synchronize(be, err);
  if (st != MEGA_OK) return st;
  w->state = *state;
  w->staged = true;
  return MEGA_OK;
}

/* ---- gathers over the writers (a lone writer gathers from itself) ---- */

static mega_status gather_counts(mega_ckpt_writer *w, const int64_t mine[2], int64_t *all,
                                 mega_err *err) {
  if (!w->c.comm) {
    all[0] = mine[0];
    all[1] = mine[1];
    return MEGA_OK;
  }
  size_t counts[w->size];
  for (int i = 0; i < w->size; i++) counts[i] = 2 * sizeof(int64_t);
  return mega_comm_all_gather(w->c.comm, mine, all, counts, MEGA_DT_BYTE, w->c.timeout_ms, err);
}

/* Every writer's text, NUL-terminated, in *texts (one malloc'd block of
 * pointers followed by the bytes; the caller frees *texts). */
static mega_status gather_texts(mega_ckpt_writer *w, const char *mine, char ***texts,
                                mega_err *err) {
  int n = w->size;
  uint64_t len = strlen(mine) + 1, lens[n];
  size_t counts[n];
  for (int i = 0; i < n; i++) counts[i] = sizeof(uint64_t);
  mega_status st = MEGA_OK;
  if (w->c.comm)
    st = mega_comm_all_gather(w->c.comm, &len, lens, counts, MEGA_DT_BYTE, w->c.timeout_ms, err);
  else
    lens[0] = len;
  if (st != MEGA_OK) return st;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] == 0 || lens[i] > (1u << 30))
      return mega_fail(err, MEGA_ERR_INTERNAL, "writer %d sent a file list of %llu bytes", i,
                       (unsigned long long)lens[i]);
    total += lens[i];
  }
  char **out = malloc(n * sizeof *out + total);
  if (!out) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory gathering the writers' files");
  char *bytes = (char *)(out + n);
  for (int i = 0; i < n; i++) counts[i] = lens[i];
  if (w->c.comm)
    st = mega_comm_all_gather(w->c.comm, mine, bytes, counts, MEGA_DT_BYTE, w->c.timeout_ms,
                              err);
  else
    memcpy(bytes, mine, len);
  if (st != MEGA_OK) {
    free(out);
    return st;
  }
  for (int i = 0; i < n; i++) {
    out[i] = bytes;
    bytes[lens[i] - 1] = '\0'; /* a peer's text is trusted no further than its length */
    bytes += lens[i];
  }
  *texts = out;
  return MEGA_OK;
}

/* ---- one writer's files ---- */

typedef struct part {
  int nm, no;               /* this writer's model and optimizer shards */
  int *shard_m, *shard_o;
  mega_ckpt_file *files;    /* nm + no */
  json_t *map_m, *map_o;    /* tensor -> file */
  uint64_t bytes_m, bytes_o; /* tensor data */
} part;

static void part_free(part *p) {
  free(p->shard_m);
  free(p->shard_o);
  free(p->files);
  json_decref(p->map_m);
  json_decref(p->map_o);
}

static mega_status plan(mega_ckpt_writer *w, part *p, mega_err *err) {
  uint64_t limit = w->c.max_shard_bytes;
  p->shard_m = malloc((w->nmodel + 1) * sizeof *p->shard_m);
  p->shard_o = malloc((w->nopt + 1) * sizeof *p->shard_o);
  p->map_m = json_object();
  p->map_o = json_object();
  if (!p->shard_m || !p->shard_o || !p->map_m || !p->map_o)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory planning the checkpoint's shards");
  p->nm = mega_ckpt_plan_shards(w->model, w->nmodel, limit, p->shard_m);
  p->no = mega_ckpt_plan_shards(w->opt, w->nopt, limit, p->shard_o);
  p->files = calloc((size_t)(p->nm + p->no + 1), sizeof *p->files);
  if (p->nm < 0 || p->no < 0 || !p->files)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory planning the checkpoint's shards");
  for (size_t i = 0; i < w->nmodel; i++) p->bytes_m += (uint64_t)w->model[i].numel * 4;
  for (size_t i = 0; i < w->nopt; i++) p->bytes_o += (uint64_t)w->opt[i].numel * 4;
  return MEGA_OK;
}

/* This writer's file list for the committer, or its failure. */
static char *part_text(const part *p, const mega_err *failed) {
  json_t *j;
  if (failed) {
    j = json_pack("{s:b, s:s, s:i}", "ok", 0, "error", failed->msg, "status",
                  (int)failed->status);
  } else {
    json_t *files = json_array();
    for (int i = 0; files && i < p->nm + p->no; i++)
      json_array_append_new(files, json_pack("{s:s, s:I, s:I}", "name", p->files[i].name,
                                             "size", (json_int_t)p->files[i].size, "crc32",
                                             (json_int_t)p->files[i].crc32));
    j = json_pack("{s:b, s:o, s:O, s:O, s:I, s:I}", "ok", 1, "files", files, "model", p->map_m,
                  "optimizer", p->map_o, "model_bytes", (json_int_t)p->bytes_m,
                  "optimizer_bytes", (json_int_t)p->bytes_o);
  }
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  return s;
}

/* ---- the committer ---- */

typedef struct merged {
  mega_ckpt_file *files;
  size_t nfiles, cap;
  json_t *map_m, *map_o;
  uint64_t bytes_m, bytes_o;
} merged;

static mega_status add_file(merged *m, const mega_ckpt_file *f, mega_err *err) {
  if (m->nfiles == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 16;
    mega_ckpt_file *g = realloc(m->files, cap * sizeof *g);
    if (!g) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging the writers' files");
    m->files = g;
    m->cap = cap;
  }
  m->files[m->nfiles++] = *f;
  return MEGA_OK;
}

static mega_status merge_map(json_t *into, json_t *from, int writer, mega_err *err) {
  const char *key;
  json_t *v;
  if (!json_is_object(from))
    return mega_fail(err, MEGA_ERR_INTERNAL, "writer %d sent no tensor map", writer);
  json_object_foreach(from, key, v) {
    if (json_object_get(into, key))
      return mega_fail(err, MEGA_ERR_INTERNAL,
                       "tensor '%s' was written by two writers (writer %d and an earlier one)",
                       key, writer);
    json_object_set(into, key, v);
  }
  return MEGA_OK;
}

/* Checks and merges the writers' texts; a writer's failure becomes ours. */
static mega_status merge(mega_ckpt_writer *w, char **texts, merged *m, mega_err *err) {
  m->map_m = json_object();
  m->map_o = json_object();
  if (!m->map_m || !m->map_o) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (int k = 0; k < w->size; k++) {
    json_t *j = json_loads(texts[k], 0, NULL);
    if (!j) return mega_fail(err, MEGA_ERR_INTERNAL, "writer %d sent a bad file list", k);
    mega_status st = MEGA_OK;
    if (!json_is_true(json_object_get(j, "ok"))) {
      const char *why = json_string_value(json_object_get(j, "error"));
      json_int_t code = json_integer_value(json_object_get(j, "status"));
      st = mega_fail(err, code > MEGA_OK && code <= MEGA_ERR_INTERNAL ? (mega_status)code
                                                                     : MEGA_ERR_IO,
                     "%s", why ? why : "failed");
      if (k) mega_err_prefix(err, "checkpoint writer %d", k);
    }
    json_t *files = json_object_get(j, "files");
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
      if (st != MEGA_OK) break;
      mega_ckpt_file cf = {.size = (uint64_t)json_integer_value(json_object_get(f, "size")),
                           .crc32 = (uint32_t)json_integer_value(json_object_get(f, "crc32"))};
      const char *name = json_string_value(json_object_get(f, "name"));
      snprintf(cf.name, sizeof cf.name, "%s", name ? name : "");
      st = add_file(m, &cf, err);
    }
    if (st == MEGA_OK) st = merge_map(m->map_m, json_object_get(j, "model"), k, err);
    if (st == MEGA_OK) st = merge_map(m->map_o, json_object_get(j, "optimizer"), k, err);
    m->bytes_m += (uint64_t)json_integer_value(json_object_get(j, "model_bytes"));
    m->bytes_o += (uint64_t)json_integer_value(json_object_get(j, "optimizer_bytes"));
    json_decref(j);
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}

static mega_status write_index(const char *tmp, const char *prefix, json_t *map, uint64_t bytes,
                               merged *m, mega_err *err) {
  json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)bytes,
                          "weight_map", map);
  char name[64];
  snprintf(name, sizeof name, "%s.safetensors.index.json", prefix);
  mega_ckpt_file f;
  mega_status st = mega_ckpt_write_json(idx, tmp, name, JSON_INDENT(2) | JSON_SORT_KEYS, &f, err);
  return st == MEGA_OK ? add_file(m, &f, err) : st;
}

static mega_status commit(mega_ckpt_writer *w, const char *tmp, const int64_t *counts,
                          char **texts, mega_ckpt_write_result *res, mega_err *err) {
  merged m = {0};
  int64_t total_m = 0, total_o = 0;
  for (int k = 0; k < w->size; k++) {
    total_m += counts[2 * k];
    total_o += counts[2 * k + 1];
  }
  const mega_ckpt_state *s = &w->state;
  mega_status st = merge(w, texts, &m, err);
  if (st == MEGA_OK && total_m > 1) st = write_index(tmp, "model", m.map_m, m.bytes_m, &m, err);
  if (st == MEGA_OK && total_o > 1)
    st = write_index(tmp, "optimizer", m.map_o, m.bytes_o, &m, err);
  mega_ckpt_file f;
  if (st == MEGA_OK) {
    json_t *cj = mega_ckpt_config_json(w->c.cfg, w->c.job);
    st = mega_ckpt_write_json(cj, tmp, MEGA_CKPT_CONFIG_FILE, mega_ckpt_config_flags(cj), &f,
                              err);
  }
  if (st == MEGA_OK) st = add_file(&m, &f, err);
  if (st == MEGA_OK)
    st = mega_ckpt_write_json(mega_ckpt_state_json(s, w->c.job, total_o > 0), tmp,
                              MEGA_CKPT_STATE_FILE, JSON_INDENT(2), &f, err);
  if (st == MEGA_OK) st = add_file(&m, &f, err);
  if (st != MEGA_OK) {
    if (*tmp) mega_ckpt_abort(tmp); /* every writer is done with it: they sent their lists */
    goto out;
  }
  if (w->c.await_commit) {
    mega_err why = {0};
    if (w->c.await_commit(w->c.arg, s->iteration, &why) != MEGA_OK) {
      res->refused = why;
      if (res->refused.status == MEGA_OK) res->refused.status = MEGA_ERR_CANCELLED;
      /* never committed now: every writer is done with it (they sent their
       * lists), so it goes, rather than wait for the next setup's cleanup */
      mega_ckpt_abort(tmp);
      goto out;
    }
  }
  st = mega_ckpt_write_manifest(tmp, s->iteration, s->attempt, m.files, m.nfiles, err);
  if (st == MEGA_OK) st = mega_ckpt_commit(w->c.save_dir, tmp, s->iteration, err);
  if (st != MEGA_OK) {
    mega_ckpt_abort(tmp);
    goto out;
  }
  res->committed = true;
  for (size_t i = 0; i < m.nfiles; i++) res->total_bytes += m.files[i].size;
out:
  free(m.files);
  json_decref(m.map_m);
  json_decref(m.map_o);
  return st;
}

mega_status mega_ckpt_writer_write(mega_ckpt_writer *w, mega_ckpt_write_result *res,
                                   mega_err *err) {
  memset(res, 0, sizeof *res);
  res->committer = w->rank == 0;
  if (!w->staged)
    return mega_fail(err, MEGA_ERR_INTERNAL, "checkpoint write without a staged copy");
  w->staged = false;
  const mega_ckpt_state *s = &w->state;
  if (!mega_ckpt_iter_path(res->path, sizeof res->path, w->c.save_dir, s->iteration))
    return mega_fail(err, MEGA_ERR_INVALID, "--save path too long: %s", w->c.save_dir);

  /* A local failure is carried through both gathers so that the writers
   * stay paired, and reported by the committer. */
  part p = {0};
  mega_err mine = {0};
  char tmp[4096] = "";
  bool ok = mega_ckpt_begin(w->c.save_dir, s->iteration, s->attempt, w->size == 1, tmp,
                            sizeof tmp, &mine) == MEGA_OK;
  ok = ok && plan(w, &p, &mine) == MEGA_OK;
  int64_t n[2] = {ok ? p.nm : 0, ok ? p.no : 0}, counts[2 * w->size];
  mega_status st = gather_counts(w, n, counts, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "checkpoint of iteration %lld: gathering the writers' shard counts",
                    (long long)s->iteration);
    goto abandoned;
  }
  int64_t first_m = 0, first_o = 0, total_m = 0, total_o = 0;
  for (int k = 0; k < w->size; k++) {
    if (k < w->rank) {
      first_m += counts[2 * k];
      first_o += counts[2 * k + 1];
    }
    total_m += counts[2 * k];
    total_o += counts[2 * k + 1];
  }
  ok = ok && mega_ckpt_write_part(tmp, "model", w->model, w->nmodel, p.shard_m, p.nm,
                                  (int)first_m, (int)total_m, p.files, p.map_m,
                                  &mine) == MEGA_OK;
  ok = ok && mega_ckpt_write_part(tmp, "optimizer", w->opt, w->nopt, p.shard_o, p.no,
                                  (int)first_o, (int)total_o, p.files + p.nm, p.map_o,
                                  &mine) == MEGA_OK;
  ok = ok && mega_ckpt_fsync_path(tmp, &mine) == MEGA_OK; /* the new names */
  if (ok) {
    for (int i = 0; i < p.nm + p.no; i++) res->bytes += p.files[i].size;
    if (w->c.on_durable) w->c.on_durable(w->c.arg, s->iteration, res->bytes);
  } else {
    mega_err_prefix(&mine, "saving checkpoint of iteration %lld in %s", (long long)s->iteration,
                    w->c.save_dir);
  }
  char *text = part_text(&p, ok ? NULL : &mine);
  if (!text) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory listing the checkpoint's files");
    goto out;
  }
  char **texts = NULL;
  st = gather_texts(w, text, &texts, err);
  free(text);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "checkpoint of iteration %lld: gathering the writers' file lists",
                    (long long)s->iteration);
    goto abandoned;
  }
  if (w->rank == 0) {
    st = commit(w, tmp, counts, texts, res, err);
  } else if (!ok) {
    *err = mine;
    st = mine.status ? mine.status : MEGA_ERR_IO;
  }
  free(texts);
out:
  part_free(&p);
  return st;
abandoned:
  /* the writers are parted (an abort: a cancel, a signal, a lost peer).
   * The committer's own gather failed, so this attempt's save can never be
   * committed, and no other attempt writes into its temp directory: it goes
   * now, for a cancelled job has no next start to clean it up. Only the
   * committer removes it: another writer's gather can fail after the
   * committer's succeeded (an all-gather's results differ between ranks),
   * and that committer is renaming the directory into place. */
  if (*tmp && w->rank == 0) mega_ckpt_abort(tmp);
  goto out;
}
