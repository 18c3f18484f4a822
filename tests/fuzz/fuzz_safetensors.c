/* worker/model/safetensors: a .safetensors file as a checkpoint or a
 * Hugging Face download might hold it. What opens must read back every
 * tensor it lists. */
#include "worker/model/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file("t.safetensors", data, size);
  mega_st_file *f = NULL;
  mega_err err = {0};
  if (mega_st_open(path, &f, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0] && !f);
    return 0;
  }
  size_t n = mega_st_count(f);
  for (size_t i = 0; i < n; i++) {
    const mega_st_tensor *t = mega_st_at(f, i);
    FUZZ_CHECK(t && t->name && t->ndim >= 0 && t->ndim <= MEGA_ST_MAX_DIMS);
    FUZZ_CHECK(t->numel <= size / 4);
    FUZZ_CHECK(mega_st_find(f, t->name) == t);
    float *buf = malloc((t->numel ? t->numel : 1) * sizeof *buf);
    FUZZ_CHECK(mega_st_read_f32(f, t->name, buf, t->numel, t->shape, t->ndim, &err) == MEGA_OK);
    free(buf);
  }
  mega_st_meta_get(f, "format");
  mega_st_close(f);
  return 0;
}
