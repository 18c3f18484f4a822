/* Single-file safetensors, F32 only.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 *   { "name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *     ..., "__metadata__": {"key": "value", ...} }
 * then the raw little-endian data; offsets are relative to the data start.
 *
 * The reader reads the whole file and validates everything before it returns
 * (length, JSON, dtype, shape against size, offsets inside the data and not
 * overlapping); each failure is MEGA_ERR_INVALID (MEGA_ERR_IO for the OS)
 * with a message that names the file and the tensor. Sharded Hugging Face
 * checkpoints (index.json, config.json) are built on top of this by the
 * checkpoint code.
 *
 * Ownership: a mega_st_file owns its names and data; pointers it hands out
 * live until mega_st_close. The writer only reads what it is given. */
#ifndef MEGA_WORKER_SAFETENSORS_H
#define MEGA_WORKER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define MEGA_ST_MAX_DIMS 8

typedef struct mega_st_tensor {
  const char *name;
  int ndim; /* 0 (a scalar) .. MEGA_ST_MAX_DIMS */
  int64_t shape[MEGA_ST_MAX_DIMS];
  size_t numel;     /* product of shape (1 for a scalar) */
  const void *data; /* numel little-endian floats; from the reader it may be
                       unaligned: copy it out with mega_st_read_f32 or memcpy */
} mega_st_tensor;

typedef struct mega_st_meta {
  const char *key, *value;
} mega_st_meta;

typedef struct mega_st_file mega_st_file;

mega_status mega_st_open(const char *path, mega_st_file **out, mega_err *err);
/* mega_st_open following no link on the way (core/nofollow.h), for a
 * checkpoint's shards: a link is MEGA_ERR_INVALID naming it, unread. */
mega_status mega_st_open_plain(const char *path, mega_st_file **out, mega_err *err);
void mega_st_close(mega_st_file *f); /* NULL is fine */

const char *mega_st_path(const mega_st_file *f);
size_t mega_st_count(const mega_st_file *f);
/* Tensors in data-offset order. */
const mega_st_tensor *mega_st_at(const mega_st_file *f, size_t i);
/* NULL when absent. */
const mega_st_tensor *mega_st_find(const mega_st_file *f, const char *name);
/* A __metadata__ value, NULL when absent. */
const char *mega_st_meta_get(const mega_st_file *f, const char *key);

/* Copies tensor `name` into dst (host, n floats). Fails (naming the file and
 * the tensor) when it is absent or its numel is not n; when shape is given
 * (ndim dims), the shapes must match exactly too. */
mega_status mega_st_read_f32(const mega_st_file *f, const char *name, float *dst,
                             size_t n, const int64_t *shape, int ndim, mega_err *err);

/* Writes the tensors (host data, in the given order) and the metadata (may
 * be NULL/0) to path, through path.tmp and a rename, so a reader never sees
 * a half-written file. Names must be distinct and not "__metadata__". */
mega_status mega_st_write(const char *path, const mega_st_tensor *tensors, size_t n,
                          const mega_st_meta *meta, size_t nmeta, mega_err *err);

#endif
