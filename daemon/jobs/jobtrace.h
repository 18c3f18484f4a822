/* --trace-iteration K: the ranks' ActionSpans of iteration K become one
 * Chrome trace (core/trace, one track per rank) in the job's directory, and
 * Control.GetTrace streams that file in chunks. */
#ifndef MEGA_DAEMON_JOBTRACE_H
#define MEGA_DAEMON_JOBTRACE_H

#include "daemon/base.h"
#include "daemon/jobs/jobs.h"
#include "daemon/model/stepmerge.h"
#include "proto/rpc_server.h"

/* Writes the trace of a merged iteration; *path (the caller frees) names it. */
mega_status megad_trace_write(megad_base *b, const mega_job *j, const mega_step_done *done,
                              char **path, mega_err *err);
/* Answers Control.GetTrace for j on call: the file in chunks, or
 * NOT_FOUND saying how to get one. */
void megad_trace_send(const megad_base *b, const mega_job *j, mega_rpc_call *call);
/* The trace of job_id, whole (malloc'd, NUL-terminated, *len its size), or
 * NULL when it has none (the web view's download). */
char *megad_trace_load(const megad_base *b, const char *job_id, size_t *len);

#endif
