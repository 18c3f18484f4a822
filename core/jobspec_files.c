/* What a job's flags name on disk, read where the job is checked: GPT-2's
 * vocabulary (its size is the model's), data paths given as one file of an
 * indexed dataset's pair, and relative paths made absolute. */
#include "core/jobspec.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/jobspec_internal.h"
#include "core/nofollow.h"

/* ---- GPT2BPETokenizer's vocabulary ---- */

/* vocab.json's ids: each a distinct integer 0..n-1, as GPT-2's are (the
 * model's vocabulary is n, so an id past it could never be a token). */
static mega_status check_vocab_ids(const char *path, json_t *v, size_t n, mega_err *err) {
  unsigned char *seen = calloc(n, 1);
  if (!seen) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", path);
  mega_status st = MEGA_OK;
  const char *key;
  json_t *id;
  json_object_foreach(v, key, id) {
    json_int_t k = json_integer_value(id);
    if (!json_is_integer(id) || k < 0 || (size_t)k >= n) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--vocab-file %s: \"%s\" has no id from 0 to %zu (GPT-2's vocab.json "
                     "numbers its %zu tokens 0 to %zu)", path, key, n - 1, n, n - 1);
      break;
    }
    if (seen[k]++) {
      st = mega_fail(err, MEGA_ERR_INVALID, "--vocab-file %s: id %lld appears twice", path,
                     (long long)k);
      break;
    }
  }
  free(seen);
  return st;
}

/* merges.txt as GPT-2's BPE reads it: an optional "#version" first line,
 * then one merge "A B" a line. Checked where the job is, so a wrong or
 * missing file stops the job before it trains rather than megaw generate
 * after it. */
static mega_status check_merges(const char *path, mega_err *err) {
  FILE *f = fopen(path, "r");
  if (!f) return mega_fail(err, MEGA_ERR_IO, "cannot read --merge-file %s", path);
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  mega_status st = MEGA_OK;
  for (int lineno = 1; st == MEGA_OK && (got = getline(&line, &cap, f)) >= 0; lineno++) {
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
    if (got == 0 || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
    char *sp = strchr(line, ' ');
    if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' '))
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--merge-file %s line %d is not a merge \"A B\": it is not GPT-2's "
                     "merges.txt", path, lineno);
  }
  if (st == MEGA_OK && ferror(f))
    st = mega_fail(err, MEGA_ERR_IO, "cannot read --merge-file %s", path);
  free(line);
  fclose(f);
  return st;
}

mega_status mega_jobspec_load_vocab(mega_jobspec *s, mega_err *err) {
  if (mega_jobspec_tokenizer(s) != MEGA_TOKENIZER_GPT2BPE || !s->vocab_file) return MEGA_OK;
  json_error_t je;
  json_t *v = json_load_file(s->vocab_file, 0, &je);
  if (!v)
    return mega_fail(err, MEGA_ERR_IO, "--vocab-file %s: %s", s->vocab_file, je.text);
  size_t n = json_is_object(v) ? json_object_size(v) : 0;
  mega_status st = MEGA_OK;
  if (n < 1 || n >= INT_MAX / 2)
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "--vocab-file %s is not GPT-2's vocab.json (an object of token -> id)",
                   s->vocab_file);
  if (st == MEGA_OK) st = check_vocab_ids(s->vocab_file, v, n, err);
  json_t *eod = st == MEGA_OK ? json_object_get(v, "<|endoftext|>") : NULL;
  int eod_id = eod ? (int)json_integer_value(eod) : -1; /* checked in range above */
  json_decref(v);
  if (st == MEGA_OK && s->merge_file) st = check_merges(s->merge_file, err);
  if (st == MEGA_OK) s->file_vocab = (int)n, s->file_eod = eod_id;
  return st;
}

/* ---- PREFIX.bin or PREFIX.idx for PREFIX ---- */

static bool regular(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A word of a data flag that names half of an indexed dataset: *prefix
 * (malloc'd) gets PREFIX. 0: not such a word (a PREFIX.bin without
 * PREFIX.idx is a plain file, its bytes the tokens); 1: PREFIX.bin and
 * PREFIX.idx are both here; -1: an index whose PREFIX.bin is missing. */
static int half_of_pair(const char *w, char **prefix) {
  size_t n = strlen(w);
  if (n < 5 || (strcmp(w + n - 4, ".bin") && strcmp(w + n - 4, ".idx"))) return 0;
  bool idx = !strcmp(w + n - 4, ".idx");
  if (!(*prefix = strndup(w, n - 4))) return 0;
  char other[PATH_MAX];
  snprintf(other, sizeof other, "%s%s", *prefix, idx ? ".bin" : ".idx");
  int h = regular(w) && regular(other) ? 1 : idx && regular(w) ? -1 : 0;
  if (!h) {
    free(*prefix);
    *prefix = NULL;
  }
  return h;
}

static mega_status fix_list(mega_jobspec *s, const char *flag, mega_strlist *l, bool rewrite,
                            char *note, size_t nn, mega_err *err) {
  for (int k = l->n > 1 ? 1 : 0; k < l->n; k += l->n > 1 ? 2 : 1) {
    char *prefix = NULL;
    int h = half_of_pair(l->v[k], &prefix);
    if (h == 1 && rewrite) {
      size_t len = strlen(note);
      snprintf(note + len, nn - len,
               "%s%s %s names one file of the indexed dataset %s (%s.bin and %s.idx): reading "
               "that dataset; give the prefix, as Megatron does", len ? "\n" : "", flag,
               l->v[k], prefix, prefix, prefix);
      free(l->v[k]);
      l->v[k] = prefix;
      continue;
    }
    mega_status st = MEGA_OK;
    if (h == 1)
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: %s %s names one file of the indexed dataset %s; give the "
                     "prefix, %s %s, as Megatron does (mega would otherwise read the file's "
                     "bytes as tokens)", flag, l->v[k], prefix, flag, prefix);
    else if (h == -1)
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: %s %s is the index of an indexed dataset, but %s.bin is not "
                     "there: the dataset is the pair %s.bin and %s.idx, given as %s %s (mega "
                     "never reads an index's bytes as tokens)", flag, l->v[k], prefix, prefix,
                     prefix, flag, prefix);
    free(prefix);
    if (st != MEGA_OK) return st;
  }
  (void)s;
  return MEGA_OK;
}

mega_status mega_jobspec_fix_data_paths(mega_jobspec *s, bool rewrite, char *note, size_t n,
                                        mega_err *err) {
  if (note && n) note[0] = '\0';
  char scratch[1];
  if (!note || !n) note = scratch, n = sizeof scratch, scratch[0] = '\0';
  mega_status st = fix_list(s, "--data-path", &s->data_path, rewrite, note, n, err);
  if (st == MEGA_OK)
    st = fix_list(s, "--train-data-path", &s->train_data_path, rewrite, note, n, err);
  if (st == MEGA_OK)
    st = fix_list(s, "--valid-data-path", &s->valid_data_path, rewrite, note, n, err);
  return st;
}

/* ---- relative paths, made absolute where the job was written ---- */

static mega_status absolutize(char **path, const char *cwd, mega_err *err) {
  if (!*path || (*path)[0] == '/') return MEGA_OK;
  const char *rel = (*path)[0] == '.' && (*path)[1] == '/' ? *path + 2 : *path;
  size_t n = strlen(cwd) + strlen(rel) + 2;
  char *abs = malloc(n);
  if (!abs) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  snprintf(abs, n, "%s/%s", cwd, rel);
  free(*path);
  *path = abs;
  return MEGA_OK;
}

mega_status mega_jobspec_absolute_paths(mega_jobspec *s, mega_err *err) {
  char *cwd = getcwd(NULL, 0);
  if (!cwd) return mega_fail(err, MEGA_ERR_IO, "cannot read the working directory");
  mega_status st = MEGA_OK;
  /* a blend's paths are its odd words; its weights stay as they are */
  mega_strlist *lists[] = {&s->data_path, &s->train_data_path, &s->valid_data_path};
  for (int l = 0; l < 3; l++)
    for (int k = lists[l]->n > 1 ? 1 : 0; st == MEGA_OK && k < lists[l]->n;
         k += lists[l]->n > 1 ? 2 : 1)
      st = absolutize(&lists[l]->v[k], cwd, err);
  /* every flag naming a file or a directory (the table says which) */
  int n = mega_jobspec_path_fields(s, NULL, 0);
  char ***paths = calloc((size_t)n + 1, sizeof *paths);
  if (st == MEGA_OK && !paths) st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  if (paths) mega_jobspec_path_fields(s, paths, n);
  for (int k = 0; st == MEGA_OK && k < n; k++) st = absolutize(paths[k], cwd, err);
  free(paths);
  free(cwd);
  return st;
}

mega_status mega_jobspec_resolve_dirs(mega_jobspec *s, mega_err *err) {
  char **dirs[] = {&s->save, &s->load, &s->data_cache_path};
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    if (!*dirs[i]) continue;
    char *real = mega_nf_resolve(*dirs[i]);
    if (!real && errno == ENOMEM) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    if (!real) continue;
    free(*dirs[i]);
    *dirs[i] = real;
  }
  return MEGA_OK;
}
