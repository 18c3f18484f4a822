/* An attempt that one node refuses starts no rank anywhere: every node of
 * the placement checks first (Peer PrepareLaunch), and the launches go out
 * only once all said yes. Before, the nodes that accepted started their
 * ranks, which were stopped when the refusal came in. Each case runs as a
 * test of its own (meson). */
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

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

/* Submits the tiny GPT (with extra flags, may be NULL) on two nodes of one
 * rank each to d, watches it to its end and checks that it failed with
 * every string of want in its error, and that node ok (which accepted)
 * never started a worker: no "started" line in its log, no rank log in the
 * attempt's directory. */
static void refused_everywhere(hd *d, hd *ok, const char *const *extra,
                               const char *const *want) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 5, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  spec.max_restarts = 3;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(d, id, true, 30000, &w);
  assert_non_null(w.final);
  fprintf(stderr, "refused: %s\n", w.final->error);
  assert_int_equal(w.final->state, STATE(FAILED));
  assert_int_equal(w.final->restarts, 0);
  assert_true(hd_text_ok("the job's error", w.final->error, want, NULL));
  hd_watch_free(&w);
  char log[256];
  snprintf(log, sizeof log, "%s/jobs/%s/0/rank-0.log", ok->dir, id);
  struct stat st;
  if (hd_log_has(ok, "started 1 worker") || stat(log, &st) == 0) hd_dump_log(ok);
  assert_false(hd_log_has(ok, "started 1 worker"));
  assert_int_not_equal(stat(log, &st), 0);
}

/* a2's --data-root does not hold the data: its launch check refuses, and
 * a1 (the coordinator, whose roots hold everything) starts nothing. */
static void test_refused_attempt_starts_no_rank(void **state) {
  (void)state;
  char dir[64], other[128];
  hd_tmpdir(dir, sizeof dir);
  snprintf(other, sizeof other, "%s/elsewhere", dir);
  assert_int_equal(mkdir(other, 0700), 0);
  const char *roots[] = {"--data-root", other, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "a1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "a2", 1, n1.addr, NULL, roots));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  const char *want[] = {"cannot start ranks 1..1 on node a2", "outside this megad's --data-root",
                        "no node launched a rank of the attempt", NULL};
  refused_everywhere(&n1, &n1, NULL, want);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(dir);
}

/* a2 cannot make the attempt's directory (a file is in the way of the
 * job's): an I/O error of that node, which a retry would meet again. */
static void test_node_without_its_directory(void **state) {
  (void)state;
  hd n1, n2;
  assert_true(hd_start(&n1, "d1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "d2", 1, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  char path[256];
  snprintf(path, sizeof path, "%s/jobs", n2.dir);
  assert_true(mkdir(path, 0700) == 0 || access(path, F_OK) == 0);
  snprintf(path, sizeof path, "%s/jobs/j-1-d1", n2.dir); /* the first job's id */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  const char *want[] = {"cannot start ranks 1..1 on node d2", "jobs/j-1-d1/0",
                        "no node launched a rank of the attempt", NULL};
  refused_everywhere(&n1, &n1, NULL, want);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
}

/* e2's worker program went away after its megad started (a deploy moved
 * it): its launch could not spawn, after e1's rank had started. */
static void test_node_without_its_worker(void **state) {
  (void)state;
  char dir[64], worker[128];
  hd_tmpdir(dir, sizeof dir);
  snprintf(worker, sizeof worker, "%s/megaw", dir);
  FILE *f = fopen(worker, "w");
  assert_non_null(f);
  fputs("#!/bin/sh\nexit 1\n", f);
  fclose(f);
  assert_int_equal(chmod(worker, 0755), 0);
  const char *extra[] = {"--worker", worker, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "e1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n2, "e2", 1, n1.addr, NULL, extra));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  assert_int_equal(unlink(worker), 0);
  const char *want[] = {"cannot start ranks 1..1 on node e2", "cannot run its worker", worker,
                        "no node launched a rank of the attempt", NULL};
  refused_everywhere(&n1, &n1, NULL, want);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(dir);
}

/* Writes GPT-2's vocab.json of n tokens (the last <|endoftext|>) and a
 * merges.txt into dir. */
static void write_vocab(const char *dir, int n) {
  char path[256];
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputc('{', f);
  for (int i = 0; i < n - 1; i++) fprintf(f, "\"t%d\": %d, ", i, i);
  fprintf(f, "\"<|endoftext|>\": %d}\n", n - 1);
  fclose(f);
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  assert_non_null(f = fopen(path, "w"));
  fputs("#version: 0.2\nt 0\n", f);
  fclose(f);
}

/* The nodes read another vocabulary at the same path (one machine's copy
 * of vocab.json is another version): their ranks would build embeddings of
 * other sizes, which meet in collectives of other sizes (NCCL has no check
 * of its own) or train apart. The first round compares what each node read,
 * and the job fails before any rank starts, naming both. Two machines are
 * made here by starting each megad in a directory of its own, where the
 * job's relative path (megactl would make it absolute) finds its own file. */
static void test_nodes_read_other_vocabularies(void **state) {
  (void)state;
  char dir[64], d1[128], d2[128], cwd[512];
  hd_tmpdir(dir, sizeof dir);
  snprintf(d1, sizeof d1, "%s/m1", dir);
  snprintf(d2, sizeof d2, "%s/m2", dir);
  assert_int_equal(mkdir(d1, 0700), 0);
  assert_int_equal(mkdir(d2, 0700), 0);
  write_vocab(d1, 100); /* padded to 128 rows */
  write_vocab(d2, 200); /* to 256 */
  assert_non_null(getcwd(cwd, sizeof cwd));
  hd n1, n2;
  assert_int_equal(chdir(d1), 0);
  bool up = hd_start(&n1, "w1", 1, NULL, NULL, NULL);
  assert_int_equal(chdir(d2), 0);
  up = up && hd_start(&n2, "w2", 1, n1.addr, NULL, NULL);
  assert_int_equal(chdir(cwd), 0);
  assert_true(up);
  assert_true(hd_wait_alive(&n1, 2, 10000));
  const char *bpe[] = {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "vocab.json",
                       "--merge-file", "merges.txt", NULL};
  const char *want[] = {"cannot start ranks 1..1 on node w2: its --vocab-file vocab.json holds "
                        "200 entries (<|endoftext|> 199), and node w1's 100 entries "
                        "(<|endoftext|> 99): the nodes of a job must read the same vocabulary",
                        "no node launched a rank of the attempt", NULL};
  refused_everywhere(&n1, &n1, bpe, want);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  hd_rmdir(dir);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_refused_attempt_starts_no_rank, teardown),
      cmocka_unit_test_teardown(test_node_without_its_directory, teardown),
      cmocka_unit_test_teardown(test_node_without_its_worker, teardown),
      cmocka_unit_test_teardown(test_nodes_read_other_vocabularies, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
