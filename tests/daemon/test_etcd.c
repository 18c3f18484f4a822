/* daemon/etcd: the client against a real 1-member etcd (etcd_fixture.h);
 * skips when etcd is not installed. KV and prefixes, create-if-absent and
 * fenced transactions, the session (its lease and what is put under it,
 * ended by us or revoked from outside), and freeing the client with calls
 * and a watch's message in flight. Watches are in test_etcd_watch.c, a
 * 3-member cluster's failover in test_etcd_failover.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "etcd_env.h"

/* ---- KV ---- */

static void test_put_get_prefix_delete(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  res p1 = put(&v, "kv/a", "1", 0);
  res p2 = put(&v, "kv/b", "2", 0);
  put(&v, "kv0", "not under kv/", 0);
  assert_true(p2.revision > p1.revision);
  res g = get(&v, "kv/", true);
  assert_int_equal(g.nkvs, 2);
  assert_string_equal(g.kv[0].key, "kv/a");
  assert_string_equal(g.kv[0].value, "1");
  assert_string_equal(g.kv[1].key, "kv/b");
  assert_int_equal(g.kv[1].mod_revision, p2.revision);
  g = get(&v, "kv/b", false);
  assert_int_equal(g.nkvs, 1);
  assert_string_equal(g.kv[0].value, "2");
  assert_int_equal(get(&v, "kv/nothing", false).nkvs, 0);

  megad_etcd_reply *r = NULL;
  mega_err err = {0};
  assert_int_equal(megad_etcd_get_sync(v.e, "kv/", true, &r, &err), MEGA_OK);
  assert_int_equal(r->nkvs, 2);
  assert_string_equal(r->kvs[1].key, "kv/b");
  assert_int_equal(r->revision, g.revision);
  megad_etcd_reply_free(r);

  res d = del(&v, "kv/", true);
  assert_true(d.revision > p2.revision);
  assert_int_equal(get(&v, "kv/", true).nkvs, 0);
  assert_int_equal(get(&v, "kv0", false).nkvs, 1);
  const char *why = NULL;
  assert_true(megad_etcd_ok(v.e, &why));
  assert_null(why);

  assert_int_equal(megad_etcd_put(v.e, "", "x", 1, 0, on_res, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "empty"));
  env_close(&v);
}

static void test_bad_endpoints(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  megad_base b = {.loop = &loop};
  megad_etcd *e = NULL;
  mega_err err = {0};
  assert_int_equal(megad_etcd_new(&b, "127.0.0.1", 0, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "not host:port"));
  assert_int_equal(megad_etcd_new(&b, "http://127.0.0.1:2379,,", 0, &e, &err), MEGA_ERR_INVALID);
  assert_int_equal(megad_etcd_new(&b, "https://127.0.0.1:2379", 0, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "give --etcd-cacert"));
  megad_etcd_opts o = {.endpoints = "http://127.0.0.1:2379", .cacert = "PEM"};
  assert_int_equal(megad_etcd_open(&b, &o, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "write https://"));
  o = (megad_etcd_opts){.endpoints = "127.0.0.1:2379", .prefix = "/abs/"};
  assert_int_equal(megad_etcd_open(&b, &o, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--etcd-prefix '/abs/'"));
  o.prefix = "noslash";
  assert_int_equal(megad_etcd_open(&b, &o, &e, &err), MEGA_ERR_INVALID);
  o = (megad_etcd_opts){.endpoints = "127.0.0.1:2379", .cert = "PEM", .key = "PEM"};
  assert_int_equal(megad_etcd_open(&b, &o, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "needs --etcd-cacert"));
  o = (megad_etcd_opts){.endpoints = "127.0.0.1:2379", .user = "u"};
  assert_int_equal(megad_etcd_open(&b, &o, &e, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "go together"));
  assert_int_equal(megad_etcd_new(&b, "", 0, &e, &err), MEGA_ERR_INVALID);
  assert_null(e);
  uv_loop_close(&loop);
}

/* Create-if-absent, as a coordinator election does it: the second asker
 * fails and learns the holder. */
static void test_txn_create_if_absent(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  const char *key = "elect/job-1";
  megad_etcd_cmp absent = {.key = key, .target = MEGAD_ETCD_CREATE, .number = 0};
  megad_etcd_op take1 = {.kind = MEGAD_ETCD_PUT, .key = key, .value = "node-a", .value_len = 6};
  megad_etcd_op take2 = {.kind = MEGAD_ETCD_PUT, .key = key, .value = "node-b", .value_len = 6};
  megad_etcd_op holder = {.kind = MEGAD_ETCD_GET, .key = key};
  res a = txn(&v, &absent, 1, &take1, 1, &holder, 1);
  assert_true(a.succeeded);
  res b = txn(&v, &absent, 1, &take2, 1, &holder, 1);
  assert_false(b.succeeded);
  assert_int_equal(b.nkvs, 1);
  assert_string_equal(b.kv[0].value, "node-a");
  assert_int_equal(b.kv[0].create_revision, a.revision);
  assert_string_equal(get(&v, key, false).kv[0].value, "node-a");
  env_close(&v);
}

/* A put fenced on the key's create revision: it holds while the key is the
 * same incarnation, and fails once someone deleted and made it again. */
static void test_fenced_put(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  const char *key = "fence/job-2";
  put(&v, key, "coord-a", 0);
  int64_t mine = get(&v, key, false).kv[0].create_revision;
  megad_etcd_cmp still = {.key = key, .target = MEGAD_ETCD_CREATE, .number = mine};
  megad_etcd_op rec = {.kind = MEGAD_ETCD_PUT, .key = "fence/job-2/state", .value = "running",
                       .value_len = 7};
  assert_true(txn(&v, &still, 1, &rec, 1, NULL, 0).succeeded);
  del(&v, key, false);
  put(&v, key, "coord-b", 0);
  megad_etcd_op stale = rec;
  stale.value = "stale";
  stale.value_len = 5;
  assert_false(txn(&v, &still, 1, &stale, 1, NULL, 0).succeeded);
  assert_string_equal(get(&v, "fence/job-2/state", false).kv[0].value, "running");
  /* the other targets: version, mod revision and value */
  megad_etcd_cmp ver = {.key = key, .target = MEGAD_ETCD_VERSION, .number = 1};
  megad_etcd_cmp val = {.key = key, .target = MEGAD_ETCD_VALUE, .result = MEGAD_ETCD_NOT_EQUAL,
                        .value = "coord-a", .value_len = 7};
  megad_etcd_cmp mod = {.key = key, .target = MEGAD_ETCD_MOD, .result = MEGAD_ETCD_GREATER,
                        .number = mine};
  megad_etcd_cmp all[] = {ver, val, mod};
  assert_true(txn(&v, all, 3, NULL, 0, NULL, 0).succeeded);
  all[1].result = MEGAD_ETCD_EQUAL;
  assert_false(txn(&v, all, 3, NULL, 0, NULL, 0).succeeded);
  env_close(&v);
}

/* ---- the session ---- */

static void test_session_end_and_revoke(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  sess s;
  session_up(&v, &s);
  put(&v, "nodes/a", "here", s.lease);
  res g = get(&v, "nodes/a", false);
  assert_int_equal(g.kv[0].lease, s.lease);
  run_for(&v, 3000); /* longer than the TTL: the keepalives hold it */
  assert_false(s.lost);
  assert_int_equal(get(&v, "nodes/a", false).nkvs, 1);
  megad_etcd_session_end(v.e);
  assert_int_equal(megad_etcd_session_lease(v.e), 0);
  assert_int_equal(get(&v, "nodes/a", false).nkvs, 0); /* gone at once, not after the TTL */

  /* Revoked from outside: the session is lost, and a new one can start. */
  session_up(&v, &s);
  put(&v, "nodes/b", "here", s.lease);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "lease revoke %" PRIx64, (uint64_t)s.lease);
  assert_int_equal(etcd_fx_ctl(&etcd_one, cmd), 0);
  assert_true(run_until(&v, &s.lost, 5000));
  assert_non_null(strstr(s.why, "gone"));
  assert_int_equal(megad_etcd_session_lease(v.e), 0);
  assert_int_equal(get(&v, "nodes/b", false).nkvs, 0);
  session_up(&v, &s);
  env_close(&v);
}

/* ---- freeing the client ---- */

/* A call in flight when the client is freed hears CANCELLED before free returns. */
static void test_free_cancels(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_get(v.e, "kv/", true, on_res, &x, &err), MEGA_OK);
  megad_etcd_free(v.e);
  assert_true(x.done);
  assert_int_equal(x.err.status, MEGA_ERR_CANCELLED);
  v.e = NULL;
  env_close(&v);
}

/* Waits up to 5 s, without running the loop, for the client's queue to hold
 * n completions. */
static bool wait_queued(env *v, size_t n) {
  for (int i = 0; i < 500 && mega_rpc_cq_queued(v->b.cq) < n; i++) usleep(10000);
  return mega_rpc_cq_queued(v->b.cq) >= n;
}

/* megad's stop frees the client and closes the queue at once: a watch's
 * message may then wait in the queue behind the cancel, with the stream's
 * end. Running it must start nothing on the shut-down queue (gRPC aborts). */
static void test_free_with_watch_message_queued(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  res p = put(&v, "fq/a", "1", 0);
  seen s;
  watch(&v, "fq/", p.revision, &s); /* created, then the put's event */
  assert_true(wait_queued(&v, 2));  /* the request sent, the first answer in */
  megad_etcd_free(v.e);             /* cancels the stream */
  v.e = NULL;
  assert_true(wait_queued(&v, 3)); /* and its end */
  env_close(&v);
  assert_int_equal(s.n, 0); /* nothing reaches a freed client's watch */
}

/* A callback run by megad_etcd_free cannot start another call on the
 * client being freed. */
typedef struct retry_ctx {
  megad_etcd *e;
  res x;
  mega_status again;
  mega_err err;
} retry_ctx;

static void retry_on_cancel(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  retry_ctx *c = arg;
  on_res(&c->x, r, err);
  c->again = megad_etcd_get(c->e, "kv/", true, on_res, &c->x, &c->err);
}

static void test_free_refuses_new_calls(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  retry_ctx c = {.e = v.e};
  mega_err err = {0};
  assert_int_equal(megad_etcd_get(v.e, "kv/", true, retry_on_cancel, &c, &err), MEGA_OK);
  megad_etcd_free(v.e);
  v.e = NULL;
  assert_int_equal(c.x.err.status, MEGA_ERR_CANCELLED);
  assert_int_equal(c.again, MEGA_ERR_CANCELLED);
  assert_non_null(strstr(c.err.msg, "closing"));
  env_close(&v);
}

int main(void) {
  etcd_fx_require();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_get_prefix_delete),
      cmocka_unit_test(test_bad_endpoints),
      cmocka_unit_test(test_txn_create_if_absent),
      cmocka_unit_test(test_fenced_put),
      cmocka_unit_test(test_session_end_and_revoke),
      cmocka_unit_test(test_free_cancels),
      cmocka_unit_test(test_free_with_watch_message_queued),
      cmocka_unit_test(test_free_refuses_new_calls),
  };
  return cmocka_run_group_tests(tests, etcd_one_setup, etcd_one_teardown);
}
