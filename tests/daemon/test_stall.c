/* The base's stall measure (daemon/base.h, stalls) on a real loop: a
 * callback that blocks the loop, and the process stopped (SIGSTOP from a
 * child) while the loop waits in its poll. Each is one stall of about its
 * length, heard once; silence measured across it does not count it; a loop
 * that merely waits for its timers has none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/base.h"

typedef struct fx {
  uv_loop_t loop;
  megad_base b;
  char dir[64];
  int stalls;
  uint64_t stall_ms;
  uint64_t since;    /* uv_now before the stall */
  uint64_t quiet;    /* megad_quiet_ms(since) once it is over */
  uint64_t recent;   /* megad_stall_recent then */
  int ticks;
  pid_t child;
} fx;

static void on_stall(void *arg, uint64_t ms) {
  fx *f = arg;
  f->stalls++;
  f->stall_ms = ms;
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/mega-stall-XXXXXX");
  if (!f || !mkdtemp(f->dir) || uv_loop_init(&f->loop)) return -1;
  mega_err err = {0};
  if (megad_base_init(&f->b, &f->loop, "s1", f->dir, true, &err) != MEGA_OK) return -1;
  megad_base_on_stall(&f->b, on_stall, f);
  *state = f;
  return 0;
}

static void cq_closed(void *arg) { (void)arg; }

static int teardown(void **state) {
  fx *f = *state;
  megad_base_close_cq(&f->b, cq_closed, NULL);
  uv_run(&f->loop, UV_RUN_DEFAULT); /* until the queue has drained */
  megad_base_free(&f->b);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&f->loop);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system(cmd)) rc = -1;
  free(f);
  return rc;
}

/* every 50 ms: at tick 4 (blocking) or 3 (stopped) the stall starts; two
 * ticks after it, what silence measures; tick 12 ends the run */
static void on_tick(uv_timer_t *t) {
  fx *f = t->data;
  f->ticks++;
  if (f->ticks == 3) f->since = uv_now(&f->loop);
  if (f->ticks == 4 && !f->child) usleep(800 * 1000); /* a call that blocks the loop */
  if (f->ticks == 6) {
    f->quiet = megad_quiet_ms(&f->b, f->since);
    f->recent = megad_stall_recent(&f->b, 1000, NULL);
  }
  if (f->ticks == 12) {
    uv_timer_stop(t);
    uv_stop(&f->loop); /* the completion queue keeps the loop alive */
  }
}

static void run_ticks(fx *f) {
  uv_timer_t t;
  uv_timer_init(&f->loop, &t);
  t.data = f;
  uv_timer_start(&t, on_tick, 50, 50);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&f->loop, UV_RUN_NOWAIT);
}

static void check_one_stall(const fx *f) {
  fprintf(stderr, "stall of %llu ms heard %d time(s); quiet across it %llu ms\n",
          (unsigned long long)f->stall_ms, f->stalls, (unsigned long long)f->quiet);
  assert_int_equal(f->stalls, 1);
  /* a lower bound: a poll's wait counts up to the base's tick (250 ms) */
  assert_true(f->stall_ms >= 800 - 250 && f->stall_ms < 5000);
  assert_true(f->quiet < 500); /* two ticks' worth, not the stall's 800 ms */
  assert_int_equal(f->recent, f->stall_ms);
}

static void test_blocking_call_is_a_stall(void **state) {
  fx *f = *state;
  run_ticks(f);
  check_one_stall(f);
}

static void test_stopped_process_is_a_stall(void **state) {
  fx *f = *state;
  pid_t parent = getpid();
  f->child = fork();
  assert_true(f->child >= 0);
  if (f->child == 0) { /* stop the parent mid-wait (ticks are 50 ms apart), for 800 ms */
    usleep(125 * 1000);
    kill(parent, SIGSTOP);
    usleep(800 * 1000);
    kill(parent, SIGCONT);
    _exit(0);
  }
  run_ticks(f);
  int st;
  waitpid(f->child, &st, 0);
  check_one_stall(f);
}

static void stop_loop(uv_timer_t *t) { uv_stop(t->loop); }

static void test_waiting_is_no_stall(void **state) {
  fx *f = *state;
  uv_timer_t t;
  uv_timer_init(&f->loop, &t);
  uv_timer_start(&t, stop_loop, 900, 0); /* one long, honest wait */
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(f->stalls, 0);
  assert_int_equal(megad_stall_recent(&f->b, 10000, NULL), 0);
}

int main(void) {
  alarm(60); /* a loop that never ends fails the test rather than hang it */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_blocking_call_is_a_stall, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stopped_process_is_a_stall, setup, teardown),
      cmocka_unit_test_setup_teardown(test_waiting_is_no_stall, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
