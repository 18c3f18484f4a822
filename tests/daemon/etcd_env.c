/* The etcd tests' shared pieces (etcd_env.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_env.h"

etcd_fx etcd_one;

static void on_tick(uv_timer_t *t) { (void)t; }

void env_open(env *v, const char *endpoints) {
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

void env_close(env *v) {
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

bool run_until(env *v, const bool *flag, int ms) {
  uint64_t end = uv_now(&v->loop) + (uint64_t)ms;
  while (!*flag && uv_now(&v->loop) < end) uv_run(&v->loop, UV_RUN_ONCE);
  return *flag;
}

void run_for(env *v, int ms) {
  bool never = false;
  run_until(v, &never, ms);
}

void on_res(void *arg, const megad_etcd_reply *r, const mega_err *err) {
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

void await_ok(env *v, res *x) {
  assert_true(run_until(v, &x->done, 10000));
  if (x->err.status != MEGA_OK) fprintf(stderr, "etcd call failed: %s\n", x->err.msg);
  assert_int_equal(x->err.status, MEGA_OK);
}

res put(env *v, const char *key, const char *value, int64_t lease) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_put(v->e, key, value, strlen(value), lease, on_res, &x, &err),
                   MEGA_OK);
  await_ok(v, &x);
  return x;
}

res get(env *v, const char *key, bool prefix) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_get(v->e, key, prefix, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

res del(env *v, const char *key, bool prefix) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_delete(v->e, key, prefix, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

res txn(env *v, const megad_etcd_cmp *c, size_t nc, const megad_etcd_op *t, size_t nt,
               const megad_etcd_op *o, size_t no) {
  res x = {0};
  mega_err err = {0};
  assert_int_equal(megad_etcd_txn(v->e, c, nc, t, nt, o, no, on_res, &x, &err), MEGA_OK);
  await_ok(v, &x);
  return x;
}

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

void session_up(env *v, sess *s) {
  memset(s, 0, sizeof *s);
  megad_etcd_session_cbs cbs = {s_up, s_lost, s_reachable, s};
  mega_err err = {0};
  assert_int_equal(megad_etcd_session_start(v->e, 2, &cbs, &err), MEGA_OK);
  assert_int_equal(megad_etcd_session_start(v->e, 2, &cbs, &err), MEGA_ERR_INVALID);
  assert_true(run_until(v, &s->up, 10000));
  assert_true(s->lease != 0);
  assert_int_equal(megad_etcd_session_lease(v->e), s->lease);
}

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

bool run_until_events(env *v, seen *s, int n, int ms) {
  uint64_t end = uv_now(&v->loop) + (uint64_t)ms;
  while (s->n < n && uv_now(&v->loop) < end) uv_run(&v->loop, UV_RUN_ONCE);
  return s->n >= n;
}

megad_etcd_watch_cbs seen_cbs(seen *s) {
  memset(s, 0, sizeof *s);
  return (megad_etcd_watch_cbs){w_event, w_reset, s};
}

megad_etcd_watch *watch(env *v, const char *prefix, int64_t from, seen *s) {
  megad_etcd_watch_cbs cbs = seen_cbs(s);
  megad_etcd_watch *w = NULL;
  mega_err err = {0};
  assert_int_equal(megad_etcd_watch_start(v->e, prefix, from, &cbs, &w, &err), MEGA_OK);
  return w;
}

int etcd_one_setup(void **state) {
  (void)state;
  return etcd_fx_start(&etcd_one, 1) ? 0 : -1;
}

int etcd_one_teardown(void **state) {
  (void)state;
  etcd_fx_stop(&etcd_one);
  return 0;
}
