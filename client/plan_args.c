/* megactl plan's command line: its own flags, a job's flags (as megactl
 * submit takes them), and what those give the plan. */
#include "client/plan_args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

void plan_usage(FILE *f) {
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

int plan_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(PLAN_PROG ": ", stderr);
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
  if (!*v || *end || errno || !isfinite(x) || x < 0 || x > PLAN_MAX_TIME) {
    mega_fail(err, MEGA_ERR_INVALID, "--%s: '%s' is not a time (a number from 0 to %g)", flag, v,
              PLAN_MAX_TIME);
    return false;
  }
  *out = x;
  return true;
}

/* A comma-separated list of numbers of min or more into out (at most
 * PLAN_MAX_LIST); what names them in errors. */
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
    if (*n == PLAN_MAX_LIST) {
      mega_fail(err, MEGA_ERR_INVALID, "--%s: more than %d %s", flag, PLAN_MAX_LIST, what);
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
bool plan_parse_args(int argc, char **argv, plan_opts *o, mega_err *err) {
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
int plan_apply_job(plan_opts *o) {
  const mega_jobspec *j = &o->job;
  if (o->vp < 0) o->vp = mega_jobspec_vp(j);
  o->overlap_grad = j->overlap_grad_reduce;
  o->align_grad = j->align_grad_reduce;
  /* --load is the checkpoint everywhere; a schedule comes with --schedule-file */
  struct stat st;
  if (j->load && stat(j->load, &st) == 0 && S_ISREG(st.st_mode))
    return plan_fail(PLAN_EXIT_USAGE, "--load %s is a file: --load names a checkpoint directory; give a "
                            "schedule's text form with --schedule-file FILE", j->load);
  if (!j->global_batch_size) return 0;
  if (!j->micro_batch_size)
    return plan_fail(PLAN_EXIT_USAGE, "--global-batch-size needs --micro-batch-size to give the "
                            "microbatches (or give --num-microbatches)");
  int tp = j->tensor_model_parallel_size, pp = j->pipeline_model_parallel_size, dp = 1;
  if ((o->nnodes > 0) != (o->nproc > 0))
    return plan_fail(PLAN_EXIT_USAGE, "--nnodes and --nproc-per-node go together (the world is their "
                            "product)");
  if (o->nnodes > 0) {
    long long world = (long long)o->nnodes * o->nproc;
    if (world % ((long long)tp * pp))
      return plan_fail(PLAN_EXIT_USAGE, "the world of %lld ranks (--nnodes %d x --nproc-per-node %d) is "
                              "not divisible by TP x PP = %d",
                  world, o->nnodes, o->nproc, tp * pp);
    dp = (int)(world / ((long long)tp * pp));
  }
  long long per = (long long)j->micro_batch_size * dp;
  if (j->global_batch_size % per)
    return plan_fail(PLAN_EXIT_USAGE, "--global-batch-size %d is not divisible by --micro-batch-size %d x "
                            "DP %d", j->global_batch_size, j->micro_batch_size, dp);
  int m = (int)(j->global_batch_size / per);
  if (o->mb && o->mb != m)
    return plan_fail(PLAN_EXIT_USAGE, "--num-microbatches %d disagrees with --global-batch-size %d / "
                            "(--micro-batch-size %d x DP %d) = %d; give one of them", o->mb,
                j->global_batch_size, j->micro_batch_size, dp, m);
  o->mb = m;
  return 0;
}
