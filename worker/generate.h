/* Text from a checkpoint: the model of a --save directory, loaded whole on
 * one rank (TP = PP = 1), continues a prompt one token at a time.
 *
 * Each new token is chosen from the logits of the last position of a
 * forward pass over the context (its last max_seq_len tokens; no KV cache,
 * so a step costs a whole forward). Only the tokenizer's ids are candidates,
 * never the padding rows of the vocabulary. temperature 0 is greedy: the
 * argmax, the lowest id on a tie, so the output is a function of the
 * weights and the prompt alone. Otherwise the logits divided by the
 * temperature, kept to the top_k largest (0: all), are sampled with
 * probabilities softmax(...), drawing step k's uniform from
 * kernels/rng.h's (splitmix64(seed), k): the same seed gives the same text. */
#ifndef MEGA_WORKER_GENERATE_H
#define MEGA_WORKER_GENERATE_H

#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/model/gpt.h"

typedef struct mega_gen_model {
  mega_gpt_config cfg;
  mega_gpt_stage *stage; /* the whole model */
  int tokenizer;         /* mega_tokenizer of the job that trained it */
  int vocab;             /* the tokenizer's ids: 0..vocab-1 */
  int eod;               /* NullTokenizer's end-of-document id, else -1 */
  char *vocab_file, *merge_file; /* GPT2BPETokenizer's files as the job named them, else NULL */
  char *path;            /* the checkpoint directory loaded */
  char *notice;          /* NULL, or why a newer checkpoint was passed over */
} mega_gen_model;

/* Loads --load DIR's newest complete checkpoint (mega_ckpt_resolve):
 * config.json's model, the tokenizer from trainer_state.json's job flags,
 * the weights by name. be must outlive m. */
mega_status mega_gen_load(const char *load_dir, mega_backend *be, mega_gen_model *m,
                          mega_err *err);
void mega_gen_free(mega_gen_model *m);
/* Reads and writes with another tokenizer of vocab ids (eod: its
 * end-of-document id, or -1); it must fit the model's vocabulary. */
mega_status mega_gen_use_vocab(mega_gen_model *m, int vocab, int eod, mega_err *err);

typedef struct mega_gen_opts {
  int max_new_tokens;
  double temperature; /* 0: greedy */
  int top_k;          /* 0: every id */
  uint64_t seed;
} mega_gen_opts;

/* Continues prompt[0..n) (n >= 1, ids below m->vocab): writes up to
 * max_new_tokens ids into out and their count into *nout; stops early after
 * NullTokenizer's end-of-document id (which is written). */
mega_status mega_gen_run(const mega_gen_model *m, const int32_t *prompt, int n,
                         const mega_gen_opts *o, int32_t *out, int *nout, mega_err *err);

/* The id chosen from one position's logits (vocab entries), as above, for
 * draw number step. */
int32_t mega_gen_pick(const float *logits, int vocab, const mega_gen_opts *o, uint64_t step);

#endif
