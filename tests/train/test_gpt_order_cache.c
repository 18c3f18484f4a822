/* Megatron's order index cached on disk (worker/data/gpt_order.h,
 * --data-cache-path): a cached index is the in-memory one, entry for
 * entry; a second open reads the file (its outcome and its inode and mtime
 * unchanged); another key builds another file; a file of another key, a
 * damaged, a truncated or an out-of-range one, or one whose entries are not
 * its key's though its checksums are good, is caught and replaced, and
 * refused when it cannot be replaced; processes started together build it once. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "worker/data/gpt_order.h"

enum { NDOC = 40 };
static int64_t cum[NDOC + 1];
static char dir[256];

static void make_docs(unsigned seed) {
  cum[0] = 0;
  for (int k = 0; k < NDOC; k++) {
    seed = seed * 1103515245u + 12345u;
    int len = k % 7 == 3 ? 0 : 1 + (int)((seed >> 16) % 50); /* some empty */
    cum[k + 1] = cum[k] + len;
  }
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/mega-order-cache-XXXXXX");
  assert_non_null(mkdtemp(dir));
  make_docs(7);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd);
}

typedef struct args {
  int64_t doc0, doc1, samples;
  int T;
  uint32_t seed;
} args;

static void assert_same(const mega_gpt_order *a, const mega_gpt_order *b) {
  assert_int_equal(mega_gpt_order_samples(a), mega_gpt_order_samples(b));
  assert_int_equal(mega_gpt_order_epochs(a), mega_gpt_order_epochs(b));
  assert_int_equal(mega_gpt_order_separate(a), mega_gpt_order_separate(b));
  int64_t n = mega_gpt_order_samples(a);
  for (int64_t i = 0; i < n; i++) {
    int64_t f[4], g[4];
    mega_gpt_order_sample(a, i, &f[0], &f[1], &f[2], &f[3]);
    mega_gpt_order_sample(b, i, &g[0], &g[1], &g[2], &g[3]);
    assert_memory_equal(f, g, sizeof f);
  }
  int64_t last_pos = 0, first, first_off, last, last_off; /* document positions in use */
  for (int64_t i = 0; i < n; i++) {
    mega_gpt_order_sample(a, i, &first, &first_off, &last, &last_off);
    if (last > last_pos) last_pos = last;
  }
  for (int64_t p = 0; p <= last_pos; p++)
    assert_int_equal(mega_gpt_order_document(a, p), mega_gpt_order_document(b, p));
}

static mega_gpt_order *open_as(const args *a, mega_gpt_cache_how want, char *why, size_t n) {
  mega_gpt_order *o = NULL;
  mega_gpt_cache_how how;
  mega_err err = {0};
  mega_status st = mega_gpt_order_open(cum, a->doc0, a->doc1, a->T, a->samples, a->seed, dir,
                                       &o, &how, why, n, &err);
  if (st != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(how, want);
  return o;
}

static mega_gpt_order *built(const args *a) {
  mega_gpt_order *o = NULL;
  mega_err err = {0};
  assert_int_equal(mega_gpt_order_build(cum, a->doc0, a->doc1, a->T, a->samples, a->seed, &o,
                                        &err), MEGA_OK);
  return o;
}

static void path_of(const args *a, char *buf, size_t n) {
  mega_gpt_order_cache_path(cum, a->doc0, a->doc1, a->T, a->samples, a->seed, dir, buf, n);
}

/* one epoch, several, the final one kept apart, a split's range */
static const args cases[] = {
    {0, NDOC, 20, 16, 1234}, {0, NDOC, 400, 8, 1234}, {0, NDOC, 333, 16, 5},
    {5, 30, 90, 4, 99}, {0, NDOC, 1, 1, 0},
};

static void test_cached_equals_built_and_is_read_again(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    const args *a = &cases[c];
    mega_gpt_order *mem = built(a);
    mega_gpt_order *first = open_as(a, MEGA_GPT_CACHE_BUILT, NULL, 0);
    assert_same(mem, first);
    char path[512];
    path_of(a, path, sizeof path);
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    mega_gpt_order *second = open_as(a, MEGA_GPT_CACHE_READ, NULL, 0);
    assert_same(mem, second);
    assert_int_equal(stat(path, &after), 0);
    assert_int_equal(before.st_ino, after.st_ino); /* not rewritten */
    assert_int_equal(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    mega_gpt_order_free(mem);
    mega_gpt_order_free(first);
    mega_gpt_order_free(second);
  }
}

static void test_another_key_builds_its_own(void **state) {
  (void)state;
  args a = {0, NDOC, 100, 8, 1};
  mega_gpt_order_free(open_as(&a, MEGA_GPT_CACHE_BUILT, NULL, 0));
  const args others[] = {{0, NDOC, 100, 8, 2}, {0, NDOC, 101, 8, 1}, {0, NDOC, 100, 9, 1},
                         {1, NDOC, 100, 8, 1}, {0, NDOC - 1, 100, 8, 1}};
  char p0[512], p1[512];
  path_of(&a, p0, sizeof p0);
  for (size_t k = 0; k < sizeof others / sizeof *others; k++) {
    mega_gpt_order *mem = built(&others[k]), *o = open_as(&others[k], MEGA_GPT_CACHE_BUILT, NULL, 0);
    assert_same(mem, o);
    path_of(&others[k], p1, sizeof p1);
    assert_string_not_equal(p0, p1);
    mega_gpt_order_free(mem);
    mega_gpt_order_free(o);
  }
  /* the same flags over other data: one document a token longer */
  make_docs(7);
  cum[NDOC] += 1;
  mega_gpt_order *mem = built(&a), *o = open_as(&a, MEGA_GPT_CACHE_BUILT, NULL, 0);
  assert_same(mem, o);
  mega_gpt_order_free(mem);
  mega_gpt_order_free(o);
  make_docs(7);
  mega_gpt_order_free(open_as(&a, MEGA_GPT_CACHE_READ, NULL, 0)); /* the first is still there */
}

static void copy_file(const char *from, const char *to) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  assert_int_equal(system(cmd), 0);
}

/* A file is replaced, saying why, and the index is then the built one. */
static void assert_replaced(const args *a, const char *words) {
  char why[512];
  mega_gpt_order *mem = built(a), *o = open_as(a, MEGA_GPT_CACHE_REBUILT, why, sizeof why);
  if (!strstr(why, words)) fail_msg("'%s' does not say '%s'", why, words);
  assert_same(mem, o);
  mega_gpt_order_free(o);
  o = open_as(a, MEGA_GPT_CACHE_READ, NULL, 0);
  assert_same(mem, o);
  mega_gpt_order_free(mem);
  mega_gpt_order_free(o);
}

static void poke(const char *path, long at, const void *bytes, size_t n) {
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, bytes, n, at), (ssize_t)n);
  close(fd);
}

/* Makes the file's crc32s good over what it now holds, as a writer that
 * means harm would. */
static void make_crcs_good(const char *path, off_t size) {
  uint8_t *all = malloc((size_t)size);
  int fd = open(path, O_RDWR);
  assert_int_equal(pread(fd, all, (size_t)size, 0), size);
  enum { HEADER = 96, BODY_CRC = 88, HEADER_CRC = 92 }; /* the file header's layout */
  uint32_t c = (uint32_t)crc32(0, all + HEADER, (uInt)(size - HEADER));
  memcpy(all + BODY_CRC, &c, 4);
  c = (uint32_t)crc32(0, all, HEADER_CRC);
  memcpy(all + HEADER_CRC, &c, 4);
  assert_int_equal(pwrite(fd, all, HEADER, 0), HEADER);
  close(fd);
  free(all);
}

static void test_bad_files_are_caught(void **state) {
  (void)state;
  args a = {0, NDOC, 200, 8, 3}, b = {0, NDOC, 200, 8, 4};
  char pa[512], pb[512];
  path_of(&a, pa, sizeof pa);
  path_of(&b, pb, sizeof pb);
  mega_gpt_order_free(open_as(&a, MEGA_GPT_CACHE_BUILT, NULL, 0));
  /* another key's file under this key's name (as a hash collision would) */
  copy_file(pa, pb);
  assert_replaced(&b, "another --seq-length, --seed");
  /* one flipped byte in the shuffle index */
  struct stat st;
  assert_int_equal(stat(pa, &st), 0);
  uint8_t x;
  int fd = open(pa, O_RDONLY);
  assert_int_equal(pread(fd, &x, 1, st.st_size - 3), 1);
  close(fd);
  x ^= 0x10;
  poke(pa, (long)st.st_size - 3, &x, 1);
  assert_replaced(&a, "damaged (crc32)");
  /* truncated */
  assert_int_equal(truncate(pa, st.st_size - 8), 0);
  assert_replaced(&a, "truncated");
  /* a damaged header, and one that is not an index at all */
  poke(pa, 20, "\x7f", 1);
  assert_replaced(&a, "header is damaged");
  poke(pa, 0, "NOTMEGA!", 8);
  assert_replaced(&a, "not a mega order index");
  /* entries its checksums were made good over: still caught */
  int64_t huge = INT64_MAX;
  poke(pa, (long)st.st_size - 8, &huge, sizeof huge);
  make_crcs_good(pa, st.st_size);
  assert_replaced(&a, "shuffle entry out of range");
  mega_gpt_order *m = built(&a);
  int64_t first, S = mega_gpt_order_samples(m); /* the shuffle's first entry, again as its second */
  mega_gpt_order_free(m);
  fd = open(pa, O_RDONLY);
  assert_int_equal(pread(fd, &first, 8, st.st_size - 8 * S), 8);
  close(fd);
  poke(pa, (long)(st.st_size - 8 * S + 8), &first, sizeof first);
  make_crcs_good(pa, st.st_size);
  assert_replaced(&a, "shuffle entry repeated");
}

/* A damaged file that cannot be replaced is refused, not used: here the
 * temporary name it would be written to is taken by a directory. */
static void test_unreplaceable_file_is_refused(void **state) {
  (void)state;
  args a = {0, NDOC, 50, 8, 11};
  char path[512], tmp[600];
  path_of(&a, path, sizeof path);
  mega_gpt_order_free(open_as(&a, MEGA_GPT_CACHE_BUILT, NULL, 0));
  if (geteuid() != 0) { /* a good file in a read-only directory is read */
    assert_int_equal(chmod(dir, 0555), 0);
    mega_gpt_order_free(open_as(&a, MEGA_GPT_CACHE_READ, NULL, 0));
    assert_int_equal(chmod(dir, 0755), 0);
  }
  assert_int_equal(truncate(path, 200), 0);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  assert_int_equal(mkdir(tmp, 0755), 0);
  mega_gpt_order *o = NULL;
  mega_gpt_cache_how how;
  mega_err err = {0};
  mega_status st = mega_gpt_order_open(cum, a.doc0, a.doc1, a.T, a.samples, a.seed, dir, &o,
                                       &how, NULL, 0, &err);
  assert_int_equal(st, MEGA_ERR_IO);
  assert_null(o);
  if (!strstr(err.msg, "give a writable --data-cache-path")) fail_msg("%s", err.msg);
  rmdir(tmp);
}

/* Processes that start together: one builds, the rest wait and read. */
static void test_first_builds_the_rest_read(void **state) {
  (void)state;
  args a = {0, NDOC, 5000, 4, 77};
  enum { N = 6 };
  pid_t pids[N];
  for (int k = 0; k < N; k++) {
    pids[k] = fork();
    assert_true(pids[k] >= 0);
    if (pids[k] == 0) {
      mega_gpt_order *o = NULL;
      mega_gpt_cache_how how;
      mega_err err = {0};
      if (mega_gpt_order_open(cum, a.doc0, a.doc1, a.T, a.samples, a.seed, dir, &o, &how, NULL,
                              0, &err) != MEGA_OK)
        _exit(9);
      _exit(how == MEGA_GPT_CACHE_BUILT ? 1 : how == MEGA_GPT_CACHE_READ ? 0 : 8);
    }
  }
  int builds = 0;
  for (int k = 0; k < N; k++) {
    int status;
    assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
    assert_true(WIFEXITED(status));
    assert_true(WEXITSTATUS(status) <= 1);
    builds += WEXITSTATUS(status);
  }
  assert_int_equal(builds, 1);
  mega_gpt_order *mem = built(&a), *o = open_as(&a, MEGA_GPT_CACHE_READ, NULL, 0);
  assert_same(mem, o);
  mega_gpt_order_free(mem);
  mega_gpt_order_free(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cached_equals_built_and_is_read_again, setup, teardown),
      cmocka_unit_test_setup_teardown(test_another_key_builds_its_own, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_files_are_caught, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unreplaceable_file_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_first_builds_the_rest_read, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
