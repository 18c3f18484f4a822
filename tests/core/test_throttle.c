/* core/throttle: which address a peer string is, and that guesses from one
 * address over many connections (each its own port) share one hold-off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "core/throttle.h"

static const char *src(const char *peer) {
  static char buf[MEGA_THROTTLE_KEY_MAX];
  return mega_throttle_source(peer, buf, sizeof buf);
}

static void the_address_without_its_port(void **state) {
  (void)state;
  assert_string_equal(src("ipv4:10.0.0.5:4711"), "10.0.0.5");
  assert_string_equal(src("10.0.0.5"), "10.0.0.5"); /* the web view's */
  assert_string_equal(src("ipv6:[::1]:80"), "::1");
  assert_string_equal(src("::1"), "::1");
  assert_string_equal(src("fe80::1"), "fe80::1");
  assert_string_equal(src("unix:/run/megad.sock"), "unix");
  assert_string_equal(src(NULL), "");
  /* gRPC core (1.51, as grpcio's context.peer() shows) writes a URI */
  assert_string_equal(src("ipv6:%5B::1%5D:51150"), "::1");
  assert_string_equal(src("ipv6:%5Bfe80::1%25eth0%5D:7070"), "fe80::1%eth0");
  /* an IPv4 client of a dual-stack ([::]) listener, and the web view's form */
  assert_string_equal(src("ipv6:%5B::ffff:10.0.0.5%5D:4711"), "10.0.0.5");
  assert_string_equal(src("::ffff:10.0.0.5"), "10.0.0.5");
  assert_string_equal(src("::ffff:a00:5"), "::ffff:a00:5"); /* no dotted form: as it is */
}

/* Each fresh channel is a new port: the hold must follow the address. */
static void guesses_over_new_connections_are_held_off(void **state) {
  (void)state;
  mega_throttle *t = mega_throttle_new();
  assert_non_null(t);
  const char *fmt[] = {"ipv4:192.0.2.7:%d", "ipv6:%%5B2001:db8::7%%5D:%d",
                       "ipv6:%%5B::ffff:198.51.100.7%%5D:%d"};
  for (size_t f = 0; f < sizeof fmt / sizeof *fmt; f++) {
    int64_t now = 1000000 * (int64_t)(f + 1), hold = 0;
    char peer[96], key[MEGA_THROTTLE_KEY_MAX];
    for (int i = 0; i <= MEGA_THROTTLE_FREE; i++) {
      snprintf(peer, sizeof peer, fmt[f], 40000 + i);
      hold = mega_throttle_fail(t, mega_throttle_source(peer, key, sizeof key), now);
      if (i < MEGA_THROTTLE_FREE) assert_int_equal(hold, 0);
    }
    if (hold != MEGA_THROTTLE_FIRST_MS) fail_msg("%s: hold %lld", peer, (long long)hold);
    snprintf(peer, sizeof peer, fmt[f], 50000);
    assert_int_equal(mega_throttle_wait(t, mega_throttle_source(peer, key, sizeof key), now),
                     MEGA_THROTTLE_FIRST_MS);
  }
  mega_throttle_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_address_without_its_port),
      cmocka_unit_test(guesses_over_new_connections_are_held_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
