/* Links planted in a checkpoint tree (core/nofollow.h): a latest file, a
 * shard, an iteration directory, a --save swapped for a link. Each is
 * refused with a message naming it, and nothing is read or written through
 * it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_cases.h"
#include "ckpt_util.h"
#include "tiny_model.h"
#include "worker/ckpt/checkpoint.h"

static void refused(const char *msg, const char *name) {
  if (!strstr(msg, name) || !strstr(msg, "symbolic link") || !strstr(msg, "plain files") ||
      strchr(msg, '\n'))
    fail_msg("not a refusal naming %s: %s", name, msg);
}

/* dir with complete checkpoints of iterations 2 and 4; out, a directory
 * beside it standing for what a link could point at. */
static void setup(char *dir, char *out, model *a, model *b) {
  tu_mkdtemp(dir, "links");
  tu_mkdtemp(out, "elsewhere");
  model_make(a, 1);
  model_make(b, 2);
  save_ok(a, dir, 2, 0);
  save_ok(b, dir, 4, 0);
}

static void teardown(char *dir, char *out, model *a, model *b) {
  model_free(a);
  model_free(b);
  tu_rmtree(dir);
  tu_rmtree(out);
}

static void test_latest_link(void **state) {
  (void)state;
  char dir[256], out[256], latest[600], secret[600];
  model a, b;
  setup(dir, out, &a, &b);
  snprintf(latest, sizeof latest, "%s/" MEGA_CKPT_LATEST_FILE, dir);
  snprintf(secret, sizeof secret, "%s/secret", out);
  tu_write_text(secret, "TOPSECRET-not-an-iteration\n");
  assert_int_equal(unlink(latest), 0);
  assert_int_equal(symlink(secret, latest), 0);
  char *path = NULL, *notice = NULL;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_INVALID);
  assert_null(path);
  assert_null(notice);
  refused(err.msg, MEGA_CKPT_LATEST_FILE);
  if (strstr(err.msg, "TOPSECRET")) fail_msg("echoes the file it refused: %s", err.msg);
  assert_true(mega_ckpt_present(dir)); /* a load is not silently skipped */
  teardown(dir, out, &a, &b);
}

static void test_shard_link(void **state) {
  (void)state;
  char dir[256], out[256], shard[700], copy[700], it4[600];
  model a, b;
  setup(dir, out, &a, &b);
  /* the same bytes, so only the link is wrong */
  snprintf(it4, sizeof it4, "%s/iter_0000004", dir);
  snprintf(shard, sizeof shard, "%s/model.safetensors", it4);
  snprintf(copy, sizeof copy, "%s/model.safetensors", out);
  assert_int_equal(rename(shard, copy), 0);
  assert_int_equal(symlink(copy, shard), 0);
  char *path = NULL, *notice = NULL;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_OK);
  char it2[600];
  snprintf(it2, sizeof it2, "%s/iter_0000002", dir);
  assert_string_equal(path, it2); /* the linked checkpoint is not taken */
  assert_non_null(notice);
  refused(notice, "model.safetensors");
  free(path);
  free(notice);
  /* loading that directory directly refuses the shard too */
  mega_ckpt_state s;
  assert_int_equal(mega_ckpt_load(it4, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err),
                   MEGA_ERR_INVALID);
  refused(err.msg, "model.safetensors");
  teardown(dir, out, &a, &b);
}

static void test_iteration_dir_link(void **state) {
  (void)state;
  char dir[256], out[256], it4[600], moved[600], it2[600], kept[700];
  model a, b;
  setup(dir, out, &a, &b);
  snprintf(it4, sizeof it4, "%s/iter_0000004", dir);
  snprintf(it2, sizeof it2, "%s/iter_0000002", dir);
  snprintf(moved, sizeof moved, "%s/iter_0000004", out);
  assert_int_equal(rename(it4, moved), 0);
  assert_int_equal(symlink(moved, it4), 0);
  tu_rmtree(it2); /* nothing to fall back to */
  char *path = NULL, *notice = NULL;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_INVALID);
  assert_null(path);
  refused(err.msg, "iter_0000004");
  /* a save of that iteration refuses to replace the link, and what it
   * points at is left whole */
  mega_ckpt_state s = state_at(4);
  assert_int_equal(mega_ckpt_save(dir, a.be, &a.cfg, NULL, &s, a.cp, a.n, NULL, &err),
                   MEGA_ERR_INVALID);
  refused(err.msg, "iter_0000004");
  snprintf(kept, sizeof kept, "%s/" MEGA_CKPT_MANIFEST_FILE, moved);
  assert_true(tu_exists(kept));
  assert_int_equal(mega_ckpt_verify(moved, 4, &err), MEGA_OK);
  teardown(dir, out, &a, &b);
}

static void test_save_dir_swapped(void **state) {
  (void)state;
  char dir[256], out[256], run[600], aside[600];
  model a, b;
  setup(dir, out, &a, &b);
  /* --save DIR/run, resolved at start; then run becomes a link */
  snprintf(run, sizeof run, "%s/run", dir);
  snprintf(aside, sizeof aside, "%s/run.aside", dir);
  mega_err err = {0};
  assert_int_equal(mega_ckpt_prepare_save(run, &err), MEGA_OK);
  assert_int_equal(rename(run, aside), 0);
  assert_int_equal(symlink(out, run), 0);
  mega_ckpt_state s = state_at(6);
  assert_int_equal(mega_ckpt_save(run, a.be, &a.cfg, NULL, &s, a.cp, a.n, NULL, &err),
                   MEGA_ERR_INVALID);
  refused(err.msg, run);
  /* nothing written through it */
  assert_int_equal(tu_count_prefix(out, "iter_"), 0);
  assert_int_equal(tu_count_prefix(out, ".tmp"), 0);
  assert_int_equal(tu_count_prefix(out, "latest"), 0);
  teardown(dir, out, &a, &b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_latest_link),
      cmocka_unit_test(test_shard_link),
      cmocka_unit_test(test_iteration_dir_link),
      cmocka_unit_test(test_save_dir_swapped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
