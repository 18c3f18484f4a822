/* A job as its coordinator keeps it: the journaled record, the state
 * machine, the conversions to and from the wire's Job message and the
 * journal's records, and tables of jobs.
 *
 * Pure bookkeeping: no loop, no I/O (the caller appends the records this
 * module packs).
 *
 * A mega_job is the record plus three parts, each with one owner:
 *   hist   the jobs layer: history, events, last step, curve (jobhist.h)
 *   etcd   the jobs layer's etcd side: the job's fence (etcd mode)
 *   coord  the coordinator: its running attempt, the wait queue's links,
 *          why the job waits, a rescale target, report delays
 * None of the parts is journaled as part of the record.
 *
 * Ownership: a mega_jobs table owns its jobs; a job owns its strings, its
 * placement, its history items and coord.wait (not coord.run, which the
 * coordinator frees). */
#ifndef MEGA_DAEMON_JOB_H
#define MEGA_DAEMON_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "daemon/model/jobhist.h"
#include "proto/mega.pb-c.h"

typedef Mega__V1__JobState mega_job_state;
#define MEGA_JOB_PENDING MEGA__V1__JOB_STATE__JOB_STATE_PENDING
#define MEGA_JOB_RUNNING MEGA__V1__JOB_STATE__JOB_STATE_RUNNING
#define MEGA_JOB_SUCCEEDED MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED
#define MEGA_JOB_FAILED MEGA__V1__JOB_STATE__JOB_STATE_FAILED
#define MEGA_JOB_CANCELLED MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED
#define MEGA_JOB_RESTARTING MEGA__V1__JOB_STATE__JOB_STATE_RESTARTING
#define MEGA_JOB_STOPPED MEGA__V1__JOB_STATE__JOB_STATE_STOPPED

/* One node's share of a placement: global ranks [first_rank, first_rank + nranks). */
typedef struct mega_job_node {
  char *node_id;
  uint32_t first_rank, nranks;
} mega_job_node;

/* A job's standing in etcd: etcd mode only (all zero in embedded mode).
 * Owner: the jobs layer's etcd side (jobs_etcd.c), which follows the job's
 * coordinator key mega/c/<id>; the coordinator writes it twice: fence when
 * it takes a job over (coord_etcd.c, before megad_jobs_adopt), fenced when
 * it stands down. Not journaled: it comes from the key, not the record. */
typedef struct mega_job_etcd {
  /* the create revision of the coordinator key: the fence every write,
   * launch and commit of the job's coordinator carries (0: no key yet) */
  int64_t fence;
  bool fenced; /* this node's claim was refused or lost: another node has the job */
  bool orphan; /* mirror: no coordinator key now (fence stays the last one seen) */
} mega_job_etcd;

/* The coordinator's part of a job it holds. daemon/coord writes it; in the
 * model mega_job_free frees `wait`, recovery.c reads want_nodes and
 * metrics_text.c the report delays. Never journaled: a job read from the
 * journal or from etcd starts with it all zero. */
struct coord_run; /* one running attempt: daemon/coord/coord_internal.h */
typedef struct mega_job_coord {
  struct coord_run *run; /* the attempt running now (coord_run.c); NULL: none */
  /* the wait queue of jobs waiting to start (coord_queue.c), in submission
   * order; wq_epoch: 1 + the membership view it could not fit even empty */
  struct mega_job *wq_prev, *wq_next;
  bool wq_in;
  uint64_t wq_epoch;
  char *wait; /* why a pending job waits (said once per change); owned */
  uint32_t want_nodes; /* megactl rescale's target, applied at the next checkpoint; 0: none */
  int64_t failed_ms;   /* when the last attempt's failure was detected (unix ms); 0: none */
  /* Launches refused in a row (a node that heartbeats but cannot be
   * reached), and when the next attempt may start: a refused launch is
   * retried at once, then after 0.5, 1, 2 ... 8 s. A node's own refusal
   * (its slots taken by another coordinator's job, stopping) does not
   * count: placement counts that node full until a newer view of it
   * (coord_place.c), and the next attempt waits one heartbeat interval (at
   * most 0.5 s), then goes elsewhere or waits for room as any job does.
   * launch_unreached: this attempt had a launch of the first kind. */
  uint32_t launch_refusals;
  int64_t not_before_ms;
  bool launch_unreached;
  /* Recovery from replicas (coord.c, coord_run.c): the plan the next
   * attempt fetches its state by (owned; NULL: none), when it was made
   * (unix ms), the iterations it redoes, and why there is none; donors:
   * the nodes whose ranks of attempt donors_attempt hold their state until
   * the coordinator lets them go. */
  struct Mega__V1__ReplicaPlan *replicas;
  int64_t replicas_ms;
  uint64_t replicas_redone;
  char *replicas_why;
  char **donors;
  size_t ndonors;
  uint32_t donors_attempt;
  bool gathering; /* a takeover asks the old attempt's nodes what they hold: wait */
  /* From the slowest rank's step end to the merge, summed over merged steps
   * (for /metrics). */
  double report_delay_sum_s;
  uint64_t report_delay_n;
} mega_job_coord;

typedef struct mega_job {
  /* The record: what mega_jrec_job journals and the Job message carries. */
  char *id, *name;
  char **args; /* as submitted (what users see) */
  size_t nargs;
  /* The args parsed once, when the job arrives; an attempt's launch flags
   * come from this struct (mega_recovery_attempt_spec), never from editing
   * argv. spec_ok is false when the args do not parse (a journal written by
   * another version): such a job cannot start again, and spec_why says
   * what the parser said. */
  mega_jobspec spec;
  bool spec_ok;
  char *spec_why;
  uint32_t nnodes_min, nnodes_max, nproc_per_node;
  uint32_t max_restarts, step_timeout_ms;
  uint32_t restarts; /* restarts after rank failures so far */
  mega_job_state state;
  uint32_t world, tp, pp, dp, vp;
  int64_t created_ms, started_ms, ended_ms;
  char *error; /* NULL until the job fails */
  uint64_t last_iteration, train_iters;
  uint32_t attempt;
  mega_job_node *placement;
  size_t nplaced;
  char *coordinator; /* its coordinator's node id */
  uint64_t ckpt_iteration; /* the last checkpoint every rank finished; 0: none */
  char *ckpt_path;

  /* Owner: the jobs layer (daemon/model/jobhist.h). Not journaled as part
   * of the record: its events and last step are records of their own. */
  mega_job_hist hist;
  /* Owner: the jobs layer's etcd side (above). Not journaled either. */
  mega_job_etcd etcd;
  /* Owner: the coordinator (above). */
  mega_job_coord coord;
} mega_job;

/* ---- life cycle ---- */

/* A PENDING job from a submitted spec (copied). */
mega_status mega_job_new(const char *id, const Mega__V1__JobSpec *spec, const char *coordinator,
                         int64_t now_ms, mega_job **out, mega_err *err);
void mega_job_free(mega_job *j);

/* ---- the state machine ----
 *   PENDING    -> RUNNING | FAILED | CANCELLED
 *   RUNNING    -> SUCCEEDED | FAILED | CANCELLED | RESTARTING
 *   RESTARTING -> RUNNING | FAILED | CANCELLED
 *   FAILED     -> RESTARTING (megactl resume)
 *   SUCCEEDED, CANCELLED: final; FAILED is final until resumed.
 * Entering RUNNING sets started_ms (the first time); a final state sets
 * ended_ms. error (may be NULL) is kept for FAILED and CANCELLED. A
 * transition not listed is MEGA_ERR_INVALID and changes nothing. */
mega_status mega_job_transition(mega_job *j, mega_job_state to, int64_t now_ms, const char *error,
                                mega_err *err);
bool mega_job_state_final(mega_job_state s);
const char *mega_job_state_name(mega_job_state s); /* "running", ... */

/* Sets the placement (copied) and the sizes it implies. */
mega_status mega_job_place(mega_job *j, const mega_job_node *nodes, size_t n, uint32_t world,
                           uint32_t tp, uint32_t pp, uint32_t vp, mega_err *err);

/* The node that runs global rank r, or NULL. */
const mega_job_node *mega_job_node_of(const mega_job *j, uint32_t rank);

/* ---- the wire ---- */

/* A Job message that points into the job (valid while the job is unchanged);
 * free the arrays it needed with mega_job_msg_free. */
typedef struct mega_job_msg {
  Mega__V1__Job job;
  Mega__V1__JobSpec spec;
  Mega__V1__NodeRanks *nr, **nrp;
  uint32_t *ranks;
} mega_job_msg;

mega_status mega_job_msg_init(mega_job_msg *m, const mega_job *j, mega_err *err);
void mega_job_msg_free(mega_job_msg *m);

/* A job from a Job message (a journal record), with its history empty. */
mega_status mega_job_from_msg(const Mega__V1__Job *msg, mega_job **out, mega_err *err);

/* ---- the table ---- */

#define MEGA_JOBS_ORPHANS 8
typedef struct mega_jobs {
  mega_job **v; /* in submission order */
  size_t n, cap;
  uint64_t next_id; /* n of the next "j-<n>-<node>" */
  /* Applied items (events, steps) of jobs the table does not hold, and the
   * first ids they named: after a damaged journal, the jobs whose record
   * was lost. */
  size_t orphan_items, norphans;
  char orphans[MEGA_JOBS_ORPHANS][64];
  /* Applied records of a kind this build does not know (a newer megad's):
   * skipped, and gone from the journal at its next compaction. */
  size_t unknown_records;
} mega_jobs;

void mega_jobs_init(mega_jobs *t);
void mega_jobs_free(mega_jobs *t);
/* The job of id in this table alone, or NULL (id NULL too); a linear search.
 * (megad_jobs_find, daemon/jobs, finds among the jobs this node coordinates.) */
mega_job *mega_jobs_table_find(const mega_jobs *t, const char *id);
/* Adds j (the table takes it). */
mega_status mega_jobs_add(mega_jobs *t, mega_job *j, mega_err *err);
/* A fresh id, "j-<n>-<node>" with n above every id the table holds. The
 * coordinator's node name keeps ids unique across the cluster, so a node
 * running ranks of several coordinators' jobs never confuses two. */
void mega_jobs_next_id(mega_jobs *t, const char *node, char *buf, size_t len);
/* Frees and removes every job keep(j, arg) says no to, in one pass; the
 * order of the rest stays. */
void mega_jobs_filter(mega_jobs *t, bool (*keep)(const mega_job *j, void *arg), void *arg);
/* Removes job id from the table without freeing it; NULL if absent. */
mega_job *mega_jobs_take(mega_jobs *t, const char *id);
/* A forgotten job (a replayed ForgetRecord): gone from the table, its id
 * still used. */
void mega_jobs_forget(mega_jobs *t, const char *id);

/* ---- journal records (daemon/model/megad.proto) ---- */

/* Each packs one JournalRecord into *buf (malloc'd, the caller frees). */
mega_status mega_jrec_job(const mega_job *j, uint8_t **buf, size_t *len, mega_err *err);
mega_status mega_jrec_event(const char *job_id, const Mega__V1__JobEvent *ev, uint8_t **buf,
                            size_t *len, mega_err *err);
mega_status mega_jrec_forget(const char *job_id, uint8_t **buf, size_t *len, mega_err *err);
mega_status mega_jrec_step(const char *job_id, const Mega__V1__StepMetrics *step, uint8_t **buf,
                           size_t *len, mega_err *err);

/* Applies one record to the table: a job record replaces (or adds) its job,
 * keeping its history; events and steps join their job's history. Records of
 * unknown jobs are ignored (and counted in t->orphan_items), and so are
 * records of a kind this build does not know (t->unknown_records). Bytes
 * that do not parse are MEGA_ERR_INVALID. */
mega_status mega_jobs_apply(mega_jobs *t, const uint8_t *rec, size_t len, mega_err *err);

#endif
