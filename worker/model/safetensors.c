/* safetensors reader and writer (F32), with jansson for the header. */
#include "worker/model/safetensors.h"

#include "core/nofollow.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20) /* as the reference implementation */

struct mega_st_file {
  char *path;
  unsigned char *buf; /* the whole file */
  size_t size;
  const unsigned char *data; /* start of the data section */
  size_t data_size;
  mega_st_tensor *tensors; /* sorted by data offset */
  size_t n;
  json_t *meta; /* __metadata__ object or NULL */
};

static mega_status bad(mega_err *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mega_status bad(mega_err *err, const char *path, const char *fmt, ...) {
  char msg[MEGA_ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mega_fail(err, MEGA_ERR_INVALID, "safetensors %s: %s", path, msg);
}

static mega_status read_all(const char *path, bool plain, unsigned char **out, size_t *size,
                            mega_err *err) {
  char link[4096], why[4200];
  int fd = plain ? mega_nf_open_file(path, link, sizeof link) : open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 && plain && (errno == ELOOP || errno == EINVAL))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "safetensors %s: refusing to read it: %s; a checkpoint's files must be "
                     "plain files, not links (remove it)",
                     path, mega_nf_why(errno, link, why, sizeof why));
  if (fd < 0)
    return mega_fail(err, MEGA_ERR_IO, "safetensors %s: cannot open: %s", path,
                     strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "safetensors %s: not a regular file", path);
  }
  size_t n = (size_t)sb.st_size;
  unsigned char *buf = malloc(n ? n : 1);
  if (!buf) {
    close(fd);
    return mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: cannot hold %zu bytes", path, n);
  }
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      free(buf);
      close(fd);
      return mega_fail(err, MEGA_ERR_IO, "safetensors %s: read failed: %s", path,
                       e ? strerror(e) : "file shrank while reading");
    }
    got += (size_t)r;
  }
  close(fd);
  *out = buf;
  *size = n;
  return MEGA_OK;
}

static int by_offset(const void *a, const void *b) {
  const mega_st_tensor *x = a, *y = b;
  const unsigned char *p = x->data, *q = y->data;
  return p < q ? -1 : p > q;
}

/* One header entry: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}. */
static mega_status parse_tensor(mega_st_file *f, const char *name, json_t *v,
                                mega_st_tensor *t, size_t *end, mega_err *err) {
  const char *p = f->path;
  if (!json_is_object(v)) return bad(err, p, "tensor %s: entry is not a JSON object", name);
  json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
         *offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dtype))
    return bad(err, p, "tensor %s: missing or non-string dtype", name);
  if (strcmp(json_string_value(dtype), "F32") != 0)
    return bad(err, p, "tensor %s: dtype %s is not supported (only F32)", name,
               json_string_value(dtype));
  if (!json_is_array(shape)) return bad(err, p, "tensor %s: missing shape array", name);
  size_t nd = json_array_size(shape);
  if (nd > MEGA_ST_MAX_DIMS)
    return bad(err, p, "tensor %s: %zu dimensions, at most %d supported", name, nd,
               MEGA_ST_MAX_DIMS);
  t->name = name;
  t->ndim = (int)nd;
  size_t numel = 1;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(shape, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return bad(err, p, "tensor %s: shape[%zu] is not a non-negative integer", name, i);
    t->shape[i] = json_integer_value(d);
    if (t->shape[i] && numel > SIZE_MAX / 4 / (size_t)t->shape[i])
      return bad(err, p, "tensor %s: shape overflows", name);
    numel *= (size_t)t->shape[i];
  }
  t->numel = numel;
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
    return bad(err, p, "tensor %s: data_offsets must be [begin, end] integers", name);
  json_int_t b = json_integer_value(json_array_get(offs, 0)),
             e = json_integer_value(json_array_get(offs, 1));
  if (b < 0 || e < b || (uint64_t)e > f->data_size)
    return bad(err, p,
               "tensor %s: data_offsets [%lld, %lld] fall outside the %zu data bytes "
               "(truncated file?)",
               name, (long long)b, (long long)e, f->data_size);
  if ((uint64_t)(e - b) != (uint64_t)numel * 4)
    return bad(err, p, "tensor %s: shape needs %zu bytes but data_offsets span %lld", name,
               numel * 4, (long long)(e - b));
  t->data = f->data + b;
  *end = (size_t)e;
  return MEGA_OK;
}

static mega_status parse_header(mega_st_file *f, mega_err *err) {
  const char *p = f->path;
  if (f->size < 8)
    return bad(err, p, "file is %zu bytes, shorter than the 8-byte header length", f->size);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | f->buf[i];
  if (hl > ST_MAX_HEADER || hl > f->size - 8)
    return bad(err, p, "header length %llu runs past the end of the %zu-byte file",
               (unsigned long long)hl, f->size);
  f->data = f->buf + 8 + hl;
  f->data_size = f->size - 8 - (size_t)hl;
  json_error_t je;
  json_t *root = json_loadb((const char *)f->buf + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &je);
  if (!root) return bad(err, p, "header is not valid JSON: %s (at byte %d)", je.text, je.position);
  mega_status st = MEGA_OK;
  if (!json_is_object(root)) {
    st = bad(err, p, "header is not a JSON object");
    goto out;
  }
  size_t cap = json_object_size(root);
  f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
  if (!f->tensors) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", p);
    goto out;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      const char *mk;
      json_t *mv;
      if (!json_is_object(v)) {
        st = bad(err, p, "__metadata__ is not an object");
        goto out;
      }
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          st = bad(err, p, "__metadata__ value of %s is not a string", mk);
          goto out;
        }
      }
      f->meta = json_incref(v);
      continue;
    }
    size_t end;
    mega_st_tensor *t = &f->tensors[f->n];
    if ((st = parse_tensor(f, key, v, t, &end, err))) goto out;
    /* names point into root, which we keep: copy them so root can go */
    t->name = strdup(key);
    if (!t->name) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", p);
      goto out;
    }
    f->n++;
  }
  qsort(f->tensors, f->n, sizeof *f->tensors, by_offset);
  for (size_t i = 1; i < f->n; i++) {
    const mega_st_tensor *a = &f->tensors[i - 1], *b = &f->tensors[i];
    if ((const unsigned char *)a->data + a->numel * 4 > (const unsigned char *)b->data) {
      st = bad(err, p, "tensors %s and %s overlap in the data section", a->name, b->name);
      goto out;
    }
  }
out:
  json_decref(root);
  return st;
}

static mega_status st_open(const char *path, bool plain, mega_st_file **out, mega_err *err) {
  mega_st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", path);
  }
  mega_status st = read_all(path, plain, &f->buf, &f->size, err);
  if (!st) st = parse_header(f, err);
  if (st) {
    mega_st_close(f);
    return st;
  }
  *out = f;
  return MEGA_OK;
}

mega_status mega_st_open(const char *path, mega_st_file **out, mega_err *err) {
  return st_open(path, false, out, err);
}

mega_status mega_st_open_plain(const char *path, mega_st_file **out, mega_err *err) {
  return st_open(path, true, out, err);
}

void mega_st_close(mega_st_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
  free(f->tensors);
  json_decref(f->meta);
  free(f->buf);
  free(f->path);
  free(f);
}

const char *mega_st_path(const mega_st_file *f) { return f->path; }
size_t mega_st_count(const mega_st_file *f) { return f->n; }
const mega_st_tensor *mega_st_at(const mega_st_file *f, size_t i) {
  return i < f->n ? &f->tensors[i] : NULL;
}

const mega_st_tensor *mega_st_find(const mega_st_file *f, const char *name) {
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

const char *mega_st_meta_get(const mega_st_file *f, const char *key) {
  return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

mega_status mega_st_read_f32(const mega_st_file *f, const char *name, float *dst, size_t n,
                             const int64_t *shape, int ndim, mega_err *err) {
  const mega_st_tensor *t = mega_st_find(f, name);
  if (!t)
    return mega_fail(err, MEGA_ERR_NOT_FOUND, "safetensors %s: no tensor %s", f->path, name);
  bool same = t->numel == n;
  if (shape) {
    same = same && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
  }
  if (!same) {
    char want[128] = "", got[128] = "";
    size_t w = 0, g = 0;
    for (int i = 0; shape && i < ndim && w < sizeof want; i++)
      w += (size_t)snprintf(want + w, sizeof want - w, "%s%lld", i ? "," : "",
                            (long long)shape[i]);
    for (int i = 0; i < t->ndim && g < sizeof got; i++)
      g += (size_t)snprintf(got + g, sizeof got - g, "%s%lld", i ? "," : "",
                            (long long)t->shape[i]);
    return bad(err, f->path, "tensor %s has shape [%s] (%zu floats); expected [%s] (%zu)",
               name, got, t->numel, shape ? want : "?", n);
  }
  if (n) memcpy(dst, t->data, n * sizeof *dst);
  return MEGA_OK;
}

static mega_status write_all(FILE *fp, const void *p, size_t n) {
  return n == 0 || fwrite(p, 1, n, fp) == n ? MEGA_OK : MEGA_ERR_IO;
}

mega_status mega_st_write(const char *path, const mega_st_tensor *tensors, size_t n,
                          const mega_st_meta *meta, size_t nmeta, mega_err *err) {
  json_t *root = json_object();
  mega_status st = MEGA_OK;
  char *hdr = NULL, *tmp = NULL;
  FILE *fp = NULL;
  int dir = -1; /* path's directory, reached following no link */
  char name[256], tname[260], link[4096], why[4200];
  if (!root) return mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", path);
  if (nmeta) {
    json_t *m = json_object();
    for (size_t i = 0; m && i < nmeta; i++)
      json_object_set_new(m, meta[i].key, json_string(meta[i].value));
    json_object_set_new(root, "__metadata__", m);
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const mega_st_tensor *t = &tensors[i];
    if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0 ||
        json_object_get(root, t->name) || t->ndim < 0 || t->ndim > MEGA_ST_MAX_DIMS) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "safetensors %s: tensor %zu (%s) has a bad or repeated name or ndim",
                     path, i, t->name ? t->name : "(null)");
      goto out;
    }
    size_t numel = 1;
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) {
      numel *= (size_t)t->shape[d];
      json_array_append_new(shape, json_integer(t->shape[d]));
    }
    if (numel != t->numel) {
      json_decref(shape);
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "safetensors %s: tensor %s: numel %zu does not match its shape (%zu)",
                     path, t->name, t->numel, numel);
      goto out;
    }
    json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                          "data_offsets", (json_int_t)off, (json_int_t)(off + numel * 4));
    if (!e || json_object_set_new(root, t->name, e)) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", path);
      goto out;
    }
    off += numel * 4;
  }
  hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  tmp = malloc(strlen(path) + 5);
  if (!hdr || !tmp) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "safetensors %s: out of memory", path);
    goto out;
  }
  sprintf(tmp, "%s.tmp", path);
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8; /* data 8-byte aligned */
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  /* a new temp file (O_EXCL: nothing written through a link or into
   * another name's inode), renamed within its directory */
  dir = mega_nf_parent(path, name, sizeof name, link, sizeof link);
  snprintf(tname, sizeof tname, "%s.tmp", name);
  if (dir >= 0) unlinkat(dir, tname, 0);
  int fd = dir < 0 ? -1
                   : openat(dir, tname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 || !(fp = fdopen(fd, "wb"))) {
    int e = errno;
    if (fd >= 0) close(fd);
    st = mega_fail(err, e == ELOOP ? MEGA_ERR_INVALID : MEGA_ERR_IO,
                   "safetensors %s: cannot create: %s", tmp, mega_nf_why(e, link, why, sizeof why));
    goto out;
  }
  st = write_all(fp, len8, 8);
  if (!st) st = write_all(fp, hdr, hl);
  if (!st) st = write_all(fp, "        ", padded - hl);
  for (size_t i = 0; i < n && !st; i++)
    st = write_all(fp, tensors[i].data, tensors[i].numel * 4);
  if (!st && (fflush(fp) != 0 || fsync(fileno(fp)) != 0)) st = MEGA_ERR_IO;
  if (fclose(fp) != 0 && !st) st = MEGA_ERR_IO;
  fp = NULL;
  if (!st && renameat(dir, tname, dir, name) != 0) st = MEGA_ERR_IO;
  if (st) {
    mega_fail(err, MEGA_ERR_IO, "safetensors %s: write failed: %s", path, strerror(errno));
    unlinkat(dir, tname, 0);
  }
out:
  if (fp) fclose(fp);
  if (dir >= 0) close(dir);
  free(hdr);
  free(tmp);
  json_decref(root);
  return st;
}
