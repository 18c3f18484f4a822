#include "daemon/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

struct mega_journal {
  int fd;
  char *path;
};

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t crc_of(const void *rec, size_t len) {
  return (uint32_t)crc32(crc32(0L, Z_NULL, 0), rec, (uInt)len);
}

static mega_status io_fail(mega_err *err, const char *what, const char *path) {
  return mega_fail(err, MEGA_ERR_IO, "journal %s: %s: %s", path, what, strerror(errno));
}

static int write_all(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int write_record(int fd, const void *rec, size_t len) {
  uint8_t head[8];
  put_u32(head, (uint32_t)len);
  put_u32(head + 4, crc_of(rec, len));
  return write_all(fd, head, sizeof head) || write_all(fd, rec, len) ? -1 : 0;
}

/* Makes a rename or creation in path's directory durable. */
static int fsync_dir_of(const char *path) {
  char *copy = strdup(path);
  if (!copy) return -1;
  int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(copy);
  if (dfd < 0) return -1;
  int rc = fsync(dfd);
  close(dfd);
  return rc;
}

mega_status mega_journal_open(const char *path, mega_journal **out, mega_err *err) {
  int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return io_fail(err, "cannot open", path);
  mega_journal *j = calloc(1, sizeof *j);
  if (!j || !(j->path = strdup(path))) {
    free(j);
    close(fd);
    return mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", path);
  }
  j->fd = fd;
  if (fsync_dir_of(path)) {
    mega_journal_close(j);
    return io_fail(err, "cannot sync its directory", path);
  }
  *out = j;
  return MEGA_OK;
}

mega_status mega_journal_replay(mega_journal *j, mega_journal_fn fn, void *ctx, size_t *dropped,
                                mega_err *err) {
  struct stat st;
  if (fstat(j->fd, &st)) return io_fail(err, "cannot stat", j->path);
  size_t size = (size_t)st.st_size;
  uint8_t *buf = size ? malloc(size) : NULL;
  if (size && !buf) return mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", j->path);
  size_t got = 0;
  while (got < size) {
    ssize_t n = pread(j->fd, buf + got, size - got, (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      free(buf);
      return io_fail(err, "cannot read", j->path);
    }
    got += (size_t)n;
  }
  size_t off = 0;
  mega_status s = MEGA_OK;
  while (off + 8 <= size) {
    uint32_t len = get_u32(buf + off), crc = get_u32(buf + off + 4);
    if (len > MEGA_JOURNAL_MAX_RECORD || len > size - off - 8) break;
    if (crc_of(buf + off + 8, len) != crc) break;
    if (fn && fn(ctx, buf + off + 8, len)) {
      s = mega_fail(err, MEGA_ERR_INVALID, "journal %s: record at byte %zu was refused", j->path,
                    off);
      break;
    }
    off += 8 + len;
  }
  free(buf);
  if (s != MEGA_OK) return s;
  if (dropped) *dropped = size - off;
  if (off < size && (ftruncate(j->fd, (off_t)off) || fdatasync(j->fd)))
    return io_fail(err, "cannot cut its torn tail", j->path);
  return MEGA_OK;
}

mega_status mega_journal_append(mega_journal *j, const void *rec, size_t len, mega_err *err) {
  if (len > MEGA_JOURNAL_MAX_RECORD)
    return mega_fail(err, MEGA_ERR_INVALID, "journal %s: record of %zu bytes exceeds %u", j->path,
                     len, MEGA_JOURNAL_MAX_RECORD);
  if (write_record(j->fd, rec, len) || fdatasync(j->fd))
    return io_fail(err, "cannot append", j->path);
  return MEGA_OK;
}

mega_status mega_journal_rewrite(mega_journal *j, const void *const *recs, const size_t *lens,
                                 size_t n, mega_err *err) {
  size_t plen = strlen(j->path);
  char *tmp = malloc(plen + 5);
  if (!tmp) return mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", j->path);
  memcpy(tmp, j->path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    mega_status s = io_fail(err, "cannot create", tmp);
    free(tmp);
    return s;
  }
  for (size_t i = 0; i < n; i++) {
    if (write_record(fd, recs[i], lens[i])) goto fail;
  }
  if (fsync(fd) || rename(tmp, j->path) || fsync_dir_of(j->path)) goto fail;
  close(j->fd);
  j->fd = fd;
  free(tmp);
  return MEGA_OK;
fail:;
  mega_status s = io_fail(err, "cannot rewrite", j->path);
  close(fd);
  unlink(tmp);
  free(tmp);
  return s;
}

void mega_journal_close(mega_journal *j) {
  if (!j) return;
  if (j->fd >= 0) close(j->fd);
  free(j->path);
  free(j);
}
