/* A stretch of a rank's step that an abort from another thread lets
 * finish, up to a grace, before it breaks the communicators.
 *
 * The norm's last sums (over TP and the pipeline) act as barriers: a rank
 * past them steps. An abort that breaks one while it runs can let some
 * members complete it and others not, so the survivors of one failure hold
 * different iterations, which no replica plan can join. Inside the guard an
 * abort waits until the members are through (they are alive and already on
 * their way) or a peer's failure ends the collective, at most the grace
 * (a hung peer). Once closed, the guard lets no one in.
 *
 * Threads: enter and leave on the training thread, close on any other. */
#ifndef MEGA_WORKER_ABORT_GUARD_H
#define MEGA_WORKER_ABORT_GUARD_H

#include <pthread.h>
#include <stdbool.h>

typedef struct mega_abort_guard {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  bool inside, closed;
} mega_abort_guard;

void mega_abort_guard_init(mega_abort_guard *g);
void mega_abort_guard_destroy(mega_abort_guard *g);

/* false when closed: the rank is aborting, the stretch must not begin. */
bool mega_abort_guard_enter(mega_abort_guard *g);
void mega_abort_guard_leave(mega_abort_guard *g);

/* Closes the guard and waits until no one is inside, at most grace_ms;
 * false when the grace ran out first. */
bool mega_abort_guard_close(mega_abort_guard *g, int grace_ms);

#endif
