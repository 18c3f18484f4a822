/* Megatron's order index cached on disk (gpt_order.h, --data-cache-path).
 *
 * The file, in the writer's byte order (checked on reading):
 *   header    file_header below
 *   lengths   int64[doc1 - doc0]: each document's tokens (the key's data)
 *   doc_index int32[ndoc_index], zero-padded to 8 bytes
 *   samples   int64[2 * (S + 1)]
 *   shuffle   int64[S]
 * mega's own format, not Megatron's .npy files: Megatron's file names hash
 * a JSON of Python objects (the tokenizer's, the split matrix's float
 * reprs) that mega cannot restate exactly, and its key names the dataset
 * by path, not by its contents (docs/DESIGN.md, "Megatron's data order"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/nofollow.h"
#include "worker/data/gpt_order.h"
#include "worker/data/gpt_order_internal.h"

#define MAGIC "MEGAGPTO"
#define VERSION 1u
#define BYTE_ORDER_MARK 0x01020304u

typedef struct file_header {
  char magic[8];
  uint32_t version, byte_order;
  int64_t seq_len, seed, num_samples, doc0, doc1; /* the key, with the lengths */
  int64_t epochs, separate, ndoc_index, samples;
  uint32_t body_crc;   /* of everything after the header */
  uint32_t header_crc; /* of the header up to here */
} file_header;

typedef struct key {
  const int64_t *cum;
  int64_t doc0, doc1, num_samples;
  int seq_len;
  uint32_t seed;
} key;

static uint32_t crc(uint32_t c, const void *p, size_t n) {
  const Bytef *b = p;
  for (; n > 0;) { /* zlib takes uInt lengths */
    uInt step = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = (uint32_t)crc32(c, b, step);
    b += step, n -= step;
  }
  return c;
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* The body's byte size for these counts; 0 when it overflows size_t. */
static size_t body_size(int64_t ndoc, int64_t ndoc_index, int64_t samples) {
  if (ndoc < 0 || ndoc_index < 0 || samples < 0 || ndoc > INT64_MAX / 8 ||
      ndoc_index > INT64_MAX / 8 || samples > INT64_MAX / 32)
    return 0;
  return (size_t)ndoc * 8 + pad8((size_t)ndoc_index * 4) + (size_t)(samples + 1) * 16 +
         (size_t)samples * 8;
}

static uint32_t header_crc(const file_header *h) {
  return crc(0, h, offsetof(file_header, header_crc));
}

void mega_gpt_order_cache_path(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                               int64_t num_samples, uint32_t seed, const char *dir, char *buf,
                               size_t n) {
  int64_t fields[5] = {seq_len, seed, num_samples, doc0, doc1};
  uint32_t a = crc(0, fields, sizeof fields), b = 0;
  for (int64_t d = doc0; d < doc1; d++) {
    int64_t len = cum[d + 1] - cum[d];
    b = crc(b, &len, sizeof len);
  }
  snprintf(buf, n, "%s/megatron-order-%08" PRIx32 "%08" PRIx32 ".bin", dir, a, b);
}

/* The document index holds each of the key's documents once per epoch
 * (once in the final epoch's block when kept apart), as its shuffles of
 * tiled documents give. NULL when it does, else what is wrong. */
static const char *check_documents(const mega_gpt_order *o, const key *k, uint32_t *count) {
  int64_t ndoc = k->doc1 - k->doc0, split = o->separate ? (o->epochs - 1) * ndoc : o->ndoc_index;
  int64_t from[2] = {0, split}, to[2] = {split, o->ndoc_index};
  uint32_t times[2] = {o->separate ? (uint32_t)o->epochs - 1 : (uint32_t)o->epochs, 1};
  for (int b = 0; b < (o->separate ? 2 : 1); b++) {
    memset(count, 0, (size_t)ndoc * sizeof *count);
    for (int64_t p = from[b]; p < to[b]; p++) {
      int64_t d = o->doc_index[p];
      if (d < k->doc0 || d >= k->doc1) return "a document id out of range";
      count[d - k->doc0]++;
    }
    for (int64_t d = 0; d < ndoc; d++)
      if (count[d] != times[b]) return "a document not as often as the epochs say";
  }
  return NULL;
}

/* The sample index is build_sample_idx's over the document index, and the
 * shuffle index a permutation of the samples (the final epoch's among
 * themselves when kept apart): every sample then reads T + 1 tokens inside
 * its documents, once. NULL when so, else what is wrong. */
static const char *check_samples(const mega_gpt_order *o, const key *k,
                                 const mega_gpt_order_shape *sh, uint64_t *seen) {
  int64_t pos = 0, off = 0;
  for (int64_t s = 0; s <= o->samples; s++) {
    if (s > 0) mega_gpt_order_step(o, k->cum, k->seq_len, &pos, &off);
    if (o->sample_pos[2 * s] != pos || o->sample_pos[2 * s + 1] != off)
      return "a sample's place is not where the one before it ends";
  }
  memset(seen, 0, (size_t)(o->samples + 63) / 64 * sizeof *seen);
  for (int64_t s = 0; s < o->samples; s++) {
    int64_t v = o->shuffle[s];
    if (v < 0 || v >= o->samples) return "a shuffle entry out of range";
    if (sh->separate && (s < sh->sans_final) != (v < sh->sans_final))
      return "a shuffle entry outside its epochs' samples";
    if (seen[v / 64] >> (v % 64) & 1) return "a shuffle entry repeated";
    seen[v / 64] |= (uint64_t)1 << (v % 64);
  }
  return NULL;
}

/* Every entry as the key's build would make it but for what the draws
 * chose (which the crc32 vouches for), so a reader never leaves the arrays
 * or the documents and every sample is whole. NULL when so, else what is
 * wrong. */
static const char *check_entries(const mega_gpt_order *o, const key *k,
                                 const mega_gpt_order_shape *sh) {
  uint32_t *count = malloc((size_t)(k->doc1 - k->doc0 + 1) * sizeof *count);
  uint64_t *seen = malloc((size_t)(o->samples + 64) / 64 * sizeof *seen);
  const char *bad = !count || !seen ? "out of memory checking it" : check_documents(o, k, count);
  if (!bad) bad = check_samples(o, k, sh, seen);
  free(count);
  free(seen);
  return bad;
}

/* Points o's arrays into body (after the header). */
static void place(mega_gpt_order *o, uint8_t *body, int64_t ndoc) {
  uint8_t *p = body + (size_t)ndoc * 8;
  o->doc_index = (int32_t *)p;
  p += pad8((size_t)o->ndoc_index * 4);
  o->sample_pos = (int64_t *)p;
  p += (size_t)(o->samples + 1) * 16;
  o->shuffle = (int64_t *)p;
}

/* Maps the cache file at path. 1: *out is its index; 0: there is none;
 * -1: it is unusable, why says how. */
static int load(const char *path, const key *k, const mega_gpt_order_shape *sh,
                mega_gpt_order **out, char *why, size_t n) {
  *out = NULL;
  char link[4096], because[4200];
  int fd = mega_nf_open_file(path, link, sizeof link); /* a link is rebuilt over, unread */
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    snprintf(why, n, "cannot open it: %s", mega_nf_why(errno, link, because, sizeof because));
    return -1;
  }
  struct stat st;
  file_header h;
  int64_t ndoc = k->doc1 - k->doc0;
  const char *bad = NULL;
  if (fstat(fd, &st) != 0 || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
    bad = "it is shorter than its header";
  else if (memcmp(h.magic, MAGIC, 8) != 0 || h.byte_order != BYTE_ORDER_MARK)
    bad = "it is not a mega order index (or another byte order's)";
  else if (h.version != VERSION)
    bad = "it is another version's";
  else if (h.header_crc != header_crc(&h))
    bad = "its header is damaged (crc32)";
  else if (h.seq_len != k->seq_len || h.seed != (int64_t)k->seed ||
           h.num_samples != k->num_samples || h.doc0 != k->doc0 || h.doc1 != k->doc1)
    bad = "it was built for another --seq-length, --seed, sample count or split";
  else if (h.epochs != sh->epochs || h.separate != sh->separate ||
           h.ndoc_index != sh->ndoc_index || h.samples != sh->samples)
    bad = "its epochs or sample count are not those its key makes";
  size_t body = bad ? 0 : body_size(ndoc, h.ndoc_index, h.samples);
  if (!bad && (body == 0 || (uint64_t)st.st_size != sizeof h + body))
    bad = "its size is not its header's (truncated?)";
  void *map = bad ? MAP_FAILED : mmap(NULL, sizeof h + body, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (!bad && map == MAP_FAILED) bad = "it cannot be mapped";
  uint8_t *b = bad ? NULL : (uint8_t *)map + sizeof h;
  if (!bad) {
    const int64_t *lens = (const int64_t *)b;
    for (int64_t d = 0; d < ndoc && !bad; d++)
      if (lens[d] != k->cum[k->doc0 + d + 1] - k->cum[k->doc0 + d])
        bad = "it was built for other data (the documents' lengths differ)";
  }
  if (!bad && crc(0, b, body) != h.body_crc) bad = "its contents are damaged (crc32)";
  mega_gpt_order *o = bad ? NULL : calloc(1, sizeof *o);
  if (!bad && !o) bad = "out of memory";
  if (!bad) {
    *o = (mega_gpt_order){.epochs = (int)h.epochs, .separate = (int)h.separate,
                          .ndoc_index = h.ndoc_index, .samples = h.samples, .map = map,
                          .map_len = sizeof h + body};
    place(o, b, ndoc);
    bad = check_entries(o, k, sh);
  }
  if (bad) {
    if (o) o->map = NULL; /* unmapped below, not freed as arrays */
    free(o);
    if (map != MAP_FAILED) munmap(map, sizeof h + body);
    snprintf(why, n, "%s", bad);
    return -1;
  }
  *out = o;
  return 1;
}

static mega_status write_all(int fd, const void *p, size_t n, const char *path, mega_err *err) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      return mega_fail(err, MEGA_ERR_IO, "cannot write the order index %s: %s; free space "
                       "there, or drop --data-cache-path (each start then builds the order in "
                       "memory)", path, strerror(errno));
    b += w, n -= (size_t)w;
  }
  return MEGA_OK;
}

/* Removes dir's NAME.tmp.* files: only the lock's holder writes one, and
 * the caller holds it, so these are the temps of builders that were killed
 * (each the size of the index), which nothing else would ever remove. */
static void remove_dead_temps(int dir, const char *name) {
  int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* dir is an O_PATH fd */
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  size_t len = strlen(name);
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, name, len) && !strncmp(e->d_name + len, ".tmp.", 5))
      unlinkat(dir, e->d_name, 0); /* a file; a directory there stays, and is refused */
  closedir(d);
}

/* Writes o as the cache file at path: a temporary file, fsynced, renamed. */
static mega_status store(const mega_gpt_order *o, const key *k, const char *path,
                         mega_err *err) {
  int64_t ndoc = k->doc1 - k->doc0;
  size_t di = (size_t)o->ndoc_index * 4, sp = (size_t)(o->samples + 1) * 16,
         sh = (size_t)o->samples * 8;
  int64_t *lens = malloc((size_t)(ndoc > 0 ? ndoc : 1) * 8);
  if (!lens) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory writing %s", path);
  for (int64_t d = 0; d < ndoc; d++) lens[d] = k->cum[k->doc0 + d + 1] - k->cum[k->doc0 + d];
  static const uint8_t zeros[8];
  file_header h = {.version = VERSION, .byte_order = BYTE_ORDER_MARK, .seq_len = k->seq_len,
                   .seed = k->seed, .num_samples = k->num_samples, .doc0 = k->doc0,
                   .doc1 = k->doc1, .epochs = o->epochs, .separate = o->separate,
                   .ndoc_index = o->ndoc_index, .samples = o->samples};
  memcpy(h.magic, MAGIC, 8);
  uint32_t c = crc(0, lens, (size_t)ndoc * 8);
  c = crc(c, o->doc_index, di);
  c = crc(c, zeros, pad8(di) - di);
  c = crc(c, o->sample_pos, sp);
  h.body_crc = crc(c, o->shuffle, sh);
  h.header_crc = header_crc(&h);
  /* a new temp file, renamed within the directory reached following no
   * link: nothing is written through a link swapped in on the way */
  char tmp[4200], name[256], tname[300], link[4096], why[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  int dir = mega_nf_parent(path, name, sizeof name, link, sizeof link);
  snprintf(tname, sizeof tname, "%s.tmp.%ld", name, (long)getpid());
  if (dir >= 0) remove_dead_temps(dir, name);
  int fd = dir < 0 ? -1
                   : openat(dir, tname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  mega_status st = fd >= 0 ? MEGA_OK
                           : mega_fail(err, MEGA_ERR_IO,
                                       "cannot write the order index %s: %s; give a writable "
                                       "--data-cache-path (of real directories, not links) or "
                                       "drop it",
                                       tmp, mega_nf_why(errno, link, why, sizeof why));
  if (st == MEGA_OK) st = write_all(fd, &h, sizeof h, tmp, err);
  if (st == MEGA_OK) st = write_all(fd, lens, (size_t)ndoc * 8, tmp, err);
  if (st == MEGA_OK) st = write_all(fd, o->doc_index, di, tmp, err);
  if (st == MEGA_OK) st = write_all(fd, zeros, pad8(di) - di, tmp, err);
  if (st == MEGA_OK) st = write_all(fd, o->sample_pos, sp, tmp, err);
  if (st == MEGA_OK) st = write_all(fd, o->shuffle, sh, tmp, err);
  if (st == MEGA_OK && fsync(fd) != 0)
    st = mega_fail(err, MEGA_ERR_IO, "cannot sync the order index %s: %s", tmp, strerror(errno));
  if (fd >= 0) close(fd);
  if (st == MEGA_OK && renameat(dir, tname, dir, name) != 0)
    st = mega_fail(err, MEGA_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (st != MEGA_OK && fd >= 0) unlinkat(dir, tname, 0);
  if (dir >= 0) close(dir);
  free(lens);
  return st;
}

/* mkdir -p dir. */
static mega_status make_dir(const char *dir, mega_err *err) {
  char link[4096], why[4200];
  if (mega_nf_mkdirs(dir, 0755, link, sizeof link) == 0) return MEGA_OK;
  int e = errno;
  if (e == ENOTDIR || e == EEXIST)
    return mega_fail(err, MEGA_ERR_IO, "--data-cache-path '%s' is not a directory", dir);
  return mega_fail(err, MEGA_ERR_IO, "cannot make --data-cache-path '%s': %s%s", dir,
                   mega_nf_why(e, link, why, sizeof why),
                   e == ELOOP ? " (megaw follows no link under the path it resolved at "
                                    "start)" : "");
}

mega_status mega_gpt_order_open(const int64_t *cum, int64_t doc0, int64_t doc1, int seq_len,
                                int64_t num_samples, uint32_t seed, const char *dir,
                                mega_gpt_order **out, mega_gpt_cache_how *how, char *why,
                                size_t why_len, mega_err *err) {
  *out = NULL;
  char path[4096], lock[4200], note[256] = "";
  key k = {cum, doc0, doc1, num_samples, seq_len, seed};
  mega_gpt_order_cache_path(cum, doc0, doc1, seq_len, num_samples, seed, dir, path, sizeof path);
  if (why && why_len) why[0] = 0;
  mega_gpt_order_shape sh;
  mega_status st = mega_gpt_order_shape_of(cum, doc0, doc1, seq_len, num_samples, &sh, err);
  if (st != MEGA_OK) return st;
  /* a hit needs no lock and no write access */
  int r = load(path, &k, &sh, out, note, sizeof note);
  if (r == 1) {
    *how = MEGA_GPT_CACHE_READ;
    return MEGA_OK;
  }
  st = make_dir(dir, err);
  if (st != MEGA_OK) return st;
  snprintf(lock, sizeof lock, "%s.lock", path);
  char link[4096], because[4200];
  int lfd = mega_nf_open(lock, O_RDWR | O_CREAT, 0644, link, sizeof link);
  if (lfd < 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot make the lock %s: %s; give a writable "
                     "--data-cache-path (of real directories, not links) or drop it", lock,
                     mega_nf_why(errno, link, because, sizeof because));
  /* the first process here builds; the others wait for it, then read */
  while (flock(lfd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    st = mega_fail(err, MEGA_ERR_IO, "cannot lock %s: %s", lock, strerror(errno));
    break;
  }
  char again[256] = "";
  if (st == MEGA_OK) r = load(path, &k, &sh, out, again, sizeof again);
  if (st == MEGA_OK && r == 1) {
    *how = MEGA_GPT_CACHE_READ;
  } else if (st == MEGA_OK) {
    const char *bad = again[0] ? again : note;
    *how = bad[0] ? MEGA_GPT_CACHE_REBUILT : MEGA_GPT_CACHE_BUILT;
    if (why && why_len && bad[0]) snprintf(why, why_len, "%s: %s", path, bad);
    st = mega_gpt_order_build(cum, doc0, doc1, seq_len, num_samples, seed, out, err);
    if (st == MEGA_OK) st = store(*out, &k, path, err);
    if (st != MEGA_OK) {
      mega_gpt_order_free(*out);
      *out = NULL;
    }
  }
  close(lfd); /* releases the lock */
  return st;
}
