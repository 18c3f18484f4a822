/* megaw: the worker. Without an assignment from megad it trains alone, as
 * rank 0 of 1, or as one rank of a hand launch:
 *
 *   megaw [job flags] [--json]
 *   megaw --rank R --world-size N --rendezvous-dir DIR [job flags] [--json]
 *
 * With --json each iteration is one JSON object on one line of stdout;
 * without it a readable line every --log-interval iterations. Notes go to
 * stderr. SIGINT and SIGTERM stop training after the current
 * step (exit 130 and 143); completed checkpoints stay intact. With
 * --exit-signal-handler SIGTERM saves a checkpoint (with --save) at the next
 * iteration boundary and exits 0, as Megatron does. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/jobspec.h"
#include "core/logline.h"
#include "core/schedule.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda_module.h"
#include "worker/data/data.h"
#include "worker/megaw_assigned.h"
#include "worker/megaw_generate.h"
#include "worker/rank/rank.h"
#include "core/version.h"

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

/* --exit-signal-handler: SIGTERM asks for a save and a stop at the next
 * iteration boundary, however often it comes (a scheduler may send it to
 * every process of a job, and megad may pass it on too). */
static void keep_sigterm(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

typedef struct worker_opts {
  bool json;
  int rank, world;            /* world 1 unless launched by hand with --world-size */
  bool rank_given, world_given;
  const char *rendezvous_dir; /* FileStore directory for a hand launch */
} worker_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: megaw [job flags] [--json]\n"
          "       megaw --rank R --world-size N --rendezvous-dir DIR [job flags] [--json]\n"
          "       megaw generate --load DIR --prompt TEXT [...]   (see megaw generate --help)\n\n"
          "Trains a GPT. megad starts workers with an assignment; without one, megaw\n"
          "trains alone as rank 0 of 1, or as rank R of N ranks started by hand that meet\n"
          "through a directory they all see.\n\n"
          "megaw flags:\n"
          "  --json                 print one JSON object per iteration on stdout\n"
          "  --rank R               this process's rank (hand launch)\n"
          "  --world-size N         ranks in the job (hand launch)\n"
          "  --rendezvous-dir DIR   where the ranks meet (hand launch): an empty directory\n"
          "                         every rank sees, fresh for each launch\n"
          "  --help                 print this help\n"
          "  --version              print megaw's version and the cuda module's libraries\n");
  char *flags = mega_jobspec_help_text();
  if (flags) fputs(flags, f);
  free(flags);
}

static int fail(const char *what, const mega_err *err) {
  fprintf(stderr, "megaw: %s%s%s\n", what ? what : "", what ? ": " : "", err->msg);
  return 1;
}

/* Rejects what a run without megad cannot do, rather than ignoring it:
 * without megad, --trace-iteration's spans go into that iteration's JSON
 * line, so they need --json. */
static mega_status check_standalone(const mega_jobspec *s, bool json, mega_err *err) {
  if (s->trace_iteration > 0 && !json)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "--trace-iteration needs megad, which gathers every rank's spans into one "
                     "trace (megad run or megactl submit), or --json, which prints each "
                     "rank's spans of that iteration in its JSON line");
  return MEGA_OK;
}

/* seed 003's measurements: where the gradient reductions fell against the
 * pipeline, and the CPU the rank got; with --trace-iteration, the spans. */
static void json_measurements(json_t *j, const mega_rank_metrics *m) {
  json_object_set_new(j, "step_start_unix_us", json_integer((json_int_t)m->step_start_unix_us));
  json_object_set_new(j, "work_end_s", json_real(m->work_end_s));
  json_object_set_new(j, "drained_s", json_real(m->drained_s));
  json_object_set_new(j, "reduced_s", json_real(m->reduced_s));
  json_object_set_new(j, "thread_cpu_s", json_real(m->thread_cpu_s));
  json_object_set_new(j, "thread_runq_s", json_real(m->thread_runq_s));
  json_object_set_new(j, "process_cpu_s", json_real(m->process_cpu_s));
  if (m->nreductions) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < m->nreductions; i++) {
      const mega_rank_reduction *x = &m->reductions[i];
      json_array_append_new(
          a, json_pack("{s:i, s:i, s:b, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "bucket", x->bucket,
                       "chunk", x->chunk, "tied", x->tied, "floats", (json_int_t)x->floats,
                       "launched_s", x->launched_s, "started_s", x->started_s, "done_s",
                       x->done_s, "waited_s", x->waited_s, "cpu_s", x->cpu_s, "runq_s",
                       x->runq_s));
    }
    json_object_set_new(j, "grad_reductions", a);
  }
  if (m->nspans) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < m->nspans; i++) {
      const mega_rank_span *sp = &m->spans[i];
      json_array_append_new(a, json_pack("{s:s, s:s, s:f, s:f}", "name", sp->name, "cat",
                                         sp->cat ? sp->cat : "", "start_us", sp->start_us,
                                         "dur_us", sp->dur_us));
    }
    json_object_set_new(j, "spans", a);
  }
}

static int out_errno; /* why stdout took no more steps (0: it takes all) */

typedef struct run_state {
  const worker_opts *o;
  const mega_jobspec *job;
  mega_rank *rank;
  mega_logline log; /* what the next readable line averages */
} run_state;

/* The readable output of one step: Megatron's line every --log-interval on
 * the rank that knows the loss, its validation block after an evaluation;
 * a rank without the loss prints its compute and bubble instead. */
static void print_text(run_state *rs, const mega_rank_metrics *m, double tokens_per_s) {
  const mega_jobspec *job = rs->job;
  mega_logline_add(&rs->log, m->has_loss, m->loss, m->skipped, m->step_time_s, tokens_per_s);
  if (mega_logline_due(job, m->iteration)) {
    if (m->has_loss) {
      char line[1024];
      mega_logline_step st = {.iteration = m->iteration, .world = rs->o->world,
                              .global_batch = m->global_batch, .lr = m->lr,
                              .grad_norm = m->grad_norm, .has_grad_norm = m->has_grad_norm};
      mega_logline_format(&rs->log, job, &st, line, sizeof line);
      fputs(line, stdout);
    } else {
      rs->log = (mega_logline){0};
      printf("iteration %6lld/%lld | rank %d | compute %.3f s | bubble %.3f s | %.3f s\n",
             (long long)m->iteration, (long long)mega_jobspec_train_iters(job), m->rank,
             m->compute_s, m->bubble_s, m->step_time_s);
    }
  }
  if (m->has_eval_loss) {
    char block[1024];
    mega_logline_eval(m->iteration, m->eval_loss, block, sizeof block);
    fputs(block, stdout);
  }
  char end[2048];
  mega_logline_end_eval(m->iteration, m->has_final_eval_loss, m->final_eval_loss,
                        m->has_test_loss, m->test_loss, end, sizeof end);
  fputs(end, stdout);
}

static void print_step(void *arg, const mega_rank_metrics *m) {
  run_state *rs = arg;
  const worker_opts *o = rs->o;
  double tokens_per_s = m->step_time_s > 0 ? (double)m->global_tokens / m->step_time_s : 0;
  if (o->json) {
    /* iteration and loss lead, as megaw has always printed them */
    json_t *j = json_pack("{s:I}", "iteration", (json_int_t)m->iteration);
    if (j && m->has_loss) json_object_set_new(j, "loss", json_real(m->loss));
    json_t *rest = json_pack("{s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:f, s:f, s:f, s:I}",
                             "grad_norm", m->grad_norm, "lr", m->lr, "step_time_s",
                             m->step_time_s, "tokens_per_s", tokens_per_s, "rank", m->rank,
                             "pp_rank", m->pp_rank, "dp_rank", m->dp_rank, "compute_s",
                             m->compute_s, "bubble_s", m->bubble_s, "p2p_wait_s", m->p2p_wait_s,
                             "peak_activation_bytes", (json_int_t)m->peak_activation_bytes);
    if (rest) {
      json_object_set_new(rest, "peak_inflight", json_integer(m->peak_inflight));
      json_object_set_new(rest, "tp_rank", json_integer(m->tp_rank));
      json_object_set_new(rest, "tp_comm_s", json_real(m->tp_comm_s));
      json_object_set_new(rest, "grad_sync_exposed_s", json_real(m->grad_sync_exposed_s));
      json_object_set_new(rest, "param_bytes", json_integer((json_int_t)m->param_bytes));
      json_object_set_new(rest, "grad_bytes", json_integer((json_int_t)m->grad_bytes));
      json_object_set_new(rest, "optimizer_state_bytes",
                          json_integer((json_int_t)m->optimizer_state_bytes));
    }
    if (rest && m->has_eval_loss) json_object_set_new(rest, "eval_loss", json_real(m->eval_loss));
    if (rest && m->has_final_eval_loss)
      json_object_set_new(rest, "final_eval_loss", json_real(m->final_eval_loss));
    if (rest && m->has_test_loss) json_object_set_new(rest, "test_loss", json_real(m->test_loss));
    if (rest) json_measurements(rest, m);
    if (j && rest) json_object_update(j, rest);
    json_decref(rest);
    if (j) {
      char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
      if (line) printf("%s\n", line);
      free(line);
      json_decref(j);
    }
  } else if (o->rank == o->world - 1) { /* Megatron's print_rank_last: one line a step */
    print_text(rs, m, tokens_per_s);
  }
  if (fflush(stdout) != 0 && !out_errno) {
    out_errno = errno;
    fprintf(stderr, "megaw: cannot write its output (stdout): %s; training goes on, and megaw "
                    "exits 1 after it even if it succeeds\n", strerror(out_errno));
  }
  /* A signal stops training after the step that was running; SIGTERM with
   * --exit-signal-handler after a save. */
  if (stop_signal == SIGTERM && rs->job->exit_signal_handler)
    mega_rank_request_exit(rs->rank, "SIGTERM (--exit-signal-handler)");
  else if (stop_signal)
    mega_rank_abort(rs->rank, "stopped by a signal");
}

static void print_checkpoint(void *arg, const mega_rank_ckpt_report *r) {
  (void)arg;
  if (!r->committed) return;
  fprintf(stderr, "megaw: saved checkpoint of iteration %lld in %s (%.1f MB, %.3f s, training "
                  "blocked %.3f s)\n",
          (long long)r->iteration, r->path, (double)r->bytes / 1e6, r->duration_s, r->blocked_s);
}

/* rank 0's notes about the run (rank.h) */
static void print_note(void *arg, const char *note) {
  (void)arg;
  fprintf(stderr, "megaw: %s\n", note);
}

/* Training without megad: alone (rank 0 of 1), or as one of --world-size
 * ranks started by hand that meet through --rendezvous-dir. */
static int run_standalone(const mega_jobspec *job, const worker_opts *o) {
  mega_err err = {0};
  run_state rs = {.o = o, .job = job};
  /* A hand launch binds loopback: every rank is on this node, so every
   * group's collectives may go through shared memory (comm.h). */
  uint32_t *here = calloc((size_t)o->world, sizeof *here);
  if (!here) {
    mega_fail(&err, MEGA_ERR_NOMEM, "out of memory");
    return fail(NULL, &err);
  }
  for (int i = 0; i < o->world; i++) here[i] = (uint32_t)i;
  mega_rank_env env = {.job = job, .rank = o->rank, .world_size = o->world,
                       .local_rank = o->rank, .local_world_size = o->world,
                       .node_ranks = here, .n_node_ranks = (size_t)o->world,
                       .store_dir = o->world > 1 ? o->rendezvous_dir : NULL,
                       .kv_prefix = "megaw", .device = -1,
                       .on_step = print_step, .on_checkpoint = print_checkpoint,
                       .on_note = print_note, .arg = &rs};
  if (mega_rank_create(&env, &rs.rank, &err) != MEGA_OK) return fail(NULL, &err);
  int rc = 0;
  if (mega_rank_setup(rs.rank, &err) != MEGA_OK) {
    rc = fail(NULL, &err);
    goto out;
  }
  int64_t it = mega_rank_iteration(rs.rank);
  if (job->load && !mega_rank_loaded_path(rs.rank))
    fprintf(stderr, "megaw: no checkpoint in --load %s; starting from fresh weights\n", job->load);
  if (mega_rank_load_notice(rs.rank))
    fprintf(stderr, "megaw: %s\n", mega_rank_load_notice(rs.rank));
  if (mega_rank_loaded_path(rs.rank))
    fprintf(stderr, "megaw: %s %s at iteration %lld\n",
            job->finetune ? "loaded the weights of" : "resumed from",
            mega_rank_loaded_path(rs.rank), (long long)it);
  if (it >= mega_jobspec_train_iters(job))
    fprintf(stderr, "megaw: already at iteration %lld of %lld: nothing to train\n",
            (long long)it, (long long)mega_jobspec_train_iters(job));
  if (job->simulate_compute)
    fprintf(stderr, "megaw: BENCHMARK MODE (--simulate-compute %s): F, B and W sleep instead of "
                    "computing; P2P and collectives are real; no loss is computed\n",
            job->simulate_compute);
  if (!o->json && o->rank == 0) {
    char groups[48] = "";
    if (job->group_query_attention)
      snprintf(groups, sizeof groups, " in %d query groups", mega_jobspec_query_groups(job));
    printf("megaw: rank %d of %d, %zu parameters here, %s, %d layers, hidden %d, %d heads%s, "
           "seq %d, global batch %d, micro batch %d%s\n", o->rank, o->world,
           mega_rank_num_params(rs.rank), mega_jobspec_llama(job) ? "Llama" : "GPT-2",
           job->num_layers, job->hidden_size, job->num_attention_heads, groups, job->seq_length,
           job->global_batch_size, job->micro_batch_size, job->bf16 ? ", bf16 GEMM inputs" : "");
  }
  if (mega_rank_run(rs.rank, &err) != MEGA_OK) {
    if (stop_signal && err.status == MEGA_ERR_CANCELLED) {
      fprintf(stderr, "megaw: stopped by signal %d after iteration %lld\n", (int)stop_signal,
              (long long)mega_rank_iteration(rs.rank));
      rc = 128 + stop_signal;
    } else {
      rc = fail(NULL, &err);
    }
  } else if (mega_rank_stopped(rs.rank)) {
    fprintf(stderr, "megaw: stopped after iteration %lld of %lld: %s%s%s\n",
            (long long)mega_rank_iteration(rs.rank), (long long)mega_jobspec_train_iters(job),
            mega_rank_stopped(rs.rank), job->save ? "; resume with --load " : " (no --save: "
            "nothing to resume from)", job->save ? job->save : "");
  } else if (stop_signal && !(stop_signal == SIGTERM && job->exit_signal_handler)) {
    rc = 128 + stop_signal; /* (a SIGTERM after the last iteration changed nothing) */
  }
out:
  mega_rank_destroy(rs.rank);
  free(here);
  return rc;
}

/* --rank, --world-size and --rendezvous-dir: a hand launch without megad. */
static mega_status parse_launch_flag(worker_opts *o, int argc, char **argv, int *i,
                                     mega_err *err) {
  const char *name = argv[*i];
  bool rank = !strcmp(name, "--rank"), world = !strcmp(name, "--world-size"),
       dir = !strcmp(name, "--rendezvous-dir");
  if (!rank && !world && !dir) return MEGA_ERR_NOT_FOUND;
  if (*i + 1 >= argc) return mega_fail(err, MEGA_ERR_INVALID, "%s needs a value", name);
  const char *v = argv[*i + 1];
  *i += 2;
  if (dir) {
    o->rendezvous_dir = v;
    return MEGA_OK;
  }
  char *end;
  long n = strtol(v, &end, 10);
  if (*v == '\0' || *end || n < (rank ? 0 : 1) || n > 1000000)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a %s integer", name, v,
                     rank ? "non-negative" : "positive");
  if (rank) o->rank = (int)n, o->rank_given = true;
  else o->world = (int)n, o->world_given = true;
  return MEGA_OK;
}

/* Launchers that start N copies of a program say N in the environment.
 * megaw takes its rank only from --rank and --world-size, so N copies
 * started without them (torchrun's way, or srun -n N) each trained alone as
 * rank 0 of 1, all of them saving to the same --save. */
static mega_status check_launcher_env(const worker_opts *o, const mega_jobspec *job,
                                      mega_err *err) {
  static const char *const vars[][2] = {{"WORLD_SIZE", "torchrun"},
                                        {"SLURM_STEP_NUM_TASKS", "srun"},
                                        {"OMPI_COMM_WORLD_SIZE", "mpirun"}};
  if (o->world_given) return MEGA_OK;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i][0]);
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || n < 2) continue;
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s=%ld: %s started %ld copies of megaw, but megaw takes its rank only "
                     "from --rank and --world-size, so each would train alone as rank 0 of "
                     "1%s. Start the ranks with megad (megad run --slots %ld, or megactl "
                     "submit), or give each copy --rank R --world-size %ld --rendezvous-dir "
                     "DIR (a directory every rank sees)", vars[i][0], n, vars[i][1], n,
                     job->save ? ", every copy saving to the same --save" : "", n, n);
  }
  return MEGA_OK;
}

static mega_status check_launch(const worker_opts *o, const mega_jobspec *job, mega_err *err) {
  int mp = job->tensor_model_parallel_size * job->pipeline_model_parallel_size;
  if (o->world == 1 && mp > 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "TP·PP = %d needs at least %d ranks: start them with megad (megad run "
                     "--slots %d), or by hand with --rank, --world-size and --rendezvous-dir",
                     mp, mp, mp);
  if (o->rank >= o->world)
    return mega_fail(err, MEGA_ERR_INVALID, "--rank %d is out of range for --world-size %d",
                     o->rank, o->world);
  if (o->world > 1 && !o->rank_given)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--world-size %d needs --rank R (0 to %d), a different one in each process",
                     o->world, o->world - 1);
  if (o->world == 1 && o->rendezvous_dir)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--rendezvous-dir is for ranks started by hand: give each --world-size N "
                     "and its --rank R too");
  if (o->world > 1 && !o->rendezvous_dir)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--world-size %d needs --rendezvous-dir DIR, a directory every rank sees "
                     "(or let megad start the ranks: megad run --slots %d)", o->world, o->world);
  return MEGA_OK;
}

/* By hand (not under megad): the flags, then training. */
static int by_hand(int argc, char **argv) {
  install_signals();
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  worker_opts o = {.world = 1};
  mega_err err = {0};
  for (int i = 1; i < argc;) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      mega_jobspec_free(&job);
      return 0;
    }
    if (!strcmp(argv[i], "--version")) {
      /* and the cuda module's libraries (cuDNN is found at run time) */
      const mega_cuda_module *m;
      printf("megaw %s\n", mega_version());
      if (mega_cuda_module_load(&m, &err) == MEGA_OK)
        printf("cuda module: %s\n", m->versions());
      else
        printf("cuda module: %s\n", err.msg);
      mega_jobspec_free(&job);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      o.json = true;
      i++;
      continue;
    }
    mega_status st = mega_jobspec_parse_flag(&job, argc, argv, &i, &err);
    if (st == MEGA_ERR_NOT_FOUND) st = parse_launch_flag(&o, argc, argv, &i, &err);
    if (st != MEGA_OK) {
      if (st == MEGA_ERR_NOT_FOUND && !strncmp(argv[i], "--", 2))
        fprintf(stderr, "megaw: %s (see megaw --help)\n", err.msg);
      else if (st == MEGA_ERR_NOT_FOUND)
        fprintf(stderr, "megaw: unexpected argument '%s' (see megaw --help)\n", argv[i]);
      else
        fprintf(stderr, "megaw: %s\n", err.msg);
      mega_jobspec_free(&job);
      return 2;
    }
  }
  /* Flag errors exit 2, like a usage error; failures while training exit 1. */
  long long bytes = -1;
  char note[2048];
  /* absolute paths: a checkpoint's job record then finds its vocabulary
   * from any directory (megaw generate) */
  if (mega_jobspec_fix_data_paths(&job, true, note, sizeof note, &err) != MEGA_OK ||
      mega_jobspec_absolute_paths(&job, &err) != MEGA_OK ||
      mega_jobspec_resolve_dirs(&job, &err) != MEGA_OK ||
      mega_jobspec_load_vocab(&job, &err) != MEGA_OK) {
    mega_jobspec_free(&job);
    fprintf(stderr, "megaw: %s\n", err.msg);
    return 2;
  }
  if (note[0] && o.rank == 0) fprintf(stderr, "megaw: %s\n", note);
  if (check_launcher_env(&o, &job, &err) != MEGA_OK || check_launch(&o, &job, &err) != MEGA_OK ||
      check_standalone(&job, o.json, &err) != MEGA_OK ||
      (mega_jobspec_data_file(&job, 0, NULL) && mega_data_probe(&job, &bytes, &err) != MEGA_OK) ||
      mega_jobspec_check_all(&job, o.world, bytes, &err) != MEGA_OK) {
    mega_jobspec_free(&job);
    fprintf(stderr, "megaw: %s\n", err.msg);
    return 2;
  }
  char what[512];
  if (o.rank == 0 && mega_jobspec_eval_note(&job, what, sizeof what))
    fprintf(stderr, "megaw: %s\n", what);
  if (job.exit_signal_handler) keep_sigterm();
  int rc = run_standalone(&job, &o);
  mega_jobspec_free(&job);
  return rc;
}

/* What went to stdout by hand (--json's steps, generate's text) that did
 * not all reach it fails a run that otherwise succeeded, saying why: a cut
 * file on a full disk must not pass for the whole. */
static int output_checked(int rc) {
  if (rc) return rc; /* a failed run has said why (generate: its unwritten text too) */
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  int e = out_errno ? out_errno : errno;
  fprintf(stderr, "megaw: cannot write its output (stdout): %s\n",
          e ? strerror(e) : "a write failed (a full disk, or a closed file)");
  return 1;
}

int main(int argc, char **argv) {
  /* A file size limit (ulimit -f, systemd's LimitFSIZE=) reached while
   * saving killed megaw by SIGXFSZ without a word; ignored, the write fails
   * with EFBIG and the checkpoint's error names the file. */
  signal(SIGXFSZ, SIG_IGN);
  /* Started by megad: the job comes over the pipe, not argv (megad reads
   * its stdout and says so when it ends). */
  const char *worker_fd = getenv("MEGA_WORKER_FD");
  if (worker_fd) return megaw_run_assigned(worker_fd);
  if (argc > 1 && !strcmp(argv[1], "generate"))
    return output_checked(megaw_generate(argc - 1, argv + 1));
  return output_checked(by_hand(argc, argv));
}
