/* The nodes' own credential (megad serve --peer-token-file): with it a
 * holder of the client token (--token-file) calls Control only, while the
 * megads, holding the peer token, join, launch, report and forward among
 * themselves; without it one token serves both, as before, and megad says
 * so. Each case runs as a test of its own (meson). */
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

#define CLIENT_TOKEN "Y2xpZW50LXRva2VuLWZvci10ZXN0cw=="
#define PEER_TOKEN "cGVlci10b2tlbi1vZi10aGUtbm9kZXM="
#define OTHER_PEER_TOKEN "YW5vdGhlci1wZWVyLXRva2VuLXRvbw=="

static const mega_rpc_auth client_auth = {.token = CLIENT_TOKEN};
static const mega_rpc_auth peer_auth = {.token = PEER_TOKEN};

/* dir/name holding text, mode 600; its path in path. */
static void write_token(char *path, size_t n, const char *dir, const char *name,
                        const char *text) {
  snprintf(path, n, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", text);
  fclose(f);
  assert_int_equal(chmod(path, 0600), 0);
}

/* The files of a test: the client token, the peer token, another peer token. */
typedef struct files {
  char dir[64], tok[128], ptok[128], other[128];
} files;

static void make_files(files *f) {
  hd_tmpdir(f->dir, sizeof f->dir);
  write_token(f->tok, sizeof f->tok, f->dir, "token", CLIENT_TOKEN);
  write_token(f->ptok, sizeof f->ptok, f->dir, "peer-token", PEER_TOKEN);
  write_token(f->other, sizeof f->other, f->dir, "other-peer-token", OTHER_PEER_TOKEN);
}

/* One call of m (unary) with an empty request over a fresh channel carrying a. */
static mega_status call_as(const char *addr, const mega_rpc_auth *a, const mega_rpc_method *m,
                           mega_err *err) {
  mega_rpc_channel *ch;
  mega_rpc_channel_opts o = {.peer_name = "megad", .max_backoff_ms = 200, .auth = a,
                             .auth_hint = "pass --token-file or set MEGA_TOKEN_FILE"};
  assert_int_equal(mega_rpc_channel_new(addr, &o, &ch, err), MEGA_OK);
  const ProtobufCMessageDescriptor *d = m->request;
  ProtobufCMessage *req = calloc(1, d->sizeof_message);
  assert_non_null(req);
  protobuf_c_message_init(d, req);
  ProtobufCMessage *resp = NULL;
  assert_int_equal(m->kind, MEGA_RPC_UNARY);
  mega_status s = mega_rpc_unary(ch, m, req, 5000, &resp, err);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(req);
  mega_rpc_channel_free(ch);
  return s;
}

/* A job of the tiny GPT across nnodes nodes, submitted to `to` and watched
 * through `via` (its calls forwarded when via is not the coordinator). */
static void run_job(hd *to, hd *via, const char *dir, int nnodes, char *id, size_t idlen) {
  Mega__V1__JobSpec spec;
  const char *batch[] = {"--micro-batch-size", "1", "--global-batch-size", "6", NULL};
  hd_tiny_spec(&spec, dir, 2, batch); /* 6: data-parallel over 2 or 3 nodes */
  spec.nnodes_min = spec.nnodes_max = (uint32_t)nnodes;
  spec.nproc_per_node = 1;
  mega_err err = {0};
  if (hd_submit(to, &spec, id, idlen, &err) != MEGA_OK) fail_msg("submit: %s", err.msg);
  hd_watch w;
  hd_watch_job(via, id, true, 60000, &w);
  assert_true(hd_succeeded(via, &w));
  assert_int_equal(w.ranks, (uint32_t)nnodes);
  hd_watch_free(&w);
}

static bool lists_node(hd *d, const char *name) {
  mega_err err = {0};
  Mega__V1__ListNodesResponse *r = hd_list_nodes(d, &err);
  assert_non_null(r);
  bool found = false;
  for (size_t i = 0; i < r->n_nodes; i++) found |= !strcmp(r->nodes[i]->id, name);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return found;
}

/* With a peer token, the client token is refused on every Peer method
 * (PERMISSION_DENIED, naming the peer token), and serves every Control one;
 * two megads join and run a job with the peer token. */
static void test_client_token_calls_control_only(void **state) {
  (void)state;
  files f;
  make_files(&f);
  const char *extra[] = {"--token-file", f.tok, "--peer-token-file", f.ptok, NULL};
  hd_set_auth(&client_auth); /* the harness's channels: a client's, as megactl's */
  hd n1, n2;
  assert_true(hd_start(&n1, "q1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n2, "q2", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 2, 10000)); /* Join and heartbeats: the peer token */
  assert_false(hd_log_has(&n1, "serves clients and nodes alike"));

  mega_err err = {0};
  for (size_t i = 0; mega_peer_methods[i]; i++) {
    const mega_rpc_method *m = mega_peer_methods[i];
    assert_int_not_equal(call_as(n1.addr, &client_auth, m, &err), MEGA_OK);
    char want[160];
    snprintf(want, sizeof want, "denied %s (PERMISSION_DENIED): the client token may not call %s",
             mega_rpc_method_name(m), m->path);
    if (!strstr(err.msg, want) || !strstr(err.msg, "--peer-token-file"))
      fail_msg("%s with the client token: %s", m->path, err.msg);
    assert_int_not_equal(call_as(n1.addr, NULL, m, &err), MEGA_OK);
    assert_non_null(strstr(err.msg, "megad requires a token"));
  }
  fprintf(stderr, "client token on a Peer method: %s\n", err.msg);
  assert_true(hd_wait_log(&n1, "the client token, on a method only peers may call", 5000));
  /* the peer token is what a Peer method takes */
  assert_int_equal(call_as(n1.addr, &peer_auth, &mega_peer_list_held, &err), MEGA_OK);
  /* decided by the path alone: a Peer method megad lacks is refused the same */
  const mega_rpc_method nope = {MEGA_PEER_PATH_PREFIX "Nope", mega_peer_list_held.request,
                                mega_peer_list_held.response, MEGA_RPC_UNARY};
  assert_int_not_equal(call_as(n1.addr, &client_auth, &nope, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "(PERMISSION_DENIED): the client token may not call"));
  assert_int_not_equal(call_as(n1.addr, &peer_auth, &nope, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "does not implement /mega.v1.Peer/Nope"));

  /* Control: the client token, and the peer token (a forwarding megad) */
  assert_int_equal(call_as(n1.addr, &client_auth, &mega_control_list_jobs, &err), MEGA_OK);
  assert_int_equal(call_as(n1.addr, &peer_auth, &mega_control_list_jobs, &err), MEGA_OK);
  assert_int_equal(call_as(n1.addr, &client_auth, &mega_control_list_nodes, &err), MEGA_OK);

  char id[64];
  run_job(&n1, &n2, f.dir, 2, id, sizeof id); /* watched through n2: forwarded */
  Mega__V1__Job *j = hd_get_job(&n2, id, &err);
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(f.dir);
}

/* Three megads with the peer token: a job across all three, its calls
 * forwarded from the nodes that do not coordinate it; a node with another
 * peer token, or with none (the client token on its Peer calls), does not
 * get in. */
static void test_three_nodes_and_wrong_peer_tokens(void **state) {
  (void)state;
  files f;
  make_files(&f);
  const char *extra[] = {"--token-file", f.tok, "--peer-token-file", f.ptok, NULL};
  const char *wrong[] = {"--token-file", f.tok, "--peer-token-file", f.other, NULL};
  const char *none[] = {"--token-file", f.tok, NULL};
  hd_set_auth(&client_auth);
  hd n1, n2, n3, bad, old;
  assert_true(hd_start(&n1, "r1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n2, "r2", 1, n1.addr, NULL, extra));
  assert_true(hd_start(&n3, "r3", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 3, 10000));
  assert_true(hd_wait_alive(&n3, 3, 10000));

  assert_true(hd_start(&bad, "r4", 1, n1.addr, NULL, wrong));
  assert_true(hd_wait_log(&n1, "refused a call to /mega.v1.Peer/Join from", 10000));
  assert_true(hd_log_has(&n1, "wrong token"));
  assert_false(lists_node(&n1, "r4"));
  hd_cleanup(&bad);
  /* a megad not yet given the peer token: its calls carry the client token */
  assert_true(hd_start(&old, "r5", 1, n1.addr, NULL, none));
  assert_true(hd_log_has(&old, "serves clients and nodes alike"));
  assert_true(hd_wait_log(&n1, "the client token, on a method only peers may call", 10000));
  assert_false(lists_node(&n1, "r5"));
  hd_cleanup(&old);

  char id[64];
  run_job(&n2, &n3, f.dir, 3, id, sizeof id); /* coordinated by r2, watched through r3 */
  assert_non_null(strstr(id, "-r2"));
  mega_err err = {0};
  Mega__V1__Job *j = hd_get_job(&n1, id, &err); /* forwarded to r2 */
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup(&n3);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(f.dir);
}

/* Without --peer-token-file one token serves both, as before: the client
 * token still calls Peer methods, and megad says once that it can. */
static void test_single_token_serves_both(void **state) {
  (void)state;
  files f;
  make_files(&f);
  const char *extra[] = {"--token-file", f.tok, NULL};
  hd_set_auth(&client_auth);
  hd n1, n2;
  assert_true(hd_start(&n1, "s1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n2, "s2", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  assert_true(hd_log_has(&n1, "--token-file serves clients and nodes alike: whoever holds it "
                              "can act as a node"));
  assert_true(hd_log_has(&n1, "give every megad --peer-token-file FILE"));
  mega_err err = {0};
  assert_int_equal(call_as(n1.addr, &client_auth, &mega_peer_list_held, &err), MEGA_OK);
  assert_int_equal(call_as(n1.addr, &client_auth, &mega_control_list_jobs, &err), MEGA_OK);
  assert_int_not_equal(call_as(n1.addr, &peer_auth, &mega_control_list_jobs, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "refused the token (wrong token)"));
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(f.dir);
}

/* What megad refuses at start: a peer token without the client token, the
 * client token again, a file others may read. */
static void test_peer_token_refused_at_start(void **state) {
  (void)state;
  files f;
  make_files(&f);
  char args[1024], out[4096], same[128];
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --peer-token-file %s --state-dir %s/s",
           f.ptok, f.dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--peer-token-file needs --token-file too"));
  write_token(same, sizeof same, f.dir, "same", CLIENT_TOKEN);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s --peer-token-file %s "
           "--state-dir %s/s", f.tok, same, f.dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "holds the same token as --token-file"));
  assert_int_equal(chmod(f.ptok, 0644), 0);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s --peer-token-file %s "
           "--state-dir %s/s", f.tok, f.ptok, f.dir);
  assert_int_equal(hd_megad_exits(out, sizeof out, args), 2);
  assert_non_null(strstr(out, "--peer-token-file"));
  assert_non_null(strstr(out, "group or others may read it (mode 644)"));
  hd_rmdir(f.dir);
}

static int teardown(void **state) {
  (void)state;
  hd_set_auth(NULL);
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_client_token_calls_control_only, teardown),
      cmocka_unit_test_teardown(test_three_nodes_and_wrong_peer_tokens, teardown),
      cmocka_unit_test_teardown(test_single_token_serves_both, teardown),
      cmocka_unit_test_teardown(test_peer_token_refused_at_start, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
