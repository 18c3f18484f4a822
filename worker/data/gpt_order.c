#include "worker/data/gpt_order.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "worker/data/gpt_order_internal.h"
#include "worker/data/np_random.h"

void mega_gpt_order_free(mega_gpt_order *o) {
  if (!o) return;
  if (o->map) {
    munmap(o->map, o->map_len);
  } else {
    free(o->doc_index);
    free(o->sample_pos);
    free(o->shuffle);
  }
  free(o);
}

/* The documents tiled `epochs` times and shuffled, appended at out. */
static void document_epochs(int32_t *out, int64_t doc0, int64_t ndoc, int epochs,
                            mega_np_random *r) {
  for (int e = 0; e < epochs; e++)
    for (int64_t k = 0; k < ndoc; k++) out[e * ndoc + k] = (int32_t)(doc0 + k);
  mega_np_shuffle_i32(r, out, (int64_t)epochs * ndoc);
}

void mega_gpt_order_step(const mega_gpt_order *o, const int64_t *cum, int T, int64_t *at,
                         int64_t *at_off) {
  int64_t pos = *at, off = *at_off, remaining = (int64_t)T + 1;
  while (remaining != 0) {
    int64_t doc = o->doc_index[pos];
    int64_t len = cum[doc + 1] - cum[doc] - off;
    remaining -= len;
    if (remaining <= 0) {
      off += remaining + len - 1;
      remaining = 0;
    } else if (pos == o->ndoc_index - 1) {
      /* the documents ran out: only ever at the last sample */
      off = cum[doc + 1] - cum[doc] - 1;
      break;
    } else {
      pos++;
      off = 0;
    }
  }
  *at = pos, *at_off = off;
}

/* build_sample_idx: samples of T + 1 tokens laid end to end over the
 * document index, the next starting at the previous one's last token. */
static void lay_out(mega_gpt_order *o, const int64_t *cum, int T) {
  int64_t *sp = o->sample_pos;
  int64_t pos = 0, off = 0;
  sp[0] = 0, sp[1] = 0;
  for (int64_t s = 1; s <= o->samples; s++) {
    mega_gpt_order_step(o, cum, T, &pos, &off);
    sp[2 * s] = pos, sp[2 * s + 1] = off;
  }
}

/* 0..n-1 shuffled, at out. */
static void shuffled_range(int64_t *out, int64_t from, int64_t to, mega_np_random *r) {
  for (int64_t k = from; k < to; k++) out[k - from] = k;
  mega_np_shuffle_i64(r, out, to - from);
}

mega_status mega_gpt_order_shape_of(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                    int64_t num_samples, mega_gpt_order_shape *out,
                                    mega_err *err) {
  int64_t T = seq_len;
  int64_t per_epoch_tokens = cum[doc1] - cum[doc0];
  if (seq_len < 1 || num_samples < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "Megatron's data order needs a --seq-length and a sample count >= 1 (got "
                     "%d, %lld)", seq_len, (long long)num_samples);
  if (per_epoch_tokens < T + 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "documents %lld..%lld hold %lld tokens, fewer than one sample of "
                     "--seq-length %d plus 1 (%lld)", (long long)doc0, (long long)doc1,
                     (long long)per_epoch_tokens, seq_len, (long long)(T + 1));
  /* _get_num_epochs */
  int64_t epochs = 1, tokens = per_epoch_tokens, wanted = num_samples * T + 1;
  while (tokens < wanted) epochs++, tokens += per_epoch_tokens;
  /* Megatron's document index holds int32 ids, and build_sample_idx
   * takes an int32 epoch count */
  if (doc1 - 1 > INT32_MAX || epochs > INT32_MAX)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "Megatron's data order takes int32 document ids and epoch counts, but "
                     "this is %lld documents over %lld epochs", (long long)doc1,
                     (long long)epochs);
  *out = (mega_gpt_order_shape){.epochs = epochs, .ndoc_index = epochs * (doc1 - doc0),
                                .samples = (epochs * per_epoch_tokens - 1) / T};
  if (epochs > 1) {
    out->sans_final = ((epochs - 1) * per_epoch_tokens - 1) / T;
    int64_t from_final = num_samples - out->sans_final;
    int64_t per_epoch = (per_epoch_tokens - 1) / T;
    out->separate = from_final < (int64_t)(0.80 * (double)per_epoch);
  }
  return MEGA_OK;
}

mega_status mega_gpt_order_build(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                 int64_t num_samples, uint32_t seed, mega_gpt_order **out,
                                 mega_err *err) {
  *out = NULL;
  int64_t ndoc = doc1 - doc0;
  mega_gpt_order_shape sh;
  mega_status st = mega_gpt_order_shape_of(cum, doc0, doc1, seq_len, num_samples, &sh, err);
  if (st != MEGA_OK) return st;
  mega_gpt_order *o = calloc(1, sizeof *o);
  if (!o) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for Megatron's data order");
  int epochs = (int)sh.epochs;
  o->epochs = epochs;
  o->separate = sh.separate;
  o->ndoc_index = sh.ndoc_index;
  o->samples = sh.samples;
  o->doc_index = malloc((size_t)o->ndoc_index * sizeof *o->doc_index);
  o->sample_pos = malloc((size_t)(o->samples + 1) * 2 * sizeof *o->sample_pos);
  o->shuffle = malloc((size_t)o->samples * sizeof *o->shuffle);
  if (!o->doc_index || !o->sample_pos || !o->shuffle) {
    mega_gpt_order_free(o);
    return mega_fail(err, MEGA_ERR_NOMEM,
                     "out of memory for Megatron's data order (%lld samples over %d epochs)",
                     (long long)num_samples, epochs);
  }
  mega_np_random r;
  mega_np_random_seed(&r, seed);
  if (!sh.separate) {
    document_epochs(o->doc_index, doc0, ndoc, epochs, &r);
  } else {
    document_epochs(o->doc_index, doc0, ndoc, epochs - 1, &r);
    document_epochs(o->doc_index + (epochs - 1) * ndoc, doc0, ndoc, 1, &r);
  }
  lay_out(o, cum, seq_len);
  if (!sh.separate) {
    shuffled_range(o->shuffle, 0, o->samples, &r);
  } else {
    shuffled_range(o->shuffle, 0, sh.sans_final, &r);
    shuffled_range(o->shuffle + sh.sans_final, sh.sans_final, o->samples, &r);
  }
  *out = o;
  return MEGA_OK;
}

int64_t mega_gpt_order_samples(const mega_gpt_order *o) { return o->samples; }
int mega_gpt_order_epochs(const mega_gpt_order *o) { return o->epochs; }
int mega_gpt_order_separate(const mega_gpt_order *o) { return o->separate; }

void mega_gpt_order_sample(const mega_gpt_order *o, int64_t i, int64_t *first,
                           int64_t *first_off, int64_t *last, int64_t *last_off) {
  int64_t s = o->shuffle[i];
  *first = o->sample_pos[2 * s];
  *first_off = o->sample_pos[2 * s + 1];
  *last = o->sample_pos[2 * s + 2];
  *last_off = o->sample_pos[2 * s + 3];
}

int64_t mega_gpt_order_document(const mega_gpt_order *o, int64_t p) { return o->doc_index[p]; }
