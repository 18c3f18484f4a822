/* A rank's communicators, and the one rule for which carries what.
 *
 * Each group has a device communicator (dcomm) for backend memory and a
 * host communicator (hcomm) for host memory, because NCCL, a cuda rank's
 * device communicator, reads and writes device memory only:
 *
 *   group  device (dcomm)                          host (hcomm)
 *   pp     activations and their gradients (P2P)   --variable-seq-lengths shape
 *                                                  messages; the grad-norm pieces and
 *                                                  drain times (pipeline_stats)
 *   dp     gradient buckets; the distributed       loss and token sums; grad-norm
 *          optimizer's reduce-scatter and          pieces; the checkpoint's moment
 *          parameter all-gather                    gather; the save barrier
 *   embd   the tied embedding's gradients (none     -
 *          with untied embeddings)
 *   tp     the model's collectives; sequence-      grad-norm pieces; checkpoint
 *          parallel layernorm gradients            slices (staged to host)
 *   ckpt   -                                       the writers' file lists, barrier
 *
 * A cpu rank has one Gloo communicator per group, which is both. A cuda
 * rank has NCCL for dcomm and Gloo for hcomm (as Megatron keeps gloo groups
 * beside its NCCL ones). With env.check_comm_memory a cpu rank builds the
 * two separately, as a cuda rank does, and wraps each in a check of every
 * buffer it is given (comm_check.h): that is how the routing is tested
 * without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/backend/cuda_module.h"
#include "worker/comm/comm_check.h"
#include "worker/rank/rank_internal.h"

typedef struct group_def {
  mega_group_kind kind;
  const char *name;
  bool dev, host; /* which communicators it needs */
} group_def;

/* Every rank builds its groups in this order, so each creation only waits
 * for members creating the same one. GROUP_CKPT is built apart. */
static const group_def groups[] = {
    [GROUP_PP] = {MEGA_GROUP_PP, "pp", true, true},
    [GROUP_DP] = {MEGA_GROUP_DP, "dp", true, true},
    [GROUP_EMBD] = {MEGA_GROUP_EMBD, "embd", true, false},
    [GROUP_TP] = {MEGA_GROUP_TP, "tp", true, true},
};

static int timeout_ms(const mega_rank *r) {
  return r->env.kv_timeout_ms > 0 ? r->env.kv_timeout_ms : 60000;
}

static bool on_cuda(const mega_rank *r) { return !strcmp(r->be->ops->name, "cuda"); }

static bool is_device(void *be, const void *p, size_t bytes) {
  return mega_backend_cpu_owns(be, p, bytes);
}

static bool is_host(void *be, const void *p, size_t bytes) {
  return !mega_backend_cpu_owns(be, p, bytes);
}

static bool on_node(const mega_rank *r, int rank) {
  for (size_t i = 0; i < r->env.n_node_ranks; i++)
    if (r->env.node_ranks[i] == (uint32_t)rank) return true;
  return false;
}

/* Marks group idx of kind k (both its communicators) as all on this node
 * when every member runs here: its collectives then go through shared
 * memory (comm.h), and under megad it rendezvouses through this node's
 * megad alone (a job's TP groups, as a rule, never reach the coordinator).
 * A hand launch lists every rank as on this node. */
static mega_status mark_here(mega_rank *r, mega_group_kind k, int idx, const char *name,
                             mega_err *err) {
  int size = mega_topo_group_size(&r->topo, k);
  if (!r->env.n_node_ranks || size < 1 || (size_t)size > r->env.n_node_ranks) return MEGA_OK;
  int *members = malloc((size_t)size * sizeof *members);
  if (!members) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  mega_topo_group(&r->topo, k, idx, members);
  bool all = true;
  for (int i = 0; i < size && all; i++) all = on_node(r, members[i]);
  free(members);
  if (!all) return MEGA_OK;
  char host[80];
  snprintf(host, sizeof host, "%s.host", name);
  mega_status st = mega_store_group_here(r->store, name, err);
  return st == MEGA_OK ? mega_store_group_here(r->store, host, err) : st;
}

/* One communicator of group (named name) for device or host memory. */
static mega_status create_comm(mega_rank *r, const char *name, bool dev, int pos, int size,
                               mega_comm **out, mega_err *err) {
  char group[80];
  snprintf(group, sizeof group, "%s%s", name, dev ? "" : ".host");
  mega_status st;
  if (dev && on_cuda(r))
    st = mega_comm_create_nccl(r->store, group, pos, size, r->be, timeout_ms(r), out, err);
  else
    st = mega_comm_create(r->store, group, pos, size, r->env.hostname, timeout_ms(r), out, err);
  if (st == MEGA_OK && r->env.check_comm_memory)
    st = mega_comm_check_wrap(*out, dev ? is_device : is_host, r->be,
                              dev ? "device memory" : "host memory", out, err);
  if (st != MEGA_OK) mega_err_prefix(err, "joining group %s as rank %d of %d", group, pos, size);
  return st;
}

/* Publishes a group's communicators, under the lock mega_rank_abort takes. */
static mega_status publish(mega_rank *r, int g, mega_comm *d, mega_comm *h, mega_err *err) {
  pthread_mutex_lock(&r->comm_lock);
  r->dcomm[g] = d;
  r->hcomm[g] = h;
  /* An abort that raced with the creation must still reach this group. */
  if (atomic_load(&r->aborted)) rank_comm_abort_locked(r, g);
  pthread_mutex_unlock(&r->comm_lock);
  if (!atomic_load(&r->aborted)) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_CANCELLED, "rank %d aborted: %s", r->env.rank, r->abort_reason);
}

/* The group's communicators: one that is both on a plain cpu rank, else
 * the two it needs (created device first). */
static mega_status join(mega_rank *r, int g, const group_def *def, const char *name, int pos,
                        int size, mega_err *err) {
  mega_comm *d = NULL, *h = NULL;
  mega_status st = MEGA_OK;
  bool split = on_cuda(r) || r->env.check_comm_memory;
  if (def->dev) st = create_comm(r, name, true, pos, size, &d, err);
  if (st == MEGA_OK && def->host) {
    if (d && !split)
      h = d;
    else
      st = create_comm(r, name, false, pos, size, &h, err);
  }
  if (st != MEGA_OK) {
    mega_comm_destroy(d);
    return st;
  }
  return publish(r, g, d, h, err);
}

mega_status rank_build_groups(mega_rank *r, mega_err *err) {
  if (r->env.world_size == 1) return MEGA_OK;
  if (r->env.check_comm_memory && on_cuda(r))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "check_comm_memory needs the cpu backend (it tracks the cpu's allocations)");
  const char *prefix = rank_store_prefix(r);
  mega_status st = r->env.kv ? mega_store_open_kv(r->env.kv, r->env.kv_ctx, prefix, &r->store, err)
                             : mega_store_open_file(r->env.store_dir, prefix, &r->store, err);
  if (st == MEGA_OK && !r->env.kv) st = rank_same_job(r, r->store, timeout_ms(r), err);
  for (int g = 0; g < GROUP_CKPT && st == MEGA_OK; g++) {
    int pos = 0, idx = mega_topo_group_of(&r->topo, groups[g].kind, r->env.rank, &pos);
    int size = mega_topo_group_size(&r->topo, groups[g].kind);
    if (idx < 0 || size < 2) continue;
    /* an untied head shares nothing with the embedding */
    if (g == GROUP_EMBD && r->job->untie_embeddings_and_output_weights) continue;
    char name[64];
    snprintf(name, sizeof name, "%s%d", groups[g].name, idx);
    st = mark_here(r, groups[g].kind, idx, name, err);
    if (st == MEGA_OK) st = join(r, g, &groups[g], name, pos, size, err);
  }
  r->tp.comm = r->dcomm[GROUP_TP];
  r->tp.hcomm = r->hcomm[GROUP_TP];
  /* The writers: the pipeline of dp 0, tp 0, once more, for checkpoints. */
  static const group_def ckpt = {MEGA_GROUP_PP, "ckpt", false, true};
  if (st == MEGA_OK && r->job->save && rank_is_writer(r) && r->topo.pp > 1)
    st = join(r, GROUP_CKPT, &ckpt, "ckpt", r->me.pp, r->topo.pp, err);
  mega_store_close(r->store);
  r->store = NULL;
  return st;
}

void rank_comm_abort_locked(mega_rank *r, int g) {
  if (r->dcomm[g]) mega_comm_abort(r->dcomm[g]);
  if (r->hcomm[g] && r->hcomm[g] != r->dcomm[g]) mega_comm_abort(r->hcomm[g]);
}

void rank_comm_destroy_all(mega_rank *r) {
  pthread_mutex_lock(&r->comm_lock);
  for (int g = 0; g < NGROUPS; g++) {
    if (r->hcomm[g] != r->dcomm[g]) mega_comm_destroy(r->hcomm[g]);
    mega_comm_destroy(r->dcomm[g]);
    r->dcomm[g] = r->hcomm[g] = NULL;
  }
  pthread_mutex_unlock(&r->comm_lock);
}

mega_status rank_sum_doubles(mega_comm *c, double *v, mega_err *err) {
  if (!c) return MEGA_OK;
  int n = mega_comm_size(c);
  double all[n];
  size_t counts[n];
  for (int i = 0; i < n; i++) counts[i] = sizeof(double);
  mega_status st = mega_comm_all_gather(c, v, all, counts, MEGA_DT_BYTE, 0, err);
  if (st != MEGA_OK) return st;
  double s = 0;
  for (int i = 0; i < n; i++) s += all[i];
  *v = s;
  return MEGA_OK;
}
