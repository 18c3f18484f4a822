/* A whole tiny GPT (one stage: embedding, layers, loss) whose optimizer has
 * taken one step, so its params and both moments hold distinct values; cp
 * views every tensor as a checkpoint does. For the checkpoint tests. */
#ifndef MEGA_TESTS_TRAIN_TINY_MODEL_H
#define MEGA_TESTS_TRAIN_TINY_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/ckpt/checkpoint.h"
#include "worker/model/gpt.h"
#include "worker/optim/optim.h"

typedef struct tu_model {
  mega_backend *be;
  mega_gpt_config cfg;
  mega_gpt_stage *s;
  mega_optim *o;
  mega_ckpt_param *cp; /* [n] */
  size_t n;
} tu_model;

/* hidden 16, 2 heads, max_seq_len 8; seed picks the weights and the
 * gradients of the one step. False (nothing to free) on failure. */
bool tu_model_make(tu_model *m, uint64_t seed, int layers, double weight_decay);
/* The same over any model config (a Llama's). */
bool tu_model_make_cfg(tu_model *m, const mega_gpt_config *cfg, double weight_decay);
void tu_model_free(tu_model *m);

#endif
