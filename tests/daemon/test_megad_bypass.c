/* Ways around megad's guards that a caller might try (the security probe):
 * a Peer call made by hand instead of a coordinator's, and a web listener
 * opened to the network with no token. Each case runs as a test of its
 * own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define TOKEN "c2VjcmV0LXRva2VuLWZvci10ZXN0cw=="

static void write_token(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(TOKEN "\n", f);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
}

/* The roots bind a job however it reaches a node: a Peer.LaunchRanks made
 * by hand (the token serves Control and Peer alike) is held to the node's
 * --data-root and --save-root as SubmitJob is, and its job id names no
 * path out of the state dir. */
static void test_peer_launch_keeps_the_roots(void **state) {
  (void)state;
  char dir[64], tok[128], droot[128], sroot[128], out[160], esc[200], cmd[512];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  snprintf(droot, sizeof droot, "%s/data", dir);
  snprintf(sroot, sizeof sroot, "%s/ckpt", dir);
  snprintf(out, sizeof out, "%s/outside", dir);
  write_token(tok);
  snprintf(cmd, sizeof cmd, "mkdir -p %s %s", droot, sroot);
  assert_int_equal(system(cmd), 0);
  mega_rpc_auth a = {.token = TOKEN};
  hd_set_auth(&a);
  /* the tiny GPT's data file is made in the state dir: a data root there */
  char sdir[128];
  snprintf(sdir, sizeof sdir, "%s/state", dir);
  assert_int_equal(mkdir(sdir, 0700), 0);
  const char *extra[] = {"--token-file", tok, "--data-root", sdir, "--save-root", sroot, NULL};
  hd d;
  assert_true(hd_start(&d, "b1", 1, NULL, sdir, extra));
  mega_err err = {0};

  /* SubmitJob refuses a --save outside the roots ... */
  const char *save_out[] = {"--save", out, NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, save_out);
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "outside this megad's --save-root"));
  /* ... and so does the node when the same flags come as a launch */
  assert_int_equal(hd_launch_by_hand(&d, "j-90-b1", NULL, save_out, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "launch with --save outside: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "outside this megad's --save-root"));
  pid_t pids[4];
  assert_int_equal(hd_workers(&d, pids, 4), 0);

  /* a job id is a name, never a path */
  snprintf(esc, sizeof esc, "../../escaped");
  assert_int_equal(hd_launch_by_hand(&d, esc, NULL, NULL, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "launch with job id %s: %s\n", esc, err.msg);
  assert_non_null(strstr(err.msg, "job id"));
  snprintf(cmd, sizeof cmd, "%s/escaped", dir);
  struct stat sb;
  assert_int_not_equal(stat(cmd, &sb), 0);
  assert_int_equal(hd_workers(&d, pids, 4), 0);

  hd_set_auth(NULL);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* The web listener is a listener too: without a token it stays on this
 * machine, or its page would show every job's flags to the network. */
static void test_open_web_view_refused(void **state) {
  (void)state;
  char dir[64], tok[128], args[512], out[4096];
  hd_tmpdir(dir, sizeof dir);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --metrics-listen 0.0.0.0:%d --state-dir %s/s",
           hd_free_port(), dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "open web view: %s", out);
  assert_non_null(strstr(out, "--metrics-listen 0.0.0.0:"));
  assert_non_null(strstr(out, "give --token-file"));
  /* loopback needs none; with the token the network is allowed (it asks) */
  const char *local[] = {"--metrics-listen", "[::1]:0", NULL};
  hd d;
  assert_true(hd_start(&d, "w1", 1, NULL, NULL, local));
  hd_cleanup(&d);
  snprintf(tok, sizeof tok, "%s/token", dir);
  write_token(tok);
  mega_rpc_auth a = {.token = TOKEN};
  hd_set_auth(&a);
  const char *net[] = {"--token-file", tok, "--metrics-listen", "0.0.0.0:0", NULL};
  assert_true(hd_start(&d, "w2", 1, NULL, NULL, net));
  hd_set_auth(NULL);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

static int teardown(void **state) {
  (void)state;
  hd_set_auth(NULL);
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_peer_launch_keeps_the_roots, teardown),
      cmocka_unit_test_teardown(test_open_web_view_refused, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
