/* Checkpoints through the public API: round trips (GPT-2, Llama, untied
 * embeddings), HF sharding and its index, and resolving a directory.
 * What goes wrong (crashes mid-save, damaged and mismatched files, the
 * fallback to an older save) is test_ckpt_damage.c's. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt_cases.h"
#include "ckpt_util.h"
#include "core/jobspec.h"
#include "tiny_model.h"
#include "worker/backend/backend.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"
#include "worker/optim/optim.h"

static void test_round_trip(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);
  save_ok(&a, dir, 7, 0);
  snprintf(path, sizeof path, "%s/iter_0000007/model.safetensors", dir);
  assert_true(tu_exists(path));
  snprintf(path, sizeof path, "%s/iter_0000007/optimizer.safetensors", dir);
  assert_true(tu_exists(path));
  snprintf(path, sizeof path, "%s/iter_0000007/model.safetensors.index.json", dir);
  assert_false(tu_exists(path)); /* one shard: no index, as HF */

  /* HF names, no tied head; config.json for GPT2LMHeadModel */
  mega_st_file *f;
  mega_err err = {0};
  snprintf(path, sizeof path, "%s/iter_0000007/model.safetensors", dir);
  assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
  assert_int_equal(mega_st_count(f), a.n);
  assert_non_null(mega_st_find(f, "transformer.wte.weight"));
  assert_non_null(mega_st_find(f, "transformer.h.1.mlp.c_proj.weight"));
  assert_null(mega_st_find(f, "lm_head.weight"));
  assert_string_equal(mega_st_meta_get(f, "format"), "pt");
  mega_st_close(f);
  snprintf(path, sizeof path, "%s/iter_0000007/config.json", dir);
  json_t *cfg = json_load_file(path, 0, NULL);
  assert_non_null(cfg);
  assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "gpt2");
  assert_string_equal(json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)),
                      "GPT2LMHeadModel");
  assert_int_equal(json_integer_value(json_object_get(cfg, "vocab_size")), 256);
  assert_int_equal(json_integer_value(json_object_get(cfg, "n_positions")), 8);
  assert_int_equal(json_integer_value(json_object_get(cfg, "n_embd")), 16);
  assert_int_equal(json_integer_value(json_object_get(cfg, "n_layer")), 2);
  assert_int_equal(json_integer_value(json_object_get(cfg, "n_head")), 2);
  assert_true(json_real_value(json_object_get(cfg, "layer_norm_epsilon")) == 1e-5);
  assert_string_equal(json_string_value(json_object_get(cfg, "activation_function")), "gelu_new");
  assert_true(json_is_true(json_object_get(cfg, "tie_word_embeddings")));
  json_decref(cfg);

  mega_ckpt_state s;
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_same(&a, &b);
  assert_int_equal(s.iteration, 7);
  assert_int_equal(s.consumed_samples, 28);
  assert_int_equal(s.optimizer_steps, 7);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* A small Llama as mega_chunks_config builds one from --position-embedding-
 * type rope --normalization RMSNorm --swiglu --group-query-attention
 * --num-query-groups 1 --untie-embeddings-and-output-weights
 * --disable-bias-linear (heads 4 over 1 group of 4, SwiGLU of 24). */
static void llama_make(model *m, uint64_t seed) {
  mega_gpt_config c;
  mega_gpt_config_default(&c);
  c.arch = MEGA_GPT_ARCH_LLAMA;
  c.max_seq_len = 8;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.channels = 16;
  c.ffn_hidden = 24;
  c.untied = true;
  c.no_bias = true;
  c.rope_theta = 500000.0f;
  c.ln_eps = 1e-6f;
  c.seed = seed;
  assert_true(tu_model_make_cfg(m, &c, 0.1));
}

static const char *json_str(json_t *j, const char *key) {
  return json_string_value(json_object_get(j, key));
}

/* A Llama saves as LlamaForCausalLM: HF's names, lm_head, LlamaConfig's
 * fields; it loads back exactly and into nothing else. */
static void test_llama_round_trip(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  model a, b;
  llama_make(&a, 1);
  llama_make(&b, 2);
  save_ok(&a, dir, 3, 0);
  mega_st_file *f;
  mega_err err = {0};
  snprintf(path, sizeof path, "%s/iter_0000003/model.safetensors", dir);
  assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
  assert_int_equal(mega_st_count(f), 1 + 2 * 9 + 2);
  static const char *const names[] = {
      "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
      "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
      "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
      "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
      "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
      "model.norm.weight", "lm_head.weight"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!mega_st_find(f, names[i])) fail_msg("no %s", names[i]);
  const mega_st_tensor *k = mega_st_find(f, "model.layers.0.self_attn.k_proj.weight");
  assert_true(k->shape[0] == 4 && k->shape[1] == 16); /* one group of 4: [G*hd, C] */
  mega_st_close(f);
  snprintf(path, sizeof path, "%s/iter_0000003/config.json", dir);
  json_t *c = json_load_file(path, 0, NULL);
  assert_non_null(c);
  assert_string_equal(json_str(c, "model_type"), "llama");
  assert_string_equal(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                      "LlamaForCausalLM");
  assert_int_equal(json_integer_value(json_object_get(c, "hidden_size")), 16);
  assert_int_equal(json_integer_value(json_object_get(c, "intermediate_size")), 24);
  assert_int_equal(json_integer_value(json_object_get(c, "num_attention_heads")), 4);
  assert_int_equal(json_integer_value(json_object_get(c, "num_key_value_heads")), 1);
  assert_int_equal(json_integer_value(json_object_get(c, "head_dim")), 4);
  assert_int_equal(json_integer_value(json_object_get(c, "max_position_embeddings")), 8);
  assert_true(json_number_value(json_object_get(c, "rope_theta")) == 500000);
  assert_true(json_number_value(json_object_get(c, "rms_norm_eps")) == 1e-6);
  assert_true(json_is_false(json_object_get(c, "tie_word_embeddings")));
  assert_true(json_is_false(json_object_get(c, "attention_bias")));
  assert_true(json_is_false(json_object_get(c, "mlp_bias")));
  assert_string_equal(json_str(c, "hidden_act"), "silu");
  assert_null(json_object_get(c, "partial_rotary_factor"));
  json_decref(c);
  mega_ckpt_state s;
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_same(&a, &b);
  snprintf(path, sizeof path, "%s/iter_0000003", dir);
  mega_gpt_config back;
  assert_int_equal(mega_ckpt_read_config(path, &back, &err), MEGA_OK);
  assert_true(back.arch == MEGA_GPT_ARCH_LLAMA && back.untied && back.no_bias);
  assert_int_equal(mega_gpt_kv_heads(&back), 1);
  /* into another model: GPT-2, or other groups */
  model g;
  model_make(&g, 1);
  assert_int_equal(mega_ckpt_load(path, g.be, &g.cfg, NULL, g.cp, g.n, &s, &err),
                   MEGA_ERR_INVALID);
  if (!strstr(err.msg, "is a Llama model, but this job trains GPT-2")) fail_msg("%s", err.msg);
  mega_gpt_config other = b.cfg;
  other.num_kv_heads = 2;
  assert_int_equal(mega_ckpt_load(path, b.be, &other, NULL, b.cp, b.n, &s, &err),
                   MEGA_ERR_INVALID);
  if (!strstr(err.msg, "num_key_value_heads 1, but this job has --num-query-groups 2"))
    fail_msg("%s", err.msg);
  other = b.cfg;
  other.untied = false;
  assert_int_equal(mega_ckpt_load(path, b.be, &other, NULL, b.cp, b.n, &s, &err),
                   MEGA_ERR_INVALID);
  if (!strstr(err.msg, "has untied embeddings (tie_word_embeddings false), but this job ties"))
    fail_msg("%s", err.msg);
  /* a Llama config mega cannot run */
  char cfg_path[600];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path);
  c = json_load_file(cfg_path, 0, NULL);
  json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f}", "type", "linear", "factor", 2.0));
  assert_int_equal(json_dump_file(c, cfg_path, 0), 0);
  json_decref(c);
  assert_int_equal(mega_ckpt_read_config(path, &back, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "rope_scaling; mega's RoPE has no scaling")) fail_msg("%s", err.msg);
  model_free(&g);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* Saves a 2-head Llama of `channels` turning `share` of each head (rot
 * channels), and reads its config.json back: the same share and rot. The
 * file's text goes to text (cap bytes). */
static void rotary_round_trip(int channels, double share, int rot, char *text, size_t cap) {
  char dir[256], it[512], path[600];
  tu_mkdtemp(dir, "ckpt");
  mega_gpt_config c;
  mega_gpt_config_default(&c);
  c.arch = MEGA_GPT_ARCH_LLAMA, c.max_seq_len = 8, c.num_layers = 1, c.num_heads = 2;
  c.channels = channels, c.ffn_hidden = 32, c.rotary_percent = share, c.ln_eps = 1e-6f;
  assert_int_equal(mega_gpt_rot_dim(&c), rot);
  model a;
  assert_true(tu_model_make_cfg(&a, &c, 0.1));
  save_ok(&a, dir, 1, 0);
  snprintf(it, sizeof it, "%s/iter_0000001", dir);
  mega_gpt_config back;
  mega_err err = {0};
  if (mega_ckpt_read_config(it, &back, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_true(back.rotary_percent == share);
  assert_int_equal(mega_gpt_rot_dim(&back), rot);
  snprintf(path, sizeof path, "%s/config.json", it);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(text, 1, cap - 1, f);
  text[n] = 0;
  fclose(f);
  model_free(&a);
  tu_rmtree(dir);
}

/* A RoPE fraction a float cannot hold reads back as written: 0.7 of 40
 * channels per head turns 28, where 0.7f would turn 27, which RoPE cannot,
 * and mega would refuse its own checkpoint. A file of short reals keeps
 * nine digits: rope_theta 10000.0, not %.1g's 1e4. */
static void test_rotary_fraction(void **state) {
  (void)state;
  char text[4096];
  rotary_round_trip(80, 0.7, 28, text, sizeof text);
  if (!strstr(text, "\"rope_theta\": 10000.0,")) fail_msg("%s", text);
}

/* A RoPE fraction with more digits than nine reads back as saved: 0.3333333334
 * of a 12-channel head turns 4, where its nine digits 0.333333333 would turn
 * 3. The file still writes its other reals short (1e-6, not
 * 9.9999999999999995e-7), as Hugging Face's own. */
static void test_rotary_digits(void **state) {
  (void)state;
  char text[4096];
  rotary_round_trip(24, 0.3333333334, 4, text, sizeof text);
  if (!strstr(text, "\"rms_norm_eps\": 1e-6,")) fail_msg("%s", text);
}

/* Writes config.json of a GPT-2 with n_embd and n_layer into dir. */
static void write_gpt2_config(const char *dir, long long embd, long long layers) {
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_positions\": 8, \"n_embd\": "
             "%lld, \"n_layer\": %lld, \"n_head\": 2, \"layer_norm_epsilon\": 1e-5}",
          embd, layers);
  fclose(f);
}

/* A config.json too large for mega is refused with its sizes (the MLP's
 * default width, 4 x n_embd, past an int here, said right), and so is one
 * of more layers than a stage counts in an int (megaw generate builds
 * its model from the file). */
static void test_config_too_large(void **state) {
  (void)state;
  char dir[256];
  tu_mkdtemp(dir, "ckpt");
  mega_gpt_config back;
  mega_err err = {0};
  write_gpt2_config(dir, 1000000000, 1);
  assert_int_equal(mega_ckpt_read_config(dir, &back, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "sizes too large (channels 1000000000, vocab 256, max_seq_len 8, ffn "
                       "4000000000,"))
    fail_msg("%s", err.msg);
  write_gpt2_config(dir, 32, 1 << 30);
  assert_int_equal(mega_ckpt_read_config(dir, &back, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "num_layers must be in [1, 1048576], got 1073741824"))
    fail_msg("%s", err.msg);
  tu_rmtree(dir);
}

/* An untied GPT-2 head is saved as lm_head.weight, with tie_word_embeddings
 * false. */
static void test_untied_gpt2(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  mega_gpt_config c;
  mega_gpt_config_default(&c);
  c.max_seq_len = 8, c.num_layers = 1, c.num_heads = 2, c.channels = 16, c.untied = true;
  c.ffn_hidden = 40;
  model a, b;
  c.seed = 1;
  assert_true(tu_model_make_cfg(&a, &c, 0.1));
  c.seed = 2;
  assert_true(tu_model_make_cfg(&b, &c, 0.1));
  save_ok(&a, dir, 1, 0);
  mega_st_file *f;
  mega_err err = {0};
  snprintf(path, sizeof path, "%s/iter_0000001/model.safetensors", dir);
  assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
  assert_non_null(mega_st_find(f, "lm_head.weight"));
  mega_st_close(f);
  snprintf(path, sizeof path, "%s/iter_0000001/config.json", dir);
  json_t *cj = json_load_file(path, 0, NULL);
  assert_true(json_is_false(json_object_get(cj, "tie_word_embeddings")));
  assert_int_equal(json_integer_value(json_object_get(cj, "n_inner")), 40);
  json_decref(cj);
  mega_ckpt_state s;
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_same(&a, &b);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* Sets config.json's activation_function (NULL: removes it). */
static void set_activation(const char *dir, const char *act) {
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *c = json_load_file(path, 0, NULL);
  assert_non_null(c);
  if (act)
    json_object_set_new(c, "activation_function", json_string(act));
  else
    json_object_del(c, "activation_function");
  assert_int_equal(json_dump_file(c, path, 0), 0);
  json_decref(c);
}

/* GPT-2 with the exact (erf) GELU saves activation_function "gelu" (HF's
 * name for it), reads back as such, and loads only into a job of the same
 * form: a mismatch either way is refused with the flags to change. HF's
 * tanh names ("gelu_new", its default when absent, and
 * "gelu_pytorch_tanh") read as the tanh form; others are refused. */
static void test_gelu_form(void **state) {
  (void)state;
  char dir[256], it[512];
  tu_mkdtemp(dir, "ckpt");
  mega_gpt_config c;
  mega_gpt_config_default(&c);
  c.max_seq_len = 8, c.num_layers = 1, c.num_heads = 2, c.channels = 16, c.gelu_erf = true;
  model a, b, t;
  c.seed = 1;
  assert_true(tu_model_make_cfg(&a, &c, 0.1));
  c.seed = 2;
  assert_true(tu_model_make_cfg(&b, &c, 0.1));
  c.gelu_erf = false;
  assert_true(tu_model_make_cfg(&t, &c, 0.1));
  save_ok(&a, dir, 1, 0);
  snprintf(it, sizeof it, "%s/iter_0000001", dir);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", it);
  json_t *cj = json_load_file(path, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(cj, "activation_function")), "gelu");
  json_decref(cj);
  mega_gpt_config back;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_read_config(it, &back, &err), MEGA_OK);
  assert_true(back.gelu_erf);
  mega_ckpt_state s;
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_same(&a, &b);
  /* into a tanh job, and a tanh checkpoint into an erf job */
  assert_int_equal(load(&t, dir, &s, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "activation_function \"gelu\" (the exact, erf GELU), but this job runs "
                       "the tanh one (give --no-bias-gelu-fusion"))
    fail_msg("%s", err.msg);
  char dir2[256];
  tu_mkdtemp(dir2, "ckpt");
  save_ok(&t, dir2, 1, 0);
  assert_int_equal(load(&b, dir2, &s, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "activation_function \"gelu_new\" (the tanh GELU), but this job runs the "
                       "erf one (drop --no-bias-gelu-fusion, or add --openai-gelu)"))
    fail_msg("%s", err.msg);
  assert_int_equal(load(&t, dir2, &s, &err), MEGA_OK);
  tu_rmtree(dir2);
  /* config.json as another writer spells it */
  const char *tanh_names[] = {"gelu_pytorch_tanh", NULL};
  for (int i = 0; i < 2; i++) {
    set_activation(it, tanh_names[i]);
    assert_int_equal(mega_ckpt_read_config(it, &back, &err), MEGA_OK);
    assert_false(back.gelu_erf);
  }
  set_activation(it, "relu");
  assert_int_equal(mega_ckpt_read_config(it, &back, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "activation_function \"relu\"; mega's GPT-2 MLP is GELU"))
    fail_msg("%s", err.msg);
  model_free(&a);
  model_free(&b);
  model_free(&t);
  tu_rmtree(dir);
}

static void test_sharding(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);
  save_ok(&a, dir, 3, 8192); /* wte alone is 16 KiB */
  char it[300];
  snprintf(it, sizeof it, "%s/iter_0000003", dir);
  int nshards = tu_count_prefix(it, "model-");
  assert_true(nshards > 2);
  assert_true(tu_count_prefix(it, "optimizer-") > 2);

  snprintf(path, sizeof path, "%s/model.safetensors.index.json", it);
  json_t *idx = json_load_file(path, 0, NULL);
  assert_non_null(idx);
  json_t *wmap = json_object_get(idx, "weight_map");
  assert_int_equal(json_object_size(wmap), a.n);
  size_t total = 0;
  for (size_t i = 0; i < a.n; i++) total += a.cp[i].numel * 4;
  assert_int_equal(json_integer_value(json_object_get(json_object_get(idx, "metadata"),
                                                      "total_size")), total);
  /* HF: an oversized tensor alone in its own shard, the first one */
  char first[64];
  snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", nshards);
  assert_string_equal(json_string_value(json_object_get(wmap, "transformer.wte.weight")), first);
  /* every shard holds exactly what the map says */
  size_t seen = 0;
  for (int k = 1; k <= nshards; k++) {
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, nshards);
    snprintf(path, sizeof path, "%s/%s", it, name);
    mega_st_file *f;
    mega_err err = {0};
    assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
    size_t bytes = 0;
    for (size_t i = 0; i < mega_st_count(f); i++) {
      const mega_st_tensor *t = mega_st_at(f, i);
      assert_string_equal(json_string_value(json_object_get(wmap, t->name)), name);
      bytes += t->numel * 4;
      seen++;
    }
    assert_true(bytes <= 8192 || mega_st_count(f) == 1);
    mega_st_close(f);
  }
  assert_int_equal(seen, a.n);
  json_decref(idx);

  mega_ckpt_state s;
  mega_err err = {0};
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_same(&a, &b);

  /* a tampered index fails the manifest's checksum, and resolving refuses
   * the checkpoint; loaded anyway, the index is checked against its files */
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", it);
  idx = json_load_file(path, 0, NULL);
  json_object_set_new(json_object_get(idx, "metadata"), "total_size", json_integer(12));
  json_dump_file(idx, path, 0);
  assert_int_equal(load(&b, dir, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "model.safetensors.index.json"));
  assert_non_null(strstr(err.msg, "incomplete"));
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err),
                   MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "total_size"));
  json_object_set_new(json_object_get(idx, "metadata"), "total_size", json_integer((json_int_t)total));
  json_object_set_new(json_object_get(idx, "weight_map"), "transformer.wte.weight",
                      json_string("model-00009-of-00009.safetensors"));
  json_dump_file(idx, path, 0);
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "model-00009-of-00009.safetensors"));
  json_decref(idx);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* HF's order: an oversized tensor gets its own shard at once, ahead of the
 * shard still being filled. */
static void test_shard_order(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  static float small_a[4] = {1, 2, 3, 4}, big[100], small_b[4] = {5, 6, 7, 8};
  mega_st_tensor t[3] = {
      {.name = "a", .ndim = 1, .shape = {4}, .numel = 4, .data = small_a},
      {.name = "big", .ndim = 2, .shape = {10, 10}, .numel = 100, .data = big},
      {.name = "b", .ndim = 1, .shape = {4}, .numel = 4, .data = small_b},
  };
  mega_err err = {0};
  int ns = 0;
  assert_int_equal(mega_ckpt_write_shards(dir, "t", t, 3, 64, &ns, &err), MEGA_OK);
  assert_int_equal(ns, 2);
  mega_st_file *f;
  snprintf(path, sizeof path, "%s/t-00001-of-00002.safetensors", dir);
  assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
  assert_int_equal(mega_st_count(f), 1);
  assert_non_null(mega_st_find(f, "big"));
  mega_st_close(f);
  snprintf(path, sizeof path, "%s/t-00002-of-00002.safetensors", dir);
  assert_int_equal(mega_st_open(path, &f, &err), MEGA_OK);
  assert_int_equal(mega_st_count(f), 2);
  assert_string_equal(mega_st_at(f, 0)->name, "a");
  assert_string_equal(mega_st_at(f, 1)->name, "b");
  mega_st_close(f);
  mega_ckpt_shards sh;
  assert_int_equal(mega_ckpt_open_shards(dir, "t", &sh, &err), MEGA_OK);
  assert_int_equal(sh.nfiles, 2);
  assert_non_null(mega_ckpt_shards_find(&sh, "b"));
  assert_null(mega_ckpt_shards_find(&sh, "c"));
  mega_ckpt_close_shards(&sh);
  /* Found by fuzzing (fuzz_ckpt): an index with an empty weight_map (and
   * total_size 0) opened as a checkpoint of no files. It is refused. */
  snprintf(path, sizeof path, "%s/t.safetensors.index.json", dir);
  FILE *fi = fopen(path, "w");
  fputs("{\"metadata\": {\"total_size\": 0}, \"weight_map\": {}}", fi);
  fclose(fi);
  assert_int_equal(mega_ckpt_open_shards(dir, "t", &sh, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "lists no tensors"));
  assert_int_equal(sh.nfiles, 0);
  tu_rmtree(dir);
}

static void test_resolve(void **state) {
  (void)state;
  char dir[256], path[512];
  tu_mkdtemp(dir, "ckpt");
  mega_err err = {0};
  char *p = NULL;
  assert_int_equal(mega_ckpt_resolve(dir, &p, NULL, &err), MEGA_ERR_NOT_FOUND);
  assert_int_equal(mega_ckpt_resolve("/nonexistent/mega", &p, NULL, &err), MEGA_ERR_NOT_FOUND);
  snprintf(path, sizeof path, "%s/" MEGA_CKPT_LATEST_FILE, dir);
  tu_write_text(path, "banana\n");
  assert_int_equal(mega_ckpt_resolve(dir, &p, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "one iteration number"));
  tu_write_text(path, "40\n");
  assert_int_equal(mega_ckpt_resolve(dir, &p, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "iter_0000040"));

  model a;
  model_make(&a, 1);
  save_ok(&a, dir, 40, 0);
  snprintf(path, sizeof path, "%s/iter_0000040", dir);
  assert_int_equal(mega_ckpt_resolve(path, &p, NULL, &err), MEGA_OK); /* a checkpoint dir itself */
  assert_string_equal(p, path);
  free(p);
  model_free(&a);
  tu_rmtree(dir);
}

/* config.json's bos_token_id and eos_token_id are the job's tokenizer's:
 * GPT-2's BPE names "<|endoftext|>" for both (50256 in GPT-2's own
 * vocab.json, 4 in this one), NullTokenizer --vocab-size N ends documents
 * with N and has no beginning id, the byte tokenizer has neither (null,
 * not HF's default); both architectures; without a job, neither key. */
static json_t *saved_config(model *m, const char *dir, const mega_jobspec *job) {
  char path[512];
  mega_err err = {0};
  mega_ckpt_state s = state_at(1);
  mega_ckpt_save_opts o = {0};
  if (mega_ckpt_save(dir, m->be, &m->cfg, job, &s, m->cp, m->n, &o, &err) != MEGA_OK)
    fail_msg("save: %s", err.msg);
  snprintf(path, sizeof path, "%s/iter_0000001/config.json", dir);
  json_t *c = json_load_file(path, 0, NULL);
  assert_non_null(c);
  tu_rmtree(dir);
  return c;
}

static void assert_ids(json_t *c, int bos, int eos) {
  json_t *b = json_object_get(c, "bos_token_id"), *e = json_object_get(c, "eos_token_id");
  assert_non_null(b);
  assert_non_null(e);
  if (bos < 0) assert_true(json_is_null(b));
  else assert_int_equal(json_integer_value(b), bos);
  if (eos < 0) assert_true(json_is_null(e));
  else assert_int_equal(json_integer_value(e), eos);
  json_decref(c);
}

static void test_special_ids(void **state) {
  (void)state;
  char dir[256], vocab[300];
  model gpt2, llama;
  model_make(&gpt2, 1);
  llama_make(&llama, 1);
  mega_jobspec job;
  mega_err err = {0};
  for (int arch = 0; arch < 2; arch++) {
    model *m = arch ? &llama : &gpt2;
    tu_mkdtemp(dir, "ckpt");
    json_t *c = saved_config(m, dir, NULL);
    assert_null(json_object_get(c, "bos_token_id"));
    assert_null(json_object_get(c, "eos_token_id"));
    json_decref(c);

    mega_jobspec_defaults(&job); /* bytes */
    tu_mkdtemp(dir, "ckpt");
    assert_ids(saved_config(m, dir, &job), -1, -1);

    job.tokenizer_type = MEGA_TOKENIZER_NULL;
    job.vocab_size = 255;
    tu_mkdtemp(dir, "ckpt");
    assert_ids(saved_config(m, dir, &job), -1, 255);

    char tmp[256];
    tu_mkdtemp(tmp, "vocab");
    snprintf(vocab, sizeof vocab, "%s/vocab.json", tmp);
    FILE *f = fopen(vocab, "w");
    assert_non_null(f);
    fputs("{\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"<|endoftext|>\": 4}", f);
    fclose(f);
    mega_jobspec_defaults(&job);
    job.vocab_file = strdup(vocab);
    assert_int_equal(mega_jobspec_load_vocab(&job, &err), MEGA_OK);
    tu_mkdtemp(dir, "ckpt");
    assert_ids(saved_config(m, dir, &job), 4, 4);
    /* a vocabulary without "<|endoftext|>" has no such id */
    f = fopen(vocab, "w");
    fputs("{\"a\": 0, \"b\": 1}", f);
    fclose(f);
    assert_int_equal(mega_jobspec_load_vocab(&job, &err), MEGA_OK);
    tu_mkdtemp(dir, "ckpt");
    assert_ids(saved_config(m, dir, &job), -1, -1);
    mega_jobspec_free(&job);
    tu_rmtree(tmp);
  }
  model_free(&gpt2);
  model_free(&llama);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_llama_round_trip),
      cmocka_unit_test(test_rotary_fraction),
      cmocka_unit_test(test_rotary_digits),
      cmocka_unit_test(test_config_too_large),
      cmocka_unit_test(test_untied_gpt2),
      cmocka_unit_test(test_gelu_form),
      cmocka_unit_test(test_sharding),
      cmocka_unit_test(test_shard_order),
      cmocka_unit_test(test_resolve),
      cmocka_unit_test(test_special_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
