/* Hugging Face sharded safetensors: writing shards and their index, and
 * opening a shard set with the index checked against the files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_internal.h"

static const mega_st_meta pt_meta[] = {{"format", "pt"}}; /* transformers requires it */

/* A file, or a link in its place (which opening it refuses). */
static bool file_exists(const char *path) {
  struct stat st;
  return mega_ckpt_lstat(path, &st) == 0 && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode));
}

/* huggingface_hub's split_state_dict_into_shards: in order, a tensor larger
 * than the limit alone in its own shard (placed before the shard being
 * filled), otherwise a new shard when the next tensor would pass the limit. */
int mega_ckpt_plan_shards(const mega_st_tensor *t, size_t n, uint64_t limit, int *shard_of) {
  if (limit == 0) limit = MEGA_CKPT_DEFAULT_SHARD_BYTES;
  /* Shards get ids as they open; HF lists them in the order they close (an
   * oversized tensor's at once, the one being filled when the next tensor
   * would overflow it), so number them by closing order at the end. */
  int *closed = malloc((n ? n : 1) * sizeof *closed); /* k-th closed -> id */
  int *rank = malloc((n ? n : 1) * sizeof *rank);     /* id -> k */
  if (!closed || !rank) {
    free(closed);
    free(rank);
    return -1;
  }
  int nclosed = 0, next_id = 0, current = -1;
  uint64_t current_size = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t sz = (uint64_t)t[i].numel * 4;
    if (sz > limit) {
      shard_of[i] = next_id;
      closed[nclosed++] = next_id++;
      continue;
    }
    if (current >= 0 && current_size + sz > limit) {
      closed[nclosed++] = current;
      current = -1;
    }
    if (current < 0) {
      current = next_id++;
      current_size = 0;
    }
    shard_of[i] = current;
    current_size += sz;
  }
  if (current >= 0) closed[nclosed++] = current;
  for (int k = 0; k < nclosed; k++) rank[closed[k]] = k;
  for (size_t i = 0; i < n; i++) shard_of[i] = rank[shard_of[i]];
  free(closed);
  free(rank);
  return nclosed;
}

void mega_ckpt_shard_name(char *buf, size_t cap, const char *prefix, int k, int total) {
  if (total == 1)
    snprintf(buf, cap, "%s.safetensors", prefix);
  else
    snprintf(buf, cap, "%s-%05d-of-%05d.safetensors", prefix, k + 1, total);
}

mega_status mega_ckpt_write_part(const char *dir, const char *prefix,
                                 const mega_st_tensor *tensors, size_t n, const int *shard_of,
                                 int nshards, int first, int total, mega_ckpt_file *files,
                                 json_t *weight_map, mega_err *err) {
  mega_st_tensor *group = malloc((n ? n : 1) * sizeof *group);
  if (!group) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory writing %s shards", prefix);
  mega_status st = MEGA_OK;
  char path[4096];
  for (int k = 0; k < nshards && st == MEGA_OK; k++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (shard_of[i] == k) group[m++] = tensors[i];
    mega_ckpt_file *f = &files[k];
    mega_ckpt_shard_name(f->name, sizeof f->name, prefix, first + k, total);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, f->name) >= sizeof path) {
      st = mega_fail(err, MEGA_ERR_INVALID, "checkpoint path too long: %s", dir);
      break;
    }
    st = mega_st_write(path, group, m, pt_meta, 1, err); /* fsyncs the file */
    if (st == MEGA_OK) st = mega_ckpt_file_sum(path, &f->size, &f->crc32, err);
    for (size_t i = 0; i < m && st == MEGA_OK && weight_map; i++)
      if (json_object_set_new(weight_map, group[i].name, json_string(f->name)))
        st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory writing %s shards", prefix);
  }
  free(group);
  return st;
}

mega_status mega_ckpt_write_shards(const char *dir, const char *prefix,
                                   const mega_st_tensor *tensors, size_t n,
                                   uint64_t max_shard_bytes, int *nshards, mega_err *err) {
  int *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
  mega_ckpt_file *files = calloc(n ? n : 1, sizeof *files);
  json_t *index = json_object(), *wmap = json_object();
  mega_status st = MEGA_OK;
  int ns = shard_of && files ? mega_ckpt_plan_shards(tensors, n, max_shard_bytes, shard_of) : -1;
  if (ns < 0 || !index || !wmap) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory writing %s shards", prefix);
    goto out;
  }
  if (ns == 0) { /* no tensors: one empty file, as HF writes */
    ns = 1;
    shard_of[0] = 0;
  }
  st = mega_ckpt_write_part(dir, prefix, tensors, n, shard_of, ns, 0, ns, files, wmap, err);
  if (st == MEGA_OK && ns > 1) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += (uint64_t)tensors[i].numel * 4;
    json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
    json_object_set(index, "weight_map", wmap);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", dir, prefix);
    if (json_dump_file(index, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
      st = mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  if (st == MEGA_OK && nshards) *nshards = ns;
out:
  json_decref(index);
  json_decref(wmap);
  free(files);
  free(shard_of);
  return st;
}

void mega_ckpt_close_shards(mega_ckpt_shards *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nfiles; i++) mega_st_close(s->files[i]);
  free(s->files);
  s->files = NULL;
  s->nfiles = 0;
}

const mega_st_file *mega_ckpt_shards_find(const mega_ckpt_shards *s, const char *name) {
  for (size_t i = 0; i < s->nfiles; i++)
    if (mega_st_find(s->files[i], name)) return s->files[i];
  return NULL;
}

static mega_status open_indexed(const char *dir, const char *index_path, mega_ckpt_shards *out,
                                mega_err *err) {
  json_error_t jerr;
  json_t *root;
  mega_status opened = mega_ckpt_load_json(index_path, &root, &jerr, err);
  if (opened != MEGA_OK) return opened;
  if (!root)
    return mega_fail(err, MEGA_ERR_INVALID, "%s is not valid JSON (line %d: %s)", index_path,
                     jerr.line, jerr.text);
  mega_status st = MEGA_OK;
  json_t *wmap = json_object_get(root, "weight_map");
  json_t *meta = json_object_get(root, "metadata");
  json_t *total_j = meta ? json_object_get(meta, "total_size") : NULL;
  if (!json_is_object(wmap) || !json_is_integer(total_j)) {
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "%s lacks a weight_map object or an integer metadata.total_size", index_path);
    goto out;
  }
  size_t cap = json_object_size(wmap);
  if (!cap) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s lists no tensors (its weight_map is empty)",
                   index_path);
    goto out;
  }
  out->files = calloc(cap, sizeof *out->files);
  if (!out->files) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", index_path);
    goto out;
  }
  /* Open each distinct file once; file names must stay inside dir. */
  const char *key;
  json_t *val;
  json_object_foreach(wmap, key, val) {
    const char *fname = json_string_value(val);
    if (!fname || !*fname || strchr(fname, '/') || !strcmp(fname, "..")) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s maps tensor '%s' to a bad file name",
                     index_path, key);
      goto out;
    }
    bool seen = false;
    for (size_t i = 0; i < out->nfiles && !seen; i++) {
      const char *p = mega_st_path(out->files[i]);
      const char *base = strrchr(p, '/');
      seen = !strcmp(base ? base + 1 : p, fname);
    }
    if (seen) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    st = mega_st_open_plain(path, &out->files[out->nfiles], err);
    if (st != MEGA_OK) goto out;
    out->nfiles++;
  }
  /* Every listed tensor is in its file; total_size adds up. */
  uint64_t total = 0;
  json_object_foreach(wmap, key, val) {
    const char *fname = json_string_value(val);
    const mega_st_tensor *t = NULL;
    for (size_t i = 0; i < out->nfiles && !t; i++) {
      const char *p = mega_st_path(out->files[i]);
      const char *base = strrchr(p, '/');
      if (!strcmp(base ? base + 1 : p, fname)) t = mega_st_find(out->files[i], key);
    }
    if (!t) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s lists tensor '%s' in %s, which does not hold it",
                     index_path, key, fname);
      goto out;
    }
    total += (uint64_t)t->numel * 4;
  }
  if ((json_int_t)total != json_integer_value(total_j)) {
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "%s says metadata.total_size %lld, but its tensors hold %llu bytes",
                   index_path, (long long)json_integer_value(total_j), (unsigned long long)total);
    goto out;
  }
out:
  json_decref(root);
  if (st != MEGA_OK) mega_ckpt_close_shards(out);
  return st;
}

mega_status mega_ckpt_open_shards(const char *dir, const char *prefix, mega_ckpt_shards *out,
                                  mega_err *err) {
  out->files = NULL;
  out->nfiles = 0;
  char index_path[4096], single[4096];
  snprintf(index_path, sizeof index_path, "%s/%s.safetensors.index.json", dir, prefix);
  snprintf(single, sizeof single, "%s/%s.safetensors", dir, prefix);
  if (file_exists(index_path)) return open_indexed(dir, index_path, out, err);
  if (!file_exists(single))
    return mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "checkpoint %s has neither %s.safetensors nor %s.safetensors.index.json",
                     dir, prefix, prefix);
  out->files = calloc(1, sizeof *out->files);
  if (!out->files) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", single);
  mega_status st = mega_st_open_plain(single, &out->files[0], err);
  if (st != MEGA_OK) {
    free(out->files);
    out->files = NULL;
    return st;
  }
  out->nfiles = 1;
  return MEGA_OK;
}
