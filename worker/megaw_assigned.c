/* megaw under megad: read the Assignment, check its job flags with the same
 * code as everyone else (core/jobspec, the schedule's rules), and run the
 * rank with the daemon's store for rendezvous. Steps, phases, checkpoints
 * and a failure go back over the pipe, and the committing rank waits there
 * for the coordinator's go-ahead; an Abort frame, the pipe's EOF (megad
 * died) or its silence (megad frozen) stops the rank. PR_SET_PDEATHSIG
 * takes the worker along if megad is killed outright.
 *
 * Recovery from replicas: a rank whose attempt fails because of a peer (or
 * which megad stops with an Abort that asks it to hold) does not exit if
 * its state is whole. It tells megad what it holds (RankHeld) and serves it
 * to the next attempt's ranks until megad releases it, or for HOLD_MAX_MS.
 * A rank whose Assignment carries a replica plan fetches its state from
 * such ranks at setup. */
#include "worker/megaw_assigned.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "core/jobspec.h"
#include "worker/data/data.h"
#include "worker/rank/link.h"
#include "worker/rank/rank.h"

#define HOLD_MAX_MS 120000 /* a held state nobody asks for is let go */

typedef struct assigned {
  mega_link *link;
  pthread_mutex_t mu;
  mega_rank *rank;     /* set between create and destroy */
  char *abort_reason;  /* an abort that came before the rank existed */
  char *stop_reason;   /* a Stop frame that came before it */
  bool graceful;       /* --exit-signal-handler: SIGTERM and Stop save, then stop */
  uint32_t rank_id;
  char phase[16];      /* the last phase told to megad */
} assigned;

static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) { stop_signal = sig; }

/* Runs on the link's reader thread. */
static void on_abort(void *arg, const char *reason) {
  assigned *a = arg;
  pthread_mutex_lock(&a->mu);
  if (a->rank) mega_rank_abort(a->rank, reason);
  else if (!a->abort_reason) a->abort_reason = strdup(reason);
  pthread_mutex_unlock(&a->mu);
}

/* Runs on the link's reader thread: megad passes on a stop (it got SIGTERM). */
static void on_stop(void *arg, const char *reason) {
  assigned *a = arg;
  pthread_mutex_lock(&a->mu);
  if (a->rank) mega_rank_request_exit(a->rank, reason);
  else if (!a->stop_reason) a->stop_reason = strdup(reason);
  pthread_mutex_unlock(&a->mu);
}

/* Whether the signal that came asks for a save and a stop, not an abort. */
static bool graceful_signal(const assigned *a) { return a->graceful && stop_signal == SIGTERM; }

static void on_step(void *arg, const mega_rank_metrics *m) {
  assigned *a = arg;
  mega_err err = {0};
  if (mega_link_send_step(a->link, m, &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
  /* a signal stops training after the step that was running; SIGTERM with
   * --exit-signal-handler after a save */
  if (graceful_signal(a)) mega_rank_request_exit(a->rank, "SIGTERM (--exit-signal-handler)");
  else if (stop_signal) mega_rank_abort(a->rank, "stopped by a signal");
}

/* Only changes of phase go on the pipe; step reports show progress. */
static void on_phase(void *arg, const char *phase, int64_t iteration) {
  assigned *a = arg;
  if (!strcmp(a->phase, phase)) return;
  bool after_setup = !strcmp(a->phase, "setup");
  snprintf(a->phase, sizeof a->phase, "%s", phase);
  mega_err err = {0};
  if (mega_link_send_progress(a->link, phase, iteration, &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
  /* every rank loaded alike: rank 0 says once what --load passed over */
  const char *notice = after_setup && a->rank ? mega_rank_load_notice(a->rank) : NULL;
  if (notice) fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, notice);
  if (notice && a->rank_id == 0 &&
      mega_link_send_note(a->link, notice, mega_rank_iteration(a->rank),
                          mega_rank_loaded_path(a->rank), &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
}

/* rank 0's notes about the run (rank.h): the log, and the job's history */
static void on_note(void *arg, const char *note) {
  assigned *a = arg;
  mega_err err = {0};
  fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, note);
  if (mega_link_send_note(a->link, note, 0, NULL, &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
}

/* The coordinator's answer, in slices, so a signal that stops the rank is
 * not held up by the wait (an Abort ends the link, and the wait with it).
 * The coordinator answers at once, go-ahead or refusal; the bound is for an
 * answer lost with a coordinator that died. */
static mega_status await_commit(void *arg, int64_t iteration, mega_err *err) {
  assigned *a = arg;
  int total = (int)mega_link_assignment(a->link)->bootstrap->kv_timeout_ms;
  if (total <= 0) total = 60000;
  for (int left = total;;) {
    int slice = left < 250 ? left : 250;
    mega_status s = mega_link_await_commit(a->link, iteration, slice, err);
    left -= slice;
    if (s == MEGA_ERR_TIMEOUT && left <= 0)
      return mega_fail(err, MEGA_ERR_TIMEOUT,
                       "megad did not answer the commit of iteration %lld in %.1f s",
                       (long long)iteration, total / 1000.0);
    if (s != MEGA_ERR_TIMEOUT) return s;
    if (stop_signal && !graceful_signal(a))
      return mega_fail(err, MEGA_ERR_CANCELLED, "stopped by a signal before the commit");
  }
}

static void on_recovered(void *arg, int64_t iteration, uint64_t bytes, double seconds) {
  assigned *a = arg;
  mega_err err = {0};
  fprintf(stderr, "megaw: rank %u: took the state of iteration %lld from replicas (%.1f MB in "
                  "%.3f s)\n", a->rank_id, (long long)iteration, (double)bytes / 1e6, seconds);
  if (mega_link_send_recovered(a->link, iteration, bytes, seconds, &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
}

static void on_checkpoint(void *arg, const mega_rank_ckpt_report *r) {
  assigned *a = arg;
  mega_err err = {0};
  if (mega_link_send_checkpoint(a->link, r, &err) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
}

static bool retryable(const mega_err *e) {
  return e->status == MEGA_ERR_PEER || e->status == MEGA_ERR_TIMEOUT;
}

/* Says why on stderr (megad keeps the last lines) and over the pipe. */
static int fail(assigned *a, const mega_err *e, int code) {
  fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, e->msg);
  bool again = retryable(e);
  /* a bad flag, file or checkpoint: a restart would meet it again */
  bool fatal = code == 2 || e->status == MEGA_ERR_INVALID || e->status == MEGA_ERR_UNSUPPORTED;
  mega_err ignored = {0};
  if (a->link) mega_link_send_error(a->link, e->msg, again, fatal, &ignored);
  return code;
}

static mega_status check_job(const mega_jobspec *job, int world, mega_err *err) {
  long long bytes = -1;
  if (mega_jobspec_data_file(job, 0, NULL) && mega_data_probe(job, &bytes, err) != MEGA_OK)
    return err->status;
  return mega_jobspec_check_all(job, world, bytes, err);
}

static bool released(void *arg) { return mega_link_released(arg); }

/* After the rank stopped: keeps its state for the next attempt and serves
 * it until megad lets go. False when it holds nothing usable. */
static bool hold(assigned *a, mega_rank *r, const Mega__V1__Assignment *as) {
  mega_rank_held h;
  mega_replica_server *srv = NULL;
  mega_err e = {0};
  if (mega_rank_hold(r, &h, &e) != MEGA_OK ||
      mega_replica_serve_open(r, &h, getenv("MEGA_WORKER_HOSTNAME"), as->job_id,
                              (int)as->attempt, &srv, &e) != MEGA_OK) {
    fprintf(stderr, "megaw: rank %u: not keeping its state: %s\n", a->rank_id, e.msg);
    return false;
  }
  size_t tlen;
  const uint8_t *token = mega_replica_server_token(srv, &tlen);
  if (mega_link_send_held(a->link, &h, mega_replica_server_address(srv), token, tlen, &e) !=
      MEGA_OK) {
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, e.msg);
    mega_replica_server_close(srv);
    return false;
  }
  fprintf(stderr, "megaw: rank %u: holding the state of iteration %lld (%.1f MB) for the next "
                  "attempt at %s\n", a->rank_id, (long long)h.iteration, (double)h.bytes / 1e6,
          mega_replica_server_address(srv));
  mega_status st = mega_replica_serve(srv, released, a->link, HOLD_MAX_MS, &e);
  fprintf(stderr, "megaw: rank %u: %s after serving %.1f MB\n", a->rank_id,
          st == MEGA_OK ? "released" : e.msg, (double)mega_replica_served_bytes(srv) / 1e6);
  mega_replica_server_close(srv);
  return true;
}

/* The Assignment's replica plan as the rank's (pointing into as). */
static bool plan_of(const Mega__V1__Assignment *as, mega_replica_plan *plan,
                    mega_replica_source **src, int **shards) {
  const Mega__V1__ReplicaPlan *p = as->replicas;
  *src = NULL;
  *shards = NULL;
  if (!p || !p->n_sources) return false;
  size_t total = 0;
  for (size_t i = 0; i < p->n_sources; i++) total += p->sources[i]->n_shards;
  *src = calloc(p->n_sources, sizeof **src);
  *shards = calloc(total + 1, sizeof **shards);
  if (!*src || !*shards) return false; /* the rank then says so: no source of its own */
  int *sh = *shards;
  for (size_t i = 0; i < p->n_sources; i++) {
    const Mega__V1__ReplicaSource *s = p->sources[i];
    for (size_t k = 0; k < s->n_shards; k++) sh[k] = (int)s->shards[k];
    (*src)[i] = (mega_replica_source){
        .pp = (int)s->pp, .tp = (int)s->tp, .donor_rank = (int)s->donor_rank,
        .address = s->address, .token = s->token.data, .token_len = s->token.len,
        .params = s->params, .full_moments = s->full_moments, .shards = sh,
        .nshards = s->n_shards, .shard_params = s->shard_params};
    sh += s->n_shards;
  }
  *plan = (mega_replica_plan){.job_id = as->job_id, .attempt = (int)p->attempt,
                              .iteration = (int64_t)p->iteration, .dp_size = (int)p->dp_size,
                              .sources = *src, .nsources = p->n_sources};
  return true;
}

static int run_rank(assigned *a, const mega_jobspec *job, const Mega__V1__Assignment *as) {
  const Mega__V1__Bootstrap *b = as->bootstrap;
  mega_rank_env env = {
      .job = job,
      .rank = (int)as->rank,
      .world_size = (int)as->world_size,
      .local_rank = (int)as->local_rank,
      .local_world_size = (int)as->local_world_size,
      .node_ranks = as->node_ranks,
      .n_node_ranks = as->n_node_ranks,
      .kv = as->world_size > 1 ? &mega_link_kv_ops : NULL,
      .kv_ctx = a->link,
      .kv_prefix = b && b->kv_prefix[0] ? b->kv_prefix : as->job_id,
      .kv_timeout_ms = b ? (int)b->kv_timeout_ms : 0,
      .hostname = getenv("MEGA_WORKER_HOSTNAME"),
      .state_dir = as->state_dir[0] ? as->state_dir : NULL,
      .device = -1,
      .attempt = (int)as->attempt,
      .on_step = on_step,
      .on_phase = on_phase,
      .on_note = on_note,
      .on_checkpoint = on_checkpoint,
      .await_commit = await_commit,
      .on_recovered = on_recovered,
      .arg = a,
  };
  mega_replica_plan plan;
  mega_replica_source *src;
  int *shards;
  if (plan_of(as, &plan, &src, &shards)) env.replicas = &plan;
  mega_err err = {0};
  mega_rank *r = NULL;
  if (mega_rank_create(&env, &r, &err) != MEGA_OK) {
    free(src);
    free(shards);
    return fail(a, &err, 1);
  }
  pthread_mutex_lock(&a->mu);
  a->rank = r;
  if (a->abort_reason) mega_rank_abort(r, a->abort_reason);
  if (a->stop_reason) mega_rank_request_exit(r, a->stop_reason);
  pthread_mutex_unlock(&a->mu);

  mega_err e2 = {0};
  if (mega_link_send_hello(a->link, "cpu", &e2) != MEGA_OK)
    fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, e2.msg);
  int rc = 0;
  if (mega_rank_run(r, &err) != MEGA_OK) {
    /* a peer's failure, or megad asking: the next attempt may want this state */
    bool may_hold = !stop_signal && !job->no_replica_recovery &&
                    (err.status == MEGA_ERR_CANCELLED ? mega_link_hold_asked(a->link)
                                                      : retryable(&err));
    if (err.status == MEGA_ERR_CANCELLED && stop_signal) {
      rc = 128 + stop_signal;
    } else if (err.status == MEGA_ERR_CANCELLED) { /* megad asked: it knows why */
      fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
      rc = 1;
    } else {
      rc = fail(a, &err, 1);
    }
    if (may_hold) hold(a, r, as);
  } else if (mega_rank_stopped(r)) {
    fprintf(stderr, "megaw: rank %u: stopped after iteration %lld: %s\n", a->rank_id,
            (long long)mega_rank_iteration(r), mega_rank_stopped(r));
    if (mega_link_send_stopped(a->link, mega_rank_iteration(r), mega_rank_stopped(r),
                               mega_rank_stop_was_mine(r), &err) != MEGA_OK)
      fprintf(stderr, "megaw: rank %u: %s\n", a->rank_id, err.msg);
  }
  pthread_mutex_lock(&a->mu);
  a->rank = NULL;
  pthread_mutex_unlock(&a->mu);
  mega_rank_destroy(r);
  free(src);
  free(shards);
  return rc;
}

/* The link's reader, and with --exit-signal-handler a SIGTERM that stays
 * caught however often it comes (the scheduler may signal every process of
 * the job, and megad pass it on too). */
static mega_status start_link(assigned *a, bool graceful, mega_err *err) {
  a->graceful = graceful;
  if (graceful) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    mega_link_on_stop(a->link, on_stop);
  }
  return mega_link_start(a->link, on_abort, a, err);
}

int megaw_run_assigned(const char *fd_env) {
  /* die with megad, even if it is SIGKILLed; and notice if it already died */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const char *ppid = getenv("MEGAD_PID");
  if (ppid && atoi(ppid) != (int)getppid()) {
    fprintf(stderr, "megaw: megad (pid %s) is gone; exiting\n", ppid);
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  char *end;
  long fd = strtol(fd_env, &end, 10);
  if (*fd_env == '\0' || *end || fd < 0 || fd > 1024) {
    fprintf(stderr, "megaw: MEGA_WORKER_FD='%s' is not a file descriptor; megad sets it\n", fd_env);
    return 2;
  }
  assigned a = {.phase = "setup"};
  pthread_mutex_init(&a.mu, NULL);
  mega_err err = {0};
  if (mega_link_open((int)fd, 30000, &a.link, &err) != MEGA_OK) {
    fprintf(stderr, "megaw: %s\n", err.msg);
    pthread_mutex_destroy(&a.mu);
    return 1;
  }
  const Mega__V1__Assignment *as = mega_link_assignment(a.link);
  a.rank_id = as->rank;
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  int rc;
  if (mega_jobspec_parse(&job, (int)as->n_args, as->args, &err) != MEGA_OK ||
      mega_jobspec_resolve_dirs(&job, &err) != MEGA_OK ||
      mega_jobspec_load_vocab(&job, &err) != MEGA_OK ||
      check_job(&job, (int)as->world_size, &err) != MEGA_OK) {
    rc = fail(&a, &err, 2);
  } else if (start_link(&a, job.exit_signal_handler, &err) != MEGA_OK) {
    rc = fail(&a, &err, 1);
  } else {
    rc = run_rank(&a, &job, as);
  }
  mega_jobspec_free(&job);
  mega_link_close(a.link);
  free(a.abort_reason);
  free(a.stop_reason);
  pthread_mutex_destroy(&a.mu);
  return rc;
}
