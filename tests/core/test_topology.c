#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/topology.h"

static mega_topo make(int world, int tp, int pp) {
  mega_topo t;
  mega_err err = {0};
  assert_int_equal(mega_topo_init(&t, world, tp, pp, &err), MEGA_OK);
  return t;
}

static void expect_groups(const mega_topo *t, mega_group_kind k, int n, int size,
                          const int *want) {
  assert_int_equal(mega_topo_num_groups(t, k), n);
  assert_int_equal(mega_topo_group_size(t, k), size);
  for (int g = 0; g < n; g++) {
    int got[64];
    mega_topo_group(t, k, g, got);
    assert_memory_equal(got, want + g * size, sizeof(int) * size);
  }
}

/* Seed 004: world 16, TP 2, PP 4, so DP 2. */
static void test_seed_004(void **state) {
  (void)state;
  mega_topo t = make(16, 2, 4);
  assert_int_equal(t.dp, 2);
  const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
  expect_groups(&t, MEGA_GROUP_DP, 8, 2, dp);
  const int pp[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  expect_groups(&t, MEGA_GROUP_PP, 4, 4, pp);
  const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  expect_groups(&t, MEGA_GROUP_TP, 8, 2, tp);
  const int mp[] = {0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15};
  expect_groups(&t, MEGA_GROUP_MP, 2, 8, mp);
  const int embd[] = {0, 12, 1, 13, 2, 14, 3, 15};
  expect_groups(&t, MEGA_GROUP_EMBD, 4, 2, embd);

  const int devices[] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  for (int r = 0; r < 16; r++) assert_int_equal(mega_topo_device(r, 4), devices[r]);

  mega_coord c = mega_topo_coord(&t, 13);
  assert_int_equal(c.tp, 1);
  assert_int_equal(c.dp, 0);
  assert_int_equal(c.pp, 3);
}

static void test_embd_single_stage(void **state) {
  (void)state;
  mega_topo t = make(6, 3, 1); /* DP 2 */
  const int embd[] = {0, 1, 2, 3, 4, 5};
  expect_groups(&t, MEGA_GROUP_EMBD, 6, 1, embd);
  for (int r = 0; r < 6; r++) {
    int pos = -1;
    assert_int_equal(mega_topo_group_of(&t, MEGA_GROUP_EMBD, r, &pos), r);
    assert_int_equal(pos, 0);
  }
}

static void test_embd_middle_stages(void **state) {
  (void)state;
  mega_topo t = make(8, 1, 4); /* DP 2: pipelines 0,2,4,6 and 1,3,5,7 */
  const int embd[] = {0, 6, 1, 7};
  expect_groups(&t, MEGA_GROUP_EMBD, 2, 2, embd);
  for (int r = 2; r < 6; r++) assert_int_equal(mega_topo_group_of(&t, MEGA_GROUP_EMBD, r, NULL), -1);
  int pos = -1;
  assert_int_equal(mega_topo_group_of(&t, MEGA_GROUP_EMBD, 7, &pos), 1);
  assert_int_equal(pos, 1);
}

/* Megatron's own enumeration, written as seed 004's code writes it. */
static void megatron_groups(int world, int tp, int pp, mega_group_kind k, int g, int *out) {
  int n_pp_groups = world / pp;
  int n = 0;
  switch (k) {
  case MEGA_GROUP_DP: { /* for i in pp: for j in tp: range(start + j, end, tp) */
    int i = g / tp, j = g % tp;
    for (int r = i * n_pp_groups + j; r < (i + 1) * n_pp_groups; r += tp) out[n++] = r;
    break;
  }
  case MEGA_GROUP_PP: /* range(i, world, world / pp) */
    for (int r = g; r < world; r += n_pp_groups) out[n++] = r;
    break;
  case MEGA_GROUP_TP:
    for (int r = g * tp; r < (g + 1) * tp; r++) out[n++] = r;
    break;
  default: break;
  }
}

static void test_many_shapes(void **state) {
  (void)state;
  int shapes = 0;
  for (int world = 1; world <= 48; world++)
    for (int tp = 1; tp <= world; tp++)
      for (int pp = 1; pp <= world; pp++) {
        if (world % (tp * pp)) continue;
        shapes++;
        mega_topo t = make(world, tp, pp);
        assert_int_equal(t.tp * t.pp * t.dp, world);
        /* coord <-> rank round trip, both ways */
        for (int r = 0; r < world; r++) {
          mega_coord c = mega_topo_coord(&t, r);
          assert_true(c.tp >= 0 && c.tp < tp && c.dp >= 0 && c.dp < t.dp && c.pp >= 0 && c.pp < pp);
          assert_int_equal(mega_topo_rank(&t, c), r);
          assert_int_equal(r, c.tp + tp * (c.dp + t.dp * c.pp));
        }
        for (mega_group_kind k = 0; k < MEGA_GROUP_KINDS; k++) {
          int n = mega_topo_num_groups(&t, k), size = mega_topo_group_size(&t, k);
          int seen[48] = {0};
          for (int g = 0; g < n; g++) {
            int m[48];
            mega_topo_group(&t, k, g, m);
            mega_coord c0 = mega_topo_coord(&t, m[0]);
            for (int i = 0; i < size; i++) {
              assert_true(m[i] >= 0 && m[i] < world);
              if (i) assert_true(m[i] > m[i - 1]);
              seen[m[i]]++;
              int pos = -1;
              assert_int_equal(mega_topo_group_of(&t, k, m[i], &pos), g);
              assert_int_equal(pos, i);
              mega_coord c = mega_topo_coord(&t, m[i]);
              switch (k) {
              case MEGA_GROUP_TP: assert_true(c.dp == c0.dp && c.pp == c0.pp); break;
              case MEGA_GROUP_DP: assert_true(c.tp == c0.tp && c.pp == c0.pp); break;
              case MEGA_GROUP_PP:
                assert_true(c.tp == c0.tp && c.dp == c0.dp);
                assert_int_equal(c.pp, i);
                break;
              case MEGA_GROUP_MP: assert_int_equal(c.dp, c0.dp); break;
              case MEGA_GROUP_EMBD:
                assert_true(c.tp == c0.tp && c.dp == c0.dp);
                assert_int_equal(c.pp, i == 0 ? 0 : pp - 1);
                break;
              default: fail();
              }
            }
            if (k == MEGA_GROUP_DP || k == MEGA_GROUP_PP || k == MEGA_GROUP_TP) {
              int want[48];
              megatron_groups(world, tp, pp, k, g, want);
              assert_memory_equal(m, want, sizeof(int) * size);
            }
          }
          /* TP, DP, PP and MP groups partition the world; EMBD holds the ends */
          for (int r = 0; r < world; r++) {
            mega_coord c = mega_topo_coord(&t, r);
            int want = 1;
            if (k == MEGA_GROUP_EMBD) want = (c.pp == 0 || c.pp == pp - 1) ? 1 : 0;
            assert_int_equal(seen[r], want);
          }
        }
      }
  assert_true(shapes > 100);
}

static void expect_init_error(int world, int tp, int pp, const char *want) {
  mega_topo t;
  mega_err err = {0};
  assert_int_equal(mega_topo_init(&t, world, tp, pp, &err), MEGA_ERR_INVALID);
  assert_int_equal(err.status, MEGA_ERR_INVALID);
  if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
}

static void test_init_errors(void **state) {
  (void)state;
  expect_init_error(6, 2, 2, "world size 6 is not divisible by TP·PP = 4 (TP 2 × PP 2)");
  expect_init_error(16, 3, 1, "world size 16 is not divisible by TP·PP = 3 (TP 3 × PP 1)");
  expect_init_error(4, 8, 1, "world size 4 is not divisible by TP·PP = 8");
  expect_init_error(0, 1, 1, "world size must be at least 1 (got 0)");
  expect_init_error(-4, 1, 1, "world size must be at least 1 (got -4)");
  expect_init_error(8, 0, 1, "tensor-parallel size (TP) must be at least 1 (got 0)");
  expect_init_error(8, -2, 1, "(TP) must be at least 1 (got -2)");
  expect_init_error(8, 1, 0, "pipeline-parallel size (PP) must be at least 1 (got 0)");
  expect_init_error(8, 2, -1, "(PP) must be at least 1 (got -1)");
  /* TP·PP beyond int range must not wrap into a false "divisible" */
  expect_init_error(1 << 30, 1 << 16, 1 << 16, "is not divisible by TP·PP = 4294967296");
  /* a NULL err is allowed */
  mega_topo t;
  assert_int_equal(mega_topo_init(&t, 6, 2, 2, NULL), MEGA_ERR_INVALID);
}

static void test_out_of_range(void **state) {
  (void)state;
  mega_topo t = make(8, 2, 2);
  mega_coord c = mega_topo_coord(&t, 8);
  assert_int_equal(c.tp, -1);
  assert_int_equal(mega_topo_coord(&t, -1).pp, -1);
  assert_int_equal(mega_topo_rank(&t, (mega_coord){2, 0, 0}), -1);
  assert_int_equal(mega_topo_rank(&t, (mega_coord){0, 0, -1}), -1);
  assert_int_equal(mega_topo_group_of(&t, MEGA_GROUP_DP, 8, NULL), -1);
  int sentinel[4] = {-7, -7, -7, -7};
  mega_topo_group(&t, MEGA_GROUP_TP, 4, sentinel); /* 4 TP groups: idx 4 is past the end */
  assert_int_equal(sentinel[0], -7);
  assert_int_equal(mega_topo_device(3, 0), -1);
  assert_int_equal(mega_topo_device(-1, 4), -1);
  assert_int_equal(mega_topo_device(9, 8), 1);
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(mega_group_kind_name(MEGA_GROUP_TP), "tp");
  assert_string_equal(mega_group_kind_name(MEGA_GROUP_DP), "dp");
  assert_string_equal(mega_group_kind_name(MEGA_GROUP_PP), "pp");
  assert_string_equal(mega_group_kind_name(MEGA_GROUP_MP), "mp");
  assert_string_equal(mega_group_kind_name(MEGA_GROUP_EMBD), "embd");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_seed_004),       cmocka_unit_test(test_embd_single_stage),
      cmocka_unit_test(test_embd_middle_stages), cmocka_unit_test(test_many_shapes),
      cmocka_unit_test(test_init_errors),    cmocka_unit_test(test_out_of_range),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
