/* core/utf8: text from outside (paths, job names over raw gRPC) checked and
 * made printable before it goes into JSON. The input is the bytes. Each
 * position must decode as the Unicode standard's table of well-formed
 * sequences (Table 3-7) says, written here independently; a string is
 * valid when every sequence is; sanitizing keeps valid text as it is and
 * turns each other byte into U+FFFD, so what comes out is valid. */
#include "core/utf8.h"
#include "fuzz.h"

/* Bytes of the well-formed sequence at s (at most n), 0 when none. */
static size_t ref_seq(const uint8_t *s, size_t n) {
  static const struct {
    uint8_t lo0, hi0, lo1, hi1;
    size_t len;
  } rows[] = {
      {0x00, 0x7f, 0, 0, 1},       {0xc2, 0xdf, 0x80, 0xbf, 2}, {0xe0, 0xe0, 0xa0, 0xbf, 3},
      {0xe1, 0xec, 0x80, 0xbf, 3}, {0xed, 0xed, 0x80, 0x9f, 3}, {0xee, 0xef, 0x80, 0xbf, 3},
      {0xf0, 0xf0, 0x90, 0xbf, 4}, {0xf1, 0xf3, 0x80, 0xbf, 4}, {0xf4, 0xf4, 0x80, 0x8f, 4},
  };
  if (!n) return 0;
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    if (s[0] < rows[r].lo0 || s[0] > rows[r].hi0) continue;
    size_t len = rows[r].len;
    if (n < len) return 0;
    if (len > 1 && (s[1] < rows[r].lo1 || s[1] > rows[r].hi1)) return 0;
    for (size_t i = 2; i < len; i++)
      if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* every position of the bytes as given, NULs and all */
  for (size_t i = 0; i < size; i++)
    FUZZ_CHECK(mega_utf8_seq(data + i, size - i) == ref_seq(data + i, size - i));
  FUZZ_CHECK(mega_utf8_seq(data, 0) == 0);

  /* the string a C caller sees, and the sanitized copy it should get */
  char *s = fuzz_str(data, size);
  size_t n = strlen(s);
  char *want = malloc(3 * n + 1);
  FUZZ_CHECK(want);
  size_t o = 0;
  bool valid = true;
  for (size_t i = 0; i < n;) {
    size_t k = ref_seq((const uint8_t *)s + i, n - i);
    if (k) {
      memcpy(want + o, s + i, k);
      o += k;
      i += k;
    } else {
      memcpy(want + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
      valid = false;
    }
  }
  want[o] = '\0';
  FUZZ_CHECK(mega_utf8_valid(s) == valid);
  char *got = mega_utf8_sanitize(s);
  FUZZ_CHECK(got && !strcmp(got, want));
  FUZZ_CHECK(mega_utf8_valid(got));
  if (valid) FUZZ_CHECK(!strcmp(got, s));
  free(got);
  free(want);
  free(s);
  return 0;
}
