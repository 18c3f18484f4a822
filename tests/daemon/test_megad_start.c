/* What megad serve refuses at start, before it touches anything, where it
 * would otherwise start and then misbehave: a state dir another user owns,
 * node names and --advertise values that no peer or worker could use, and
 * TLS files that no handshake would accept; and a state dir that goes bad
 * later, named as such. Each case runs as a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
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
      {"--etcd-endpoints http://127.0.0.1:1 --etcd-lease 2500ms",
       "--etcd-lease 2500ms: etcd's leases are whole seconds"},
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

/* ---- systemd's --slots ${MEGAD_SLOTS} with the variable empty is one
 * empty word: megad's default (a slot per GPU), not "'' is not a count" ---- */

static void test_empty_slots_is_the_default(void **state) {
  (void)state;
  char dir[64], args[512], out[4096];
  hd_tmpdir(dir, sizeof dir);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --state-dir %s/s --slots '' --peers ''", dir);
  int rc = hd_megad_exits(out, sizeof out, args); /* after --slots 1: the last one counts */
  fprintf(stderr, "--slots '': rc %d: %s", rc, out);
  assert_null(strstr(out, "is not a count"));
  if (rc == 2) /* no GPU here: the default has nothing to count */
    assert_non_null(strstr(out, "this node has no GPU the cuda module can use"));
  else /* one slot per GPU: it served until ended */
    assert_int_equal(rc, 124);
  hd_rmdir(dir);
}

/* ---- a job's directory that cannot be made (the state dir's jobs is a
 * file here; a full or read-only disk alike) was reported as "cannot start
 * ranks ...: out of memory" ---- */

static void test_job_dir_refused_is_named(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "j1", 1, NULL, NULL, NULL));
  char jobs[192];
  snprintf(jobs, sizeof jobs, "%s/jobs", d.dir);
  rmdir(jobs); /* empty if there */
  write_file(jobs, "not a directory\n");
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  char id[128];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_log(&d, "cannot create the job's directory in ", 10000));
  assert_true(hd_log_has(&d, "/jobs: Not a directory"));
  assert_false(hd_log_has(&d, "out of memory"));
  hd_cleanup(&d);
}

/* ---- TLS files: gRPC took any PEM and failed late; a key not the
 * certificate's read "cannot listen ... gRPC could not bind it", and an
 * expired certificate, or one another CA signed, started a megad no peer
 * or client could reach ---- */

/* In dir: ca (a CA), ca2 (another), node (ca's, a day), old (ca's, expired
 * yesterday), stranger (ca2's), each key mode 600. */
static bool make_certs(const char *dir) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "(cd '%s' && printf 'subjectAltName=IP:127.0.0.1\\n' > ext.cnf && "
           "for c in ca ca2; do openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
           "-nodes -keyout $c.key -out $c.pem -days 2 -subj /CN=$c || exit 1; done && "
           "for n in node stranger; do openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
           "-nodes -keyout $n.key -out $n.csr -subj /CN=$n || exit 1; done && "
           "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem "
           "-days 1 -extfile ext.cnf && "
           "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -out old.pem -days -1 "
           "-extfile ext.cnf && "
           "openssl x509 -req -in stranger.csr -CA ca2.pem -CAkey ca2.key -CAcreateserial "
           "-out stranger.pem -days 1 -extfile ext.cnf && chmod 600 *.key) >/dev/null 2>&1",
           dir);
  return system(cmd) == 0;
}

static void test_tls_files_checked(void **state) {
  (void)state;
  char dir[64], args[1024], out[4096];
  hd_tmpdir(dir, sizeof dir);
  if (!make_certs(dir)) {
    hd_rmdir(dir);
    fail_msg("openssl could not make test certificates (scripts/install-deps installs it)");
  }
  static const struct {
    const char *cert, *key, *ca, *says;
  } refused[] = {
      {"node.pem", "stranger.key", "ca.pem", "stranger.key is not the key of --tls-cert"},
      {"old.pem", "node.key", "ca.pem", "(/CN=node) expired on "},
      {"stranger.pem", "stranger.key", "ca.pem", "does not verify against --tls-ca"},
      {"node.key", "node.key", "ca.pem", "holds no certificate OpenSSL can read"},
      {"node.pem", "node.key", "ca.key", "--tls-ca"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    snprintf(args, sizeof args,
             "--listen 127.0.0.1:0 --state-dir %s/s%zu --tls-cert %s/%s --tls-key %s/%s "
             "--tls-ca %s/%s", dir, i, dir, refused[i].cert, dir, refused[i].key, dir,
             refused[i].ca);
    assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
    fprintf(stderr, "%s %s %s: %s", refused[i].cert, refused[i].key, refused[i].ca, out);
    assert_non_null(strstr(out, refused[i].says));
    assert_null(strstr(out, "could not bind"));
  }

  /* megactl's own certificate: the same pair check, before any call */
  snprintf(args, sizeof args,
           "'%s' --server 127.0.0.1:1 --tls-ca %s/ca.pem --tls-cert %s/node.pem --tls-key "
           "%s/stranger.key ls 2>&1", getenv("MEGACTL"), dir, dir, dir);
  FILE *p = popen(args, "r");
  assert_non_null(p);
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = '\0';
  assert_int_not_equal(pclose(p), 0);
  fprintf(stderr, "megactl: %s", out);
  assert_non_null(strstr(out, "stranger.key is not the key of --tls-cert"));

  /* the right files serve, and a certificate about to expire is named */
  char ca[128], cert[128], key[128], buf[8192];
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(cert, sizeof cert, "%s/node.pem", dir);
  snprintf(key, sizeof key, "%s/node.key", dir);
  char *ca_pem = strdup(slurp(ca, buf, sizeof buf)), *cert_pem = strdup(slurp(cert, buf, sizeof buf)),
       *key_pem = strdup(slurp(key, buf, sizeof buf));
  mega_rpc_auth tls = {.tls_ca = ca_pem, .tls_cert = cert_pem, .tls_key = key_pem};
  hd_set_auth(&tls);
  const char *extra[] = {"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, NULL};
  hd d;
  assert_true(hd_start(&d, "t1", 1, NULL, NULL, extra));
  /* a day's certificate, made a moment ago (openssl may round its end up) */
  bool warned = hd_log_has(&d, "node.pem expires in 23 hours: renew it, then restart megad") ||
                hd_log_has(&d, "node.pem expires in 24 hours: renew it, then restart megad");
  if (!warned) hd_dump_log(&d);
  assert_true(warned);
  mega_err err = {0};
  Mega__V1__ListNodesResponse *r = hd_list_nodes(&d, &err);
  assert_non_null(r); /* and answers over TLS */
  protobuf_c_message_free_unpacked(&r->base, NULL);
  hd_set_auth(NULL);
  hd_cleanup(&d);
  free(ca_pem);
  free(cert_pem);
  free(key_pem);
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
      cmocka_unit_test_teardown(test_tls_files_checked, teardown),
      cmocka_unit_test_teardown(test_empty_slots_is_the_default, teardown),
      cmocka_unit_test_teardown(test_job_dir_refused_is_named, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
