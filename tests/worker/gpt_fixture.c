#include "gpt_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/rng.h"

void fx_config(mega_gpt_config *cfg, float init_std) {
  mega_gpt_config_default(cfg);
  cfg->vocab_size = 256;
  cfg->max_seq_len = 8;
  cfg->num_layers = 2;
  cfg->num_heads = 2;
  cfg->channels = 16;
  cfg->init_std = init_std;
  cfg->seed = 20240611;
}

void fx_model_config(mega_gpt_config *cfg, float init_std, fx_model m) {
  fx_config(cfg, init_std);
  if (m == FX_GPT2) return;
  cfg->arch = MEGA_GPT_ARCH_LLAMA;
  cfg->num_heads = 4;
  cfg->num_kv_heads = 2;
  cfg->ffn_hidden = 24;
  cfg->head_dim = m == FX_LLAMA ? 6 : 8;
  cfg->rotary_percent = m == FX_LLAMA ? 1.0f : 0.5f;
  cfg->untied = m == FX_LLAMA;
  cfg->no_bias = m == FX_LLAMA;
}

static mega_status noop_reduce(void *ctx, float *buf, size_t n, mega_err *err) {
  (void)ctx, (void)buf, (void)n, (void)err;
  return MEGA_OK;
}

static mega_status noop_move(void *ctx, const float *in, float *out, size_t n, mega_err *err) {
  (void)ctx, (void)in, (void)out, (void)n, (void)err;
  return MEGA_OK;
}

const mega_gpt_tp_ops fx_tp_noop = {noop_reduce, noop_reduce, noop_move, noop_move};

void fx_ids(int32_t *ids, size_t n, int V, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    ids[i] = (int32_t)(mega_splitmix64(seed * 1000003u + i) % (uint64_t)V);
}

void fx_normals(float *x, size_t n, float std, uint64_t seed) {
  uint64_t key = mega_splitmix64(seed);
  for (size_t i = 0; i < n; i++) x[i] = (float)(std * mega_rng_normal(key, i));
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  assert_non_null(p);
  return p;
}

void fx_probe_init(fx_probe *p, mega_gpt_stage *s, int B, int T, uint64_t seed) {
  memset(p, 0, sizeof *p);
  mega_err err = {0};
  p->s = s;
  p->B = B;
  p->T = T;
  p->C = mega_gpt_stage_config(s)->channels;
  int V = mega_gpt_stage_config(s)->vocab_size;
  size_t BT = (size_t)B * T, NC = BT * p->C;
  if (mega_gpt_acts_create(s, B, T, &p->a, &err) != MEGA_OK) fail_msg("%s", err.msg);
  p->tokens = xcalloc(BT, sizeof *p->tokens);
  p->targets = xcalloc(BT, sizeof *p->targets);
  p->input = xcalloc(NC, sizeof *p->input);
  p->R = xcalloc(NC, sizeof *p->R);
  p->output = xcalloc(NC, sizeof *p->output);
  p->dinput = xcalloc(NC, sizeof *p->dinput);
  fx_ids(p->tokens, BT, V, seed);
  fx_ids(p->targets, BT, V, seed + 1);
  fx_normals(p->input, NC, 1.0f, seed + 2);
  fx_normals(p->R, NC, 1.0f, seed + 3);
}

void fx_probe_free(fx_probe *p) {
  mega_gpt_acts_destroy(p->a);
  free(p->tokens);
  free(p->targets);
  free(p->input);
  free(p->R);
  free(p->output);
  free(p->dinput);
}

void fx_probe_forward(fx_probe *p, double *loss) {
  const mega_gpt_stage_desc *d = mega_gpt_stage_desc_get(p->s);
  mega_err err = {0};
  if (mega_gpt_forward(p->s, p->a, d->embedding ? p->tokens : NULL,
                       d->embedding ? NULL : p->input, d->loss ? p->targets : NULL,
                       d->loss ? NULL : p->output, loss, &err) != MEGA_OK)
    fail_msg("forward: %s", err.msg);
}

double fx_probe_value(fx_probe *p, double *mag) {
  double loss = 0.0;
  fx_probe_forward(p, &loss);
  size_t BT = (size_t)p->B * p->T;
  if (mega_gpt_stage_desc_get(p->s)->loss) {
    if (mag) *mag = loss / (double)BT;
    return loss / (double)BT;
  }
  double f = 0.0, m = 0.0;
  for (size_t i = 0; i < BT * p->C; i++) {
    f += (double)p->output[i] * p->R[i];
    m += fabs((double)p->output[i] * p->R[i]);
  }
  if (mag) *mag = m;
  return f;
}

void fx_probe_grad(fx_probe *p) {
  const mega_gpt_stage_desc *d = mega_gpt_stage_desc_get(p->s);
  mega_err err = {0};
  double loss = 0.0;
  mega_gpt_zero_grad(p->s);
  fx_probe_forward(p, &loss);
  float scale = 1.0f / (float)(p->B * p->T);
  if (mega_gpt_backward_input(p->s, p->a, d->loss ? NULL : p->R, scale,
                              d->embedding ? NULL : p->dinput, &err) != MEGA_OK)
    fail_msg("backward_input: %s", err.msg);
  if (mega_gpt_backward_weight(p->s, p->a, &err) != MEGA_OK)
    fail_msg("backward_weight: %s", err.msg);
}
