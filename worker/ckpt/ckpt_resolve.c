/* --load DIR to a complete checkpoint: the one latest names, or else the
 * newest complete iter_* directory, with a notice saying why. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/nofollow.h"

#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_internal.h"

/* A file, or a link where one should be (which the load then refuses). */
static bool is_file(const char *dir, const char *name) {
  char p[4352];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return mega_ckpt_lstat(p, &st) == 0 && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode));
}

static bool is_checkpoint_dir(const char *dir) {
  return is_file(dir, MEGA_CKPT_MANIFEST_FILE) || is_file(dir, MEGA_CKPT_STATE_FILE);
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The iterations of DIR's iter_NNNNNNN directories, newest first (malloc'd
 * into *out; *n of them). */
static mega_status list_iters(const char *dir, int64_t **out, size_t *n, mega_err *err) {
  *out = NULL;
  *n = 0;
  char link[4096];
  int fd = mega_nf_open(dir, O_RDONLY | O_DIRECTORY, 0, link, sizeof link);
  if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) return MEGA_OK;
  if (fd < 0) return mega_ckpt_refuse(err, MEGA_ERR_IO, "read --load", dir, errno, link);
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "cannot read --load %s: %s", dir, strerror(errno));
  }
  size_t cap = 0;
  mega_status st = MEGA_OK;
  for (struct dirent *e; (e = readdir(d));) {
    const char *p = e->d_name;
    if (strncmp(p, "iter_", 5) != 0 || !p[5] || strspn(p + 5, "0123456789") != strlen(p + 5) ||
        strlen(p + 5) > 18)
      continue;
    struct stat sb; /* a link is no checkpoint of this directory's */
    if (fstatat(dirfd(d), p, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *grown = realloc(*out, cap * sizeof **out);
      if (!grown) {
        st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory listing %s", dir);
        break;
      }
      *out = grown;
    }
    (*out)[(*n)++] = strtoll(p + 5, NULL, 10);
  }
  closedir(d);
  if (st != MEGA_OK) {
    free(*out);
    *out = NULL;
    *n = 0;
    return st;
  }
  if (*n) qsort(*out, *n, sizeof **out, cmp_desc);
  return MEGA_OK;
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

/* Checks checkpoint dir (iteration it, -1: any) for a load that needs the
 * optimizer's state (weights_only false) or not: true when it loads. With
 * weights_only, *optim says what is wrong with its optimizer files, if
 * anything; without, such a problem makes it incomplete like any other,
 * and *why then says that its weights alone would load. */
static bool check(const char *dir, int64_t it, bool weights_only, mega_err *optim,
                  mega_err *why) {
  if (mega_ckpt_verify_parts(dir, it, weights_only, optim, why) != MEGA_OK) return false;
  if (weights_only || optim->status == MEGA_OK) return true;
  mega_fail(why, MEGA_ERR_INVALID,
            "%s; its weights are whole, and --no-load-optim loads them with fresh Adam "
            "moments (--finetune: as a new run)", optim->msg);
  return false;
}

/* The newest complete iter_* of dir other than skip (-1: none skipped).
 * *path gets it (malloc'd) or stays NULL; *first_bad gets the reason the
 * newest incomplete one (newer than what was found) failed, when any. */
static mega_status newest_complete(const char *dir, int64_t skip, bool weights_only,
                                   char **path, int64_t *found, size_t *nseen,
                                   mega_err *first_bad, int64_t *bad_it, mega_err *optim,
                                   mega_err *err) {
  *path = NULL;
  *nseen = 0;
  *bad_it = -1;
  int64_t *its;
  size_t n;
  mega_status st = list_iters(dir, &its, &n, err);
  if (st != MEGA_OK) return st;
  char p[4096];
  for (size_t i = 0; i < n && !*path; i++) {
    if (its[i] == skip) continue;
    (*nseen)++;
    if (!mega_ckpt_iter_path(p, sizeof p, dir, its[i])) continue;
    mega_err verr = {0};
    if (!check(p, its[i], weights_only, optim, &verr)) {
      if (verr.status == MEGA_ERR_UNSUPPORTED) { /* whole, in another build's format */
        st = verr.status;
        if (err) *err = verr;
        break;
      }
      if (*bad_it < 0) {
        *bad_it = its[i];
        *first_bad = verr;
      }
      continue;
    }
    *path = strdup(p);
    *found = its[i];
    if (!*path) st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  free(its);
  return st;
}

/* The iteration the latest file names: MEGA_ERR_INVALID when its text
 * names none (which a load may pass over), MEGA_ERR_IO when it cannot be
 * read and MEGA_ERR_UNSUPPORTED for Megatron's "release" (neither of which
 * it may: see mega_ckpt_resolve). */
static mega_status read_latest(const char *latest, int64_t *it, mega_err *err) {
  int fd;
  mega_status opened = mega_ckpt_open_plain(latest, &fd, err);
  if (opened == MEGA_ERR_INVALID) { /* a link: not to be passed over */
    if (err) err->status = MEGA_ERR_IO;
    return MEGA_ERR_IO;
  }
  if (opened != MEGA_OK) return opened;
  char line[64] = {0};
  ssize_t r;
  do r = read(fd, line, sizeof line - 1);
  while (r < 0 && errno == EINTR);
  int read_err = r < 0 ? errno : 0;
  size_t got = r < 0 ? 0 : (size_t)r;
  close(fd);
  if (read_err)
    return mega_fail(err, MEGA_ERR_IO, "cannot read %s: %s", latest, strerror(read_err));
  line[got] = '\0';
  size_t n = strcspn(line, "\r\n"); /* the message is one line */
  const char *word = line + strspn(line, " \t\r\n"); /* stripped, as Megatron reads it */
  size_t wlen = strlen(word);
  while (wlen && strchr(" \t\r\n", word[wlen - 1])) wlen--;
  if (wlen == 7 && !strncmp(word, "release", 7))
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "%s says 'release': Megatron's released checkpoint in its release/ "
                     "directory, which mega cannot load (it loads the iter_* checkpoints mega "
                     "saved); point --load at those, or write the iteration to load into %s",
                     latest, latest);
  char *end;
  errno = 0;
  long long v = strtoll(line, &end, 10);
  while (*end == '\n' || *end == ' ' || *end == '\r') end++;
  if (got == 0 || end == line || *end || errno || v < 0)
    return mega_fail(err, MEGA_ERR_INVALID, "%s should hold one iteration number, not '%.*s'",
                     latest, (int)(n < 20 ? n : 20), line);
  *it = v;
  return MEGA_OK;
}

bool mega_ckpt_present(const char *load_dir) {
  if (!load_dir) return false;
  if (is_file(load_dir, MEGA_CKPT_LATEST_FILE) || is_checkpoint_dir(load_dir)) return true;
  int64_t *its = NULL;
  size_t n = 0;
  mega_err e = {0};
  bool any = list_iters(load_dir, &its, &n, &e) == MEGA_OK && n > 0;
  free(its);
  return any;
}

static mega_status resolve(const char *load_dir, bool weights_only, char **path,
                           char **notice, mega_err *optim, mega_err *err) {
  *path = NULL;
  if (notice) *notice = NULL;
  char latest[4096], dir[4096];
  snprintf(latest, sizeof latest, "%s/" MEGA_CKPT_LATEST_FILE, load_dir);
  struct stat sb;
  if (mega_ckpt_lstat(load_dir, &sb) == 0 && S_ISLNK(sb.st_mode))
    return mega_ckpt_refuse(err, MEGA_ERR_INVALID, "read --load", load_dir, ELOOP, load_dir);
  if (mega_ckpt_lstat(load_dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--load %s is a file; it takes a directory of checkpoints, or one "
                     "checkpoint's directory", load_dir);
  bool has_latest = mega_ckpt_lstat(latest, &sb) == 0;
  if (!has_latest && errno != ENOENT && errno != ENOTDIR)
    return mega_ckpt_refuse(err, MEGA_ERR_IO, "read", latest, errno, latest);
  if (has_latest && S_ISLNK(sb.st_mode))
    return mega_ckpt_refuse(err, MEGA_ERR_INVALID, "read", latest, ELOOP, latest);

  if (!has_latest && is_checkpoint_dir(load_dir)) { /* --load names a checkpoint itself */
    mega_err verr = {0};
    if (!check(load_dir, -1, weights_only, optim, &verr)) {
      if (verr.status != MEGA_ERR_UNSUPPORTED)
        return mega_fail(err, MEGA_ERR_INVALID, "--load %s is an incomplete checkpoint: %s",
                         load_dir, verr.msg);
      if (err) *err = verr;
      return verr.status;
    }
    *path = strdup(load_dir);
    return *path ? MEGA_OK : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }

  int64_t named = -1, found = -1, bad_it = -1;
  mega_err why = {0}, first_bad = {0};
  /* A latest file whose text names no iteration (emptied, edited) is
   * passed over like an incomplete checkpoint. Not one that cannot be read
   * (a rank that read it and a rank that could not would load different
   * checkpoints when a newer complete one lies beside the one it names),
   * nor Megatron's "release", whose checkpoint is not an iter_* one: an
   * older iter_* would load where the user meant the release's weights
   * (--finetune from a released model, say). */
  if (has_latest) {
    mega_status rs = read_latest(latest, &named, &why);
    if (rs != MEGA_OK && rs != MEGA_ERR_INVALID) {
      if (err) *err = why;
      return rs;
    }
    if (rs != MEGA_OK) named = -1;
  }
  if (has_latest && named >= 0) {
    if (!mega_ckpt_iter_path(dir, sizeof dir, load_dir, named))
      return mega_fail(err, MEGA_ERR_INVALID, "--load path too long");
    if (check(dir, named, weights_only, optim, &why)) {
      *path = strdup(dir);
      return *path ? MEGA_OK : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    }
    if (why.status == MEGA_ERR_UNSUPPORTED) { /* never passed over: see newest_complete */
      if (err) *err = why;
      return why.status;
    }
  }
  size_t nseen = 0;
  mega_status st = newest_complete(load_dir, named, weights_only, path, &found, &nseen,
                                   &first_bad, &bad_it, optim, err);
  if (st != MEGA_OK) return st;

  if (has_latest && named < 0) {
    if (!*path)
      return mega_fail(err, MEGA_ERR_INVALID, "%s, and %s holds no complete checkpoint; point "
                       "--load at a good one, or remove %s to start fresh", why.msg, load_dir,
                       latest);
    if (notice)
      *notice = dup_printf("%s; loading iteration %lld, the newest complete checkpoint",
                           why.msg, (long long)found);
    return MEGA_OK;
  }
  if (has_latest) {
    if (!*path)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s names iteration %lld, but that checkpoint is incomplete (%s), and "
                       "%s holds no other complete checkpoint; point --load at a good one, or "
                       "remove %s to start fresh",
                       latest, (long long)named, why.msg, load_dir, latest);
    if (notice)
      *notice = dup_printf("checkpoint iteration %lld in %s is incomplete (%s); loading "
                           "iteration %lld, the newest complete checkpoint",
                           (long long)named, load_dir, why.msg, (long long)found);
    return MEGA_OK;
  }
  if (*path) {
    if (notice && bad_it > found)
      *notice = dup_printf("checkpoint iteration %lld in %s is incomplete (%s); loading "
                           "iteration %lld, the newest complete checkpoint",
                           (long long)bad_it, load_dir, first_bad.msg, (long long)found);
    return MEGA_OK;
  }
  if (nseen > 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--load %s holds %zu iter_* director%s but no complete checkpoint (the "
                     "newest: %s); point --load at a good one, or remove them to start fresh",
                     load_dir, nseen, nseen == 1 ? "y" : "ies", first_bad.msg);
  return mega_fail(err, MEGA_ERR_NOT_FOUND, "--load %s holds no checkpoint (no %s)", load_dir,
                   MEGA_CKPT_LATEST_FILE);
}

mega_status mega_ckpt_resolve(const char *load_dir, char **path, char **notice, mega_err *err) {
  mega_err optim;
  return resolve(load_dir, false, path, notice, &optim, err);
}

mega_status mega_ckpt_resolve_weights(const char *load_dir, char **path, char **notice,
                                      mega_err *err) {
  mega_err optim = {0};
  char *fallback = NULL;
  mega_status st = resolve(load_dir, true, path, notice ? &fallback : NULL, &optim, err);
  if (!notice) return st;
  *notice = fallback;
  if (st == MEGA_OK && optim.status != MEGA_OK) {
    *notice = dup_printf("%s%scheckpoint %s has no usable optimizer state (%s); its weights "
                         "load alone", fallback ? fallback : "", fallback ? "; " : "", *path,
                         optim.msg);
    free(fallback);
  }
  return st;
}
