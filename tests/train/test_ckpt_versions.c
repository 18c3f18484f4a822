/* Checkpoints of another build of mega (an upgrade, or a downgrade after
 * one): the files say which build wrote them, and one this build cannot
 * read is refused naming it, never passed over or guessed at. The other
 * build's files are made here by editing this build's, as it would have
 * written them (the manifest's sums kept right). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt_cases.h"
#include "ckpt_util.h"
#include "core/jobspec.h"
#include "core/version.h"
#include "worker/ckpt/checkpoint.h"

#define FUTURE "9.9.9+0123456789ab"

static json_t *read_json(const char *ckpt, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", ckpt, name);
  json_error_t jerr;
  json_t *j = json_load_file(path, 0, &jerr);
  if (!j) fail_msg("%s: %s", path, jerr.text);
  return j;
}

/* Sets key to value (stolen) in ckpt's file name, in its object sub (NULL:
 * the top), and the manifest's size and crc32 of that file to match, as
 * the build that wrote it would have. */
static void set_key(const char *ckpt, const char *name, const char *sub, const char *key,
                    json_t *value) {
  json_t *j = read_json(ckpt, name);
  json_t *obj = sub ? json_object_get(j, sub) : j;
  assert_non_null(obj);
  assert_int_equal(json_object_set_new(obj, key, value), 0);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", ckpt, name);
  assert_int_equal(json_dump_file(j, path, JSON_INDENT(2)), 0);
  json_decref(j);
  if (!strcmp(name, "manifest.json")) return;
  uint64_t size;
  uint32_t crc;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_file_sum(path, &size, &crc, &err), MEGA_OK);
  json_t *m = read_json(ckpt, "manifest.json");
  json_t *e = json_object_get(json_object_get(m, "files"), name);
  assert_non_null(e);
  json_object_set_new(e, "size", json_integer((json_int_t)size));
  json_object_set_new(e, "crc32", json_integer((json_int_t)crc));
  snprintf(path, sizeof path, "%s/manifest.json", ckpt);
  assert_int_equal(json_dump_file(m, path, JSON_INDENT(2)), 0);
  json_decref(m);
}

/* A scratch directory, two models (a saved, b loaded into) and the
 * directory of a's newest checkpoint when iters > 0 (saved at 1..iters). */
typedef struct fx {
  char dir[256], it[512];
  model a, b;
} fx;

static void fx_open(fx *f, int iters) {
  tu_mkdtemp(f->dir, "ckver");
  model_make(&f->a, 1);
  model_make(&f->b, 2);
  for (int i = 1; i <= iters; i++) save_ok(&f->a, f->dir, i, 0);
  snprintf(f->it, sizeof f->it, "%s/iter_%07d", f->dir, iters);
}

static void fx_close(fx *f) {
  model_free(&f->a);
  model_free(&f->b);
  tu_rmtree(f->dir);
}

/* Both of mega's JSON files name the build that wrote them. */
static void test_files_name_their_build(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1);
  const char *files[] = {"manifest.json", "trainer_state.json"};
  for (int i = 0; i < 2; i++) {
    json_t *j = read_json(f.it, files[i]);
    const char *v = json_string_value(json_object_get(j, "mega_version"));
    assert_non_null(v);
    assert_string_equal(v, mega_version());
    json_decref(j);
  }
  fx_close(&f);
}

/* A newer build's manifest (another version): the checkpoint is whole, so
 * the load stops there, naming that build, where it once passed over it
 * as incomplete and loaded the older one, whose iterations the next save
 * would write over the newer. */
static void test_newer_manifest_is_not_passed_over(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 2);
  set_key(f.it, "manifest.json", NULL, "version", json_integer(2));
  set_key(f.it, "manifest.json", NULL, "mega_version", json_string(FUTURE));
  mega_ckpt_state s;
  mega_err err = {0};
  assert_int_equal(load(&f.b, f.dir, &s, &err), MEGA_ERR_UNSUPPORTED);
  printf("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "iter_0000002 is of another format"));
  assert_non_null(strstr(err.msg, "version 2 (written by mega " FUTURE ")"));
  assert_non_null(strstr(err.msg, "reads version 1"));
  char *path = NULL, *notice = NULL;
  assert_int_equal(mega_ckpt_resolve_weights(f.dir, &path, &notice, &err),
                   MEGA_ERR_UNSUPPORTED);
  assert_null(path);
  /* named by --load itself, too */
  assert_int_equal(mega_ckpt_resolve(f.it, &path, &notice, &err), MEGA_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, FUTURE));
  fx_close(&f);
}

/* A job flag this build does not know (a newer build's, which may shape the
 * model or the data): refused naming the flag and both builds. */
static void test_unknown_job_flag_names_both_builds(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 0);
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  mega_ckpt_state s = state_at(1);
  mega_err err = {0};
  if (mega_ckpt_save(f.dir, f.a.be, &f.a.cfg, &job, &s, f.a.cp, f.a.n, NULL, &err) != MEGA_OK)
    fail_msg("save: %s", err.msg);
  snprintf(f.it, sizeof f.it, "%s/iter_0000001", f.dir);
  set_key(f.it, "trainer_state.json", "job", "a_flag_from_a_newer_mega", json_true());
  set_key(f.it, "trainer_state.json", NULL, "mega_version", json_string(FUTURE));
  assert_int_equal(mega_ckpt_load(f.it, f.b.be, &f.b.cfg, &job, f.b.cp, f.b.n, &s, &err),
                   MEGA_ERR_INVALID);
  printf("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "written by mega " FUTURE " with a job flag this megaw (mega "
                                  MEGA_VERSION ") does not know (\"a_flag_from_a_newer_mega\""));
  /* a build from before the files named theirs says so */
  set_key(f.it, "trainer_state.json", NULL, "mega_version", json_null());
  assert_int_equal(mega_ckpt_load(f.it, f.b.be, &f.b.cfg, &job, f.b.cp, f.b.n, &s, &err),
                   MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "a build of mega that does not name its version"));
  mega_jobspec_free(&job);
  fx_close(&f);
}

/* A newer build's trainer_state.json (another version): refused naming it. */
static void test_newer_state_names_its_build(void **state) {
  (void)state;
  fx f;
  fx_open(&f, 1);
  set_key(f.it, "trainer_state.json", NULL, "version", json_integer(3));
  set_key(f.it, "trainer_state.json", NULL, "mega_version", json_string(FUTURE));
  mega_ckpt_state s;
  mega_err err = {0};
  assert_int_equal(load(&f.b, f.dir, &s, &err), MEGA_ERR_UNSUPPORTED);
  printf("%s\n", err.msg);
  assert_non_null(strstr(err.msg, "trainer_state.json is version 3 (written by mega " FUTURE
                                  "), and this megaw (mega " MEGA_VERSION ") reads version 2"));
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_files_name_their_build),
      cmocka_unit_test(test_newer_manifest_is_not_passed_over),
      cmocka_unit_test(test_unknown_job_flag_names_both_builds),
      cmocka_unit_test(test_newer_state_names_its_build),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
