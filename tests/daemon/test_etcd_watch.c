/* daemon/etcd's watches against a real 1-member etcd (etcd_fixture.h);
 * skips when etcd is not installed: order and replay from a revision, a
 * range, a prefix mapping keys, a compacted revision resetting the watch,
 * and a quiet watch that lives through a compaction and its member's
 * restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "etcd_env.h"

static void test_watch_order_and_replay(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  seen s;
  megad_etcd_watch *w = watch(&v, "wo/", 0, &s);
  run_for(&v, 300); /* let etcd create it: "from now" means from then */
  res p1 = put(&v, "wo/a", "1", 0);
  put(&v, "wo/b", "2", 0);
  put(&v, "wx", "outside the prefix", 0);
  del(&v, "wo/a", false);
  assert_true(run_until_events(&v, &s, 3, 10000));
  run_for(&v, 200);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.ev[0].type, MEGAD_ETCD_EV_PUT);
  assert_string_equal(s.ev[0].key, "wo/a");
  assert_string_equal(s.ev[0].value, "1");
  assert_int_equal(s.ev[0].rev, p1.revision);
  assert_string_equal(s.ev[1].key, "wo/b");
  assert_int_equal(s.ev[2].type, MEGAD_ETCD_EV_DELETE);
  assert_string_equal(s.ev[2].key, "wo/a");
  assert_true(s.ev[2].rev > s.ev[1].rev && s.ev[1].rev > s.ev[0].rev);
  megad_etcd_watch_cancel(w);

  /* From a past revision: the same history again. */
  seen r;
  w = watch(&v, "wo/", p1.revision, &r);
  assert_true(run_until_events(&v, &r, 3, 10000));
  assert_int_equal(r.ev[0].rev, p1.revision);
  assert_int_equal(r.ev[2].type, MEGAD_ETCD_EV_DELETE);
  megad_etcd_watch_cancel(w);
  env_close(&v);
}

/* A watch of a key range: the keys in [key, end) and no others, both ends
 * mapped under --etcd-prefix (the jobs' watch of mega/c/ to mega/j/ that
 * leaves out mega/load/ and mega/nodes/). */
static void test_watch_range(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  megad_etcd_free(v.e);
  megad_etcd_opts o = {.endpoints = etcd_one.endpoints, .prefix = "teams/r/"};
  mega_err err = {0};
  assert_int_equal(megad_etcd_open(&v.b, &o, &v.e, &err), MEGA_OK);
  seen s;
  megad_etcd_watch_cbs cbs = seen_cbs(&s);
  megad_etcd_watch *w = NULL;
  assert_int_equal(megad_etcd_watch_range(v.e, "mega/j/", "mega/c/", 0, &cbs, &w, &err),
                   MEGA_ERR_INVALID); /* empty */
  assert_int_equal(megad_etcd_watch_range(v.e, "mega/c/", "mega/j0", 0, &cbs, &w, &err), MEGA_OK);
  run_for(&v, 300);
  put(&v, "mega/load/n1", "l", 0);
  put(&v, "mega/c/1", "n1", 0);
  put(&v, "mega/nodes/n1", "r", 0);
  put(&v, "mega/j/1/0", "rec", 0);
  put(&v, "mega/b", "before", 0);
  assert_true(run_until_events(&v, &s, 2, 10000));
  run_for(&v, 300);
  assert_int_equal(s.n, 2);
  assert_string_equal(s.ev[0].key, "mega/c/1");
  assert_string_equal(s.ev[1].key, "mega/j/1/0");
  megad_etcd_watch_cancel(w);
  env_close(&v);
}

/* --etcd-prefix: the layers' mega/ keys live under the prefix in etcd, and
 * come back as mega/ in replies, transactions and watch events; a client
 * with another prefix sees none of them. */
static void test_prefix_maps_keys(void **state) {
  (void)state;
  env v, w2;
  env_open(&v, etcd_one.endpoints);
  megad_etcd_free(v.e);
  megad_etcd_opts o = {.endpoints = etcd_one.endpoints, .prefix = "teams/a/"};
  mega_err err = {0};
  assert_int_equal(megad_etcd_open(&v.b, &o, &v.e, &err), MEGA_OK);
  env_open(&w2, etcd_one.endpoints);
  megad_etcd_free(w2.e);
  o.prefix = "teams/b/";
  assert_int_equal(megad_etcd_open(&w2.b, &o, &w2.e, &err), MEGA_OK);
  seen s;
  megad_etcd_watch *w = watch(&v, "mega/p/", 0, &s);
  run_for(&v, 300);
  put(&v, "mega/p/x", "1", 0);
  put(&w2, "mega/p/x", "2", 0); /* the other cluster's, same layer key */
  megad_etcd_cmp c = {.key = "mega/p/y", .target = MEGAD_ETCD_CREATE, .number = 0};
  megad_etcd_op t[2] = {{.kind = MEGAD_ETCD_PUT, .key = "mega/p/y", .value = "3", .value_len = 1},
                        {.kind = MEGAD_ETCD_GET, .key = "mega/p/", .prefix = true}};
  res x = txn(&v, &c, 1, t, 2, NULL, 0);
  assert_true(x.succeeded);
  assert_int_equal(x.nkvs, 2);
  assert_string_equal(x.kv[0].key, "mega/p/x");
  assert_string_equal(x.kv[0].value, "1");
  assert_string_equal(x.kv[1].key, "mega/p/y");
  res g = get(&w2, "mega/", true);
  assert_int_equal(g.nkvs, 1);
  assert_string_equal(g.kv[0].key, "mega/p/x");
  assert_string_equal(g.kv[0].value, "2");
  assert_true(run_until_events(&v, &s, 2, 10000));
  run_for(&v, 200);
  assert_int_equal(s.n, 2); /* not the other cluster's put */
  assert_string_equal(s.ev[0].key, "mega/p/x");
  assert_string_equal(s.ev[1].key, "mega/p/y");
  megad_etcd_watch_cancel(w);
  /* in etcd itself, under the prefixes */
  assert_int_equal(etcd_fx_ctl(&etcd_one, "get teams/a/p/x | grep -qx 1"), 0);
  assert_int_equal(etcd_fx_ctl(&etcd_one, "get teams/b/p/x | grep -qx 2"), 0);
  assert_int_equal(etcd_fx_ctl(&etcd_one, "get --prefix mega/p/ --keys-only | grep -q ."), 1);
  del(&v, "mega/p/", true);
  del(&w2, "mega/p/", true);
  env_close(&w2);
  env_close(&v);
}

static void test_watch_compacted_resets(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  res p1 = put(&v, "wc/a", "1", 0);
  res p2 = put(&v, "wc/a", "2", 0);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "compaction %" PRId64, p2.revision);
  assert_int_equal(etcd_fx_ctl(&etcd_one, cmd), 0);
  seen s;
  megad_etcd_watch *w = watch(&v, "wc/", p1.revision, &s);
  assert_true(run_until(&v, &s.reset, 10000));
  assert_non_null(strstr(s.why, "compacted"));
  assert_int_equal(s.n, 0);
  megad_etcd_watch_cancel(w);
  env_close(&v);
}

/* A watch whose keys stay quiet while others change: etcd's progress
 * notifications (the fixture's members send one every 300 ms) move its
 * revision on, so after a compaction of that history a broken stream
 * opens again where it was, with no reset and no whole read. Before, it
 * resumed at its last event's revision, long compacted. */
static void test_quiet_watch_survives_compaction(void **state) {
  (void)state;
  env v;
  env_open(&v, etcd_one.endpoints);
  seen s;
  megad_etcd_watch *w = watch(&v, "wq/", 0, &s);
  run_for(&v, 300);
  put(&v, "wq/a", "1", 0);
  assert_true(run_until_events(&v, &s, 1, 10000));
  res last = {0};
  for (int i = 0; i < 5; i++) last = put(&v, "wq-other", "noise", 0);
  run_for(&v, 1200); /* a few progress notifications */
  char cmd[64];
  snprintf(cmd, sizeof cmd, "compaction %" PRId64, last.revision);
  assert_int_equal(etcd_fx_ctl(&etcd_one, cmd), 0);
  etcd_fx_kill(&etcd_one, 0); /* the stream breaks; it opens again once etcd is back */
  assert_true(etcd_fx_restart(&etcd_one, 0));
  put(&v, "wq/b", "2", 0);
  assert_true(run_until_events(&v, &s, 2, 15000));
  assert_false(s.reset);
  assert_string_equal(s.ev[1].key, "wq/b");
  megad_etcd_watch_cancel(w);
  env_close(&v);
}

int main(void) {
  etcd_fx_require();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watch_order_and_replay),
      cmocka_unit_test(test_prefix_maps_keys),
      cmocka_unit_test(test_watch_range),
      cmocka_unit_test(test_watch_compacted_resets),
      cmocka_unit_test(test_quiet_watch_survives_compaction),
  };
  return cmocka_run_group_tests(tests, etcd_one_setup, etcd_one_teardown);
}
