/* UTF-8 checking and repair (see utf8.h). */
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

size_t mega_utf8_seq(const unsigned char *s, size_t n) {
  if (!n) return 0;
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned cp, min;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    cp = c & 0x1f;
    min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    cp = c & 0x0f;
    min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    cp = c & 0x07;
    min = 0x10000;
  } else {
    return 0; /* a continuation byte, an overlong lead (c0, c1) or past f4 */
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

bool mega_utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n) {
    size_t k = mega_utf8_seq(p, n);
    if (!k) return false;
    p += k;
    n -= k;
  }
  return true;
}

char *mega_utf8_sanitize(const char *s) {
  size_t n = strlen(s);
  char *out = malloc(3 * n + 1); /* each bad byte becomes 3 */
  if (!out) return NULL;
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0;
  while (n) {
    size_t k = mega_utf8_seq(p, n);
    if (k) {
      memcpy(out + o, p, k);
      o += k;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      k = 1;
    }
    p += k;
    n -= k;
  }
  out[o] = '\0';
  return out;
}
