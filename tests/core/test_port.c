/* core/port: the one rule for a port after "HOST:". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/port.h"

static bool parse(const char *s, unsigned *out) { return mega_port_parse(s, strlen(s), out); }

static void test_ports_taken(void **state) {
  (void)state;
  unsigned p = 1;
  assert_true(parse("0", &p));
  assert_int_equal(p, 0);
  assert_true(parse("7070", &p));
  assert_int_equal(p, 7070);
  assert_true(parse("65535", &p));
  assert_int_equal(p, 65535);
  assert_true(parse("00080", &p)); /* five digits, leading zeros: still 80 */
  assert_int_equal(p, 80);
  /* only the n bytes given are read */
  assert_true(mega_port_parse("2379/x", 4, &p));
  assert_int_equal(p, 2379);
}

static void test_ports_refused(void **state) {
  (void)state;
  const char *bad[] = {"", "65536", "99999", "100000", "-1", "+80", " 80", "80 ", "7070x",
                       "0x10", "1e3", "000080"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    unsigned p = 4242;
    assert_false(parse(bad[i], &p));
    assert_int_equal(p, 4242); /* untouched */
  }
}

static void test_port_of_address(void **state) {
  (void)state;
  unsigned p = 0;
  assert_true(mega_port_of("127.0.0.1:7070", &p));
  assert_int_equal(p, 7070);
  assert_true(mega_port_of("[::1]:8080", &p));
  assert_int_equal(p, 8080);
  assert_false(mega_port_of("node1", &p));
  assert_false(mega_port_of("node1:", &p));
  assert_false(mega_port_of("[::1]", &p)); /* "1]" after the last colon */
  assert_false(mega_port_of(NULL, &p));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ports_taken),
      cmocka_unit_test(test_ports_refused),
      cmocka_unit_test(test_port_of_address),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
