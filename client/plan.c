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
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "client/commands.h"
#include "client/render.h"
#include "core/jobspec.h"
#include "core/sim.h"
#include "core/trace.h"

#define PROG "megactl plan"
#define EXIT_USAGE 2
#define EXIT_FAIL 1
#define TRACE_UNIT_US 1000.0 /* one cost-model time unit is drawn as 1 ms */
#define MAX_LIST 1024 /* --grad-bucket-sizes, --grad-sync-slowdown */
/* A time flag's ceiling: units are the user's, and a schedule of many
 * microbatches of such times still sums far inside a double */
#define MAX_TIME 1e12

typedef enum { FMT_TEXT, FMT_JSON, FMT_TRACE, FMT_SCHEDULE } out_format;

typedef struct plan_opts {
  int pp, vp, mb, group; /* 0: not given */
  const char *schedule;  /* NULL: not given */
  double t_f, t_b, t_w, latency, t_grad_sync;
  bool t_w_given, t_grad_sync_given, overlap_grad, align_grad;
  int grad_buckets;
  double bucket_sizes[MAX_LIST]; /* --grad-bucket-sizes */
  int nbucket_sizes;
  double slowdown[MAX_LIST]; /* --grad-sync-slowdown */
  int nslowdown;
  double lanes; /* --grad-sync-lanes; 0: not given */
  double gs_latency; /* --grad-sync-latency */
  out_format format;
  const char *load, *output; /* load: --schedule-file */
  bool help;
  int nnodes, nproc;         /* 0: not given */
  mega_jobspec job;          /* the job flags given */
} plan_opts;

enum { O_M, O_SCHED, O_TF, O_TB, O_TW, O_LAT, O_FORMAT, O_LOAD, O_OUT, O_HELP, O_TGS, O_BUCKETS,
       O_LANES, O_GSLAT, O_NNODES, O_NPROC, O_BSIZES, O_SLOW };

static const struct {
  const char *name;
  bool has_value;
} flags[] = {
    [O_M] = {"num-microbatches", true},
    [O_SCHED] = {"schedule", true},
    [O_TF] = {"t-forward", true},
    [O_TB] = {"t-backward", true},
    [O_TW] = {"t-weight", true},
    [O_LAT] = {"p2p-latency", true},
    [O_FORMAT] = {"format", true},
    [O_LOAD] = {"schedule-file", true},
    [O_OUT] = {"output", true},
    [O_HELP] = {"help", false},
    [O_TGS] = {"t-grad-sync", true},
    [O_BUCKETS] = {"grad-buckets", true},
    [O_LANES] = {"grad-sync-lanes", true},
    [O_GSLAT] = {"grad-sync-latency", true},
    [O_NNODES] = {"nnodes", true},
    [O_NPROC] = {"nproc-per-node", true},
    [O_BSIZES] = {"grad-bucket-sizes", true},
    [O_SLOW] = {"grad-sync-slowdown", true},
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

static void usage(FILE *f) {
  fputs(
      "usage: megactl plan --pipeline-model-parallel-size P --num-microbatches M\n"
      "                    [--virtual-pipeline-model-parallel-size V]\n"
      "                    [--microbatch-group-size-per-vp-stage N]\n"
      "                    [--schedule no-pipelining|gpipe|1f1b|interleaved|zb-h1]\n"
      "                    [--t-forward F] [--t-backward B] [--t-weight W]\n"
      "                    [--p2p-latency L] [--format text|json|trace|schedule]\n"
      "                    [--overlap-grad-reduce] [--align-grad-reduce]\n"
      "                    [--t-grad-sync G] [--grad-buckets N] [--grad-sync-lanes L]\n"
      "                    [--grad-sync-latency A] [--grad-bucket-sizes S,S,...]\n"
      "                    [--grad-sync-slowdown X,X,...]\n"
      "                    [--schedule-file FILE] [--output FILE]\n"
      "                    [--nnodes N --nproc-per-node K] [any job flags]\n"
      "\n"
      "Generates a pipeline schedule, validates it, simulates it under a cost model\n"
      "and shows the result. No cluster is needed.\n"
      "\n"
      "  --schedule       no-pipelining at P=1, interleaved when V>1, else 1f1b\n"
      "  --t-forward      time of one microbatch's forward through a rank's layers (1)\n"
      "  --t-backward     time of its backward, input gradient (1)\n"
      "  --t-weight       time of its weight gradient (0; 1 when the schedule has W\n"
      "                   actions, as zb-h1 has: the zero-bubble paper's F=B=W).\n"
      "                   Without W actions a backward costs T_b + T_w.\n"
      "  --p2p-latency    delay of each send (0)\n"
      "  --t-grad-sync    time of a rank's data-parallel gradient reduction, all its\n"
      "                   chunks (0); places each chunk's GS (launch) and GW (wait):\n"
      "                   after the schedule, or with --overlap-grad-reduce right\n"
      "                   after the chunk's last backward, or with --align-grad-reduce\n"
      "                   offset by pipeline rank (seed 003)\n"
      "  --grad-buckets   buckets per chunk (1): with overlap they launch through the\n"
      "                   chunk's last backward\n"
      "  --grad-bucket-sizes  their sizes in launch order, in any unit (the floats of\n"
      "                   the engine's buckets): each costs its share of the chunk's\n"
      "                   reduction and is ready as far through the backward as the\n"
      "                   buckets up to it are through the chunk (default: equal)\n"
      "  --grad-sync-lanes  the stages' reductions share their links: at most L (1 or\n"
      "                   more) run at full speed at once, k > L each at L/k (ranks on\n"
      "                   one machine: bench_comm lanes measures L); default: each\n"
      "                   stage's data-parallel group has links of its own\n"
      "  --grad-sync-slowdown  the same as measured: k reductions at once each run\n"
      "                   the k-th times slower than one alone (from the last on,\n"
      "                   their total speed stays; bench_comm lanes measures them)\n"
      "  --grad-sync-latency  a fixed time every collective costs on top of its bytes\n"
      "                   (0): each bucket\n"
      "  --format         text: a timeline and per-rank phases and bubbles (default)\n"
      "                   json: the same figures as one JSON object\n"
      "                   trace: a Chrome trace for Perfetto (one time unit = 1 ms)\n"
      "                   schedule: the schedule's text form, to edit and give back\n"
      "  --schedule-file FILE  read a schedule in text form; P, V and M come from it,\n"
      "                   and size flags, when given, must agree with it; so do its\n"
      "                   GS and GW: the gradient flags are refused without them\n"
      "  --output FILE    write there instead of stdout\n"
      "\n"
      "A job's flags, as megactl submit takes them, give the rest: P, V, the group\n"
      "size, --overlap-grad-reduce, --align-grad-reduce, and without\n"
      "--num-microbatches the microbatches, --global-batch-size / (--micro-batch-size\n"
      "x DP), DP = --nnodes x --nproc-per-node / (TP x PP), or 1 without them. Model,\n"
      "data and checkpoint flags are taken and ignored (--load is the checkpoint).\n"
      "\n"
      "Times are in any unit you like; busy and idle are reported in it.\n",
      f);
}

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(PROG ": ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return code;
}

static bool parse_int(const char *flag, const char *v, int *out, mega_err *err) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (!*v || *end || errno || x < 1 || x > 1000000000) {
    mega_fail(err, MEGA_ERR_INVALID, "--%s: '%s' is not a whole number from 1 up", flag, v);
    return false;
  }
  *out = (int)x;
  return true;
}

static bool parse_time(const char *flag, const char *v, double *out, mega_err *err) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (!*v || *end || errno || !isfinite(x) || x < 0 || x > MAX_TIME) {
    mega_fail(err, MEGA_ERR_INVALID, "--%s: '%s' is not a time (a number from 0 to %g)", flag, v,
              MAX_TIME);
    return false;
  }
  *out = x;
  return true;
}

/* A comma-separated list of numbers of min or more into out (at most
 * MAX_LIST); what names them in errors. */
static bool parse_list(const char *flag, const char *v, double min, const char *what,
                       double *out, int *n, mega_err *err) {
  *n = 0;
  for (const char *p = v;;) {
    char *end;
    errno = 0;
    double x = strtod(p, &end);
    if (end == p || (*end && *end != ',') || errno || !isfinite(x) || x < min) {
      mega_fail(err, MEGA_ERR_INVALID,
                "--%s: '%s' is not a list of %s (numbers, %g or more, comma-separated)", flag, v,
                what, min);
      return false;
    }
    if (*n == MAX_LIST) {
      mega_fail(err, MEGA_ERR_INVALID, "--%s: more than %d %s", flag, MAX_LIST, what);
      return false;
    }
    out[(*n)++] = x;
    if (!*end) return true;
    p = end + 1;
  }
}

/* --grad-bucket-sizes: not all 0. */
static bool parse_sizes(const char *flag, const char *v, plan_opts *o, mega_err *err) {
  if (!parse_list(flag, v, 0, "sizes", o->bucket_sizes, &o->nbucket_sizes, err)) return false;
  double total = 0;
  for (int j = 0; j < o->nbucket_sizes; j++) total += o->bucket_sizes[j];
  if (total > 0) return true;
  mega_fail(err, MEGA_ERR_INVALID, "--%s: '%s' adds up to nothing", flag, v);
  return false;
}

static bool set_flag(plan_opts *o, int id, const char *v, mega_err *err) {
  const char *name = flags[id].name;
  switch (id) {
  case O_M: return parse_int(name, v, &o->mb, err);
  case O_NNODES: return parse_int(name, v, &o->nnodes, err);
  case O_NPROC: return parse_int(name, v, &o->nproc, err);
  case O_SCHED: o->schedule = v; return true;
  case O_TF: return parse_time(name, v, &o->t_f, err);
  case O_TB: return parse_time(name, v, &o->t_b, err);
  case O_TW: o->t_w_given = true; return parse_time(name, v, &o->t_w, err);
  case O_LAT: return parse_time(name, v, &o->latency, err);
  case O_LOAD: o->load = v; return true;
  case O_OUT: o->output = v; return true;
  case O_HELP: o->help = true; return true;
  case O_TGS: o->t_grad_sync_given = true; return parse_time(name, v, &o->t_grad_sync, err);
  case O_BUCKETS: return parse_int(name, v, &o->grad_buckets, err);
  case O_BSIZES: return parse_sizes(name, v, o, err);
  case O_SLOW: return parse_list(name, v, 1, "slowdowns", o->slowdown, &o->nslowdown, err);
  case O_GSLAT: return parse_time(name, v, &o->gs_latency, err);
  case O_LANES:
    if (!parse_time(name, v, &o->lanes, err)) return false;
    if (o->lanes < 1) {
      mega_fail(err, MEGA_ERR_INVALID,
                "--%s: '%s' is under 1; a reduction alone runs at full speed", name, v);
      return false;
    }
    return true;
  case O_FORMAT:
    if (!strcmp(v, "text")) o->format = FMT_TEXT;
    else if (!strcmp(v, "json")) o->format = FMT_JSON;
    else if (!strcmp(v, "trace")) o->format = FMT_TRACE;
    else if (!strcmp(v, "schedule")) o->format = FMT_SCHEDULE;
    else {
      mega_fail(err, MEGA_ERR_INVALID, "--format: '%s' is not one of text, json, trace, schedule",
                v);
      return false;
    }
    return true;
  }
  return false;
}

/* The job flag at argv[*i] (a flag mega_jobspec knows): the ones plan uses
 * are noted as given. */
static bool job_flag(plan_opts *o, int argc, char **argv, int *i, mega_err *err) {
  const char *arg = argv[*i];
  size_t len = strcspn(arg, "=");
  mega_status st = mega_jobspec_parse_flag(&o->job, argc, argv, i, err);
  if (st != MEGA_OK) {
    if (st == MEGA_ERR_NOT_FOUND) {
      size_t n = strlen(err->msg);
      snprintf(err->msg + n, sizeof err->msg - n, " (see megactl plan --help)");
    }
    return false;
  }
#define IS(name) (len == strlen(name) && !strncmp(arg, name, len))
  if (IS("--pipeline-model-parallel-size")) o->pp = o->job.pipeline_model_parallel_size;
  if (IS("--virtual-pipeline-model-parallel-size") ||
      IS("--num-layers-per-virtual-pipeline-stage") || IS("--pipeline-model-parallel-layout"))
    o->vp = -1; /* resolved from the job once every flag is in */
  if (IS("--microbatch-group-size-per-vp-stage"))
    o->group = o->job.microbatch_group_size_per_vp_stage;
#undef IS
  return true;
}

/* "--name value" or "--name=value", names matched exactly: plan's own
 * flags, then the job's. */
static bool parse_args(int argc, char **argv, plan_opts *o, mega_err *err) {
  for (int i = 1; i < argc;) {
    const char *arg = argv[i];
    if (!strcmp(arg, "-h")) arg = "--help";
    if (strncmp(arg, "--", 2) || !arg[2]) {
      mega_fail(err, MEGA_ERR_INVALID, "unexpected argument '%s' (see megactl plan --help)", arg);
      return false;
    }
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int id = -1;
    for (int k = 0; k < NFLAGS; k++)
      if (strlen(flags[k].name) == len && !strncmp(flags[k].name, name, len)) id = k;
    if (id < 0) {
      if (!job_flag(o, argc, argv, &i, err)) return false;
      continue;
    }
    const char *value = NULL;
    if (flags[id].has_value) {
      if (eq) value = eq + 1;
      else if (i + 1 < argc) value = argv[++i];
      else {
        mega_fail(err, MEGA_ERR_INVALID, "--%s needs a value", flags[id].name);
        return false;
      }
    } else if (eq) {
      mega_fail(err, MEGA_ERR_INVALID, "--%s takes no value", flags[id].name);
      return false;
    }
    if (!set_flag(o, id, value, err)) return false;
    i++;
  }
  return true;
}

/* What the job flags give the plan: VP, the gradient flags, and the
 * microbatches from the batch sizes; 0 or an exit status. */
static int apply_job(plan_opts *o) {
  const mega_jobspec *j = &o->job;
  if (o->vp < 0) o->vp = mega_jobspec_vp(j);
  o->overlap_grad = j->overlap_grad_reduce;
  o->align_grad = j->align_grad_reduce;
  /* --load is the checkpoint everywhere; a schedule comes with --schedule-file */
  struct stat st;
  if (j->load && stat(j->load, &st) == 0 && S_ISREG(st.st_mode))
    return fail(EXIT_USAGE, "--load %s is a file: --load names a checkpoint directory; give a "
                            "schedule's text form with --schedule-file FILE", j->load);
  if (!j->global_batch_size) return 0;
  if (!j->micro_batch_size)
    return fail(EXIT_USAGE, "--global-batch-size needs --micro-batch-size to give the "
                            "microbatches (or give --num-microbatches)");
  int tp = j->tensor_model_parallel_size, pp = j->pipeline_model_parallel_size, dp = 1;
  if ((o->nnodes > 0) != (o->nproc > 0))
    return fail(EXIT_USAGE, "--nnodes and --nproc-per-node go together (the world is their "
                            "product)");
  if (o->nnodes > 0) {
    long long world = (long long)o->nnodes * o->nproc;
    if (world % ((long long)tp * pp))
      return fail(EXIT_USAGE, "the world of %lld ranks (--nnodes %d x --nproc-per-node %d) is "
                              "not divisible by TP x PP = %d",
                  world, o->nnodes, o->nproc, tp * pp);
    dp = (int)(world / ((long long)tp * pp));
  }
  long long per = (long long)j->micro_batch_size * dp;
  if (j->global_batch_size % per)
    return fail(EXIT_USAGE, "--global-batch-size %d is not divisible by --micro-batch-size %d x "
                            "DP %d", j->global_batch_size, j->micro_batch_size, dp);
  int m = (int)(j->global_batch_size / per);
  if (o->mb && o->mb != m)
    return fail(EXIT_USAGE, "--num-microbatches %d disagrees with --global-batch-size %d / "
                            "(--micro-batch-size %d x DP %d) = %d; give one of them", o->mb,
                j->global_batch_size, j->micro_batch_size, dp, m);
  o->mb = m;
  return 0;
}

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
      return fail(EXIT_USAGE, "--%s %d disagrees with %s, which has %s=%d; drop the flag or "
                              "make it match", sizes[k].flag, sizes[k].given, o->load,
                  sizes[k].key, sizes[k].have);
  if (o->schedule) {
    mega_sched_kind k;
    mega_err err = {0};
    if (mega_sched_kind_parse(o->schedule, &k, &err) != MEGA_OK)
      return fail(EXIT_USAGE, "%s", err.msg);
    if (k != s->kind)
      return fail(EXIT_USAGE, "--schedule %s disagrees with %s, which has kind=%s; drop the flag "
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
    if (!text) return fail(EXIT_FAIL, "cannot read %s: %s", o->load, strerror(errno));
    mega_status st = mega_sched_parse(text, s, &err);
    free(text);
    if (st != MEGA_OK) return fail(EXIT_FAIL, "%s: %s", o->load, err.msg);
    int rc = check_agrees(o, s);
    if (rc) return rc;
    if (mega_sched_validate(s, &err) != MEGA_OK)
      return fail(EXIT_FAIL, "%s is not a valid schedule: %s", o->load, err.msg);
    return 0;
  }
  if (!o->pp)
    return fail(EXIT_USAGE,
                "--pipeline-model-parallel-size is required (or --schedule-file FILE)");
  if (!o->mb)
    return fail(EXIT_USAGE, "--num-microbatches is required (or --global-batch-size and "
                            "--micro-batch-size, or --schedule-file FILE)");
  if (o->align_grad && !o->overlap_grad)
    return fail(EXIT_USAGE, "--align-grad-reduce needs --overlap-grad-reduce");
  mega_sched_params p = {.pp = o->pp, .vp = o->vp ? o->vp : 1, .microbatches = o->mb,
                         .group_size = o->group};
  if (o->overlap_grad)
    p.grad_sync = o->align_grad ? MEGA_GRAD_SYNC_ALIGNED : MEGA_GRAD_SYNC_LAST_BACKWARD;
  else if (o->t_grad_sync_given)
    p.grad_sync = MEGA_GRAD_SYNC_END;
  if (o->schedule) {
    if (mega_sched_kind_parse(o->schedule, &p.kind, &err) != MEGA_OK)
      return fail(EXIT_USAGE, "%s", err.msg);
    if (p.kind == MEGA_SCHED_CUSTOM)
      return fail(EXIT_USAGE, "--schedule custom is a schedule you write: give it with "
                              "--schedule-file FILE "
                              "(start from another kind's --format schedule)");
  } else {
    p.kind = mega_sched_default_kind(p.pp, p.vp);
  }
  if (mega_sched_check_params(&p, &err) != MEGA_OK) return fail(EXIT_USAGE, "%s", err.msg);
  if (mega_sched_generate(&p, s, &err) != MEGA_OK) return fail(EXIT_FAIL, "%s", err.msg);
  if (mega_sched_validate(s, &err) != MEGA_OK)
    return fail(EXIT_FAIL, "the generated %s schedule is not valid (a bug in mega): %s",
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
      return fail(EXIT_USAGE, "%s %s the gradient reductions, and this schedule has none: %s",
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
    if (!text) return fail(EXIT_FAIL, "out of memory");
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
      return fail(EXIT_USAGE, "--grad-buckets %d and the %d --grad-bucket-sizes disagree: "
                              "give one of them", o->grad_buckets, o->nbucket_sizes);
    cost.grad_buckets = o->nbucket_sizes;
    cost.grad_bucket_sizes = o->bucket_sizes;
  }
  if (o->nslowdown) {
    if (o->lanes > 0)
      return fail(EXIT_USAGE, "--grad-sync-lanes and --grad-sync-slowdown say the same thing: "
                              "give one of them");
    cost.grad_sync_slowdown = o->slowdown;
    cost.grad_sync_slowdown_n = o->nslowdown;
  }
  long long reductions = (long long)s->pp * s->vp * cost.grad_buckets;
  if (reductions > MEGA_SIM_MAX_REDUCTIONS)
    return fail(EXIT_USAGE, "--grad-buckets %d: pp %d x vp %d x %d buckets is %lld reductions, "
                            "more than this planner handles (%d); give fewer buckets",
                cost.grad_buckets, s->pp, s->vp, cost.grad_buckets, reductions,
                MEGA_SIM_MAX_REDUCTIONS);
  mega_sim sim = {0};
  mega_err err = {0};
  if (mega_sim_run(s, &cost, &sim, &err) != MEGA_OK)
    return fail(EXIT_FAIL, "simulation failed: %s", err.msg);
  if (!isfinite(sim.makespan)) { /* a slowdown or a size list can still overflow */
    double m = sim.makespan;
    mega_sim_free(&sim);
    return fail(EXIT_USAGE, "the times given add up past any number (the makespan is %g): give "
                            "smaller times, sizes or slowdowns", m);
  }
  rc = 0;
  if (o->format == FMT_TEXT) {
    if (plan_render_text(out, s, &sim, &cost, terminal_width(tty), want_color(tty)))
      rc = fail(EXIT_FAIL, "out of memory");
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
      rc = fail(EXIT_FAIL, "out of memory");
    }
  }
  mega_sim_free(&sim);
  return rc;
}

/* The document to path, or to stdout when NULL; 0 or an exit status. */
static int write_doc(const char *path, const char *doc, size_t len) {
  FILE *out = path ? fopen(path, "w") : stdout;
  if (!out) return fail(EXIT_FAIL, "cannot write %s: %s", path, strerror(errno));
  bool ok = fwrite(doc, 1, len, out) == len;
  ok = (path ? fclose(out) : fflush(out)) == 0 && ok;
  if (!ok) return fail(EXIT_FAIL, "cannot write %s: %s", path ? path : "to stdout", strerror(errno));
  return 0;
}

int megactl_plan(int argc, char **argv) {
  plan_opts o = {.t_f = 1, .t_b = 1, .t_w = 0, .latency = 0, .format = FMT_TEXT};
  mega_jobspec_defaults(&o.job);
  mega_err err = {0};
  if (!parse_args(argc, argv, &o, &err)) {
    mega_jobspec_free(&o.job);
    return fail(EXIT_USAGE, "%s", err.msg);
  }
  if (o.help) {
    usage(stdout);
    mega_jobspec_free(&o.job);
    return 0;
  }
  mega_schedule s = {0};
  int rc = apply_job(&o);
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
  if (!mem) rc = fail(EXIT_FAIL, "out of memory");
  if (!rc) rc = emit(&o, mem, &s, o.output ? NULL : stdout);
  if (mem && fclose(mem) && !rc) rc = fail(EXIT_FAIL, "out of memory");
  if (!rc) rc = write_doc(o.output, doc, len);
  free(doc);
  mega_sched_free(&s);
  return rc;
}
