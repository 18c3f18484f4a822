/* The communicator in one process: argument checks, store errors, and a
 * group of one rank (collectives degenerate to copies; no P2P peer). */
#include <dirent.h>
#include <ftw.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/comm/comm.h"

static char dir[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/mega-comm-unit-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  return nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static mega_comm *solo(const char *prefix, const char *group) {
  mega_store *s = NULL;
  mega_err err = {0};
  assert_int_equal(mega_store_open_file(dir, prefix, &s, &err), MEGA_OK);
  mega_comm *c = NULL;
  mega_status st = mega_comm_create(s, group, 0, 1, NULL, 5000, &c, &err);
  mega_store_close(s);
  if (st != MEGA_OK) fail_msg("create: %s", err.msg);
  return c;
}

static void test_store_errors(void **state) {
  (void)state;
  mega_store *s = (mega_store *)&s;
  mega_err err = {0};
  assert_int_equal(mega_store_open_file("/nonexistent/mega", "p", &s, &err),
                   MEGA_ERR_NOT_FOUND);
  assert_null(s);
  assert_non_null(strstr(err.msg, "/nonexistent/mega"));
  assert_int_equal(mega_store_open_file(dir, "", &s, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_store_open_file(dir, NULL, &s, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_store_open_file(dir, "p", NULL, &err), MEGA_ERR_INVALID);
  mega_kv_ops half = {0};
  assert_int_equal(mega_store_open_kv(&half, NULL, "p", &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "set, get and wait"));
  assert_int_equal(mega_store_open_kv(NULL, NULL, "p", &s, &err), MEGA_ERR_INVALID);
  mega_store_close(NULL);
}

static void test_create_errors(void **state) {
  (void)state;
  mega_store *s = NULL;
  mega_comm *c = (mega_comm *)&c;
  mega_err err = {0};
  assert_int_equal(mega_store_open_file(dir, "create-errors", &s, &err), MEGA_OK);
  assert_int_equal(mega_comm_create(NULL, "g", 0, 1, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_null(c);
  assert_int_equal(mega_comm_create(s, "", 0, 1, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_create(s, NULL, 0, 1, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_create(s, "g", 2, 2, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "rank 2"));
  assert_int_equal(mega_comm_create(s, "g", -1, 2, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_create(s, "g", 0, 0, NULL, 1000, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_create(s, "g", 0, 1, NULL, 0, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_create(s, "g", 0, 1, NULL, 1000, NULL, &err), MEGA_ERR_INVALID);
  assert_null(c);
  /* An address of no interface here (TEST-NET-1) cannot be bound. */
  assert_int_equal(mega_comm_create(s, "g", 0, 1, "192.0.2.1", 1000, &c, &err), MEGA_ERR_IO);
  assert_null(c);
  assert_non_null(strstr(err.msg, "192.0.2.1"));
  mega_store_close(s);
  mega_comm_destroy(NULL);
}

/* A group of one: every collective is a copy or nothing. */
static void test_single_rank_collectives(void **state) {
  (void)state;
  mega_comm *c = solo("single", "g");
  mega_err err = {0};
  assert_int_equal(mega_comm_rank(c), 0);
  assert_int_equal(mega_comm_size(c), 1);

  float buf[5] = {1, 2, 3, 4, 5};
  assert_int_equal(mega_comm_all_reduce(c, buf, 5, 0, &err), MEGA_OK);
  assert_true(buf[0] == 1 && buf[4] == 5);
  assert_int_equal(mega_comm_all_reduce(c, NULL, 0, 0, &err), MEGA_OK);

  float out[5] = {0};
  size_t counts[1] = {5};
  assert_int_equal(mega_comm_all_gather(c, buf, out, counts, MEGA_DT_F32, 0, &err), MEGA_OK);
  assert_memory_equal(out, buf, sizeof buf);
  memset(out, 0, sizeof out);
  assert_int_equal(mega_comm_reduce_scatter(c, buf, out, counts, 0, &err), MEGA_OK);
  assert_memory_equal(out, buf, sizeof buf);
  assert_int_equal(mega_comm_broadcast(c, buf, 5, MEGA_DT_F32, 0, 0, &err), MEGA_OK);
  assert_true(buf[2] == 3);
  assert_int_equal(mega_comm_barrier(c, 0, &err), MEGA_OK);

  mega_req *r = NULL;
  bool done = false;
  assert_int_equal(mega_comm_iall_reduce(c, buf, 5, 0, &r, &err), MEGA_OK);
  for (int i = 0; i < 5000 && !done; i++) {
    assert_int_equal(mega_req_test(r, &done, &err), MEGA_OK);
    if (!done) usleep(1000);
  }
  assert_true(done);
  assert_int_equal(mega_req_wait(r, 0, &err), MEGA_OK);
  mega_req_free(r);
  assert_int_equal(mega_comm_status(c, &err), MEGA_OK);
  mega_comm_destroy(c);
}

static void test_bad_arguments(void **state) {
  (void)state;
  mega_comm *c = solo("bad-args", "g");
  mega_err err = {0};
  mega_req *r = (mega_req *)&r;
  char b[8];
  assert_int_equal(mega_comm_isend(c, b, 8, 0, 0, &r, &err), MEGA_ERR_INVALID);
  assert_null(r);
  assert_non_null(strstr(err.msg, "peer rank 0"));
  assert_int_equal(mega_comm_irecv(c, b, 8, 1, 0, &r, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_isend(NULL, b, 8, 1, 0, &r, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_isend(c, b, 8, 1, 0, NULL, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_all_reduce(c, NULL, 3, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_broadcast(c, b, 8, MEGA_DT_BYTE, 1, 0, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "root 1"));
  assert_int_equal(mega_comm_broadcast(c, b, 8, (mega_dtype)7, 0, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_comm_all_gather(c, b, b, NULL, MEGA_DT_BYTE, 0, &err), MEGA_ERR_INVALID);
  float x[4] = {0};
  size_t counts[1] = {2};
  assert_int_equal(mega_comm_reduce_scatter(c, x, x + 1, counts, 0, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "overlaps"));
  assert_int_equal(mega_req_wait(NULL, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_req_test(NULL, NULL, &err), MEGA_ERR_INVALID);
  mega_req_free(NULL);
  /* Bad arguments do not break the communicator. */
  assert_int_equal(mega_comm_status(c, &err), MEGA_OK);
  mega_comm_destroy(c);
}

/* Keys are write-once: a group name cannot be reused under one prefix. */
static void test_group_name_reused(void **state) {
  (void)state;
  mega_comm *c = solo("reuse", "g");
  mega_store *s = NULL;
  mega_err err = {0};
  assert_int_equal(mega_store_open_file(dir, "reuse", &s, &err), MEGA_OK);
  mega_comm *c2 = NULL;
  assert_int_equal(mega_comm_create(s, "g", 0, 1, NULL, 2000, &c2, &err), MEGA_ERR_INVALID);
  assert_null(c2);
  assert_non_null(strstr(err.msg, "new store prefix"));
  mega_store_close(s);
  mega_comm_destroy(c);
}

static void test_abort_is_final(void **state) {
  (void)state;
  mega_comm *c = solo("abort", "g");
  mega_err err = {0};
  mega_comm_abort(c);
  mega_comm_abort(c);
  float x = 1;
  assert_int_equal(mega_comm_all_reduce(c, &x, 1, 0, &err), MEGA_ERR_CANCELLED);
  assert_non_null(strstr(err.msg, "aborted"));
  mega_req *r = NULL;
  assert_int_equal(mega_comm_ibarrier(c, 0, &r, &err), MEGA_ERR_CANCELLED);
  assert_null(r);
  assert_int_equal(mega_comm_status(c, &err), MEGA_ERR_CANCELLED);
  mega_comm_destroy(c);
}

/* This process's threads under SCHED_BATCH. */
static int batch_threads(void) {
  DIR *d = opendir("/proc/self/task");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.' && sched_getscheduler(atoi(e->d_name)) == SCHED_BATCH) n++;
  closedir(d);
  return n;
}

/* Gloo's event loop runs without wakeup preemption (a loop woken by a write
 * preempted the sender holding its pair's lock, then spun: gloo_device.cc);
 * the thread that made the communicator keeps its own policy. */
static void test_loop_thread_is_batch(void **state) {
  (void)state;
  int before = batch_threads();
  mega_comm *a = solo("batch", "a");
  assert_int_equal(batch_threads(), before + 1);
  mega_comm *b = solo("batch", "b");
  assert_int_equal(batch_threads(), before + 2);
  assert_int_equal(sched_getscheduler(0), SCHED_OTHER);
  mega_comm_destroy(a);
  mega_comm_destroy(b);
  assert_int_equal(batch_threads(), before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store_errors),
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_single_rank_collectives),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_group_name_reused),
      cmocka_unit_test(test_abort_is_final),
      cmocka_unit_test(test_loop_thread_is_batch),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
