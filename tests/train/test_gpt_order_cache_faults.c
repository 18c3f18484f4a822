/* --data-cache-path when things go wrong (worker/data/gpt_order.h): the
 * temp file of a builder that was killed (SIGKILL from megad, an OOM kill)
 * is removed by the next build, which holds the lock, so dead builders do
 * not pile up index-sized files; a full disk (RLIMIT_FSIZE stands in for
 * it: no root, an exact byte) refuses with the file and leaves no temp. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/gpt_order.h"

enum { NDOC = 30, SAMPLES = 400, SEQ = 8, SEED = 3 };
static int64_t cum[NDOC + 1];
static char dir[256];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/mega-order-faults-XXXXXX");
  assert_non_null(mkdtemp(dir));
  for (int k = 0; k < NDOC; k++) cum[k + 1] = cum[k] + 3 + (k * 7) % 40;
  signal(SIGXFSZ, SIG_IGN); /* as megaw: the write fails with EFBIG instead */
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd);
}

static mega_status open_order(mega_gpt_cache_how *how, mega_err *err) {
  mega_gpt_order *o = NULL;
  mega_status st =
      mega_gpt_order_open(cum, 0, NDOC, SEQ, SAMPLES, SEED, dir, &o, how, NULL, 0, err);
  mega_gpt_order_free(o);
  return st;
}

/* Names in dir that hold part. */
static int names_with(const char *part) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, part)) n++;
  closedir(d);
  return n;
}

/* The pid of a process that has ended. */
static pid_t dead_pid(void) {
  pid_t p = fork();
  assert_true(p >= 0);
  if (p == 0) _exit(0);
  assert_int_equal(waitpid(p, NULL, 0), p);
  return p;
}

/* A builder killed while it wrote left NAME.tmp.PID; the next build
 * removes it (it was kept for ever, one more file of the index's size for
 * each builder killed). */
static void test_dead_builders_temp_is_removed(void **state) {
  (void)state;
  char path[512], stale[600];
  mega_gpt_order_cache_path(cum, 0, NDOC, SEQ, SAMPLES, SEED, dir, path, sizeof path);
  snprintf(stale, sizeof stale, "%s.tmp.%ld", path, (long)dead_pid());
  FILE *f = fopen(stale, "w");
  assert_non_null(f);
  for (int i = 0; i < 4096; i++) fputc(i & 0xff, f);
  fclose(f);
  mega_gpt_cache_how how;
  mega_err err = {0};
  if (open_order(&how, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(how, MEGA_GPT_CACHE_BUILT);
  if (access(stale, F_OK) == 0) fail_msg("%s is still there", stale);
  assert_int_equal(names_with(".tmp."), 0);
  assert_int_equal(open_order(&how, &err), MEGA_OK);
  assert_int_equal(how, MEGA_GPT_CACHE_READ);
}

/* The disk fills while the index is written: the job is refused (the
 * order exists only if every process can map it), naming the file and the
 * cause, and nothing is left half written; with room, the next start
 * builds it. The refusal says what to do. */
static void test_full_disk_refuses_and_leaves_no_temp(void **state) {
  (void)state;
  struct rlimit r, was;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
  r = was;
  r.rlim_cur = 1000;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &r), 0);
  mega_gpt_cache_how how;
  mega_err err = {0};
  mega_status st = open_order(&how, &err);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
  assert_int_equal(st, MEGA_ERR_IO);
  if (!strstr(err.msg, dir) || !strstr(err.msg, "File too large") ||
      !strstr(err.msg, "or drop --data-cache-path"))
    fail_msg("%s", err.msg);
  assert_int_equal(names_with(".tmp."), 0);
  assert_int_equal(open_order(&how, &err), MEGA_OK);
  assert_int_equal(how, MEGA_GPT_CACHE_BUILT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_dead_builders_temp_is_removed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_disk_refuses_and_leaves_no_temp, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
