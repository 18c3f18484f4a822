/* Megatron's indexed dataset (MMIDIDX): PREFIX.idx describes sequences of
 * token ids stored in PREFIX.bin, as Megatron's tools/preprocess_data.py
 * writes them. The index, all little-endian:
 *
 *   9 bytes   magic "MMIDIDX\0\0"
 *   uint64    version, 1
 *   uint8     dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
 *             6 float64, 7 float32, 8 uint16
 *   uint64    sequence count S
 *   uint64    document count D
 *   int32[S]  sequence lengths, in tokens
 *   int64[S]  sequence pointers, byte offsets into PREFIX.bin
 *   int64[D]  document indices: the first sequence of each document, then S
 *
 * Both files are memory-mapped read-only once; the dataset is then
 * immutable, so any number of threads may read it at once. Opening checks
 * the header, the index's length and every sequence against the size of
 * .bin; token values are checked as they are read (mega_indexed_read). */
#ifndef MEGA_WORKER_INDEXED_H
#define MEGA_WORKER_INDEXED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct mega_indexed mega_indexed;

/* True when PREFIX.idx exists (then the data is indexed, not a plain file). */
bool mega_indexed_exists(const char *prefix);

/* Opens PREFIX.idx and PREFIX.bin. A bad file is MEGA_ERR_INVALID with one
 * line naming the file and the problem; an unreadable one MEGA_ERR_IO. The
 * caller owns *out and frees it with mega_indexed_close. */
mega_status mega_indexed_open(const char *prefix, mega_indexed **out, mega_err *err);
void mega_indexed_close(mega_indexed *x);

int64_t mega_indexed_sequences(const mega_indexed *x);
int64_t mega_indexed_documents(const mega_indexed *x);
int mega_indexed_dtype(const mega_indexed *x);
/* Tokens in sequence i (0 <= i < sequences). */
int64_t mega_indexed_length(const mega_indexed *x, int64_t i);

/* Copies n tokens of sequence seq from token offset off (within it) into
 * out. Each must be a whole number in [0, vocab); one that is not fails
 * (MEGA_ERR_INVALID) naming the file, the sequence and the value. */
mega_status mega_indexed_read(const mega_indexed *x, int64_t seq, int64_t off, int64_t n,
                              int vocab, int32_t *out, mega_err *err);

/* Writing (tools/preprocess): one sequence per document, as Megatron's
 * preprocess_data.py writes a GPT dataset. dtype is a code above. The
 * files are written as PREFIX.bin.tmp and PREFIX.idx.tmp and renamed into
 * place by a close that succeeds, so a failed or abandoned write never
 * leaves a dataset that reads (a part of the input) under PREFIX, and
 * keeps one that was there before. */
typedef struct mega_indexed_writer mega_indexed_writer;
mega_status mega_indexed_writer_open(const char *prefix, int dtype, mega_indexed_writer **out,
                                     mega_err *err);
/* Appends a document: its n ids (each must fit the dtype) as one sequence,
 * or with n 0 a document of no sequence, as Megatron writes an empty one
 * (its GPT dataset counts sequences, so an empty sequence would shift the
 * data order). */
mega_status mega_indexed_writer_add(mega_indexed_writer *w, const int32_t *ids, size_t n,
                                    mega_err *err);
/* Writes the index and puts PREFIX.bin and PREFIX.idx in place; on failure
 * neither is touched and the temporaries are removed. Frees w whatever
 * happens. */
mega_status mega_indexed_writer_close(mega_indexed_writer *w, mega_err *err);
/* Drops what was written (the temporaries) and frees w; NULL is a no-op. */
void mega_indexed_writer_abort(mega_indexed_writer *w);

#endif
