/* megaw's assignment mode: started by megad, which sets MEGA_WORKER_FD (the
 * pipe, fd 3) and sends an Assignment first (worker/rank/link.h). */
#ifndef MEGA_WORKER_MEGAW_ASSIGNED_H
#define MEGA_WORKER_MEGAW_ASSIGNED_H

/* Runs the assigned rank to the end; returns the process's exit status
 * (0 done, 1 failed or aborted, 2 a job megad should not have sent). fd_env
 * is MEGA_WORKER_FD's value. */
int megaw_run_assigned(const char *fd_env);

#endif
