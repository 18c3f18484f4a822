/* Dropout's masks, counter-based. Hidden dropout: whether element
 * (sample, t, c) of a dropout site is kept is a pure function of (seed, layer, site, the
 * sample's global index in the training order, its position t, the
 * channel c). No RNG state exists, so the mask is the same under every
 * parallel layout, microbatch split and schedule, backward and activation
 * recomputation regenerate it instead of storing it, and a resumed run
 * draws what an uninterrupted one would. Attention dropout's mask is the
 * same kind of function (mega_attn_dropout, at the end). Shared by the cpu backend and the
 * CUDA kernels (kernels/gpt_bodies.h). */
#ifndef MEGA_KERNELS_DROPOUT_H
#define MEGA_KERNELS_DROPOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/hd.h"
#include "kernels/rng.h"

/* Megatron's hidden-dropout sites: the embeddings' output (layer -1), and
 * in each layer the attention's output projection and the MLP's second
 * linear, each with its bias, before the residual add. */
enum { MEGA_DROP_EMBEDDING = 0, MEGA_DROP_ATTENTION = 1, MEGA_DROP_MLP = 2 };
/* Attention dropout's site: the softmax probabilities of each layer's
 * causal self-attention, before they multiply V (mega_attn_dropout). */
enum { MEGA_DROP_ATTN_PROBS = 3 };

/* One dropout call over rows of a microbatch: row r (from row0) is token r
 * % T of sample sample0 + r / T (a microbatch holds consecutive samples).
 * An element is dropped when its 32 mask bits are below threshold, and a
 * kept one is scaled by scale = 1/(1-p) (inverted dropout). */
typedef struct mega_dropout {
  uint64_t key;     /* mega_dropout_key(seed, layer, site) */
  int64_t sample0;  /* the microbatch's first sample, in the training order */
  int64_t row0;     /* the first row the call covers (a sequence-parallel rank's) */
  int T;            /* tokens per sample */
  uint32_t threshold;
  float scale;
} mega_dropout;

/* The key of a site: layer is the global layer (-1: the embeddings). */
static inline MEGA_HD uint64_t mega_dropout_key(uint64_t seed, int layer, int site) {
  uint64_t where = ((uint64_t)(uint32_t)(layer + 1) << 8) | (uint32_t)site;
  return mega_splitmix64(seed ^ mega_splitmix64(where ^ 0x64726F706F7574ull /* "dropout" */));
}

/* The key of one token's row at a site. */
static inline MEGA_HD uint64_t mega_dropout_row_key(uint64_t key, int64_t sample, int64_t t) {
  return mega_splitmix64(mega_splitmix64(key ^ (uint64_t)sample) ^ (uint64_t)t);
}

/* Channel c's 32 mask bits in a row. */
static inline MEGA_HD uint32_t mega_dropout_bits(uint64_t row_key, int64_t c) {
  return (uint32_t)(mega_splitmix64(row_key ^ (uint64_t)c) >> 32);
}

/* The threshold of probability p in [0, 1): round(p * 2^32), so an element
 * is dropped with probability p to within 2^-33. */
static inline uint32_t mega_dropout_threshold(double p) {
  double t = p * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

/* The call's description; p in (0, 1). */
static inline mega_dropout mega_dropout_of(double p, uint64_t key, int64_t sample0,
                                           int64_t row0, int T) {
  mega_dropout d = {.key = key, .sample0 = sample0, .row0 = row0, .T = T,
                    .threshold = mega_dropout_threshold(p), .scale = (float)(1.0 / (1.0 - p))};
  return d;
}

/* The row key of the call's row r (counted from row0). */
static inline MEGA_HD uint64_t mega_dropout_row(const mega_dropout *d, int64_t r) {
  int64_t g = d->row0 + r;
  return mega_dropout_row_key(d->key, d->sample0 + g / d->T, g % d->T);
}

/* v if the element is kept (times scale), else 0. */
static inline MEGA_HD float mega_dropout_apply(const mega_dropout *d, uint64_t row_key,
                                               int64_t c, float v) {
  return mega_dropout_bits(row_key, c) >= d->threshold ? v * d->scale : 0.0f;
}

/* Attention dropout over one attention call (backend.h's mega_attn_dims):
 * probability (b, h, t, s), of the call's sample b, query head h, query
 * position t and key position s, is kept when its 32 mask bits (of the
 * key of row (sample0 + b, head0 + h, t), then column s) are at least
 * threshold, and then scaled. head0 is the call's first head in the
 * model's numbering (a tensor-parallel rank's), so a head split draws the
 * mask of the whole. scale 0 (all zero, the default): no dropout. */
typedef struct mega_attn_dropout {
  uint64_t key;     /* mega_dropout_key(seed, layer, MEGA_DROP_ATTN_PROBS) */
  int64_t sample0;  /* the microbatch's first sample, in the training order */
  int head0;
  uint32_t threshold;
  float scale;
} mega_attn_dropout;

/* The call's description; p in (0, 1). */
static inline mega_attn_dropout mega_attn_dropout_of(double p, uint64_t key, int64_t sample0,
                                                     int head0) {
  mega_attn_dropout d = {.key = key, .sample0 = sample0, .head0 = head0,
                         .threshold = mega_dropout_threshold(p),
                         .scale = (float)(1.0 / (1.0 - p))};
  return d;
}

/* The row key of query position t of the call's head h of sample b. */
static inline MEGA_HD uint64_t mega_attn_dropout_row(const mega_attn_dropout *d, int64_t b,
                                                     int h, int64_t t) {
  uint64_t k = mega_splitmix64(d->key ^ (uint64_t)(d->sample0 + b));
  return mega_splitmix64(mega_splitmix64(k ^ (uint64_t)(int64_t)(d->head0 + h)) ^ (uint64_t)t);
}

/* v if key position s of the row is kept (times scale), else 0. */
static inline MEGA_HD float mega_attn_dropout_apply(const mega_attn_dropout *d,
                                                    uint64_t row_key, int64_t s, float v) {
  return mega_dropout_bits(row_key, s) >= d->threshold ? v * d->scale : 0.0f;
}

#endif
