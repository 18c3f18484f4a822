/* Feeds every file of the given corpus directories to the target's
 * LLVMFuzzerTestOneInput, built with the normal compiler: the committed
 * corpora (and every past finding in them) run in the default suite. */
#include <dirent.h>
#include <sys/stat.h>

#include "fuzz.h"

static int feed(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    fclose(f);
    free(buf);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 0;
}

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  int bad = 0, fed = 0;
  for (int a = 1; a < argc; a++) {
    DIR *d = opendir(argv[a]);
    if (!d) {
      bad |= feed(argv[a]);
      fed++;
      continue;
    }
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      names = realloc(names, (n + 1) * sizeof *names);
      names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp);
    for (size_t i = 0; i < n; i++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[a], names[i]);
      bad |= feed(p);
      fed++;
      free(names[i]);
    }
    free(names);
  }
  printf("replayed %d input%s\n", fed, fed == 1 ? "" : "s");
  if (!fed) {
    fprintf(stderr, "replay: no inputs (an empty corpus checks nothing)\n");
    return 1;
  }
  return bad;
}
