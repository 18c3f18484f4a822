/* numpy's legacy RandomState restated (worker/data/np_random.h) against
 * numpy itself: /usr/bin/python3 writes, at run time, the state an integer
 * seed gives, the raw 32-bit outputs across several regenerations, and the
 * shuffles Megatron's GPTDataset makes (one RandomState shuffling arrays
 * of several lengths in turn); each must be the same here. Without
 * python3 and numpy the test reports itself skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/np_random.h"

static const uint32_t seeds[] = {0, 1, 1234, 42, 4294967295u};
enum { NSEEDS = 5, NRAW = 2000 };
/* array lengths shuffled in turn by one RandomState, as Megatron shuffles
 * its document index and then its sample index */
static const int64_t lengths[] = {0, 1, 2, 3, 10, 255, 256, 257, 1000, 65537};
enum { NLEN = 10 };

static const char script[] =
    "import sys\n"
    "import numpy as np\n"
    "out = sys.stdout\n"
    "for seed in [0, 1, 1234, 42, 4294967295]:\n"
    "    rs = np.random.RandomState(seed)\n"
    "    st = rs.get_state()\n"
    "    out.write('%d ' % st[2] + ' '.join(map(str, st[1].tolist())) + '\\n')\n"
    "    out.write(' '.join(map(str, rs._bit_generator.random_raw(2000).tolist())) + '\\n')\n"
    "    rs = np.random.RandomState(seed)\n"
    "    for n in [0, 1, 2, 3, 10, 255, 256, 257, 1000, 65537]:\n"
    "        a = np.arange(n, dtype=np.int64)\n"
    "        rs.shuffle(a)\n"
    "        out.write(' '.join(map(str, a.tolist())) + '\\n')\n";

static FILE *numpy_values(void) {
  FILE *probe = popen("/usr/bin/python3 -c 'import numpy' 2>/dev/null", "r");
  if (!probe || pclose(probe) != 0) return NULL;
  char path[] = "/tmp/mega-np-random-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs(script, f);
  fclose(f);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s", path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  /* read it all so the script file can go */
  FILE *mem = tmpfile();
  assert_non_null(mem);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) fwrite(buf, 1, n, mem);
  assert_int_equal(pclose(p), 0);
  unlink(path);
  rewind(mem);
  return mem;
}

static uint64_t next_number(FILE *f) {
  unsigned long long v;
  if (fscanf(f, "%llu", &v) != 1) fail_msg("numpy's output ended early");
  return v;
}

static void test_against_numpy(void **state) {
  (void)state;
  FILE *f = numpy_values();
  if (!f) skip();
  int64_t *a = malloc(65537 * sizeof *a);
  assert_non_null(a);
  for (int s = 0; s < NSEEDS; s++) {
    mega_np_random r;
    mega_np_random_seed(&r, seeds[s]);
    assert_int_equal(next_number(f), r.pos);
    for (int k = 0; k < 624; k++) assert_int_equal(next_number(f), r.mt[k]);
    for (int k = 0; k < NRAW; k++) {
      uint64_t want = next_number(f);
      uint32_t got = mega_np_random_u32(&r);
      if (want != got) fail_msg("seed %u, raw output %d: numpy %llu, mega %u", seeds[s], k,
                                (unsigned long long)want, got);
    }
    mega_np_random_seed(&r, seeds[s]);
    for (int l = 0; l < NLEN; l++) {
      for (int64_t k = 0; k < lengths[l]; k++) a[k] = k;
      mega_np_shuffle_i64(&r, a, lengths[l]);
      for (int64_t k = 0; k < lengths[l]; k++) {
        int64_t want = (int64_t)next_number(f);
        if (want != a[k])
          fail_msg("seed %u, shuffle of %lld: element %lld is %lld in numpy, %lld here",
                   seeds[s], (long long)lengths[l], (long long)k, (long long)want,
                   (long long)a[k]);
      }
    }
  }
  unsigned long long extra;
  assert_int_equal(fscanf(f, "%llu", &extra), EOF);
  free(a);
  fclose(f);
}

/* The 32-bit and 64-bit arrays shuffle alike (Megatron's document index is
 * int32, its shuffle index uint32 or int64), and random_interval stays in
 * [0, max] over both of its word sizes. */
static void test_widths_and_interval(void **state) {
  (void)state;
  mega_np_random r32, r64;
  mega_np_random_seed(&r32, 1234);
  r64 = r32;
  int32_t a[300];
  int64_t b[300];
  for (int k = 0; k < 300; k++) a[k] = k, b[k] = k;
  mega_np_shuffle_i32(&r32, a, 300);
  mega_np_shuffle_i64(&r64, b, 300);
  int moved = 0;
  for (int k = 0; k < 300; k++) {
    assert_int_equal(a[k], b[k]);
    moved += a[k] != k;
  }
  assert_true(moved > 250);
  const uint64_t maxes[] = {0, 1, 5, 0xffffffffu, 0x100000000ull, 0x123456789abull};
  for (int m = 0; m < 6; m++)
    for (int k = 0; k < 200; k++) assert_true(mega_np_random_interval(&r32, maxes[m]) <= maxes[m]);
  assert_int_equal(mega_np_random_interval(&r32, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_against_numpy),
      cmocka_unit_test(test_widths_and_interval),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
