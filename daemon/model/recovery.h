/* What happens to a job when an attempt ends: the state machine of
 * attempts, as pure logic (no loop, no I/O), so every rule is unit-tested
 * without starting daemons (tests/daemon/test_recovery.c).
 *
 * An attempt ends for one reason:
 *
 *   DONE         every rank finished        -> SUCCEEDED
 *   CANCELLED    a user cancelled           -> CANCELLED
 *   FATAL        the job itself is bad (a flag, a missing data file): a
 *                restart would fail the same way -> FAILED
 *   CRASH        a rank died, errored or hung -> RESTARTING while
 *                restarts < --max-restarts (counted), else FAILED
 *   NODE_LOST    a node of the job was lost -> RESTARTING when the job can
 *                recover (elastic --nnodes MIN:MAX with MIN < MAX, or a
 *                restart budget); not counted, as torchrun counts only
 *                failures. Else FAILED: fail fast stays the default.
 *   LAUNCH       a node could not start its ranks yet (not back, slots
 *                taken) -> RESTARTING: the job waits and is placed again;
 *                never FAILED, never counted
 *   COORDINATOR  this megad restarted while the job ran -> RESTARTING, not
 *                counted
 *   RESCALE      a planned re-plan at a checkpoint (nodes came back,
 *                megactl rescale) -> RESTARTING, not counted
 *   STOPPED      every rank stopped early as asked, after its checkpoint
 *                (--exit-signal-handler on SIGTERM, --exit-interval,
 *                --exit-duration-in-mins) -> STOPPED: resumable, not a
 *                failure, and not restarted here (whoever asked wants it
 *                to stop: a time limit, a planned exit)
 *
 * RESTARTING jobs resume from the newest committed checkpoint (or from the
 * start, as the first attempt did, when none was committed yet) as attempt
 * k+1, on as many nodes as the placement finds in the job's range; never
 * from the start once a checkpoint was committed (attempt_spec, below). */
#ifndef MEGA_DAEMON_RECOVERY_H
#define MEGA_DAEMON_RECOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "daemon/model/job.h"

typedef enum mega_end_kind {
  MEGA_END_DONE,
  MEGA_END_CANCELLED,
  MEGA_END_FATAL,
  MEGA_END_CRASH,
  MEGA_END_NODE_LOST,
  MEGA_END_LAUNCH,
  MEGA_END_COORDINATOR,
  MEGA_END_RESCALE,
  MEGA_END_STOPPED,
} mega_end_kind;

const char *mega_end_kind_name(mega_end_kind k); /* "crash", "node lost", ... */

typedef struct mega_recovery {
  mega_job_state next; /* SUCCEEDED, CANCELLED, FAILED, STOPPED or RESTARTING */
  bool counted;        /* the restart uses one of --max-restarts */
  /* for FAILED: the cause and why no restart follows; STOPPED: why. Room
   * for the longest cause (a rank's exit, coord_run.c: 1600 bytes) and
   * the restarts note. */
  char why[1700];
} mega_recovery;

/* The decision for job j (its restarts, --max-restarts and --nnodes range)
 * after an attempt ended with kind; cause is the attempt's cause sentence
 * (may be NULL). */
mega_recovery mega_recovery_decide(const mega_job *j, mega_end_kind kind, const char *cause);

/* Whether j recovers from a lost node at all (elastic, or a restart budget). */
bool mega_recovery_elastic(const mega_job *j);

/* The node counts the next placement may use: [*lo, *hi]. Elastic jobs take
 * any count in --nnodes MIN:MAX (a megactl rescale target narrows it to that
 * count); other jobs need the count they were submitted with. */
void mega_recovery_node_range(const mega_job *j, uint32_t *lo, uint32_t *hi);

/* Whether a running job on `now` nodes should re-plan at a committed
 * checkpoint, where `could` is the node count a placement within
 * mega_recovery_node_range would find now (0: none): an elastic job grows
 * when nodes came back; a megactl rescale target is met either way. */
bool mega_recovery_should_replan(const mega_job *j, uint32_t now, uint32_t could);

/* The flags of the next attempt (into out, which must be fresh): the job's
 * parsed spec, with --load pointed at --save when a checkpoint there was
 * committed, so the attempt resumes from it whole (--finetune and
 * --no-load-optim, which were for loading the first start's --load, are
 * dropped then), and with --exit-on-missing-checkpoint: a --save that holds
 * no checkpoint any more (moved, not mounted on a node) fails the attempt
 * as a bad job instead of training from iteration 1 under the name of a
 * resume. A damaged newest checkpoint still falls back to an older
 * complete one (the worker says which). */
mega_status mega_recovery_attempt_spec(const mega_job *j, mega_jobspec *out, mega_err *err);

#endif
