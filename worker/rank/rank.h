/* One rank of a parallel job: what megaw runs once it knows who it is.
 *
 * The rank builds its topology (core/topology), meets its peers through the
 * rendezvous store, builds a communicator per group it belongs to, builds
 * the stage models of its pipeline chunks from the layout, and trains: each
 * iteration the engine executes this rank's action list from core/schedule
 * (its GS/GW actions reduce the gradient buckets over the data-parallel
 * group, worker/engine/grads.h), then the gradients are finalised (the embedding
 * group's all-reduce) and the optimizer steps (with the distributed
 * optimizer, on this rank's shards, then the parameters are all-gathered). After each iteration the rank hands a mega_rank_metrics to
 * on_step, which megaw forwards to its daemon (or prints, when alone).
 *
 *   mega_rank *r;
 *   mega_rank_create(&env, &r, &err);   // cheap: checks, no I/O with peers
 *   ... another thread may now call mega_rank_abort(r, "why") at any time ...
 *   mega_rank_run(r, &err);             // set up, train, checkpoint
 *   mega_rank_destroy(r);
 *
 * mega_rank_run is mega_rank_setup, then mega_rank_step and the due
 * checkpoints until --train-iters; tests drive the steps themselves.
 *
 * A world of one needs no store. Otherwise exactly one of kv (the daemon's
 * store, through the worker's pipe) or store_dir (Gloo's FileStore on a
 * directory all ranks see: tests and hand launches) is set.
 *
 * Ownership: env and everything it points to are borrowed and must outlive
 * the rank; the rank copies nothing it does not say it copies. */
#ifndef MEGA_WORKER_RANK_H
#define MEGA_WORKER_RANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/comm/comm.h"
#include "worker/engine/span.h"

/* One gradient reduction of an iteration (seed 003's measurements): a
 * data-parallel bucket, or the tied embedding's all-reduce over the
 * embedding group (bucket -1). Times are seconds from the step's start
 * (step_start_unix_us), -1 where unknown (a communicator that keeps no
 * times, NCCL's). */
typedef struct mega_rank_reduction {
  int bucket, chunk;
  bool tied;           /* the tied embedding's bucket, or the embedding group's all-reduce */
  uint64_t floats;     /* what this rank's collective reduces (the whole bucket) */
  double launched_s;   /* handed to the communicator (backward, GS, or finalize) */
  double started_s;    /* begun on its comm thread, the collectives before it done */
  double done_s;       /* finished there: every peer had taken part */
  double waited_s;     /* the rank's wait for it returned */
  double cpu_s, runq_s; /* its comm thread's CPU time, and time runnable without a core */
} mega_rank_reduction;

/* What one rank measured in one iteration. Times are seconds on this rank. */
typedef struct mega_rank_metrics {
  int64_t iteration; /* 1-based */
  int rank, pp_rank, dp_rank, tp_rank;
  bool has_loss; /* the last pipeline stage knows the loss */
  double loss;   /* mean cross-entropy over the iteration's G*T tokens (all DP) */
  bool has_grad_norm;
  double grad_norm; /* global, before clipping */
  double lr;
  uint64_t tokens; /* tokens of this rank's data-parallel replica */
  uint64_t global_tokens; /* of every replica (they differ under --variable-seq-lengths) */
  int global_batch; /* this iteration's (it grows under --rampup-batch-size) */
  bool skipped;    /* the optimizer skipped a non-finite step */
  double step_time_s;
  double compute_s; /* F, B and W */
  double tp_comm_s; /* of that, the tensor-parallel collectives (on the critical path) */
  double bubble_s;  /* waiting for a peer with nothing to compute */
  double bubble_warmup_s, bubble_steady_s, bubble_cooldown_s;
  double p2p_wait_s;          /* waiting for P2P transfers themselves */
  double grad_sync_exposed_s; /* gradient reduction not hidden behind compute */
  uint64_t peak_activation_bytes;
  int peak_inflight; /* (microbatch, chunk) activations alive at once */
  uint64_t param_bytes;           /* resident parameter buffers of this rank */
  uint64_t grad_bytes;            /* its gradient buffers */
  uint64_t optimizer_state_bytes; /* its optimizer state (the moments it owns) */
  uint64_t shard_copy_bytes;      /* the copy of another rank's shard it keeps (moments) */
  double shard_copy_s;            /* of step_time_s: waiting for its exchange, stepping it */
  bool has_eval_loss; /* an evaluation ran after this iteration (last stage) */
  double eval_loss;   /* mean cross-entropy over --eval-iters forward-only batches */
  /* The last iteration of a run that ended normally (mega_rank_run): the
   * evaluation after training, on the validation set (after the
   * --eval-interval one when both fall here, on the next batches) and on
   * the test set (Megatron's "iteration N on validation/test set"). */
  bool has_final_eval_loss, has_test_loss;
  double final_eval_loss, test_loss;
  int64_t step_start_unix_us;
  /* Where the gradient reductions fell against the pipeline (seconds from
   * the step's start): this rank's last action other than GS and GW ended,
   * the pipeline's (the latest over its stages), and the gradients this
   * rank's share of the norm needs were reduced. */
  double work_end_s, drained_s, reduced_s;
  /* CPU over the step: the training thread's, its time runnable without a
   * core (Linux schedstat; -1 unknown), and every thread's of the process
   * (comm threads, Gloo's I/O, BLAS). */
  double thread_cpu_s, thread_runq_s, process_cpu_s;
  const mega_rank_reduction *reductions; /* valid during on_step */
  size_t nreductions;
  const mega_rank_span *spans; /* only for --trace-iteration; valid during on_step */
  size_t nspans;
} mega_rank_metrics;

/* A checkpoint as one rank saw it (mega_rank_env.on_checkpoint). Every
 * rank reports once its part of iteration's checkpoint is durable
 * (committed false; a replica that writes nothing reports too); the
 * committing rank reports again once the manifest and
 * latest_checkpointed_iteration.txt are written (committed true). */
typedef struct mega_rank_ckpt_report {
  int64_t iteration;
  const char *path;  /* SAVE/iter_NNNNNNN (valid during the call) */
  uint64_t bytes;    /* written by this rank; committed: the whole checkpoint */
  double duration_s; /* from the start of the save */
  double blocked_s;  /* of that, the time training waited */
  bool committed;
} mega_rank_ckpt_report;

/* Recovery from replicas (see "Recovery from replicas" below): where the
 * ranks of a new attempt take their state from. One source per held rank
 * of the ended attempt that a (pp, tp) coordinate needs; a rank uses the
 * sources of its own coordinate. Borrowed, like the rest of env. */
typedef struct mega_replica_source {
  int pp, tp;
  int donor_rank;
  const char *address; /* host:port */
  const uint8_t *token;
  size_t token_len;
  bool params;       /* every parameter from this donor */
  bool full_moments; /* every moment from this donor */
  const int *shards; /* distributed optimizer: these DP shards' moments */
  size_t nshards;
  bool shard_params; /* and their parameters */
} mega_replica_source;

typedef struct mega_replica_plan {
  const char *job_id;
  int attempt;       /* the donors' (ended) attempt */
  int64_t iteration; /* the state every source holds */
  int dp_size;       /* that attempt's DP */
  const mega_replica_source *sources;
  size_t nsources;
} mega_replica_plan;

typedef struct mega_rank_env {
  const mega_jobspec *job; /* passed mega_jobspec_check for this world */
  int rank, world_size;
  int local_rank, local_world_size;
  /* Every global rank on this node (may be NULL): a group of only these
   * ranks rendezvouses through this node's megad alone. Borrowed. */
  const uint32_t *node_ranks;
  size_t n_node_ranks;

  /* Rendezvous (see above). */
  const mega_kv_ops *kv;
  void *kv_ctx;
  const char *store_dir;
  const char *kv_prefix;  /* private to one job attempt, e.g. "j-7/1" */
  int kv_timeout_ms;      /* rendezvous and collective timeout; 0: 60000 */
  const char *hostname;   /* address this rank binds for its peers; NULL: 127.0.0.1 */

  const char *state_dir;  /* this rank's scratch directory (traces); may be NULL */
  int device;             /* CUDA device, or -1 for the cpu backend */
  /* Tests: build each group's device and host communicators apart (as a
   * cuda rank does) on a cpu backend that tracks its memory, and check that
   * each gets only its kind of memory (worker/rank/rank_comm.c). */
  bool check_comm_memory;
  int attempt;            /* the launcher's attempt (0 by hand): names checkpoint temp files
                             and is recorded in every checkpoint's manifest */

  /* Called on the rank's thread after every iteration. */
  void (*on_step)(void *arg, const mega_rank_metrics *m);
  /* Called when the rank enters a phase ("setup", "train", "eval",
   * "checkpoint") with the iterations completed, so megad's hang check knows which
   * time limit applies. May be NULL. */
  void (*on_phase)(void *arg, const char *phase, int64_t iteration);
  /* Called on rank 0 (the same holds on every rank) with a sentence for
   * the user about the run: that the data gives no test set, or that an
   * exit at the last iteration came before the evaluation after training.
   * May be NULL. */
  void (*on_note)(void *arg, const char *note);
  /* Called for each checkpoint report (above); may run on the rank's
   * checkpoint thread (--async-save). May be NULL. */
  void (*on_checkpoint)(void *arg, const mega_rank_ckpt_report *r);
  /* Under a coordinator: the committing rank asks before it commits
   * iteration's checkpoint, once every rank's part is durable. MEGA_OK
   * commits; any other status leaves the checkpoint uncommitted (err says
   * why; loads never use it). NULL: commit at once. May run on the
   * checkpoint thread. */
  mega_status (*await_commit)(void *arg, int64_t iteration, mega_err *err);
  /* Set: setup takes the rank's weights, optimizer state, iteration and
   * data position from these held ranks instead of --load, then calls
   * on_recovered (may be NULL) with what it moved. */
  const mega_replica_plan *replicas;
  void (*on_recovered)(void *arg, int64_t iteration, uint64_t bytes, double seconds);
  void *arg;
} mega_rank_env;

typedef struct mega_rank mega_rank;

mega_status mega_rank_create(const mega_rank_env *env, mega_rank **out, mega_err *err);

/* Builds the backend, model chunks, schedule and optimizer, meets the peers
 * and builds the groups, and resumes from --load when it holds a
 * checkpoint. */
mega_status mega_rank_setup(mega_rank *r, mega_err *err);

/* One iteration: the schedule, gradient reductions, optimizer, and the
 * evaluation every --eval-interval iterations. When that evaluation fails
 * the iteration is trained all the same: mega_rank_iteration counts it and
 * *m holds its report (without eval_loss). */
mega_status mega_rank_step(mega_rank *r, mega_rank_metrics *m, mega_err *err);

/* Writes a checkpoint of the current iteration under --save. Every rank of
 * the job calls it at the same iteration. The dp 0, tp 0 rank of each
 * pipeline stage writes that stage's tensors, and rank 0 commits; the
 * others report at once (on_checkpoint). Every rank returns when the
 * others have reached the save too. Without --async-save that is once the
 * checkpoint is committed (or refused). With --async-save it is once the
 * writers' tensors are copied to host memory; the files are written on a
 * thread, and the next save, mega_rank_save_wait and mega_rank_run wait for
 * it. A failure of that write is returned by whichever waits next. */
mega_status mega_rank_save(mega_rank *r, mega_err *err);
/* Waits for this rank's checkpoint write in flight, if any. */
mega_status mega_rank_save_wait(mega_rank *r, mega_err *err);

int64_t mega_rank_iteration(const mega_rank *r); /* completed */
const char *mega_rank_loaded_path(const mega_rank *r); /* the checkpoint resumed, or NULL */
/* One line when --load passed over an incomplete checkpoint (which, why,
 * and what loaded instead), else NULL. Valid until destroy. */
const char *mega_rank_load_notice(const mega_rank *r);
size_t mega_rank_num_params(const mega_rank *r);       /* in this rank's chunks */

/* Sets up if needed, then trains to --train-iters (or until aborted), saving
 * when due, and waits for the last checkpoint's write. MEGA_ERR_CANCELLED
 * after an abort; MEGA_ERR_PEER when another rank failed (the message names
 * it). It may stop early, as Megatron's training loop does (rank_exit.c):
 * after an iteration divisible by --exit-interval, or at the first boundary
 * where any rank has been asked to stop (mega_rank_request_exit, with
 * --exit-signal-handler) or has run --exit-duration-in-mins; every rank then
 * saves that iteration's checkpoint (with --save, unless it was just saved)
 * and returns MEGA_OK, and mega_rank_stopped says why. After the last
 * iteration it evaluates the validation and test sets as Megatron's
 * pretrain does, unless one of those exits falls there: that skips the
 * evaluation (on_note says why) and the run has ended, not stopped. Every
 * trained iteration is reported (on_step), the last one with the
 * evaluation's losses, even when what follows it fails. */
mega_status mega_rank_run(mega_rank *r, mega_err *err);

/* With --exit-signal-handler: asks the rank to stop at the next iteration
 * boundary, saving first (a SIGTERM's meaning). Any thread (not a signal
 * handler); the first why is kept (copied). Without the flag it does
 * nothing: stop such a rank with mega_rank_abort. */
void mega_rank_request_exit(mega_rank *r, const char *why);
/* Why mega_rank_run stopped before --train-iters ("SIGTERM
 * (--exit-signal-handler)", "--exit-interval 5", ...), or NULL. */
const char *mega_rank_stopped(const mega_rank *r);
/* Whether that reason is this rank's own (it was asked, its clock, its
 * iteration) rather than the other ranks' agreement. */
bool mega_rank_stop_was_mine(const mega_rank *r);

/* From any thread, at any time after create: stops the rank promptly. Every
 * communicator is aborted, so the rank's peers fail fast as well. */
void mega_rank_abort(mega_rank *r, const char *reason);

void mega_rank_destroy(mega_rank *r); /* NULL is fine */

/* ---- Recovery from replicas ----
 *
 * When an attempt fails, a rank whose state is whole need not die with it.
 * After mega_rank_run (or a step) returned a failure, or after an abort,
 * mega_rank_hold stops what is in flight (every communicator aborted, so
 * the rank's peers fail fast) and says what consistent state the rank
 * still holds: usually its state after the last completed iteration; with
 * the distributed optimizer, when the failure came after this rank's
 * optimizer step, only its own shard and its copy, one iteration later.
 * A server (mega_replica_serve_*) then hands that state, rank to rank over
 * TCP, to the ranks of the next attempt (mega_rank_env.replicas), whatever
 * their data-parallel size: tensors go by index, so shards cut for one DP
 * size are put back together for another. A fetch must present the
 * server's token, so only the attempt the coordinator gave it to can take
 * the state. The rank must not be stepped again after hold. */
typedef struct mega_rank_held {
  int64_t iteration; /* the state's completed iterations */
  int pp, tp, dp, dp_size;
  bool all_params;   /* every parameter is at iteration */
  bool full_moments; /* and every moment (no distributed optimizer) */
  int shards[2];     /* distributed optimizer: the shards held whole (own, copy) */
  int nshards;
  uint64_t bytes;    /* parameters and moments held */
} mega_rank_held;

/* MEGA_ERR_UNSUPPORTED with the reason when the rank holds nothing usable
 * (stopped before its setup finished, while it fetched or loaded its state,
 * or inside a step's update). */
mega_status mega_rank_hold(mega_rank *r, mega_rank_held *out, mega_err *err);

typedef struct mega_replica_server mega_replica_server;

/* Listens on host (NULL: 127.0.0.1) for fetches of r's held state (hold
 * first). job_id and attempt are the held rank's: a fetch must name the
 * job and a later attempt. r must outlive the server. */
mega_status mega_replica_serve_open(mega_rank *r, const mega_rank_held *held, const char *host,
                                    const char *job_id, int attempt, mega_replica_server **out,
                                    mega_err *err);
const char *mega_replica_server_address(const mega_replica_server *s);
const uint8_t *mega_replica_server_token(const mega_replica_server *s, size_t *len);
/* Serves fetches, one at a time, until stop(arg) is true (asked every
 * 100 ms and after each fetch) or max_ms passed (MEGA_ERR_TIMEOUT). A
 * fetch that fails (a peer that dies midway) is logged to stderr and the
 * server goes on. */
mega_status mega_replica_serve(mega_replica_server *s, bool (*stop)(void *arg), void *arg,
                               int max_ms, mega_err *err);
uint64_t mega_replica_served_bytes(const mega_replica_server *s);
void mega_replica_server_close(mega_replica_server *s); /* NULL is fine */

#endif
