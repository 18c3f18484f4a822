#include "worker/data/indexed.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/nofollow.h"

#define HEADER 34 /* magic 9, version 8, dtype 1, sequence count 8, document count 8 */

static const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

/* Bytes per token of dtype code c (index), 0 for an unknown code. */
static const int itemsize[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};

struct mega_indexed {
  char *idx_path, *bin_path;
  const uint8_t *idx, *bin; /* mapped read-only; bin NULL when empty */
  size_t idx_n, bin_n;
  int dtype, size;
  int64_t nseq, ndoc;
  const uint8_t *lengths, *pointers, *docs; /* int32[nseq], int64[nseq], int64[ndoc], unaligned */
};

bool mega_indexed_exists(const char *prefix) {
  char path[4096];
  struct stat st;
  snprintf(path, sizeof path, "%s.idx", prefix);
  return stat(path, &st) == 0;
}

static int64_t get_i64(const uint8_t *p) {
  int64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

static int32_t get_i32(const uint8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* Maps path read-only; an empty file maps to NULL with *n 0. */
static mega_status map_file(const char *path, const uint8_t **out, size_t *n, mega_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mega_fail(err, MEGA_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "%s is not a regular file", path);
  }
  *n = (size_t)st.st_size;
  *out = NULL;
  if (*n) {
    void *m = mmap(NULL, *n, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (m == MAP_FAILED) return mega_fail(err, MEGA_ERR_IO, "cannot map %s: %s", path, strerror(saved));
    *out = m;
    return MEGA_OK;
  }
  close(fd);
  return MEGA_OK;
}

/* The header and the three arrays fit in the index. */
static mega_status check_index(mega_indexed *x, mega_err *err) {
  const char *p = x->idx_path;
  if (x->idx_n < 9 || memcmp(x->idx, magic, 9) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s is not a Megatron indexed dataset: its first bytes are not the magic "
                     "MMIDIDX\\0\\0 (write it with Megatron's tools/preprocess_data.py)", p);
  if (x->idx_n < HEADER)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s is truncated: %zu bytes, shorter than the %d-byte header", p, x->idx_n,
                     HEADER);
  int64_t version = get_i64(x->idx + 9);
  if (version != 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s has index version %lld; mega reads version 1 (Megatron's MMIDIDX)", p,
                     (long long)version);
  x->dtype = x->idx[17];
  if (x->dtype < 1 || x->dtype > 8)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s has unknown dtype code %d; known codes: 1 uint8, 2 int8, 3 int16, "
                     "4 int32, 5 int64, 6 float64, 7 float32, 8 uint16", p, x->dtype);
  x->size = itemsize[x->dtype];
  x->nseq = get_i64(x->idx + 18);
  x->ndoc = get_i64(x->idx + 26);
  uint64_t room = (uint64_t)(x->idx_n - HEADER);
  /* 12 bytes per sequence, 8 per document, without overflow */
  if (x->nseq < 0 || x->ndoc < 0 || (uint64_t)x->nseq > room / 12 ||
      (uint64_t)x->ndoc > (room - 12 * (uint64_t)x->nseq) / 8)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s is truncated: %zu bytes cannot hold the %lld sequences and %lld "
                     "documents its header announces (%d + 12 x sequences + 8 x documents bytes)",
                     p, x->idx_n, (long long)x->nseq, (long long)x->ndoc, HEADER);
  x->lengths = x->idx + HEADER;
  x->pointers = x->lengths + 4 * x->nseq;
  x->docs = x->pointers + 8 * x->nseq;
  return MEGA_OK;
}

/* Every sequence lies inside .bin; the document indices are in order. */
static mega_status check_sequences(const mega_indexed *x, mega_err *err) {
  for (int64_t i = 0; i < x->nseq; i++) {
    int64_t len = get_i32(x->lengths + 4 * i), ptr = get_i64(x->pointers + 8 * i);
    if (len < 0)
      return mega_fail(err, MEGA_ERR_INVALID, "%s: sequence %lld has a negative length (%lld)",
                       x->idx_path, (long long)i, (long long)len);
    uint64_t bytes = (uint64_t)len * (uint64_t)x->size;
    if (ptr < 0 || (uint64_t)ptr > x->bin_n || bytes > x->bin_n - (uint64_t)ptr)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: sequence %lld (%lld tokens at byte %lld) runs past the end of %s "
                       "(%zu bytes); the index does not belong to this .bin, or it is truncated",
                       x->idx_path, (long long)i, (long long)len, (long long)ptr, x->bin_path,
                       x->bin_n);
  }
  int64_t prev = 0;
  for (int64_t k = 0; k < x->ndoc; k++) {
    int64_t d = get_i64(x->docs + 8 * k);
    if (d < prev || d > x->nseq)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: document index %lld is %lld, outside %lld..%lld (the indices must "
                       "rise from 0 to the sequence count)", x->idx_path, (long long)k,
                       (long long)d, (long long)prev, (long long)x->nseq);
    prev = d;
  }
  return MEGA_OK;
}

mega_status mega_indexed_open(const char *prefix, mega_indexed **out, mega_err *err) {
  *out = NULL;
  mega_indexed *x = calloc(1, sizeof *x);
  if (!x || asprintf(&x->idx_path, "%s.idx", prefix) < 0 ||
      asprintf(&x->bin_path, "%s.bin", prefix) < 0) {
    if (x) free(x->idx_path);
    free(x);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening %s", prefix);
  }
  mega_status st = map_file(x->idx_path, &x->idx, &x->idx_n, err);
  if (st == MEGA_OK) st = check_index(x, err);
  if (st == MEGA_OK) st = map_file(x->bin_path, &x->bin, &x->bin_n, err);
  if (st == MEGA_OK) st = check_sequences(x, err);
  if (st != MEGA_OK) {
    mega_indexed_close(x);
    return st;
  }
  *out = x;
  return MEGA_OK;
}

void mega_indexed_close(mega_indexed *x) {
  if (!x) return;
  if (x->idx) munmap((void *)x->idx, x->idx_n);
  if (x->bin) munmap((void *)x->bin, x->bin_n);
  free(x->idx_path);
  free(x->bin_path);
  free(x);
}

int64_t mega_indexed_sequences(const mega_indexed *x) { return x->nseq; }
int64_t mega_indexed_documents(const mega_indexed *x) { return x->ndoc; }
int mega_indexed_dtype(const mega_indexed *x) { return x->dtype; }
int64_t mega_indexed_length(const mega_indexed *x, int64_t i) { return get_i32(x->lengths + 4 * i); }

/* Token p of a sequence starting at b, as a double (exact for every
 * integer dtype but int64 past 2^53, which no vocabulary reaches). */
static double token(const mega_indexed *x, const uint8_t *b) {
  switch (x->dtype) {
  case 1: return *b;
  case 2: return (int8_t)*b;
  case 3: { int16_t v; memcpy(&v, b, 2); return v; }
  case 4: return get_i32(b);
  case 5: return (double)get_i64(b);
  case 6: { double v; memcpy(&v, b, 8); return v; }
  case 7: { float v; memcpy(&v, b, 4); return v; }
  default: { uint16_t v; memcpy(&v, b, 2); return v; }
  }
}

mega_status mega_indexed_read(const mega_indexed *x, int64_t seq, int64_t off, int64_t n,
                              int vocab, int32_t *out, mega_err *err) {
  if (n <= 0) return MEGA_OK; /* an empty .bin is not mapped: no pointer to offset */
  const uint8_t *b = x->bin + get_i64(x->pointers + 8 * seq) + off * x->size;
  for (int64_t k = 0; k < n; k++, b += x->size) {
    double v = token(x, b);
    if (!(v >= 0 && v < vocab) || v != floor(v))
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: token %lld of sequence %lld is %.17g, not a token id of the "
                       "vocabulary 0..%d (give the tokenizer the data was made with: "
                       "--tokenizer-type and its --vocab-size or --vocab-file)",
                       x->bin_path, (long long)(off + k), (long long)seq, v, vocab - 1);
    out[k] = (int32_t)v;
  }
  return MEGA_OK;
}

/* ---- writing ---- */

struct mega_indexed_writer {
  char *prefix;
  char *bin_tmp, *idx_tmp; /* written here, renamed to PREFIX.bin/.idx when whole */
  FILE *bin;
  int dtype;
  int32_t *lengths;
  int64_t *pointers, offset;
  size_t n, cap;
  int64_t *docs; /* Megatron's document_indices: the sequence count after each document */
  size_t ndocs, docs_cap;
};

static void writer_free(mega_indexed_writer *w) {
  free(w->docs);
  free(w->lengths);
  free(w->pointers);
  free(w->bin_tmp);
  free(w->idx_tmp);
  free(w->prefix);
  free(w);
}

mega_status mega_indexed_writer_open(const char *prefix, int dtype, mega_indexed_writer **out,
                                     mega_err *err) {
  *out = NULL;
  if (dtype < 1 || dtype > 8)
    return mega_fail(err, MEGA_ERR_INVALID, "unknown dtype code %d", dtype);
  mega_indexed_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->prefix = strdup(prefix)) || asprintf(&w->bin_tmp, "%s.bin.tmp", prefix) < 0 ||
      asprintf(&w->idx_tmp, "%s.idx.tmp", prefix) < 0) {
    if (w) writer_free(w);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  w->dtype = dtype;
  w->bin = fopen(w->bin_tmp, "wb");
  if (!w->bin) {
    mega_status st = mega_fail(err, MEGA_ERR_IO, "cannot write %s.bin: %s", prefix, strerror(errno));
    writer_free(w);
    return st;
  }
  *out = w;
  return MEGA_OK;
}

mega_status mega_indexed_writer_add(mega_indexed_writer *w, const int32_t *ids, size_t n,
                                    mega_err *err) {
  if (n > INT32_MAX) return mega_fail(err, MEGA_ERR_INVALID, "a document of %zu tokens", n);
  if (w->ndocs == w->docs_cap) {
    size_t cap = w->docs_cap ? 2 * w->docs_cap : 1024;
    int64_t *d = realloc(w->docs, cap * sizeof *d);
    if (!d) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    w->docs = d;
    w->docs_cap = cap;
  }
  if (n == 0) { /* Megatron: a document, but no sequence */
    w->docs[w->ndocs++] = (int64_t)w->n;
    return MEGA_OK;
  }
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 1024;
    int32_t *l = realloc(w->lengths, cap * sizeof *l);
    if (l) w->lengths = l;
    int64_t *p = l ? realloc(w->pointers, cap * sizeof *p) : NULL;
    if (!p) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    w->pointers = p;
    w->cap = cap;
  }
  int size = itemsize[w->dtype];
  for (size_t k = 0; k < n; k++) {
    uint8_t b[8];
    int32_t v = ids[k];
    switch (w->dtype) {
    case 1: case 2: b[0] = (uint8_t)v; break;
    case 3: case 8: { uint16_t x = (uint16_t)v; memcpy(b, &x, 2); break; }
    case 4: memcpy(b, &v, 4); break;
    case 5: { int64_t x = v; memcpy(b, &x, 8); break; }
    case 6: { double x = v; memcpy(b, &x, 8); break; }
    default: { float x = (float)v; memcpy(b, &x, 4); break; }
    }
    if (fwrite(b, (size_t)size, 1, w->bin) != 1)
      return mega_fail(err, MEGA_ERR_IO, "cannot write %s.bin: %s", w->prefix, strerror(errno));
  }
  w->lengths[w->n] = (int32_t)n;
  w->pointers[w->n++] = w->offset;
  w->offset += (int64_t)n * size;
  w->docs[w->ndocs++] = (int64_t)w->n;
  return MEGA_OK;
}

/* f's buffered bytes on the disk: a rename after it then never names an
 * empty or partial file, even after a crash. */
static bool flush_sync(FILE *f) { return fflush(f) == 0 && fsync(fileno(f)) == 0; }

/* PREFIX.idx.tmp from the lengths and pointers. */
static mega_status write_index(const mega_indexed_writer *w, mega_err *err) {
  FILE *f = fopen(w->idx_tmp, "wb");
  if (!f) return mega_fail(err, MEGA_ERR_IO, "cannot write %s.idx: %s", w->prefix, strerror(errno));
  uint64_t version = 1, nseq = w->n, ndoc = w->ndocs + 1;
  uint8_t dt = (uint8_t)w->dtype;
  bool ok = fwrite(magic, 9, 1, f) == 1 && fwrite(&version, 8, 1, f) == 1 &&
            fwrite(&dt, 1, 1, f) == 1 && fwrite(&nseq, 8, 1, f) == 1 &&
            fwrite(&ndoc, 8, 1, f) == 1 &&
            fwrite(w->lengths, 4, w->n, f) == w->n && fwrite(w->pointers, 8, w->n, f) == w->n;
  int64_t zero = 0;
  ok = ok && fwrite(&zero, 8, 1, f) == 1 && fwrite(w->docs, 8, w->ndocs, f) == w->ndocs;
  ok = ok && flush_sync(f);
  if (fclose(f) != 0 || !ok)
    return mega_fail(err, MEGA_ERR_IO, "cannot write %s.idx: %s", w->prefix, strerror(errno));
  return MEGA_OK;
}

/* fsyncs the directory holding path, so its new names survive a crash. */
static mega_status sync_parent(const char *path, mega_err *err) {
  char *dir = strdup(path), link[4096] = "", why[4200];
  if (!dir) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  char *real = mega_nf_resolve(dirname(dir)); /* the user's links, followed once */
  int rc = real ? mega_nf_fsync(real, link, sizeof link) : -1;
  mega_status st = rc == 0 ? MEGA_OK
                           : mega_fail(err, MEGA_ERR_IO, "cannot sync the directory of %s: %s",
                                       path, mega_nf_why(errno, link, why, sizeof why));
  free(real);
  free(dir);
  return st;
}

/* The .bin first, then the .idx that makes the pair a dataset. Two
 * renames are not one step, so a .bin that was there is kept under a hard
 * link (PREFIX.bin.old) until the .idx is in place: if that rename fails,
 * the old .bin goes back and the dataset that was there stays whole. */
static mega_status rename_into_place(const mega_indexed_writer *w, mega_err *err) {
  char *bin = NULL, *idx = NULL, *old = NULL;
  mega_status st = MEGA_OK;
  if (asprintf(&bin, "%s.bin", w->prefix) < 0 || asprintf(&idx, "%s.idx", w->prefix) < 0 ||
      asprintf(&old, "%s.bin.old", w->prefix) < 0) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    goto out;
  }
  unlink(old);
  bool kept = link(bin, old) == 0, none = !kept && errno == ENOENT;
  if (rename(w->bin_tmp, bin) != 0) {
    st = mega_fail(err, MEGA_ERR_IO, "cannot write %s.bin: %s", w->prefix, strerror(errno));
  } else if (rename(w->idx_tmp, idx) != 0) {
    st = mega_fail(err, MEGA_ERR_IO, "cannot write %s.idx: %s", w->prefix, strerror(errno));
    if (kept) rename(old, bin); /* the .bin that was there, back */
    else if (none) unlink(bin); /* there was none: leave none */
    kept = false;
  }
  if (kept) unlink(old);
  if (st == MEGA_OK) st = sync_parent(bin, err);
out:
  free(bin);
  free(idx);
  free(old);
  return st;
}

mega_status mega_indexed_writer_close(mega_indexed_writer *w, mega_err *err) {
  mega_status st = MEGA_OK;
  bool synced = flush_sync(w->bin);
  if (fclose(w->bin) != 0 || !synced)
    st = mega_fail(err, MEGA_ERR_IO, "cannot write %s.bin: %s", w->prefix, strerror(errno));
  w->bin = NULL;
  if (st == MEGA_OK) st = write_index(w, err);
  if (st == MEGA_OK) st = rename_into_place(w, err);
  if (st != MEGA_OK) {
    unlink(w->bin_tmp);
    unlink(w->idx_tmp);
  }
  writer_free(w);
  return st;
}

void mega_indexed_writer_abort(mega_indexed_writer *w) {
  if (!w) return;
  if (w->bin) fclose(w->bin);
  unlink(w->bin_tmp);
  unlink(w->idx_tmp);
  writer_free(w);
}
