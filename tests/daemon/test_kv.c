#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "daemon/model/kv.h"

typedef struct answer_log {
  int calls;
  mega_status status;
  char value[64];
} answer_log;

static void record(void *ctx, mega_status s, const uint8_t *val, size_t len) {
  answer_log *a = ctx;
  a->calls++;
  a->status = s;
  a->value[0] = '\0';
  if (val && len < sizeof a->value) {
    memcpy(a->value, val, len);
    a->value[len] = '\0';
  }
}

static void set_str(mega_kv *kv, const char *k, const char *v) {
  mega_err err = {0};
  assert_int_equal(mega_kv_set(kv, k, v, strlen(v), &err), MEGA_OK);
}

static void set_then_get(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  set_str(kv, "job/1/rank0", "127.0.0.1:4000");
  set_str(kv, "job/1/rank0", "127.0.0.1:4001");
  const uint8_t *v;
  size_t n;
  assert_true(mega_kv_get(kv, "job/1/rank0", &v, &n));
  assert_int_equal(n, 14);
  assert_memory_equal(v, "127.0.0.1:4001", n);
  assert_false(mega_kv_get(kv, "job/1/rank1", &v, &n));
  assert_int_equal(mega_kv_size(kv), 1);
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void wait_is_answered_by_a_later_set(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  answer_log a = {0}, b = {0};
  assert_int_not_equal(mega_kv_wait(kv, "k", 5000, record, &a), 0);
  assert_int_not_equal(mega_kv_wait(kv, "k", 0, record, &b), 0);
  assert_int_equal(mega_kv_pending(kv), 2);
  set_str(kv, "other", "x");
  assert_int_equal(a.calls, 0);
  set_str(kv, "k", "hello");
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.status, MEGA_OK);
  assert_string_equal(a.value, "hello");
  assert_int_equal(b.calls, 1);
  assert_int_equal(mega_kv_pending(kv), 0);
  uv_run(&loop, UV_RUN_DEFAULT); /* the answered wait's timer closes; nothing fires again */
  assert_int_equal(a.calls, 1);
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void wait_on_present_key_answers_at_once(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  set_str(kv, "k", "v");
  answer_log a = {0};
  assert_int_equal(mega_kv_wait(kv, "k", 10, record, &a), 0);
  assert_int_equal(a.calls, 1);
  assert_string_equal(a.value, "v");
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

static void wait_times_out(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  answer_log a = {0};
  mega_kv_wait(kv, "never", 20, record, &a);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(a.calls, 1);
  assert_int_equal(a.status, MEGA_ERR_TIMEOUT);
  assert_int_equal(mega_kv_pending(kv), 0);
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void cancel_and_delete_prefix_cancel_waits(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  answer_log a = {0}, b = {0}, c = {0};
  uint64_t id = mega_kv_wait(kv, "job/1/x", 5000, record, &a);
  mega_kv_wait(kv, "job/2/y", 5000, record, &b);
  mega_kv_wait(kv, "job/3/z", 5000, record, &c);
  set_str(kv, "job/2/kept-no", "1");
  set_str(kv, "job/3/kept", "1");
  mega_kv_cancel(kv, id);
  mega_kv_cancel(kv, 12345);
  assert_int_equal(a.status, MEGA_ERR_CANCELLED);
  mega_kv_delete_prefix(kv, "job/2/");
  assert_int_equal(b.calls, 1);
  assert_int_equal(b.status, MEGA_ERR_CANCELLED);
  assert_int_equal(c.calls, 0);
  assert_int_equal(mega_kv_size(kv), 1);
  mega_kv_free(kv); /* answers c */
  assert_int_equal(c.status, MEGA_ERR_CANCELLED);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

typedef struct chain {
  mega_kv *kv;
  int calls;
} chain;

/* A waiter that sets another key from its callback, as a forwarding daemon
 * might: the store must stay consistent. */
static void set_next(void *ctx, mega_status s, const uint8_t *val, size_t len) {
  (void)val;
  (void)len;
  chain *c = ctx;
  c->calls++;
  assert_int_equal(s, MEGA_OK);
  mega_err err = {0};
  mega_kv_set(c->kv, "b", "2", 1, &err);
  mega_kv_delete_prefix(c->kv, "a");
}

static void callbacks_may_reenter(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  chain ch = {kv, 0};
  answer_log b = {0};
  mega_kv_wait(kv, "a", 1000, set_next, &ch);
  mega_kv_wait(kv, "b", 1000, record, &b);
  set_str(kv, "a", "1");
  assert_int_equal(ch.calls, 1);
  assert_int_equal(b.calls, 1);
  assert_string_equal(b.value, "2");
  const uint8_t *v;
  size_t n;
  assert_false(mega_kv_get(kv, "a", &v, &n));
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void empty_values_are_values(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  mega_kv *kv = mega_kv_new(&loop);
  answer_log a = {0};
  mega_kv_wait(kv, "flag", 1000, record, &a);
  mega_err err = {0};
  assert_int_equal(mega_kv_set(kv, "flag", NULL, 0, &err), MEGA_OK);
  assert_int_equal(a.status, MEGA_OK);
  assert_string_equal(a.value, "");
  mega_kv_free(kv);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(set_then_get),
      cmocka_unit_test(wait_is_answered_by_a_later_set),
      cmocka_unit_test(wait_on_present_key_answers_at_once),
      cmocka_unit_test(wait_times_out),
      cmocka_unit_test(cancel_and_delete_prefix_cancel_waits),
      cmocka_unit_test(callbacks_may_reenter),
      cmocka_unit_test(empty_values_are_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
