/* The cpu backend's worker threads: threads - 1 helpers that sleep on a
 * condition variable between jobs (no spinning: the cores are shared with
 * OpenBLAS's threads and other workers). */
#include <pthread.h>
#include <stdlib.h>

#include "worker/backend/cpu_internal.h"

struct mega_cpu_pool {
  int threads; /* helpers + the caller */
  pthread_t *helpers;
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  uint64_t generation; /* bumped per job */
  int pending;         /* helpers still running the current job */
  bool stop;
  /* the current job */
  mega_cpu_task fn;
  void *ctx;
  int64_t n, chunk;
};

typedef struct helper_arg {
  mega_cpu_pool *p;
  int index; /* 1 .. threads-1; the caller runs chunk 0 */
} helper_arg;

static void run_chunk(mega_cpu_pool *p, int index) {
  int64_t b = index * p->chunk, e = b + p->chunk;
  if (e > p->n) e = p->n;
  if (b < e) p->fn(p->ctx, b, e);
}

static void *helper_main(void *arg) {
  helper_arg a = *(helper_arg *)arg;
  free(arg);
  mega_cpu_pool *p = a.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->generation == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) break;
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, a.index);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
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
  p->threads = 1;
  for (int i = 1; i < threads; i++) {
    helper_arg *a = malloc(sizeof *a);
    if (a) *a = (helper_arg){p, i};
    int rc = a ? pthread_create(&p->helpers[i], NULL, helper_main, a) : -1;
    if (rc != 0) {
      free(a);
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
  int parts = p ? p->threads : 1;
  if (grain < 1) grain = 1;
  if (n / grain < parts) parts = (int)(n / grain);
  if (parts <= 1) {
    fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n + parts - 1) / parts;
  /* helpers whose chunk is empty return at once */
  p->pending = p->threads - 1;
  p->generation++;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_chunk(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
