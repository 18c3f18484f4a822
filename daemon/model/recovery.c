#include "daemon/model/recovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"

const char *mega_end_kind_name(mega_end_kind k) {
  switch (k) {
  case MEGA_END_DONE: return "done";
  case MEGA_END_CANCELLED: return "cancelled";
  case MEGA_END_FATAL: return "fatal";
  case MEGA_END_CRASH: return "crash";
  case MEGA_END_NODE_LOST: return "node lost";
  case MEGA_END_LAUNCH: return "launch refused";
  case MEGA_END_COORDINATOR: return "coordinator restarted";
  case MEGA_END_RESCALE: return "rescale";
  case MEGA_END_STOPPED: return "stopped as asked";
  }
  return "unknown";
}

static uint32_t nmin(const mega_job *j) { return j->nnodes_min ? j->nnodes_min : 1; }
static uint32_t nmax(const mega_job *j) {
  return j->nnodes_max > nmin(j) ? j->nnodes_max : nmin(j);
}

bool mega_recovery_elastic(const mega_job *j) { return nmax(j) > nmin(j) || j->max_restarts > 0; }

mega_recovery mega_recovery_decide(const mega_job *j, mega_end_kind kind, const char *cause) {
  mega_recovery r = {.next = MEGA_JOB_RESTARTING};
  const char *c = cause && cause[0] ? cause : mega_end_kind_name(kind);
  switch (kind) {
  case MEGA_END_DONE:
    r.next = MEGA_JOB_SUCCEEDED;
    break;
  case MEGA_END_CANCELLED:
    r.next = MEGA_JOB_CANCELLED;
    snprintf(r.why, sizeof r.why, "%s", c);
    break;
  case MEGA_END_STOPPED:
    r.next = MEGA_JOB_STOPPED;
    snprintf(r.why, sizeof r.why, "%s", c);
    break;
  case MEGA_END_FATAL:
    r.next = MEGA_JOB_FAILED;
    snprintf(r.why, sizeof r.why, "%s", c);
    break;
  case MEGA_END_CRASH:
    if (j->restarts < j->max_restarts) {
      r.counted = true;
    } else {
      r.next = MEGA_JOB_FAILED;
      if (j->max_restarts == 0)
        snprintf(r.why, sizeof r.why, "%s", c);
      else
        snprintf(r.why, sizeof r.why, "%s (all %u restarts of --max-restarts used)", c,
                 j->max_restarts);
    }
    break;
  case MEGA_END_NODE_LOST:
    if (!mega_recovery_elastic(j)) {
      r.next = MEGA_JOB_FAILED;
      snprintf(r.why, sizeof r.why, "%s", c);
    }
    break;
  case MEGA_END_LAUNCH:
  case MEGA_END_COORDINATOR:
  case MEGA_END_RESCALE:
    break;
  }
  return r;
}

void mega_recovery_node_range(const mega_job *j, uint32_t *lo, uint32_t *hi) {
  *lo = nmin(j);
  *hi = nmax(j);
  uint32_t want = j->coord.want_nodes; /* megactl rescale's, when in range */
  if (want && want >= *lo && want <= *hi) *lo = *hi = want;
}

bool mega_recovery_should_replan(const mega_job *j, uint32_t now, uint32_t could) {
  if (!could || could == now) return false;
  return j->coord.want_nodes ? could == j->coord.want_nodes : nmax(j) > nmin(j) && could > now;
}

mega_status mega_recovery_attempt_spec(const mega_job *j, mega_jobspec *out, mega_err *err) {
  if (!j->spec_ok)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "job %s: its flags do not parse in this megad (mega %s: %s), which is not "
                     "the build it was submitted to; run it on a build that takes them, or "
                     "submit it again with flags this one takes", j->id, mega_version(),
                     j->spec_why ? j->spec_why : "no reason given");
  mega_status s = mega_jobspec_copy(out, &j->spec, err);
  if (s != MEGA_OK || !j->ckpt_iteration || !j->spec.save) return s;
  char *load = strdup(j->spec.save);
  if (!load) {
    mega_jobspec_free(out);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  free(out->load);
  out->load = load;
  /* the job's own checkpoint is resumed whole: the flags that load only a
   * part of a foreign one (a pretrained model) were for the first start */
  out->finetune = false;
  out->no_load_optim = false;
  /* a commit was recorded there: finding none is an error, never a fresh
   * start the job would call a resume (an older complete one still loads) */
  out->exit_on_missing_checkpoint = true;
  return MEGA_OK;
}
