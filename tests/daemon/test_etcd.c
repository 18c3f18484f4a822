/* daemon/etcd: the client against real etcd members (etcd_fixture.h); skips
 * when etcd is not installed. KV and prefixes, create-if-absent and fenced
 * transactions, the session (its lease and what is put under it, ended by us
 * or revoked from outside), watches (order, replay, compaction), and in a
 * 3-member cluster: a watch that survives kill -9 of its member without
 * losing or repeating an event, calls and the session failing over, a member
 * without a quorum refusing to keep a watch (hasleader), and the client
 * saying so when no member is left. */
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

#include "daemon/etcd/etcd.h"
#include "etcd_fixture.h"

static etcd_fx one; /* a 1-member etcd for the group */

typedef struct env {
  uv_loop_t loop;
  uv_timer_t tick; /* wakes uv_run(ONCE) so waits can check the clock */
  megad_base b;
  megad_etcd *e;
  char dir[64];
} env;

static void on_tick(uv_timer_t *t) { (void)t; }

static void env_open(env *v, const char *endpoints) {
  memset(v, 0, sizeof *v);
  assert_int_equal(uv_loop_init(&v->loop), 0);
  uv_timer_init(&v->loop, &v->tick);
  uv_timer_start(&v->tick, on_tick, 10, 10);
  snprintf(v->dir, sizeof v->dir, "/tmp/etcd-test-state-XXXXXX");
  assert_non_null(mkdtemp(v->dir));
  mega_err err = {0};
  assert_int_equal(megad_base_init(&v->b, &v->loop, "t", v->dir, true, &err), MEGA_OK);
  assert_int_equal(megad_etcd_new(&v->b, endpoints, 2000, &v->e, &err), MEGA_OK);
}

static void cq_closed(void *arg) { *(bool *)arg = true; }

static void env_close(env *v) {
  megad_etcd_free(v->e);
  bool closed = false;
  megad_base_close_cq(&v->b, cq_closed, &closed);
  while (!closed) uv_run(&v->loop, UV_RUN_ONCE);
  megad_base_free(&v->b);
  uv_close((uv_handle_t *)&v->tick, NULL);
  uv_run(&v->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&v->loop), 0);
  megad_rmtree(v->dir);
}

/* Runs the loop until *flag or ms pass; whether *flag. */
static bool run_until(env *v, const bool *flag, int ms) {
  uint64_t end = uv_now(&v->loop) + (uint64_t)ms;
  while (!*flag && uv_now(&v->loop) < end) uv_run(&v->loop, UV_RUN_ONCE);
  return *flag;
}

static void run_for(env *v, int ms) {
  bool never = false;
  run_until(v, &never, ms);
}

/* ---- a call's answer, copied ---- */

typedef struct res {
  bool done;
  mega_err err;
  int64_t revision, lease, ttl;
  bool succeeded;
  size_t nkvs;
  struct {
    char key[64], value[64];
    int64_t create_revision, mod_revision, lease;
  } kv[8];
} res;

static void on_res(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  res *x = arg;
  x->done = true;
  x->err = *err;
  if (!r) return;
  x->revision = r->revision;
  x->succeeded = r->succeeded;
  x->lease = r->lease;
  x->ttl = r->ttl;
  x->nkvs = r->nkvs;
  for (size_t i = 0; i < r->nkvs && i < 8; i++) {
    snprintf(x->kv[i].key, sizeof x->kv[i].key, "%s", r->kvs[i].key);
    snprintf(x->kv[i].value, sizeof x->kv[i].value, "%.*s", (int)r->kvs[i].value_len,
             (const char *)r->kvs[i].value);
    x->kv[i].create_revision = r->kvs[i].create_revision;
    x->kv[i].mod_revision = r->kvs[i].mod_revision;
    x->kv[i].lease = r->kvs[i].lease;
  }
}

/* Waits for the answer; asserts it came and was OK. */
static void await_ok(env *v, res *x) {
  assert_true(run_until(v, &x->done, 10000));
  if (x->err.status != MEGA_OK) fprintf(stderr, "etcd call failed: %s\n", x->err.msg);
  assert_int_equal(x->err.status, MEGA_OK);
}

static res put(env *v, const char *key, const char *value, int64_t lease) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_put(v->e, key, value, strlen(value), lease, on_res, &x, &err),
                   MEGA_OK);
  await_ok(v, &x);
  return x;
}

static res get(env *v, const char *key, bool prefix) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_get(v->e, key, prefix, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

static res del(env *v, const char *key, bool prefix) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_delete(v->e, key, prefix, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

static res txn(env *v, const megad_etcd_cmp *c, size_t nc, const megad_etcd_op *t, size_t nt,
               const megad_etcd_op *o, size_t no) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_txn(v->e, c, nc, t, nt, o, no, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

/* ---- KV ---- */

static void test_put_get_prefix_delete(void **state) {
  (void)state;
  env v;
  env_open(&v, one.endpoints);
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
  env_open(&v, one.endpoints);
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
  env_open(&v, one.endpoints);
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

typedef struct sess {
  bool up, lost, unreachable, reachable_again;
  int64_t lease;
  char why[512];
} sess;

static void s_up(void *arg, int64_t lease) {
  sess *s = arg;
  s->up = true;
  s->lease = lease;
}

static void s_lost(void *arg, const char *why) {
  sess *s = arg;
  s->lost = true;
  snprintf(s->why, sizeof s->why, "%s", why);
}

static void s_reachable(void *arg, bool ok, const char *why) {
  sess *s = arg;
  if (ok) {
    s->reachable_again = s->unreachable;
  } else {
    s->unreachable = true;
    snprintf(s->why, sizeof s->why, "%s", why);
  }
}

static void session_up(env *v, sess *s) {
  memset(s, 0, sizeof *s);
  megad_etcd_session_cbs cbs = {s_up, s_lost, s_reachable, s};
  mega_err err = {0};
  assert_int_equal(megad_etcd_session_start(v->e, 2, &cbs, &err), MEGA_OK);
  assert_int_equal(megad_etcd_session_start(v->e, 2, &cbs, &err), MEGA_ERR_INVALID);
  assert_true(run_until(v, &s->up, 10000));
  assert_true(s->lease != 0);
  assert_int_equal(megad_etcd_session_lease(v->e), s->lease);
}

static void test_session_end_and_revoke(void **state) {
  (void)state;
  env v;
  env_open(&v, one.endpoints);
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
  assert_int_equal(etcd_fx_ctl(&one, cmd), 0);
  assert_true(run_until(&v, &s.lost, 5000));
  assert_non_null(strstr(s.why, "gone"));
  assert_int_equal(megad_etcd_session_lease(v.e), 0);
  assert_int_equal(get(&v, "nodes/b", false).nkvs, 0);
  session_up(&v, &s);
  env_close(&v);
}

/* ---- watches ---- */

typedef struct seen {
  int n;
  bool reset;
  char why[512];
  struct {
    megad_etcd_evtype type;
    char key[64], value[64];
    int64_t rev;
  } ev[64];
} seen;

static void w_event(void *arg, megad_etcd_evtype type, const megad_etcd_kv *kv) {
  seen *s = arg;
  if (s->n >= 64) return;
  s->ev[s->n].type = type;
  snprintf(s->ev[s->n].key, sizeof s->ev[s->n].key, "%s", kv->key);
  snprintf(s->ev[s->n].value, sizeof s->ev[s->n].value, "%.*s", (int)kv->value_len,
           (const char *)kv->value);
  s->ev[s->n].rev = kv->mod_revision;
  s->n++;
}

static void w_reset(void *arg, const char *why) {
  seen *s = arg;
  s->reset = true;
  snprintf(s->why, sizeof s->why, "%s", why);
}

static bool run_until_events(env *v, seen *s, int n, int ms) {
  uint64_t end = uv_now(&v->loop) + (uint64_t)ms;
  while (s->n < n && uv_now(&v->loop) < end) uv_run(&v->loop, UV_RUN_ONCE);
  return s->n >= n;
}

static megad_etcd_watch *watch(env *v, const char *prefix, int64_t from, seen *s) {
  memset(s, 0, sizeof *s);
  megad_etcd_watch_cbs cbs = {w_event, w_reset, s};
  megad_etcd_watch *w = NULL;
  mega_err err = {0};
  assert_int_equal(megad_etcd_watch_start(v->e, prefix, from, &cbs, &w, &err), MEGA_OK);
  return w;
}

static void test_watch_order_and_replay(void **state) {
  (void)state;
  env v;
  env_open(&v, one.endpoints);
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
  env_open(&v, one.endpoints);
  megad_etcd_free(v.e);
  megad_etcd_opts o = {.endpoints = one.endpoints, .prefix = "teams/r/"};
  mega_err err = {0};
  assert_int_equal(megad_etcd_open(&v.b, &o, &v.e, &err), MEGA_OK);
  seen s;
  memset(&s, 0, sizeof s);
  megad_etcd_watch_cbs cbs = {w_event, w_reset, &s};
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
  env_open(&v, one.endpoints);
  megad_etcd_free(v.e);
  megad_etcd_opts o = {.endpoints = one.endpoints, .prefix = "teams/a/"};
  mega_err err = {0};
  assert_int_equal(megad_etcd_open(&v.b, &o, &v.e, &err), MEGA_OK);
  env_open(&w2, one.endpoints);
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
  assert_int_equal(etcd_fx_ctl(&one, "get teams/a/p/x | grep -qx 1"), 0);
  assert_int_equal(etcd_fx_ctl(&one, "get teams/b/p/x | grep -qx 2"), 0);
  assert_int_equal(etcd_fx_ctl(&one, "get --prefix mega/p/ --keys-only | grep -q ."), 1);
  del(&v, "mega/p/", true);
  del(&w2, "mega/p/", true);
  env_close(&w2);
  env_close(&v);
}

static void test_watch_compacted_resets(void **state) {
  (void)state;
  env v;
  env_open(&v, one.endpoints);
  res p1 = put(&v, "wc/a", "1", 0);
  res p2 = put(&v, "wc/a", "2", 0);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "compaction %" PRId64, p2.revision);
  assert_int_equal(etcd_fx_ctl(&one, cmd), 0);
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
  env_open(&v, one.endpoints);
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
  assert_int_equal(etcd_fx_ctl(&one, cmd), 0);
  etcd_fx_kill(&one, 0); /* the stream breaks; it opens again once etcd is back */
  assert_true(etcd_fx_restart(&one, 0));
  put(&v, "wq/b", "2", 0);
  assert_true(run_until_events(&v, &s, 2, 15000));
  assert_false(s.reset);
  assert_string_equal(s.ev[1].key, "wq/b");
  megad_etcd_watch_cancel(w);
  env_close(&v);
}

/* ---- three members ---- */

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

/* A call in flight when the client is freed hears CANCELLED before free returns. */
static void test_free_cancels(void **state) {
  (void)state;
  env v;
  env_open(&v, one.endpoints);
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
  env_open(&v, one.endpoints);
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
  env_open(&v, one.endpoints);
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

static int group_setup(void **state) {
  (void)state;
  return etcd_fx_start(&one, 1) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  etcd_fx_stop(&one);
  return 0;
}

int main(void) {
  etcd_fx_require();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_get_prefix_delete),
      cmocka_unit_test(test_bad_endpoints),
      cmocka_unit_test(test_txn_create_if_absent),
      cmocka_unit_test(test_fenced_put),
      cmocka_unit_test(test_session_end_and_revoke),
      cmocka_unit_test(test_watch_order_and_replay),
      cmocka_unit_test(test_prefix_maps_keys),
      cmocka_unit_test(test_watch_range),
      cmocka_unit_test(test_watch_compacted_resets),
      cmocka_unit_test(test_quiet_watch_survives_compaction),
      cmocka_unit_test(test_free_cancels),
      cmocka_unit_test(test_free_with_watch_message_queued),
      cmocka_unit_test(test_free_refuses_new_calls),
      cmocka_unit_test(test_three_members_failover),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
