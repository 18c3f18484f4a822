/* Shared by the worker tests: a tiny GPT, deterministic data, and a probe
 * that evaluates a stage's scalar objective and its analytic gradients.
 * The tests run the cpu backend, so backend memory is host memory. */
#ifndef MEGA_TESTS_WORKER_GPT_FIXTURE_H
#define MEGA_TESTS_WORKER_GPT_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/backend/backend.h"
#include "worker/model/gpt.h"

/* C=16, 2 layers, 2 heads, max_seq_len 8, vocab 256. */
void fx_config(mega_gpt_config *cfg, float init_std);
/* The Llamas of the same sizes (fx_config's, then): FX_LLAMA has 4 query
 * heads over 2 groups of head_dim 6 (wider than C/NH), SwiGLU of 24, RoPE
 * on every channel, an untied head and no biases; FX_LLAMA_TIED ties the
 * head to the embedding, has biases, and head_dim 8 with half of each
 * head's channels rotated. */
typedef enum fx_model { FX_GPT2, FX_LLAMA, FX_LLAMA_TIED } fx_model;
void fx_model_config(mega_gpt_config *cfg, float init_std, fx_model m);
/* TP collectives that do nothing, for stages built only to look at their
 * parameters or their memory (never run). */
extern const mega_gpt_tp_ops fx_tp_noop;

/* Deterministic values: ids in [0, V), normals scaled by std. */
void fx_ids(int32_t *ids, size_t n, int V, uint64_t seed);
void fx_normals(float *x, size_t n, float std, uint64_t seed);

/* One stage's objective: the loss stage's mean token loss
 * loss_sum / (B*T), else sum(output * R) for a fixed R; its gradient is
 * what backward_input/backward_weight compute with loss_scale = 1/(B*T) or
 * doutput = R. */
typedef struct fx_probe {
  mega_gpt_stage *s;
  mega_gpt_acts *a;
  int B, T, C;
  int32_t *tokens, *targets; /* host [BT], used by their stages */
  float *input;              /* [BT,C], non-embedding stages */
  float *R;                  /* [BT,C], non-loss stages */
  float *output, *dinput;    /* [BT,C] */
} fx_probe;

/* Creates acts and data for stage s (B x T); frees with fx_probe_free. */
void fx_probe_init(fx_probe *p, mega_gpt_stage *s, int B, int T, uint64_t seed);
void fx_probe_free(fx_probe *p);
/* The objective; *mag (may be NULL) gets the sum of the magnitudes of its
 * terms, the scale of its float rounding error. */
double fx_probe_value(fx_probe *p, double *mag);
/* Forward on the probe's data (tokens or input; targets or output); *loss
 * gets the loss stage's loss_sum. */
void fx_probe_forward(fx_probe *p, double *loss);
/* Zeroes grads, then forward, backward_input, backward_weight; fills
 * p->dinput on non-embedding stages. */
void fx_probe_grad(fx_probe *p);

#endif
