/* Helpers shared by the train tests: scratch directories and files. */
#ifndef MEGA_TESTS_TRAIN_CKPT_UTIL_H
#define MEGA_TESTS_TRAIN_CKPT_UTIL_H

#include <stdbool.h>
#include <stddef.h>

/* mkdtemp under $TMPDIR or /tmp; path gets at least 256 bytes. */
void tu_mkdtemp(char *path, const char *tag);
/* rm -r. */
void tu_rmtree(const char *path);
/* Number of entries in dir whose name starts with prefix. */
int tu_count_prefix(const char *dir, const char *prefix);
bool tu_exists(const char *path);
/* Writes text to path (replacing it). */
void tu_write_text(const char *path, const char *text);
/* Writes n bytes: a repeating phrase (the data for the training tests). */
void tu_write_repetitive(const char *path, size_t n);

#endif
