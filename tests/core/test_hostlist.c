/* core/hostlist: Slurm's node lists, expanded as slurm-wlm 22.05's
 * `scontrol show hostnames` expands them (each expected list below is what
 * that scontrol printed for the same input on this machine). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/hostlist.h"

/* The expansion, space-separated. */
static const char *expand(const char *list) {
  static char buf[4096];
  char **v = NULL;
  size_t n = 0;
  mega_err err = {0};
  assert_int_equal(mega_hostlist_expand(list, &v, &n, &err), MEGA_OK);
  buf[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (i) strcat(buf, " ");
    strcat(buf, v[i]);
  }
  mega_hostlist_free(v, n);
  return buf;
}

static const char *refused(const char *list) {
  static mega_err err;
  memset(&err, 0, sizeof err);
  char **v = (char **)&err; /* must come back NULL */
  size_t n = 7;
  assert_int_equal(mega_hostlist_expand(list, &v, &n, &err), MEGA_ERR_INVALID);
  assert_null(v);
  assert_int_equal(n, 0);
  return err.msg;
}

static void as_scontrol_expands(void **state) {
  (void)state;
  assert_string_equal(expand("gpu[01-04,07],cpu3"), "gpu01 gpu02 gpu03 gpu04 gpu07 cpu3");
  assert_string_equal(expand("a[1-2]b[3-4]"), "a1b3 a1b4 a2b3 a2b4");
  assert_string_equal(expand("n[8-11]"), "n8 n9 n10 n11");
  assert_string_equal(expand("n[008-011]"), "n008 n009 n010 n011");
  assert_string_equal(expand("n[1-010]"), "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
  assert_string_equal(expand("n[010-12]"), "n010 n011 n012");
  assert_string_equal(expand("n[01-2]"), "n01 n02");
  assert_string_equal(expand("x[1-3],y"), "x1 x2 x3 y");
  assert_string_equal(expand("n[1-2],n1"), "n1 n2 n1"); /* as listed, repeats kept */
  assert_string_equal(expand("r1-n[1,3]"), "r1-n1 r1-n3");
  assert_string_equal(expand("h-1[1-2]"), "h-11 h-12");
  assert_string_equal(expand("n[1-2]-[3-4]"), "n1-3 n1-4 n2-3 n2-4");
  assert_string_equal(expand("a,b,,c"), "a b c");
  assert_string_equal(expand("n[1-1]"), "n1");
  assert_string_equal(expand("[1-2]"), "1 2");
  assert_string_equal(expand("n01,n[02-03]"), "n01 n02 n03");
  assert_string_equal(expand("vm"), "vm");
}

static void bad_lists_say_what(void **state) {
  (void)state;
  assert_non_null(strstr(refused("n[3-1]"), "'3-1' runs backwards"));
  assert_non_null(strstr(refused("n[a-b]"), "'a-b' is not a number"));
  assert_non_null(strstr(refused("n[1-2"), "leaves a bracket open"));
  assert_non_null(strstr(refused("n1-2]"), "never opened"));
  assert_non_null(strstr(refused("n[]"), "is not a number"));
  assert_non_null(strstr(refused(""), "names no host"));
  assert_non_null(strstr(refused(",,"), "names no host"));
  assert_non_null(strstr(refused("n[1-99999999]"), "more than 65536 hosts"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(as_scontrol_expands),
      cmocka_unit_test(bad_lists_say_what),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
