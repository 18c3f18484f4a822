#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "daemon/model/placement.h"

static const mega_node_slots cluster[] = {
    {"a", 4, true}, {"b", 2, true}, {"c", 4, false}, {"d", 4, true}, {"e", 8, true},
};

static void places_on_alive_nodes_with_room(void **state) {
  (void)state;
  mega_placement_req req = {.nnodes_min = 1, .nnodes_max = 3, .nproc_per_node = 4,
                            .model_parallel = 2};
  int out[3], n = 0;
  mega_err err = {0};
  assert_int_equal(mega_place(cluster, 5, &req, out, &n, &err), MEGA_OK);
  assert_int_equal(n, 3);
  assert_int_equal(out[0], 0); /* b has 2 slots, c is dead */
  assert_int_equal(out[1], 3);
  assert_int_equal(out[2], 4);
}

static void preferred_node_comes_first(void **state) {
  (void)state;
  mega_placement_req req = {.nnodes_min = 2, .nnodes_max = 2, .nproc_per_node = 2,
                            .model_parallel = 1, .prefer = "e"};
  int out[2], n = 0;
  assert_int_equal(mega_place(cluster, 5, &req, out, &n, NULL), MEGA_OK);
  assert_int_equal(n, 2);
  assert_int_equal(out[0], 4);
  assert_int_equal(out[1], 0);
}

static void world_must_divide_by_model_parallel(void **state) {
  (void)state;
  /* 3 nodes x 2 = 6 is not a multiple of TP*PP = 4; 2 nodes x 2 = 4 is. */
  mega_placement_req req = {.nnodes_min = 1, .nnodes_max = 3, .nproc_per_node = 2,
                            .model_parallel = 4};
  int out[3], n = 0;
  assert_int_equal(mega_place(cluster, 5, &req, out, &n, NULL), MEGA_OK);
  assert_int_equal(n, 2);

  mega_placement_req fixed = {.nnodes_min = 3, .nnodes_max = 3, .nproc_per_node = 2,
                              .model_parallel = 4};
  mega_err err = {0};
  assert_int_equal(mega_place(cluster, 5, &fixed, out, &n, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "TP·PP = 4"));
}

static void too_few_nodes_says_how_many(void **state) {
  (void)state;
  mega_placement_req req = {.nnodes_min = 4, .nnodes_max = 4, .nproc_per_node = 4,
                            .model_parallel = 1};
  int out[4], n = 0;
  mega_err err = {0};
  assert_int_equal(mega_place(cluster, 5, &req, out, &n, &err), MEGA_ERR_UNSUPPORTED);
  assert_string_equal(err.msg, "not enough nodes: the job needs 4 nodes with 4 free slots "
                               "each, and 3 of 4 alive nodes have them");
}

/* A rolling upgrade: the nodes of another build (or of none known) are
 * not placed on, and a job that waits for them says so. */
static void one_build_per_job(void **state) {
  (void)state;
  const mega_node_slots mixed[] = {
      {"a", 4, true, "0.2+new"}, {"b", 4, true, "0.1"}, {"c", 4, true, NULL},
      {"d", 4, true, "0.2+new"}, {"e", 4, false, "0.1"},
  };
  mega_placement_req req = {.nnodes_min = 1, .nnodes_max = 5, .nproc_per_node = 4,
                            .model_parallel = 1, .prefer = "b", .version = "0.2+new"};
  int out[5], n = 0;
  mega_err err = {0};
  assert_int_equal(mega_place(mixed, 5, &req, out, &n, &err), MEGA_OK);
  assert_int_equal(n, 2);
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], 3);
  req.nnodes_min = req.nnodes_max = 3;
  assert_int_equal(mega_place(mixed, 5, &req, out, &n, &err), MEGA_ERR_UNSUPPORTED);
  assert_string_equal(err.msg, "not enough nodes: the job needs 3 nodes with 4 free slots each, "
                               "and 2 of 4 alive nodes have them; 2 more run another build of "
                               "mega (b: 0.1; c: version not known), not this coordinator's "
                               "0.2+new, and a job's ranks run one build: upgrade them");
  /* no version asked for: every build, as before */
  req.version = NULL;
  assert_int_equal(mega_place(mixed, 5, &req, out, &n, &err), MEGA_OK);
  assert_int_equal(n, 3);
}

/* Half way through a rolling upgrade of many nodes: the waiting line says
 * which nodes run which build, a few names per build, in one line; nodes
 * of another build that are full or dead are not among them. */
static void other_builds_are_named_by_build(void **state) {
  (void)state;
  const mega_node_slots mixed[] = {
      {"n1", 2, true, "0.1+a"}, {"n2", 2, true, "0.1+b"}, {"n3", 2, true, "0.1+b"},
      {"n4", 2, true, "0.1+c"}, {"n5", 2, true, "0.1+b"}, {"n6", 2, true, "0.1+b"},
      {"n7", 2, true, "0.1+b"}, {"n8", 2, true, "0.1+b"}, {"n9", 0, true, "0.1+d"},
      {"n10", 2, false, "0.1+d"}, {"n11", 2, true, ""},
  };
  mega_placement_req req = {.nnodes_min = 2, .nnodes_max = 2, .nproc_per_node = 2,
                            .model_parallel = 1, .prefer = "n1", .version = "0.1+a"};
  int out[2], n = 0;
  mega_err err = {0};
  assert_int_equal(mega_place(mixed, 11, &req, out, &n, &err), MEGA_ERR_UNSUPPORTED);
  assert_string_equal(err.msg, "not enough nodes: the job needs 2 nodes with 2 free slots each, "
                               "and 1 of 10 alive nodes has them; 8 more run another build of "
                               "mega (n2, n3, n5, n6 and 2 more: 0.1+b; n4: 0.1+c; n11: "
                               "version not known), not this coordinator's 0.1+a, and a job's "
                               "ranks run one build: upgrade them");
}

static void bad_requests_are_refused(void **state) {
  (void)state;
  int out[4], n = 0;
  mega_err err = {0};
  mega_placement_req zero = {.nnodes_min = 1, .nnodes_max = 1, .nproc_per_node = 0};
  assert_int_equal(mega_place(cluster, 5, &zero, out, &n, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--nproc-per-node"));
  mega_placement_req range = {.nnodes_min = 3, .nnodes_max = 2, .nproc_per_node = 1};
  assert_int_equal(mega_place(cluster, 5, &range, out, &n, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--nnodes 3:2"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(places_on_alive_nodes_with_room),
      cmocka_unit_test(preferred_node_comes_first),
      cmocka_unit_test(world_must_divide_by_model_parallel),
      cmocka_unit_test(other_builds_are_named_by_build),
      cmocka_unit_test(too_few_nodes_says_how_many),
      cmocka_unit_test(one_build_per_job),
      cmocka_unit_test(bad_requests_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
