/* megad_write_state_file (daemon/base.h), which writes STATE/address, on a
 * full disk: here this process's file size limit (RLIMIT_FSIZE, SIGXFSZ
 * ignored), which stops a write at an exact byte and fails it as a full
 * disk would. The file is written whole or not at all, and a failure is a
 * warning that names it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/base.h"

/* Calls megad_write_state_file(name, text) with files limited to `limit`
 * bytes; what it said on stderr goes to said (cap bytes). */
static bool write_limited(const megad_base *b, const char *name, const char *text, rlim_t limit,
                          char *said, size_t cap) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  assert_true(dup2(p[1], STDERR_FILENO) >= 0);
  struct rlimit was, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
  lim = was;
  lim.rlim_cur = limit;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  bool ok = megad_write_state_file(b, name, text);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(p[1]);
  ssize_t n = read(p[0], said, cap - 1);
  said[n > 0 ? n : 0] = 0;
  close(p[0]);
  return ok;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[256];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void test_full_disk(void **state) {
  (void)state;
  signal(SIGXFSZ, SIG_IGN);
  char dir[] = "/tmp/mega-statefile-XXXXXX", path[300], tmp[300], said[2048];
  assert_non_null(mkdtemp(dir));
  megad_base b = {.node_id = (char *)"n1", .state_dir = dir};
  snprintf(path, sizeof path, "%s/address", dir);
  snprintf(tmp, sizeof tmp, "%s/address.tmp", dir);
  /* room: written */
  assert_true(write_limited(&b, "address", "127.0.0.1:4000\n", RLIM_INFINITY, said, sizeof said));
  assert_string_equal(slurp(path), "127.0.0.1:4000\n");
  assert_string_equal(said, "");
  /* room for 4 bytes of 15: the old file stays, no temp file, a warning */
  assert_false(write_limited(&b, "address", "127.0.0.1:5000\n", 4, said, sizeof said));
  assert_string_equal(slurp(path), "127.0.0.1:4000\n");
  assert_null(slurp(tmp));
  if (!strstr(said, "warning: cannot write ") || !strstr(said, path)) fail_msg("said: %s", said);
  /* none before: none after */
  assert_int_equal(unlink(path), 0);
  assert_false(write_limited(&b, "address", "127.0.0.1:5000\n", 4, said, sizeof said));
  assert_null(slurp(path));
  assert_null(slurp(tmp));
  assert_int_equal(rmdir(dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_full_disk)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
