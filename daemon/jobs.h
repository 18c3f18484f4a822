/* The jobs layer: the jobs this megad coordinates (the table of
 * daemon/job.h), kept durable in the journal, each job's history (events and
 * merged steps) and the watchers that follow it.
 *
 * Every change of a job goes through here, so the journal, the history and
 * the watchers never disagree: megad_jobs_save journals a job's record,
 * megad_job_event and megad_job_step add to its history and reach every
 * watcher (daemon/watch.h: jobs.watchers), and megad_job_finalize is the one
 * place a job ends.
 *
 * On the loop thread only. Ownership: the layer owns the table, the journal
 * and the watchers; it borrows its base. */
#ifndef MEGA_DAEMON_JOBS_H
#define MEGA_DAEMON_JOBS_H

#include <stdbool.h>

#include "daemon/base.h"
#include "daemon/job.h"
#include "daemon/journal.h"
#include "daemon/watch.h"

/* What happened since this megad started (for /metrics). */
typedef struct megad_jobs_stats {
  uint64_t submitted;
  uint64_t finished[3]; /* succeeded, failed, cancelled */
  uint64_t events[16];  /* by JobEventKind */
  uint64_t steps;       /* merged steps */
  double report_delay_sum_s; /* slowest rank's step end -> merge, summed */
  uint64_t report_delay_n;
} megad_jobs_stats;

typedef struct megad_jobs {
  megad_base *b;
  mega_jobs t;
  mega_journal *journal;
  megad_watchers watchers;
  megad_jobs_stats stats;
} megad_jobs;

/* Opens STATE/journal and replays it into the table. A torn tail or damage
 * is said loudly (the damaged file is kept); a journal mostly made of
 * history is compacted. */
mega_status megad_jobs_open(megad_jobs *js, megad_base *b, mega_err *err);
void megad_jobs_close(megad_jobs *js);

mega_job *megad_jobs_find(megad_jobs *js, const char *id);
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
