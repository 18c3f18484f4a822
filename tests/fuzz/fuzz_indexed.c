/* worker/indexed: Megatron's MMIDIDX dataset (PREFIX.idx, PREFIX.bin) as
 * found on disk. The input is a 2-byte little-endian length L, then L bytes
 * of .idx, then .bin. What opens must read every sequence it lists (each
 * token checked against a vocabulary), or refuse a token with a reason. */
#include "worker/data/indexed.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t l = (size_t)data[0] | (size_t)data[1] << 8;
  if (l > size - 2) l = size - 2;
  fuzz_file("d.idx", data + 2, l);
  fuzz_file("d.bin", data + 2 + l, size - 2 - l);
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/d", fuzz_dir());
  mega_indexed *x = NULL;
  mega_err err = {0};
  if (mega_indexed_open(prefix, &x, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0] && !x);
    return 0;
  }
  int64_t n = mega_indexed_sequences(x);
  FUZZ_CHECK(n >= 0 && mega_indexed_documents(x) >= 0);
  int32_t buf[256];
  for (int64_t i = 0; i < n && i < 64; i++) {
    int64_t len = mega_indexed_length(x, i);
    FUZZ_CHECK(len >= 0 && (size_t)len <= size); /* .bin holds it */
    int64_t k = len < 256 ? len : 256;
    if (mega_indexed_read(x, i, 0, k, 50257, buf, &err) != MEGA_OK) FUZZ_CHECK(err.msg[0]);
  }
  mega_indexed_close(x);
  return 0;
}
