/* What a node checks before any rank of a launch starts (launch.h): the
 * node and its slots, the job id, the attempt not stopped here already,
 * its worker program still there, what only this node can see (the job's
 * flags under its roots, its data files, the save directory, and for
 * PrepareLaunch the vocabulary file, whose size the coordinator compares
 * across nodes) and the attempt's directory. LaunchRanks
 * checks it all again before it spawns; PrepareLaunch only checks, so that
 * an attempt one node refuses starts no rank anywhere. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/jobspec.h"
#include "core/version.h"
#include "daemon/launch/launch_internal.h"
#include "daemon/model/roots.h"
#include "daemon/model/util.h"

/* What only this node can check: the files as it sees them. Also says
 * whether the job has --exit-signal-handler. */
static mega_status check_here(const megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                              bool *graceful, megad_launch_files *files, mega_err *err) {
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_status st = MEGA_OK;
  if (req->spec && mega_jobspec_parse(&s, (int)req->spec->n_args, req->spec->args, err) != MEGA_OK) {
    mega_jobspec_free(&s);
    /* a prefix: formatting err->msg into itself lost the parser's reason */
    mega_err_prefix(err, "node %s cannot parse the job's flags", L->b->node_id);
    if (err) err->status = MEGA_ERR_INVALID;
    return MEGA_ERR_INVALID;
  }
  struct stat sb;
  const char *flag, *bad, *why;
  mega_err re = {0};
  if (L->o.roots && megad_roots_check(L->o.roots, &s, &re) != MEGA_OK)
    st = mega_fail(err, MEGA_ERR_INVALID, "node %s refuses the launch: %s", L->b->node_id,
                   re.msg);
  else if (!megad_data_visible(&s, &flag, &bad, &why))
    st = mega_fail(err, MEGA_ERR_INVALID, "node %s cannot read %s %s: %s", L->b->node_id, flag,
                   bad, why);
  else if (s.save && stat(s.save, &sb) == 0 && !S_ISDIR(sb.st_mode))
    st = mega_fail(err, MEGA_ERR_INVALID, "--save %s is not a directory on node %s", s.save,
                   L->b->node_id);
  else if (files && mega_jobspec_load_vocab(&s, &re) != MEGA_OK)
    st = mega_fail(err, MEGA_ERR_INVALID, "node %s: %s", L->b->node_id, re.msg);
  if (st == MEGA_OK && files)
    *files = (megad_launch_files){.vocab_entries = s.file_vocab,
                                  .eod_id = s.file_vocab ? s.file_eod : -1};
  *graceful = s.exit_signal_handler;
  mega_jobspec_free(&s);
  return st;
}

mega_status launch_check(const megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                         bool *graceful, megad_launch_files *files, mega_err *err) {
  const megad_base *b = L->b;
  if (b->stopping) return mega_fail(err, MEGA_ERR_UNSUPPORTED, "node %s is shutting down", b->node_id);
  /* calls go by address: the node meant may be gone, and another megad
   * listen where it did */
  if (req->node_id && req->node_id[0] && strcmp(req->node_id, b->node_id))
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "the megad at this address is node %s, not node %s (which is gone)",
                     b->node_id, req->node_id);
  /* a job's ranks run one build: ranks of two could differ in what they
   * send each other or compute, and nothing would say so */
  const char *cv = req->coordinator_version;
  if (!cv || strcmp(cv, mega_version()))
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "node %s runs mega %s and starts no ranks for coordinator %s, which runs "
                     "%s: a job's ranks run one build (README \"Upgrading\"); the job waits for "
                     "nodes of its coordinator's build", b->node_id, mega_version(),
                     req->coordinator_node_id && req->coordinator_node_id[0]
                         ? req->coordinator_node_id : "(unnamed)",
                     cv && cv[0] ? cv : "an older build (one that does not say its version)");
  if (!req->n_ranks || !req->job_id || !req->job_id[0] || !req->bootstrap)
    return mega_fail(err, MEGA_ERR_INVALID, "LaunchRanks needs a job id, ranks and a bootstrap");
  if (!megad_job_id_is_name(req->job_id))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "LaunchRanks: the job id '%.64s' is not one megad makes (letters, digits, "
                     "'.', '-' and '_', such as j-7-node1)", req->job_id);
  if (L->slots_used + req->n_ranks > L->o.slots)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "node %s has %u free slot%s, and %zu rank%s were asked of it", b->node_id,
                     L->o.slots - L->slots_used, L->o.slots - L->slots_used == 1 ? "" : "s",
                     req->n_ranks, req->n_ranks == 1 ? "" : "s");
  if (launch_attempt_ended(L, req->job_id, req->attempt))
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "attempt %u of job %s was stopped on node %s before its launch came",
                     req->attempt, req->job_id, b->node_id);
  /* checked at megad's start, but a deploy may have moved it since */
  if (access(L->o.worker_path, X_OK))
    return mega_fail(err, MEGA_ERR_IO, "node %s cannot run its worker %s: %s", b->node_id,
                     L->o.worker_path, strerror(errno));
  return check_here(L, req, graceful, files, err);
}

char *launch_attempt_dir(const megad_launcher *L, const char *job_id, uint32_t attempt,
                         mega_err *err) {
  errno = 0;
  char *jdir = megad_job_dir(L->b, job_id), *dir = NULL;
  if (!jdir) { /* not "out of memory" when the disk said no */
    if (!errno) mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    else mega_fail(err, MEGA_ERR_IO, "cannot create the job's directory in %s/jobs: %s",
                   L->b->state_dir, strerror(errno));
    return NULL;
  }
  if (asprintf(&dir, "%s/%u", jdir, attempt) < 0) dir = NULL;
  free(jdir);
  if (!dir) {
    mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    return NULL;
  }
  struct stat st;
  if (mkdir(dir, 0700) && (errno != EEXIST || stat(dir, &st) || !S_ISDIR(st.st_mode))) {
    mega_fail(err, MEGA_ERR_IO, "cannot create %s: %s", dir,
              errno == EEXIST ? "a file is in the way" : strerror(errno));
    free(dir);
    return NULL;
  }
  return dir;
}

mega_status megad_launch_check(megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                               megad_launch_files *files, mega_err *err) {
  bool graceful;
  mega_status s = launch_check(L, req, &graceful, files, err);
  if (s != MEGA_OK) return s;
  char *dir = launch_attempt_dir(L, req->job_id, req->attempt, err);
  free(dir);
  return dir ? MEGA_OK : err->status;
}
