/* The roots of what jobs touch (daemon/model/roots.h) against directories
 * others could change: megad refuses such a root at start, and a job whose
 * --save or --load goes through such a directory under a root; group
 * write, root's directories and a sticky /tmp above a root are fine. Real
 * directories under a fresh temporary one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/model/roots.h"

#define NOBODY 65534 /* another user, for the cases only root can set up */

static char top[64];

static int setup(void **state) {
  (void)state;
  snprintf(top, sizeof top, "/tmp/test_roots-XXXXXX");
  return mkdtemp(top) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
  return system(cmd) == 0 ? 0 : -1;
}

/* top/name made with mode (umask aside); its path in out. */
static void dir_at(char *out, size_t cap, const char *name, unsigned mode) {
  snprintf(out, cap, "%s/%s", top, name);
  assert_int_equal(mkdir(out, 0700), 0);
  assert_int_equal(chmod(out, mode), 0);
}

static mega_status init_save(const char *root, mega_err *err) {
  megad_roots r;
  const char *save[] = {root};
  mega_status s = megad_roots_init(&r, NULL, 0, save, 1, false, err);
  if (s == MEGA_OK) megad_roots_free(&r);
  return s;
}

static void test_root_others_may_write_is_refused_at_start(void **state) {
  (void)state;
  char p[128];
  mega_err err = {0};
  static const struct {
    const char *name;
    unsigned mode;
    const char *why; /* NULL: accepted */
  } cases[] = {
      {"open", 0777, "is a shared directory (mode 0777: anyone may write)"},
      {"sticky", 01777, "is a shared directory (mode 1777: sticky, like /tmp)"},
      {"team", 0775, NULL},
      {"teamsticky", 03770, NULL},
      {"own", 0700, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    dir_at(p, sizeof p, cases[i].name, cases[i].mode);
    mega_status s = init_save(p, &err);
    fprintf(stderr, "%04o: %s\n", cases[i].mode, s == MEGA_OK ? "accepted" : err.msg);
    if (!cases[i].why) {
      assert_int_equal(s, MEGA_OK);
      continue;
    }
    assert_int_equal(s, MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, "--save-root"));
    assert_non_null(strstr(err.msg, cases[i].why));
    assert_non_null(strstr(err.msg, "chmod o-w"));
  }
  /* a data root too, and a root whose parent anyone may write (they could
   * rename the root away and put a link in its place) */
  megad_roots r;
  dir_at(p, sizeof p, "data", 0777);
  const char *data[] = {p};
  assert_int_equal(megad_roots_init(&r, data, 1, NULL, 0, false, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--data-root"));
  char in[160];
  snprintf(in, sizeof in, "%s/open/in", top);
  assert_int_equal(mkdir(in, 0700), 0);
  assert_int_equal(init_save(in, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "under an open one: %s\n", err.msg);
  char want[160];
  snprintf(want, sizeof want, "%s/open is a shared directory", top);
  assert_non_null(strstr(err.msg, want));
  /* sticky above the root, like /tmp itself (top's parent): fine */
  snprintf(in, sizeof in, "%s/sticky/in", top);
  assert_int_equal(mkdir(in, 0700), 0);
  assert_int_equal(init_save(in, &err), MEGA_OK);

  if (geteuid() != 0) return; /* only root can hand a directory to another user */
  /* another user's root (NFS with root_squash shows root's own as nobody's):
   * taken, with a note megad logs at start */
  dir_at(p, sizeof p, "theirs", 0755);
  assert_int_equal(chown(p, NOBODY, NOBODY), 0);
  const char *save[] = {p};
  assert_int_equal(megad_roots_init(&r, NULL, 0, save, 1, false, &err), MEGA_OK);
  fprintf(stderr, "theirs: %s\n", r.note);
  assert_non_null(strstr(r.note, "belongs to uid 65534"));
  assert_non_null(strstr(r.note, "chown it"));
  megad_roots_free(&r);
  /* one of megad's own: no note */
  dir_at(p, sizeof p, "ours", 0755);
  assert_int_equal(megad_roots_init(&r, NULL, 0, save, 1, false, &err), MEGA_OK);
  assert_string_equal(r.note, "");
  megad_roots_free(&r);
}

static mega_status admit(const megad_roots *r, const char *save, const char *load,
                         mega_err *err) {
  mega_jobspec s;
  memset(&s, 0, sizeof s);
  s.save = (char *)save;
  s.load = (char *)load;
  return megad_roots_check(r, &s, err);
}

static void test_checkpoint_paths_others_may_write_are_refused(void **state) {
  (void)state;
  char root[128], p[256], q[192];
  mega_err err = {0};
  dir_at(root, sizeof root, "ckpt", 0755);
  megad_roots r;
  const char *save[] = {root};
  assert_int_equal(megad_roots_init(&r, NULL, 0, save, 1, false, &err), MEGA_OK);

  snprintf(p, sizeof p, "%s/new/run1", root); /* still to be made: fine */
  assert_int_equal(admit(&r, p, NULL, &err), MEGA_OK);

  /* a team directory others may write: anyone could make run1 first, as a
   * link, or swap the one made for a link; sticky does not stop the first */
  dir_at(q, sizeof q, "ckpt/team", 0777);
  snprintf(p, sizeof p, "%s/run1", q);
  assert_int_equal(admit(&r, p, NULL, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "--save under an open one: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "invalid job: --save"));
  assert_non_null(strstr(err.msg, "ckpt/team is a shared directory (mode 0777"));
  assert_int_equal(admit(&r, NULL, q, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "invalid job: --load"));
  assert_int_equal(chmod(q, 01777), 0);
  assert_int_equal(admit(&r, p, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "sticky, like /tmp"));
  /* group-writable (and group-sticky) team directories are the norm */
  assert_int_equal(chmod(q, 03770), 0);
  assert_int_equal(admit(&r, p, NULL, &err), MEGA_OK);
  assert_int_equal(admit(&r, NULL, q, &err), MEGA_OK);

  /* the root was fine at start and opened since: checked again */
  assert_int_equal(chmod(root, 0777), 0);
  assert_int_equal(admit(&r, NULL, q, &err), MEGA_ERR_INVALID);
  assert_int_equal(chmod(root, 0755), 0);

  if (geteuid() == 0) { /* a --load a teammate owns (not open to all): taken */
    assert_int_equal(chown(q, NOBODY, NOBODY), 0);
    assert_int_equal(admit(&r, NULL, q, &err), MEGA_OK);
  }
  megad_roots_free(&r);
}

static void test_data_cache_path_is_a_save_roots(void **state) {
  (void)state;
  char data[128], save[128], p[256];
  mega_err err = {0};
  dir_at(data, sizeof data, "cdata", 0755);
  dir_at(save, sizeof save, "csave", 0755);
  megad_roots r;
  const char *d[] = {data}, *s[] = {save};
  assert_int_equal(megad_roots_init(&r, d, 1, s, 1, false, &err), MEGA_OK);
  mega_jobspec spec;
  memset(&spec, 0, sizeof spec);
  snprintf(p, sizeof p, "%s/cache", save); /* still to be made: fine */
  spec.data_cache_path = p;
  assert_int_equal(megad_roots_check(&r, &spec, &err), MEGA_OK);
  /* jobs write the cache: not into the data roots, nor anywhere else */
  snprintf(p, sizeof p, "%s/cache", data);
  assert_int_equal(megad_roots_check(&r, &spec, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "cache in the data root: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--data-cache-path"));
  assert_non_null(strstr(err.msg, "outside this megad's --save-root"));
  spec.data_cache_path = "/etc/mega-cache";
  assert_int_equal(megad_roots_check(&r, &spec, &err), MEGA_ERR_INVALID);
  /* nor through a directory anyone may write */
  char q[192];
  dir_at(q, sizeof q, "csave/open", 0777);
  snprintf(p, sizeof p, "%s/cache", q);
  spec.data_cache_path = p;
  assert_int_equal(megad_roots_check(&r, &spec, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "is a shared directory"));
  megad_roots_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_root_others_may_write_is_refused_at_start),
      cmocka_unit_test(test_checkpoint_paths_others_may_write_are_refused),
      cmocka_unit_test(test_data_cache_path_is_a_save_roots),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
