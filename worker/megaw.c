/* megaw: the worker. Without an assignment from megad it trains alone, as
 * rank 0 of 1:
 *
 *   megaw [job flags] [--json]
 *
 * With --json each iteration is one JSON object on one line of stdout;
 * without it a readable line every --log-interval iterations. Notes go to
 * stderr. SIGINT and SIGTERM stop training after the current
 * step (exit 130 and 143); completed checkpoints stay intact. */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/data.h"
#include "worker/train.h"

static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) { stop_signal = sig; }

static void install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND; /* a second signal stops at once, as usual */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

typedef struct worker_opts {
  bool json;
} worker_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: megaw [job flags] [--json]\n\n"
          "Trains a GPT on one rank. Without an assignment from megad it runs alone, as\n"
          "rank 0 of 1.\n\n"
          "worker flags:\n"
          "  --json     print one JSON object per iteration on stdout\n"
          "  --help     print this help\n"
          "  --version  print megaw's version\n");
  int width = 0;
  for (int i = 0; i < mega_jobspec_flag_count(); i++) {
    const mega_jobflag *fl = mega_jobspec_flag(i);
    int w = (int)strlen(fl->name) + (fl->metavar ? 1 + (int)strlen(fl->metavar) : 0);
    if (w > width && w <= 40) width = w;
  }
  const char *group = NULL;
  for (int i = 0; i < mega_jobspec_flag_count(); i++) {
    const mega_jobflag *fl = mega_jobspec_flag(i);
    if (!group || strcmp(group, fl->group) != 0) {
      group = fl->group;
      fprintf(f, "\n%s flags:\n", group);
    }
    char head[96];
    snprintf(head, sizeof head, "%s%s%s", fl->name, fl->metavar ? " " : "",
             fl->metavar ? fl->metavar : "");
    fprintf(f, "  %-*s  %s", width, head, fl->help);
    if (fl->default_text) fprintf(f, " (default: %s)", fl->default_text);
    fputc('\n', f);
  }
}

static int fail(const char *what, const mega_err *err) {
  fprintf(stderr, "megaw: %s%s%s\n", what ? what : "", what ? ": " : "", err->msg);
  return 1;
}

/* Rejects the flags single-rank training does not act on, rather than
 * ignoring them silently. */
static mega_status check_alone(const mega_jobspec *s, mega_err *err) {
  if (s->tensor_model_parallel_size > 1 || s->pipeline_model_parallel_size > 1)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "without megad, training runs alone on one rank; --tensor-model-parallel-size and "
                     "--pipeline-model-parallel-size above 1 need megad (megactl submit)");
  if (s->eval_interval > 0)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "megaw alone does not evaluate; drop --eval-interval");
  if (s->trace_iteration > 0)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "--trace-iteration needs the pipeline engine (megactl submit)");
  if (s->simulate_compute)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "--simulate-compute needs the pipeline engine (megactl submit)");
  return MEGA_OK;
}

static void print_step(const worker_opts *o, const mega_step_report *r, int64_t total) {
  if (o->json) {
    json_t *j = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "iteration", (json_int_t)r->iteration,
                          "loss", r->loss, "grad_norm", r->grad_norm, "lr", r->lr,
                          "step_time_s", r->step_time_s, "tokens_per_s", r->tokens_per_s);
    if (j) {
      char *line = json_dumps(j, JSON_COMPACT);
      if (line) printf("%s\n", line);
      free(line);
      json_decref(j);
    }
  } else {
    printf("iteration %6lld/%lld | loss %.6f | grad_norm %.4f | lr %.4e | %.3f s | %.0f tokens/s\n",
           (long long)r->iteration, (long long)total, r->loss, r->grad_norm, r->lr,
           r->step_time_s, r->tokens_per_s);
  }
  fflush(stdout);
}

static int save(mega_trainer *t, const mega_jobspec *job) {
  mega_err err = {0};
  if (mega_trainer_save(t, &err) != MEGA_OK) return fail(NULL, &err);
  fprintf(stderr, "megaw: saved checkpoint of iteration %lld in %s\n",
          (long long)mega_trainer_iteration(t), job->save);
  return 0;
}

/* Training as rank 0 of 1. */
static int run_alone(const mega_jobspec *job, const worker_opts *o) {
  mega_err err = {0};
  mega_backend *be = NULL;
  mega_backend_cpu_opts bo = {.threads = job->blas_threads};
  if (mega_backend_cpu_create(&bo, &be, &err) != MEGA_OK) return fail("cpu backend", &err);
  mega_trainer *t = NULL;
  bool resumed = false;
  int rc = 0;
  if (mega_trainer_create(job, be, NULL, &t, &resumed, &err) != MEGA_OK) {
    rc = fail(NULL, &err);
    goto out;
  }
  if (job->load && !resumed)
    fprintf(stderr, "megaw: no checkpoint in --load %s; starting from fresh weights\n", job->load);
  if (resumed)
    fprintf(stderr, "megaw: resumed from %s at iteration %lld\n", mega_trainer_loaded_path(t),
            (long long)mega_trainer_iteration(t));
  if (mega_trainer_iteration(t) >= job->train_iters)
    fprintf(stderr, "megaw: already at iteration %lld, --train-iters %d: nothing to train\n",
            (long long)mega_trainer_iteration(t), job->train_iters);
  if (!o->json)
    printf("megaw: %zu parameters, %d layers, hidden %d, %d heads, seq %d, global batch %d, "
           "micro batch %d\n", mega_trainer_num_params(t), job->num_layers, job->hidden_size,
           job->num_attention_heads, job->seq_length, job->global_batch_size,
           job->micro_batch_size);
  if (job->save && job->save_initial && mega_trainer_iteration(t) == 0 && !stop_signal &&
      (rc = save(t, job)) != 0)
    goto out;
  while (mega_trainer_iteration(t) < job->train_iters && !stop_signal) {
    mega_step_report r;
    if (mega_trainer_step(t, &r, &err) != MEGA_OK) {
      rc = fail(NULL, &err);
      goto out;
    }
    /* JSON lines are for programs: every iteration. Readable lines follow
     * --log-interval, and the last iteration always prints. */
    if (o->json || r.iteration % job->log_interval == 0 || r.iteration == job->train_iters)
      print_step(o, &r, job->train_iters);
    if (mega_trainer_save_due(t) && (rc = save(t, job)) != 0) goto out;
  }
  if (stop_signal) {
    fprintf(stderr, "megaw: stopped by signal %d after iteration %lld\n", (int)stop_signal,
            (long long)mega_trainer_iteration(t));
    rc = 128 + stop_signal;
  }
out:
  mega_trainer_destroy(t);
  mega_backend_destroy(be);
  return rc;
}

int main(int argc, char **argv) {
  install_signals();
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  worker_opts o = {0};
  mega_err err = {0};
  for (int i = 1; i < argc;) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      mega_jobspec_free(&job);
      return 0;
    }
    if (!strcmp(argv[i], "--version")) {
      printf("megaw %s\n", MEGA_VERSION);
      mega_jobspec_free(&job);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      o.json = true;
      i++;
      continue;
    }
    mega_status st = mega_jobspec_parse_flag(&job, argc, argv, &i, &err);
    if (st != MEGA_OK) {
      if (st == MEGA_ERR_NOT_FOUND)
        fprintf(stderr, "megaw: unknown flag '%s' (see megaw --help)\n", argv[i]);
      else
        fprintf(stderr, "megaw: %s\n", err.msg);
      mega_jobspec_free(&job);
      return 2;
    }
  }
  /* Flag errors exit 2, like a usage error; failures while training exit 1. */
  long long bytes = -1;
  if (check_alone(&job, &err) != MEGA_OK ||
      (job.data_path && mega_data_file_size(job.data_path, &bytes, &err) != MEGA_OK) ||
      mega_jobspec_check(&job, 1, bytes, &err) != MEGA_OK) {
    mega_jobspec_free(&job);
    fprintf(stderr, "megaw: %s\n", err.msg);
    return 2;
  }
  int rc = run_alone(&job, &o);
  mega_jobspec_free(&job);
  return rc;
}
