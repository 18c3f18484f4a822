#include "worker/rank/abort_guard.h"

#include <time.h>

void mega_abort_guard_init(mega_abort_guard *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* a wall clock step must not cut the grace */
  pthread_cond_init(&g->cv, &a);
  pthread_condattr_destroy(&a);
  g->inside = g->closed = false;
}

void mega_abort_guard_destroy(mega_abort_guard *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

bool mega_abort_guard_enter(mega_abort_guard *g) {
  pthread_mutex_lock(&g->mu);
  bool ok = !g->closed;
  if (ok) g->inside = true;
  pthread_mutex_unlock(&g->mu);
  return ok;
}

void mega_abort_guard_leave(mega_abort_guard *g) {
  pthread_mutex_lock(&g->mu);
  g->inside = false;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

bool mega_abort_guard_close(mega_abort_guard *g, int grace_ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += grace_ms / 1000;
  until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&g->mu);
  g->closed = true;
  int rc = 0;
  while (g->inside && rc == 0) rc = pthread_cond_timedwait(&g->cv, &g->mu, &until);
  bool out = !g->inside;
  pthread_mutex_unlock(&g->mu);
  return out;
}
