/* A rank's state, shared by the rank's files (worker/rank/rank*.c): rank.c
 * creates it, sets it up and runs the steps; each section below names the
 * file that gives the others its functions. Private to the rank. */
#ifndef MEGA_WORKER_RANK_INTERNAL_H
#define MEGA_WORKER_RANK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/topology.h"
#include "worker/data/data.h"
#include "worker/engine/chunks.h"
#include "worker/engine/engine.h"
#include "worker/optim/lr_sched.h"
#include "worker/rank/abort_guard.h"
#include "worker/rank/rank.h"
#include "worker/rank/rank_load.h"
#include "worker/rank/rank_saver.h"

/* GROUP_CKPT: the writers (each stage's dp 0, tp 0 rank), used only by
 * whichever thread writes a checkpoint, never by the training thread's
 * collectives (comm.h, Ordering). */
enum { GROUP_PP, GROUP_DP, GROUP_EMBD, GROUP_TP, GROUP_CKPT, NGROUPS };

/* The rank's tensor parallelism (rank_tp.c): the model's collectives go
 * over comm (r->dcomm[GROUP_TP]) and add their time to comm_s. With --save,
 * the ranks of dp 0 gather their slices for the writer, which holds whole
 * copies (whole) of the tensors it saves. */
typedef struct rank_tp {
  mega_comm *comm;  /* device memory: the model's collectives */
  mega_comm *hcomm; /* host memory: checkpoint slices */
  int size;
  size_t *counts; /* [size] scratch */
  double comm_s;
  mega_ckpt_param *local, *whole; /* [nwhole]: this rank's views, the writer's whole ones */
  size_t nwhole;
} rank_tp;

struct mega_rank {
  mega_rank_env env;
  const mega_jobspec *job;
  mega_topo topo;
  mega_coord me;
  atomic_bool aborted;
  char abort_reason[256];

  mega_backend *be;
  mega_layout layout;
  mega_chunks chunks;
  mega_schedule sched;
  mega_data *data;
  mega_batch_plan plan;      /* training's, for the current global batch */
  mega_batch_plan eval_plan; /* --global-batch-size's */
  mega_lr_sched lr;
  mega_optim *optim;
  mega_optim *copy; /* distributed optimizer: the copy of another rank's shard (grads.h) */
  mega_store *store;
  /* Per group, the communicators for device and for host memory (the rule
   * for which carries what is in rank_comm.c); the same one on a cpu rank.
   * NULL where this rank is in no such group of size > 1, or the group
   * carries no such memory. */
  mega_comm *dcomm[NGROUPS], *hcomm[NGROUPS];
  pthread_mutex_t comm_lock; /* guards them against mega_rank_abort's thread */
  mega_abort_guard guard;    /* the norm's last sums, which an abort lets finish */
  rank_tp tp;
  mega_p2p *p2p;
  bool simulate;
  mega_rank_ckpt_loaded loaded;
  mega_ckpt_param *save_params; /* the writer's tensors: chunks' views less the tied copy */
  mega_rank_saver *saver;       /* writers with --save */
  mega_engine *engine;
  mega_schedule eval_sched;  /* forward-only, when the job evaluates */
  mega_engine *eval_engine;
  mega_engine *test_engine;  /* the same schedule on the test split's batches */
  int64_t eval_done;         /* evaluation batches run so far */
  int64_t iteration; /* completed */
  /* setup finished: the parameters and moments are this run's (drawn,
   * loaded or fetched from replicas); before, a fetching rank's are not */
  bool ready;
  /* Where a failure leaves the state (mega_rank_hold): stepping once the
   * optimizer of iteration+1 may have begun, stepped once it (and the
   * copy) took that step; both clear when the iteration completes. */
  bool stepping, stepped;
  /* stopping early (rank_exit.c) */
  atomic_bool exit_claimed, exit_asked; /* claimed: exit_why is being written */
  char exit_why[160];
  char stopped[256]; /* why mega_rank_run stopped early; empty: it did not */
  bool stopped_mine; /* ... for a reason of this rank's own */
  double start_s;    /* monotonic seconds at setup, for --exit-duration-in-mins */
  mega_rank_span *spans;
  size_t nspans, span_cap;
  mega_rank_reduction *reductions; /* [nbuckets + 1], this iteration's */
  size_t nreductions;
};

/* Writes a checkpoint for its stage: each stage's dp 0, tp 0 rank. */
static inline bool rank_is_writer(const mega_rank *r) { return r->me.dp == 0 && r->me.tp == 0; }

static inline void rank_phase(mega_rank *r, const char *name) {
  if (r->env.on_phase) r->env.on_phase(r->env.arg, name, r->iteration);
}

/* rank_comm.c */
/* Opens the rendezvous store and builds every group's communicators. */
mega_status rank_build_groups(mega_rank *r, mega_err *err);
/* rank_samejob.c: a hand launch's ranks (no megad) check through the store,
 * before any group, that they were given the same job; a difference is
 * MEGA_ERR_INVALID on every rank, naming the flag. */
mega_status rank_same_job(mega_rank *r, mega_store *store, int timeout_ms, mega_err *err);
/* A hand launch's rank that failed before the ranks met (out of memory,
 * say) publishes why in their place, so that the others stop at once,
 * naming it, rather than wait out the store's timeout for a rank that will
 * never come. Best effort; nothing for ranks under megad, which stops them. */
void rank_same_job_failed(const mega_rank *r, const char *why);
/* The rendezvous store's key prefix (rank_samejob.c). */
const char *rank_store_prefix(const mega_rank *r);
/* Sums one double per rank of group c (NULL: this rank alone), in rank
 * order, so every member gets the same bits whatever the group's size. */
mega_status rank_sum_doubles(mega_comm *c, double *v, mega_err *err);
/* Aborts group g's communicators (the caller holds comm_lock). */
void rank_comm_abort_locked(mega_rank *r, int g);
void rank_comm_destroy_all(mega_rank *r);

/* rank_tp.c */
/* The stages' TP description (its collectives bound to r->tp). */
mega_status rank_tp_init(mega_rank *r, mega_gpt_tp *out, mega_err *err);
void rank_tp_free(mega_rank *r);
/* TP communication time since the last call. */
double rank_tp_take_comm_s(mega_rank *r);
/* Sums the sequence-parallel layernorm gradients over the TP group. */
mega_status rank_tp_finalize_grads(mega_rank *r, mega_err *err);
/* The writer's whole copies of local's n tensors (moments where local has
 * them), filled by rank_tp_gather. */
mega_status rank_tp_whole_build(mega_rank *r, const mega_ckpt_param *local, size_t n,
                                mega_err *err);
void rank_tp_whole_free(mega_rank *r);
mega_status rank_tp_gather(mega_rank *r, const mega_ckpt_param *local, size_t n, mega_err *err);

/* rank_save.c */
/* A distributed optimizer holds only its shards of the moments, and
 * checkpoints hold whole tensors: whole moments live in these arrays (one
 * per chunk and moment, laid out like the chunk's buffers) while a
 * checkpoint is saved or loaded. */
typedef struct rank_whole_moments {
  int vp;
  float **avg, **sq;
} rank_whole_moments;
mega_status rank_whole_moments_alloc(mega_rank *r, rank_whole_moments *w, mega_err *err);
void rank_whole_moments_free(rank_whole_moments *w);
/* The writer's tensors and its saver (after the optimizer and the groups). */
mega_status rank_build_saver(mega_rank *r, mega_err *err);

/* rank_measure.c */
/* The training thread's CPU seconds and run-queue seconds so far (runq -1
 * without schedstat), and the process's CPU seconds. */
void rank_thread_clock(double *cpu, double *runq, double *process_cpu);
/* r->reductions from the buckets' times and the embedding all-reduce's,
 * as seconds from t0 (wall); with trace, their spans are appended. */
mega_status rank_collect_reductions(mega_rank *r, double t0, bool trace, mega_err *err);

/* rank_exit.c */
/* After iteration's step (and its due save): whether to stop now, with
 * r->stopped set; at the last iteration too, where a stop skips the
 * evaluation after training (rank_end). With --exit-signal-handler or --exit-duration-in-mins
 * every rank takes part in a small all-reduce, so all stop together. */
mega_status rank_exit_check(mega_rank *r, bool *stop, mega_err *err);
double rank_now_s(void);

/* rank_eval.c */
/* --eval-iters forward-only batches of the validation set after iteration
 * r->iteration (Megatron's evaluate_and_print_results), going on from
 * r->eval_done; the loss, on the last stage, in m's eval_loss. */
mega_status rank_evaluate(mega_rank *r, mega_rank_metrics *m, mega_err *err);
/* The end of a run at its last iteration, with st the status of its save
 * and exit check and stop whether an exit came (Megatron's exit before its
 * evaluation after training): unless either, the validation and test sets
 * are evaluated into m; then m is reported (env.on_step) whatever that
 * gave, since the iteration itself is trained. Returns st, or the
 * evaluation's failure. */
mega_status rank_end(mega_rank *r, mega_rank_metrics *m, mega_status st, bool stop,
                     mega_err *err);
/* Gives rank 0's launcher a note (env.on_note). */
void rank_note(mega_rank *r, const char *note);

/* rank_load.c */
/* --load into the chunks and the optimizer (resharding a distributed
 * optimizer's moments). */
mega_status rank_load_checkpoint(mega_rank *r, mega_err *err);

/* rank_fetch.c */
/* mega_rank_env.replicas into the chunks, the optimizer (and its copy),
 * the iteration and the evaluation count. */
mega_status rank_fetch_replicas(mega_rank *r, mega_err *err);

#endif
