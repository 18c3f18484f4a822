#include "core/dirperm.h"

#include <stddef.h>
#include <sys/stat.h>

const char *mega_dir_others_write(unsigned mode) {
  if (!(mode & S_IWOTH)) return NULL;
  return (mode & S_ISVTX) ? "sticky, like /tmp" : "anyone may write";
}
