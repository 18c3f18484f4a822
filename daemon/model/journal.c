#include "daemon/model/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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
  /* a rewrite's temp file that a crash left (the caller holds the state
   * dir, so no rewrite runs now) */
  char *tmp = NULL;
  if (asprintf(&tmp, "%s.tmp", path) >= 0) unlink(tmp);
  free(tmp);
  if (fsync_dir_of(path)) {
    mega_journal_close(j);
    return io_fail(err, "cannot sync its directory", path);
  }
  *out = j;
  return MEGA_OK;
}

/* Whether a valid record starts at off. An empty record is never valid:
 * nothing writes one, and zeros (length 0, the crc32 of nothing is 0) would
 * otherwise read as a run of them, so a zero-filled region passed for good
 * records and the records it overwrote were lost without a word. */
static bool record_at(const uint8_t *buf, size_t size, size_t off, uint32_t *len) {
  if (off + 8 > size) return false;
  uint32_t l = get_u32(buf + off), crc = get_u32(buf + off + 4);
  if (l == 0 || l > MEGA_JOURNAL_MAX_RECORD || l > size - off - 8) return false;
  if (crc_of(buf + off + 8, l) != crc) return false;
  *len = l;
  return true;
}

/* The next offset after a bad record where a valid record starts, or size. */
static size_t resync(const uint8_t *buf, size_t size, size_t from) {
  uint32_t len;
  for (size_t k = from; k + 8 <= size; k++)
    if (record_at(buf, size, k, &len)) return k;
  return size;
}

static mega_status read_whole(mega_journal *j, uint8_t **out, size_t *size, mega_err *err) {
  struct stat st;
  if (fstat(j->fd, &st)) return io_fail(err, "cannot stat", j->path);
  *size = (size_t)st.st_size;
  uint8_t *buf = malloc(*size ? *size : 1);
  if (!buf) return mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", j->path);
  size_t got = 0;
  while (got < *size) {
    ssize_t n = pread(j->fd, buf + got, *size - got, (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      free(buf);
      return io_fail(err, "cannot read", j->path);
    }
    got += (size_t)n;
  }
  *out = buf;
  return MEGA_OK;
}

/* What a crash can leave after the last good record: a record cut short
 * (a header cut, or a length that runs past the end of the file), never a
 * whole record that is wrong. Anything else is damage, even at the end. */
static bool torn_at(const uint8_t *buf, size_t size, size_t off) {
  if (size - off < 8) return true;
  uint32_t l = get_u32(buf + off);
  return l > 0 && l <= MEGA_JOURNAL_MAX_RECORD && l > size - off - 8;
}

/* The file as found, in PATH.damaged-UNIXTIME (-2, -3, ... when a copy of
 * that second exists: every copy is kept). */
static mega_status keep_copy(mega_journal *j, const uint8_t *buf, size_t size, char *copy,
                             size_t cap, mega_err *err) {
  long long now = (long long)time(NULL);
  int fd = -1;
  for (int k = 1; fd < 0 && k < 1000; k++) {
    if (k == 1) snprintf(copy, cap, "%s.damaged-%lld", j->path, now);
    else snprintf(copy, cap, "%s.damaged-%lld-%d", j->path, now, k);
    fd = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0 || write_all(fd, buf, size) || fsync(fd)) {
    mega_status s = io_fail(err, "cannot keep a copy of the damaged journal", copy);
    if (fd >= 0) {
      close(fd);
      unlink(copy); /* half a copy is no copy, and a full disk's next try makes another */
    }
    return s;
  }
  close(fd);
  return MEGA_OK;
}

mega_status mega_journal_replay(mega_journal *j, mega_journal_fn fn, void *ctx,
                                mega_journal_report *rep, mega_err *err) {
  mega_journal_report r = {0};
  uint8_t *buf = NULL;
  size_t size = 0;
  mega_status s = read_whole(j, &buf, &size, err);
  if (s != MEGA_OK) return s;
  /* Good records as (offset, length) runs, for a rewrite after damage. */
  size_t nrec = 0, cap = 64;
  size_t (*recs)[2] = malloc(cap * sizeof *recs);
  if (!recs) {
    free(buf);
    return mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", j->path);
  }
  size_t off = 0;
  while (off < size) {
    uint32_t len;
    if (!record_at(buf, size, off, &len)) {
      size_t next = resync(buf, size, off + 1);
      if (next == size && torn_at(buf, size, off)) break; /* a torn tail */
      if (!r.damaged_regions) r.first_damage = off;
      r.damaged_bytes += next - off;
      r.damaged_regions++;
      off = next;
      continue;
    }
    if (fn && fn(ctx, buf + off + 8, len)) {
      s = mega_fail(err, MEGA_ERR_INVALID, "journal %s: record at byte %zu was refused", j->path,
                    off);
      break;
    }
    if (nrec == cap) {
      void *v = realloc(recs, 2 * cap * sizeof *recs);
      if (!v) {
        s = mega_fail(err, MEGA_ERR_NOMEM, "journal %s: out of memory", j->path);
        break;
      }
      recs = v;
      cap *= 2;
    }
    recs[nrec][0] = off + 8;
    recs[nrec++][1] = len;
    r.records++;
    off += 8 + len;
  }
  if (s == MEGA_OK) {
    /* off stops short of the end only at a torn tail */
    r.torn_bytes = size - off;
    if (r.damaged_regions || r.torn_bytes) s = keep_copy(j, buf, size, r.copy, sizeof r.copy, err);
    if (s == MEGA_OK && r.damaged_regions) {
      const void **ptrs = malloc((nrec ? nrec : 1) * sizeof *ptrs);
      size_t *lens = ptrs ? malloc((nrec ? nrec : 1) * sizeof *lens) : NULL;
      if (!lens) s = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
      for (size_t i = 0; s == MEGA_OK && i < nrec; i++) {
        ptrs[i] = buf + recs[i][0];
        lens[i] = recs[i][1];
      }
      if (s == MEGA_OK) s = mega_journal_rewrite(j, (const void *const *)ptrs, lens, nrec, err);
      free(ptrs);
      free(lens);
    } else if (s == MEGA_OK && r.torn_bytes) {
      /* a crash tears at most the tail: cut it (the copy keeps it) */
      if (ftruncate(j->fd, (off_t)off) || fdatasync(j->fd))
        s = io_fail(err, "cannot cut its torn tail", j->path);
    }
  }
  free(recs);
  free(buf);
  if (rep) *rep = r;
  return s;
}

static mega_status check_len(const mega_journal *j, size_t len, mega_err *err) {
  if (len == 0)
    return mega_fail(err, MEGA_ERR_INVALID, "journal %s: an empty record (replay would take it "
                     "for damage)", j->path);
  if (len > MEGA_JOURNAL_MAX_RECORD)
    return mega_fail(err, MEGA_ERR_INVALID, "journal %s: record of %zu bytes exceeds %u", j->path,
                     len, MEGA_JOURNAL_MAX_RECORD);
  return MEGA_OK;
}

/* A failed append (a full disk, ulimit -f) is cut back to where it began:
 * left there, its part-written record would sit in the middle of the file
 * once later appends found room, and replay would call it damage. */
static mega_status append_failed(mega_journal *j, off_t end, mega_err *err) {
  mega_status s = io_fail(err, "cannot append", j->path);
  if (end >= 0 && ftruncate(j->fd, end) == 0) fdatasync(j->fd);
  return s;
}

mega_status mega_journal_append(mega_journal *j, const void *rec, size_t len, mega_err *err) {
  return mega_journal_append_many(j, &rec, &len, 1, err);
}

mega_status mega_journal_append_many(mega_journal *j, const void *const *recs, const size_t *lens,
                                     size_t n, mega_err *err) {
  for (size_t i = 0; i < n; i++) {
    mega_status st = check_len(j, lens[i], err);
    if (st != MEGA_OK) return st;
  }
  off_t end = lseek(j->fd, 0, SEEK_END);
  for (size_t i = 0; i < n; i++)
    if (write_record(j->fd, recs[i], lens[i])) return append_failed(j, end, err);
  if (n && fdatasync(j->fd)) return append_failed(j, end, err);
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
  if (fsync(fd) || rename(tmp, j->path)) goto fail;
  /* in place: this is the journal now, whatever follows (the old file is
   * unlinked, and appends to it would be lost) */
  close(j->fd);
  j->fd = fd;
  free(tmp);
  if (fsync_dir_of(j->path)) return io_fail(err, "rewritten, but cannot sync its directory", j->path);
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
