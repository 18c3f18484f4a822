/* The tiny reference checkpoints' model config (tests/ref/{gpt,llama}_tiny.safetensors),
 * kept in their safetensors __metadata__ as strings so that make_ref.py
 * builds the same model: written by test_parity --write-ckpt, read back by
 * test_parity and test_adamw_parity. Header-only; for the tests. */
#ifndef MEGA_TESTS_REF_CONFIG_H
#define MEGA_TESTS_REF_CONFIG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"

#define REF_META_N 16

/* Every key make_ref.py's make_config reads; vals holds their text. */
static inline size_t ref_config_meta(const mega_gpt_config *c, mega_st_meta *meta,
                                     char vals[REF_META_N][32]) {
  size_t n = 0;
#define KV(k, fmt, v) (snprintf(vals[n], 32, fmt, v), meta[n] = (mega_st_meta){k, vals[n]}, n++)
  KV("arch", "%s", c->arch == MEGA_GPT_ARCH_LLAMA ? "llama" : "gpt2");
  KV("vocab_size", "%d", c->vocab_size);
  KV("max_seq_len", "%d", c->max_seq_len);
  KV("num_layers", "%d", c->num_layers);
  KV("num_heads", "%d", c->num_heads);
  KV("channels", "%d", c->channels);
  KV("init_std", "%.9g", (double)c->init_std);
  KV("ln_eps", "%.9g", (double)c->ln_eps);
  KV("seed", "%llu", (unsigned long long)c->seed);
  KV("num_kv_heads", "%d", mega_gpt_kv_heads(c));
  KV("head_dim", "%d", mega_gpt_head_dim(c));
  KV("ffn_hidden", "%d", mega_gpt_ffn(c));
  KV("untied", "%d", (int)c->untied);
  KV("no_bias", "%d", (int)c->no_bias);
  KV("rope_theta", "%.9g", (double)c->rope_theta);
  KV("rotary_percent", "%.17g", c->rotary_percent);
#undef KV
  return n;
}

/* The config back from a checkpoint's metadata (a GPT-2 one written before
 * the Llama keys lacks them: GPT-2's defaults). */
static inline void ref_config_read(const mega_st_file *f, mega_gpt_config *c) {
  mega_gpt_config_default(c);
  const char *v;
#define GET(k, conv, field) \
  if ((v = mega_st_meta_get(f, k))) c->field = conv;
  GET("vocab_size", atoi(v), vocab_size);
  GET("max_seq_len", atoi(v), max_seq_len);
  GET("num_layers", atoi(v), num_layers);
  GET("num_heads", atoi(v), num_heads);
  GET("channels", atoi(v), channels);
  GET("init_std", strtof(v, NULL), init_std);
  GET("ln_eps", strtof(v, NULL), ln_eps);
  GET("seed", strtoull(v, NULL, 10), seed);
  GET("arch", strcmp(v, "llama") ? MEGA_GPT_ARCH_GPT2 : MEGA_GPT_ARCH_LLAMA, arch);
  GET("num_kv_heads", atoi(v), num_kv_heads);
  GET("head_dim", atoi(v), head_dim);
  GET("ffn_hidden", atoi(v), ffn_hidden);
  GET("untied", atoi(v) != 0, untied);
  GET("no_bias", atoi(v) != 0, no_bias);
  GET("rope_theta", strtof(v, NULL), rope_theta);
  GET("rotary_percent", strtod(v, NULL), rotary_percent);
#undef GET
}

#endif
