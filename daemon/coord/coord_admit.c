/* Admission: what a job must be to be accepted at submit. Everything from
 * the wire is bounded before any arithmetic on it; the paths must lie
 * under the roots; the job must be placeable on some node that exists; and
 * the node's queue must have room. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>

#include "core/jobspec.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/model/roots.h"
#include "daemon/model/util.h"

/* Control characters reach terminals raw (escape sequences); a name is an
 * identifier, so it may hold none. */
static const char *bad_text(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == 0x7f) return "a control character";
  return NULL;
}

mega_status coord_check_msg(const megad_coord *c, const Mega__V1__JobSpec *spec, mega_err *err) {
  (void)c;
  const char *name = spec->name ? spec->name : "";
  size_t len = strlen(name);
  if (len > MEGAD_JOB_NAME_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--name: %zu bytes is longer than the %d allowed",
                     len, MEGAD_JOB_NAME_MAX);
  const char *why = bad_text(name);
  if (why)
    return mega_fail(err, MEGA_ERR_INVALID, "--name holds %s; give a name of printable "
                     "characters", why);
  if (spec->n_args > MEGAD_JOB_ARGS_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "the job has %zu flag words, more than the %d allowed",
                     spec->n_args, MEGAD_JOB_ARGS_MAX);
  for (size_t i = 0; i < spec->n_args; i++) {
    size_t n = spec->args[i] ? strlen(spec->args[i]) : 0;
    if (n > MEGAD_JOB_ARG_MAX)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "job flag word %zu is %zu bytes long, more than the %d allowed", i + 1, n,
                       MEGAD_JOB_ARG_MAX);
  }
  if (spec->nnodes_min > MEGAD_NODES_MAX || spec->nnodes_max > MEGAD_NODES_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes %u:%u: at most %d nodes", spec->nnodes_min,
                     spec->nnodes_max, MEGAD_NODES_MAX);
  if (spec->nproc_per_node > MEGAD_NPROC_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nproc-per-node %u: at most %d", spec->nproc_per_node,
                     MEGAD_NPROC_MAX);
  if ((uint64_t)(spec->nnodes_max > spec->nnodes_min ? spec->nnodes_max : spec->nnodes_min) *
          (spec->nproc_per_node ? spec->nproc_per_node : 1) > MEGAD_WORLD_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes x --nproc-per-node is more than %d ranks",
                     MEGAD_WORLD_MAX);
  if (spec->max_restarts > MEGAD_RESTARTS_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "--max-restarts %u: at most %d", spec->max_restarts,
                     MEGAD_RESTARTS_MAX);
  return MEGA_OK;
}

/* A job whose ranks per node no node has the slots for can never start. */
static mega_status check_placeable(megad_coord *c, const mega_job *j, mega_err *err) {
  uint32_t most = 0;
  for (size_t i = 0; i < c->members->nnodes; i++)
    if (c->members->nodes[i]->slots > most) most = c->members->nodes[i]->slots;
  uint32_t nproc = coord_nproc(c, j);
  if (nproc > most)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--nproc-per-node %u: no node of the cluster has that many slots (the most "
                     "is %u), so the job could never start",
                     nproc, most);
  return MEGA_OK;
}

/* This node's memory (MemTotal): the coordinator's view of a node's, the
 * nodes of a cluster being alike. 0 when unknown. */
static double node_memory_bytes(void) {
  struct sysinfo si;
  return sysinfo(&si) == 0 ? (double)si.totalram * si.mem_unit : 0;
}

/* The model's parameters: GPT-2's (12h^2 + 13h per layer, wpe, the tied
 * head) or a Llama's (its query and key/value widths, SwiGLU's three
 * projections, RMSNorm, no wpe, an untied head), biases or none. */
static double model_params(const mega_jobspec *s, double V, double pos) {
  double h = s->hidden_size, kv = mega_jobspec_kv_channels(s);
  double q = s->num_attention_heads * kv, g = mega_jobspec_query_groups(s) * kv;
  double f = mega_jobspec_ffn_hidden_size(s), mlp = s->swiglu ? 3 : 2;
  bool rms = s->normalization == MEGA_NORM_RMSNORM;
  double layer = h * (q + 2 * g) + q * h + mlp * h * f + (rms ? 2 : 4) * h;
  if (!s->disable_bias_linear) layer += q + 2 * g + h + (mlp - 1) * f + h;
  double emb = V * h * (s->untie_embeddings_and_output_weights ? 2 : 1);
  if (s->position_embedding_type != MEGA_POS_ROPE) emb += pos * h;
  return emb + s->num_layers * layer + (rms ? 1 : 2) * h;
}

/* A job whose model cannot fit in a node's memory is refused now rather
 * than OOM-killed later. An upper estimate per rank (fp32, as the workers
 * train): the stage's share of the parameters at 16 bytes each (weights,
 * gradients, Adam's two moments; the moments divided over DP with the
 * distributed optimizer), plus the activations of the microbatches a stage
 * holds at once (Megatron's 34·s·b·h + 5·a·s²·b per layer, doubled for fp32)
 * and the last stage's logits (one [s·b, V/TP] buffer: the classifier's
 * probabilities and gradient are written over them). */
static mega_status check_memory(megad_coord *c, const mega_job *j, uint32_t nproc, uint32_t nodes,
                                mega_err *err) {
  const mega_jobspec *s = &j->spec;
  double mem = c->o.node_memory_bytes > 0 ? c->o.node_memory_bytes : node_memory_bytes();
  if (mem <= 0) return MEGA_OK;
  /* GPT-2's vocabulary is its vocab file's size: read it (a shallow copy
   * takes the count; it owns nothing) */
  mega_jobspec counted = *s;
  mega_err verr = {0};
  if (mega_jobspec_tokenizer(s) == MEGA_TOKENIZER_GPT2BPE &&
      mega_jobspec_load_vocab(&counted, &verr) != MEGA_OK)
    return mega_fail(err, MEGA_ERR_INVALID, "invalid job: %s on node %s", verr.msg,
                     c->b->node_id);
  double h = s->hidden_size, L = s->num_layers, seq = s->seq_length, b = s->micro_batch_size,
         a = s->num_attention_heads, V = mega_jobspec_padded_vocab(&counted),
         pos = mega_jobspec_max_position_embeddings(s);
  double tp = j->tp ? j->tp : 1, pp = j->pp ? j->pp : 1, world = (double)nproc * nodes;
  double dp = world / (tp * pp) >= 1 ? world / (tp * pp) : 1;
  double params = model_params(s, V, pos);
  double per_rank_params = params / (tp * pp);
  double state = per_rank_params * (8 + (s->use_distributed_optimizer ? 8 / dp : 8));
  double in_flight = pp; /* 1F1B holds at most PP microbatches' activations */
  double act = (L / pp) * in_flight * 2 * (34 * seq * b * h + 5 * a * seq * seq * b) / tp +
               4 * seq * b * V / tp;
  double need = nproc * (state + act);
  if (need <= mem) return MEGA_OK;
  const double gib = 1024.0 * 1024 * 1024;
  return mega_fail(err, MEGA_ERR_INVALID,
                   "invalid job: the model needs about %.1f GiB on each node (%u rank%s x "
                   "(%.1f GiB of weights, gradients and Adam state for %.2fB parameters / TP %g / "
                   "PP %g, plus %.1f GiB of activations)), but node %s has %.1f GiB; use more "
                   "pipeline or tensor parallelism, fewer ranks per node, or a smaller model",
                   need / gib, nproc, nproc == 1 ? "" : "s", state / gib, params / 1e9, tp, pp,
                   act / gib, c->b->node_id, mem / gib);
}

/* --save need not exist yet (the committing rank makes it at its start),
 * but its nearest existing ancestor must be a directory this megad can make
 * directories in: else every attempt fails at its start. access() alone
 * would pass anything for root (/proc: "rw"), so a directory is made and
 * removed there; nothing is left behind. As with --data-path, this is the
 * coordinator's view; the committing rank checks again where it runs. */
static mega_status check_save_dir(const megad_coord *c, const char *save, mega_err *err) {
  char p[MEGAD_JOB_ARG_MAX + 1];
  snprintf(p, sizeof p, "%s", save);
  struct stat st;
  for (;;) {
    if (stat(p, &st) == 0) break;
    if (errno != ENOENT && errno != ENOTDIR)
      return mega_fail(err, MEGA_ERR_INVALID, "invalid job: --save %s: cannot look at %s: %s",
                       save, p, strerror(errno));
    char *slash = strrchr(p, '/');
    while (slash && slash > p && slash[1] == '\0') { /* a trailing slash */
      *slash = '\0';
      slash = strrchr(p, '/');
    }
    if (!slash) snprintf(p, sizeof p, ".");
    else if (slash == p) p[1] = '\0';
    else *slash = '\0';
  }
  bool self = !strcmp(p, save);
  if (!S_ISDIR(st.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID,
                     self ? "invalid job: --save %s is a file; give a directory for the "
                            "checkpoints%s"
                          : "invalid job: --save %s lies under %s, which is a file, not a "
                            "directory; give a --save whose parents are directories",
                     save, self ? "" : p);
  char probe[MEGAD_JOB_ARG_MAX + 64];
  snprintf(probe, sizeof probe, "%s/.megad-save-check-XXXXXX", p);
  if (!mkdtemp(probe))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: --save %s: megad on %s cannot create directories in %s (%s); "
                     "give a --save in a directory megad's user may write",
                     save, c->b->node_id, p, strerror(errno));
  rmdir(probe);
  return MEGA_OK;
}

/* The first job of t other than j, not ended, whose --save resolves to a. */
static mega_status save_in_use_by(const mega_jobs *t, const mega_job *j, const char *a,
                                  mega_err *err) {
  mega_status rc = MEGA_OK;
  for (size_t i = 0; i < t->n && rc == MEGA_OK; i++) {
    const mega_job *o = t->v[i];
    if (o == j || !strcmp(o->id, j->id) || !o->spec.save || mega_job_state_final(o->state))
      continue;
    char *theirs = megad_path_resolve(o->spec.save);
    if (!strcmp(a, theirs ? theirs : o->spec.save))
      rc = mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: --save %s is the checkpoint directory of job %s%s%s (%s), "
                     "which has not ended; two jobs saving there would overwrite each other's "
                     "checkpoints: give another --save, or cancel %s first",
                     j->spec.save, o->id, o->name && o->name[0] ? " " : "", o->name ? o->name : "",
                     mega_job_state_name(o->state), o->id);
    free(theirs);
  }
  return rc;
}

/* Two live jobs on one --save overwrite each other's checkpoints, and one's
 * start-up clean-up removes the other's saves in progress: a --save that a
 * job which has not ended uses is refused (after resolving both, so ./ck
 * and /abs/ck are one directory). The jobs are this megad's and, on etcd,
 * every node's (the mirror), since a --save is shared storage. An ended
 * job's is free: a new job resuming from what it saved is the normal use.
 * j itself (a resume) is skipped. */
mega_status coord_save_in_use(const megad_coord *c, const mega_job *j, mega_err *err) {
  if (!j->spec.save) return MEGA_OK;
  char *mine = megad_path_resolve(j->spec.save);
  const char *a = mine ? mine : j->spec.save;
  mega_status rc = save_in_use_by(&c->jobs->t, j, a, err);
  if (rc == MEGA_OK && c->jobs->etcd) rc = save_in_use_by(&c->jobs->mirror, j, a, err);
  free(mine);
  return rc;
}

/* What can be checked when a job arrives: its flags, a node count in range
 * giving a valid world, and the files as the coordinator sees them (it runs
 * the first ranks; every node checks again before its ranks start). */
mega_status coord_admit(megad_coord *c, const mega_job *j, mega_err *err) {
  const mega_jobspec *s = &j->spec;
  uint32_t lo = j->nnodes_min ? j->nnodes_min : 1, hi = j->nnodes_max > lo ? j->nnodes_max : lo;
  if (j->nnodes_max && j->nnodes_max < lo)
    return mega_fail(err, MEGA_ERR_INVALID, "--nnodes %u:%u: MAX is below MIN", lo, j->nnodes_max);
  mega_status rc = c->o.roots ? megad_roots_check(c->o.roots, s, err) : MEGA_OK;
  if (rc != MEGA_OK) return rc;
  const char *flag, *bad, *why;
  /* PREFIX.bin or PREFIX.idx for PREFIX: refused with the prefix to give
   * (megactl and megad run give the prefix when they see the files);
   * without rewrite the spec is only read */
  if ((rc = mega_jobspec_fix_data_paths((mega_jobspec *)s, false, NULL, 0, err)) != MEGA_OK)
    return rc;
  if (!megad_data_visible(s, &flag, &bad, &why))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: %s %s: %s on node %s (the coordinator; every node of the job "
                     "must see it: a file, or PREFIX.bin and PREFIX.idx)", flag, bad, why,
                     c->b->node_id);
  if (s->save && ((rc = check_save_dir(c, s->save, err)) != MEGA_OK ||
                  (rc = coord_save_in_use(c, j, err)) != MEGA_OK))
    return rc;
  uint32_t nproc = coord_nproc(c, j);
  if ((rc = mega_jobspec_check_node(s, (int)nproc, err)) != MEGA_OK) return rc;
  rc = coord_check_world(s, (int)(lo * nproc), err);
  for (uint32_t n = hi; rc != MEGA_OK && n > lo; n--)
    if (coord_check_world(s, (int)(n * nproc), NULL) == MEGA_OK) rc = MEGA_OK;
  if (rc != MEGA_OK) return rc;
  if ((rc = check_placeable(c, j, err)) != MEGA_OK) return rc;
  if ((rc = check_memory(c, j, nproc, lo, err)) != MEGA_OK) return rc;
  size_t waiting = c->nwaiting;
  if (c->o.max_pending && waiting >= c->o.max_pending)
    return mega_fail(err, MEGA_ERR_NOMEM,
                     "node %s already holds %zu waiting jobs (--max-pending %u); cancel some or "
                     "wait for them to start",
                     c->b->node_id, waiting, c->o.max_pending);
  return MEGA_OK;
}
