/* The abort guard (worker/rank/abort_guard.h): an abort waits for the
 * stretch a rank is in to end, at most its grace, and lets no one in after.
 * A thread plays the training thread: it enters, stays for a while, leaves. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/rank/abort_guard.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct inside {
  mega_abort_guard *g;
  int stay_ms;            /* < 0: until told to go */
  volatile int entered, go;
  double left_at;
} inside;

static void *stay(void *arg) {
  inside *in = arg;
  if (!mega_abort_guard_enter(in->g)) return NULL;
  in->entered = 1;
  if (in->stay_ms >= 0) usleep((useconds_t)in->stay_ms * 1000);
  else
    while (!in->go) usleep(1000);
  in->left_at = now_ms();
  mega_abort_guard_leave(in->g);
  return NULL;
}

static void start(pthread_t *t, inside *in) {
  pthread_create(t, NULL, stay, in);
  while (!in->entered) usleep(1000);
}

/* The stretch ends within the grace: the abort returns when it does. */
static void waits_for_the_stretch(void **state) {
  (void)state;
  mega_abort_guard g;
  mega_abort_guard_init(&g);
  inside in = {.g = &g, .stay_ms = 150};
  pthread_t t;
  start(&t, &in);
  assert_true(mega_abort_guard_close(&g, 60000)); /* the stretch ended first */
  assert_true(now_ms() >= in.left_at);            /* and it was waited for */
  pthread_join(t, NULL);
  assert_false(mega_abort_guard_enter(&g)); /* closed: no new stretch */
  mega_abort_guard_destroy(&g);
}

/* A stretch that outlasts the grace (a hung peer): the abort goes on. */
static void gives_up_after_the_grace(void **state) {
  (void)state;
  mega_abort_guard g;
  mega_abort_guard_init(&g);
  inside in = {.g = &g, .stay_ms = -1};
  pthread_t t;
  start(&t, &in);
  double t0 = now_ms();
  assert_false(mega_abort_guard_close(&g, 100));
  assert_true(now_ms() - t0 >= 99); /* it did wait the grace */
  in.go = 1;
  pthread_join(t, NULL);
  mega_abort_guard_destroy(&g);
}

/* Nobody inside: the abort does not wait. */
static void nobody_inside(void **state) {
  (void)state;
  mega_abort_guard g;
  mega_abort_guard_init(&g);
  assert_true(mega_abort_guard_enter(&g));
  mega_abort_guard_leave(&g);
  double t0 = now_ms();
  assert_true(mega_abort_guard_close(&g, 60000));
  assert_true(now_ms() - t0 < 30000); /* far from the grace: it did not wait */
  mega_abort_guard_destroy(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(waits_for_the_stretch),
      cmocka_unit_test(gives_up_after_the_grace),
      cmocka_unit_test(nobody_inside),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
