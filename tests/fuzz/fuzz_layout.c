/* core/layout: --pipeline-model-parallel-layout strings. The first byte
 * picks PP (1..16); the rest is the string. What parses must format and
 * parse back to the same stages. */
#include "core/layout.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int pp = 1 + data[0] % 16;
  char *s = fuzz_str(data + 1, size - 1);
  mega_layout l;
  mega_err err = {0};
  if (mega_layout_parse(s, pp, &l, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0]);
    free(s);
    return 0;
  }
  FUZZ_CHECK(l.pp == pp && l.vp >= 1 && l.nstages == l.pp * l.vp);
  static const char kinds[] = {MEGA_LAYER_EMBEDDING, MEGA_LAYER_DECODER, MEGA_LAYER_MTP,
                               MEGA_LAYER_LOSS};
  for (int r = 0; r < l.pp; r++)
    for (int v = 0; v < l.vp; v++) {
      int len = 0;
      mega_layout_stage(&l, r, v, &len);
      FUZZ_CHECK(len >= 0);
      for (int k = 0; k < 4; k++) {
        int n = mega_layout_count(&l, r, v, kinds[k]);
        FUZZ_CHECK(n >= 0 && n <= len);
        int *ids = malloc(((size_t)n + 1) * sizeof *ids);
        FUZZ_CHECK(mega_layout_ids(&l, r, v, kinds[k], ids) == n);
        int off = mega_layout_offset(&l, r, v, kinds[k]);
        for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] == off + i);
        FUZZ_CHECK(off + n <= mega_layout_total(&l, kinds[k]));
        free(ids);
      }
    }
  char *f = mega_layout_format(&l);
  FUZZ_CHECK(f);
  mega_layout back;
  FUZZ_CHECK(mega_layout_parse(f, pp, &back, &err) == MEGA_OK);
  FUZZ_CHECK(back.vp == l.vp && !strcmp(back.kinds, l.kinds));
  for (int i = 0; i <= l.nstages; i++) FUZZ_CHECK(back.stage_start[i] == l.stage_start[i]);
  mega_layout_free(&back);
  free(f);
  mega_layout_free(&l);
  free(s);
  return 0;
}
