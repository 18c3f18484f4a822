#include "ckpt_util.h"

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void tu_mkdtemp(char *path, const char *tag) {
  const char *base = getenv("TMPDIR");
  snprintf(path, 256, "%s/mega-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  if (!mkdtemp(path)) {
    perror("mkdtemp");
    exit(1);
  }
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

void tu_rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

int tu_count_prefix(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

bool tu_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

void tu_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

void tu_write_repetitive(const char *path, size_t n) {
  static const char phrase[] = "the quick brown fox jumps over the lazy dog. ";
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  for (size_t i = 0; i < n; i++) fputc(phrase[i % (sizeof phrase - 1)], f);
  fclose(f);
}
