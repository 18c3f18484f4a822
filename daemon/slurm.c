#include "daemon/slurm.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hostlist.h"
#include "core/port.h"

/* A name and its place in the list. */
typedef struct placed {
  const char *name;
  size_t at;
} placed;

static int by_name_then_place(const void *a, const void *b) {
  const placed *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* Whether each of names[0..n) repeats one listed before it (NULL when out
 * of memory). Sorted, a name's first place leads its run: n log n, where
 * comparing each name with those before it took seconds for the 65536
 * names a list may hold. */
static bool *repeats(char **names, size_t n) {
  placed *p = malloc((n ? n : 1) * sizeof *p);
  bool *rep = calloc(n ? n : 1, sizeof *rep);
  if (!p || !rep) {
    free(p);
    free(rep);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) p[i] = (placed){names[i], i};
  qsort(p, n, sizeof *p, by_name_then_place);
  for (size_t i = 1; i < n; i++) rep[p[i].at] = !strcmp(p[i].name, p[i - 1].name);
  free(p);
  return rep;
}

mega_status megad_slurm_peers(const char *nodelist, const char *self, int port, char **peers,
                              size_t *nnodes, mega_err *err) {
  *peers = NULL;
  char **names = NULL;
  size_t n = 0;
  mega_status st = mega_hostlist_expand(nodelist, &names, &n, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "SLURM_JOB_NODELIST");
    return st;
  }
  size_t cap = 1, distinct = 0, len = 0;
  bool found = false;
  for (size_t i = 0; i < n; i++) cap += strlen(names[i]) + 16; /* ",NAME:PORT", any int */
  char *out = calloc(1, cap);
  bool *rep = repeats(names, n);
  if (!out || !rep) st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; st == MEGA_OK && i < n; i++) {
    if (rep[i]) continue;
    distinct++;
    if (!strcmp(names[i], self)) {
      found = true;
      continue;
    }
    int w = snprintf(out + len, cap - len, "%s%s:%d", len ? "," : "", names[i], port);
    if (w > 0) len += (size_t)w < cap - len ? (size_t)w : cap - len - 1;
  }
  free(rep);
  if (st == MEGA_OK && !found)
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "this node, %s, is not in SLURM_JOB_NODELIST %s: give --node-name as Slurm "
                   "names this node", self, nodelist);
  mega_hostlist_free(names, n);
  if (st != MEGA_OK) {
    free(out);
    return st;
  }
  *peers = out;
  if (nnodes) *nnodes = distinct;
  return MEGA_OK;
}

/* A count from the environment: 0 when unset; -1 when it is not a count. */
static int env_count(const char *name) {
  const char *v = getenv(name);
  if (!v || !v[0]) return 0;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  /* SLURM_CPUS_ON_NODE is a plain number; a GPU count may read "2(x1)" elsewhere */
  if (errno || end == v || n < 0 || n > 4096) return -1;
  return (int)n;
}

mega_status megad_slurm_from_env(const char *listen, const char *node_name, megad_slurm *out,
                                 mega_err *err) {
  memset(out, 0, sizeof *out);
  const char *list = getenv("SLURM_JOB_NODELIST");
  if (!list || !list[0]) list = getenv("SLURM_NODELIST");
  if (!list || !list[0])
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--peers slurm: SLURM_JOB_NODELIST is not set; start megad with srun in a "
                     "Slurm allocation (deploy/slurm/mega.sbatch), or give --peers HOST:PORT,...");
  unsigned port = 0;
  if (!listen || !strncmp(listen, "unix:", 5) || !mega_port_of(listen, &port) || port == 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--peers slurm needs --listen HOST:PORT with a fixed port (every node's "
                     "megad listens on the same one and finds the others there), not %s",
                     listen ? listen : "nothing");
  const char *self = node_name;
  if (!self) {
    self = getenv("SLURMD_NODENAME");
    if (!self || !self[0])
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--peers slurm: SLURMD_NODENAME is not set (megad runs outside a job "
                       "step?); give --node-name as Slurm names this node");
    if (!(out->node_name = strdup(self))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  mega_status st = megad_slurm_peers(list, self, port, &out->peers, &out->nnodes, err);
  if (st != MEGA_OK) {
    megad_slurm_free(out);
    return st;
  }
  out->gpu_slots = env_count("SLURM_GPUS_ON_NODE");
  out->cpu_slots = env_count("SLURM_CPUS_ON_NODE");
  if (out->gpu_slots < 0 || out->cpu_slots < 0) {
    megad_slurm_free(out);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--peers slurm: SLURM_GPUS_ON_NODE='%s' or SLURM_CPUS_ON_NODE='%s' is not a "
                     "count; give --slots N", getenv("SLURM_GPUS_ON_NODE") ?: "",
                     getenv("SLURM_CPUS_ON_NODE") ?: "");
  }
  return MEGA_OK;
}

void megad_slurm_free(megad_slurm *s) {
  free(s->node_name);
  free(s->peers);
  memset(s, 0, sizeof *s);
}
