/* megad under Slurm: `megad serve --peers slurm` takes the node's name, its
 * peers and (without --slots) its slots from the allocation srun started it
 * in, so one sbatch line starts a cluster (deploy/slurm/).
 *
 *   name   --node-name, else $SLURMD_NODENAME (the node as Slurm names it)
 *   peers  every other node of $SLURM_JOB_NODELIST (core/hostlist.h),
 *          each at NAME:PORT, PORT being this megad's --listen port: every
 *          node's megad listens on the same one
 *   slots  $SLURM_GPUS_ON_NODE; without it one per GPU megad finds, else
 *          $SLURM_CPUS_ON_NODE
 *
 * Pure but for reading the environment (megad_slurm_from_env). */
#ifndef MEGA_DAEMON_SLURM_H
#define MEGA_DAEMON_SLURM_H

#include <stddef.h>

#include "core/status.h"

typedef struct megad_slurm {
  char *node_name; /* NULL when --node-name was given */
  char *peers;     /* "n2:7070,n3:7070"; "" for a one-node allocation */
  int gpu_slots;   /* $SLURM_GPUS_ON_NODE; 0: not set */
  int cpu_slots;   /* $SLURM_CPUS_ON_NODE; 0: not set */
  size_t nnodes;   /* in the allocation */
} megad_slurm;

/* The peers of self in nodelist (Slurm's form), at port: every name but
 * self's, each once, in the list's order. self must be in the list.
 * *peers is the caller's (free). */
mega_status megad_slurm_peers(const char *nodelist, const char *self, int port, char **peers,
                              size_t *nnodes, mega_err *err);

/* Reads the allocation from the environment for a megad listening on
 * listen ("host:port" with a port other than 0) named node_name (NULL: Slurm's
 * name for it). Errors say which variable or flag is missing. */
mega_status megad_slurm_from_env(const char *listen, const char *node_name, megad_slurm *out,
                                 mega_err *err);
void megad_slurm_free(megad_slurm *s);

#endif
