/* worker/ckpt/ckpt_config.c: a checkpoint's config.json as found on disk
 * (a resume checks it against the job; megaw generate builds its model
 * from it). The input is the file. A file it refuses gets a reason; one
 * it takes is a model mega can run (mega_gpt_config_check), read as the
 * file says (its fractions as written, not rounded to a float), and
 * written back by mega's own writer it reads back the same and matches
 * itself. */
#include <math.h>

#include "worker/ckpt/ckpt_internal.h"
#include "fuzz.h"

/* The file's number at key, NAN when it has none. */
static double number(const uint8_t *data, size_t size, const char *key) {
  json_t *j = json_loadb((const char *)data, size, 0, NULL);
  json_t *v = json_object_get(j, key);
  double x = json_is_number(v) ? json_number_value(v) : NAN;
  json_decref(j);
  return x;
}

static bool same(const mega_gpt_config *a, const mega_gpt_config *b) {
  return a->arch == b->arch && a->vocab_size == b->vocab_size &&
         a->max_seq_len == b->max_seq_len && a->num_layers == b->num_layers &&
         a->num_heads == b->num_heads && a->channels == b->channels &&
         mega_gpt_kv_heads(a) == mega_gpt_kv_heads(b) &&
         mega_gpt_head_dim(a) == mega_gpt_head_dim(b) && mega_gpt_ffn(a) == mega_gpt_ffn(b) &&
         mega_gpt_rot_dim(a) == mega_gpt_rot_dim(b) && a->untied == b->untied &&
         a->no_bias == b->no_bias && a->gelu_erf == b->gelu_erf && a->ln_eps == b->ln_eps &&
         (a->arch != MEGA_GPT_ARCH_LLAMA ||
          (a->rope_theta == b->rope_theta && a->rotary_percent == b->rotary_percent));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_clean();
  fuzz_file(MEGA_CKPT_CONFIG_FILE, data, size);
  const char *dir = fuzz_dir();
  mega_gpt_config cfg, back;
  mega_err err = {0};
  if (mega_ckpt_read_config(dir, &cfg, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0]);
    return 0;
  }
  FUZZ_CHECK(mega_gpt_config_check(&cfg, &err) == MEGA_OK);
  if (cfg.arch == MEGA_GPT_ARCH_LLAMA) {
    double p = number(data, size, "partial_rotary_factor");
    FUZZ_CHECK(cfg.rotary_percent == (isnan(p) ? 1.0 : p));
  }
  double pd = number(data, size, cfg.arch == MEGA_GPT_ARCH_LLAMA ? "attention_dropout"
                                                                 : "attn_pdrop");
  FUZZ_CHECK(cfg.attention_dropout == (isnan(pd) ? 0.0 : pd));
  /* as a save writes it (ckpt_writer.c) */
  json_t *cj = mega_ckpt_config_json(&cfg, NULL);
  FUZZ_CHECK(mega_ckpt_write_json(cj, dir, MEGA_CKPT_CONFIG_FILE, mega_ckpt_config_flags(cj),
                                  NULL, &err) == MEGA_OK);
  if (mega_ckpt_read_config(dir, &back, &err) != MEGA_OK) fprintf(stderr, "%s\n", err.msg);
  FUZZ_CHECK(err.msg[0] == 0 && same(&cfg, &back));
  if (mega_ckpt_check_config(dir, &cfg, &err) != MEGA_OK) fprintf(stderr, "%s\n", err.msg);
  FUZZ_CHECK(err.msg[0] == 0);
  return 0;
}
