/* The scratch directory of the targets that read files: one per process,
 * in /dev/shm when there is one (fast), removed at exit. */
#include <dirent.h>
#include <unistd.h>

#include "fuzz.h"

static char dir[256];

void fuzz_clean(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
      continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
}

static void remove_dir(void) {
  fuzz_clean();
  rmdir(dir);
}

const char *fuzz_dir(void) {
  if (dir[0]) return dir;
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(dir, sizeof dir, "%s/mega-fuzz-XXXXXX", base);
  if (!mkdtemp(dir)) abort();
  atexit(remove_dir);
  return dir;
}

const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
  return path;
}
