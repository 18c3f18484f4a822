/* megad's security, end to end (issue 11): the cluster token on every
 * Control and Peer call, what megad refuses at start, TLS and mutual TLS,
 * the path roots, bounded input, and private files. Each case runs as a
 * test of its own (meson). */
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
#include <sys/wait.h>
#include <unistd.h>

#include "core/throttle.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define TOKEN "c2VjcmV0LXRva2VuLWZvci10ZXN0cw=="

static void write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(chmod(path, mode), 0);
}

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
  write_file(tok, TOKEN "\n", 0600);
  write_file(bad, "YW5vdGhlci10b2tlbi1lbnRpcmVseQ==\n", 0600);
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
  write_file(tok, TOKEN, 0644);
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
  write_file(tok, "abcdefghijklmnopqrstuvwxyz\n", 0600); /* 26: accepted before */
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
  write_file(path, "x\n", 0644);
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
  write_file(tok, TOKEN, 0600);
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

/* ---- the paths a job may name ---- */

static mega_status submit_paths(hd *d, const char *data, const char *save, const char *load,
                                char *id, mega_err *err) {
  Mega__V1__JobSpec spec;
  const char *extra[8];
  int n = 0;
  if (save) extra[n++] = "--save", extra[n++] = save;
  if (load) extra[n++] = "--load", extra[n++] = load;
  extra[n] = NULL;
  hd_tiny_spec(&spec, d->dir, 2, extra);
  for (size_t i = 0; i + 1 < spec.n_args; i++)
    if (!strcmp(spec.args[i], "--data-path")) spec.args[i + 1] = (char *)data;
  spec.nnodes_min = 2; /* waits for a second node: nothing runs */
  return hd_submit(d, &spec, id, 64, err);
}

static void test_path_roots(void **state) {
  (void)state;
  char dir[64], droot[128], sroot[128], cmd[1024], p[256], q[256], id[64];
  hd_tmpdir(dir, sizeof dir);
  snprintf(droot, sizeof droot, "%s/data", dir);
  snprintf(sroot, sizeof sroot, "%s/ckpt", dir);
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s %s/old && cp /etc/hostname %s/secret.txt && "
           "yes 'some text to train on' | head -c 4000 > %s/ok.txt && "
           "ln -s %s/secret.txt %s/link.txt && yes 'more text' | head -c 4000 > %s/outside.txt",
           droot, sroot, dir, droot, dir, droot, dir);
  assert_int_equal(system(cmd), 0);
  const char *extra[] = {"--data-root", droot, "--save-root", sroot, NULL};
  hd d;
  assert_true(hd_start(&d, "p1", 1, NULL, NULL, extra));
  mega_err err = {0};

  snprintf(p, sizeof p, "%s/ok.txt", droot);
  snprintf(q, sizeof q, "%s/new/run1", sroot); /* does not exist yet */
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_OK);
  snprintf(q, sizeof q, "%s/old", sroot);
  assert_int_equal(submit_paths(&d, p, NULL, q, id, &err), MEGA_OK);

  snprintf(p, sizeof p, "%s/outside.txt", dir);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "outside: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--data-path"));
  assert_non_null(strstr(err.msg, "outside this megad's --data-root"));
  assert_non_null(strstr(err.msg, droot));

  { /* a blend is checked dataset by dataset: the second one is outside */
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, d.dir, 2, NULL);
    char *words[72], ok[256];
    size_t n = 0;
    snprintf(ok, sizeof ok, "%s/ok.txt", droot);
    for (size_t i = 0; i < spec.n_args && n < 64; i++) {
      words[n++] = spec.args[i];
      if (!strcmp(spec.args[i], "--data-path")) {
        words[n++] = "0.5", words[n++] = ok, words[n++] = "0.5", words[n++] = p;
        i++;
      }
    }
    spec.args = words;
    spec.n_args = n;
    spec.nnodes_min = 2;
    assert_int_equal(hd_submit(&d, &spec, id, 64, &err), MEGA_ERR_INVALID);
    fprintf(stderr, "blend: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "outside.txt"));
    assert_non_null(strstr(err.msg, "outside this megad's --data-root"));
  }

  snprintf(p, sizeof p, "%s/link.txt", droot); /* a symlink out of the root */
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "resolves to"));
  snprintf(p, sizeof p, "%s/../secret.txt", droot);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);

  snprintf(p, sizeof p, "%s/ok.txt", droot);
  snprintf(q, sizeof q, "%s/new/../../escape", sroot);
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "save: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--save"));
  snprintf(q, sizeof q, "%s/elsewhere", dir);
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--save-root"));
  assert_int_equal(submit_paths(&d, p, NULL, dir, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--load"));
  hd_cleanup(&d);

  /* on the network without roots: no job may name a path */
  char tok[128];
  snprintf(tok, sizeof tok, "%s/token", dir);
  write_file(tok, TOKEN, 0600);
  mega_rpc_auth a = {.token = TOKEN};
  hd_set_auth(&a);
  const char *open_net[] = {"--listen", "0.0.0.0:0", "--advertise", "127.0.0.1", "--token-file",
                            tok, NULL};
  assert_true(hd_start(&d, "p2", 1, NULL, NULL, open_net));
  snprintf(p, sizeof p, "%s/ok.txt", droot);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "no roots: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "has no --data-root configured"));
  hd_set_auth(NULL);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* ---- bounded input, checked before any arithmetic ---- */

static mega_status submit_with(hd *d, const char *name, uint32_t nmin, uint32_t nproc,
                               const char *const *extra, mega_err *err) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 2, extra);
  spec.name = (char *)name;
  spec.nnodes_min = nmin;
  spec.nproc_per_node = nproc;
  char id[64];
  return hd_submit(d, &spec, id, sizeof id, err);
}

static void test_bounded_input(void **state) {
  (void)state;
  const char *extra[] = {"--max-pending", "2", NULL};
  hd d;
  assert_true(hd_start(&d, "b1", 2, NULL, NULL, extra));
  mega_err err = {0};
  assert_int_equal(submit_with(&d, "x", UINT32_MAX, 0, NULL, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "nnodes: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "at most 1024 nodes"));
  assert_int_equal(submit_with(&d, "x", 1, 65536, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "at most 4096"));
  const char *gbs8[] = {"--global-batch-size", "8", NULL}; /* a valid job of 4 ranks */
  assert_int_equal(submit_with(&d, "x", 1, 4, gbs8, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "nproc: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "no node of the cluster has that many slots"));
  const char *tp[] = {"--tensor-model-parallel-size", "4", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 2, tp, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "tp: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "a TP group stays inside one node"));
  const char *gpt3[] = {"--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads",
                        "96", "--seq-length", "2048", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, gpt3, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "memory: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "the model needs about"));
  assert_non_null(strstr(err.msg, "but node b1 has"));
  /* Llama 3 8B's shape counts its 8.03B parameters */
  const char *llama3[] = {"--num-layers", "32", "--hidden-size", "4096",
                          "--num-attention-heads", "32", "--seq-length", "2048",
                          "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                          "--swiglu", "--ffn-hidden-size", "14336", "--group-query-attention",
                          "--num-query-groups", "8", "--untie-embeddings-and-output-weights",
                          "--disable-bias-linear", "--tokenizer-type", "NullTokenizer",
                          "--vocab-size", "128255", "--max-position-embeddings", "8192", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, llama3, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "memory: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "for 8.03B parameters"));
  const char *layers[] = {"--num-layers", "100000", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, layers, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--num-layers 100000 is larger than the 4096 allowed"));

  char name[1024];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  assert_int_equal(submit_with(&d, name, 1, 1, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "longer than the 128 allowed"));
  assert_int_equal(submit_with(&d, "bad\nname\x1b[31mred", 1, 1, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "control character"));
  size_t big = 10u << 20; /* a 10 MB name: refused before it is parsed */
  char *huge = malloc(big + 1);
  memset(huge, 'h', big);
  huge[big] = '\0';
  assert_int_not_equal(submit_with(&d, huge, 1, 1, NULL, &err), MEGA_OK);
  fprintf(stderr, "10 MB name: %.200s\n", err.msg);
  free(huge);

  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  static char *many[700];
  size_t n = 0;
  for (; n < spec.n_args; n++) many[n] = spec.args[n];
  while (n + 2 <= 700) many[n++] = "--seed", many[n++] = "1";
  spec.args = many;
  spec.n_args = n;
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "flag words"));

  /* the queue: two jobs wait (for a second node), the third is refused */
  assert_int_equal(submit_with(&d, "w1", 2, 1, NULL, &err), MEGA_OK);
  assert_int_equal(submit_with(&d, "w2", 2, 1, NULL, &err), MEGA_OK);
  assert_int_equal(submit_with(&d, "w3", 2, 1, NULL, &err), MEGA_ERR_NOMEM); /* RESOURCE_EXHAUSTED */
  fprintf(stderr, "queue: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--max-pending 2"));

  /* still answering, and nothing of the refused jobs reached the journal */
  assert_int_equal(list_jobs(d.addr, NULL, &err), MEGA_OK);
  char path[256];
  snprintf(path, sizeof path, "%s/journal", d.dir);
  struct stat st;
  if (stat(path, &st) == 0) assert_true(st.st_size < 64 * 1024);
  hd_cleanup(&d);
}

/* ---- retention of ended jobs, and the queue's limit ---- */

static size_t count_jobs(hd *d) {
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(d->ch, &mega_control_list_jobs, &req.base, 5000, &resp, &err) != MEGA_OK)
    fail_msg("ListJobs: %s", err.msg);
  size_t n = ((Mega__V1__ListJobsResponse *)resp)->n_jobs;
  protobuf_c_message_free_unpacked(resp, NULL);
  return n;
}

/* The count once megad has applied --retain-jobs: it does so on the turn
 * of its loop after a job ends, and a ListJobs the same turn already holds
 * (the reply to the cancel went out first) still counts the job. */
static size_t count_settled(hd *d, size_t want) {
  size_t n = count_jobs(d);
  for (int i = 0; i < 100 && n != want; i++) {
    usleep(20 * 1000);
    n = count_jobs(d);
  }
  return n;
}

static void cancel(hd *d, const char *id) {
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  assert_int_equal(mega_rpc_unary(d->ch, &mega_control_cancel_job, &req.base, 5000, &resp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
}

static void test_retention(void **state) {
  (void)state;
  const char *extra[] = {"--retain-jobs", "2", NULL};
  hd d;
  assert_true(hd_start(&d, "k1", 1, NULL, NULL, extra));
  char ids[6][64], path[256];
  mega_err err = {0};
  /* --retain-jobs holds at every end, not at the next 10 s tick (a stream
   * of short jobs once listed 36 with --retain-jobs 5) */
  for (int i = 0; i < 6; i++) {
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, d.dir, 2, NULL);
    spec.nnodes_min = 2; /* waits: nothing runs */
    assert_int_equal(hd_submit(&d, &spec, ids[i], sizeof ids[i], &err), MEGA_OK);
    if (i == 0) {
      snprintf(path, sizeof path, "%s/jobs/%s", d.dir, ids[0]);
      mkdir(path, 0700); /* as a job that ran leaves it (logs) */
    }
    cancel(&d, ids[i]);
    size_t listed = count_settled(&d, i < 2 ? (size_t)i + 1 : 2);
    if (listed != (i < 2 ? (size_t)i + 1 : 2)) hd_dump_log(&d);
    assert_int_equal(listed, i < 2 ? (size_t)i + 1 : 2);
  }
  Mega__V1__Job *j = hd_get_job(&d, ids[0], &err);
  assert_null(j);
  assert_int_equal(access(path, F_OK), -1); /* its directory went with it */
  j = hd_get_job(&d, ids[5], &err); /* the newest ended are kept */
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* those that ended longest ago go first, not the oldest submitted: x,
   * submitted before y, ends after it and is kept */
  char x[64], y[64];
  Mega__V1__JobSpec wait_spec;
  hd_tiny_spec(&wait_spec, d.dir, 2, NULL);
  wait_spec.nnodes_min = 2;
  assert_int_equal(hd_submit(&d, &wait_spec, x, sizeof x, &err), MEGA_OK);
  assert_int_equal(hd_submit(&d, &wait_spec, y, sizeof y, &err), MEGA_OK);
  /* ends are kept to the millisecond, and two RPCs on loopback can fit in
   * one: a tie has no "longest ago", so each end gets its own */
  usleep(2000);
  cancel(&d, y);
  assert_int_equal(count_settled(&d, 3), 3); /* x waits; ids[5] and y ended */
  usleep(2000);
  cancel(&d, x);
  assert_int_equal(count_settled(&d, 2), 2);
  assert_null(hd_get_job(&d, ids[5], &err));
  j = hd_get_job(&d, x, &err);
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* at start too, for a journal of more */
  assert_true(hd_restart(&d, (const char *const[]){"--retain-jobs", "1", NULL}));
  assert_int_equal(count_jobs(&d), 1);
  j = hd_get_job(&d, x, &err);
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* ids are never given twice, even once their jobs are forgotten */
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  spec.nnodes_min = 2;
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_string_equal(id, "j-9-k1");
  cancel(&d, id);
  const char *age[] = {"--retain-age", "1s", NULL};
  usleep(1200000);
  assert_true(hd_restart(&d, age));
  assert_int_equal(count_jobs(&d), 0);
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_string_equal(id, "j-10-k1");
  /* the forgets were journaled whole (they were once empty records: the
   * record's bytes were read before the call that made them) */
  assert_false(hd_log_has(&d, "JOURNAL DAMAGED"));
  assert_false(hd_log_has(&d, "empty record"));
  hd_cleanup(&d);
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
  write_file(tok, TOKEN "\n", 0600);
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
      cmocka_unit_test_teardown(test_path_roots, teardown),
      cmocka_unit_test_teardown(test_bounded_input, teardown),
      cmocka_unit_test_teardown(test_files_are_private, teardown),
      cmocka_unit_test_teardown(test_retention, teardown),
      cmocka_unit_test_teardown(test_metrics_wants_the_token, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
