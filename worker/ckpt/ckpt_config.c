/* config.json: mega's model config as Hugging Face's GPT2LMHeadModel or
 * LlamaForCausalLM config, both ways, and the check a load makes against
 * the job's model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/ckpt_internal.h"

/* A float as the shortest decimal that reads back as it, so 1e-5f is
 * written 1e-05 rather than 9.99999974738e-06. */
static double tidy(float x) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.9g", (double)x);
  for (int prec = 1; prec <= 9; prec++) {
    char b2[32];
    snprintf(b2, sizeof b2, "%.*g", prec, (double)x);
    if (strtof(b2, NULL) == x) return strtod(b2, NULL);
  }
  return strtod(buf, NULL);
}

static json_t *gpt2_json(const mega_gpt_config *cfg) {
  int F = mega_gpt_ffn(cfg);
  json_t *archs = json_pack("[s]", "GPT2LMHeadModel");
  json_t *j = json_pack(
      "{s:o, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:b, s:f, s:f, s:f, s:f, s:s}",
      "architectures", archs, "model_type", "gpt2", "vocab_size", cfg->vocab_size,
      "n_positions", cfg->max_seq_len, "n_ctx", cfg->max_seq_len, "n_embd", cfg->channels,
      "n_layer", cfg->num_layers, "n_head", cfg->num_heads, "layer_norm_epsilon",
      tidy(cfg->ln_eps), "activation_function", cfg->gelu_erf ? "gelu" : "gelu_new",
      "tie_word_embeddings", !cfg->untied,
      "initializer_range", tidy(cfg->init_std),
      /* HF's names for Megatron's dropout sites (HF draws other masks: only
       * evaluation computes the same) */
      "resid_pdrop", cfg->hidden_dropout, "embd_pdrop", cfg->hidden_dropout, "attn_pdrop",
      cfg->attention_dropout,
      "torch_dtype", "float32");
  /* n_inner: null means HF's 4 x n_embd */
  json_t *inner = F == 4 * cfg->channels ? json_null() : json_integer(F);
  if (!j || !inner || json_object_set_new(j, "n_inner", inner)) {
    json_decref(j);
    return NULL;
  }
  return j;
}

/* LlamaConfig's fields. RoPE turns the first rotary_percent of each head
 * (Megatron's --rotary-percent), saved as partial_rotary_factor when below
 * 1: Hugging Face's name for it (GPT-NeoX's rotary_pct), which its
 * LlamaForCausalLM does not apply. */
static json_t *llama_json(const mega_gpt_config *cfg) {
  json_t *archs = json_pack("[s]", "LlamaForCausalLM");
  bool bias = !cfg->no_bias;
  json_t *j = json_pack(
      "{s:o, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:b, s:s, s:f, "
      "s:f, s:n, s:s}",
      "architectures", archs, "model_type", "llama", "vocab_size", cfg->vocab_size,
      "max_position_embeddings", cfg->max_seq_len, "hidden_size", cfg->channels,
      "intermediate_size", mega_gpt_ffn(cfg), "num_hidden_layers", cfg->num_layers,
      "num_attention_heads", cfg->num_heads, "num_key_value_heads", mega_gpt_kv_heads(cfg),
      "head_dim", mega_gpt_head_dim(cfg), "rms_norm_eps", tidy(cfg->ln_eps), "rope_theta",
      tidy(cfg->rope_theta), "tie_word_embeddings", !cfg->untied, "attention_bias", bias,
      "mlp_bias", bias, "hidden_act", "silu", "initializer_range", tidy(cfg->init_std),
      "attention_dropout", cfg->attention_dropout, "rope_scaling", "torch_dtype", "float32");
  if (j && cfg->rotary_percent < 1.0 &&
      json_object_set_new(j, "partial_rotary_factor", json_real(cfg->rotary_percent))) {
    json_decref(j);
    return NULL;
  }
  return j;
}

/* The fewest significant digits that read back as x (17 always do). */
static int digits(double x) {
  for (int prec = 1; prec < 17; prec++) {
    char b[40];
    snprintf(b, sizeof b, "%.*g", prec, x);
    if (strtod(b, NULL) == x) return prec;
  }
  return 17;
}

/* The most digits any real in j needs, and at least 9: fewer would print
 * 500000.0 as 5e5 (%g's exponent once it passes the precision). */
static int max_digits(const json_t *j) {
  int most = 9;
  if (json_is_real(j)) return digits(json_real_value(j));
  const char *key;
  json_t *v;
  size_t i;
  json_object_foreach((json_t *)j, key, v) {
    int d = max_digits(v);
    if (d > most) most = d;
  }
  json_array_foreach(j, i, v) {
    int d = max_digits(v);
    if (d > most) most = d;
  }
  return most;
}

size_t mega_ckpt_config_flags(const json_t *j) {
  return JSON_INDENT(2) | JSON_REAL_PRECISION(max_digits(j));
}

/* A special id, null where the tokenizer has none: written either way, so
 * Hugging Face's defaults for an absent key (GPT-2's 50256, Llama's 1 and
 * 2) never name a token mega's tokenizer does not mean. */
static json_t *special_id(int id) { return id >= 0 ? json_integer(id) : json_null(); }

json_t *mega_ckpt_config_json(const mega_gpt_config *cfg, const mega_jobspec *job) {
  json_t *j = cfg->arch == MEGA_GPT_ARCH_LLAMA ? llama_json(cfg) : gpt2_json(cfg);
  if (!j || !job) return j;
  int bos, eos;
  mega_jobspec_special_ids(job, &bos, &eos);
  if (json_object_set_new(j, "bos_token_id", special_id(bos)) ||
      json_object_set_new(j, "eos_token_id", special_id(eos))) {
    json_decref(j);
    return NULL;
  }
  return j;
}

/* ---- reading ---- */

typedef struct reader {
  const json_t *j;
  const char *path;
  mega_err *err;
  mega_status st;
} reader;

/* A positive integer key (required, or def when absent and def > 0). */
static int get_int(reader *r, const char *key, int def) {
  if (r->st) return 0;
  json_t *v = json_object_get(r->j, key);
  if (!v && def > 0) return def;
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 30) {
    r->st = mega_fail(r->err, MEGA_ERR_INVALID, "%s lacks a positive integer %s", r->path, key);
    return 0;
  }
  return (int)json_integer_value(v);
}

/* A positive number key (def when absent; required when def is NAN), as
 * written: the caller rounds it to a float where the field is one, but a
 * fraction such as partial_rotary_factor stays a double, as Python's. */
static double get_num(reader *r, const char *key, double def) {
  if (r->st) return 0;
  json_t *v = json_object_get(r->j, key);
  if (!v && !isnan(def)) return def;
  if (!json_is_number(v) || !(json_number_value(v) > 0)) {
    r->st = mega_fail(r->err, MEGA_ERR_INVALID, "%s lacks a positive number %s", r->path, key);
    return 0;
  }
  return json_number_value(v);
}

static bool get_bool(reader *r, const char *key, bool def) {
  if (r->st) return def;
  json_t *v = json_object_get(r->j, key);
  if (!v || json_is_null(v)) return def;
  if (!json_is_boolean(v)) {
    r->st = mega_fail(r->err, MEGA_ERR_INVALID, "%s: %s is not true or false", r->path, key);
    return def;
  }
  return json_is_true(v);
}

static void read_gpt2(reader *r, mega_gpt_config *cfg) {
  cfg->arch = MEGA_GPT_ARCH_GPT2;
  cfg->vocab_size = get_int(r, "vocab_size", 0);
  cfg->max_seq_len = get_int(r, "n_positions", 0);
  cfg->channels = get_int(r, "n_embd", 0);
  cfg->num_layers = get_int(r, "n_layer", 0);
  cfg->num_heads = get_int(r, "n_head", 0);
  cfg->ln_eps = (float)get_num(r, "layer_norm_epsilon", NAN);
  json_t *inner = json_object_get(r->j, "n_inner");
  if (inner && !json_is_null(inner)) cfg->ffn_hidden = get_int(r, "n_inner", 0);
  cfg->untied = !get_bool(r, "tie_word_embeddings", true);
  /* the dropout it trained with (HF's default 0.1 where absent is not
   * mega's: read it only when written); it acts only in training */
  json_t *pdrop = json_object_get(r->j, "resid_pdrop");
  if (json_is_number(pdrop)) cfg->hidden_dropout = json_number_value(pdrop);
  json_t *apdrop = json_object_get(r->j, "attn_pdrop");
  if (json_is_number(apdrop)) cfg->attention_dropout = json_number_value(apdrop);
  /* GPT2Config's names: "gelu_new" (its default) and "gelu_pytorch_tanh"
   * are the tanh GELU, "gelu" the exact one; mega's MLP has no other */
  if (r->st) return;
  json_t *act = json_object_get(r->j, "activation_function");
  const char *a = json_string_value(act);
  if (!act || (a && (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_pytorch_tanh"))))
    cfg->gelu_erf = false;
  else if (a && !strcmp(a, "gelu"))
    cfg->gelu_erf = true;
  else
    r->st = mega_fail(r->err, MEGA_ERR_INVALID,
                      "%s: activation_function %s%s%s; mega's GPT-2 MLP is GELU, \"gelu_new\" "
                      "(the tanh form) or \"gelu\" (the exact, erf form)",
                      r->path, a ? "\"" : "", a ? a : "is not a string", a ? "\"" : "");
}

/* Only what mega's Llama is: SiLU, no RoPE scaling, biases on every linear
 * layer or on none. */
static void read_llama(reader *r, mega_gpt_config *cfg) {
  cfg->arch = MEGA_GPT_ARCH_LLAMA;
  cfg->vocab_size = get_int(r, "vocab_size", 0);
  cfg->max_seq_len = get_int(r, "max_position_embeddings", 0);
  cfg->channels = get_int(r, "hidden_size", 0);
  cfg->num_layers = get_int(r, "num_hidden_layers", 0);
  cfg->num_heads = get_int(r, "num_attention_heads", 0);
  cfg->ffn_hidden = get_int(r, "intermediate_size", 0);
  cfg->num_kv_heads = get_int(r, "num_key_value_heads", cfg->num_heads);
  int def_hd = cfg->num_heads > 0 ? cfg->channels / cfg->num_heads : 0;
  cfg->head_dim = get_int(r, "head_dim", def_hd > 0 ? def_hd : 0);
  cfg->ln_eps = (float)get_num(r, "rms_norm_eps", 1e-6); /* HF's defaults */
  cfg->rope_theta = (float)get_num(r, "rope_theta", 10000.0);
  cfg->rotary_percent = get_num(r, "partial_rotary_factor", 1.0);
  cfg->untied = !get_bool(r, "tie_word_embeddings", false);
  json_t *apdrop = json_object_get(r->j, "attention_dropout"); /* absent: HF's 0 */
  if (json_is_number(apdrop)) cfg->attention_dropout = json_number_value(apdrop);
  bool ab = get_bool(r, "attention_bias", false), mb = get_bool(r, "mlp_bias", false);
  cfg->no_bias = !ab;
  if (r->st) return;
  const char *act = json_string_value(json_object_get(r->j, "hidden_act"));
  json_t *scaling = json_object_get(r->j, "rope_scaling");
  if (ab != mb)
    r->st = mega_fail(r->err, MEGA_ERR_INVALID,
                      "%s: attention_bias %s but mlp_bias %s; mega's Llama has biases on every "
                      "linear layer or on none",
                      r->path, ab ? "true" : "false", mb ? "true" : "false");
  else if (act && strcmp(act, "silu"))
    r->st = mega_fail(r->err, MEGA_ERR_INVALID,
                      "%s: hidden_act \"%s\"; mega's Llama MLP is SwiGLU (silu)", r->path, act);
  else if (scaling && !json_is_null(scaling))
    r->st = mega_fail(r->err, MEGA_ERR_INVALID,
                      "%s has rope_scaling; mega's RoPE has no scaling", r->path);
}

mega_status mega_ckpt_read_config(const char *dir, mega_gpt_config *cfg, mega_err *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, MEGA_CKPT_CONFIG_FILE);
  json_error_t je;
  json_t *j;
  mega_status opened = mega_ckpt_load_json(path, &j, &je, err);
  if (opened != MEGA_OK) return opened;
  if (!j) return mega_fail(err, MEGA_ERR_INVALID, "%s: %s", path, je.text);
  reader r = {.j = j, .path = path, .err = err};
  mega_gpt_config_default(cfg);
  const char *mt = json_string_value(json_object_get(j, "model_type"));
  if (mt && !strcmp(mt, "gpt2"))
    read_gpt2(&r, cfg);
  else if (mt && !strcmp(mt, "llama"))
    read_llama(&r, cfg);
  else
    r.st = mega_fail(err, MEGA_ERR_INVALID,
                     "%s: model_type is %s%s%s, not \"gpt2\" or \"llama\" (mega's two "
                     "architectures)",
                     path, mt ? "\"" : "", mt ? mt : "missing", mt ? "\"" : "");
  json_decref(j);
  if (r.st) return r.st;
  mega_status st = mega_gpt_config_check(cfg, err);
  if (st) mega_err_prefix(err, "%s", path);
  return st;
}

/* One field both configs have: its name in each architecture's config.json,
 * the job flag that sets it, and its value. */
typedef struct field {
  const char *gpt2, *llama, *flag;
  long long (*get)(const mega_gpt_config *c);
} field;

static long long f_vocab(const mega_gpt_config *c) { return c->vocab_size; }
static long long f_pos(const mega_gpt_config *c) { return c->max_seq_len; }
static long long f_hidden(const mega_gpt_config *c) { return c->channels; }
static long long f_layers(const mega_gpt_config *c) { return c->num_layers; }
static long long f_heads(const mega_gpt_config *c) { return c->num_heads; }
static long long f_groups(const mega_gpt_config *c) { return mega_gpt_kv_heads(c); }
static long long f_hd(const mega_gpt_config *c) { return mega_gpt_head_dim(c); }
static long long f_ffn(const mega_gpt_config *c) { return mega_gpt_ffn(c); }
static long long f_tied(const mega_gpt_config *c) { return !c->untied; }
static long long f_bias(const mega_gpt_config *c) { return !c->no_bias; }

mega_status mega_ckpt_check_config(const char *dir, const mega_gpt_config *cfg, mega_err *err) {
  mega_gpt_config saved;
  mega_status st = mega_ckpt_read_config(dir, &saved, err);
  if (st) return st;
  static const char *const arch_name[] = {"GPT-2", "Llama"};
  if (saved.arch != cfg->arch)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s is a %s model, but this job trains %s "
                     "(Llama is --position-embedding-type rope --normalization RMSNorm "
                     "--swiglu)",
                     dir, MEGA_CKPT_CONFIG_FILE, arch_name[saved.arch], arch_name[cfg->arch]);
  static const field fields[] = {
      {"vocab_size", "vocab_size", "vocabulary size", f_vocab},
      {"n_positions", "max_position_embeddings",
       "--max-position-embeddings (by default --seq-length)", f_pos},
      {"n_embd", "hidden_size", "--hidden-size", f_hidden},
      {"n_layer", "num_hidden_layers", "--num-layers", f_layers},
      {"n_head", "num_attention_heads", "--num-attention-heads", f_heads},
      {"n_head", "num_key_value_heads", "--num-query-groups", f_groups},
      {"n_embd / n_head", "head_dim", "--kv-channels", f_hd},
      {"an MLP width (n_inner; null is 4 x n_embd) of", "intermediate_size", "--ffn-hidden-size",
       f_ffn},
  };
  bool llama = cfg->arch == MEGA_GPT_ARCH_LLAMA;
  /* the two yes-or-no fields, said as such */
  if (f_tied(&saved) != f_tied(cfg))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s has %s embeddings (tie_word_embeddings "
                     "%s), but this job %s",
                     dir, MEGA_CKPT_CONFIG_FILE, f_tied(&saved) ? "tied" : "untied",
                     f_tied(&saved) ? "true" : "false",
                     f_tied(&saved) ? "unties them (--untie-embeddings-and-output-weights)"
                                    : "ties them (add --untie-embeddings-and-output-weights)");
  if (f_bias(&saved) != f_bias(cfg))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s is a model %s biases, but this job %s",
                     dir, MEGA_CKPT_CONFIG_FILE, f_bias(&saved) ? "with" : "without",
                     f_bias(&saved) ? "drops them (--disable-bias-linear)"
                                    : "has them (add --disable-bias-linear)");
  /* The GELU's form: refused rather than followed, since the flags that
   * pick it are what would silently change the model's function (Megatron
   * picks it from them alone) */
  if (!llama && saved.gelu_erf != cfg->gelu_erf)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s has activation_function \"%s\" (the %s "
                     "GELU), but this job runs the %s one (%s)",
                     dir, MEGA_CKPT_CONFIG_FILE, saved.gelu_erf ? "gelu" : "gelu_new",
                     saved.gelu_erf ? "exact, erf" : "tanh", saved.gelu_erf ? "tanh" : "erf",
                     saved.gelu_erf
                         ? "give --no-bias-gelu-fusion and drop --openai-gelu"
                         : "drop --no-bias-gelu-fusion, or add --openai-gelu");
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    long long have = fields[i].get(&saved), want = fields[i].get(cfg);
    /* a Llama's positions shape no tensor (RoPE is computed for any), so
     * --finetune may lengthen the context; a resume's own check of the job
     * flags still holds --max-position-embeddings */
    if (have == want || (llama && fields[i].get == f_pos)) continue;
    /* Megatron pads the vocabulary to a multiple of
     * --make-vocab-size-divisible-by x TP, so it can differ by layout */
    bool vocab = fields[i].get == f_vocab;
    return mega_fail(err, MEGA_ERR_INVALID,
                     "checkpoint config mismatch: %s/%s has %s %lld, but this job has %s %lld%s",
                     dir, MEGA_CKPT_CONFIG_FILE, llama ? fields[i].llama : fields[i].gpt2, have,
                     fields[i].flag, want,
                     vocab ? " (the padded vocabulary: a multiple of "
                             "--make-vocab-size-divisible-by x --tensor-model-parallel-size; "
                             "choose --make-vocab-size-divisible-by so it comes out the same)"
                           : "");
  }
  return MEGA_OK;
}
