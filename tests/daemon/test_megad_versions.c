/* Nodes of different builds of mega in one cluster (a rolling upgrade):
 * what a node of this build does with calls an older or newer one makes.
 * No older build is built here: each case makes the other build's bytes by
 * hand (a LaunchRanks without the newer fields, a Join that names another
 * version). Each case runs as a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A flag the node cannot parse (one a newer coordinator's build knows):
 * the refusal names the flag and what the parser said, not an empty
 * reason. */
static void test_unparsed_flag_is_named(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "v1", 1, NULL, NULL, NULL));
  const char *newer[] = {"--a-flag-from-a-newer-mega", NULL};
  mega_err err = {0};
  assert_int_not_equal(hd_launch_by_hand(&d, "j-1-v1", newer, &err), MEGA_OK);
  printf("refusal: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--a-flag-from-a-newer-mega"));
  assert_null(strstr(err.msg, "flags: node")); /* its prefix once */
  assert_int_equal(hd_workers(&d, NULL, 0), 0);
  hd_cleanup(&d);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_unparsed_flag_is_named, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
