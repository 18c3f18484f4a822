/* core/utf8: RFC 3629 as jansson checks it, and the repair for display. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/utf8.h"

static void test_valid(void **state) {
  (void)state;
  const char *good[] = {"", "ascii", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                        "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
  const char *bad[] = {"\x80", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80",
                       "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xc3", "a\xe2\x82", "\xff"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    assert_true(mega_utf8_valid(good[i]));
    json_t *j = json_string(good[i]); /* jansson agrees */
    assert_non_null(j);
    json_decref(j);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_false(mega_utf8_valid(bad[i]));
    assert_null(json_string(bad[i]));
    char *fixed = mega_utf8_sanitize(bad[i]);
    assert_true(mega_utf8_valid(fixed));
    assert_non_null(strstr(fixed, "\xef\xbf\xbd"));
    free(fixed);
  }
  char *same = mega_utf8_sanitize("caf\xc3\xa9");
  assert_string_equal(same, "caf\xc3\xa9");
  free(same);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_valid)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
