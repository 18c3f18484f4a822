/* The coordinator's files, each calling only files listed below it; two
 * joined by "and" are one level in two files, and call each other
 * (tests/layers/calls_allowed.txt says why):
 *
 *   coord.c        submit, scheduling, launches, the recovery decision,
 *                  cancel, resume, rescale, membership events; and
 *   coord_etcd.c   in etcd mode, taking over orphaned jobs and standing
 *                  down (a takeover schedules; the tick sweeps for orphans)
 *   coord_launch.c asking a node to start its ranks of an attempt
 *   coord_held.c   what an old attempt's ranks kept, asked of its nodes
 *                  before the job restarts; it tells coord.c through
 *                  megad_coord.held_gathered
 *   coord_retain.c forgetting ended jobs, and other nodes' job directories
 *   coord_admit.c  what a job must be to be accepted at submit
 *   coord_run.c    one running attempt: worker reports, checkpoints,
 *                  failures and their cause, aborts; and
 *   coord_end.c    its end: the held states and the replica plan, what the
 *                  survivors completed; it tells coord.c through
 *                  megad_coord.attempt_over
 *   coord_late.c   steps of attempts over, sent again after a takeover
 *   coord_queue.c  the queue of waiting jobs
 *   coord_place.c  where a job can run now
 *
 * Private to the coordinator.
 *
 * How much a failure explains: a rank that fails because a peer died says
 * so with a retryable WorkerError (a secondary cause); the peer's own crash
 * or non-retryable error is the cause (primary). A secondary cause waits
 * CAUSE_WAIT_MS for a primary one before the attempt is stopped (longer
 * while a node of the job has gone quiet: its loss is the cause then). */
#ifndef MEGA_DAEMON_COORD_INTERNAL_H
#define MEGA_DAEMON_COORD_INTERNAL_H

#include "daemon/coord/coord.h"
#include "daemon/model/replicas.h"
#include "daemon/model/stepmerge.h"

enum { CAUSE_NONE, CAUSE_SECONDARY, CAUSE_PRIMARY };
#define CAUSE_WAIT_MS 1500
#define PENDING_SAVES 8 /* checkpoints whose ranks are still reporting */

/* One checkpoint iteration while its ranks report it saved. */
typedef struct save_wait {
  uint64_t iteration; /* 0: free */
  uint32_t nsaved;
  bool *saved; /* [world] */
  bool asked;  /* the go-ahead was sent */
} save_wait;

typedef struct coord_run {
  struct coord_run *prev, *next; /* megad_coord.runs */
  megad_coord *c;
  mega_job *job;
  uint32_t world;
  mega_stepmerge *merge;
  char kv_prefix[192];
  int trace_iteration;
  bool *hello, *exited, *errored;
  uint32_t nhello, nexited;
  int64_t started_ms; /* placed */
  uint64_t started_loop_ms; /* the same, on the loop's clock */
  save_wait saves[PENDING_SAVES];
  /* commits refused while this node could not act (etcd away): how many,
   * and their first and last iterations, for the event when they resume */
  uint32_t skipped;
  uint64_t skipped_first, skipped_last;
  /* the end */
  bool stopping;
  /* this node stalled past the heartbeat timeout (no etcd): the other
   * nodes took it for lost, stopped their ranks with hold and report no
   * more to it; at the end it asks them what they kept (gather) */
  bool orphaned, gather;
  mega_end_kind end_kind;
  char *cause;
  int cause_prio;
  mega_end_kind cause_kind;
  uint64_t cause_since; /* uv_now of the first secondary cause */
  uv_timer_t cause_timer, stop_timer;
  int timers_open; /* while closing */
  megad_cancel_wait *cancels;
  size_t ncancels;
  /* Recovery from replicas: what each rank held when it stopped (owned
   * copies, [world]) and on which node; and, for an attempt that fetched
   * its state from replicas, their plan (owned) and what the ranks said. */
  Mega__V1__RankHeld **held;
  char **held_node;
  uint32_t nheld;
  Mega__V1__ReplicaPlan *plan;
  uint64_t plan_redone;
  bool *recovered; /* [world]: the rank said RankRecovered */
  uint32_t nrecovered;
  uint64_t recovered_bytes;
  double recovered_s; /* the slowest rank's fetch */
  /* The launch (coord_launch.c): the ranks' flags (owned), and while
   * preparing, how many nodes have not said yes yet; no rank runs then. */
  char **args;
  size_t nargs;
  bool preparing;
  uint32_t unprepared;
  /* the first node's answer of what its files give the job, which the
   * others' must equal (coord_launch.c); files_node "": none yet */
  megad_launch_files files;
  char files_node[128];
  /* ranks that stopped early as asked (WorkerStopped): the first one's why */
  char *stopped;
  bool stopped_mine; /* said by a rank that was asked itself */
  uint64_t stopped_iteration;
} coord_run;

/* coord.c: ends j, the jobs layer's megad_job_finalize plus what the
 * coordinator kept for it (why it waited). Every end of a job this node
 * coordinates goes through here. */
void coord_finalize(megad_coord *c, mega_job *j, mega_job_state state, const char *error);

/* coord_admit.c: what a job must be to be accepted (bounds first, then the
 * paths under the roots, placeability and the queue's room) */
#define MEGAD_JOB_NAME_MAX 128
#define MEGAD_JOB_ARGS_MAX 512  /* flag words */
#define MEGAD_JOB_ARG_MAX 4096  /* bytes in one word (a path) */
#define MEGAD_NODES_MAX 1024
#define MEGAD_NPROC_MAX 4096
#define MEGAD_WORLD_MAX 65536
#define MEGAD_RESTARTS_MAX 10000
mega_status coord_check_msg(const megad_coord *c, const Mega__V1__JobSpec *spec, mega_err *err);
mega_status coord_admit(megad_coord *c, const mega_job *j, mega_err *err);
/* MEGA_ERR_INVALID naming the other job when j's --save is that of another
 * job of this node that has not ended (submit, and megactl resume). */
mega_status coord_save_in_use(const megad_coord *c, const mega_job *j, mega_err *err);

/* coord_queue.c: the queue of waiting jobs. add puts j in submission order
 * (a restarting job goes before the younger ones); remove takes it out. */
void coord_wq_add(megad_coord *c, mega_job *j);
void coord_wq_remove(megad_coord *c, mega_job *j);
/* coord_retain.c: forgets the ended jobs past o.retain_jobs, those that
 * ended longest ago first, and those ended more than o.retain_ms ago;
 * removes the directories of other nodes' jobs that ran here by the same
 * limits; then lets the jobs layer compact a journal that is mostly
 * history. O(jobs + dirs log dirs); it runs after every job's end and every
 * launch's end here, and, for the age, every 10 s. */
void coord_retain(megad_coord *c, int64_t now_ms);

/* coord_place.c: where a job can run now */
uint32_t coord_nproc(megad_coord *c, const mega_job *j); /* ranks per node */
/* core/jobspec's check for a world, on the data file as this node sees it. */
mega_status coord_check_world(const mega_jobspec *s, int world, mega_err *err);
/* Picks nodes for j: idx gets node indexes into members, *n their count,
 * the largest count in j's range that gives a valid job. own: j's own ranks
 * count as free (a re-plan); empty: every slot counts as free (could it run
 * at all). UNSUPPORTED: not enough usable nodes now; INVALID: no count in
 * range gives a valid job. */
mega_status coord_place(megad_coord *c, mega_job *j, bool own, bool empty, int *idx, int *n,
                        mega_err *err);
/* The placement a job would get now, as a node count (0: none). */
uint32_t coord_could_place(megad_coord *c, mega_job *j, bool own);
/* Notes that an ended attempt's ranks left their nodes. */
void coord_released(megad_coord *c, const mega_job *j);
/* Notes that node_id refused a launch: full until a newer view of it. */
void coord_refused(megad_coord *c, const char *node_id);

/* coord_launch.c: starts run's attempt with args (owned from now on, as
 * mega_jobspec_to_argv made them) and run->plan: every node of the
 * placement checks first, and only once all said yes does any start its
 * ranks. A refusal is the attempt's cause (a busy node: placed again; a bad
 * job: it fails); a refusal of the check starts no rank anywhere, one of
 * the start counts the node's ranks as gone. The attempt may be over when
 * this returns. */
void coord_launch_attempt(coord_run *run, char **args, size_t nargs);

/* coord_run.c: one running attempt */
coord_run *coord_run_new(megad_coord *c, mega_job *j, int trace_iteration);
coord_run *coord_run_of(megad_coord *c, const char *job_id, uint32_t attempt);
/* Ranks [first, first+n) will never report (not started, or their node is
 * lost): counted as exited. */
void coord_ranks_gone(coord_run *run, uint32_t first, uint32_t n);
/* A failure of the attempt, with its weight and kind. Soon after a stall of
 * this node that the attempt could not outlive, the stall is the cause
 * (COORDINATOR, primary) whatever the failure seen. */
void coord_cause(coord_run *run, int prio, mega_end_kind kind, const char *msg);
/* Whether the attempt could not outlive this node's newest stall, if it
 * ended within window_ms; then the sentence that says so, in buf, and
 * run->orphaned when the other nodes took this one for lost. */
bool coord_stall_cause(coord_run *run, uint64_t window_ms, char *buf, size_t len);
/* Ends the attempt: every node aborts its ranks; once every rank has exited
 * (or after the grace) the recovery decision is made. */
void coord_stop(coord_run *run, mega_end_kind kind, const char *why);

/* Sends AbortJob for j's current attempt to a node (stale: the attempts
 * before it), or aborts here when the node is this one. */
void coord_abort_on(megad_coord *c, const mega_job *j, const char *node_id, bool stale,
                    const char *reason);
/* The same for a given attempt; hold: ranks with a whole state keep it for
 * the next attempt (launch.h, megad_launch_hold). */
void coord_abort_attempt(megad_coord *c, const mega_job *j, const char *node_id,
                         uint32_t attempt, bool stale, bool hold, const char *reason);
/* Sends AbortJob for the attempt to every node of the placement. */
void coord_abort_nodes(coord_run *run, const char *reason, bool hold);
/* The attempt's cause, replaced (coord_cause weighs it first). */
void coord_set_cause(coord_run *run, int prio, mega_end_kind kind, const char *msg);
void coord_run_free(coord_run *run);

/* coord_end.c: the attempt is over (every rank's exit is known): plans
 * where the next one takes its state from, records what the survivors
 * completed, frees run and tells the coordinator (attempt_over). */
void coord_run_finish(coord_run *run);
/* coord_end.c: where j's next attempt takes its state from, given the
 * ranks of its attempt that hold one (d, n): j->coord.replicas, or why not
 * in j->coord.replicas_why; the attempt's nodes become j->coord.donors.
 * floor: the iteration the attempt took from replicas (0: none), below
 * which a rank holds nothing of the run (mega_replicas_in.floor). */
void coord_plan_replicas(megad_coord *c, mega_job *j, const mega_replica_donor *d, size_t n,
                         uint64_t floor);
/* coord_end.c: lets the ranks that hold j's state for a later attempt go
 * (j->coord.donors) and forgets the plan that named them. */
void coord_release_donors(megad_coord *c, mega_job *j, const char *why);
/* coord_held.c: asks every node of j's placement what its ranks of j's
 * attempt hold; j waits (j->coord.gathering) until all answered, then
 * coord_plan_replicas plans from their answers. restarted (this megad
 * started while the attempt ran): a node not in its view yet is looked for
 * a while, and told to stop the attempt's ranks with hold first. */
void coord_gather_held(megad_coord *c, mega_job *j, bool restarted);
/* coord_run.c: where j's next attempt starts, for its events: "the
 * checkpoint of iteration K" or "the start". */
void coord_resume_point(const mega_job *j, char *buf, size_t len);
/* coord_run.c: in etcd mode, whether this node may act as a coordinator
 * now (its lease was renewed within its TTL; always in embedded mode). */
bool coord_may_act(const megad_coord *c);
/* coord_etcd.c: the orphan scan the tick runs. */
void coord_etcd_tick(megad_coord *c);

/* coord_late.c: steps of an attempt over, sent again after a takeover
 * (megad_coord_resent, but never of the attempt running here) */
typedef struct coord_late coord_late;
mega_status coord_late_add(megad_coord *c, const char *job_id, uint32_t attempt, uint32_t world,
                           const char *node_id, Mega__V1__StepReport *const *r, size_t n,
                           mega_err *err);
/* Merges what came for attempts quiet a while, from the ranks that sent. */
void coord_late_tick(megad_coord *c);
/* Merges what came of j's earlier attempts now: before a later attempt's
 * step or j's end goes into the history, so the history stays in order. */
void coord_late_flush(megad_coord *c, const mega_job *j);
void coord_late_free(megad_coord *c);

/* Answers the committing rank about iteration at once: the go-ahead, or,
 * while this node may not act (coord_may_act), a refusal, so no rank waits
 * for etcd; a refusal is an event (once per run of them) and so is the
 * commit that ends the run. */
void coord_ask_commit(coord_run *run, uint64_t iteration);

#endif
