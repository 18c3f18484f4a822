#include "core/port.h"

#include <string.h>

bool mega_port_parse(const char *s, size_t n, unsigned *out) {
  if (n == 0 || n > 5) return false;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v > 65535) return false;
  *out = v;
  return true;
}

bool mega_port_of(const char *addr, unsigned *out) {
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  return colon && mega_port_parse(colon + 1, strlen(colon + 1), out);
}
