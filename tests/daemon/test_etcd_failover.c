/* daemon/etcd in a real 3-member cluster (etcd_fixture.h); skips when etcd
 * is not installed: a watch that survives kill -9 of its member without
 * losing or repeating an event, calls and the session failing over, a
 * member without a quorum refusing to keep a watch (hasleader), and the
 * client saying so when no member is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "etcd_env.h"

static void put_retry(env *v, const char *key, const char *value) {
  for (int i = 0; i < 20; i++) { /* an election may be under way */
    res x = {0};
    mega_err err = {0};
    assert_int_equal(megad_etcd_put(v->e, key, value, strlen(value), 0, on_res, &x, &err),
                     MEGA_OK);
    assert_true(run_until(v, &x.done, 10000));
    if (x.err.status == MEGA_OK) return;
    run_for(v, 250);
  }
  fail_msg("could not put %s", key);
}

static void test_three_members_failover(void **state) {
  (void)state;
  etcd_fx three;
  assert_true(etcd_fx_start(&three, 3));
  env v;
  env_open(&v, three.endpoints); /* calls go to member 0 first */
  sess s;
  session_up(&v, &s);
  seen w;
  megad_etcd_watch *wh = watch(&v, "f/", 0, &w);
  run_for(&v, 300);
  char key[32];
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "f/%02d", i);
    put(&v, key, "before", 0);
  }
  assert_true(run_until_events(&v, &w, 10, 10000));

  /* The member the watch, the session and the calls were on dies. */
  etcd_fx_kill(&three, 0);
  assert_true(etcd_fx_wait(&three, 30000));
  res g = get(&v, "f/", true); /* fails over from the dead member: no error */
  assert_int_equal(g.nkvs, 10);
  for (int i = 10; i < 20; i++) {
    snprintf(key, sizeof key, "f/%02d", i);
    put_retry(&v, key, "after");
  }
  assert_true(run_until_events(&v, &w, 20, 15000));
  run_for(&v, 500);
  assert_int_equal(w.n, 20); /* nothing repeated */
  for (int i = 0; i < 20; i++) {
    snprintf(key, sizeof key, "f/%02d", i);
    assert_string_equal(w.ev[i].key, key); /* nothing lost, in order */
    if (i) assert_true(w.ev[i].rev > w.ev[i - 1].rev);
  }
  assert_false(w.reset);
  assert_false(s.lost); /* the lease lived through it */
  assert_int_equal(megad_etcd_session_lease(v.e), s.lease);
  assert_true(megad_etcd_ok(v.e, NULL));

  /* The member comes back; then the other two go, so it has no leader: it
   * ends the watch (we asked for a leader: hasleader), which cannot open
   * anywhere, and the client says so, instead of a watch that never fires. */
  assert_true(etcd_fx_restart(&three, 0));
  megad_etcd_session_end(v.e); /* only the watch talks to etcd now */
  assert_true(megad_etcd_ok(v.e, NULL));
  etcd_fx_kill(&three, 1);
  etcd_fx_kill(&three, 2);
  uint64_t end = uv_now(&v.loop) + 20000;
  while (megad_etcd_ok(v.e, NULL) && uv_now(&v.loop) < end) uv_run(&v.loop, UV_RUN_ONCE);
  const char *why = NULL;
  assert_false(megad_etcd_ok(v.e, &why));
  fprintf(stderr, "with no quorum: %s\n", why);
  /* A quorum again: the watch goes on where it was. */
  assert_true(etcd_fx_restart(&three, 1));
  put_retry(&v, "f/20", "quorum again");
  assert_true(run_until_events(&v, &w, 21, 15000));
  run_for(&v, 300);
  assert_int_equal(w.n, 21);
  assert_string_equal(w.ev[20].key, "f/20");
  assert_false(w.reset);

  /* Every member goes: the client says so. */
  session_up(&v, &s);
  for (int i = 0; i < 3; i++) etcd_fx_kill(&three, i);
  run_for(&v, 3000);
  assert_true(s.unreachable);
  assert_non_null(strstr(s.why, "etcd unreachable at 127.0.0.1:"));
  assert_false(megad_etcd_ok(v.e, &why));
  assert_non_null(strstr(why, "etcd unreachable"));
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_get(v.e, "f/", true, on_res, &x, &err), MEGA_OK);
  assert_true(run_until(&v, &x.done, 10000));
  assert_int_equal(x.err.status, MEGA_ERR_IO);
  megad_etcd_watch_cancel(wh);
  env_close(&v);
  etcd_fx_stop(&three);
}

int main(void) {
  etcd_fx_require();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_three_members_failover),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
