#include "worker/data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/data/data_blend.h"
#include "worker/data/gpt_order.h"
#include "worker/data/indexed.h"

/* One dataset: a plain file's bytes, or an indexed dataset's sequences. */
typedef struct source {
  char *path;
  const uint8_t *bytes; /* plain file, mapped read-only */
  size_t nbytes;
  mega_indexed *ix;
  int64_t *cum;         /* indexed: tokens before sequence k, sequences + 1 entries */
  int64_t ntok;
} source;

/* A run of a dataset's sequences [seq0, seq1) (a plain file: its bytes),
 * read as one token stream: a split, or the whole dataset. */
typedef struct stream {
  const source *src;
  int64_t seq0, seq1;
  int64_t base, ntok; /* first token in the dataset's concatenation, tokens */
  int64_t windows;
  mega_gpt_order *order; /* Megatron's order: its GPTDataset; NULL in file order */
} stream;

struct mega_data {
  int seq_len, vocab;
  bool megatron;         /* Megatron's order */
  int n, nv, nsrc;       /* training and valid datasets, sources opened */
  source *src;           /* n training sources, then nv valid ones */
  stream *train, *valid; /* valid: per training dataset with a split, or per valid
                            dataset (nv > 0); NULL without either */
  stream *test;          /* per training dataset: the split's test share; NULL without */
  char no_test[768];     /* why a test share asked for gave no test set; empty: it did not */
  mega_blend *blend;     /* NULL for one dataset */
  mega_blend *vblend;    /* the valid datasets' blend, NULL for fewer than two */
  /* --data-cache-path: what the order indices' cache did, for the log */
  int cache_read, cache_built;
  char cache_note[1024];
};

mega_status mega_batch_plan_init(mega_batch_plan *p, int global_batch, int micro_batch,
                                 int dp_size, mega_err *err) {
  if (global_batch < 1 || micro_batch < 1 || dp_size < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--global-batch-size, --micro-batch-size and the data-parallel size must be "
                     ">= 1 (got %d, %d, %d)", global_batch, micro_batch, dp_size);
  if (global_batch % (micro_batch * dp_size) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--global-batch-size (%d) must be a multiple of --micro-batch-size (%d) "
                     "times the data-parallel size (%d)", global_batch, micro_batch, dp_size);
  p->global_batch = global_batch;
  p->micro_batch = micro_batch;
  p->dp_size = dp_size;
  p->num_micro = global_batch / (micro_batch * dp_size);
  p->iter0 = p->sample0 = 0;
  return MEGA_OK;
}

int64_t mega_batch_plan_start(const mega_batch_plan *p, int64_t it) {
  return p->sample0 + (it - p->iter0) * p->global_batch;
}

mega_status mega_data_file_size(const char *path, long long *bytes, mega_err *err) {
  struct stat st;
  if (stat(path, &st) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot read --data-path '%s': %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return mega_fail(err, MEGA_ERR_IO, "--data-path '%s' is not a regular file", path);
  *bytes = (long long)st.st_size;
  return MEGA_OK;
}

/* A plain file has no documents for Megatron's GPTDataset to shuffle. */
#define PLAIN_FOR_MEGATRON                                                                   \
  "--data-order megatron reads Megatron's indexed datasets, but '%s' is a plain file (no "   \
  "%s.idx); preprocess it into PREFIX.bin/.idx (build/tools/preprocess) or use --data-order " \
  "file"

mega_status mega_data_probe(const mega_jobspec *job, long long *bytes, mega_err *err) {
  *bytes = -1;
  const char *p, *flag;
  for (int k = 0; (p = mega_jobspec_data_file(job, k, &flag)); k++) {
    struct stat st;
    if (mega_indexed_exists(p)) {
      char bin[4096];
      snprintf(bin, sizeof bin, "%s.bin", p);
      if (stat(bin, &st) != 0 || !S_ISREG(st.st_mode))
        return mega_fail(err, MEGA_ERR_IO,
                         "%s '%s': %s.idx is there but %s is %s; an indexed dataset is the pair "
                         "PREFIX.bin and PREFIX.idx", flag, p, p, bin,
                         stat(bin, &st) != 0 ? "missing" : "not a regular file");
      continue;
    }
    if (stat(p, &st) != 0)
      return mega_fail(err, MEGA_ERR_IO,
                       errno == ENOENT ? "cannot read %s '%s': there is no such file, nor an "
                                         "indexed dataset %s.bin and %s.idx"
                                       : "cannot read %s '%s': %s",
                       flag, p, errno == ENOENT ? p : strerror(errno), p);
    if (!S_ISREG(st.st_mode))
      return mega_fail(err, MEGA_ERR_IO, "%s '%s' is not a regular file", flag, p);
    if (job->data_order == MEGA_DATA_ORDER_MEGATRON)
      return mega_fail(err, MEGA_ERR_INVALID, PLAIN_FOR_MEGATRON, p, p);
    if (k == 0 && mega_jobspec_data_single(job)) *bytes = (long long)st.st_size;
  }
  return MEGA_OK;
}

/* ---- opening ---- */

static mega_status open_plain(source *s, mega_err *err) {
  int fd = open(s->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot open --data-path '%s': %s", s->path,
                     strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "--data-path '%s' is not a regular file", s->path);
  }
  s->nbytes = (size_t)st.st_size;
  s->ntok = (int64_t)s->nbytes;
  void *map = s->nbytes ? mmap(NULL, s->nbytes, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  int saved = errno;
  close(fd);
  if (map == MAP_FAILED)
    return mega_fail(err, MEGA_ERR_IO, "cannot map --data-path '%s': %s", s->path,
                     strerror(saved));
  s->bytes = map;
  return MEGA_OK;
}

static mega_status open_source(source *s, const char *path, mega_err *err) {
  if (!(s->path = strdup(path))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  if (!mega_indexed_exists(path)) return open_plain(s, err);
  mega_status st = mega_indexed_open(path, &s->ix, err);
  if (st != MEGA_OK) return st;
  int64_t n = mega_indexed_sequences(s->ix);
  if (!(s->cum = malloc((size_t)(n + 1) * sizeof *s->cum)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory indexing %s", path);
  s->cum[0] = 0;
  for (int64_t k = 0; k < n; k++) s->cum[k + 1] = s->cum[k] + mega_indexed_length(s->ix, k);
  s->ntok = s->cum[n];
  return MEGA_OK;
}

static void close_source(source *s) {
  if (s->bytes) munmap((void *)s->bytes, s->nbytes);
  mega_indexed_close(s->ix);
  free(s->cum);
  free(s->path);
}

/* Megatron's get_split_indices: split points round(share * count), ties to
 * even as Python's round, then all moved so the last is count (kept in
 * 0..count and in order, where Megatron's would leave them). */
static void split_points(const double shares[3], int64_t count, int64_t pts[4]) {
  pts[0] = 0;
  for (int k = 0; k < 3; k++) pts[k + 1] = pts[k] + (int64_t)nearbyint(shares[k] * (double)count);
  int64_t diff = pts[3] - count;
  for (int k = 1; k < 4; k++) {
    pts[k] -= diff;
    if (pts[k] < pts[k - 1]) pts[k] = pts[k - 1];
  }
}

/* Megatron-LM core's split (BlendedMegatronDatasetConfig's split_matrix):
 * the shares' running sums, each bound round(sum x count), ties to even
 * as Python's round. Used with Megatron's order, whose datasets it makes. */
static void core_split_points(const double shares[3], int64_t count, int64_t pts[4]) {
  double cum = 0;
  pts[0] = 0;
  for (int k = 0; k < 3; k++) {
    cum += shares[k];
    pts[k + 1] = (int64_t)nearbyint(cum * (double)count);
  }
}

static mega_status make_stream(const source *src, int64_t seq0, int64_t seq1, int T,
                               const char *what, stream *out, mega_err *err) {
  *out = (stream){.src = src, .seq0 = seq0, .seq1 = seq1};
  if (src->ix) {
    out->base = src->cum[seq0];
    out->ntok = src->cum[seq1] - src->cum[seq0];
  } else {
    out->ntok = src->ntok;
  }
  if (out->ntok < (int64_t)T + 1) {
    if (!src->ix)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--data-path '%s' holds %lld bytes, fewer than one window of "
                       "--seq-length %d plus 1 target byte (%d); use a larger file or a shorter "
                       "--seq-length", src->path, (long long)out->ntok, T, T + 1);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s%s (sequences %lld..%lld) holds %lld tokens, fewer than one window of "
                     "--seq-length %d plus 1 target (%d); use more data%s or a shorter "
                     "--seq-length", src->path, what, (long long)seq0, (long long)seq1,
                     (long long)out->ntok, T, T + 1, *what ? ", another --split" : "");
  }
  out->windows = (out->ntok - 1) / T;
  return MEGA_OK;
}

/* Megatron's BlendedMegatronDatasetBuilder: the samples it asks of dataset
 * k of a blend of `size` samples, ceil(ceil(size * w_k) * (1 + 0.005))
 * with w normalized (its _get_size_per_split_per_dataset with the default
 * mid_level_dataset_surplus); a lone dataset is asked for size. */
static int64_t megatron_size(const double *weights, int n, int k, bool blend, int64_t size) {
  if (!blend) return size;
  double sum = 0;
  for (int d = 0; d < n; d++) sum += weights[d];
  return (int64_t)ceil(ceil((double)size * (weights[k] / sum)) * (1 + 0.005));
}

static mega_status build_order(mega_data *d, stream *s, uint32_t seed, int64_t samples,
                               const char *cache, const char *what, mega_err *err) {
  if (!s->src->ix)
    return mega_fail(err, MEGA_ERR_INVALID, PLAIN_FOR_MEGATRON, s->src->path, s->src->path);
  if (samples < 1) samples = 1;
  mega_err sub = {0};
  mega_status st;
  if (!cache) {
    st = mega_gpt_order_build(s->src->cum, s->seq0, s->seq1, d->seq_len, samples, seed,
                              &s->order, &sub);
  } else {
    mega_gpt_cache_how how;
    char why[512];
    st = mega_gpt_order_open(s->src->cum, s->seq0, s->seq1, d->seq_len, samples, seed, cache,
                             &s->order, &how, why, sizeof why, &sub);
    if (st == MEGA_OK && how == MEGA_GPT_CACHE_READ) d->cache_read++;
    if (st == MEGA_OK && how != MEGA_GPT_CACHE_READ) d->cache_built++;
    size_t used = strlen(d->cache_note);
    if (st == MEGA_OK && how == MEGA_GPT_CACHE_REBUILT && used < sizeof d->cache_note)
      snprintf(d->cache_note + used, sizeof d->cache_note - used, "; replaced %s", why);
  }
  if (st != MEGA_OK)
    return mega_fail(err, st, "%s%s: Megatron's data order: %s", s->src->path, what, sub.msg);
  return MEGA_OK;
}

/* Each stream's GPTDataset, built for the samples Megatron asks of it. */
static mega_status build_orders(mega_data *d, const double *weights, const mega_data_opts *o,
                                mega_err *err) {
  bool blend = weights && (d->n > 1 || o->train_blend_of_one);
  mega_status st = MEGA_OK;
  for (int k = 0; k < d->n && st == MEGA_OK; k++)
    st = build_order(d, &d->train[k], o->seed,
                     megatron_size(weights, d->n, k, blend, o->train_samples), o->cache_dir,
                     o->split ? "'s train split" : "", err);
  /* Megatron's test dataset: --eval-iters x G samples, the split's third share */
  for (int k = 0; d->test && k < d->n && st == MEGA_OK; k++)
    st = build_order(d, &d->test[k], o->seed,
                     megatron_size(weights, d->n, k, blend, o->test_samples), o->cache_dir,
                     "'s test split", err);
  if (!d->valid) return st;
  if (d->nv) {
    for (int k = 0; k < d->nv && st == MEGA_OK; k++)
      st = build_order(d, &d->valid[k], o->seed,
                       megatron_size(o->valid_weights, d->nv, k, d->nv > 1, o->valid_samples),
                       o->cache_dir, " (--valid-data-path)", err);
  } else {
    for (int k = 0; k < d->n && st == MEGA_OK; k++)
      st = build_order(d, &d->valid[k], o->seed,
                       megatron_size(weights, d->n, k, blend, o->valid_samples), o->cache_dir,
                       "'s valid split", err);
  }
  return st;
}

mega_status mega_data_open_set(const char *const *paths, const double *weights, int n,
                               const mega_data_opts *o, mega_data **out, mega_err *err) {
  *out = NULL;
  int T = o->seq_len;
  if (T < 1) return mega_fail(err, MEGA_ERR_INVALID, "--seq-length must be >= 1 (got %d)", T);
  if (n < 1) return mega_fail(err, MEGA_ERR_INVALID, "--data-path names no dataset");
  mega_data *d = calloc(1, sizeof *d);
  if (!d) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening the data");
  d->seq_len = T;
  d->vocab = o->vocab > 0 ? o->vocab : MEGA_VOCAB_SIZE;
  d->n = n;
  d->nv = o->valid_n > 0 ? o->valid_n : 0;
  d->src = calloc((size_t)(n + d->nv), sizeof *d->src);
  d->train = calloc((size_t)n, sizeof *d->train);
  bool valid = (o->split && o->eval) || d->nv;
  if (valid) d->valid = calloc((size_t)(d->nv ? d->nv : n), sizeof *d->valid);
  if (o->split && o->test) d->test = calloc((size_t)n, sizeof *d->test);
  mega_status st = d->src && d->train && (!valid || d->valid) && (!o->split || !o->test || d->test)
                       ? MEGA_OK
                       : mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening the data");
  bool no_test = false;
  for (int k = 0; k < n && st == MEGA_OK; k++) {
    source *s = &d->src[k];
    d->nsrc = k + 1; /* closed on failure too */
    st = open_source(s, paths[k], err);
    if (st == MEGA_OK && o->split && !s->ix)
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--split divides an indexed dataset's documents, but '%s' is a plain file "
                     "(no %s.idx); drop --split or preprocess it into PREFIX.bin/.idx",
                     s->path, s->path);
    if (st != MEGA_OK) break;
    int64_t nseq = s->ix ? mega_indexed_sequences(s->ix) : 0;
    if (!o->split) {
      st = make_stream(s, 0, nseq, T, "", &d->train[k], err);
      continue;
    }
    int64_t pts[4];
    if (o->megatron) core_split_points(o->shares, nseq, pts);
    else split_points(o->shares, nseq, pts);
    st = make_stream(s, pts[0], pts[1], T, "'s train split", &d->train[k], err);
    if (st == MEGA_OK && o->eval)
      st = make_stream(s, pts[1], pts[2], T, "'s valid split", &d->valid[k], err);
    /* a test share too small for a window gives no test set: it was never
     * read before the end of training evaluated it, so refuse no job for
     * it, but keep why for the user */
    mega_err none = {0};
    if (st == MEGA_OK && d->test && !no_test &&
        make_stream(s, pts[2], pts[3], T, "'s test split", &d->test[k], &none) != MEGA_OK) {
      no_test = true;
      snprintf(d->no_test, sizeof d->no_test, "%s", none.msg);
    }
  }
  for (int k = 0; k < d->nv && st == MEGA_OK; k++) {
    source *s = &d->src[n + k];
    d->nsrc = n + k + 1;
    st = open_source(s, o->valid_paths[k], err);
    int64_t nseq = s->ix ? mega_indexed_sequences(s->ix) : 0;
    if (st == MEGA_OK) st = make_stream(s, 0, nseq, T, " (--valid-data-path)", &d->valid[k], err);
  }
  if (no_test) {
    free(d->test);
    d->test = NULL;
  }
  d->megatron = o->megatron;
  if (st == MEGA_OK && o->megatron) st = build_orders(d, weights, o, err);
  if (st == MEGA_OK && n > 1) st = mega_blend_create(weights, n, o->samples, &d->blend, err);
  if (st == MEGA_OK && d->nv > 1)
    st = mega_blend_create(o->valid_weights, d->nv, o->samples, &d->vblend, err);
  if (st != MEGA_OK) {
    mega_data_close(d);
    return st;
  }
  *out = d;
  return MEGA_OK;
}

mega_status mega_data_open(const char *path, int seq_len, mega_data **out, mega_err *err) {
  mega_data_opts o = {.seq_len = seq_len};
  return mega_data_open_set(&path, NULL, 1, &o, out, err);
}

mega_status mega_data_open_job(const mega_jobspec *j, mega_data **out, mega_err *err) {
  int n = mega_jobspec_data_count(j), nv = mega_jobspec_blend_count(&j->valid_data_path);
  const char **paths = calloc((size_t)(n + nv + 1), sizeof *paths);
  double *weights = calloc((size_t)(n + nv + 1), sizeof *weights);
  mega_data_opts o = {.seq_len = j->seq_length, .vocab = mega_jobspec_tokenizer_vocab(j),
                      .split = j->split != NULL, .eval = mega_jobspec_evaluates_at_end(j),
                      .test = mega_jobspec_tests_at_end(j)};
  /* training samples, and as many evaluation ones as the job can read */
  int64_t iters = mega_jobspec_train_iters(j), G = j->global_batch_size;
  int64_t evals = mega_jobspec_eval_batches(j);
  o.samples = mega_jobspec_samples_before(j, iters);
  if (evals * G > o.samples) o.samples = evals * G;
  /* Megatron's train_valid_test_num_samples: --train-samples, else
   * --train-iters x G; (train iterations / --eval-interval + 1) x
   * --eval-iters x G; --eval-iters x G for the test split */
  o.megatron = j->data_order == MEGA_DATA_ORDER_MEGATRON;
  o.seed = (uint32_t)j->seed;
  o.cache_dir = j->data_cache_path;
  o.train_samples = j->train_samples >= 0 ? j->train_samples : iters * G;
  o.valid_samples = evals * G;
  o.test_samples = o.test ? (int64_t)j->eval_iters * G : 0;
  /* --data-path W P is a blend of one to Megatron (its get_blend_from_list
   * reads weights from a list of even length); --train-data-path's lone
   * dataset is built as it is */
  o.train_blend_of_one = j->data_path.n == 2;
  mega_status st = paths && weights ? mega_jobspec_split(j, o.shares, err)
                                    : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (int k = 0; k < n && st == MEGA_OK; k++) {
    paths[k] = mega_jobspec_data_prefix(j, k);
    weights[k] = mega_jobspec_data_weight(j, k);
  }
  for (int k = 0; k < nv && st == MEGA_OK; k++) {
    paths[n + k] = mega_jobspec_blend_prefix(&j->valid_data_path, k);
    weights[n + k] = mega_jobspec_blend_weight(&j->valid_data_path, k);
  }
  o.valid_paths = paths + n;
  o.valid_weights = weights + n;
  o.valid_n = nv;
  if (st == MEGA_OK) st = mega_data_open_set(paths, weights, n, &o, out, err);
  free(paths);
  free(weights);
  return st;
}

void mega_data_close(mega_data *d) {
  if (!d) return;
  for (int k = 0; k < d->nsrc; k++) close_source(&d->src[k]);
  for (int k = 0; k < d->n && d->train; k++) mega_gpt_order_free(d->train[k].order);
  for (int k = 0; k < (d->nv ? d->nv : d->n) && d->valid; k++)
    mega_gpt_order_free(d->valid[k].order);
  for (int k = 0; k < d->n && d->test; k++) mega_gpt_order_free(d->test[k].order);
  mega_blend_destroy(d->blend);
  mega_blend_destroy(d->vblend);
  free(d->src);
  free(d->train);
  free(d->valid);
  free(d->test);
  free(d);
}

bool mega_data_cache_note(const mega_data *d, char *buf, size_t n) {
  if (d->cache_read + d->cache_built == 0) return false;
  snprintf(buf, n, "Megatron's order: %d index%s read from --data-cache-path, %d built and "
           "written there%s", d->cache_read, d->cache_read == 1 ? "" : "es", d->cache_built,
           d->cache_note);
  return true;
}

size_t mega_data_size(const mega_data *d) { return (size_t)d->src[0].ntok; }
int64_t mega_data_windows(const mega_data *d) { return d->train[0].windows; }
int mega_data_seq_len(const mega_data *d) { return d->seq_len; }

/* ---- the order ---- */

/* The stream of dataset k that `which` reads (the test split's: NULL
 * without one). */
static const stream *stream_of(const mega_data *d, mega_data_which which, int k) {
  if (which == MEGA_DATA_TEST) return d->test ? &d->test[k] : NULL;
  return which == MEGA_DATA_VALID && d->valid ? &d->valid[k] : &d->train[k];
}

static void source_of(const mega_data *d, int64_t s, mega_data_which which, int *dataset,
                      int64_t *window) {
  bool eval = which == MEGA_DATA_VALID;
  int k = 0;
  int64_t c = s;
  const mega_blend *b = eval && d->nv ? d->vblend : d->blend;
  if (b) mega_blend_source(b, s, &k, &c);
  if (d->megatron) { /* the GPTDataset's sample number */
    *dataset = k;
    *window = c;
    return;
  }
  const stream *st = stream_of(d, which, k);
  int64_t w = c % st->windows;
  *dataset = k;
  *window = eval && !d->valid ? st->windows - 1 - w : w;
}

void mega_data_sample_source(const mega_data *d, int64_t s, bool eval, int *dataset,
                             int64_t *window) {
  source_of(d, s, eval ? MEGA_DATA_VALID : MEGA_DATA_TRAIN, dataset, window);
}

bool mega_data_has_test(const mega_data *d) { return d->test != NULL; }
const char *mega_data_no_test(const mega_data *d) { return d->no_test[0] ? d->no_test : NULL; }

int64_t mega_data_sample_window(const mega_data *d, int64_t iteration, int global_batch,
                                int sample) {
  /* (i*G + j) mod K without overflow for any realistic i: reduce each term. */
  int64_t K = d->train[0].windows;
  int64_t a = (iteration % K) * ((int64_t)global_batch % K) % K;
  return (a + sample % K) % K;
}

int mega_batch_first_sample(const mega_batch_plan *p, int dp_rank, int micro) {
  return dp_rank * (p->global_batch / p->dp_size) + micro * p->micro_batch;
}

/* Tokens [pos, pos + n) of a stream into out, ids checked. */
static mega_status read_tokens(const mega_data *d, const stream *st, int64_t pos, int n,
                               int32_t *out, mega_err *err) {
  const source *s = st->src;
  if (!s->ix) {
    const uint8_t *b = s->bytes + pos;
    for (int t = 0; t < n; t++) {
      if (b[t] >= d->vocab)
        return mega_fail(err, MEGA_ERR_INVALID,
                         "%s: byte %lld is %d, not a token id of the vocabulary 0..%d "
                         "(--vocab-size N allows ids 0..N)", s->path, (long long)(pos + t),
                         b[t], d->vocab - 1);
      out[t] = b[t];
    }
    return MEGA_OK;
  }
  int64_t at = st->base + pos;
  /* the last sequence starting at or before at */
  int64_t lo = st->seq0, hi = st->seq1 - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (s->cum[mid] <= at) lo = mid;
    else hi = mid - 1;
  }
  for (int64_t q = lo; n > 0; q++) {
    int64_t off = at - s->cum[q], len = s->cum[q + 1] - s->cum[q];
    int64_t take = len - off < n ? len - off : n;
    if (take <= 0) continue; /* an empty sequence */
    mega_status r = mega_indexed_read(s->ix, q, off, take, d->vocab, out, err);
    if (r != MEGA_OK) return r;
    out += take, n -= (int)take, at += take;
  }
  return MEGA_OK;
}

/* Megatron's sample c of a stream, T + 1 tokens, into out: its pieces of
 * documents as GPTDataset's _query_document_sample_shuffle_indices reads
 * them. */
static mega_status read_megatron_sample(const mega_data *d, const stream *st, int64_t c,
                                        int32_t *out, mega_err *err) {
  const source *s = st->src;
  if (c >= mega_gpt_order_samples(st->order))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: sample %lld is past the %lld of Megatron's data order, which holds "
                     "what the job's flags ask for (--train-iters or --train-samples, "
                     "--eval-interval and --eval-iters); ask for more samples there",
                     s->path, (long long)c, (long long)mega_gpt_order_samples(st->order));
  int64_t first, first_off, last, last_off;
  mega_gpt_order_sample(st->order, c, &first, &first_off, &last, &last_off);
  int64_t got = 0, want = (int64_t)d->seq_len + 1;
  for (int64_t p = first; p <= last; p++) {
    int64_t doc = mega_gpt_order_document(st->order, p);
    int64_t off = p == first ? first_off : 0;
    int64_t end = p == last ? last_off + 1 : s->cum[doc + 1] - s->cum[doc];
    int64_t n = end - off;
    if (n <= 0) continue;
    if (off < 0 || end > s->cum[doc + 1] - s->cum[doc])
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: Megatron's sample %lld lies outside document %lld (an index built "
                       "wrong)", s->path, (long long)c, (long long)doc);
    if (got + n > want) break;
    mega_status r = mega_indexed_read(s->ix, doc, off, n, d->vocab, out + got, err);
    if (r != MEGA_OK) return r;
    got += n;
  }
  if (got != want)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: Megatron's sample %lld holds %lld tokens, not %lld (an index built "
                     "wrong)", s->path, (long long)c, (long long)got, (long long)want);
  return MEGA_OK;
}

/* Copies microbatch `micro` of DP rank dp_rank. */
static mega_status copy_microbatch(const mega_data *d, const mega_batch_plan *p, int64_t iteration,
                                   int dp_rank, int micro, mega_data_which which,
                                   int32_t *tokens, int32_t *targets, mega_err *err) {
  bool eval = which != MEGA_DATA_TRAIN;
  if (iteration < 0 || dp_rank < 0 || dp_rank >= p->dp_size || micro < 0 ||
      micro >= p->num_micro)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "no microbatch %d of DP rank %d in %siteration %lld (%d microbatches, DP %d)",
                     micro, dp_rank, eval ? "evaluation " : "", (long long)iteration,
                     p->num_micro, p->dp_size);
  if (which == MEGA_DATA_TEST && !d->test)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the job has no test data: a --split with a test share (its third) gives "
                     "one");
  if (d->megatron && which == MEGA_DATA_VALID && !d->valid)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--data-order megatron evaluates only on a valid split (--split) or on "
                     "--valid-data-path, as Megatron does");
  int T = d->seq_len;
  int first = mega_batch_first_sample(p, dp_rank, micro);
  int32_t *buf = malloc(((size_t)T + 1) * sizeof *buf);
  if (!buf) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading a window");
  mega_status st = MEGA_OK;
  for (int b = 0; b < p->micro_batch && st == MEGA_OK; b++) {
    int k;
    int64_t w;
    source_of(d, mega_batch_plan_start(p, iteration) + first + b, which, &k, &w);
    const stream *s = stream_of(d, which, k);
    st = d->megatron ? read_megatron_sample(d, s, w, buf, err)
                     : read_tokens(d, s, w * T, T + 1, buf, err);
    memcpy(tokens + (size_t)b * T, buf, (size_t)T * sizeof *buf);
    memcpy(targets + (size_t)b * T, buf + 1, (size_t)T * sizeof *buf);
  }
  free(buf);
  return st;
}

mega_status mega_data_microbatch(const mega_data *d, const mega_batch_plan *p, int64_t iteration,
                                 int dp_rank, int micro, int32_t *tokens, int32_t *targets,
                                 mega_err *err) {
  return copy_microbatch(d, p, iteration, dp_rank, micro, MEGA_DATA_TRAIN, tokens, targets, err);
}

mega_status mega_data_eval_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t eval_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err) {
  return copy_microbatch(d, p, eval_iteration, dp_rank, micro, MEGA_DATA_VALID, tokens, targets,
                         err);
}

mega_status mega_data_test_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t test_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err) {
  return copy_microbatch(d, p, test_iteration, dp_rank, micro, MEGA_DATA_TEST, tokens, targets,
                         err);
}

int mega_data_variable_seq_len(int seq_len, const mega_batch_plan *p, int64_t iteration,
                               int first_sample) {
  int64_t k = mega_batch_plan_start(p, iteration) / p->micro_batch + first_sample / p->micro_batch;
  return seq_len - (int)(k % 4) * (seq_len / 8);
}
