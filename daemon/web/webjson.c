/* The web view's JSON documents (see webjson.h). */
#include "daemon/web/webjson.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec.h"
#include "core/schedule.h"
#include "core/sim.h"
#include "core/utf8.h"

/* An enum value's proto name without its prefix, lower case:
 * JOB_EVENT_KIND_NODE_LOST -> "node_lost". */
static json_t *enum_name(const ProtobufCEnumDescriptor *d, int value, const char *prefix) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  if (!v) return json_string("unknown");
  const char *s = v->name;
  size_t pl = strlen(prefix);
  if (!strncmp(s, prefix, pl)) s += pl;
  char buf[64];
  size_t i = 0;
  for (; s[i] && i + 1 < sizeof buf; i++) buf[i] = (char)tolower((unsigned char)s[i]);
  buf[i] = '\0';
  return json_string(buf);
}

/* A number JSON can hold: NaN and infinities (a diverged loss) become null. */
static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Text from outside (a job's name over raw gRPC, a rank's error) as a JSON
 * string: jansson refuses bytes that are not UTF-8, which would drop the
 * field, so those show as U+FFFD. NULL is "". */
static json_t *str(const char *s) {
  if (!s || mega_utf8_valid(s)) return json_string(s ? s : "");
  char *fixed = mega_utf8_sanitize(s);
  json_t *j = fixed ? json_string(fixed) : NULL;
  free(fixed);
  return j;
}

static json_t *ms(int64_t t) { return t ? json_integer(t) : json_null(); }

static json_t *job_summary(const mega_job *j) {
  json_t *o = json_object();
  json_object_set_new(o, "id", str(j->id));
  json_object_set_new(o, "name", str(j->name));
  json_object_set_new(o, "state", json_string(mega_job_state_name(j->state)));
  json_object_set_new(o, "world", json_integer(j->world));
  json_object_set_new(o, "tp", json_integer(j->tp));
  json_object_set_new(o, "pp", json_integer(j->pp));
  json_object_set_new(o, "dp", json_integer(j->dp));
  json_object_set_new(o, "vp", json_integer(j->vp));
  json_object_set_new(o, "attempt", json_integer(j->attempt));
  json_object_set_new(o, "restarts", json_integer(j->restarts));
  json_object_set_new(o, "max_restarts", json_integer(j->max_restarts));
  json_object_set_new(o, "last_iteration", json_integer((json_int_t)j->last_iteration));
  json_object_set_new(o, "train_iters", json_integer((json_int_t)j->train_iters));
  json_object_set_new(o, "checkpoint_iteration", json_integer((json_int_t)j->ckpt_iteration));
  json_object_set_new(o, "created_ms", ms(j->created_ms));
  json_object_set_new(o, "started_ms", ms(j->started_ms));
  json_object_set_new(o, "ended_ms", ms(j->ended_ms));
  json_object_set_new(o, "error", j->error ? str(j->error) : json_null());
  json_object_set_new(o, "coordinator", str(j->coordinator));
  const Mega__V1__StepMetrics *s = j->hist.last_step;
  json_object_set_new(o, "loss", s && !s->no_loss ? num(s->loss) : json_null());
  json_object_set_new(o, "tokens_per_s", s ? num(s->tokens_per_s) : json_null());
  json_object_set_new(o, "step_time_s", s ? num(s->step_time_s) : json_null());
  return o;
}

json_t *megad_webjson_jobs(const mega_jobs *t, const mega_jobs *mirror) {
  json_t *a = json_array();
  for (size_t i = t->n; i-- > 0;) json_array_append_new(a, job_summary(t->v[i])); /* newest first */
  for (size_t i = mirror ? mirror->n : 0; i-- > 0;)
    if (!mega_jobs_table_find(t, mirror->v[i]->id))
      json_array_append_new(a, job_summary(mirror->v[i]));
  json_t *o = json_object();
  json_object_set_new(o, "jobs", a);
  return o;
}

json_t *megad_webjson_cluster(const megad_web_data *d) {
  json_t *o = json_object(), *nodes = json_array();
  json_object_set_new(o, "self", str(d->nnodes ? d->nodes[0]->id : ""));
  for (size_t i = 0; i < d->nnodes; i++) {
    const megad_node *n = d->nodes[i];
    json_t *x = json_object(), *ids = json_array();
    json_object_set_new(x, "id", str(n->id));
    json_object_set_new(x, "address", str(n->address));
    json_object_set_new(x, "state", enum_name(&mega__v1__node_state__descriptor, (int)n->state,
                                              "NODE_STATE_"));
    json_object_set_new(x, "slots", json_integer(n->slots));
    json_object_set_new(x, "slots_used", json_integer(n->slots_used));
    json_object_set_new(x, "backend", str(n->backend));
    json_object_set_new(x, "devices", str(n->device_name));
    json_object_set_new(x, "version", str(n->version));
    json_object_set_new(x, "last_heartbeat_ms", ms(n->last_heartbeat_unix_ms));
    for (size_t k = 0; k < n->njob_ids; k++) json_array_append_new(ids, str(n->job_ids[k]));
    json_object_set_new(x, "job_ids", ids);
    json_object_set_new(x, "self", json_boolean(i == 0));
    json_array_append_new(nodes, x);
  }
  json_object_set_new(o, "nodes", nodes);
  json_t *jobs = megad_webjson_jobs(d->jobs, d->mirror);
  json_object_set(o, "jobs", json_object_get(jobs, "jobs"));
  json_decref(jobs);
  return o;
}

/* The job's schedule simulated with megactl plan's unit costs (T_f = T_b = 1,
 * T_w = 1 when the schedule has W actions, free P2P): core/sim's closed forms,
 * e.g. (P-1)/(M+P-1) for 1F1B, per pipeline stage. null when the job's
 * schedule is not known yet (no placement) or its flags do not parse. */
static json_t *closed_form(const mega_job *j) {
  if (!j->spec_ok || !j->world) return json_null();
  mega_sched_params p;
  mega_jobspec_sched_params(&j->spec, (int)j->world, &p);
  mega_err e = {0};
  mega_schedule s = {0};
  if (mega_sched_check_params(&p, &e) != MEGA_OK || mega_sched_generate(&p, &s, &e) != MEGA_OK)
    return json_null();
  bool has_w = false;
  for (int r = 0; r < s.pp && !has_w; r++)
    for (int i = 0; i < s.ranks[r].n && !has_w; i++) has_w = s.ranks[r].acts[i].kind == MEGA_ACT_W;
  mega_cost c = {.t_f = 1, .t_b = 1, .t_w = has_w ? 1 : 0};
  mega_sim sim = {0};
  json_t *o = json_null();
  if (mega_sim_run(&s, &c, &sim, &e) == MEGA_OK) {
    o = json_object();
    json_object_set_new(o, "schedule", json_string(mega_sched_kind_name(s.kind)));
    json_object_set_new(o, "pp", json_integer(s.pp));
    json_object_set_new(o, "vp", json_integer(s.vp));
    json_object_set_new(o, "microbatches", json_integer(s.microbatches));
    json_object_set_new(o, "t_forward", json_real(c.t_f));
    json_object_set_new(o, "t_backward", json_real(c.t_b));
    json_object_set_new(o, "t_weight", json_real(c.t_w));
    json_object_set_new(o, "bubble_fraction", num(sim.bubble_fraction));
    json_t *st = json_array();
    for (int r = 0; r < sim.pp; r++) json_array_append_new(st, num(sim.ranks[r].bubble_fraction));
    json_object_set_new(o, "stages", st);
    mega_sim_free(&sim);
  }
  mega_sched_free(&s);
  return o;
}

static json_t *rank_json(const Mega__V1__RankMetrics *m) {
  json_t *o = json_object();
  json_object_set_new(o, "rank", json_integer(m->rank));
  json_object_set_new(o, "pp_rank", json_integer(m->pp_rank));
  json_object_set_new(o, "dp_rank", json_integer(m->dp_rank));
  json_object_set_new(o, "tp_rank", json_integer(m->tp_rank));
  json_object_set_new(o, "step_time_s", num(m->step_time_s));
  json_object_set_new(o, "compute_s", num(m->compute_s));
  json_object_set_new(o, "bubble_s", num(m->bubble_s));
  json_object_set_new(o, "bubble_warmup_s", num(m->bubble_warmup_s));
  json_object_set_new(o, "bubble_steady_s", num(m->bubble_steady_s));
  json_object_set_new(o, "bubble_cooldown_s", num(m->bubble_cooldown_s));
  json_object_set_new(o, "p2p_wait_s", num(m->p2p_wait_s));
  json_object_set_new(o, "grad_sync_exposed_s", num(m->grad_sync_exposed_s));
  json_object_set_new(o, "tp_comm_s", num(m->tp_comm_s));
  json_object_set_new(o, "peak_inflight", json_integer(m->peak_inflight));
  return o;
}

static json_t *event_json(const Mega__V1__JobEvent *ev) {
  json_t *o = json_object();
  json_object_set_new(o, "time_ms", ms(ev->time_unix_ms));
  json_object_set_new(o, "kind", enum_name(&mega__v1__job_event_kind__descriptor, (int)ev->kind,
                                           "JOB_EVENT_KIND_"));
  json_object_set_new(o, "message", str(ev->message));
  json_object_set_new(o, "node", str(ev->node_id));
  json_object_set_new(o, "rank", ev->has_rank ? json_integer(ev->rank) : json_null());
  json_object_set_new(o, "attempt", json_integer(ev->attempt));
  json_object_set_new(o, "number", json_integer((json_int_t)ev->number));
  return o;
}

json_t *megad_webjson_job(const mega_job *j) {
  json_t *o = job_summary(j);
  json_t *args = json_array();
  for (size_t i = 0; i < j->nargs; i++) json_array_append_new(args, str(j->args[i]));
  json_object_set_new(o, "args", args);
  json_object_set_new(o, "trace_iteration",
                      json_integer(j->spec_ok ? j->spec.trace_iteration : 0));
  json_object_set_new(o, "closed_form", closed_form(j));
  const Mega__V1__StepMetrics *s = j->hist.last_step;
  if (s) {
    json_t *ls = json_object(), *ranks = json_array();
    json_object_set_new(ls, "iteration", json_integer((json_int_t)s->iteration));
    json_object_set_new(ls, "attempt", json_integer(s->attempt));
    json_object_set_new(ls, "step_time_s", num(s->step_time_s));
    for (size_t r = 0; r < s->n_ranks; r++) json_array_append_new(ranks, rank_json(s->ranks[r]));
    json_object_set_new(ls, "ranks", ranks);
    json_object_set_new(o, "last_step", ls);
  } else {
    json_object_set_new(o, "last_step", json_null());
  }
  json_t *evs = json_array();
  for (size_t i = 0; i < j->hist.nevents; i++)
    json_array_append_new(evs, event_json(j->hist.events[i]));
  json_object_set_new(o, "events", evs);
  json_object_set_new(o, "events_left_out",
                      json_integer((json_int_t)mega_job_hist_events_left_out(&j->hist)));
  return o;
}

uint64_t megad_webjson_job_version(const mega_job *j) {
  uint64_t v[] = {j->hist.curve.seq, j->hist.events_total, (uint64_t)j->state, j->attempt, j->restarts,
                  j->ckpt_iteration, j->last_iteration, j->world, (uint64_t)j->ended_ms,
                  j->train_iters};
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields */
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ v[i]) * 1099511628211ull;
  return h;
}

json_t *megad_webjson_steps(const mega_job *j, uint64_t since, size_t max) {
  const mega_stepring *r = &j->hist.curve;
  /* another curve's cursor (megad restarted, or the job's record was made
   * anew): this whole curve, which replaces the reader's */
  bool reset = !mega_stepring_knows(r, since);
  if (reset) since = 0;
  json_t *o = json_object(), *pts = json_array(), *marks = json_array();
  size_t from = mega_stepring_after(r, since), skipped = 0;
  if (r->n - from > max) {
    skipped = r->n - from - max;
    from = r->n - max;
  }
  for (size_t i = from; i < r->n; i++) {
    const mega_steppoint *p = &r->v[i];
    json_t *x = json_object();
    json_object_set_new(x, "seq", json_integer((json_int_t)p->seq));
    json_object_set_new(x, "it", json_integer((json_int_t)p->iteration));
    json_object_set_new(x, "t", ms(p->time_ms));
    json_object_set_new(x, "loss", num(p->loss));
    if (p->has_eval) json_object_set_new(x, "eval_loss", num(p->eval_loss));
    json_object_set_new(x, "grad_norm", num(p->grad_norm));
    json_object_set_new(x, "lr", num(p->lr));
    json_object_set_new(x, "tokens_per_s", num(p->tokens_per_s));
    json_object_set_new(x, "step_time_s", num(p->step_time_s));
    json_object_set_new(x, "bubble", num(p->bubble));
    json_object_set_new(x, "grad_sync_s", num(p->grad_sync_s));
    json_object_set_new(x, "attempt", json_integer(p->attempt));
    json_object_set_new(x, "world", json_integer(p->world));
    if (p->skipped) json_object_set_new(x, "skipped", json_true());
    json_array_append_new(pts, x);
  }
  for (size_t i = 0; i < r->nmarks; i++) {
    const mega_stepmark *m = &r->marks[i];
    if (m->seq <= since) continue;
    json_t *x = json_object();
    json_object_set_new(x, "seq", json_integer((json_int_t)m->seq));
    json_object_set_new(x, "it", json_integer((json_int_t)m->iteration));
    json_object_set_new(x, "attempt", json_integer(m->attempt));
    json_object_set_new(x, "kind", json_string(m->world != m->prev_world ? "rescale" : "restart"));
    json_object_set_new(x, "world", json_integer(m->world));
    json_object_set_new(x, "prev_world", json_integer(m->prev_world));
    json_array_append_new(marks, x);
  }
  json_object_set_new(o, "job", str(j->id));
  json_object_set_new(o, "state", json_string(mega_job_state_name(j->state)));
  json_object_set_new(o, "next", json_integer((json_int_t)r->seq));
  json_object_set_new(o, "thinned", json_integer((json_int_t)r->thinned));
  json_object_set_new(o, "skipped", json_integer((json_int_t)skipped));
  json_object_set_new(o, "points", pts);
  json_object_set_new(o, "marks", marks);
  if (reset) json_object_set_new(o, "reset", json_true());
  return o;
}
