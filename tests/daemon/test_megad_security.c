/* megad's security, end to end (issue 11): the cluster token on every
 * Control and Peer call and on /metrics, what megad refuses at start, its
 * listen addresses, TLS and mutual TLS, a state dir of its own and private
 * files. What a job may ask for (paths, sizes, retention):
 * test_megad_limits.c. Each case runs as a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/throttle.h"
#include "harness.h"

#define TOKEN "c2VjcmV0LXRva2VuLWZvci10ZXN0cw=="

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return strdup("");
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return strdup(buf);
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* A ListJobs over a fresh channel with auth a; the status, err filled. */
static mega_status list_jobs(const char *addr, const mega_rpc_auth *a, mega_err *err) {
  mega_rpc_channel *ch;
  mega_rpc_channel_opts o = {.peer_name = "megad", .max_backoff_ms = 200, .auth = a,
                             .auth_hint = "pass --token-file or set MEGA_TOKEN_FILE"};
  assert_int_equal(mega_rpc_channel_new(addr, &o, &ch, err), MEGA_OK);
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  mega_status s = mega_rpc_unary(ch, &mega_control_list_jobs, &req.base, 5000, &resp, err);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  mega_rpc_channel_free(ch);
  return s;
}

/* ---- the token: every Control and Peer call carries it ---- */

static void test_token_guards_every_call(void **state) {
  (void)state;
  char dir[64], tok[128], bad[128];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  snprintf(bad, sizeof bad, "%s/other", dir);
  hd_write_file(tok, TOKEN "\n", 0600);
  hd_write_file(bad, "YW5vdGhlci10b2tlbi1lbnRpcmVseQ==\n", 0600);
  mega_rpc_auth good = {.token = TOKEN}, wrong = {.token = "YW5vdGhlci10b2tlbi1lbnRpcmVseQ=="};
  const char *with_tok[] = {"--token-file", tok, NULL}, *with_bad[] = {"--token-file", bad, NULL};
  hd n1, n2, n3;
  hd_set_auth(&good);
  assert_true(hd_start(&n1, "t1", 1, NULL, NULL, with_tok));
  assert_true(hd_start(&n2, "t2", 1, n1.addr, NULL, with_tok));
  assert_true(hd_wait_alive(&n1, 2, 10000)); /* heartbeats (Peer calls) carry the token */

  mega_err err = {0};
  double refusing_since = hd_now_s(); /* n1 logs refusals from here on */
  assert_int_not_equal(list_jobs(n1.addr, NULL, &err), MEGA_OK);
  fprintf(stderr, "no token: %s\n", err.msg);
  assert_string_equal(err.msg, "megad requires a token: pass --token-file or set MEGA_TOKEN_FILE");
  assert_int_not_equal(list_jobs(n1.addr, &wrong, &err), MEGA_OK);
  fprintf(stderr, "wrong token: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "refused the token (wrong token)"));
  assert_int_equal(list_jobs(n1.addr, &good, &err), MEGA_OK);
  /* guesses: a few more are refused as such, then held off; the right token passes */
  for (int i = 1; i < MEGA_THROTTLE_FREE; i++)
    assert_int_not_equal(list_jobs(n1.addr, &wrong, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "refused the token (wrong token)"));
  assert_int_not_equal(list_jobs(n1.addr, &wrong, &err), MEGA_OK);
  fprintf(stderr, "guessing: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "too many wrong tokens from 127.0.0.1"));
  assert_int_equal(list_jobs(n1.addr, &good, &err), MEGA_OK);

  /* a flood of bad calls: each refused, the log rate-limited */
  for (int i = 0; i < 40; i++) assert_int_not_equal(list_jobs(n1.addr, NULL, &err), MEGA_OK);

  /* a megad with another token cannot join: its calls are refused */
  hd_set_auth(&wrong);
  assert_true(hd_start(&n3, "t3", 1, n1.addr, NULL, with_bad));
  usleep(2000000);
  Mega__V1__ListNodesResponse *r = hd_list_nodes(&n1, &err);
  assert_non_null(r);
  for (size_t i = 0; i < r->n_nodes; i++) assert_string_not_equal(r->nodes[i]->id, "t3");
  protobuf_c_message_free_unpacked(&r->base, NULL);

  /* a job across both nodes: launches, reports and rendezvous all pass */
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, dir, 2, NULL);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  assert_true(hd_succeeded(&n1, &w));
  hd_watch_free(&w);

  char *log = slurp(n1.log);
  assert_non_null(strstr(log, "refused a call to /mega.v1.Control/ListJobs from ipv4:127.0.0.1:"));
  assert_non_null(strstr(log, "/mega.v1.Peer/")); /* t3's heartbeats or join */
  /* t3 keeps calling (a join each heartbeat) until the end: one line a
   * second at most for as long as that took (a fixed 8 was too few for a
   * loaded machine under ASan, where the job alone can take seconds) */
  int lines = count(log, "refused");
  double span = hd_now_s() - refusing_since;
  fprintf(stderr, "%d refusal lines in %.1f s for more than 40 refused calls and t3's\n", lines,
          span);
  assert_true(lines >= 1 && lines <= 2 + (int)span);
  free(log);
  hd_set_auth(NULL);
  hd_cleanup(&n3);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(dir);
}

/* ---- what megad refuses at start ---- */

static void test_refused_at_start(void **state) {
  (void)state;
  char dir[64], tok[128], args[1024], out[4096];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  hd_write_file(tok, TOKEN, 0644);
  snprintf(args, sizeof args, "--listen 0.0.0.0:0 --state-dir %s/s", dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "reaches beyond this machine: give --token-file"));
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s --state-dir %s/s", tok, dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "group or others may read it (mode 644)"));
  assert_non_null(strstr(out, "chmod 600"));
  snprintf(args, sizeof args, "--listen 127.0.0.1:99999 --state-dir %s/s", dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "'99999' is not a port"));
  chmod(tok, 0600);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s --tls-cert %s --tls-key %s "
           "--state-dir %s/s", tok, tok, tok, dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--tls-cert needs --tls-ca"));
  hd_write_file(tok, "abcdefghijklmnopqrstuvwxyz\n", 0600); /* 26: accepted before */
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s --state-dir %s/s", tok, dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "short token: %s", out);
  assert_non_null(strstr(out, "shorter than 32 characters"));
  assert_non_null(strstr(out, "head -c 32 /dev/urandom | base64"));
  /* a root anyone may write: others could swap a job's --save for a link */
  char open_root[160];
  snprintf(open_root, sizeof open_root, "%s/open", dir);
  assert_int_equal(mkdir(open_root, 0700), 0);
  assert_int_equal(chmod(open_root, 0777), 0);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --save-root %s --state-dir %s/s", open_root,
           dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "open root: %s", out);
  assert_non_null(strstr(out, "--save-root"));
  assert_non_null(strstr(out, "is a shared directory (mode 0777: anyone may write)"));
  hd_rmdir(dir);
}

/* ---- listen addresses: a host alone is refused (gRPC would take 443),
 * a busy --metrics-listen names its port, and port 0's choice is logged ---- */

static void test_listen_addresses(void **state) {
  (void)state;
  char dir[64], args[512], out[4096];
  hd_tmpdir(dir, sizeof dir);
  snprintf(args, sizeof args, "--listen 127.0.0.1 --state-dir %s/s", dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "no port: %s", out);
  assert_non_null(strstr(out, "give HOST:PORT, such as 127.0.0.1:7070"));

  int busy = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(busy, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(busy, 1), 0);
  assert_int_equal(getsockname(busy, (struct sockaddr *)&sa, &sl), 0);
  int port = ntohs(sa.sin_port);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --metrics-listen 127.0.0.1:%d --state-dir %s/s",
           port, dir);
  assert_int_not_equal(hd_megad_exits(out, sizeof out, args), 0);
  fprintf(stderr, "busy: %s", out);
  char want[64];
  snprintf(want, sizeof want, "port %d", port);
  assert_non_null(strstr(out, want));
  assert_null(strstr(out, "port 0"));
  close(busy);

  const char *extra[] = {"--metrics-listen", "127.0.0.1:0", NULL};
  hd d;
  assert_true(hd_start(&d, "l1", 1, NULL, NULL, extra));
  const char *line = "serving /metrics and the web view on 127.0.0.1:";
  assert_true(hd_wait_log(&d, line, 5000));
  FILE *f = fopen(d.log, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  fclose(f);
  out[n] = '\0';
  const char *at = strstr(out, line);
  assert_non_null(at);
  int chosen = atoi(at + strlen(line));
  assert_true(chosen > 0);
  char *page = hd_http_get(chosen, "/healthz", NULL);
  assert_non_null(page);
  assert_non_null(strstr(page, " 200 "));
  free(page);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* ---- the state dir: megad makes its own private, and leaves a file or a
 * directory others share (like /tmp) as it found it, refusing to start ---- */

static void test_state_dir_is_its_own(void **state) {
  (void)state;
  char dir[64], path[128], args[512], out[4096];
  struct stat st;
  hd_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/afile", dir);
  hd_write_file(path, "x\n", 0644);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --state-dir %s", path);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  fprintf(stderr, "a file: %s", out);
  assert_non_null(strstr(out, "is not a directory"));
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0644);

  static const unsigned shared[] = {01777, 0777, 01755};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/shared%d", dir, i);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(chmod(path, shared[i]), 0);
    snprintf(args, sizeof args, "--listen 127.0.0.1:0 --state-dir %s", path);
    assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
    fprintf(stderr, "mode %04o: %s", shared[i], out);
    assert_non_null(strstr(out, "is a shared directory"));
    char mode[16];
    snprintf(mode, sizeof mode, "mode %04o", shared[i]);
    assert_non_null(strstr(out, mode));
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, shared[i]);
  }

  /* its own: made private, and the log says what the mode was */
  snprintf(path, sizeof path, "%s/own", dir);
  assert_int_equal(mkdir(path, 0700), 0);
  assert_int_equal(chmod(path, 02755), 0);
  hd d;
  assert_true(hd_start(&d, "s1", 1, NULL, path, NULL));
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  assert_true(hd_log_has(&d, "(mode 2700, was 2755)"));
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* ---- TLS, and mutual TLS between megads ---- */

static bool make_certs(const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext.cnf && "
           "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
           "-subj '/CN=mega test CA' && "
           "openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj '/CN=node' && "
           "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
           "-out node.pem -days 1 -extfile ext.cnf && chmod 600 node.key",
           dir);
  char full[2200];
  snprintf(full, sizeof full, "(%s) >/dev/null 2>&1", cmd);
  return system(full) == 0;
}

static void test_tls_and_client_certificates(void **state) {
  (void)state;
  char dir[64], tok[128], ca[128], cert[128], key[128];
  hd_tmpdir(dir, sizeof dir);
  if (!make_certs(dir)) {
    hd_rmdir(dir);
    fail_msg("openssl could not make test certificates (scripts/install-deps installs it)");
  }
  snprintf(tok, sizeof tok, "%s/token", dir);
  hd_write_file(tok, TOKEN, 0600);
  snprintf(ca, sizeof ca, "%s/ca.pem", dir);
  snprintf(cert, sizeof cert, "%s/node.pem", dir);
  snprintf(key, sizeof key, "%s/node.key", dir);
  char *ca_pem = slurp(ca), *cert_pem = slurp(cert), *key_pem = slurp(key);
  const char *extra[] = {"--token-file", tok, "--tls-cert", cert, "--tls-key", key,
                         "--tls-ca", ca, "--tls-client-auth", NULL};
  mega_rpc_auth mtls = {.token = TOKEN, .tls_ca = ca_pem, .tls_cert = cert_pem,
                        .tls_key = key_pem};
  hd_set_auth(&mtls);
  hd n1, n2;
  assert_true(hd_start(&n1, "s1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n2, "s2", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 2, 10000)); /* peers call each other over mTLS */
  assert_true(hd_wait_alive(&n2, 2, 10000));
  mega_err err = {0};
  assert_int_equal(list_jobs(n1.addr, &mtls, &err), MEGA_OK);

  mega_rpc_auth plain = {.token = TOKEN};
  assert_int_not_equal(list_jobs(n1.addr, &plain, &err), MEGA_OK);
  fprintf(stderr, "plaintext client: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "cannot reach megad"));
  mega_rpc_auth no_cert = {.token = TOKEN, .tls_ca = ca_pem};
  assert_int_not_equal(list_jobs(n1.addr, &no_cert, &err), MEGA_OK);
  fprintf(stderr, "no client certificate: %s\n", err.msg);
  mega_rpc_auth no_token = {.tls_ca = ca_pem, .tls_cert = cert_pem, .tls_key = key_pem};
  assert_int_not_equal(list_jobs(n1.addr, &no_token, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "requires a token"));
  hd_set_auth(NULL);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  free(ca_pem);
  free(cert_pem);
  free(key_pem);
  hd_rmdir(dir);
}

/* ---- private files ---- */

static void test_files_are_private(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "m1", 1, NULL, NULL, NULL));
  char save[256];
  snprintf(save, sizeof save, "%s/ckpt", d.dir);
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--save", save, "--save-interval", "1", NULL};
  hd_tiny_spec(&spec, d.dir, 2, extra);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, id, true, 60000, &w);
  assert_true(hd_succeeded(&d, &w));
  hd_watch_free(&w);
  /* every file and directory under the state dir, checkpoints included */
  char cmd[512];
  snprintf(cmd, sizeof cmd, "find '%s' -mindepth 1 \\( -type d ! -perm 700 -o -type f -perm /077 \\) "
           "! -name '*.sock' ! -name tiny.txt -print", d.dir); /* tiny.txt: the test's own */
  FILE *p = popen(cmd, "r");
  char out[4096] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  pclose(p);
  if (out[0]) fprintf(stderr, "not private:\n%s", out);
  assert_string_equal(out, "");
  snprintf(cmd, sizeof cmd, "find '%s' -type f -name '*.safetensors' | grep -q .", save);
  assert_int_equal(system(cmd), 0); /* a checkpoint was written, and checked above */
  hd_cleanup(&d);
}

static int teardown(void **state) {
  (void)state;
  hd_set_auth(NULL);
  hd_cleanup_all();
  return 0;
}

/* With --token-file, /metrics wants the token as a bearer token. */
static void test_metrics_wants_the_token(void **state) {
  (void)state;
  char dir[64], tok[128], maddr[64];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  hd_write_file(tok, TOKEN "\n", 0600);
  int port = hd_free_port();
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
  const char *extra[] = {"--token-file", tok, "--metrics-listen", maddr, NULL};
  mega_rpc_auth good = {.token = TOKEN};
  hd_set_auth(&good);
  hd n1;
  assert_true(hd_start(&n1, "m1", 1, NULL, NULL, extra));
  char *p = hd_http_get(port, "/metrics", NULL);
  assert_non_null(strstr(p, " 401 "));
  assert_null(strstr(p, "mega_jobs"));
  free(p);
  p = hd_http_get(port, "/metrics", "Bearer YW5vdGhlci10b2tlbi1lbnRpcmVseQ==");
  assert_non_null(strstr(p, " 401 "));
  free(p);
  p = hd_http_get(port, "/metrics", "Bearer " TOKEN);
  assert_non_null(strstr(p, " 200 OK"));
  assert_non_null(strstr(p, "\nmega_jobs_submitted_total 0\n"));
  assert_non_null(strstr(p, "mega_http_requests_total{code=\"401\"} 2\n"));
  free(p);
  assert_int_equal(hd_stop(&n1), 0);
  hd_cleanup(&n1);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_token_guards_every_call, teardown),
      cmocka_unit_test_teardown(test_refused_at_start, teardown),
      cmocka_unit_test_teardown(test_state_dir_is_its_own, teardown),
      cmocka_unit_test_teardown(test_listen_addresses, teardown),
      cmocka_unit_test_teardown(test_tls_and_client_certificates, teardown),
      cmocka_unit_test_teardown(test_files_are_private, teardown),
      cmocka_unit_test_teardown(test_metrics_wants_the_token, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
