/* The jobs layer: the jobs this megad coordinates (the table of
 * daemon/model/job.h), kept durable in the journal, each job's history (events and
 * merged steps) and the watchers that follow it.
 *
 * Every change of a job goes through here, so the journal, the history and
 * the watchers never disagree: megad_jobs_save journals a job's record,
 * megad_job_event and megad_job_step add to its history and reach every
 * watcher (daemon/jobs/watch.h: jobs.watchers), and megad_job_finalize is the one
 * place a job ends.
 *
 * On the loop thread only. Ownership: the layer owns the table, the journal
 * and the watchers; it borrows its base. */
#ifndef MEGA_DAEMON_JOBS_H
#define MEGA_DAEMON_JOBS_H

#include <stdbool.h>

#include "daemon/base.h"
#include "daemon/etcd/etcd.h"
#include "daemon/jobs/watch.h"
#include "daemon/model/job.h"
#include "daemon/model/journal.h"

/* What happened since this megad started (for /metrics). */
typedef struct megad_jobs_stats {
  uint64_t submitted;
  uint64_t finished[4]; /* succeeded, failed, cancelled, stopped */
  uint64_t events[16];  /* by JobEventKind */
  uint64_t steps;       /* merged steps */
  double report_delay_sum_s; /* slowest rank's step end -> merge, summed */
  uint64_t report_delay_n;
} megad_jobs_stats;

/* What the jobs layer tells the coordinator in etcd mode (jobs_etcd.c). */
typedef struct megad_jobs_cbs {
  /* This node's claim on j is gone (etcd refused a write of it, or its
   * coordinator key vanished): another node coordinates j now, or will. */
  void (*fenced)(void *arg, mega_job *j, const char *why);
  /* etcd took this node's claim on j (its first record): j may start. */
  void (*claimed)(void *arg, mega_job *j);
  /* etcd refused j's first record for good (why): j cannot run. */
  void (*refused)(void *arg, mega_job *j, const char *why);
  /* A job without a coordinator: its key went with its node's lease. */
  void (*orphan)(void *arg, const char *job_id);
  /* job_id's coordinator key names node_id now (a claim, or a takeover). */
  void (*coordinator)(void *arg, const char *job_id, const char *node_id);
  void *arg;
} megad_jobs_cbs;

typedef struct megad_jwrite megad_jwrite;

/* Told of every item a job's watchers get (a merged step, an event, the
 * final state), after they got it: how a layer above (the web view's live
 * streams) hears of news without polling. */
typedef void (*megad_jobs_item_fn)(void *arg, const mega_job *j,
                                   const Mega__V1__WatchJobResponse *item);

typedef struct megad_jobs {
  megad_base *b;
  mega_jobs t;             /* the jobs this node coordinates */
  mega_journal *journal;   /* embedded mode; NULL in etcd mode */
  size_t journal_recs;     /* records in the journal file now */
  size_t journal_live;     /* records a rewrite kept, when last counted */
  size_t journal_behind;   /* records the journal could not take since the table was last
                              written whole (a full disk): a rewrite from the table is due */
  megad_watchers watchers;
  megad_jobs_stats stats;
  /* etcd mode (jobs_etcd.c): the cluster's jobs as etcd has them (this
   * node's too), and the write queue (writeq_): the writes of this node's
   * jobs, in order, one transaction in flight */
  megad_etcd *etcd;
  megad_jobs_cbs cbs;
  mega_jobs mirror;
  megad_etcd_watch *watch; /* mega/, in revision order */
  megad_jwrite *writeq_head, *writeq_tail;
  size_t writeq_len, writeq_batch;
  int64_t writeq_fence, writeq_lease; /* the batch in flight: its job's fence, a claim's lease */
  bool writeq_busy;
  char writeq_err[512]; /* why the last write failed; empty once one succeeds */
  uv_timer_t writeq_retry;
  bool writeq_retry_on;
  /* after a watch that could not resume: the read of every job again, asked
   * again every second while etcd refuses it (reload_fails in a row) */
  uv_timer_t reload_retry;
  unsigned reload_fails;
  int64_t rev; /* the newest revision the mirror has seen */
  megad_jobs_item_fn on_item; /* one listener (may be NULL); megad_jobs_listen sets it */
  void *on_item_arg;
} megad_jobs;

/* Registers fn (NULL: none) to hear of every watcher item. */
void megad_jobs_listen(megad_jobs *js, megad_jobs_item_fn fn, void *arg);

/* Opens STATE/journal and replays it into the table. A torn tail or damage
 * is said loudly (the damaged file is kept); a journal mostly made of
 * history is compacted. */
mega_status megad_jobs_open(megad_jobs *js, megad_base *b, mega_err *err);
/* Rewrites the journal once it is mostly history (more than twice the
 * records a rewrite would keep, and 64 more), so a megad that runs for
 * weeks keeps it as bounded as its table; O(1) until then. Also once a
 * record could not be written (a full disk): the table is ahead of the
 * file until a rewrite from it succeeds, tried on every call (and at
 * megad_jobs_close). Call where the table is whole (not between a record
 * and the change it journals); a no-op in etcd mode. */
void megad_jobs_tidy(megad_jobs *js);
/* etcd mode instead of the journal (jobs_etcd.c): reads every job of the
 * cluster from etcd into the mirror and follows it from there on. Keys:
 *   mega/j/<id>/0          the JobRecord (a JournalRecord, as journaled)
 *   mega/j/<id>/e/<seq>    its events, in order
 *   mega/j/<id>/s          its last step, when it ended
 *   mega/c/<id>            its coordinator's node id, under that node's lease
 * Every write of a job this node coordinates is a transaction guarded by
 * the create revision of mega/c/<id> (the job's fence). */
mega_status megad_jobs_open_etcd(megad_jobs *js, megad_base *b, megad_etcd *etcd,
                                 mega_err *err);
void megad_jobs_set_cbs(megad_jobs *js, const megad_jobs_cbs *cbs);
/* etcd mode, at shutdown before the client is freed: the watches end and
 * writes not yet sent are dropped (megad_jobs_close does it too). */
void megad_jobs_etcd_close(megad_jobs *js);
void megad_jobs_close(megad_jobs *js);

mega_job *megad_jobs_find(megad_jobs *js, const char *id);
/* etcd mode: the mirror's copy of a job (any node's), or NULL. */
mega_job *megad_jobs_mirror_find(megad_jobs *js, const char *id);
/* etcd mode: the coordinator key's create revision as this node last saw
 * it (0: none, or embedded mode). A launch or commit carrying an older
 * fence comes from a coordinator that lost the job. */
int64_t megad_jobs_coord_rev(megad_jobs *js, const char *job_id);
/* etcd mode: takes j over (the table takes it), fence already set; saves
 * its record under the new fence. */
mega_status megad_jobs_adopt(megad_jobs *js, mega_job *j, mega_err *err);
/* etcd mode: whether r, the answer to a claim refused because the
 * coordinator key exists (its failure branch reads that key), shows this
 * node's own claim under lease: a claim sent again after its first try went
 * through (a reply lost with a member) finds itself, and is won. */
bool megad_jobs_claim_mine(const megad_jobs *js, const megad_etcd_reply *r, int64_t lease);
/* etcd mode: lets go of j (freed) without a write: another node has it. */
void megad_jobs_drop(megad_jobs *js, mega_job *j);
/* Whether writes of this node's jobs have reached etcd; false with why. */
bool megad_jobs_durable(const megad_jobs *js, const char **why);
/* Journals j, then adds it (the table takes it). On failure j is the
 * caller's still. */
mega_status megad_jobs_add(megad_jobs *js, mega_job *j, mega_err *err);
/* Journals j's record (its state after a change); a failure is a warning. */
mega_status megad_jobs_save(megad_jobs *js, const mega_job *j, mega_err *err);

/* An event: history, journal, log line and every watcher. */
void megad_job_event(megad_jobs *js, mega_job *j, Mega__V1__JobEventKind kind,
                     const char *node_id, int rank, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* A merged step: history (last_step) and every watcher. */
void megad_job_step(megad_jobs *js, mega_job *j, const Mega__V1__StepMetrics *step);
/* Retention: forgets every ended job gone(j, arg) says yes to (journaled,
 * its directory under STATE/jobs removed, its id never given again), in one
 * pass. Nothing may hold such a job: ended jobs have no watchers. Returns
 * how many went. */
size_t megad_jobs_forget(megad_jobs *js, bool (*gone)(const mega_job *j, void *arg), void *arg);

/* Moves j to state (a transition of job.h), journals it, sends the event and
 * the final state to every watcher, whose streams then end. error: the cause
 * for FAILED and CANCELLED. The one place a job ends. */
void megad_job_finalize(megad_jobs *js, mega_job *j, mega_job_state state, const char *error);

#endif
