#include "worker/rank/rank_saver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

bool mega_rank_ckpt_due(const mega_jobspec *job, int64_t iteration) {
  if (!job->save) return false;
  /* the last iteration, counted as Megatron counts a --train-samples run's */
  if (iteration == mega_jobspec_train_iters(job)) return true;
  return job->save_interval > 0 && iteration % job->save_interval == 0;
}

/* ---- the saver ---- */

struct mega_rank_saver {
  mega_rank_saver_config c;
  mega_ckpt_writer *w;
  pthread_t thread;
  bool running;   /* the thread exists and has not been joined */
  bool on_thread; /* the save in flight writes on the thread: only its copy blocked */
  /* the save in flight (or the last one) */
  int64_t iteration;
  double t0, blocked_s;
  char path[4096];
  mega_status st; /* its result, handed out once by wait */
  mega_err err;
};

double mega_rank_saver_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void report(mega_rank_saver *s, uint64_t bytes, bool committed) {
  if (!s->c.on_checkpoint) return;
  double d = mega_rank_saver_now() - s->t0;
  mega_rank_ckpt_report r = {.iteration = s->iteration, .path = s->path, .bytes = bytes,
                             .duration_s = d, .blocked_s = s->on_thread ? s->blocked_s : d,
                             .committed = committed};
  s->c.on_checkpoint(s->c.arg, &r);
}

static void on_durable(void *arg, int64_t iteration, uint64_t bytes) {
  (void)iteration;
  report(arg, bytes, false);
}

static mega_status await_commit(void *arg, int64_t iteration, mega_err *err) {
  mega_rank_saver *s = arg;
  return s->c.await_commit(s->c.arg, iteration, err);
}

static void write_now(mega_rank_saver *s) {
  mega_ckpt_write_result res;
  s->st = mega_ckpt_writer_write(s->w, &res, &s->err);
  if (s->st != MEGA_OK) return;
  if (res.committed) {
    report(s, res.total_bytes, true);
  } else if (res.committer && res.refused.status != MEGA_OK) {
    fprintf(stderr, "mega: rank %d: checkpoint of iteration %lld left uncommitted: %s\n",
            s->c.rank, (long long)s->iteration, res.refused.msg);
  }
}

static void *thread_main(void *arg) {
  write_now(arg);
  return NULL;
}

mega_status mega_rank_saver_create(const mega_rank_saver_config *cfg,
                                   const mega_ckpt_param *params, size_t n,
                                   mega_rank_saver **out, mega_err *err) {
  *out = NULL;
  mega_rank_saver *s = calloc(1, sizeof *s);
  if (!s) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the checkpoint saver");
  s->c = *cfg;
  mega_ckpt_writer_config wc = cfg->writer;
  wc.on_durable = on_durable;
  wc.await_commit = cfg->await_commit ? await_commit : NULL;
  wc.arg = s;
  mega_status st = mega_ckpt_writer_create(&wc, params, n, &s->w, err);
  if (st != MEGA_OK) {
    free(s);
    return st;
  }
  *out = s;
  return MEGA_OK;
}

mega_status mega_rank_saver_wait(mega_rank_saver *s, mega_err *err) {
  if (!s) return MEGA_OK;
  if (s->running) {
    pthread_join(s->thread, NULL);
    s->running = false;
  }
  mega_status st = s->st;
  if (st != MEGA_OK && err) *err = s->err;
  s->st = MEGA_OK;
  return st;
}

mega_status mega_rank_saver_stage(mega_rank_saver *s, mega_backend *be,
                                  const mega_ckpt_state *state, double t0, mega_err *err) {
  mega_status st = mega_rank_saver_wait(s, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "the previous checkpoint (iteration %lld)", (long long)s->iteration);
    return st;
  }
  s->iteration = state->iteration;
  s->t0 = t0;
  mega_ckpt_iter_path(s->path, sizeof s->path, s->c.writer.save_dir, state->iteration);
  return mega_ckpt_writer_stage(s->w, be, state, err);
}

mega_status mega_rank_saver_write(mega_rank_saver *s, mega_err *err) {
  s->blocked_s = mega_rank_saver_now() - s->t0;
  s->on_thread = s->c.async;
  if (s->on_thread && pthread_create(&s->thread, NULL, thread_main, s) == 0) {
    s->running = true;
    return MEGA_OK;
  }
  s->on_thread = false;
  write_now(s); /* without --async-save, or when no thread could start */
  return mega_rank_saver_wait(s, err);
}

void mega_rank_saver_destroy(mega_rank_saver *s) {
  if (!s) return;
  mega_rank_saver_wait(s, NULL);
  mega_ckpt_writer_destroy(s->w);
  free(s);
}
