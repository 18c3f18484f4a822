/* worker/ckpt_*: the files that say what a checkpoint holds, as found on
 * disk. The first byte picks the file the rest of the input becomes:
 *   0  model.safetensors.index.json beside two real shards (open_shards)
 *   1  manifest.json beside three files (mega_ckpt_verify)
 *   2  latest_checkpointed_iteration.txt (mega_ckpt_resolve)
 *   3  trainer_state.json beside a matching config.json (mega_ckpt_load)
 * A bad file is an error with a reason, never a crash. */
#include "worker/backend/backend.h"
#include "worker/ckpt/ckpt_internal.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"
#include "fuzz.h"

static mega_gpt_config cfg;
static mega_jobspec job;
static mega_backend *be;

/* The files the input's file sits beside (rewritten after every clean). */
static void beside(int mode) {
  const char *dir = fuzz_dir();
  mega_err err = {0};
  if (mode == 0) {
    float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
    mega_st_tensor t1[] = {{.name = "wte", .ndim = 2, .shape = {2, 3}, .numel = 6, .data = a}};
    mega_st_tensor t2[] = {{.name = "ln.b", .ndim = 1, .shape = {2}, .numel = 2, .data = b}};
    char p[512];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    FUZZ_CHECK(mega_st_write(p, t1, 1, NULL, 0, &err) == MEGA_OK);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    FUZZ_CHECK(mega_st_write(p, t2, 1, NULL, 0, &err) == MEGA_OK);
  } else if (mode == 1) {
    fuzz_file("config.json", (const uint8_t *)"{}\n", 3);
    fuzz_file("trainer_state.json", (const uint8_t *)"{}\n", 3);
    fuzz_file("a.bin", (const uint8_t *)"abc", 3);
  } else if (mode == 3) {
    FUZZ_CHECK(mega_ckpt_write_json(mega_ckpt_config_json(&cfg, NULL), dir, MEGA_CKPT_CONFIG_FILE, 0,
                                    NULL, &err) == MEGA_OK);
    float w = 1;
    mega_st_tensor t[] = {{.name = "wte", .ndim = 1, .shape = {1}, .numel = 1, .data = &w}};
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FUZZ_CHECK(mega_st_write(p, t, 1, NULL, 0, &err) == MEGA_OK);
  }
}

static void once(void) {
  if (be) return;
  mega_gpt_config_default(&cfg);
  cfg.num_layers = 2;
  cfg.channels = 32;
  cfg.num_heads = 2;
  cfg.max_seq_len = 16;
  mega_jobspec_defaults(&job);
  job.num_layers = 2;
  job.hidden_size = 32;
  job.num_attention_heads = 2;
  job.seq_length = 16;
  mega_err err = {0};
  FUZZ_CHECK(mega_backend_cpu_create(NULL, &be, &err) == MEGA_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  once();
  int mode = data[0] % 4;
  fuzz_clean();
  beside(mode);
  const char *dir = fuzz_dir();
  mega_err err = {0};
  mega_status st;
  if (mode == 0) {
    fuzz_file("model.safetensors.index.json", data + 1, size - 1);
    mega_ckpt_shards sh = {0};
    st = mega_ckpt_open_shards(dir, "model", &sh, &err);
    if (st == MEGA_OK) {
      FUZZ_CHECK(sh.nfiles >= 1 && sh.nfiles <= 2);
      mega_ckpt_close_shards(&sh);
    }
  } else if (mode == 1) {
    fuzz_file("manifest.json", data + 1, size - 1);
    st = mega_ckpt_verify(dir, -1, &err);
  } else if (mode == 2) {
    fuzz_file("latest_checkpointed_iteration.txt", data + 1, size - 1);
    char *path = NULL, *notice = NULL;
    st = mega_ckpt_resolve(dir, &path, &notice, &err);
    free(path);
    free(notice);
  } else {
    fuzz_file(MEGA_CKPT_STATE_FILE, data + 1, size - 1);
    mega_ckpt_state state = {0};
    st = mega_ckpt_load(dir, be, &cfg, &job, NULL, 0, &state, &err);
  }
  if (st != MEGA_OK) FUZZ_CHECK(err.msg[0]);
  return 0;
}
