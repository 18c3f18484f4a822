/* core/duration: what people type in timeout flags. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/duration.h"

static unsigned ok(const char *s) {
  unsigned ms = 0;
  mega_err err = {0};
  assert_int_equal(mega_duration_parse("--t", s, 0, 86400000, &ms, &err), MEGA_OK);
  return ms;
}

static const char *bad(const char *s, unsigned min, unsigned max) {
  static mega_err err;
  unsigned ms = 77;
  memset(&err, 0, sizeof err);
  assert_int_equal(mega_duration_parse("--heartbeat-timeout", s, min, max, &ms, &err),
                   MEGA_ERR_INVALID);
  assert_int_equal(ms, 77); /* untouched */
  return err.msg;
}

static void units(void **state) {
  (void)state;
  assert_int_equal(ok("250ms"), 250);
  assert_int_equal(ok("1.5s"), 1500);
  assert_int_equal(ok("2m"), 120000);
  assert_int_equal(ok("1h"), 3600000);
  assert_int_equal(ok("0.0004s"), 0); /* rounds to whole ms */
  assert_int_equal(ok(".5s"), 500);
  assert_int_equal(ok("2.m"), 120000);
}

static void errors_say_how_to_write_it(void **state) {
  (void)state;
  assert_non_null(strstr(bad("250", 0, 1000), "write 250ms or 250s"));
  assert_non_null(strstr(bad("3 days", 0, 1000), "unknown unit"));
  assert_non_null(strstr(bad("fast", 0, 1000), "not a duration"));
  assert_non_null(strstr(bad("-1s", 0, 1000), "not a duration"));
  assert_non_null(strstr(bad("", 0, 1000), "needs a duration"));
  /* strtod's wider grammar is not a duration here. */
  assert_non_null(strstr(bad("0x10s", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad("+5s", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad("1e3ms", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad("infs", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad("1.2.3s", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad(".s", 0, 100000), "not a duration"));
  assert_non_null(strstr(bad("5s", 0, 1000), "out of range (0 ms to 1000 ms)"));
  assert_non_null(strstr(bad("5ms", 10, 1000), "out of range"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(units),
      cmocka_unit_test(errors_say_how_to_write_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
