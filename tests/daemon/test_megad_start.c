/* What megad serve refuses at start, before it touches anything, where it
 * would otherwise start and then misbehave: a state dir another user owns,
 * node names and --advertise values that no peer or worker could use, and
 * TLS files that no handshake would accept. Each case runs as a test of
 * its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static char *slurp(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, len - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  return buf;
}

/* ---- a state dir another user owns: its owner could plant a journal for
 * megad to run, or a link for megad to write through (as root: anywhere) ---- */

static void test_state_dir_of_another_user(void **state) {
  (void)state;
  if (geteuid() != 0) skip(); /* only root can give a directory away */
  char dir[64], sd[128], victim[128], link[192], args[512], out[4096], buf[256];
  hd_tmpdir(dir, sizeof dir);
  snprintf(sd, sizeof sd, "%s/theirs", dir);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  write_file(victim, "precious\n");
  assert_int_equal(mkdir(sd, 0755), 0);
  snprintf(link, sizeof link, "%s/address", sd);
  assert_int_equal(symlink(victim, link), 0);
  assert_int_equal(lchown(link, 65534, 65534), 0);
  assert_int_equal(chown(sd, 65534, 65534), 0); /* nobody's, with nobody's link in it */
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --state-dir %s", sd);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "another user's: %s", out);
  assert_non_null(strstr(out, "belongs to uid 65534"));
  assert_string_equal(slurp(victim, buf, sizeof buf), "precious\n");
  snprintf(link, sizeof link, "%s/journal", sd);
  assert_int_not_equal(access(link, F_OK), 0); /* nothing written there */
  snprintf(link, sizeof link, "%s/lock", sd);
  assert_int_not_equal(access(link, F_OK), 0);

  /* chowned back to megad's user, the same directory serves */
  assert_int_equal(chown(sd, 0, 0), 0);
  snprintf(link, sizeof link, "%s/address", sd);
  assert_int_equal(unlink(link), 0);
  hd d;
  assert_true(hd_start(&d, "o1", 1, NULL, sd, NULL));
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* ---- node names: part of job ids, etcd keys and paths, held in 64-byte
 * buffers; a long UTF-8 name cut a job id mid-character, which broke every
 * /metrics scrape, and an empty or slashed one made ids no path could hold.
 * --advertise: a host alone; "host:port" or a bare IPv6 address made an
 * address no peer or worker could dial ---- */

static void test_node_names_and_advertise(void **state) {
  (void)state;
  char dir[64], args[512], out[4096];
  hd_tmpdir(dir, sizeof dir);
  char long_name[80];
  memset(long_name, 'n', 64);
  long_name[64] = '\0';
  static const struct {
    const char *flags, *says;
  } refused[] = {
      {"--node-name ''", "--node-name is empty"},
      {"--node-name 'a/b'", "holds '/' (byte 2); a node name has only letters, digits"},
      {"--node-name 'n\"1'", "holds '\"' (byte 2)"},
      {"--node-name '\xc3\xbc'", "holds '?' (byte 1)"},
      {NULL, "is 64 bytes long; a node name has at most 63"},
      {"--advertise ''", "--advertise is empty"},
      {"--advertise 10.0.0.1:7070", "give the host alone, 10.0.0.1; the port is --listen's"},
      {"--advertise fd00::1", "write an IPv6 address in brackets, [fd00::1]"},
      {"--advertise '[fd00::1]:7070'", "an IPv6 address in brackets, such as [fd00::1], and no port"},
      {"--advertise http://n1", "give a host alone (a name or an address), not a URL"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    char flags[128];
    snprintf(flags, sizeof flags, "%s", refused[i].flags ? refused[i].flags : "");
    if (!refused[i].flags) snprintf(flags, sizeof flags, "--node-name %s", long_name);
    snprintf(args, sizeof args, "--listen 127.0.0.1:0 --state-dir %s/s%zu %s", dir, i, flags);
    assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
    fprintf(stderr, "%s: %s", flags, out);
    assert_non_null(strstr(out, refused[i].says));
  }

  /* the longest name serves, and its job ids carry it whole */
  long_name[63] = '\0';
  hd d;
  assert_true(hd_start(&d, long_name, 1, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  char id[128], want[96];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  snprintf(want, sizeof want, "j-1-%s", long_name);
  assert_string_equal(id, want);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_state_dir_of_another_user, teardown),
      cmocka_unit_test_teardown(test_node_names_and_advertise, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
