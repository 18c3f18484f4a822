/* Groups all on this node (mega_store_group_here), whose collectives go
 * through shared memory: a peer killed in a collective, a peer that breaks
 * or destroys its communicator before or during one, a silent peer, and
 * what is left in /dev/shm. The same promises as Gloo's TCP (test_comm_fail.c). */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/comm/mp.h"

static mega_comm *open_here(const mp_env *env, const char *group, int rank, int size,
                            int timeout_ms) {
  mega_store *store = mp_store(env, false);
  if (!store) return NULL;
  mega_comm *c = NULL;
  mega_err err = {0};
  mega_status st = mega_store_group_here(store, group, &err);
  if (st == MEGA_OK) st = mega_comm_create(store, group, rank, size, NULL, timeout_ms, &c, &err);
  mega_store_close(store);
  if (st != MEGA_OK) {
    fprintf(stderr, "rank %d: creating '%s': %s: %s\n", rank, group, mega_status_str(st),
            err.msg);
    return NULL;
  }
  return c;
}

/* Entries of /dev/shm this process named (the segment's creator is rank 0). */
static int shm_files_of_mine(void) {
  char want[32];
  snprintf(want, sizeof want, "mega-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, want, strlen(want)) == 0;
  closedir(d);
  return n;
}

/* Rank 2 of 3 dies while the others are in a 4M-float all-reduce (many
 * pieces): both fail within 2.5 s with MEGA_ERR_PEER naming rank 2, and
 * every later call fails at once. */
static int body_killed(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_here(env, "dp", rank, 3, 10000);
  MP_CHECK(c, "no communicator");
  MP_CHECK(strcmp(mega_comm_transport(c), "gloo+shm") == 0, "transport %s",
           mega_comm_transport(c));
  MP_CHECK(rank != 0 || shm_files_of_mine() == 0, "the segment's name was left in /dev/shm");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 2) {
    mp_die_after_ms(300);
  }
  const size_t n = 4u << 20;
  float *buf = calloc(n, sizeof(float));
  MP_CHECK(buf, "malloc");
  double t0 = mp_now_ms();
  mega_status st = mega_comm_all_reduce(c, buf, n, 0, &err);
  double dt = mp_now_ms() - t0;
  MP_CHECK(st == MEGA_ERR_PEER, "all_reduce gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(dt < 2500, "the death took %.0f ms to notice", dt);
  MP_CHECK(strstr(err.msg, "rank 2"), "message does not name rank 2: %s", err.msg);
  mega_err later = {0};
  t0 = mp_now_ms();
  st = mega_comm_barrier(c, 0, &later);
  MP_CHECK(st == MEGA_ERR_PEER && mp_now_ms() - t0 < 100, "a later barrier gave %s: %s",
           mega_status_str(st), later.msg);
  free(buf);
  mega_comm_destroy(c);
  return 0;
}

static void *abort_after(void *p) {
  mp_sleep_ms(500);
  mega_comm_abort(p);
  return NULL;
}

/* Rank 0 is aborted from another thread during an all-reduce rank 1 never
 * joins: it ends with MEGA_ERR_CANCELLED promptly. Rank 1 then starts one
 * and hears at once that rank 0 broke the group, and why. */
static int body_abort(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_here(env, "g", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  const size_t n = 1u << 20;
  float *buf = calloc(n, sizeof(float));
  MP_CHECK(buf, "malloc");
  if (rank == 1) {
    mp_sleep_ms(1500);
    double t0 = mp_now_ms();
    mega_status st = mega_comm_all_reduce(c, buf, n, 0, &err);
    MP_CHECK(st == MEGA_ERR_PEER, "rank 1's all_reduce gave %s: %s", mega_status_str(st),
             err.msg);
    MP_CHECK(mp_now_ms() - t0 < 500, "rank 1 learned of the abort after %.0f ms",
             mp_now_ms() - t0);
    MP_CHECK(strstr(err.msg, "rank 0") && strstr(err.msg, "aborted"),
             "message does not say that rank 0 was aborted: %s", err.msg);
  } else {
    pthread_t t;
    MP_CHECK(pthread_create(&t, NULL, abort_after, c) == 0, "pthread_create");
    double t0 = mp_now_ms();
    mega_status st = mega_comm_all_reduce(c, buf, n, 0, &err);
    double dt = mp_now_ms() - t0;
    pthread_join(t, NULL);
    MP_CHECK(st == MEGA_ERR_CANCELLED, "all_reduce gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt < 1500, "all_reduce returned %.0f ms after it began (abort at 500)", dt);
  }
  free(buf);
  mega_comm_destroy(c);
  return 0;
}

/* Rank 0 destroys its communicator after a barrier; rank 1's next
 * all-reduce fails at once, naming rank 0 and why, as a closed TCP
 * connection would tell it. */
static int body_destroyed(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_here(env, "d", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_OK(mega_comm_barrier(c, 0, &err), err);
  if (rank == 0) {
    mega_comm_destroy(c);
    mp_sleep_ms(1500); /* alive: only its pidfd would not tell */
    return 0;
  }
  mp_sleep_ms(300);
  float x = 1;
  double t0 = mp_now_ms();
  mega_status st = mega_comm_all_reduce(c, &x, 1, 0, &err);
  MP_CHECK(st == MEGA_ERR_PEER, "all_reduce gave %s: %s", mega_status_str(st), err.msg);
  MP_CHECK(mp_now_ms() - t0 < 500, "took %.0f ms", mp_now_ms() - t0);
  MP_CHECK(strstr(err.msg, "rank 0") && strstr(err.msg, "destroyed"), "message: %s", err.msg);
  mega_comm_destroy(c);
  return 0;
}

/* Rank 1 is alive but never joins: rank 0's barrier times out after its
 * own 800 ms, as MEGA_ERR_TIMEOUT. */
static int body_silent(int rank, const mp_env *env) {
  mega_err err = {0};
  mega_comm *c = open_here(env, "s", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  if (rank == 1) {
    mp_sleep_ms(2500);
  } else {
    double t0 = mp_now_ms();
    mega_status st = mega_comm_barrier(c, 800, &err);
    double dt = mp_now_ms() - t0;
    MP_CHECK(st == MEGA_ERR_TIMEOUT, "barrier gave %s: %s", mega_status_str(st), err.msg);
    MP_CHECK(dt > 700 && dt < 2000, "barrier timed out after %.0f ms, not about 800", dt);
  }
  mega_comm_destroy(c);
  return 0;
}

/* MEGA_COMM_SHM=0 keeps a group on Gloo's TCP even when marked here: set
 * on every rank (*arg -1), or on one rank only (*arg that rank), which
 * stands for a rank that cannot map the segment: the others agree. */
static int body_off(int rank, const mp_env *env) {
  mega_err err = {0};
  int who = *(const int *)env->arg;
  if (who < 0 || who == rank) setenv("MEGA_COMM_SHM", "0", 1);
  mega_comm *c = open_here(env, "off", rank, 2, 10000);
  MP_CHECK(c, "no communicator");
  MP_CHECK(strcmp(mega_comm_transport(c), "gloo") == 0, "transport %s", mega_comm_transport(c));
  float x = (float)rank + 1;
  MP_OK(mega_comm_all_reduce(c, &x, 1, 0, &err), err);
  MP_CHECK(x == 3.0f, "sum %g", x);
  mega_comm_destroy(c);
  return 0;
}

static void test_killed_in_all_reduce(void **state) {
  (void)state;
  assert_int_equal(mp_run(3, body_killed, NULL, 15000, 1u << 2), 0);
}

static void test_abort_breaks_the_group(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_abort, NULL, 15000, 0), 0);
}

static void test_destroyed_peer(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_destroyed, NULL, 15000, 0), 0);
}

static void test_silent_peer_times_out(void **state) {
  (void)state;
  assert_int_equal(mp_run(2, body_silent, NULL, 15000, 0), 0);
}

static void test_switched_off(void **state) {
  (void)state;
  int all = -1, one = 1, root = 0;
  assert_int_equal(mp_run(2, body_off, &all, 15000, 0), 0);
  assert_int_equal(mp_run(2, body_off, &one, 15000, 0), 0);
  assert_int_equal(mp_run(2, body_off, &root, 15000, 0), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_in_all_reduce),
      cmocka_unit_test(test_abort_breaks_the_group),
      cmocka_unit_test(test_destroyed_peer),
      cmocka_unit_test(test_silent_peer_times_out),
      cmocka_unit_test(test_switched_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
