#include "daemon/model/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/replicas.h"
#include "daemon/model/util.h"

static mega_status oom(mega_err *err) { return mega_fail(err, MEGA_ERR_NOMEM, "out of memory"); }

static void free_placement(mega_job *j) {
  for (size_t i = 0; i < j->nplaced; i++) free(j->placement[i].node_id);
  free(j->placement);
  j->placement = NULL;
  j->nplaced = 0;
}

void mega_job_free(mega_job *j) {
  if (!j) return;
  free(j->id);
  free(j->name);
  for (size_t i = 0; i < j->nargs; i++) free(j->args[i]);
  free(j->args);
  free(j->error);
  free(j->spec_why);
  free(j->coordinator);
  free(j->ckpt_path);
  free(j->coord.wait);
  mega_replicas_plan_free(j->coord.replicas);
  free(j->coord.replicas_why);
  for (size_t i = 0; i < j->coord.ndonors; i++) free(j->coord.donors[i]);
  free(j->coord.donors);
  free_placement(j);
  mega_jobspec_free(&j->spec);
  mega_job_hist_free(&j->hist);
  free(j);
}

static mega_status set_spec(mega_job *j, const Mega__V1__JobSpec *spec, mega_err *err) {
  j->name = megad_strdup(spec ? spec->name : NULL);
  size_t n = spec ? spec->n_args : 0;
  j->args = calloc(n ? n : 1, sizeof *j->args);
  if (!j->name || !j->args) return oom(err);
  for (size_t i = 0; i < n; i++) {
    if (!(j->args[i] = megad_strdup(spec->args[i]))) return oom(err);
    j->nargs++;
  }
  if (spec) {
    j->nnodes_min = spec->nnodes_min;
    j->nnodes_max = spec->nnodes_max;
    j->nproc_per_node = spec->nproc_per_node;
    j->max_restarts = spec->max_restarts;
    j->step_timeout_ms = spec->step_timeout_ms;
  }
  /* parsed once; a job whose flags no longer parse keeps its record */
  mega_err why = {0};
  j->spec_ok = mega_jobspec_parse(&j->spec, (int)j->nargs, j->args, &why) == MEGA_OK;
  if (!j->spec_ok && !(j->spec_why = strdup(why.msg))) return oom(err);
  return MEGA_OK;
}

mega_status mega_job_new(const char *id, const Mega__V1__JobSpec *spec, const char *coordinator,
                         int64_t now_ms, mega_job **out, mega_err *err) {
  *out = NULL;
  mega_job *j = calloc(1, sizeof *j);
  if (!j) return oom(err);
  j->state = MEGA_JOB_PENDING;
  j->created_ms = now_ms;
  j->tp = j->pp = j->dp = j->vp = 1;
  mega_jobspec_defaults(&j->spec);
  if (!(j->id = strdup(id)) || !(j->coordinator = megad_strdup(coordinator)) ||
      set_spec(j, spec, err) != MEGA_OK) {
    mega_job_free(j);
    return oom(err);
  }
  *out = j;
  return MEGA_OK;
}

bool mega_job_state_final(mega_job_state s) {
  return s == MEGA_JOB_SUCCEEDED || s == MEGA_JOB_FAILED || s == MEGA_JOB_CANCELLED ||
         s == MEGA_JOB_STOPPED;
}

const char *mega_job_state_name(mega_job_state s) {
  switch (s) {
  case MEGA_JOB_PENDING: return "pending";
  case MEGA_JOB_RUNNING: return "running";
  case MEGA_JOB_SUCCEEDED: return "succeeded";
  case MEGA_JOB_FAILED: return "failed";
  case MEGA_JOB_CANCELLED: return "cancelled";
  case MEGA_JOB_RESTARTING: return "restarting";
  case MEGA_JOB_STOPPED: return "stopped";
  default: return "unknown";
  }
}

static bool allowed(mega_job_state from, mega_job_state to) {
  switch (from) {
  case MEGA_JOB_PENDING:
    return to == MEGA_JOB_RUNNING || to == MEGA_JOB_FAILED || to == MEGA_JOB_CANCELLED;
  case MEGA_JOB_RUNNING:
    return to == MEGA_JOB_SUCCEEDED || to == MEGA_JOB_FAILED || to == MEGA_JOB_CANCELLED ||
           to == MEGA_JOB_RESTARTING || to == MEGA_JOB_STOPPED;
  case MEGA_JOB_RESTARTING:
    return to == MEGA_JOB_RUNNING || to == MEGA_JOB_FAILED || to == MEGA_JOB_CANCELLED;
  case MEGA_JOB_FAILED:
  case MEGA_JOB_STOPPED: /* megactl resume */
    return to == MEGA_JOB_RESTARTING;
  default:
    return false;
  }
}

mega_status mega_job_transition(mega_job *j, mega_job_state to, int64_t now_ms, const char *error,
                                mega_err *err) {
  if (!allowed(j->state, to))
    return mega_fail(err, MEGA_ERR_INVALID, "job %s cannot go from %s to %s", j->id,
                     mega_job_state_name(j->state), mega_job_state_name(to));
  if ((to == MEGA_JOB_FAILED || to == MEGA_JOB_CANCELLED || to == MEGA_JOB_STOPPED) && error) {
    char *e = strdup(error);
    if (!e) return oom(err);
    free(j->error);
    j->error = e;
  }
  j->state = to;
  if (to == MEGA_JOB_RUNNING && !j->started_ms) j->started_ms = now_ms;
  if (mega_job_state_final(to)) j->ended_ms = now_ms;
  return MEGA_OK;
}

mega_status mega_job_place(mega_job *j, const mega_job_node *nodes, size_t n, uint32_t world,
                           uint32_t tp, uint32_t pp, uint32_t vp, mega_err *err) {
  mega_job_node *p = calloc(n ? n : 1, sizeof *p);
  if (!p) return oom(err);
  for (size_t i = 0; i < n; i++) {
    p[i] = nodes[i];
    if (!(p[i].node_id = strdup(nodes[i].node_id))) {
      for (size_t k = 0; k < i; k++) free(p[k].node_id);
      free(p);
      return oom(err);
    }
  }
  free_placement(j);
  j->placement = p;
  j->nplaced = n;
  j->world = world;
  j->tp = tp;
  j->pp = pp;
  j->vp = vp;
  j->dp = tp && pp ? world / (tp * pp) : 0;
  return MEGA_OK;
}

const mega_job_node *mega_job_node_of(const mega_job *j, uint32_t rank) {
  for (size_t i = 0; i < j->nplaced; i++)
    if (rank >= j->placement[i].first_rank &&
        rank < j->placement[i].first_rank + j->placement[i].nranks)
      return &j->placement[i];
  return NULL;
}

/* ---- the wire ---- */

mega_status mega_job_msg_init(mega_job_msg *m, const mega_job *j, mega_err *err) {
  memset(m, 0, sizeof *m);
  mega__v1__job__init(&m->job);
  mega__v1__job_spec__init(&m->spec);
  size_t nr = 0;
  for (size_t i = 0; i < j->nplaced; i++) nr += j->placement[i].nranks;
  m->nr = calloc(j->nplaced ? j->nplaced : 1, sizeof *m->nr);
  m->nrp = calloc(j->nplaced ? j->nplaced : 1, sizeof *m->nrp);
  m->ranks = calloc(nr ? nr : 1, sizeof *m->ranks);
  if (!m->nr || !m->nrp || !m->ranks) {
    mega_job_msg_free(m);
    return oom(err);
  }
  uint32_t *r = m->ranks;
  for (size_t i = 0; i < j->nplaced; i++) {
    mega__v1__node_ranks__init(&m->nr[i]);
    m->nr[i].node_id = j->placement[i].node_id;
    m->nr[i].ranks = r;
    m->nr[i].n_ranks = j->placement[i].nranks;
    for (uint32_t k = 0; k < j->placement[i].nranks; k++) *r++ = j->placement[i].first_rank + k;
    m->nrp[i] = &m->nr[i];
  }
  m->spec.name = j->name;
  m->spec.args = j->args;
  m->spec.n_args = j->nargs;
  m->spec.nnodes_min = j->nnodes_min;
  m->spec.nnodes_max = j->nnodes_max;
  m->spec.nproc_per_node = j->nproc_per_node;
  m->spec.max_restarts = j->max_restarts;
  m->spec.step_timeout_ms = j->step_timeout_ms;
  Mega__V1__Job *o = &m->job;
  o->id = j->id;
  o->name = j->name;
  o->state = j->state;
  o->spec = &m->spec;
  o->world_size = j->world;
  o->tp = j->tp;
  o->pp = j->pp;
  o->dp = j->dp;
  o->vp = j->vp;
  o->created_unix_ms = j->created_ms;
  o->started_unix_ms = j->started_ms;
  o->ended_unix_ms = j->ended_ms;
  o->error = j->error ? j->error : "";
  o->last_iteration = j->last_iteration;
  o->train_iters = j->train_iters;
  o->attempt = j->attempt;
  o->placement = m->nrp;
  o->n_placement = j->nplaced;
  o->coordinator_node_id = j->coordinator;
  o->checkpoint_iteration = j->ckpt_iteration;
  o->checkpoint_path = j->ckpt_path ? j->ckpt_path : "";
  o->restarts = j->restarts;
  return MEGA_OK;
}

void mega_job_msg_free(mega_job_msg *m) {
  free(m->nr);
  free(m->nrp);
  free(m->ranks);
  m->nr = NULL;
  m->nrp = NULL;
  m->ranks = NULL;
}

mega_status mega_job_from_msg(const Mega__V1__Job *msg, mega_job **out, mega_err *err) {
  mega_job *j;
  mega_status s = mega_job_new(msg->id, msg->spec, msg->coordinator_node_id, msg->created_unix_ms,
                               &j, err);
  if (s != MEGA_OK) return s;
  if (!msg->spec && msg->name && msg->name[0]) {
    free(j->name);
    if (!(j->name = strdup(msg->name))) goto nomem;
  }
  j->state = msg->state;
  j->started_ms = msg->started_unix_ms;
  j->ended_ms = msg->ended_unix_ms;
  if (msg->error && msg->error[0] && !(j->error = strdup(msg->error))) goto nomem;
  j->last_iteration = msg->last_iteration;
  j->train_iters = msg->train_iters;
  j->attempt = msg->attempt;
  j->restarts = msg->restarts;
  j->ckpt_iteration = msg->checkpoint_iteration;
  if (msg->checkpoint_path && msg->checkpoint_path[0] && !(j->ckpt_path = strdup(msg->checkpoint_path)))
    goto nomem;
  mega_job_node *nodes = calloc(msg->n_placement ? msg->n_placement : 1, sizeof *nodes);
  if (!nodes) goto nomem;
  for (size_t i = 0; i < msg->n_placement; i++) {
    const Mega__V1__NodeRanks *nr = msg->placement[i];
    nodes[i].node_id = nr->node_id;
    nodes[i].first_rank = nr->n_ranks ? nr->ranks[0] : 0;
    nodes[i].nranks = (uint32_t)nr->n_ranks;
  }
  s = mega_job_place(j, nodes, msg->n_placement, msg->world_size, msg->tp, msg->pp, msg->vp, err);
  free(nodes);
  if (s != MEGA_OK) {
    mega_job_free(j);
    return s;
  }
  j->dp = msg->dp;
  *out = j;
  return MEGA_OK;
nomem:
  mega_job_free(j);
  return oom(err);
}

/* ---- the table ---- */

void mega_jobs_init(mega_jobs *t) {
  memset(t, 0, sizeof *t);
  t->next_id = 1;
}

void mega_jobs_free(mega_jobs *t) {
  for (size_t i = 0; i < t->n; i++) mega_job_free(t->v[i]);
  free(t->v);
  mega_jobs_init(t);
}

mega_job *mega_jobs_table_find(const mega_jobs *t, const char *id) {
  if (!id) return NULL;
  for (size_t i = 0; i < t->n; i++)
    if (!strcmp(t->v[i]->id, id)) return t->v[i];
  return NULL;
}

static void note_id(mega_jobs *t, const char *id) {
  unsigned long long n;
  if (sscanf(id, "j-%llu", &n) == 1 && n >= t->next_id) t->next_id = n + 1;
}

void mega_jobs_filter(mega_jobs *t, bool (*keep)(const mega_job *j, void *arg), void *arg) {
  size_t k = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (keep(t->v[i], arg)) t->v[k++] = t->v[i];
    else mega_job_free(t->v[i]);
  }
  t->n = k;
}

static bool not_id(const mega_job *j, void *id) { return strcmp(j->id, id) != 0; }

void mega_jobs_forget(mega_jobs *t, const char *id) {
  note_id(t, id);
  mega_jobs_filter(t, not_id, (void *)id);
}

mega_job *mega_jobs_take(mega_jobs *t, const char *id) {
  for (size_t i = 0; id && i < t->n; i++) {
    mega_job *j = t->v[i];
    if (strcmp(j->id, id)) continue;
    memmove(t->v + i, t->v + i + 1, (t->n - i - 1) * sizeof *t->v);
    t->n--;
    return j;
  }
  return NULL;
}

mega_status mega_jobs_add(mega_jobs *t, mega_job *j, mega_err *err) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    mega_job **v = realloc(t->v, cap * sizeof *v);
    if (!v) return oom(err);
    t->v = v;
    t->cap = cap;
  }
  t->v[t->n++] = j;
  note_id(t, j->id);
  return MEGA_OK;
}

void mega_jobs_next_id(mega_jobs *t, const char *node, char *buf, size_t len) {
  snprintf(buf, len, "j-%llu-%s", (unsigned long long)t->next_id++, node);
}
