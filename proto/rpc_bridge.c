#include "proto/rpc_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct cq_event {
  mega_rpc_tag *tag;
  bool ok;
} cq_event;

struct mega_rpc_cq {
  uv_loop_t *loop;
  grpc_completion_queue *cq;
  uv_async_t async;
  uv_thread_t thread;

  uv_mutex_t mu; /* guards the fields below: the thread pushes, the loop swaps */
  cq_event *fifo;
  size_t n, cap;
  bool drained;  /* the thread saw GRPC_QUEUE_SHUTDOWN and exits */

  cq_event *spare; /* the loop's half of the double buffer */
  size_t spare_cap;
  bool closing;
  void (*done)(void *);
  void *done_arg;
};

static void cq_thread(void *arg) {
  mega_rpc_cq *q = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(q->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
    bool last = ev.type == GRPC_QUEUE_SHUTDOWN;
    uv_mutex_lock(&q->mu);
    if (last) {
      q->drained = true;
    } else {
      if (q->n == q->cap) {
        /* Growing cannot fail quietly: a lost tag would leak its call. */
        size_t cap = q->cap ? 2 * q->cap : 64;
        cq_event *f = realloc(q->fifo, cap * sizeof *f);
        while (!f) {
          uv_mutex_unlock(&q->mu);
          uv_sleep(1);
          uv_mutex_lock(&q->mu);
          f = realloc(q->fifo, cap * sizeof *f);
        }
        q->fifo = f;
        q->cap = cap;
      }
      q->fifo[q->n++] = (cq_event){ev.tag, ev.success != 0};
    }
    uv_mutex_unlock(&q->mu);
    uv_async_send(&q->async);
    if (last) return;
  }
}

static void cq_closed(uv_handle_t *h) {
  mega_rpc_cq *q = MEGA_RPC_CONTAINER(h, mega_rpc_cq, async);
  void (*done)(void *) = q->done;
  void *arg = q->done_arg;
  uv_mutex_destroy(&q->mu);
  free(q->fifo);
  free(q->spare);
  free(q);
  mega_rpc_lib_unref();
  if (done) done(arg);
}

static void cq_wakeup(uv_async_t *a) {
  mega_rpc_cq *q = MEGA_RPC_CONTAINER(a, mega_rpc_cq, async);
  for (;;) {
    /* Swap buffers so callbacks run without the lock (they post new ops,
     * whose completions the thread pushes meanwhile). */
    uv_mutex_lock(&q->mu);
    cq_event *batch = q->fifo;
    size_t n = q->n, cap = q->cap;
    bool drained = q->drained;
    q->fifo = q->spare;
    q->cap = q->spare_cap;
    q->n = 0;
    uv_mutex_unlock(&q->mu);

    for (size_t i = 0; i < n; i++) batch[i].tag->fn(batch[i].tag, batch[i].ok);
    q->spare = batch;
    q->spare_cap = cap;
    if (n == 0) {
      if (drained && q->closing && !uv_is_closing((uv_handle_t *)&q->async)) {
        uv_thread_join(&q->thread);
        grpc_completion_queue_destroy(q->cq);
        q->cq = NULL;
        uv_close((uv_handle_t *)&q->async, cq_closed);
      }
      return;
    }
  }
}

mega_status mega_rpc_cq_new(uv_loop_t *loop, mega_rpc_cq **out, mega_err *err) {
  *out = NULL;
  mega_rpc_cq *q = calloc(1, sizeof *q);
  if (!q) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating a completion queue");
  q->loop = loop;
  if (uv_mutex_init(&q->mu) != 0) {
    free(q);
    return mega_fail(err, MEGA_ERR_INTERNAL, "cannot create a mutex for the completion queue");
  }
  int rc = uv_async_init(loop, &q->async, cq_wakeup);
  if (rc != 0) {
    uv_mutex_destroy(&q->mu);
    free(q);
    return mega_fail(err, MEGA_ERR_IO, "cannot create a libuv async handle: %s", uv_strerror(rc));
  }
  mega_rpc_lib_ref();
  q->cq = grpc_completion_queue_create_for_next(NULL);
  rc = uv_thread_create(&q->thread, cq_thread, q);
  if (rc != 0) {
    grpc_completion_queue_shutdown(q->cq);
    /* No thread: drain here (the queue is empty) so it can be destroyed. */
    while (grpc_completion_queue_next(q->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(q->cq);
    q->done = NULL;
    uv_close((uv_handle_t *)&q->async, cq_closed);
    return mega_fail(err, MEGA_ERR_IO, "cannot start the completion queue thread: %s",
                     uv_strerror(rc));
  }
  *out = q;
  return MEGA_OK;
}

void mega_rpc_cq_close(mega_rpc_cq *q, void (*done)(void *arg), void *arg) {
  if (!q || q->closing) return;
  q->closing = true;
  q->done = done;
  q->done_arg = arg;
  grpc_completion_queue_shutdown(q->cq);
  /* The thread wakes us once it sees the shutdown event. */
}

bool mega_rpc_cq_closing(const mega_rpc_cq *q) { return !q || q->closing; }

size_t mega_rpc_cq_queued(mega_rpc_cq *q) {
  uv_mutex_lock(&q->mu);
  size_t n = q->n;
  uv_mutex_unlock(&q->mu);
  return n;
}

uv_loop_t *mega_rpc_cq_loop(const mega_rpc_cq *q) { return q->loop; }

grpc_completion_queue *mega_rpc_cq_raw(const mega_rpc_cq *q) { return q->cq; }
