/* core/secret: what counts as the same token. (That the time does not
 * depend on the guess is the code's shape, not something a test can time.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "core/secret.h"

static bool eq(const char *sent, const char *want) {
  return mega_secret_equal(sent, strlen(sent), want, strlen(want));
}

static void equal_only_when_every_byte_and_the_length_agree(void **state) {
  (void)state;
  assert_true(eq("s3cret-token", "s3cret-token"));
  assert_false(eq("x3cret-token", "s3cret-token")); /* first byte */
  assert_false(eq("s3cret-tokex", "s3cret-token")); /* last byte */
  assert_false(eq("s3cret-toke", "s3cret-token"));  /* a prefix */
  assert_false(eq("s3cret-token ", "s3cret-token")); /* one more */
  assert_false(eq("", "s3cret-token"));
  assert_false(eq("s3cret-token", ""));
  assert_true(eq("", ""));
  assert_true(mega_secret_equal(NULL, 0, NULL, 0));
  assert_false(mega_secret_equal(NULL, 0, "a", 1));
  /* bytes, not strings: a NUL inside counts */
  assert_true(mega_secret_equal("a\0b", 3, "a\0b", 3));
  assert_false(mega_secret_equal("a\0c", 3, "a\0b", 3));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(equal_only_when_every_byte_and_the_length_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
