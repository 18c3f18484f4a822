/* Shared by the fuzz targets: each defines LLVMFuzzerTestOneInput, which
 * libFuzzer drives (meson -Dfuzz=true, scripts/fuzz) and replay.c feeds
 * the committed corpus in the default test suite. */
#ifndef MEGA_TESTS_FUZZ_H
#define MEGA_TESTS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property the code promises failed: a finding, like a crash. */
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);     \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

/* data as a NUL-terminated string (the caller frees); an embedded NUL ends
 * it, as it would for a C caller. */
static inline char *fuzz_str(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

/* A directory of this process's own for targets that read files. */
const char *fuzz_dir(void);
/* Writes data to fuzz_dir()/name; returns the path (static buffer). */
const char *fuzz_file(const char *name, const uint8_t *data, size_t size);
/* Empties fuzz_dir() (files only). */
void fuzz_clean(void);

#endif
