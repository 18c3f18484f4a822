#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/layout.h"

static void expect_stage(const mega_layout *l, int r, int v, const char *want) {
  int len = -1;
  const char *got = mega_layout_stage(l, r, v, &len);
  assert_non_null(got);
  assert_int_equal(len, (int)strlen(want));
  assert_memory_equal(got, want, (size_t)len);
}

/* Megatron's get_layer_offset, written as seed 001 writes it, on counts. */
static int megatron_offset(const mega_layout *l, int pp_rank, int vp_stage, char kind) {
  int offset = 0;
  for (int v = 0; v < vp_stage + 1; v++)
    for (int r = 0; r < (v < vp_stage ? l->pp : pp_rank); r++)
      offset += mega_layout_count(l, r, v, kind);
  return offset;
}

static void expect_megatron_offsets(const mega_layout *l) {
  const char kinds[] = {MEGA_LAYER_EMBEDDING, MEGA_LAYER_DECODER, MEGA_LAYER_MTP, MEGA_LAYER_LOSS};
  for (int k = 0; k < 4; k++) {
    int sum = 0;
    for (int r = 0; r < l->pp; r++)
      for (int v = 0; v < l->vp; v++) {
        assert_int_equal(mega_layout_offset(l, r, v, kinds[k]), megatron_offset(l, r, v, kinds[k]));
        sum += mega_layout_count(l, r, v, kinds[k]);
      }
    assert_int_equal(mega_layout_total(l, kinds[k]), sum);
  }
}

/* Seed 001's DeepSeek-V3 table: "Et*3|(tt|)*29,m|L" at PP=16 gives VP=2. */
static void test_deepseek_v3(void **state) {
  (void)state;
  mega_layout l;
  mega_err err = {0};
  assert_int_equal(mega_layout_parse("Et*3|(tt|)*29,m|L", 16, &l, &err), MEGA_OK);
  assert_int_equal(l.pp, 16);
  assert_int_equal(l.vp, 2);
  assert_int_equal(l.nstages, 32);

  expect_stage(&l, 0, 0, "Ettt");
  expect_stage(&l, 0, 1, "tt");
  for (int r = 1; r <= 13; r++) {
    expect_stage(&l, r, 0, "tt");
    expect_stage(&l, r, 1, "tt");
  }
  expect_stage(&l, 14, 0, "tt");
  expect_stage(&l, 14, 1, "m");
  expect_stage(&l, 15, 0, "tt");
  expect_stage(&l, 15, 1, "L");

  assert_int_equal(mega_layout_count(&l, 0, 0, MEGA_LAYER_EMBEDDING), 1);
  assert_int_equal(mega_layout_count(&l, 0, 0, MEGA_LAYER_DECODER), 3);
  assert_int_equal(mega_layout_count(&l, 0, 1, MEGA_LAYER_DECODER), 2);
  assert_int_equal(mega_layout_count(&l, 14, 1, MEGA_LAYER_DECODER), 0);
  assert_int_equal(mega_layout_count(&l, 14, 1, MEGA_LAYER_MTP), 1);
  assert_int_equal(mega_layout_count(&l, 15, 1, MEGA_LAYER_LOSS), 1);
  assert_int_equal(mega_layout_total(&l, MEGA_LAYER_DECODER), 61);
  assert_int_equal(mega_layout_total(&l, MEGA_LAYER_MTP), 1);
  assert_int_equal(mega_layout_total(&l, MEGA_LAYER_EMBEDDING), 1);
  assert_int_equal(mega_layout_total(&l, MEGA_LAYER_LOSS), 1);

  /* decoder offsets: stage s = v*16 + r holds 3 (s=0), 2 (s=1..29), 0 after */
  assert_int_equal(mega_layout_offset(&l, 0, 0, MEGA_LAYER_DECODER), 0);
  for (int r = 1; r < 16; r++)
    assert_int_equal(mega_layout_offset(&l, r, 0, MEGA_LAYER_DECODER), 2 * r + 1);
  for (int r = 0; r < 14; r++)
    assert_int_equal(mega_layout_offset(&l, r, 1, MEGA_LAYER_DECODER), 33 + 2 * r);
  assert_int_equal(mega_layout_offset(&l, 14, 1, MEGA_LAYER_DECODER), 61);
  assert_int_equal(mega_layout_offset(&l, 15, 1, MEGA_LAYER_DECODER), 61);
  assert_int_equal(mega_layout_offset(&l, 14, 1, MEGA_LAYER_MTP), 0);
  expect_megatron_offsets(&l);

  int ids[8];
  assert_int_equal(mega_layout_ids(&l, 0, 0, MEGA_LAYER_DECODER, ids), 3);
  assert_int_equal(ids[0], 0);
  assert_int_equal(ids[2], 2);
  assert_int_equal(mega_layout_ids(&l, 1, 0, MEGA_LAYER_DECODER, ids), 2);
  assert_int_equal(ids[0], 3);
  assert_int_equal(ids[1], 4);
  assert_int_equal(mega_layout_ids(&l, 0, 1, MEGA_LAYER_DECODER, ids), 2);
  assert_int_equal(ids[0], 33);
  assert_int_equal(mega_layout_ids(&l, 13, 1, MEGA_LAYER_DECODER, ids), 2);
  assert_int_equal(ids[0], 59);
  assert_int_equal(ids[1], 60);
  assert_int_equal(mega_layout_ids(&l, 15, 1, MEGA_LAYER_DECODER, ids), 0);

  /* every decoder id 0..60 is built exactly once */
  int seen[61] = {0};
  for (int r = 0; r < 16; r++)
    for (int v = 0; v < 2; v++) {
      int n = mega_layout_ids(&l, r, v, MEGA_LAYER_DECODER, ids);
      for (int k = 0; k < n; k++) seen[ids[k]]++;
    }
  for (int k = 0; k < 61; k++) assert_int_equal(seen[k], 1);

  char *s = mega_layout_format(&l);
  assert_non_null(s);
  char want[256] = "Ettt";
  for (int k = 0; k < 29; k++) strcat(want, "|tt");
  strcat(want, "|m|L");
  assert_string_equal(s, want);
  free(s);
  mega_layout_free(&l);
  assert_null(l.kinds);
}

static void expect_expands(const char *str, int pp, const char *want) {
  mega_layout l;
  mega_err err = {0};
  if (mega_layout_parse(str, pp, &l, &err) != MEGA_OK) fail_msg("'%s': %s", str, err.msg);
  char *s = mega_layout_format(&l);
  assert_string_equal(s, want);
  free(s);
  expect_megatron_offsets(&l);
  mega_layout_free(&l);
}

static void test_syntax(void **state) {
  (void)state;
  expect_expands("EtL", 1, "EtL");
  expect_expands("Et|tL", 2, "Et|tL");
  expect_expands("Et|tL", 1, "Et|tL"); /* 2 stages at PP 1: VP 2 */
  expect_expands(" E t * 3 | ( t t | ) * 2 , L ", 1, "Ettt|tt|tt|L");
  expect_expands("E,t,t|t,t,L", 2, "Ett|ttL");
  expect_expands("\tE\nt|\r tL", 2, "Et|tL");
  expect_expands("E((t|)*2t|)*2L", 7, "Et|t|t|t|t|t|L");
  expect_expands("E|*3L", 4, "E|||L"); /* empty stages are allowed */
  expect_expands("Et*12|L", 2, "Etttttttttttt|L");
  expect_expands("E(t)*1|t*01L", 2, "Et|tL");
  expect_expands("E(tm)*2|L", 2, "Etmtm|L");

  mega_layout l;
  assert_int_equal(mega_layout_parse("Et|t|t|tL", 2, &l, NULL), MEGA_OK);
  assert_int_equal(l.vp, 2);
  expect_stage(&l, 0, 0, "Et");
  expect_stage(&l, 1, 0, "t");
  expect_stage(&l, 0, 1, "t");
  expect_stage(&l, 1, 1, "tL");
  assert_int_equal(mega_layout_offset(&l, 0, 1, MEGA_LAYER_DECODER), 2);
  assert_int_equal(mega_layout_offset(&l, 1, 1, MEGA_LAYER_DECODER), 3);
  mega_layout_free(&l);
}

static void expect_parse_error(const char *str, int pp, const char *want) {
  mega_layout l;
  mega_err err = {0};
  assert_int_equal(mega_layout_parse(str, pp, &l, &err), MEGA_ERR_INVALID);
  assert_int_equal(err.status, MEGA_ERR_INVALID);
  if (!strstr(err.msg, want)) fail_msg("'%s': message '%s' lacks '%s'", str, err.msg, want);
  assert_null(l.kinds); /* nothing to free after a failure */
  mega_layout_free(&l);
}

static void test_parse_errors(void **state) {
  (void)state;
  expect_parse_error("Etx|L", 1, "column 3: unknown letter 'x'");
  expect_parse_error("ET|L", 1, "column 2: unknown letter 'T'");
  expect_parse_error("Et|\x01L", 1, "column 4: unexpected byte 0x01");
  expect_parse_error("E(tt|L", 1, "column 2: '(' is never closed");
  expect_parse_error("E((t|)*2|L", 1, "column 2: '(' is never closed");
  expect_parse_error("Ett)|L", 1, "column 4: ')' has no matching '('");
  expect_parse_error("Et*|L", 1, "column 3: '*' needs a repeat count");
  expect_parse_error("Et*x|L", 1, "column 3: '*' needs a repeat count");
  expect_parse_error("E(t|)|L", 1, "column 2: '(...)' needs a repeat count");
  expect_parse_error("Et*0|L", 1, "column 4: repeat count must be at least 1 (got 0)");
  expect_parse_error("E(t|)*00L", 1, "column 7: repeat count must be at least 1 (got 0)");
  expect_parse_error("*3EtL", 1, "column 1: '*' has nothing to repeat");
  expect_parse_error("Et*3*2L", 1, "column 5: '*' has nothing to repeat");
  expect_parse_error("E()*3L", 1, "column 2: '()' repeats nothing");
  expect_parse_error("Et*99999999L", 1, "column 4: repeat count is larger than 1000000");
  expect_parse_error("E(t*1000000)*1000000L", 1, "expands to more than");
  expect_parse_error("Et|t|L", 2, "the layout has 3 stages, which is not a multiple of the pipeline size PP = 2");
  expect_parse_error("Et|t|t|t|L", 4, "5 stages");
  expect_parse_error("tt|L", 1, "column 1: the first stage has no 'E' (embedding)");
  expect_parse_error("", 1, "the first stage has no 'E'");
  expect_parse_error("Ett|t", 1, "column 5: the last stage has no 'L' (loss)");
  expect_parse_error("t|Et|L", 1, "column 3: 'E' (embedding) is in stage 1, but it belongs in the first stage");
  expect_parse_error("Et|Et|L", 1, "column 4: a second 'E' (embedding)");
  expect_parse_error("(t|)*2EL", 1, "column 7: 'E' (embedding) is in stage 2");
  expect_parse_error("EtL|t", 1, "column 3: 'L' (loss) is in stage 0, but it belongs in the last stage (stage 1)");
  expect_parse_error("Et|tLL", 1, "column 6: a second 'L' (loss)");
  expect_parse_error("Et|L*2", 1, "column 4: a second 'L'");
  expect_parse_error("EE|L", 1, "column 2: a second 'E'");
  expect_parse_error("tE|L", 1, "column 2: 'E' (embedding) must come first in its stage");
  expect_parse_error("Et|Lt", 1, "column 4: 'L' (loss) must come last in its stage");
  expect_parse_error("EtL", 0, "pipeline-parallel size (PP) must be at least 1 (got 0)");
  expect_parse_error(NULL, 1, "no layout string");

  char deep[300];
  memset(deep, '(', 100);
  strcpy(deep + 100, "t");
  expect_parse_error(deep, 1, "column 65: parentheses nest deeper than 64 levels");
}

static void test_uniform(void **state) {
  (void)state;
  mega_layout l;
  mega_err err = {0};

  assert_int_equal(mega_layout_uniform(8, 4, 1, -1, -1, &l, &err), MEGA_OK);
  char *s = mega_layout_format(&l);
  assert_string_equal(s, "Ett|tt|tt|ttL");
  free(s);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(8, 2, 2, -1, -1, &l, &err), MEGA_OK);
  assert_int_equal(l.vp, 2);
  expect_stage(&l, 0, 0, "Ett");
  expect_stage(&l, 1, 0, "tt");
  expect_stage(&l, 0, 1, "tt");
  expect_stage(&l, 1, 1, "ttL");
  assert_int_equal(mega_layout_offset(&l, 0, 1, MEGA_LAYER_DECODER), 4);
  assert_int_equal(mega_layout_offset(&l, 1, 1, MEGA_LAYER_DECODER), 6);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(10, 4, 1, 1, 3, &l, &err), MEGA_OK);
  s = mega_layout_format(&l);
  assert_string_equal(s, "Et|ttt|ttt|tttL");
  free(s);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(7, 3, 1, 1, -1, &l, &err), MEGA_OK);
  s = mega_layout_format(&l);
  assert_string_equal(s, "Et|ttt|tttL");
  free(s);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(12, 3, 2, 2, 6, &l, &err), MEGA_OK);
  s = mega_layout_format(&l);
  assert_string_equal(s, "Et|tt|ttt|t|tt|tttL");
  free(s);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(6, 2, 1, 6, 0, &l, &err), MEGA_OK);
  s = mega_layout_format(&l);
  assert_string_equal(s, "Etttttt|L");
  free(s);
  mega_layout_free(&l);

  assert_int_equal(mega_layout_uniform(3, 1, 1, -1, -1, &l, &err), MEGA_OK);
  s = mega_layout_format(&l);
  assert_string_equal(s, "EtttL");
  free(s);
  mega_layout_free(&l);
}

/* Megatron's uniform offset: vp_stage * (L / vp) + pp_rank * (L / pp / vp). */
static void test_uniform_many(void **state) {
  (void)state;
  int shapes = 0;
  for (int layers = 1; layers <= 24; layers++)
    for (int pp = 1; pp <= 8; pp++)
      for (int vp = 1; vp <= 4; vp++) {
        mega_layout l;
        mega_status st = mega_layout_uniform(layers, pp, vp, -1, -1, &l, NULL);
        if (layers % (pp * vp)) {
          assert_int_equal(st, MEGA_ERR_INVALID);
          continue;
        }
        assert_int_equal(st, MEGA_OK);
        shapes++;
        assert_int_equal(mega_layout_total(&l, MEGA_LAYER_DECODER), layers);
        for (int r = 0; r < pp; r++)
          for (int v = 0; v < vp; v++) {
            assert_int_equal(mega_layout_count(&l, r, v, MEGA_LAYER_DECODER), layers / pp / vp);
            assert_int_equal(mega_layout_offset(&l, r, v, MEGA_LAYER_DECODER),
                             v * (layers / vp) + r * (layers / pp / vp));
            assert_int_equal(mega_layout_count(&l, r, v, MEGA_LAYER_EMBEDDING), r == 0 && v == 0);
            assert_int_equal(mega_layout_count(&l, r, v, MEGA_LAYER_LOSS),
                             r == pp - 1 && v == vp - 1);
          }
        expect_megatron_offsets(&l);
        /* the formatted string parses back to the same layout */
        char *s = mega_layout_format(&l);
        mega_layout back;
        assert_int_equal(mega_layout_parse(s, pp, &back, NULL), MEGA_OK);
        assert_int_equal(back.vp, vp);
        assert_string_equal(back.kinds, l.kinds);
        assert_memory_equal(back.stage_start, l.stage_start, sizeof(int) * (size_t)(pp * vp + 1));
        free(s);
        mega_layout_free(&back);
        mega_layout_free(&l);
      }
  assert_true(shapes > 50);
}

static void expect_uniform_error(int layers, int pp, int vp, int first, int last, const char *want) {
  mega_layout l;
  mega_err err = {0};
  assert_int_equal(mega_layout_uniform(layers, pp, vp, first, last, &l, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
  assert_null(l.kinds);
}

static void test_uniform_errors(void **state) {
  (void)state;
  expect_uniform_error(10, 4, 1, -1, -1, "num-layers 10 is not divisible by the pipeline size PP = 4");
  expect_uniform_error(12, 4, 2, -1, -1,
                       "pipeline rank 0's 3 layers are not divisible by the virtual pipeline size VP = 2");
  expect_uniform_error(12, 3, 2, 3, 5,
                       "--decoder-first-pipeline-num-layers 3 is not divisible by the virtual pipeline size VP = 2");
  expect_uniform_error(13, 3, 2, 4, 3,
                       "--decoder-last-pipeline-num-layers 3 is not divisible by the virtual pipeline size VP = 2");
  expect_uniform_error(10, 4, 1, 1, 2,
                       "num-layers 10 minus the first/last pipeline ranks' 3 leaves 7 layers, which are not divisible by the 2 other pipeline ranks");
  expect_uniform_error(4, 3, 1, 3, 2, "take 5 layers, more than --num-layers 4");
  expect_uniform_error(8, 2, 1, 3, 3, "num-layers 8 minus first 3 and last 3 leaves 2 layers, but PP = 2 has no other pipeline rank");
  expect_uniform_error(8, 1, 1, 3, -1, "--decoder-first-pipeline-num-layers needs a pipeline (PP > 1)");
  expect_uniform_error(8, 1, 1, -1, 8, "--decoder-last-pipeline-num-layers needs a pipeline");
  expect_uniform_error(8, 2, 1, -2, -1, "--decoder-first-pipeline-num-layers must be at least 0 (got -2)");
  expect_uniform_error(0, 1, 1, -1, -1, "num-layers must be at least 1 (got 0)");
  expect_uniform_error(4, 0, 1, -1, -1, "(PP) must be at least 1 (got 0)");
  expect_uniform_error(4, 1, 0, -1, -1, "(VP) must be at least 1 (got 0)");
}

static void test_out_of_range(void **state) {
  (void)state;
  mega_layout l;
  assert_int_equal(mega_layout_parse("Et|tL", 2, &l, NULL), MEGA_OK);
  int len = 5;
  assert_null(mega_layout_stage(&l, 2, 0, &len));
  assert_int_equal(len, 0);
  assert_null(mega_layout_stage(&l, 0, 1, NULL));
  assert_int_equal(mega_layout_count(&l, -1, 0, MEGA_LAYER_DECODER), 0);
  assert_int_equal(mega_layout_offset(&l, 0, 3, MEGA_LAYER_DECODER), 0);
  int ids[4];
  assert_int_equal(mega_layout_ids(&l, 5, 0, MEGA_LAYER_DECODER, ids), 0);
  assert_int_equal(mega_layout_count(&l, 0, 0, 'x'), 0);
  mega_layout_free(&l);
  mega_layout_free(&l); /* freeing twice is harmless */
  mega_layout_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deepseek_v3),  cmocka_unit_test(test_syntax),
      cmocka_unit_test(test_parse_errors), cmocka_unit_test(test_uniform),
      cmocka_unit_test(test_uniform_many), cmocka_unit_test(test_uniform_errors),
      cmocka_unit_test(test_out_of_range),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
