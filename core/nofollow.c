/* Path walks that refuse symbolic links (core/nofollow.h). */
#include "core/nofollow.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* After a failed openat(dir, name, ...NOFOLLOW): a link there is ELOOP
 * (O_DIRECTORY reports one as ENOTDIR, O_EXCL as EEXIST). */
static int refuse(int dir, const char *name, const char *path, size_t end, char *link,
                  size_t cap) {
  int e = errno;
  struct stat st;
  if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    e = ELOOP;
    if (link && cap) snprintf(link, cap, "%.*s", (int)end, path);
  }
  return e;
}

/* Walks path's directories; with make, creates the missing ones. Returns
 * the last directory's fd and leaves the last name in name. */
static int walk(const char *path, bool make, mode_t mode, char *name, size_t namecap, char *link,
                size_t cap) {
  if (link && cap) link[0] = '\0';
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--; /* "dir/" names dir */
  size_t cut = n;
  while (cut > 0 && path[cut - 1] != '/') cut--;
  if (n - cut + 1 > namecap) {
    errno = ENAMETOOLONG;
    return -1;
  }
  snprintf(name, namecap, "%.*s", (int)(n - cut), path + cut);
  if (!name[0]) snprintf(name, namecap, "."); /* path "/" */
  int fd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  char comp[256];
  for (size_t i = 0; fd >= 0 && i < cut;) {
    size_t j = i;
    while (j < cut && path[j] != '/') j++;
    size_t len = j - i;
    if (len >= sizeof comp) {
      close(fd);
      errno = ENAMETOOLONG;
      return -1;
    }
    memcpy(comp, path + i, len);
    comp[len] = '\0';
    i = j + 1;
    if (!len || !strcmp(comp, ".")) continue;
    if (make && mkdirat(fd, comp, mode) != 0 && errno != EEXIST) {
      int e = errno;
      close(fd);
      errno = e;
      if (link && cap) snprintf(link, cap, "%.*s", (int)j, path);
      return -1;
    }
    int next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      int e = refuse(fd, comp, path, j, link, cap);
      close(fd);
      errno = e;
      return -1;
    }
    close(fd);
    fd = next;
  }
  return fd;
}

int mega_nf_parent(const char *path, char *name, size_t namecap, char *link, size_t cap) {
  return walk(path, false, 0, name, namecap, link, cap);
}

int mega_nf_open(const char *path, int flags, mode_t mode, char *link, size_t cap) {
  char name[256];
  int dir = walk(path, false, 0, name, sizeof name, link, cap);
  if (dir < 0) return -1;
  int fd = openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
  int e = fd < 0 ? refuse(dir, name, path, strlen(path), link, cap) : 0;
  close(dir);
  errno = e;
  return fd;
}

int mega_nf_fsync(const char *path, char *link, size_t cap) {
  int fd = mega_nf_open(path, O_RDONLY, 0, link, cap);
  if (fd < 0) return -1;
  int rc = fsync(fd), e = errno;
  close(fd);
  errno = e;
  return rc;
}

int mega_nf_open_file(const char *path, char *link, size_t cap) {
  int fd = mega_nf_open(path, O_RDONLY | O_NONBLOCK, 0, link, cap);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  /* back to blocking reads (a regular file never blocks, but be plain) */
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int mega_nf_create(const char *path, mode_t mode, char *link, size_t cap) {
  char name[256];
  int dir = walk(path, false, 0, name, sizeof name, link, cap);
  if (dir < 0) return -1;
  unlinkat(dir, name, 0);
  int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  int e = fd < 0 ? refuse(dir, name, path, strlen(path), link, cap) : 0;
  close(dir);
  errno = e;
  return fd;
}

int mega_nf_mkdirs(const char *path, mode_t mode, char *link, size_t cap) {
  char name[256];
  int dir = walk(path, true, mode, name, sizeof name, link, cap);
  if (dir < 0) return -1;
  int rc = 0;
  if (mkdirat(dir, name, mode) != 0 && errno != EEXIST) rc = -1;
  int e = errno;
  if (rc == 0) {
    int fd = openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      rc = -1;
      e = refuse(dir, name, path, strlen(path), link, cap);
    } else {
      close(fd);
    }
  }
  close(dir);
  errno = e;
  return rc;
}

const char *mega_nf_why(int e, const char *link, char *buf, size_t cap) {
  if (e == ELOOP && link && link[0])
    snprintf(buf, cap, "%s is a symbolic link", link);
  else if (e == EINVAL)
    snprintf(buf, cap, "not a plain file");
  else
    snprintf(buf, cap, "%s", strerror(e));
  return buf;
}

char *mega_nf_resolve(const char *path) {
  char *real = realpath(path, NULL);
  if (real || errno != ENOENT) return real;
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  size_t cut = n;
  while (cut > 0 && path[cut - 1] != '/') cut--;
  if (cut == 0 || n == cut) return NULL; /* "name" with no parent given: realpath said ENOENT */
  char *parent = strndup(path, cut > 1 ? cut - 1 : 1);
  if (!parent) return NULL;
  char *up = mega_nf_resolve(parent);
  free(parent);
  if (!up) return NULL;
  size_t ul = strlen(up);
  char *out = malloc(ul + 1 + (n - cut) + 1);
  if (out)
    sprintf(out, "%s%s%.*s", up, ul > 1 ? "/" : "", (int)(n - cut), path + cut);
  free(up);
  return out;
}
