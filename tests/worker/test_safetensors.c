/* safetensors: a round trip, a GPT stage saved and loaded, and one clear
 * error (naming the file and tensor) for each kind of bad file. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "worker/model/safetensors.h"

static char dir[64];

static int make_dir(void **state) {
  (void)state;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/mega-st-XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
  return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static void path_of(char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/%s", dir, name);
}

static void round_trip(void **state) {
  (void)state;
  float a[6] = {1, -2, 3.5f, 4, 5, 6}, b[3] = {0.25f, NAN, -INFINITY}, c[1] = {42};
  mega_st_tensor ts[3] = {
      {.name = "a.weight", .ndim = 2, .shape = {2, 3}, .numel = 6, .data = a},
      {.name = "b", .ndim = 1, .shape = {3}, .numel = 3, .data = b},
      {.name = "scalar", .ndim = 0, .numel = 1, .data = c},
  };
  mega_st_meta meta[2] = {{"format", "pt"}, {"step", "17"}};
  char p[128];
  path_of(p, sizeof p, "rt.safetensors");
  mega_err err = {0};
  assert_int_equal(mega_st_write(p, ts, 3, meta, 2, &err), MEGA_OK);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  assert_int_equal(access(tmp, F_OK), -1); /* renamed into place */
  mega_st_file *f = NULL;
  if (mega_st_open(p, &f, &err) != MEGA_OK) fail_msg("%s", err.msg);
  assert_int_equal(mega_st_count(f), 3);
  assert_string_equal(mega_st_at(f, 0)->name, "a.weight");
  assert_string_equal(mega_st_meta_get(f, "step"), "17");
  assert_null(mega_st_meta_get(f, "absent"));
  assert_null(mega_st_find(f, "absent"));
  const mega_st_tensor *t = mega_st_find(f, "scalar");
  assert_int_equal(t->ndim, 0);
  assert_int_equal(t->numel, 1);
  float got[6];
  int64_t shape[2] = {2, 3};
  assert_int_equal(mega_st_read_f32(f, "a.weight", got, 6, shape, 2, &err), MEGA_OK);
  assert_memory_equal(got, a, sizeof a);
  assert_int_equal(mega_st_read_f32(f, "b", got, 3, NULL, 0, &err), MEGA_OK);
  assert_memory_equal(got, b, sizeof b); /* NaN and inf bit patterns survive */
  int64_t wrong[2] = {3, 2};
  assert_int_equal(mega_st_read_f32(f, "a.weight", got, 6, wrong, 2, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "a.weight has shape [2,3] (6 floats); expected [3,2]"));
  assert_int_equal(mega_st_read_f32(f, "nope", got, 6, NULL, 0, &err), MEGA_ERR_NOT_FOUND);
  mega_st_close(f);
  /* the data section starts 8-byte aligned */
  FILE *fp = fopen(p, "rb");
  unsigned char len8[8];
  assert_int_equal(fread(len8, 1, 8, fp), 8);
  fclose(fp);
  assert_int_equal(len8[0] % 8, 0);
}

static void writer_rejects_bad_lists(void **state) {
  (void)state;
  float a[2] = {1, 2};
  mega_st_tensor dup[2] = {{.name = "x", .ndim = 1, .shape = {2}, .numel = 2, .data = a},
                           {.name = "x", .ndim = 1, .shape = {2}, .numel = 2, .data = a}};
  char p[128];
  path_of(p, sizeof p, "bad-write.safetensors");
  mega_err err = {0};
  assert_int_equal(mega_st_write(p, dup, 2, NULL, 0, &err), MEGA_ERR_INVALID);
  dup[1].name = "y";
  dup[1].numel = 3;
  assert_int_equal(mega_st_write(p, dup, 2, NULL, 0, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "does not match its shape"));
  assert_int_equal(access(p, F_OK), -1);
}

static void gpt_stage_save_and_load(void **state) {
  (void)state;
  mega_backend *be;
  mega_err err = {0};
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_gpt_config cfg;
  fx_config(&cfg, 0.02f);
  mega_gpt_stage_desc whole = {true, true, 0, 2}, last = {false, true, 1, 1};
  mega_gpt_stage *s1, *s2;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s1, &err), MEGA_OK);
  cfg.seed++;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &last, &s2, &err), MEGA_OK);
  char p[128];
  path_of(p, sizeof p, "gpt.safetensors");
  assert_int_equal(mega_gpt_save_safetensors(s1, p, &err), MEGA_OK);
  mega_st_file *f;
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_OK);
  assert_int_equal(mega_st_count(f), 2 + 24 + 2);
  const mega_st_file *files[1] = {f};
  /* another seed's last stage takes the whole model's tensors by name */
  assert_int_equal(mega_gpt_load_safetensors(s2, files, 1, &err), MEGA_OK);
  int np;
  const mega_param_info *pi = mega_gpt_params(s2, &np);
  for (int i = 0; i < np; i++) {
    const mega_param_info *src = mega_gpt_param_find(s1, pi[i].name);
    assert_non_null(src);
    assert_memory_equal(mega_gpt_param_data(s2) + pi[i].offset,
                        mega_gpt_param_data(s1) + src->offset, pi[i].numel * sizeof(float));
  }
  mega_st_close(f);
  /* a missing tensor is named */
  float x[1] = {0};
  mega_st_tensor one = {.name = "transformer.wte.weight", .ndim = 1, .shape = {1}, .numel = 1,
                        .data = x};
  assert_int_equal(mega_st_write(p, &one, 1, NULL, 0, &err), MEGA_OK);
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_OK);
  files[0] = f;
  assert_int_equal(mega_gpt_load_safetensors(s2, files, 1, &err), MEGA_ERR_NOT_FOUND);
  assert_non_null(strstr(err.msg, "transformer.h.1.ln_1.weight"));
  mega_st_close(f);
  mega_gpt_stage_destroy(s1);
  mega_gpt_stage_destroy(s2);
  mega_backend_destroy(be);
}

/* Writes an 8-byte length (hl, or the header's real length when hl < 0),
 * the header and ndata data bytes. */
static void write_raw(const char *p, long long hl, const char *header, size_t ndata) {
  FILE *fp = fopen(p, "wb");
  assert_non_null(fp);
  unsigned long long n = hl < 0 ? strlen(header) : (unsigned long long)hl;
  for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, fp);
  fputs(header, fp);
  for (size_t i = 0; i < ndata; i++) fputc(0, fp);
  fclose(fp);
}

static void expect_bad(const char *header, size_t ndata, const char *want1,
                       const char *want2) {
  char p[128];
  path_of(p, sizeof p, "bad.safetensors");
  write_raw(p, -1, header, ndata);
  mega_st_file *f = NULL;
  mega_err err = {0};
  mega_status st = mega_st_open(p, &f, &err);
  if (st == MEGA_OK) fail_msg("accepted a bad header: %s", header);
  assert_int_equal(st, MEGA_ERR_INVALID);
  assert_null(f);
  if (!strstr(err.msg, p) || !strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
    fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err.msg, want1, want2 ? want2 : "");
}

static void bad_files_fail_clearly(void **state) {
  (void)state;
  char p[128];
  mega_err err = {0};
  mega_st_file *f = NULL;
  path_of(p, sizeof p, "absent.safetensors");
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "absent.safetensors"));
  path_of(p, sizeof p, "short.safetensors");
  FILE *fp = fopen(p, "wb");
  fputs("abc", fp);
  fclose(fp);
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "shorter than the 8-byte header length"));
  path_of(p, sizeof p, "long.safetensors");
  write_raw(p, 1000, "{}", 0);
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "header length 1000 runs past the end"));
  path_of(p, sizeof p, "huge.safetensors");
  write_raw(p, (long long)1 << 62, "{}", 0);
  assert_int_equal(mega_st_open(p, &f, &err), MEGA_ERR_INVALID);

  expect_bad("{\"a\": ", 0, "not valid JSON", NULL);
  expect_bad("[1, 2]", 0, "not a JSON object", NULL);
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
             16, "not valid JSON", "duplicate");
  expect_bad("{\"w\": 3}", 0, "tensor w", "not a JSON object");
  expect_bad("{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "tensor w",
             "dtype F16 is not supported");
  expect_bad("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor w", "dtype");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
             "tensor w", "shape[0]");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "tensor w",
             "shape");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
             4, "tensor w", "9 dimensions");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor w", "data_offsets");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 5, "tensor w",
             "outside the 5 data bytes (truncated file?)");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "tensor w",
             "outside");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12,
             "tensor w", "shape needs 12 bytes but data_offsets span 8");
  expect_bad("{\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, "tensors v and w overlap", NULL);
  expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of k", NULL);
  expect_bad("{\"__metadata__\":[]}", 0, "__metadata__ is not an object", NULL);
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
             "\"data_offsets\":[0,8]}}",
             8, "tensor w", "overflows");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip),
      cmocka_unit_test(writer_rejects_bad_lists),
      cmocka_unit_test(gpt_stage_save_and_load),
      cmocka_unit_test(bad_files_fail_clearly),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
