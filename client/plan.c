/* megactl plan: print, simulate and draw a pipeline schedule, no cluster
 * needed. Generates the schedule from Megatron's flags (or reads its text
 * form), validates it, runs the simulator, and writes a terminal drawing,
 * JSON, a Chrome trace, or the text form itself.
 *
 * It takes a job's whole flag set, as megactl submit does: from the job
 * flags it uses PP, VP, the microbatch group, the schedule, the gradient
 * flags and the microbatches (global batch / (micro batch x DP), DP from
 * --nnodes x --nproc-per-node / (TP x PP), 1 without them), and it ignores
 * the rest (model, data, checkpoints).
 *
 * Exit status: 0 on success, 2 for a bad command line (unknown flag,
 * missing or malformed value, a combination Megatron refuses, flags that
 * disagree with a loaded file), 1 for anything else (an unreadable,
 * unparsable or invalid schedule file, a failed write). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <jansson.h>

#include "client/commands.h"
#include "client/plan_args.h"
#include "client/render.h"
#include "core/sim.h"
#include "core/trace.h"

#define TRACE_UNIT_US 1000.0 /* one cost-model time unit is drawn as 1 ms */

/* Reads a whole file; NULL with errno set on failure. */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - 1 - n, f);
    if (ferror(f)) {
      int e = errno;
      free(buf);
      fclose(f);
      errno = e ? e : EIO;
      return NULL;
    }
    if (feof(f)) break;
    char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
    if (!bigger) {
      free(buf);
      buf = NULL;
      errno = ENOMEM;
      break;
    }
    buf = bigger;
    cap *= 2;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  return buf;
}

/* The loaded schedule's shape against the flags the user also gave. */
static int check_agrees(const plan_opts *o, const mega_schedule *s) {
  struct {
    int given, have;
    const char *flag, *key;
  } sizes[] = {
      {o->pp, s->pp, "pipeline-model-parallel-size", "pp"},
      {o->vp, s->vp, "virtual-pipeline-model-parallel-size", "vp"},
      {o->mb, s->microbatches, "num-microbatches", "microbatches"},
      {o->group, s->group_size, "microbatch-group-size-per-vp-stage", "group"},
  };
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    if (sizes[k].given && sizes[k].given != sizes[k].have)
      return plan_fail(PLAN_EXIT_USAGE, "--%s %d disagrees with %s, which has %s=%d; drop the flag or "
                              "make it match", sizes[k].flag, sizes[k].given, o->load,
                  sizes[k].key, sizes[k].have);
  if (o->schedule) {
    mega_sched_kind k;
    mega_err err = {0};
    if (mega_sched_kind_parse(o->schedule, &k, &err) != MEGA_OK)
      return plan_fail(PLAN_EXIT_USAGE, "%s", err.msg);
    if (k != s->kind)
      return plan_fail(PLAN_EXIT_USAGE, "--schedule %s disagrees with %s, which has kind=%s; drop the flag "
                              "or make it match", o->schedule, o->load,
                  mega_sched_kind_name(s->kind));
  }
  return 0;
}

/* Fills s from --load or from the flags; returns 0 or an exit status. */
static int build_schedule(const plan_opts *o, mega_schedule *s) {
  mega_err err = {0};
  if (o->load) {
    char *text = read_file(o->load);
    if (!text) return plan_fail(PLAN_EXIT_FAIL, "cannot read %s: %s", o->load, strerror(errno));
    mega_status st = mega_sched_parse(text, s, &err);
    free(text);
    if (st != MEGA_OK) return plan_fail(PLAN_EXIT_FAIL, "%s: %s", o->load, err.msg);
    int rc = check_agrees(o, s);
    if (rc) return rc;
    if (mega_sched_validate(s, &err) != MEGA_OK)
      return plan_fail(PLAN_EXIT_FAIL, "%s is not a valid schedule: %s", o->load, err.msg);
    return 0;
  }
  if (!o->pp)
    return plan_fail(PLAN_EXIT_USAGE,
                "--pipeline-model-parallel-size is required (or --schedule-file FILE)");
  if (!o->mb)
    return plan_fail(PLAN_EXIT_USAGE, "--num-microbatches is required (or --global-batch-size and "
                            "--micro-batch-size, or --schedule-file FILE)");
  if (o->align_grad && !o->overlap_grad)
    return plan_fail(PLAN_EXIT_USAGE, "--align-grad-reduce needs --overlap-grad-reduce");
  mega_sched_params p = {.pp = o->pp, .vp = o->vp ? o->vp : 1, .microbatches = o->mb,
                         .group_size = o->group};
  if (o->overlap_grad)
    p.grad_sync = o->align_grad ? MEGA_GRAD_SYNC_ALIGNED : MEGA_GRAD_SYNC_LAST_BACKWARD;
  else if (o->t_grad_sync_given)
    p.grad_sync = MEGA_GRAD_SYNC_END;
  if (o->schedule) {
    if (mega_sched_kind_parse(o->schedule, &p.kind, &err) != MEGA_OK)
      return plan_fail(PLAN_EXIT_USAGE, "%s", err.msg);
    if (p.kind == MEGA_SCHED_CUSTOM)
      return plan_fail(PLAN_EXIT_USAGE, "--schedule custom is a schedule you write: give it with "
                              "--schedule-file FILE "
                              "(start from another kind's --format schedule)");
  } else {
    p.kind = mega_sched_default_kind(p.pp, p.vp);
  }
  if (mega_sched_check_params(&p, &err) != MEGA_OK) return plan_fail(PLAN_EXIT_USAGE, "%s", err.msg);
  if (mega_sched_generate(&p, s, &err) != MEGA_OK) return plan_fail(PLAN_EXIT_FAIL, "%s", err.msg);
  if (mega_sched_validate(s, &err) != MEGA_OK)
    return plan_fail(PLAN_EXIT_FAIL, "the generated %s schedule is not valid (a bug in mega): %s",
                mega_sched_kind_name(p.kind), err.msg);
  return 0;
}

static bool has_actions(const mega_schedule *s, mega_act_kind kind) {
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].acts[i].kind == kind) return true;
  return false;
}

static json_t *json_numbers(const double *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

static json_t *plan_json(const mega_schedule *s, const mega_sim *sim, const mega_cost *c) {
  json_t *root = json_object();
  json_object_set_new(root, "schedule", json_string(mega_sched_kind_name(s->kind)));
  json_object_set_new(root, "pp", json_integer(s->pp));
  json_object_set_new(root, "vp", json_integer(s->vp));
  json_object_set_new(root, "microbatches", json_integer(s->microbatches));
  json_object_set_new(root, "group_size", json_integer(s->group_size));
  json_object_set_new(root, "makespan", json_real(sim->makespan));
  json_object_set_new(root, "bubble_fraction", json_real(sim->bubble_fraction));
  json_object_set_new(root, "grad_sync_exposed", json_real(sim->grad_sync_exposed));
  json_t *cost = json_object();
  json_object_set_new(cost, "t_forward", json_real(c->t_f));
  json_object_set_new(cost, "t_backward", json_real(c->t_b));
  json_object_set_new(cost, "t_weight", json_real(c->t_w));
  json_object_set_new(cost, "p2p_latency", json_real(c->p2p_latency));
  json_object_set_new(cost, "grad_sync", json_real(c->grad_sync));
  json_object_set_new(cost, "grad_buckets", json_integer(c->grad_buckets));
  if (c->grad_bucket_sizes)
    json_object_set_new(cost, "grad_bucket_sizes",
                        json_numbers(c->grad_bucket_sizes, c->grad_buckets));
  json_object_set_new(cost, "grad_sync_lanes", json_real(c->grad_sync_lanes));
  if (c->grad_sync_slowdown)
    json_object_set_new(cost, "grad_sync_slowdown",
                        json_numbers(c->grad_sync_slowdown, c->grad_sync_slowdown_n));
  json_object_set_new(cost, "grad_sync_latency", json_real(c->grad_sync_latency));
  json_object_set_new(root, "cost", cost);
  /* Megatron's table exists for the interleaved schedule only: [] otherwise. */
  json_t *table = json_array();
  if (s->kind == MEGA_SCHED_INTERLEAVED) {
    size_t n = (size_t)s->microbatches * (size_t)s->vp;
    int(*t)[2] = malloc(sizeof *t * n);
    if (!t) {
      json_decref(table);
      json_decref(root);
      return NULL;
    }
    mega_sched_table(s->microbatches, s->vp, s->group_size, t);
    for (size_t k = 0; k < n; k++)
      json_array_append_new(table, json_pack("[ii]", t[k][0], t[k][1]));
    free(t);
  }
  json_object_set_new(root, "schedule_table", table);
  json_t *ranks = json_array();
  for (int r = 0; r < s->pp; r++) {
    mega_phases ph = mega_sched_phases(s, r);
    const mega_sim_rank *mr = &sim->ranks[r];
    char *acts = mega_sched_format_rank(s, r);
    json_t *o = json_object();
    json_object_set_new(o, "rank", json_integer(r));
    json_object_set_new(o, "warmup", json_integer(ph.warmup));
    json_object_set_new(o, "steady", json_integer(ph.steady));
    json_object_set_new(o, "cooldown", json_integer(ph.cooldown));
    json_object_set_new(o, "peak_inflight", json_integer(mr->peak_inflight));
    json_object_set_new(o, "busy", json_real(mr->busy));
    json_object_set_new(o, "idle", json_real(mr->idle));
    json_object_set_new(o, "bubble_fraction", json_real(mr->bubble_fraction));
    json_object_set_new(o, "grad_sync_exposed", json_real(mr->grad_sync_exposed));
    json_object_set_new(o, "work_end", json_real(mr->work_end));
    json_t *red = json_array(); /* [start, end] of each bucket's reduction, in launch order */
    for (int j = 0; j < mr->nreduce; j++)
      json_array_append_new(red, json_pack("[f, f]", mr->reduce[j].start, mr->reduce[j].end));
    json_object_set_new(o, "reductions", red);
    json_object_set_new(o, "actions", acts ? json_string(acts) : json_null());
    free(acts);
    json_array_append_new(ranks, o);
  }
  json_object_set_new(root, "ranks", ranks);
  return root;
}

/* tty: the terminal the document goes to, or NULL (a file). */
static int terminal_width(FILE *tty) {
  const char *cols = getenv("COLUMNS");
  if (cols && atoi(cols) > 0) return atoi(cols);
  struct winsize ws;
  if (tty && isatty(fileno(tty)) && ioctl(fileno(tty), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 80;
}

static bool want_color(FILE *tty) {
  const char *term = getenv("TERM");
  return tty && isatty(fileno(tty)) && !getenv("NO_COLOR") && term && strcmp(term, "dumb");
}

/* The gradient flags act on the schedule's reductions (GS, GW): one with
 * none would change nothing, so it is refused; 0 or an exit status. */
static int refuse_idle_sync_flags(const plan_opts *o, const mega_schedule *s) {
  if (has_actions(s, MEGA_ACT_GRAD_SYNC)) return 0;
  const struct {
    bool given;
    const char *flag, *does;
  } sync_flags[] = {
      {o->t_grad_sync_given, "--t-grad-sync", "costs"},
      {o->overlap_grad, "--overlap-grad-reduce", "places"},
      {o->gs_latency > 0, "--grad-sync-latency", "costs"},
      {o->nbucket_sizes > 0, "--grad-bucket-sizes", "divides"},
      {o->grad_buckets > 0, "--grad-buckets", "divides"},
      {o->lanes > 0, "--grad-sync-lanes", "shares the links of"},
      {o->nslowdown > 0, "--grad-sync-slowdown", "slows"},
  };
  for (size_t k = 0; k < sizeof sync_flags / sizeof sync_flags[0]; k++)
    if (sync_flags[k].given)
      return plan_fail(PLAN_EXIT_USAGE, "%s %s the gradient reductions, and this schedule has none: %s",
                  sync_flags[k].flag, sync_flags[k].does,
                  o->load ? "add GS and GW actions to the --schedule-file (--format schedule "
                            "with --overlap-grad-reduce shows where), or drop the flag"
                          : "give --t-grad-sync or --overlap-grad-reduce");
  return 0;
}

/* Writes one formatted document to out, drawn for the terminal tty (or
 * NULL); returns 0 or an exit status. */
static int emit(const plan_opts *o, FILE *out, const mega_schedule *s, FILE *tty) {
  if (o->format == FMT_SCHEDULE) {
    char *text = mega_sched_format(s);
    if (!text) return plan_fail(PLAN_EXIT_FAIL, "out of memory");
    fputs(text, out);
    free(text);
    return 0;
  }
  mega_cost cost = {.t_f = o->t_f, .t_b = o->t_b, .t_w = o->t_w, .p2p_latency = o->latency,
                    .grad_sync = o->t_grad_sync, .grad_buckets = o->grad_buckets ? o->grad_buckets : 1,
                    .grad_sync_lanes = o->lanes, .grad_sync_latency = o->gs_latency};
  if (!o->t_w_given && has_actions(s, MEGA_ACT_W)) cost.t_w = 1;
  int rc = refuse_idle_sync_flags(o, s);
  if (rc) return rc;
  if (o->nbucket_sizes) {
    if (o->grad_buckets && o->grad_buckets != o->nbucket_sizes)
      return plan_fail(PLAN_EXIT_USAGE, "--grad-buckets %d and the %d --grad-bucket-sizes disagree: "
                              "give one of them", o->grad_buckets, o->nbucket_sizes);
    cost.grad_buckets = o->nbucket_sizes;
    cost.grad_bucket_sizes = o->bucket_sizes;
  }
  if (o->nslowdown) {
    if (o->lanes > 0)
      return plan_fail(PLAN_EXIT_USAGE, "--grad-sync-lanes and --grad-sync-slowdown say the same thing: "
                              "give one of them");
    cost.grad_sync_slowdown = o->slowdown;
    cost.grad_sync_slowdown_n = o->nslowdown;
  }
  long long reductions = (long long)s->pp * s->vp * cost.grad_buckets;
  if (reductions > MEGA_SIM_MAX_REDUCTIONS)
    return plan_fail(PLAN_EXIT_USAGE, "--grad-buckets %d: pp %d x vp %d x %d buckets is %lld reductions, "
                            "more than this planner handles (%d); give fewer buckets",
                cost.grad_buckets, s->pp, s->vp, cost.grad_buckets, reductions,
                MEGA_SIM_MAX_REDUCTIONS);
  mega_sim sim = {0};
  mega_err err = {0};
  if (mega_sim_run(s, &cost, &sim, &err) != MEGA_OK)
    return plan_fail(PLAN_EXIT_FAIL, "simulation failed: %s", err.msg);
  if (!isfinite(sim.makespan)) { /* a slowdown or a size list can still overflow */
    double m = sim.makespan;
    mega_sim_free(&sim);
    return plan_fail(PLAN_EXIT_USAGE, "the times given add up past any number (the makespan is %g): give "
                            "smaller times, sizes or slowdowns", m);
  }
  rc = 0;
  if (o->format == FMT_TEXT) {
    if (plan_render_text(out, s, &sim, &cost, terminal_width(tty), want_color(tty)))
      rc = plan_fail(PLAN_EXIT_FAIL, "out of memory");
  } else {
    char *doc = NULL;
    if (o->format == FMT_JSON) {
      json_t *j = plan_json(s, &sim, &cost);
      doc = j ? json_dumps(j, JSON_INDENT(2)) : NULL; /* full precision: exact closed forms */
      json_decref(j);
    } else {
      char name[128];
      snprintf(name, sizeof name, "megactl plan: %s pp=%d vp=%d microbatches=%d",
               mega_sched_kind_name(s->kind), s->pp, s->vp, s->microbatches);
      mega_trace *t = mega_trace_new(name);
      if (t) {
        mega_trace_add_sim(t, s, &sim, TRACE_UNIT_US);
        doc = mega_trace_dump(t);
      }
      mega_trace_free(t);
    }
    if (doc) {
      fputs(doc, out);
      fputc('\n', out);
      free(doc);
    } else {
      rc = plan_fail(PLAN_EXIT_FAIL, "out of memory");
    }
  }
  mega_sim_free(&sim);
  return rc;
}

/* The document to path, or to stdout when NULL; 0 or an exit status. */
static int write_doc(const char *path, const char *doc, size_t len) {
  FILE *out = path ? fopen(path, "w") : stdout;
  if (!out) return plan_fail(PLAN_EXIT_FAIL, "cannot write %s: %s", path, strerror(errno));
  bool ok = fwrite(doc, 1, len, out) == len;
  ok = (path ? fclose(out) : fflush(out)) == 0 && ok;
  if (!ok) return plan_fail(PLAN_EXIT_FAIL, "cannot write %s: %s", path ? path : "to stdout", strerror(errno));
  return 0;
}

int megactl_plan(int argc, char **argv) {
  plan_opts o = {.t_f = 1, .t_b = 1, .t_w = 0, .latency = 0, .format = FMT_TEXT};
  mega_jobspec_defaults(&o.job);
  mega_err err = {0};
  if (!plan_parse_args(argc, argv, &o, &err)) {
    mega_jobspec_free(&o.job);
    return plan_fail(PLAN_EXIT_USAGE, "%s", err.msg);
  }
  if (o.help) {
    plan_usage(stdout);
    mega_jobspec_free(&o.job);
    return 0;
  }
  mega_schedule s = {0};
  int rc = plan_apply_job(&o);
  if (!rc) rc = build_schedule(&o, &s);
  mega_jobspec_free(&o.job);
  if (rc) {
    mega_sched_free(&s);
    return rc;
  }
  /* the whole document first: a plan refused half way (a flag checked
   * against the schedule, the simulation) leaves --output as it was */
  char *doc = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&doc, &len);
  if (!mem) rc = plan_fail(PLAN_EXIT_FAIL, "out of memory");
  if (!rc) rc = emit(&o, mem, &s, o.output ? NULL : stdout);
  if (mem && fclose(mem) && !rc) rc = plan_fail(PLAN_EXIT_FAIL, "out of memory");
  if (!rc) rc = write_doc(o.output, doc, len);
  free(doc);
  mega_sched_free(&s);
  return rc;
}
