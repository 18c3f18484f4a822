#include "core/secret.h"

bool mega_secret_equal(const void *sent, size_t sent_len, const void *want, size_t want_len) {
  const unsigned char *s = sent, *w = want;
  /* volatile: the compiler may not stop at the first difference */
  volatile unsigned char diff = sent_len != want_len;
  for (size_t i = 0; i < want_len; i++) diff |= (unsigned char)(w[i] ^ (i < sent_len ? s[i] : 0));
  return diff == 0;
}
