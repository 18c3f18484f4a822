/* Exit codes a batch scheduler can act on, shared by megactl watch, megad
 * run and deploy/slurm/mega.sbatch (deploy/slurm/README.md, "Exit codes").
 * The rest keep their usual meanings: 0 succeeded, 1 failed, 2 a usage
 * error, 128 + N killed by signal N. */
#ifndef MEGA_CORE_EXITCODE_H
#define MEGA_CORE_EXITCODE_H

/* The job stopped early as asked (--exit-signal-handler on SIGTERM before a
 * time limit, --exit-interval, --exit-duration-in-mins), after committing
 * its checkpoint: run it again (requeue) and it goes on from there. */
#define MEGA_EXIT_REQUEUE 92
/* The job failed or was cancelled: running it again would not go on where
 * it stopped (the batch script's "do not requeue"; NVIDIA's ft_launcher
 * uses the same number). */
#define MEGA_EXIT_NO_REQUEUE 93
/* megactl watch lost every megad it asked for longer than its reconnect
 * timeout: how the job ends is not known here (its coordinator's node may
 * be gone); what it last committed stays, so a bounded requeue is safe. */
#define MEGA_EXIT_LOST 94

#endif
