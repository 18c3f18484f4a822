/* Inside the jobs layer: jobs.c over jobs_etcd.c (the etcd side of the
 * journal's records). Not for other layers. */
#ifndef MEGA_DAEMON_JOBS_INTERNAL_H
#define MEGA_DAEMON_JOBS_INTERNAL_H

#include "daemon/jobs/jobs.h"

/* The largest job record kept in etcd (etcd refuses requests over 1.5 MiB
 * with its default --max-request-bytes; a batch holds several records). */
#define MEGAD_ETCD_RECORD_MAX (512 * 1024)

/* Queues one record of j (a JournalRecord, taken: freed here) for
 * mega/j/<id>/<suffix>. claim: the job's first record, written only if no
 * node coordinates the job yet, with the coordinator key under this node's
 * lease (its revision becomes j->etcd.fence). */
void megad_jobs_etcd_put(megad_jobs *js, const mega_job *j, const char *suffix, uint8_t *buf,
                         size_t len, bool claim);
/* Queues the deletion of mega/j/<id>/<suffix> (an event the job's history
 * let go), guarded by j's fence as a put is. */
void megad_jobs_etcd_del(megad_jobs *js, const mega_job *j, const char *suffix);
/* Queues the deletion of every key of a forgotten job. */
void megad_jobs_etcd_forget(megad_jobs *js, const char *job_id);

#endif
