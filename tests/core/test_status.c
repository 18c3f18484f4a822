#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/status.h"

static void fail_records_message_and_status(void **state) {
  (void)state;
  mega_err err = {0};
  mega_status s = mega_fail(&err, MEGA_ERR_INVALID, "world size %d is not divisible by %d", 6, 4);
  assert_int_equal(s, MEGA_ERR_INVALID);
  assert_int_equal(err.status, MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "world size 6 is not divisible by 4");
}

static void fail_accepts_null_err(void **state) {
  (void)state;
  assert_int_equal(mega_fail(NULL, MEGA_ERR_IO, "ignored"), MEGA_ERR_IO);
}

static void prefix_adds_context(void **state) {
  (void)state;
  mega_err err = {0};
  mega_fail(&err, MEGA_ERR_INVALID, "unknown letter 'x'");
  mega_err_prefix(&err, "layout at column %d", 3);
  assert_string_equal(err.msg, "layout at column 3: unknown letter 'x'");
}

static void long_messages_are_truncated_not_overflowed(void **state) {
  (void)state;
  mega_err err = {0};
  char big[2 * MEGA_ERR_MSG_MAX];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  mega_fail(&err, MEGA_ERR_INVALID, "%s", big);
  assert_int_equal(strlen(err.msg), MEGA_ERR_MSG_MAX - 1);
  mega_err_prefix(&err, "context");
  assert_int_equal(strlen(err.msg), MEGA_ERR_MSG_MAX - 1);
}

static void every_status_has_a_name(void **state) {
  (void)state;
  for (int s = MEGA_OK; s <= MEGA_ERR_INTERNAL; s++)
    assert_string_not_equal(mega_status_str((mega_status)s), "unknown status");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fail_records_message_and_status),
      cmocka_unit_test(fail_accepts_null_err),
      cmocka_unit_test(prefix_adds_context),
      cmocka_unit_test(long_messages_are_truncated_not_overflowed),
      cmocka_unit_test(every_status_has_a_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
