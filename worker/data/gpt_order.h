/* Megatron-LM core's GPTDataset order over one indexed dataset's documents
 * (megatron/core/datasets/gpt_dataset.py, _build_document_sample_shuffle_
 * indices with _build_document_index and _build_shuffle_index, and
 * helpers.cpp's build_sample_idx; read at Megatron-LM main, gpt_dataset.py
 * 002398e and helpers.cpp 298c71d), with add_extra_token_to_sequence and
 * drop_last_partial_sequence both true, Megatron's defaults for training
 * and validation. Restated here:
 *
 * With documents D (a split's sequence ids, in order) of P tokens in all,
 * N samples asked for and sequence length T, a sample is T + 1 tokens.
 * Epochs E: the least E >= 1 with E*P >= N*T + 1. With E > 1 the final
 * epoch is kept apart when the samples it must give, N - floor(((E-1)*P -
 * 1) / T), are fewer than int(0.8 * floor((P - 1) / T)).
 * A RandomState(seed) then draws, in this order:
 *   - the document index: D tiled E times and shuffled; kept apart, D
 *     tiled E-1 times and shuffled, then D once and shuffled, concatenated;
 *   - (the sample index draws nothing) floor((E*P - 1) / T) samples laid
 *     end to end over the documents in document-index order, each T + 1
 *     tokens and each starting at the previous one's last token;
 *   - the shuffle index: 0..S-1 shuffled (S the samples), or, kept apart,
 *     0..S0-1 shuffled and then S0..S-1 shuffled, S0 = floor(((E-1)*P -
 *     1) / T).
 * Sample number i (0-based, as the dataset is indexed) is laid-out sample
 * shuffle[i]. The index holds S >= N samples. Immutable after build. */
#ifndef MEGA_WORKER_GPT_ORDER_H
#define MEGA_WORKER_GPT_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct mega_gpt_order mega_gpt_order;

/* Builds the index over documents [doc0, doc1), document k holding
 * cum[k+1] - cum[k] tokens (cum: tokens before each sequence, as read from
 * the dataset's index). num_samples >= 1, seq_len >= 1. Fails
 * (MEGA_ERR_INVALID) when the documents hold fewer than seq_len + 1
 * tokens, MEGA_ERR_NOMEM when the index does not fit. The caller owns *out. */
mega_status mega_gpt_order_build(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                 int64_t num_samples, uint32_t seed, mega_gpt_order **out,
                                 mega_err *err);
void mega_gpt_order_free(mega_gpt_order *o); /* NULL is fine */

int64_t mega_gpt_order_samples(const mega_gpt_order *o); /* S */
int mega_gpt_order_epochs(const mega_gpt_order *o);      /* E */
int mega_gpt_order_separate(const mega_gpt_order *o);    /* 1: final epoch kept apart */

/* Where sample i (0 <= i < S) lies: from position *first of the document
 * index at token *first_off of that document, to position *last at token
 * *last_off inclusive (a sample ends at a document's *last_off-th token,
 * counting from 0). Tokens: the first document's from first_off on, every
 * document's between, the last's [0, last_off], or [first_off, last_off]
 * when first == last; T + 1 in all. */
void mega_gpt_order_sample(const mega_gpt_order *o, int64_t i, int64_t *first,
                           int64_t *first_off, int64_t *last, int64_t *last_off);
/* The document (sequence id) at position p of the document index. */
int64_t mega_gpt_order_document(const mega_gpt_order *o, int64_t p);

/* ---- the index cached on disk (--data-cache-path; gpt_order_cache.c) ----
 *
 * A cache file holds one index and its whole key: the arguments of
 * mega_gpt_order_build and the token count of every document in [doc0,
 * doc1), so a file is used only for the same documents, seed, sequence
 * length and sample count (a split, a blend's share and the epochs all
 * follow from these), whatever its name. Its name is a hash of that key.
 * A crc32 of the body catches a damaged or truncated file, and every entry
 * is checked to be what the key's build makes but for its draws (the key's
 * epochs and samples, each document once an epoch, each sample laid where
 * the one before it ends, the shuffle a permutation), so even a file whose
 * checksums were made good is whole samples, each used once. Which
 * permutations were drawn only the crc32 vouches for: checking them would
 * cost the build the file saves. A file is written to a temporary name and renamed, under
 * an exclusive flock on NAME.lock, so the first process to miss builds it
 * and the others wait on the lock and then map it; the builder removes the
 * temporary files of builders that were killed. */

typedef enum mega_gpt_cache_how {
  MEGA_GPT_CACHE_READ,    /* mapped from the cache file */
  MEGA_GPT_CACHE_BUILT,   /* no cache file: built and written */
  MEGA_GPT_CACHE_REBUILT, /* the file was damaged or another key's: built and replaced */
} mega_gpt_cache_how;

/* mega_gpt_order_build through the cache in directory dir (made if
 * missing): maps the key's file when it is whole and is this key's, else
 * builds the index and writes the file. *how says which; with REBUILT,
 * why (why_len bytes, may be NULL) gets what was wrong with the old file.
 * Fails as mega_gpt_order_build does, and (MEGA_ERR_IO) when the file is
 * missing or unusable and cannot be written. The caller owns *out. */
mega_status mega_gpt_order_open(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                int64_t num_samples, uint32_t seed, const char *dir,
                                mega_gpt_order **out, mega_gpt_cache_how *how, char *why,
                                size_t why_len, mega_err *err);
/* The cache file's path for this key in dir, into buf (n bytes). */
void mega_gpt_order_cache_path(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                               int64_t num_samples, uint32_t seed, const char *dir, char *buf,
                               size_t n);

#endif
