/* The checkpoint directory protocol: the shared temp directory, fsync,
 * rename into place, latest_checkpointed_iteration.txt, cleanup. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "core/nofollow.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_internal.h"

#define TEMP_PREFIX MEGA_CKPT_TEMP_PREFIX

bool mega_ckpt_iter_path(char *buf, size_t cap, const char *dir, int64_t iteration) {
  int w = snprintf(buf, cap, "%s/iter_%07" PRId64, dir, iteration);
  return w > 0 && (size_t)w < cap;
}

mega_status mega_ckpt_fsync_path(const char *path, mega_err *err) {
  char link[4096] = "";
  if (mega_nf_fsync(path, link, sizeof link) == 0) return MEGA_OK;
  return mega_ckpt_refuse(err, MEGA_ERR_IO, "sync", path, errno, link);
}

/* A --save that names a place no directory can be (under a file, in
 * /proc, a read-only or forbidden tree) is a bad job, which a restart would
 * meet again (MEGA_ERR_INVALID: megad fails the job at once instead of
 * spending its restarts); a full or failing disk is an I/O error. */
static mega_status path_status(int e) {
  switch (e) {
  case ENOENT: case ENOTDIR: case EEXIST: case EACCES: case EPERM: case EROFS:
  case ENAMETOOLONG: case ELOOP:
    return MEGA_ERR_INVALID;
  default:
    return MEGA_ERR_IO;
  }
}

/* mkdir -p without following a link: megaw resolved --save at start, so a
 * link on the way was put there since. */
static mega_status mkdir_p(const char *path, mega_err *err) {
  char link[4096];
  if (mega_nf_mkdirs(path, 0755, link, sizeof link) == 0) return MEGA_OK;
  int e = errno;
  if (e == ELOOP) return mega_ckpt_refuse(err, MEGA_ERR_INVALID, "write into", path, e, link);
  return mega_fail(err, path_status(e), "cannot create --save directory %s: %s", path,
                   strerror(e));
}

/* Removes parent's flat directory name (what a save creates); a link
 * there goes itself, without what it points at. */
static int remove_flat_at(int parent, const char *name) {
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return unlinkat(parent, name, 0);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -1;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
  return unlinkat(parent, name, AT_REMOVEDIR);
}

static int remove_flat_dir(const char *path) {
  char name[256];
  int parent = mega_nf_parent(path, name, sizeof name, NULL, 0);
  if (parent < 0) return -1;
  int rc = remove_flat_at(parent, name);
  close(parent);
  return rc;
}

mega_status mega_ckpt_prepare_save(const char *save_dir, mega_err *err) {
  mega_status st = mkdir_p(save_dir, err);
  if (st != MEGA_OK) return st;
  if (access(save_dir, W_OK | X_OK) != 0) {
    int e = errno;
    return mega_fail(err, path_status(e), "cannot write into --save directory %s: %s", save_dir,
                     strerror(e));
  }
  return mega_ckpt_clean_temps(save_dir, NULL, err);
}

mega_status mega_ckpt_clean_temps(const char *save_dir, int *removed, mega_err *err) {
  if (removed) *removed = 0;
  char link[4096];
  int fd = mega_nf_open(save_dir, O_RDONLY | O_DIRECTORY, 0, link, sizeof link);
  if (fd < 0 && errno == ENOENT) return MEGA_OK;
  if (fd < 0) return mega_ckpt_refuse(err, MEGA_ERR_IO, "read --save directory", save_dir, errno,
                                      link);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "cannot read --save directory %s: %s", save_dir,
                     strerror(errno));
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, TEMP_PREFIX, strlen(TEMP_PREFIX)) != 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    int rc = S_ISDIR(st.st_mode) ? remove_flat_at(dirfd(d), e->d_name)
                                 : unlinkat(dirfd(d), e->d_name, 0);
    if (rc == 0 && removed) (*removed)++;
  }
  closedir(d);
  return MEGA_OK;
}

mega_status mega_ckpt_begin(const char *save_dir, int64_t iteration, int attempt, bool fresh,
                            char *tmp, size_t cap, mega_err *err) {
  mega_status st = mkdir_p(save_dir, err);
  if (st != MEGA_OK) return st;
  int w = snprintf(tmp, cap, "%s/" TEMP_PREFIX "iter_%07" PRId64 ".a%d", save_dir, iteration,
                   attempt);
  if (w < 0 || (size_t)w >= cap) return mega_fail(err, MEGA_ERR_INVALID, "--save path too long");
  if (fresh) remove_flat_dir(tmp);
  char link[4096];
  if (mega_nf_mkdirs(tmp, 0755, link, sizeof link) != 0)
    return mega_ckpt_refuse(err, MEGA_ERR_IO, "create the temp directory", tmp, errno, link);
  return MEGA_OK;
}

mega_status mega_ckpt_write_json(json_t *j, const char *dir, const char *name, size_t flags,
                                 mega_ckpt_file *out, mega_err *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = j ? json_dumps(j, flags) : NULL;
  json_decref(j);
  if (!text) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building %s", path);
  size_t len = strlen(text);
  text[len] = '\n'; /* json_dump_file ends without one; a file reads better with it */
  char link[4096];
  int fd = mega_nf_create(path, 0644, link, sizeof link);
  mega_status st = MEGA_OK;
  if (fd < 0) {
    st = mega_ckpt_refuse(err, MEGA_ERR_IO, "write", path, errno, link);
  } else {
    size_t done = 0;
    while (done < len + 1) {
      ssize_t w = write(fd, text + done, len + 1 - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += (size_t)w;
    }
    if (done != len + 1 || fsync(fd) != 0)
      st = mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == MEGA_OK)
      st = mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  if (st == MEGA_OK && out) {
    snprintf(out->name, sizeof out->name, "%s", name);
    out->size = len + 1;
    out->crc32 = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)(len + 1));
  }
  free(text);
  return st;
}

void mega_ckpt_abort(const char *tmp) { remove_flat_dir(tmp); }

/* The latest file, through a temp file made anew (O_EXCL: never one a
 * link or an older file stands at) and renamed within SAVE's fd. */
static mega_status write_latest(int dir, const char *save_dir, int64_t iteration,
                                mega_err *err) {
  const char *tmp = TEMP_PREFIX MEGA_CKPT_LATEST_FILE;
  unlinkat(dir, tmp, 0);
  int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot write %s/%s: %s", save_dir, tmp, strerror(errno));
  char text[32];
  int len = snprintf(text, sizeof text, "%" PRId64 "\n", iteration);
  bool ok = write(fd, text, (size_t)len) == len;
  ok = fsync(fd) == 0 && ok;
  ok = close(fd) == 0 && ok;
  if (!ok) {
    int saved = errno;
    unlinkat(dir, tmp, 0);
    return mega_fail(err, MEGA_ERR_IO, "cannot write %s/%s: %s", save_dir, tmp, strerror(saved));
  }
  if (renameat(dir, tmp, dir, MEGA_CKPT_LATEST_FILE) != 0) {
    int saved = errno;
    unlinkat(dir, tmp, 0);
    return mega_fail(err, MEGA_ERR_IO, "cannot rename %s/%s into place: %s", save_dir, tmp,
                     strerror(saved));
  }
  if (fsync(dir) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot sync %s: %s", save_dir, strerror(errno));
  return MEGA_OK;
}

/* Without atomic exchange: move an older copy aside (to a temp name that
 * cleanup removes), then rename. Names are dir's. */
static mega_status replace_plain(int dir, const char *tmp, const char *final, int64_t iteration,
                                 mega_err *err) {
  if (renameat(dir, tmp, dir, final) == 0) return MEGA_OK;
  if (errno != ENOTEMPTY && errno != EEXIST)
    return mega_fail(err, MEGA_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
  char old[64];
  snprintf(old, sizeof old, TEMP_PREFIX "old.iter_%07" PRId64, iteration);
  remove_flat_at(dir, old);
  if (renameat(dir, final, dir, old) != 0 || renameat(dir, tmp, dir, final) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot replace %s: %s", final, strerror(errno));
  remove_flat_at(dir, old);
  return MEGA_OK;
}

/* Renames SAVE's temp directory tmp to iter_NNNNNNN, all within dir (SAVE,
 * opened without following links), and points the latest file at it. */
static mega_status commit_at(int dir, const char *save_dir, const char *tmp, int64_t iteration,
                             mega_err *err) {
  char final[64];
  snprintf(final, sizeof final, "iter_%07" PRId64, iteration);
  struct stat sb;
  if (fstatat(dir, final, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(sb.st_mode)) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", save_dir, final);
    return mega_ckpt_refuse(err, MEGA_ERR_INVALID, "replace", path,
                            S_ISLNK(sb.st_mode) ? ELOOP : EINVAL, path);
  }
  /* Same iteration saved before (a resumed run): swap atomically, so the
   * name always holds a complete checkpoint, then drop the old copy. */
  mega_status st = MEGA_OK;
  if (renameat2(dir, tmp, dir, final, RENAME_NOREPLACE) != 0) {
    if (errno == EINVAL) { /* a file system without renameat2 flags */
      st = replace_plain(dir, tmp, final, iteration, err);
      if (st != MEGA_OK) return st;
    } else if (errno != EEXIST) {
      return mega_fail(err, MEGA_ERR_IO, "cannot rename %s to %s in %s: %s", tmp, final,
                       save_dir, strerror(errno));
    } else if (renameat2(dir, tmp, dir, final, RENAME_EXCHANGE) == 0) {
      if (fsync(dir) != 0)
        return mega_fail(err, MEGA_ERR_IO, "cannot sync %s: %s", save_dir, strerror(errno));
      remove_flat_at(dir, tmp); /* now the old copy */
    } else if (errno == EINVAL) {
      st = replace_plain(dir, tmp, final, iteration, err);
      if (st != MEGA_OK) return st;
    } else {
      return mega_fail(err, MEGA_ERR_IO, "cannot replace %s in %s: %s", final, save_dir,
                       strerror(errno));
    }
  }
  if (fsync(dir) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot sync %s: %s", save_dir, strerror(errno));
  return write_latest(dir, save_dir, iteration, err);
}

mega_status mega_ckpt_commit(const char *save_dir, const char *tmp, int64_t iteration,
                             mega_err *err) {
  mega_status st = mega_ckpt_fsync_path(tmp, err);
  if (st != MEGA_OK) return st;
  const char *name = strrchr(tmp, '/');
  name = name ? name + 1 : tmp;
  char link[4096];
  int dir = mega_nf_open(save_dir, O_RDONLY | O_DIRECTORY, 0, link, sizeof link);
  if (dir < 0) return mega_ckpt_refuse(err, MEGA_ERR_IO, "write into", save_dir, errno, link);
  st = commit_at(dir, save_dir, name, iteration, err);
  close(dir);
  return st;
}
