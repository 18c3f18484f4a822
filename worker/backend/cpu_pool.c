/* The cpu backend's worker threads: threads - 1 helpers that sleep on a
 * condition variable between jobs (no spinning: the cores are shared with
 * other workers). A job is cut into more chunks than threads and every
 * participant, the caller included, claims chunks until none are left, so a
 * helper that another process keeps off its core delays nothing: the
 * others take its share. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "worker/backend/cpu_internal.h"

#define CHUNKS_PER_THREAD 4

struct mega_cpu_pool {
  int threads; /* helpers + the caller */
  pthread_t *helpers;
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  bool stop;
  /* the current job; its fields change only under mu while active == 0 */
  uint64_t generation;
  mega_cpu_task fn;
  void *ctx;
  int64_t n, chunk, nchunks;
  atomic_int_fast64_t next;     /* next chunk to claim */
  atomic_int_fast64_t finished; /* chunks done */
  int active;                   /* helpers inside the job (under mu) */
};

/* Claims and runs chunks; returns whether this call finished the last. */
static bool work(mega_cpu_pool *p) {
  bool last = false;
  for (;;) {
    int64_t k = atomic_fetch_add(&p->next, 1);
    if (k >= p->nchunks) break;
    int64_t b = k * p->chunk, e = b + p->chunk < p->n ? b + p->chunk : p->n;
    p->fn(p->ctx, b, e);
    if (atomic_fetch_add(&p->finished, 1) + 1 == p->nchunks) last = true;
  }
  return last;
}

static void *helper_main(void *arg) {
  mega_cpu_pool *p = arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->generation == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) break;
    seen = p->generation;
    if (atomic_load(&p->next) >= p->nchunks) continue; /* woke too late: nothing left */
    p->active++;
    pthread_mutex_unlock(&p->mu);
    work(p);
    pthread_mutex_lock(&p->mu);
    p->active--;
    pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

mega_status mega_cpu_pool_create(int threads, mega_cpu_pool **out, mega_err *err) {
  *out = NULL;
  if (threads <= 1) return MEGA_OK;
  mega_cpu_pool *p = calloc(1, sizeof *p);
  if (!p || !(p->helpers = calloc((size_t)threads, sizeof *p->helpers))) {
    free(p);
    return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: out of memory for threads");
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  atomic_init(&p->next, 0);
  atomic_init(&p->finished, 0);
  p->threads = 1;
  for (int i = 1; i < threads; i++) {
    if (pthread_create(&p->helpers[i], NULL, helper_main, p) != 0) {
      mega_cpu_pool_destroy(p);
      return mega_fail(err, MEGA_ERR_NOMEM, "cpu backend: cannot start thread %d of %d", i,
                       threads);
    }
    p->threads++;
  }
  *out = p;
  return MEGA_OK;
}

void mega_cpu_pool_destroy(mega_cpu_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->threads; i++) pthread_join(p->helpers[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  free(p->helpers);
  free(p);
}

int mega_cpu_pool_threads(const mega_cpu_pool *p) { return p ? p->threads : 1; }

void mega_cpu_parallel_for(mega_cpu_pool *p, int64_t n, int64_t grain, mega_cpu_task fn,
                           void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = p ? (int64_t)p->threads * CHUNKS_PER_THREAD : 1;
  if (n / grain < chunks) chunks = n / grain;
  if (chunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n + chunks - 1) / chunks;
  p->nchunks = (n + p->chunk - 1) / p->chunk;
  atomic_store(&p->next, 0);
  atomic_store(&p->finished, 0);
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  work(p);
  /* every chunk done and every helper out, before the job can change */
  pthread_mutex_lock(&p->mu);
  while (atomic_load(&p->finished) < p->nchunks || p->active > 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
