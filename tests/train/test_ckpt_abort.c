/* A save that an abort cuts short (worker/ckpt/ckpt_writer.h): megad
 * cancels the job, or stops it on SIGINT or SIGTERM, while the writers
 * write. Each writer's gather then fails, and the attempt's temp directory
 * goes with the save: a cancelled job has no next start to clean it, and it
 * held a checkpoint's worth of shards for ever. Writers run as threads, each
 * with its own Gloo communicator, aborted once every writer's files are
 * durable. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "ckpt_util.h"
#include "tiny_model.h"
#include "worker/ckpt/ckpt_writer.h"
#include "worker/comm/comm.h"

#define W 2

static char dir[256], save[512], rdv[512];
static tu_model m;

/* How many writers have their files on disk. */
static pthread_mutex_t durable_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t durable_cv = PTHREAD_COND_INITIALIZER;
static int ndurable;

typedef struct writer {
  int k;
  mega_comm *comm;
  bool durable;
  mega_status st;
  mega_err err;
} writer;

/* The abort comes once every writer's shards are on disk, before the
 * writers gather their file lists: the temp directory is full then. A
 * writer that aborted on its own durability alone would fail the others'
 * writes (the committer removes the directory they still write into),
 * which is another case. The wait is bounded so that a writer that never
 * gets there fails the test instead of hanging it. */
static void on_durable(void *arg, int64_t iteration, uint64_t bytes) {
  writer *w = arg;
  (void)iteration;
  (void)bytes;
  w->durable = true;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 20;
  pthread_mutex_lock(&durable_mu);
  if (++ndurable == W) pthread_cond_broadcast(&durable_cv);
  while (ndurable < W && pthread_cond_timedwait(&durable_cv, &durable_mu, &until) == 0) {
  }
  pthread_mutex_unlock(&durable_mu);
  mega_comm_abort(w->comm);
}

static void *writer_main(void *arg) {
  writer *w = arg;
  mega_store *store = NULL;
  mega_err *e = &w->err;
  mega_status st = mega_store_open_file(rdv, "writers", &store, e);
  if (st == MEGA_OK) st = mega_comm_create(store, "ckpt", w->k, W, NULL, 20000, &w->comm, e);
  mega_store_close(store);
  size_t per = (m.n + W - 1) / W, first = (size_t)w->k * per;
  size_t count = first + per < m.n ? per : m.n - first;
  mega_ckpt_writer_config wc = {.save_dir = save, .cfg = &m.cfg, .comm = w->comm, .attempt = 2,
                                .on_durable = on_durable, .arg = w};
  mega_ckpt_writer *cw = NULL;
  mega_ckpt_state s = {.iteration = 4, .consumed_samples = 16, .optimizer_steps = 4,
                       .attempt = 2};
  mega_ckpt_write_result res;
  if (st == MEGA_OK) st = mega_ckpt_writer_create(&wc, m.cp + first, count, &cw, e);
  if (st == MEGA_OK) st = mega_ckpt_writer_stage(cw, m.be, &s, e);
  if (st == MEGA_OK) st = mega_ckpt_writer_write(cw, &res, e);
  mega_ckpt_writer_destroy(cw);
  mega_comm_destroy(w->comm);
  w->st = st;
  return NULL;
}

static void test_aborted_save_leaves_no_temp(void **state) {
  (void)state;
  pthread_t t[W];
  writer w[W];
  for (int k = 0; k < W; k++) {
    w[k] = (writer){.k = k};
    assert_int_equal(pthread_create(&t[k], NULL, writer_main, &w[k]), 0);
  }
  for (int k = 0; k < W; k++) pthread_join(t[k], NULL);
  for (int k = 0; k < W; k++) {
    assert_true(w[k].durable);
    assert_int_not_equal(w[k].st, MEGA_OK);
    if (!strstr(w[k].err.msg, "iteration 4")) fail_msg("writer %d: %s", k, w[k].err.msg);
  }
  char p[700];
  snprintf(p, sizeof p, "%s/iter_0000004", save);
  assert_false(tu_exists(p));
  if (tu_count_prefix(save, ".tmp") != 0) fail_msg("a temp directory is left in %s", save);
  snprintf(p, sizeof p, "%s/latest_checkpointed_iteration.txt", save);
  assert_false(tu_exists(p));
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "ckpt-abort");
  snprintf(save, sizeof save, "%s/save", dir);
  snprintf(rdv, sizeof rdv, "%s/rdv", dir);
  assert_int_equal(mkdir(rdv, 0755), 0);
  assert_true(tu_model_make(&m, 1, 3, 0));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_model_free(&m);
  tu_rmtree(dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_aborted_save_leaves_no_temp),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
