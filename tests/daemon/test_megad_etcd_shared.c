/* megad on an etcd shared with others (etcd_fixture.h; skipped without
 * etcd): two clusters on one etcd under --etcd-prefix never see each
 * other's nodes or jobs, and an elastic job of one takes no node of the
 * other; TLS with client certificates towards an etcd started with
 * --client-cert-auth; a user and password (etcd's authentication on), with
 * a user whose role covers only its prefix, a wrong password and a prefix
 * outside the role refused with what to do, and a restarted etcd member
 * (whose simple tokens are gone) met by authenticating again; a role that
 * loses the prefix for a while and gets it back; prefixes that nest. */
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

#include "etcd_fixture.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

static etcd_fx fx;

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  etcd_fx_stop(&fx);
  return 0;
}

/* A short tiny job on nodes [lo, hi] of d's cluster, one rank each. A
 * megad that has not yet seen etcd again (after a restart of it) refuses
 * new jobs and says to submit again: so does this, for up to 20 s. */
static void submit(hd *d, int iters, int lo, int hi, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, iters, NULL);
  spec.nnodes_min = (uint32_t)lo;
  spec.nnodes_max = (uint32_t)hi;
  spec.nproc_per_node = 1;
  double t0 = hd_now_s();
  for (;;) {
    mega_err err = {0};
    if (hd_submit(d, &spec, id, len, &err) == MEGA_OK) return;
    if (!strstr(err.msg, "submit again once etcd is back") || hd_now_s() - t0 > 20)
      fail_msg("submit: %s", err.msg);
    usleep(200 * 1000);
  }
}

static Mega__V1__Job *wait_end(hd *d, const char *id, int ms) {
  double t0 = hd_now_s();
  while (hd_now_s() - t0 < ms / 1000.0) {
    Mega__V1__Job *j = hd_get_job(d, id, NULL);
    if (j && (j->state == STATE(SUCCEEDED) || j->state == STATE(FAILED) ||
              j->state == STATE(CANCELLED)))
      return j;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    usleep(100 * 1000);
  }
  return NULL;
}

static bool lists_node(hd *d, const char *node) {
  Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
  bool found = false;
  for (size_t i = 0; r && i < r->n_nodes; i++) found |= !strcmp(r->nodes[i]->id, node);
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return found;
}

/* A megad of one slot named name, in the cluster at prefix of fx's etcd. */
static bool start_at(hd *d, const char *name, const char *prefix) {
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", prefix, NULL};
  return hd_start(d, name, 1, NULL, NULL, extra);
}

static void test_two_clusters_share_one_etcd(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 1));
  hd a1, a2, b1, b2;
  assert_true(start_at(&a1, "a1", "mega/a/"));
  assert_true(start_at(&a2, "a2", "mega/a/"));
  assert_true(start_at(&b1, "b1", "mega/b/"));
  assert_true(start_at(&b2, "b2", "mega/b/"));
  assert_true(hd_wait_alive(&a1, 2, 10000));
  assert_true(hd_wait_alive(&b1, 2, 10000));
  assert_false(lists_node(&a1, "b1") || lists_node(&a1, "b2"));
  assert_false(lists_node(&b2, "a1") || lists_node(&b2, "a2"));
  /* elastic up to 4 nodes: it takes both of its cluster's, none of the other's */
  char id[64];
  submit(&a1, 20, 1, 4, id, sizeof id);
  Mega__V1__Job *j = wait_end(&a1, id, 60000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  assert_int_equal(j->n_placement, 2);
  for (size_t i = 0; i < j->n_placement; i++)
    assert_true(j->placement[i]->node_id[0] == 'a');
  protobuf_c_message_free_unpacked(&j->base, NULL);
  mega_err err = {0};
  assert_null(hd_get_job(&b1, id, &err));
  assert_int_equal(err.status, MEGA_ERR_NOT_FOUND);
  /* and in etcd: everything under the prefixes */
  assert_int_equal(
      etcd_fx_ctl(&fx, "get --prefix mega/a/nodes/ --keys-only | grep -qx mega/a/nodes/a2"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "get --prefix mega/a/j/ --keys-only | grep -q ."), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "get --prefix mega/b/j/ --keys-only | grep -q ."), 1);
  assert_int_equal(etcd_fx_ctl(&fx, "get --prefix mega/nodes/ --keys-only | grep -q ."), 1);
  /* megactl etcd-dump shows each cluster's tree, values decoded */
  char cmd[512], out[1 << 16];
  snprintf(cmd, sizeof cmd, "'%s' etcd-dump --etcd-endpoints %s --etcd-prefix mega/a/ --json",
           getenv("MEGACTL"), fx.endpoints);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  assert_int_equal(pclose(p), 0);
  assert_non_null(strstr(out, "{\"key\":\"mega/a/nodes/a1\""));
  assert_non_null(strstr(out, "\"state\":\"NODE_STATE_ALIVE\""));
  char want[128];
  snprintf(want, sizeof want, "{\"key\":\"mega/a/j/%s/0\"", id);
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "\"state\":\"JOB_STATE_SUCCEEDED\""));
  snprintf(cmd, sizeof cmd, "'%s' etcd-dump --etcd-endpoints %s --etcd-prefix mega/b/ --keys-only",
           getenv("MEGACTL"), fx.endpoints);
  p = popen(cmd, "r");
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  assert_int_equal(pclose(p), 0);
  assert_non_null(strstr(out, "mega/b/nodes/b1\n"));
  assert_null(strstr(out, id));
  hd_cleanup_all();
}

static void test_tls_client_certificates(void **state) {
  (void)state;
  assert_true(etcd_fx_start_tls(&fx));
  char ca[128], cert[128], key[128];
  snprintf(ca, sizeof ca, "%s/ca.pem", fx.dir);
  snprintf(cert, sizeof cert, "%s/client.pem", fx.dir);
  snprintf(key, sizeof key, "%s/client.key", fx.dir);
  const char *tls[] = {"--etcd-endpoints", fx.endpoints, "--etcd-cacert", ca, "--etcd-cert", cert,
                       "--etcd-key", key, NULL};
  hd n1, n2, bad;
  assert_true(hd_start(&n1, "t1", 1, NULL, NULL, tls));
  assert_true(hd_start(&n2, "t2", 1, NULL, NULL, tls));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char id[64];
  submit(&n2, 10, 2, 2, id, sizeof id);
  Mega__V1__Job *j = wait_end(&n1, id, 60000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* no client certificate: etcd closes the handshake, and megad says so */
  const char *nocert[] = {"--etcd-endpoints", fx.endpoints, "--etcd-cacert", ca, NULL};
  assert_false(hd_start(&bad, "t3", 1, NULL, NULL, nocert));
  assert_true(hd_log_has(&bad, "if etcd runs with --client-cert-auth, give --etcd-cert"));
  hd_cleanup(&bad);
  /* plaintext towards a TLS etcd is refused before anything is sent */
  const char *plain[] = {"--etcd-endpoints", fx.endpoints, NULL};
  assert_false(hd_start(&bad, "t4", 1, NULL, NULL, plain));
  assert_true(hd_log_has(&bad, "give --etcd-cacert FILE"));
  hd_cleanup(&bad);
  hd_cleanup_all();
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  chmod(path, 0600);
}

/* One etcd member with authentication on: root (password rootpw) and mega
 * (megapw, in the file pw names), whose role megarole may use mega/p/ only. */
static void start_with_auth(char *pw, size_t len) {
  assert_true(etcd_fx_start(&fx, 1));
  assert_int_equal(etcd_fx_ctl(&fx, "user add root --new-user-password=rootpw "
                                    "--interactive=false"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "user add mega --new-user-password=megapw "
                                    "--interactive=false"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "role add megarole"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "role grant-permission megarole --prefix=true readwrite "
                                    "mega/p/"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "user grant-role mega megarole"), 0);
  assert_int_equal(etcd_fx_ctl(&fx, "auth enable"), 0);
  snprintf(pw, len, "%s/pw", fx.dir);
  write_file(pw, "megapw\n");
}

static void test_user_and_password(void **state) {
  (void)state;
  char pw[128], wrong[128];
  start_with_auth(pw, sizeof pw);
  snprintf(wrong, sizeof wrong, "%s/wrong", fx.dir);
  write_file(wrong, "nope\n");
  const char *ok[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", "mega/p/",
                      "--etcd-user", "mega", "--etcd-password-file", pw, NULL};
  hd n1, n2, bad;
  assert_true(hd_start(&n1, "u1", 1, NULL, NULL, ok));
  assert_true(hd_start(&n2, "u2", 1, NULL, NULL, ok));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char id[64];
  submit(&n1, 10, 2, 2, id, sizeof id);
  Mega__V1__Job *j = wait_end(&n2, id, 60000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  protobuf_c_message_free_unpacked(&j->base, NULL);

  const char *no_user[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", "mega/p/", NULL};
  assert_false(hd_start(&bad, "u3", 1, NULL, NULL, no_user));
  assert_true(hd_log_has(&bad, "etcd has authentication on: give --etcd-user"));
  hd_cleanup(&bad);
  const char *bad_pw[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", "mega/p/",
                          "--etcd-user", "mega", "--etcd-password-file", wrong, NULL};
  assert_false(hd_start(&bad, "u4", 1, NULL, NULL, bad_pw));
  assert_true(hd_log_has(&bad, "refused user mega: wrong name or password"));
  hd_cleanup(&bad);
  const char *other[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", "mega/q/",
                         "--etcd-user", "mega", "--etcd-password-file", pw, NULL};
  assert_false(hd_start(&bad, "u5", 1, NULL, NULL, other));
  assert_true(hd_log_has(&bad, "may not use mega/q/: grant its role readwrite"));
  hd_cleanup(&bad);

  /* a restarted member forgets its tokens: the megads authenticate again
   * and go on (a job submitted after it runs to the end) */
  setenv("ETCDCTL_USER", "root:rootpw", 1); /* the fixture's health check */
  assert_true(etcd_fx_restart(&fx, 0));
  unsetenv("ETCDCTL_USER");
  submit(&n2, 10, 2, 2, id, sizeof id);
  j = wait_end(&n1, id, 60000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* n2 wrote the job, so its token was refused first; n1 may not have
   * needed etcd yet while the short job ran, but does within seconds */
  assert_true(hd_log_has(&n2, "authenticated again as mega"));
  assert_true(hd_wait_log(&n1, "authenticated again as mega", 15000));
  hd_cleanup_all();
}

static bool lists_job(hd *d, const char *id) {
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(d->ch, &mega_control_list_jobs, &req.base, 5000, &resp, &err) != MEGA_OK)
    fail_msg("ListJobs on %s: %s", d->name, err.msg);
  Mega__V1__ListJobsResponse *r = (Mega__V1__ListJobsResponse *)resp;
  bool found = false;
  for (size_t i = 0; i < r->n_jobs; i++) found |= !strcmp(r->jobs[i]->id, id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return found;
}

/* etcd refuses a node what it allowed (its role lost the prefix) just when
 * its jobs' watch must be read again (a restarted member cancels the watch
 * of a token it no longer knows): the read is tried again until the role
 * has the prefix back, and the node follows the cluster's jobs from then
 * on (it lists a job another node ran after). Once, the failed read was
 * the last, and the node never again saw a job of the cluster. */
static void test_auth_revoked_then_restored(void **state) {
  (void)state;
  char pw[128];
  start_with_auth(pw, sizeof pw);
  const char *ok[] = {"--etcd-endpoints", fx.endpoints, "--etcd-prefix", "mega/p/",
                      "--etcd-user", "mega", "--etcd-password-file", pw, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "r1", 1, NULL, NULL, ok));
  assert_true(hd_start(&n2, "r2", 1, NULL, NULL, ok));
  assert_true(hd_wait_alive(&n2, 2, 10000));
  setenv("ETCDCTL_USER", "root:rootpw", 1);
  assert_int_equal(etcd_fx_ctl(&fx, "role revoke-permission megarole --prefix=true mega/p/"), 0);
  assert_true(etcd_fx_restart(&fx, 0));
  assert_true(hd_wait_log(&n2, "the mirror stays stale until it works", 10000));
  assert_int_equal(etcd_fx_ctl(&fx, "role grant-permission megarole --prefix=true readwrite "
                                    "mega/p/"), 0);
  unsetenv("ETCDCTL_USER");
  char id[64];
  submit(&n1, 5, 1, 1, id, sizeof id);
  bool seen = false;
  for (int i = 0; i < 50 && !seen; i++) {
    seen = lists_job(&n2, id);
    if (!seen) usleep(100 * 1000);
  }
  assert_true(seen);
  Mega__V1__Job *j = wait_end(&n1, id, 30000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup_all();
}

/* Prefixes that nest: a cluster at mega/t/ beside one at mega/t/nodes/ and
 * one at mega/t/j/, whose keys lie in the ranges the first one reads (its
 * node mega/t/nodes/nodes/b1, its job's record mega/t/j/j/<id>/0). The
 * first lists neither's node nor job, and a job of two nodes waits there
 * for a second node of its own; once, it listed node nodes/b1 and placed
 * the job on it, refused again and again. A node name with '/' is refused:
 * its key would be such a key. */
static void test_nested_prefixes(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 1));
  hd a1, b1, c1, bad;
  assert_true(start_at(&a1, "a1", "mega/t/"));
  assert_true(start_at(&b1, "b1", "mega/t/nodes/"));
  assert_true(start_at(&c1, "c1", "mega/t/j/"));
  char cid[64], aid[64];
  submit(&c1, 5, 1, 1, cid, sizeof cid);
  Mega__V1__Job *j = wait_end(&c1, cid, 30000);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(SUCCEEDED));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_int_equal(etcd_fx_ctl(&fx, "get --prefix mega/t/nodes/nodes/b1 --keys-only | grep -q ."), 0);
  assert_false(lists_node(&a1, "b1") || lists_node(&a1, "nodes/b1"));
  assert_false(lists_job(&a1, cid));
  submit(&a1, 5, 2, 2, aid, sizeof aid);
  usleep(1500 * 1000);
  j = hd_get_job(&a1, aid, NULL);
  assert_non_null(j);
  assert_int_equal(j->state, STATE(PENDING));
  assert_int_equal(j->n_placement, 0);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_false(start_at(&bad, "x/y", "mega/t/"));
  assert_true(hd_log_has(&bad, "a node of an etcd cluster has a name without '/'"));
  hd_cleanup_all();
}

/* The probes a kubelet uses (deploy/k8s): /healthz and /readyz answer
 * without the token that /metrics wants; /readyz says 503 and why while
 * etcd is away, and 200 again once it is back. */
static void test_probes(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 1));
  char dir[64], tok[128], maddr[64];
  hd_tmpdir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/token", dir);
  write_file(tok, "probe-test-token-0123456789abcdef\n");
  int port = hd_free_port();
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, "--token-file", tok,
                         "--metrics-listen", maddr, NULL};
  mega_rpc_auth auth = {.token = "probe-test-token-0123456789abcdef"};
  hd_set_auth(&auth);
  hd n1;
  assert_true(hd_start(&n1, "k1", 1, NULL, NULL, extra));
  char *p = hd_http_get(port, "/metrics", NULL);
  assert_non_null(strstr(p, " 401 "));
  free(p);
  p = hd_http_get(port, "/healthz", NULL);
  assert_non_null(strstr(p, " 200 "));
  assert_non_null(strstr(p, "\r\n\r\nok\n"));
  free(p);
  p = hd_http_get(port, "/readyz", NULL);
  assert_non_null(strstr(p, " 200 "));
  free(p);
  etcd_fx_kill(&fx, 0);
  bool unready = false;
  for (int i = 0; i < 100 && !unready; i++) {
    usleep(100 * 1000);
    p = hd_http_get(port, "/readyz", NULL);
    unready = strstr(p, " 503 ") && strstr(p, "etcd"); /* why: unreachable, or not durable */
    free(p);
  }
  assert_true(unready);
  p = hd_http_get(port, "/healthz", NULL);
  assert_non_null(strstr(p, " 200 ")); /* alive all the same */
  free(p);
  assert_true(etcd_fx_restart(&fx, 0));
  bool ready = false;
  for (int i = 0; i < 100 && !ready; i++) {
    usleep(100 * 1000);
    p = hd_http_get(port, "/readyz", NULL);
    ready = strstr(p, " 200 ") != NULL;
    free(p);
  }
  assert_true(ready);
  hd_set_auth(NULL);
  hd_cleanup_all();
  hd_rmdir(dir);
}

int main(int argc, char **argv) {
  etcd_fx_require();
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_two_clusters_share_one_etcd, teardown),
      cmocka_unit_test_teardown(test_tls_client_certificates, teardown),
      cmocka_unit_test_teardown(test_user_and_password, teardown),
      cmocka_unit_test_teardown(test_auth_revoked_then_restored, teardown),
      cmocka_unit_test_teardown(test_nested_prefixes, teardown),
      cmocka_unit_test_teardown(test_probes, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
