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

#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_internal.h"

#define TEMP_PREFIX MEGA_CKPT_TEMP_PREFIX

bool mega_ckpt_iter_path(char *buf, size_t cap, const char *dir, int64_t iteration) {
  int w = snprintf(buf, cap, "%s/iter_%07" PRId64, dir, iteration);
  return w > 0 && (size_t)w < cap;
}

mega_status mega_ckpt_fsync_path(const char *path, mega_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mega_fail(err, MEGA_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
  int rc = fsync(fd);
  int saved = errno;
  close(fd);
  if (rc != 0) return mega_fail(err, MEGA_ERR_IO, "cannot sync %s: %s", path, strerror(saved));
  return MEGA_OK;
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

static mega_status mkdir_p(const char *path, mega_err *err) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return mega_fail(err, MEGA_ERR_INVALID, "path too long: %s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
      int e = errno;
      return mega_fail(err, path_status(e), "cannot create %s: %s", buf, strerror(e));
    }
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
    int e = errno;
    return mega_fail(err, path_status(e), "cannot create --save directory %s: %s", buf,
                     strerror(e));
  }
  struct stat st;
  if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID, "--save %s is not a directory", buf);
  return MEGA_OK;
}

/* Removes a flat directory of files (what a save creates). */
static int remove_flat_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
  return rmdir(path);
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
  DIR *d = opendir(save_dir);
  if (!d) {
    if (errno == ENOENT) return MEGA_OK;
    return mega_fail(err, MEGA_ERR_IO, "cannot read --save directory %s: %s", save_dir,
                     strerror(errno));
  }
  struct dirent *e;
  char path[4096];
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, TEMP_PREFIX, strlen(TEMP_PREFIX)) != 0) continue;
    snprintf(path, sizeof path, "%s/%s", save_dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) != 0) continue;
    int rc = S_ISDIR(st.st_mode) ? remove_flat_dir(path) : unlink(path);
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
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return mega_fail(err, MEGA_ERR_IO, "cannot create the temp directory %s: %s", tmp,
                     strerror(errno));
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
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  mega_status st = MEGA_OK;
  if (fd < 0) {
    st = mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", path, strerror(errno));
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

static mega_status write_latest(const char *save_dir, int64_t iteration, mega_err *err) {
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/" TEMP_PREFIX MEGA_CKPT_LATEST_FILE, save_dir);
  snprintf(path, sizeof path, "%s/" MEGA_CKPT_LATEST_FILE, save_dir);
  FILE *f = fopen(tmp, "w");
  if (!f) return mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  int ok = fprintf(f, "%" PRId64 "\n", iteration) > 0;
  ok = (fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (fclose(f) == 0) && ok;
  if (!ok) {
    unlink(tmp);
    return mega_fail(err, MEGA_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  }
  if (rename(tmp, path) != 0) {
    int saved = errno;
    unlink(tmp);
    return mega_fail(err, MEGA_ERR_IO, "cannot rename %s into place: %s", tmp, strerror(saved));
  }
  return mega_ckpt_fsync_path(save_dir, err);
}

/* Without atomic exchange: move an older copy aside (to a temp name that
 * cleanup removes), then rename. */
static mega_status replace_plain(const char *save_dir, const char *tmp, const char *final,
                                 int64_t iteration, mega_err *err) {
  if (rename(tmp, final) == 0) return MEGA_OK;
  if (errno != ENOTEMPTY && errno != EEXIST)
    return mega_fail(err, MEGA_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
  char old[4096];
  snprintf(old, sizeof old, "%s/" TEMP_PREFIX "old.iter_%07" PRId64, save_dir, iteration);
  remove_flat_dir(old);
  if (rename(final, old) != 0 || rename(tmp, final) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot replace %s: %s", final, strerror(errno));
  remove_flat_dir(old);
  return MEGA_OK;
}

mega_status mega_ckpt_commit(const char *save_dir, const char *tmp, int64_t iteration,
                             mega_err *err) {
  mega_status st = mega_ckpt_fsync_path(tmp, err);
  if (st != MEGA_OK) return st;
  char final[4096];
  if (!mega_ckpt_iter_path(final, sizeof final, save_dir, iteration))
    return mega_fail(err, MEGA_ERR_INVALID, "--save path too long");
  /* Same iteration saved before (a resumed run): swap atomically, so the
   * name always holds a complete checkpoint, then drop the old copy. */
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) != 0) {
    if (errno == EINVAL) { /* a file system without renameat2 flags */
      st = replace_plain(save_dir, tmp, final, iteration, err);
      if (st != MEGA_OK) return st;
    } else if (errno != EEXIST) {
      return mega_fail(err, MEGA_ERR_IO, "cannot rename %s to %s: %s", tmp, final,
                       strerror(errno));
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
      st = mega_ckpt_fsync_path(save_dir, err);
      if (st != MEGA_OK) return st;
      remove_flat_dir(tmp); /* now the old copy */
    } else if (errno == EINVAL) {
      st = replace_plain(save_dir, tmp, final, iteration, err);
      if (st != MEGA_OK) return st;
    } else {
      return mega_fail(err, MEGA_ERR_IO, "cannot replace %s: %s", final, strerror(errno));
    }
  }
  st = mega_ckpt_fsync_path(save_dir, err);
  if (st != MEGA_OK) return st;
  return write_latest(save_dir, iteration, err);
}
