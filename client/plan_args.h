/* megactl plan's command line (plan_args.c): the options, their parse, and
 * what a job's flags give the plan. Private to client/plan*.c. */
#ifndef MEGA_CLIENT_PLAN_ARGS_H
#define MEGA_CLIENT_PLAN_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "core/jobspec.h"
#include "core/status.h"

#define PLAN_PROG "megactl plan"
#define PLAN_EXIT_USAGE 2
#define PLAN_EXIT_FAIL 1
#define PLAN_MAX_LIST 1024 /* --grad-bucket-sizes, --grad-sync-slowdown */
/* A time flag's ceiling: units are the user's, and a schedule of many
 * microbatches of such times still sums far inside a double */
#define PLAN_MAX_TIME 1e12

typedef enum { FMT_TEXT, FMT_JSON, FMT_TRACE, FMT_SCHEDULE } out_format;

typedef struct plan_opts {
  int pp, vp, mb, group; /* 0: not given */
  const char *schedule;  /* NULL: not given */
  double t_f, t_b, t_w, latency, t_grad_sync;
  bool t_w_given, t_grad_sync_given, overlap_grad, align_grad;
  int grad_buckets;
  double bucket_sizes[PLAN_MAX_LIST]; /* --grad-bucket-sizes */
  int nbucket_sizes;
  double slowdown[PLAN_MAX_LIST]; /* --grad-sync-slowdown */
  int nslowdown;
  double lanes; /* --grad-sync-lanes; 0: not given */
  double gs_latency; /* --grad-sync-latency */
  out_format format;
  const char *load, *output; /* load: --schedule-file */
  bool help;
  int nnodes, nproc;         /* 0: not given */
  mega_jobspec job;          /* the job flags given */
} plan_opts;

void plan_usage(FILE *f);
/* "megactl plan: MESSAGE" on stderr; returns code. */
int plan_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool plan_parse_args(int argc, char **argv, plan_opts *o, mega_err *err);
/* What the job flags give the plan: VP, the gradient flags, and the
 * microbatches from the batch sizes; 0 or an exit status. */
int plan_apply_job(plan_opts *o);

#endif
