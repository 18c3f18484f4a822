/* Checkpoint files opened without following links (core/nofollow.h): a
 * link planted in a --load or swapped into a --save is refused, naming it,
 * and what it points at is never read or written. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/nofollow.h"
#include "worker/ckpt/ckpt_internal.h"

mega_status mega_ckpt_refuse(mega_err *err, mega_status code, const char *doing,
                             const char *path, int e, const char *link) {
  char why[4400];
  mega_nf_why(e, link, why, sizeof why);
  if (e == ELOOP)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "refusing to %s %s: %s; a checkpoint's files must be plain files and its "
                     "directories real ones, not links (remove it)",
                     doing, path, why);
  if (e == EINVAL)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cannot %s %s: not a plain file; a checkpoint's files must be plain files",
                     doing, path);
  return mega_fail(err, code, "cannot %s %s: %s", doing, path, why);
}

mega_status mega_ckpt_open_plain(const char *path, int *fd, mega_err *err) {
  char link[4096];
  *fd = mega_nf_open_file(path, link, sizeof link);
  if (*fd < 0) return mega_ckpt_refuse(err, MEGA_ERR_IO, "read", path, errno, link);
  return MEGA_OK;
}

mega_status mega_ckpt_load_json(const char *path, json_t **out, json_error_t *jerr,
                                mega_err *err) {
  int fd;
  *out = NULL;
  mega_status st = mega_ckpt_open_plain(path, &fd, err);
  if (st != MEGA_OK) return st;
  *out = json_loadfd(fd, 0, jerr);
  close(fd);
  return MEGA_OK;
}

int mega_ckpt_lstat(const char *path, struct stat *st) {
  int fd = mega_nf_open(path, O_PATH, 0, NULL, 0);
  if (fd < 0) return -1;
  int rc = fstat(fd, st);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}
