/* Checkpoints that went wrong, through the public API: a crash mid-save
 * (temporaries ignored and cleaned, latest unchanged), damaged files,
 * missing and mismatched tensors, each a clear error, and the fallback to
 * the newest loadable save. */
#include <fcntl.h>
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
#include <jansson.h>

#include "ckpt_cases.h"
#include "ckpt_util.h"
#include "tiny_model.h"
#include "worker/backend/backend.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"
#include "worker/optim/optim.h"

static void test_atomicity(void **state) {
  (void)state;
  char dir[256], path[1024];
  tu_mkdtemp(dir, "ckpt");
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);
  mega_err err = {0};
  save_ok(&a, dir, 1, 0);

  /* A crash mid-save leaves a temp dir (and a temp latest file): ignored by
   * loads, removed by the cleanup. */
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s/.tmp.iter_0000002.AbCdEf", dir);
  assert_int_equal(mkdir(tmp, 0755), 0);
  snprintf(path, sizeof path, "%s/model.safetensors", tmp);
  tu_write_text(path, "half a file");
  snprintf(path, sizeof path, "%s/.tmp.latest_checkpointed_iteration.txt", dir);
  tu_write_text(path, "2\n");
  mega_ckpt_state s;
  assert_int_equal(load(&b, dir, &s, &err), MEGA_OK);
  assert_int_equal(s.iteration, 1);
  int removed = 0;
  assert_int_equal(mega_ckpt_clean_temps(dir, &removed, &err), MEGA_OK);
  assert_int_equal(removed, 2);
  assert_false(tu_exists(tmp));

  /* A save that fails part way (two tensors with one name) leaves nothing
   * behind and latest unchanged. */
  mega_ckpt_param dup[2] = {a.cp[0], a.cp[0]};
  mega_ckpt_state s2 = state_at(2);
  assert_int_not_equal(mega_ckpt_save(dir, a.be, &a.cfg, NULL, &s2, dup, 2, NULL, &err), MEGA_OK);
  assert_non_null(strstr(err.msg, "iteration 2"));
  snprintf(path, sizeof path, "%s/iter_0000002", dir);
  assert_false(tu_exists(path));
  assert_int_equal(tu_count_prefix(dir, ".tmp"), 0);
  char *resolved = NULL;
  assert_int_equal(mega_ckpt_resolve(dir, &resolved, NULL, &err), MEGA_OK);
  assert_non_null(strstr(resolved, "iter_0000001"));
  free(resolved);

  /* Saving the same iteration again replaces it whole. */
  save_ok(&b, dir, 1, 0);
  assert_int_equal(tu_count_prefix(dir, ".tmp"), 0);
  assert_int_equal(tu_count_prefix(dir, "iter_"), 1);
  model c;
  model_make(&c, 3);
  assert_int_equal(load(&c, dir, &s, &err), MEGA_OK);
  assert_same(&b, &c);
  model_free(&c);

  /* latest names the newest complete save */
  save_ok(&a, dir, 5, 0);
  snprintf(path, sizeof path, "%s/" MEGA_CKPT_LATEST_FILE, dir);
  FILE *f = fopen(path, "r");
  char line[32] = {0};
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_string_equal(line, "5\n");
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* Corrupts one file of a fresh checkpoint, then expects load to fail with
 * a message containing `needle`. */
typedef void (*corrupt_fn)(const char *iter_dir);

static void trunc_model(const char *d) {
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  FILE *f = fopen(p, "r+");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  assert_int_equal(truncate(p, n / 2), 0);
}

static void flip_header(const char *d) {
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  int fd = open(p, O_RDWR);
  char c;
  assert_int_equal(pread(fd, &c, 1, 8), 1);
  c ^= 0x5a; /* the JSON header's '{' */
  assert_int_equal(pwrite(fd, &c, 1, 8), 1);
  close(fd);
}

static void drop_optimizer(const char *d) {
  char p[512];
  snprintf(p, sizeof p, "%s/optimizer.safetensors", d);
  assert_int_equal(unlink(p), 0);
}

static void bad_state_json(const char *d) {
  char p[512];
  snprintf(p, sizeof p, "%s/trainer_state.json", d);
  tu_write_text(p, "{\"format\": \"mega-checkpoint\", \"version\": 1, \"iteration\": ");
}

static void check_corrupt(corrupt_fn fn, mega_status want, const char *needle) {
  char dir[256], it[512];
  tu_mkdtemp(dir, "ckpt");
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);
  save_ok(&a, dir, 2, 0);
  snprintf(it, sizeof it, "%s/iter_0000002", dir);
  fn(it);
  mega_err err = {0};
  mega_ckpt_state s;
  mega_status st = mega_ckpt_load(it, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err);
  if (st != want || !strstr(err.msg, needle))
    fail_msg("status %d (want %d), message: %s (want '%s')", st, want, err.msg, needle);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

static void test_corrupt_files(void **state) {
  (void)state;
  check_corrupt(trunc_model, MEGA_ERR_INVALID, "model.safetensors");
  check_corrupt(flip_header, MEGA_ERR_INVALID, "model.safetensors");
  check_corrupt(drop_optimizer, MEGA_ERR_NOT_FOUND, "optimizer.safetensors");
  check_corrupt(bad_state_json, MEGA_ERR_INVALID, "trainer_state.json");
}

static void test_missing_and_mismatched(void **state) {
  (void)state;
  char dir[256], it[512];
  mega_err err = {0};
  mega_ckpt_state s;
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);

  /* missing tensor: saved without the last one */
  tu_mkdtemp(dir, "ckpt");
  snprintf(it, sizeof it, "%s/iter_0000002", dir);
  mega_ckpt_state st2 = state_at(2);
  assert_int_equal(mega_ckpt_save(dir, a.be, &a.cfg, NULL, &st2, a.cp, a.n - 1, NULL, &err), MEGA_OK);
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "missing model tensor 'transformer.ln_f.bias'"));
  tu_rmtree(dir);

  /* shape mismatch: c_attn saved as [3C, C] instead of [C, 3C] */
  tu_mkdtemp(dir, "ckpt");
  snprintf(it, sizeof it, "%s/iter_0000002", dir);
  size_t k = 0;
  while (strcmp(a.cp[k].name, "transformer.h.0.attn.c_attn.weight")) k++;
  int64_t s0 = a.cp[k].shape[0];
  a.cp[k].shape[0] = a.cp[k].shape[1];
  a.cp[k].shape[1] = s0;
  assert_int_equal(mega_ckpt_save(dir, a.be, &a.cfg, NULL, &st2, a.cp, a.n, NULL, &err), MEGA_OK);
  a.cp[k].shape[1] = a.cp[k].shape[0];
  a.cp[k].shape[0] = s0;
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "transformer.h.0.attn.c_attn.weight")) fail_msg("%s", err.msg);
  tu_rmtree(dir);

  /* config mismatch */
  tu_mkdtemp(dir, "ckpt");
  snprintf(it, sizeof it, "%s/iter_0000002", dir);
  save_ok(&a, dir, 2, 0);
  mega_gpt_config other = b.cfg;
  other.num_layers = 3;
  assert_int_equal(mega_ckpt_load(it, b.be, &other, NULL, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "n_layer 2"));
  assert_non_null(strstr(err.msg, "--num-layers 3"));
  tu_rmtree(dir);

  /* job mismatch: the data order (--global-batch-size) differs */
  tu_mkdtemp(dir, "ckpt");
  snprintf(it, sizeof it, "%s/iter_0000002", dir);
  mega_jobspec j1, j2;
  mega_jobspec_defaults(&j1);
  j1.num_layers = 2;
  j1.hidden_size = 16;
  j1.num_attention_heads = 2;
  j1.seq_length = 8;
  j1.micro_batch_size = 2;
  j1.global_batch_size = 4;
  j1.train_iters = 10;
  j1.lr = 1e-3;
  mega_jobspec_defaults(&j2);
  assert_int_equal(mega_jobspec_copy(&j2, &j1, &err), MEGA_OK);
  j2.global_batch_size = 8;
  assert_int_equal(mega_ckpt_save(dir, a.be, &a.cfg, &j1, &st2, a.cp, a.n, NULL, &err), MEGA_OK);
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j1, b.cp, b.n, &s, &err), MEGA_OK);
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j2, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--global-batch-size 4"));
  /* the data order, and with Megatron's its seed */
  j2.global_batch_size = 4;
  j2.data_order = MEGA_DATA_ORDER_MEGATRON;
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j2, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--data-order file, but this job has megatron"));
  j2.data_order = MEGA_DATA_ORDER_FILE;
  j2.seed = 7; /* file order: the seed only made the initial weights */
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j2, b.cp, b.n, &s, &err), MEGA_OK);
  j1.data_order = j2.data_order = MEGA_DATA_ORDER_MEGATRON;
  assert_int_equal(mega_ckpt_save(dir, a.be, &a.cfg, &j1, &st2, a.cp, a.n, NULL, &err), MEGA_OK);
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j2, b.cp, b.n, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--seed 1234, but this job has 7"));
  j2.seed = 1234;
  assert_int_equal(mega_ckpt_load(it, b.be, &b.cfg, &j2, b.cp, b.n, &s, &err), MEGA_OK);
  j1.data_order = MEGA_DATA_ORDER_FILE;
  /* the LR schedule has its own check, which names Megatron's two ways out */
  mega_lr_sched saved = mega_lr_sched_from_job(&j1), mine = saved;
  assert_int_equal(mega_ckpt_check_sched(it, &saved, &mine, &j1, &err), MEGA_OK);
  mine.style = MEGA_LR_COSINE;
  assert_int_equal(mega_ckpt_check_sched(it, &saved, &mine, &j1, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--lr-decay-style linear, but this job has cosine"));
  assert_non_null(strstr(err.msg, "--override-opt_param-scheduler"));
  assert_non_null(strstr(err.msg, "--use-checkpoint-opt_param-scheduler"));
  mine = saved;
  mine.decay = 7 * 4; /* 7 iterations of 4 samples: the schedule counts samples */
  assert_int_equal(mega_ckpt_check_sched(it, &saved, &mine, &j1, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--lr-decay-iters 10, but this job has 7"));
  assert_int_equal(mega_ckpt_check_sched(it, &saved, &mine, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--lr-decay-samples 40, but this job has 28"));
  mega_jobspec_free(&j1);
  mega_jobspec_free(&j2);
  tu_rmtree(dir);

  model_free(&a);
  model_free(&b);
}

/* ---- completeness: the manifest, and falling back past a bad checkpoint ---- */

static void flip_last_byte(const char *d) {
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  int fd = open(p, O_RDWR);
  off_t end = lseek(fd, 0, SEEK_END);
  char c;
  assert_int_equal(pread(fd, &c, 1, end - 1), 1);
  c ^= 0x01; /* one bit of the last tensor's data: the header still parses */
  assert_int_equal(pwrite(fd, &c, 1, end - 1), 1);
  close(fd);
}

static void trunc_optimizer(const char *d) {
  char p[600];
  snprintf(p, sizeof p, "%s/optimizer.safetensors", d);
  struct stat sb;
  assert_int_equal(stat(p, &sb), 0);
  assert_int_equal(truncate(p, sb.st_size - 4), 0);
}

static void drop_manifest(const char *d) {
  char p[600];
  snprintf(p, sizeof p, "%s/manifest.json", d);
  assert_int_equal(unlink(p), 0);
}

static void drop_config(const char *d) {
  char p[600];
  snprintf(p, sizeof p, "%s/config.json", d);
  assert_int_equal(unlink(p), 0);
}

static void test_fallback(void **state) {
  (void)state;
  static const struct {
    corrupt_fn fn;
    const char *why;
  } cases[] = {
      {flip_last_byte, "model.safetensors has crc32"},
      {trunc_optimizer, "optimizer.safetensors is"},
      {drop_manifest, "has no manifest.json"},
      {drop_config, "config.json is missing"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char dir[256], it4[512], it2[512];
    tu_mkdtemp(dir, "ckpt");
    model a, b, x;
    model_make(&a, 1);
    model_make(&b, 2);
    model_make(&x, 3);
    save_ok(&a, dir, 2, 0);
    save_ok(&b, dir, 4, 0);
    snprintf(it2, sizeof it2, "%s/iter_0000002", dir);
    snprintf(it4, sizeof it4, "%s/iter_0000004", dir);
    mega_err err = {0};
    assert_int_equal(mega_ckpt_verify(it4, 4, &err), MEGA_OK);
    cases[c].fn(it4);
    assert_int_equal(mega_ckpt_verify(it4, 4, &err), MEGA_ERR_INVALID);
    if (!strstr(err.msg, cases[c].why)) fail_msg("verify: %s (want '%s')", err.msg, cases[c].why);

    /* latest names 4, which is incomplete: 2 loads, and the notice says why */
    char *path = NULL, *notice = NULL;
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_OK);
    assert_string_equal(path, it2);
    assert_non_null(notice);
    if (!strstr(notice, "iteration 4") || !strstr(notice, "incomplete") ||
        !strstr(notice, cases[c].why) || !strstr(notice, "loading iteration 2"))
      fail_msg("notice: %s", notice);
    /* only the optimizer's state is bad: the notice says the weights would load */
    if ((strstr(notice, "--no-load-optim") != NULL) != (cases[c].fn == trunc_optimizer))
      fail_msg("notice: %s", notice);
    mega_ckpt_state s;
    assert_int_equal(mega_ckpt_load(path, x.be, &x.cfg, NULL, x.cp, x.n, &s, &err), MEGA_OK);
    assert_same(&a, &x);
    assert_int_equal(s.iteration, 2);
    free(path);
    free(notice);

    /* a load of the weights alone takes 4 when only its optimizer state is
     * bad, and says so; any other damage falls back as above */
    bool optim_only = cases[c].fn == trunc_optimizer;
    assert_int_equal(mega_ckpt_resolve_weights(dir, &path, &notice, &err), MEGA_OK);
    assert_string_equal(path, optim_only ? it4 : it2);
    assert_non_null(notice);
    if (optim_only && !strstr(notice, "no usable optimizer state"))
      fail_msg("notice: %s", notice);
    if (optim_only) {
      mega_ckpt_param *w = calloc(x.n, sizeof *w);
      for (size_t i = 0; i < x.n; i++) {
        w[i] = x.cp[i];
        w[i].exp_avg = w[i].exp_avg_sq = NULL;
      }
      assert_int_equal(mega_ckpt_load(path, x.be, &x.cfg, NULL, w, x.n, &s, &err), MEGA_OK);
      assert_int_equal(s.iteration, 4);
      for (size_t i = 0; i < x.n; i++)
        assert_memory_equal(x.cp[i].param, b.cp[i].param, x.cp[i].numel * sizeof(float));
      free(w);
    }
    free(path);
    free(notice);

    /* without the latest file: the newest complete one, with the notice */
    char latest[600];
    snprintf(latest, sizeof latest, "%s/" MEGA_CKPT_LATEST_FILE, dir);
    assert_int_equal(unlink(latest), 0);
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_OK);
    assert_string_equal(path, it2);
    assert_non_null(notice);
    assert_non_null(strstr(notice, "iteration 4"));
    free(path);
    free(notice);

    /* and when none is complete, an error that says so */
    drop_manifest(it2);
    assert_true(mega_ckpt_present(dir)); /* only a look: the load finds them wanting */
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no complete checkpoint"));
    tu_write_text(latest, "4\n");
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_INVALID);
    if (!strstr(err.msg, "names iteration 4") || !strstr(err.msg, cases[c].why) ||
        !strstr(err.msg, "no other complete checkpoint"))
      fail_msg("%s", err.msg);
    assert_null(path);
    model_free(&a);
    model_free(&b);
    model_free(&x);
    tu_rmtree(dir);
  }
}

/* A fresh directory with complete checkpoints of iterations 2 (a) and 4 (b). */
static void two_saves(char *dir, model *a, model *b) {
  tu_mkdtemp(dir, "ckpt");
  model_make(a, 1);
  model_make(b, 2);
  save_ok(a, dir, 2, 0);
  save_ok(b, dir, 4, 0);
}

/* A latest file that names no iteration (emptied, edited) is passed over
 * like an incomplete checkpoint: the newest complete one loads, with a
 * one-line notice; with none, a one-line error. */
static void test_bad_latest(void **state) {
  (void)state;
  static const char *const texts[] = {"garbage\n", "", "-3\n", "4 5\n", "releases\n"};
  for (size_t c = 0; c < sizeof texts / sizeof texts[0]; c++) {
    char dir[256], it4[512], latest[600];
    model a, b;
    two_saves(dir, &a, &b);
    snprintf(it4, sizeof it4, "%s/iter_0000004", dir);
    snprintf(latest, sizeof latest, "%s/" MEGA_CKPT_LATEST_FILE, dir);
    tu_write_text(latest, texts[c]);
    char *path = NULL, *notice = NULL;
    mega_err err = {0};
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_OK);
    assert_string_equal(path, it4);
    assert_non_null(notice);
    if (!strstr(notice, "should hold one iteration number") ||
        !strstr(notice, "loading iteration 4") || strchr(notice, '\n'))
      fail_msg("notice: %s", notice);
    free(path);
    free(notice);

    drop_manifest(it4);
    snprintf(it4, sizeof it4, "%s/iter_0000002", dir);
    drop_manifest(it4);
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_INVALID);
    assert_null(path);
    if (!strstr(err.msg, "should hold one iteration number") ||
        !strstr(err.msg, "holds no complete checkpoint") || strchr(err.msg, '\n'))
      fail_msg("%s", err.msg);
    model_free(&a);
    model_free(&b);
    tu_rmtree(dir);
  }
}

/* A latest file that names a checkpoint mega cannot load, or that cannot be
 * read, is not passed over for an iter_* beside it: Megatron's "release"
 * means its release/ directory (the weights a --finetune run meant), and a
 * rank that could not read the file would load the newest complete iter_*
 * while the others load the one it names. */
static void test_latest_not_passed_over(void **state) {
  (void)state;
  char dir[256], latest[600];
  model a, b;
  two_saves(dir, &a, &b);
  snprintf(latest, sizeof latest, "%s/" MEGA_CKPT_LATEST_FILE, dir);
  static const char *const release[] = {"release\n", "release", "release \r\n"};
  for (size_t c = 0; c < sizeof release / sizeof release[0]; c++) {
    tu_write_text(latest, release[c]);
    char *path = NULL, *notice = NULL;
    mega_err err = {0};
    assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_UNSUPPORTED);
    assert_null(path);
    assert_null(notice);
    if (!strstr(err.msg, "'release'") || !strstr(err.msg, "cannot load") ||
        strchr(err.msg, '\n'))
      fail_msg("%s", err.msg);
  }
  /* unreadable: a directory where the file should be (as an I/O error) */
  assert_int_equal(unlink(latest), 0);
  assert_int_equal(mkdir(latest, 0755), 0);
  char *path = NULL, *notice = NULL;
  mega_err err = {0};
  assert_int_equal(mega_ckpt_resolve(dir, &path, &notice, &err), MEGA_ERR_IO);
  assert_null(path);
  if (!strstr(err.msg, "cannot read") || !strstr(err.msg, MEGA_CKPT_LATEST_FILE))
    fail_msg("%s", err.msg);
  assert_int_equal(rmdir(latest), 0);
  model_free(&a);
  model_free(&b);
  tu_rmtree(dir);
}

/* mega_ckpt_present: whether a rank may skip drawing its initial weights */
static void test_present(void **state) {
  (void)state;
  char dir[256], p[600];
  tu_mkdtemp(dir, "ckpt");
  assert_false(mega_ckpt_present(NULL));
  assert_false(mega_ckpt_present(dir));
  snprintf(p, sizeof p, "%s/nothing-here", dir);
  assert_false(mega_ckpt_present(p));
  snprintf(p, sizeof p, "%s/iter_notanumber", dir);
  assert_int_equal(mkdir(p, 0755), 0);
  assert_false(mega_ckpt_present(dir));
  snprintf(p, sizeof p, "%s/iter_0000010", dir);
  assert_int_equal(mkdir(p, 0755), 0);
  assert_true(mega_ckpt_present(dir));
  model a;
  model_make(&a, 1);
  char other[256];
  tu_mkdtemp(other, "ckpt");
  save_ok(&a, other, 2, 0); /* latest and iter_0000002 */
  assert_true(mega_ckpt_present(other));
  snprintf(p, sizeof p, "%s/iter_0000002", other);
  assert_true(mega_ckpt_present(p)); /* --load naming a checkpoint itself */
  model_free(&a);
  tu_rmtree(other);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_atomicity),
      cmocka_unit_test(test_corrupt_files),
      cmocka_unit_test(test_missing_and_mismatched),
      cmocka_unit_test(test_fallback),
      cmocka_unit_test(test_bad_latest),
      cmocka_unit_test(test_latest_not_passed_over),
      cmocka_unit_test(test_present),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
