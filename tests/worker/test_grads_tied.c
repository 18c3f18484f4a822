/* The tied embedding's exchange (worker/engine/grads_tied.c) with real
 * ranks as threads: PP 2 x DP 2 over Gloo on loopback. Each rank fills its
 * gradients with known small integers (so every sum is exact in fp32),
 * runs the buckets' reductions and the exchange, and checks everything it
 * owns: each parameter's gradient is the sum over DP, and wte's, on both
 * stages, the sum over DP and both stages; with and without the
 * distributed optimizer, overlap and average_in_collective, over two
 * iterations (the embedding group's order across them). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "worker/comm/comm.h"
#include "worker/engine/grads.h"

enum { PP = 2, DP = 2, ITERS = 2 };

typedef struct config {
  bool overlap, distributed, average;
  const char *dir; /* the rendezvous */
} config;

typedef struct rank_arg {
  const config *cfg;
  int s, d; /* stage, data-parallel rank */
  mega_status st;
  char msg[512];
  size_t checked, tied_checked; /* elements */
  bool timed;                   /* the exchange reported its times */
} rank_arg;

/* Rank (s, d)'s gradient of element e of a tensor in iteration it. */
static float value(int s, int d, int it, size_t e) {
  return (float)((int)(e % 13) + 16 * d + 64 * s + 256 * it);
}

/* The sum over DP (and over both stages for wte), scaled as the
 * reduction scales it. */
static float expected(const config *c, int s, int it, size_t e, bool tied) {
  double sum = 0;
  for (int d = 0; d < DP; d++)
    for (int k = 0; k < PP; k++)
      if (tied || k == s) sum += value(k, d, it, e);
  return (float)(c->average ? sum / DP : sum);
}

static mega_status fail_at(rank_arg *a, const char *what, size_t i, float got, float want) {
  snprintf(a->msg, sizeof a->msg, "stage %d dp %d: %s element %zu is %g, not %g", a->s, a->d,
           what, i, got, want);
  return MEGA_ERR_INTERNAL;
}

/* Everything this rank's optimizer steps: its shards (distributed) or all. */
static mega_status check(rank_arg *a, mega_grads *g, mega_gpt_stage *stage, int it) {
  int np;
  const mega_param_info *p = mega_gpt_params(stage, &np);
  size_t nr;
  const mega_optim_range *r = mega_grads_ranges(g, &nr);
  const mega_grads_piece *pc = mega_grads_pieces(g, &nr);
  for (size_t i = 0; i < nr; i++) {
    bool tied = p[pc[i].param].tied_embedding;
    for (size_t k = 0; k < r[i].numel; k++) {
      size_t e = pc[i].elem + k;
      float want = expected(a->cfg, a->s, it, e, tied);
      if (r[i].grads[k] != want) return fail_at(a, p[pc[i].param].name, e, r[i].grads[k], want);
      a->checked++;
      a->tied_checked += tied;
    }
  }
  return MEGA_OK;
}

static void fill(mega_gpt_stage *stage, int s, int d, int it) {
  int np;
  const mega_param_info *p = mega_gpt_params(stage, &np);
  float *grads = mega_gpt_grad_data(stage);
  for (int i = 0; i < np; i++)
    for (size_t e = 0; e < p[i].numel; e++) grads[p[i].offset + e] = value(s, d, it, e);
}

/* One iteration's gradient sync: readiness-driven with overlap (as the
 * last backward reports its units, back to front), else the GS. The loss
 * stage's second replica comes late, so the embedding stage really waits
 * for its copy. */
static mega_status sync_grads(rank_arg *a, mega_grads *g, mega_gpt_stage *stage, mega_err *err) {
  if (a->s == 1 && a->d == 1) nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);
  if (a->cfg->overlap) {
    int np;
    mega_gpt_params(stage, &np);
    mega_grads_enable(g, 0, true);
    for (int i = np - 1; i >= 0; i--) mega_grads_ready(g, 0, i, 1);
    mega_grads_enable(g, 0, false);
  }
  mega_status st = mega_grads_launch(g, 0, err);
  if (st == MEGA_OK) st = mega_grads_wait(g, 0, err);
  if (st == MEGA_OK) st = mega_grads_wait_tied(g, err);
  return st;
}

static mega_status run_rank(rank_arg *a, mega_backend *be, mega_err *err) {
  mega_gpt_config mc;
  fx_config(&mc, 0.2f);
  mega_gpt_stage_desc desc = a->s == 0 ? (mega_gpt_stage_desc){true, false, 0, 1}
                                       : (mega_gpt_stage_desc){false, true, 1, 1};
  mega_gpt_stage *stage = NULL;
  mega_grads *g = NULL;
  mega_store *store = NULL;
  mega_comm *dp = NULL, *embd = NULL;
  mega_grads_opts o = {.dp_size = DP, .dp_rank = a->d, .overlap = a->cfg->overlap,
                       .distributed = a->cfg->distributed,
                       .average_in_collective = a->cfg->average, .bucket_size = 2000};
  char name[32];
  mega_status st = mega_gpt_stage_create(be, &mc, &desc, &stage, err);
  if (st == MEGA_OK) st = mega_grads_create(be, &stage, 1, &o, &g, err);
  if (st == MEGA_OK) st = mega_store_open_file(a->cfg->dir, "tied", &store, err);
  snprintf(name, sizeof name, "dp%d", a->s);
  if (st == MEGA_OK) st = mega_comm_create(store, name, a->d, DP, NULL, 20000, &dp, err);
  snprintf(name, sizeof name, "embd%d", a->d);
  if (st == MEGA_OK) st = mega_comm_create(store, name, a->s, PP, NULL, 20000, &embd, err);
  if (st == MEGA_OK) {
    mega_grads_set_comm(g, dp, NULL);
    st = mega_grads_set_tied_comm(g, embd, err);
  }
  for (int it = 0; it < ITERS && st == MEGA_OK; it++) {
    st = mega_grads_start(g, err);
    if (st != MEGA_OK) break;
    mega_grads_zero(g, SIZE_MAX);
    fill(stage, a->s, a->d, it);
    st = sync_grads(a, g, stage, err);
    if (st == MEGA_OK) st = check(a, g, stage, it);
    size_t floats;
    const mega_grads_timing *t = mega_grads_tied_timing(g, &floats);
    a->timed = t->launched > 0 && (t->waited > 0 || t->done > 0) && floats > 0;
  }
  mega_grads_destroy(g);
  mega_comm_destroy(embd);
  mega_comm_destroy(dp);
  mega_store_close(store);
  mega_gpt_stage_destroy(stage);
  return st;
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  mega_backend *be = NULL;
  mega_err err = {0};
  a->st = mega_backend_cpu_create(NULL, &be, &err);
  if (a->st == MEGA_OK) a->st = run_rank(a, be, &err);
  if (a->st != MEGA_OK && !a->msg[0]) snprintf(a->msg, sizeof a->msg, "%s", err.msg);
  mega_backend_destroy(be);
  return NULL;
}

static void run_config(bool overlap, bool distributed, bool average) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/mega_tied_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  assert_non_null(mkdtemp(dir));
  config c = {overlap, distributed, average, dir};
  rank_arg a[PP * DP];
  pthread_t t[PP * DP];
  for (int k = 0; k < PP * DP; k++) {
    a[k] = (rank_arg){.cfg = &c, .s = k / DP, .d = k % DP};
    assert_int_equal(pthread_create(&t[k], NULL, rank_main, &a[k]), 0);
  }
  for (int k = 0; k < PP * DP; k++) pthread_join(t[k], NULL);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) print_message("could not remove %s\n", dir);
  for (int k = 0; k < PP * DP; k++) {
    if (a[k].st != MEGA_OK) fail_msg("overlap %d distributed %d: %s", overlap, distributed,
                                     a[k].msg);
    assert_true(a[k].checked > 0);
    assert_true(a[k].tied_checked > 0); /* each rank owns part of the total */
    assert_true(a[k].timed);
  }
}

static void total_without_overlap(void **state) {
  (void)state;
  run_config(false, false, false);
}

static void total_with_overlap(void **state) {
  (void)state;
  run_config(true, false, false);
}

static void total_shards_distributed(void **state) {
  (void)state;
  run_config(true, true, false);
  run_config(false, true, false);
}

static void total_averaged_in_collective(void **state) {
  (void)state;
  run_config(true, true, true);
  run_config(true, false, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(total_without_overlap),
      cmocka_unit_test(total_with_overlap),
      cmocka_unit_test(total_shards_distributed),
      cmocka_unit_test(total_averaged_in_collective),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
