/* manifest.json: what makes a checkpoint complete. The committer writes it
 * last, listing every other file with its size and crc32; a load verifies
 * every listed file before trusting the directory. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "core/version.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_internal.h"

#define MANIFEST_FORMAT "mega-checkpoint-manifest"
#define MANIFEST_VERSION 1
#define SUM_CHUNK (4u << 20)

mega_status mega_ckpt_file_sum(const char *path, uint64_t *size, uint32_t *crc, mega_err *err) {
  int fd;
  mega_status opened = mega_ckpt_open_plain(path, &fd, err);
  if (opened != MEGA_OK) return opened;
  unsigned char *buf = malloc(SUM_CHUNK);
  if (!buf) {
    close(fd);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", path);
  }
  uLong c = crc32(0L, Z_NULL, 0);
  uint64_t total = 0;
  mega_status st = MEGA_OK;
  for (;;) {
    ssize_t r = read(fd, buf, SUM_CHUNK);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      st = mega_fail(err, MEGA_ERR_IO, "cannot read %s: %s", path, strerror(errno));
      break;
    }
    if (r == 0) break;
    c = crc32(c, buf, (uInt)r);
    total += (uint64_t)r;
  }
  free(buf);
  close(fd);
  if (st == MEGA_OK) {
    *size = total;
    *crc = (uint32_t)c;
  }
  return st;
}

mega_status mega_ckpt_write_manifest(const char *dir, int64_t iteration, int attempt,
                                     const mega_ckpt_file *files, size_t n, mega_err *err) {
  json_t *list = json_object();
  for (size_t i = 0; list && i < n; i++) {
    json_t *e = json_pack("{s:I, s:I}", "size", (json_int_t)files[i].size, "crc32",
                          (json_int_t)files[i].crc32);
    if (!e || json_object_set_new(list, files[i].name, e)) {
      json_decref(list);
      list = NULL;
    }
  }
  json_t *m = list ? json_pack("{s:s, s:i, s:s, s:I, s:i, s:o}", "format", MANIFEST_FORMAT,
                               "version", MANIFEST_VERSION, MEGA_CKPT_VERSION_KEY, mega_version(),
                               "iteration", (json_int_t)iteration, "attempt", attempt, "files",
                               list)
                   : NULL;
  if (!m) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building %s", dir);
  return mega_ckpt_write_json(m, dir, MEGA_CKPT_MANIFEST_FILE, JSON_INDENT(2) | JSON_SORT_KEYS,
                              NULL, err);
}

const char *mega_ckpt_written_by(const json_t *j, char *buf, size_t len) {
  const char *v = json_string_value(json_object_get(j, MEGA_CKPT_VERSION_KEY));
  if (v) snprintf(buf, len, "mega %.100s", v);
  else snprintf(buf, len, "a build of mega that does not name its version");
  return buf;
}

static bool bad_name(const char *name) {
  return !*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") ||
         !strcmp(name, MEGA_CKPT_MANIFEST_FILE);
}

/* The manifest's entry for name: its size and crc32, checked for shape. */
static bool entry(json_t *e, uint64_t *size, uint32_t *crc) {
  json_t *s = json_object_get(e, "size"), *c = json_object_get(e, "crc32");
  if (!json_is_integer(s) || !json_is_integer(c) || json_integer_value(s) < 0 ||
      json_integer_value(c) < 0 || json_integer_value(c) > 0xffffffffLL)
    return false;
  *size = (uint64_t)json_integer_value(s);
  *crc = (uint32_t)json_integer_value(c);
  return true;
}

/* The optimizer's files: optimizer.safetensors, its shards and index. */
static bool optimizer_file(const char *name) {
  return !strncmp(name, "optimizer", 9) && (name[9] == '.' || name[9] == '-');
}

/* A problem with an optimizer file goes to *optim (the first only) and the
 * check goes on; with weights_only their checksums are not read. */
static bool optim_problem(const char *name, mega_err *optim, const mega_err *what) {
  if (!optimizer_file(name)) return false;
  if (optim->status == MEGA_OK) *optim = *what;
  return true;
}

mega_status mega_ckpt_verify(const char *dir, int64_t iteration, mega_err *err) {
  mega_err optim = {0};
  mega_status st = mega_ckpt_verify_parts(dir, iteration, false, &optim, err);
  if (st == MEGA_OK && optim.status != MEGA_OK) {
    if (err) *err = optim;
    return MEGA_ERR_INVALID;
  }
  return st;
}

mega_status mega_ckpt_verify_parts(const char *dir, int64_t iteration, bool weights_only,
                                   mega_err *optim, mega_err *err) {
  *optim = (mega_err){0};
  char path[4352];
  snprintf(path, sizeof path, "%s/" MEGA_CKPT_MANIFEST_FILE, dir);
  struct stat sb;
  int rc = mega_ckpt_lstat(dir, &sb);
  if (rc != 0 && errno != ELOOP)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: %s", dir,
                     errno == ENOENT ? "it does not exist" : strerror(errno));
  if (rc != 0 || S_ISLNK(sb.st_mode))
    return mega_ckpt_refuse(err, MEGA_ERR_INVALID, "read", dir, ELOOP, dir);
  if (!S_ISDIR(sb.st_mode)) return mega_fail(err, MEGA_ERR_INVALID, "%s is not a directory", dir);
  if (mega_ckpt_lstat(path, &sb) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s has no " MEGA_CKPT_MANIFEST_FILE " (a save that did not finish, or a "
                     "checkpoint from before mega wrote manifests)", dir);
  json_error_t jerr;
  json_t *m;
  mega_status opened = mega_ckpt_load_json(path, &m, &jerr, err);
  if (opened != MEGA_OK) return opened;
  if (!m)
    return mega_fail(err, MEGA_ERR_INVALID, "%s is not valid JSON (line %d: %s)", path,
                     jerr.line, jerr.text);
  mega_status st = MEGA_OK;
  const char *fmt = json_string_value(json_object_get(m, "format"));
  json_t *ver = json_object_get(m, "version"), *it = json_object_get(m, "iteration");
  json_t *files = json_object_get(m, "files");
  if (fmt && !strcmp(fmt, MANIFEST_FORMAT) && json_is_integer(ver) &&
      json_integer_value(ver) != MANIFEST_VERSION) {
    /* whole, in a format this build does not read: not to be passed over
     * for an older checkpoint (whose iterations a save would then write
     * over this one) */
    char by[160];
    st = mega_fail(err, MEGA_ERR_UNSUPPORTED,
                   "checkpoint %s is of another format: its %s is version %lld (written by %s), "
                   "and this megaw (mega %s) reads version %d; load it with a build of mega that "
                   "reads it", dir, MEGA_CKPT_MANIFEST_FILE, (long long)json_integer_value(ver),
                   mega_ckpt_written_by(m, by, sizeof by), mega_version(), MANIFEST_VERSION);
    goto out;
  }
  if (!fmt || strcmp(fmt, MANIFEST_FORMAT) || !json_is_integer(ver) || !json_is_integer(it) ||
      !json_is_object(files)) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s is not a %s version %d", path, MANIFEST_FORMAT,
                   MANIFEST_VERSION);
    goto out;
  }
  if (iteration >= 0 && json_integer_value(it) != iteration) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s is for iteration %lld, not %lld", path,
                   (long long)json_integer_value(it), (long long)iteration);
    goto out;
  }
  static const char *const required[] = {MEGA_CKPT_CONFIG_FILE, MEGA_CKPT_STATE_FILE};
  for (size_t i = 0; i < 2; i++)
    if (!json_object_get(files, required[i])) {
      st = mega_fail(err, MEGA_ERR_INVALID, "%s does not list %s", path, required[i]);
      goto out;
    }
  /* Sizes first (cheap, and what a crash leaves wrong), then checksums. */
  for (int pass = 0; pass < 2 && st == MEGA_OK; pass++) {
    const char *name;
    json_t *e;
    json_object_foreach(files, name, e) {
      uint64_t size;
      uint32_t crc;
      if (bad_name(name) || !entry(e, &size, &crc)) {
        st = mega_fail(err, MEGA_ERR_INVALID, "%s has a bad entry for '%s'", path, name);
        break;
      }
      char fp[4352];
      snprintf(fp, sizeof fp, "%s/%s", dir, name);
      mega_err bad = {0};
      if (pass == 0) {
        int got = mega_ckpt_lstat(fp, &sb);
        if (got == 0 && S_ISLNK(sb.st_mode))
          mega_ckpt_refuse(&bad, MEGA_ERR_INVALID, "read", fp, ELOOP, fp);
        else if (got != 0 || !S_ISREG(sb.st_mode))
          mega_fail(&bad, MEGA_ERR_INVALID, "%s is missing", fp);
        else if ((uint64_t)sb.st_size != size)
          mega_fail(&bad, MEGA_ERR_INVALID, "%s is %lld bytes, but the manifest says %llu", fp,
                    (long long)sb.st_size, (unsigned long long)size);
      } else if (weights_only && optimizer_file(name)) {
        continue;
      } else {
        uint64_t got_size;
        uint32_t got;
        if (mega_ckpt_file_sum(fp, &got_size, &got, &bad) != MEGA_OK)
          bad.status = MEGA_ERR_INVALID;
        else if (got != crc || got_size != size)
          mega_fail(&bad, MEGA_ERR_INVALID,
                    "%s has crc32 %08" PRIx32 ", but the manifest says %08" PRIx32, fp, got,
                    crc);
      }
      if (bad.status == MEGA_OK || optim_problem(name, optim, &bad)) continue;
      if (err) *err = bad;
      st = MEGA_ERR_INVALID;
      break;
    }
  }
out:
  json_decref(m);
  return st;
}
