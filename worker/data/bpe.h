/* GPT-2's byte-level BPE (Megatron's GPT2BPETokenizer, OpenAI's encoder.py):
 * vocab.json maps token strings to ids, merges.txt lists the merges by
 * rank. Text is cut into pre-tokens by GPT-2's pattern
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * each pre-token's bytes are merged pair by pair, the lowest-ranked pair
 * first, and the pieces looked up in the vocabulary. Token strings spell
 * bytes with GPT-2's byte-to-unicode table (printable bytes as themselves,
 * the rest as U+0100 onward), so every byte string has an encoding and
 * decoding is exact.
 *
 * Character classes come from glibc's C.UTF-8 locale: letters (\p{L}) are
 * iswalpha's, numbers (\p{N}) the ASCII digits (glibc files other scripts'
 * digits under alpha, so they join letters' pre-tokens), whitespace
 * iswspace's. ASCII text pre-tokenizes exactly as GPT-2's regex does.
 *
 * A loaded tokenizer is immutable: any number of threads may encode. */
#ifndef MEGA_WORKER_BPE_H
#define MEGA_WORKER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct mega_bpe mega_bpe;

/* Reads vocab.json (an object of string -> id, the ids 0..n-1 for n
 * entries) and merges.txt (an optional "#version" line, then "A B" per
 * line). The caller owns *out. */
mega_status mega_bpe_load(const char *vocab_file, const char *merge_file, mega_bpe **out,
                          mega_err *err);
void mega_bpe_free(mega_bpe *b); /* NULL is fine */

/* Entries in vocab.json (Megatron's vocab_size for this tokenizer). */
int mega_bpe_vocab_size(const mega_bpe *b);
/* The id of "<|endoftext|>", or -1 when the vocabulary lacks it. */
int mega_bpe_eod(const mega_bpe *b);

/* A growable array of token ids; free ids with free(). */
typedef struct mega_bpe_ids {
  int32_t *ids;
  size_t n, cap;
} mega_bpe_ids;

/* Appends the ids of text[0..len) to out. Fails (MEGA_ERR_INVALID) when a
 * merged piece is not in the vocabulary (a vocabulary and merges that do
 * not belong together). */
mega_status mega_bpe_encode(const mega_bpe *b, const char *text, size_t len, mega_bpe_ids *out,
                            mega_err *err);
mega_status mega_bpe_push(mega_bpe_ids *out, int32_t id, mega_err *err);

/* The bytes of ids[0..n) into *text (malloc'd, NUL-terminated, *len bytes
 * before it). An id outside the vocabulary is MEGA_ERR_INVALID. */
mega_status mega_bpe_decode(const mega_bpe *b, const int32_t *ids, size_t n, char **text,
                            size_t *len, mega_err *err);

#endif
