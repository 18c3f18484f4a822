#include "core/jobspec.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/schedule.h"
#include "core/topology.h"

/* ---- the table ---- */

typedef struct flagdef {
  mega_jobflag info;
  size_t off;
  long long idef; /* int, bool, enum */
  double fdef;    /* float */
} flagdef;

static const char *const lr_styles[] = {"constant", "linear", "cosine", NULL};
static const char *const recomputes[] = {"full", "selective", NULL};
/* Index i is mega_sched_kind i. */
static const char *const schedules[] = {"no-pipelining", "gpipe", "1f1b", "interleaved", "zb-h1",
                                        NULL};
_Static_assert(MEGA_SCHED_NO_PIPELINING == 0 && MEGA_SCHED_GPIPE == 1 && MEGA_SCHED_1F1B == 2 &&
                   MEGA_SCHED_INTERLEAVED == 3 && MEGA_SCHED_ZB_H1 == 4,
               "--schedule's choices index mega_sched_kind");
_Static_assert(MEGA_LR_LINEAR == 1 && MEGA_RECOMPUTE_SELECTIVE == 1, "enum choices order");

#define OFF(f) offsetof(mega_jobspec, f)
#define FLAG(nm, f, grp, ty, meta, dtext, hlp, ch, req, mn, mx, mnx, mxx, idf, fdf) \
  {{nm, #f, grp, ty, meta, dtext, hlp, ch, req, mn, mx, mnx, mxx}, OFF(f), idf, fdf}
#define INT(nm, f, grp, meta, idf, dtext, req, mn, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_INT, meta, dtext, hlp, NULL, req, mn, NAN, false, false, idf, 0)
#define FLT(nm, f, grp, fdf, dtext, req, mn, mx, mnx, mxx, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_FLOAT, "F", dtext, hlp, NULL, req, mn, mx, mnx, mxx, 0, fdf)
#define STR(nm, f, grp, meta, req, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_STRING, meta, req ? "required" : "none", hlp, NULL, req, NAN, \
       NAN, false, false, 0, 0)
#define BOOL(nm, f, grp, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_BOOL, NULL, "off", hlp, NULL, false, NAN, NAN, false, false, 0, 0)
#define ENUM(nm, f, grp, meta, ch, idf, dtext, hlp) \
  FLAG(nm, f, grp, MEGA_JOBFLAG_ENUM, meta, dtext, hlp, ch, false, NAN, NAN, false, false, idf, 0)

static const flagdef table[] = {
    INT("--num-layers", num_layers, "model", "N", 0, "required", true, 1,
        "Number of transformer decoder layers."),
    INT("--hidden-size", hidden_size, "model", "N", 0, "required", true, 1,
        "Width of the model."),
    INT("--num-attention-heads", num_attention_heads, "model", "N", 0, "required", true, 1,
        "Attention heads per layer; must divide --hidden-size."),
    INT("--seq-length", seq_length, "model", "N", 0, "required", true, 1,
        "Tokens (bytes) per sample."),
    INT("--max-position-embeddings", max_position_embeddings, "model", "N", -1, "seq-length",
        false, 1, "Rows of the learned position table; at least --seq-length."),
    FLT("--init-method-std", init_method_std, "model", 0.02, "0.02", false, 0, NAN, true, false,
        "Standard deviation of the normal weight initialization."),
    INT("--seed", seed, "model", "N", 1234, "1234", false, 0,
        "Random seed for the initial weights and the data order."),
    INT("--micro-batch-size", micro_batch_size, "batch", "N", 0, "required", true, 1,
        "Samples per microbatch."),
    INT("--global-batch-size", global_batch_size, "batch", "N", 0, "required", true, 1,
        "Samples per iteration over all data-parallel replicas."),
    INT("--train-iters", train_iters, "batch", "N", 0, "required", true, 1,
        "Number of training iterations."),
    STR("--data-path", data_path, "data", "FILE", true,
        "Training data: any file, read as bytes (vocabulary of 256)."),
    FLT("--lr", lr, "optimizer", NAN, "required", true, 0, NAN, false, false,
        "Peak learning rate."),
    FLT("--min-lr", min_lr, "optimizer", 0, "0", false, 0, NAN, false, false,
        "Learning rate at the end of the decay."),
    INT("--lr-warmup-iters", lr_warmup_iters, "optimizer", "N", 0, "0", false, 0,
        "Iterations of linear warmup from 0 to --lr."),
    INT("--lr-decay-iters", lr_decay_iters, "optimizer", "N", -1, "train-iters", false, 1,
        "Iteration at which the decay reaches --min-lr."),
    ENUM("--lr-decay-style", lr_decay_style, "optimizer", "constant|linear|cosine", lr_styles,
         MEGA_LR_LINEAR, "linear", "Shape of the learning-rate decay."),
    FLT("--weight-decay", weight_decay, "optimizer", 0.01, "0.01", false, 0, NAN, false, false,
        "Decoupled (AdamW) weight decay."),
    FLT("--adam-beta1", adam_beta1, "optimizer", 0.9, "0.9", false, 0, 1, false, true,
        "Adam's first-moment decay."),
    FLT("--adam-beta2", adam_beta2, "optimizer", 0.999, "0.999", false, 0, 1, false, true,
        "Adam's second-moment decay."),
    FLT("--adam-eps", adam_eps, "optimizer", 1e-8, "1e-08", false, 0, NAN, true, false,
        "Adam's denominator term."),
    FLT("--clip-grad", clip_grad, "optimizer", 1.0, "1", false, 0, NAN, false, false,
        "Global gradient-norm clipping threshold; 0 disables clipping."),
    STR("--save", save, "checkpoints", "DIR", false, "Directory to save checkpoints in."),
    INT("--save-interval", save_interval, "checkpoints", "N", 0, "0", false, 0,
        "Save every N iterations; 0 saves only at the end."),
    BOOL("--save-initial", save_initial, "checkpoints", "Also save before the first iteration."),
    STR("--load", load, "checkpoints", "DIR", false, "Directory to resume from."),
    INT("--eval-interval", eval_interval, "evaluation", "N", 0, "0", false, 0,
        "Evaluate every N iterations; 0 never evaluates."),
    INT("--eval-iters", eval_iters, "evaluation", "N", 10, "10", false, 1,
        "Iterations per evaluation."),
    INT("--tensor-model-parallel-size", tensor_model_parallel_size, "parallelism", "N", 1, "1",
        false, 1, "Tensor-parallel size (TP)."),
    INT("--pipeline-model-parallel-size", pipeline_model_parallel_size, "parallelism", "N", 1,
        "1", false, 1, "Pipeline-parallel size (PP)."),
    INT("--virtual-pipeline-model-parallel-size", virtual_pipeline_model_parallel_size,
        "parallelism", "N", -1, "1", false, 1,
        "Model chunks per pipeline rank (VP) for the interleaved schedule."),
    INT("--num-layers-per-virtual-pipeline-stage", num_layers_per_virtual_pipeline_stage,
        "parallelism", "N", -1, "none", false, 1,
        "Decoder layers per model chunk; sets VP from --num-layers and PP."),
    INT("--microbatch-group-size-per-vp-stage", microbatch_group_size_per_vp_stage,
        "parallelism", "N", -1, "pipeline size", false, 1,
        "Microbatches run per model chunk before the next chunk (interleaved schedule)."),
    STR("--pipeline-model-parallel-layout", pipeline_model_parallel_layout, "parallelism", "STR",
        false, "Layers per stage, e.g. \"Et*3|(tt|)*29,m|L\"; sets VP from the stage count."),
    INT("--decoder-first-pipeline-num-layers", decoder_first_pipeline_num_layers, "parallelism",
        "N", -1, "none", false, 0, "Decoder layers on the first pipeline rank."),
    INT("--decoder-last-pipeline-num-layers", decoder_last_pipeline_num_layers, "parallelism",
        "N", -1, "none", false, 0, "Decoder layers on the last pipeline rank."),
    ENUM("--schedule", schedule, "parallelism", "no-pipelining|gpipe|1f1b|interleaved|zb-h1",
         schedules, MEGA_JOB_SCHEDULE_AUTO, "auto",
         "Pipeline schedule; by default chosen from PP and VP."),
    BOOL("--batch-p2p-comm", batch_p2p_comm, "p2p and memory",
         "Post a step's sends and receives as one batch instead of in even/odd order."),
    BOOL("--overlap-p2p-comm", overlap_p2p_comm, "p2p and memory",
         "Overlap pipeline sends and receives with compute (interleaved schedule)."),
    BOOL("--overlap-p2p-comm-warmup-flush", overlap_p2p_comm_warmup_flush, "p2p and memory",
         "Also overlap P2P in the warmup and flush phases."),
    BOOL("--variable-seq-lengths", variable_seq_lengths, "p2p and memory",
         "Send each activation's shape before it, for varying sequence lengths."),
    BOOL("--deallocate-pipeline-outputs", deallocate_pipeline_outputs, "p2p and memory",
         "Free a stage's output as soon as it is sent, keeping only what backward needs."),
    ENUM("--recompute-granularity", recompute_granularity, "p2p and memory", "full|selective", recomputes,
         MEGA_RECOMPUTE_NONE, "none", "Recompute activations in backward instead of storing them."),
    BOOL("--overlap-grad-reduce", overlap_grad_reduce, "data parallel",
         "Reduce gradient buckets while backward still runs."),
    BOOL("--align-grad-reduce", align_grad_reduce, "data parallel",
         "Launch every pipeline stage's gradient reduce together."),
    INT("--bucket-size", bucket_size, "data parallel", "N", 40000000, "40000000", false, 1,
        "Gradient bucket size in elements."),
    BOOL("--use-distributed-optimizer", use_distributed_optimizer, "data parallel",
         "Shard optimizer state over data-parallel ranks (reduce-scatter, all-gather)."),
    INT("--blas-threads", blas_threads, "worker", "N", 1, "1", false, 1,
        "BLAS threads per CPU worker."),
    INT("--trace-iteration", trace_iteration, "worker", "N", 0, "0", false, 0,
        "Record a Chrome trace of iteration N (1-based); 0 records none."),
    STR("--simulate-compute", simulate_compute, "worker", "F_MS:B_MS[:W_MS]", false,
        "Sleep these milliseconds instead of computing forward, backward (and weight grad)."),
    INT("--log-interval", log_interval, "worker", "N", 1, "1", false, 1,
        "Report every N iterations."),
};

enum { NFLAGS = sizeof table / sizeof table[0] };

#define FIELD(s, f, type) ((type *)((char *)(s) + (f)->off))
#define CFIELD(s, f, type) ((const type *)((const char *)(s) + (f)->off))

int mega_jobspec_flag_count(void) { return NFLAGS; }

const mega_jobflag *mega_jobspec_flag(int i) {
  return i >= 0 && i < NFLAGS ? &table[i].info : NULL;
}

static const flagdef *find_n(const char *name, size_t n) {
  for (int i = 0; i < NFLAGS; i++)
    if (strlen(table[i].info.name) == n && memcmp(table[i].info.name, name, n) == 0)
      return &table[i];
  return NULL;
}

const mega_jobflag *mega_jobspec_flag_find(const char *name) {
  const flagdef *f = name ? find_n(name, strlen(name)) : NULL;
  return f ? &f->info : NULL;
}

static int nchoices(const flagdef *f) {
  int n = 0;
  while (f->info.choices[n]) n++;
  return n;
}

/* ---- life cycle ---- */

static void set_default(mega_jobspec *s, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: *FIELD(s, f, int) = (int)f->idef; break;
  case MEGA_JOBFLAG_FLOAT: *FIELD(s, f, double) = f->fdef; break;
  case MEGA_JOBFLAG_STRING: *FIELD(s, f, char *) = NULL; break;
  case MEGA_JOBFLAG_BOOL: *FIELD(s, f, bool) = f->idef != 0; break;
  }
}

void mega_jobspec_defaults(mega_jobspec *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < NFLAGS; i++) set_default(s, &table[i]);
}

void mega_jobspec_free(mega_jobspec *s) {
  if (!s) return;
  for (int i = 0; i < NFLAGS; i++)
    if (table[i].info.type == MEGA_JOBFLAG_STRING) free(*FIELD(s, &table[i], char *));
  mega_jobspec_defaults(s);
}

mega_status mega_jobspec_copy(mega_jobspec *dst, const mega_jobspec *src, mega_err *err) {
  *dst = *src;
  for (int i = 0; i < NFLAGS; i++)
    if (table[i].info.type == MEGA_JOBFLAG_STRING) *FIELD(dst, &table[i], char *) = NULL;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &table[i];
    if (f->info.type != MEGA_JOBFLAG_STRING) continue;
    const char *v = *CFIELD(src, f, char *);
    if (v && !(*FIELD(dst, f, char *) = strdup(v))) {
      mega_jobspec_free(dst);
      return mega_fail(err, MEGA_ERR_NOMEM, "out of memory copying a job spec");
    }
  }
  return MEGA_OK;
}

static bool same_value(const mega_jobspec *a, const mega_jobspec *b, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return *CFIELD(a, f, int) == *CFIELD(b, f, int);
  case MEGA_JOBFLAG_BOOL: return *CFIELD(a, f, bool) == *CFIELD(b, f, bool);
  case MEGA_JOBFLAG_FLOAT: {
    double x = *CFIELD(a, f, double), y = *CFIELD(b, f, double);
    return x == y || (isnan(x) && isnan(y));
  }
  case MEGA_JOBFLAG_STRING: {
    const char *x = *CFIELD(a, f, char *), *y = *CFIELD(b, f, char *);
    return x == y || (x && y && strcmp(x, y) == 0);
  }
  }
  return false;
}

bool mega_jobspec_equal(const mega_jobspec *a, const mega_jobspec *b) {
  for (int i = 0; i < NFLAGS; i++)
    if (!same_value(a, b, &table[i])) return false;
  return true;
}

static bool is_default(const mega_jobspec *s, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return *CFIELD(s, f, int) == f->idef;
  case MEGA_JOBFLAG_BOOL: return *CFIELD(s, f, bool) == (f->idef != 0);
  case MEGA_JOBFLAG_FLOAT: {
    double x = *CFIELD(s, f, double);
    return x == f->fdef || (isnan(x) && isnan(f->fdef));
  }
  case MEGA_JOBFLAG_STRING: return *CFIELD(s, f, char *) == NULL;
  }
  return true;
}

/* ---- typed setters: the one place a flag's bounds are enforced ---- */

/* The shortest text that reads back as exactly v. */
static void format_double(double v, char *buf, size_t n) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}


static mega_status check_bounds(const flagdef *f, double v, const char *lead, mega_err *err) {
  const mega_jobflag *in = &f->info;
  char got[64];
  if (in->type == MEGA_JOBFLAG_INT) snprintf(got, sizeof got, "%.0f", v);
  else format_double(v, got, sizeof got);
  if (in->type == MEGA_JOBFLAG_FLOAT && !isfinite(v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be a finite number (got %s)", lead,
                     in->name, got);
  if (!isnan(in->min) && (in->min_exclusive ? !(v > in->min) : !(v >= in->min)))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be %s %g (got %s)", lead, in->name,
                     in->min_exclusive ? "greater than" : "at least", in->min, got);
  if (!isnan(in->max) && (in->max_exclusive ? !(v < in->max) : !(v <= in->max)))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be %s %g (got %s)", lead, in->name,
                     in->max_exclusive ? "less than" : "at most", in->max, got);
  return MEGA_OK;
}

static mega_status set_string(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  if (!*v) return mega_fail(err, MEGA_ERR_INVALID, "%s: the value is empty", f->info.name);
  char *copy = strdup(v);
  if (!copy) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory storing %s", f->info.name);
  free(*FIELD(s, f, char *));
  *FIELD(s, f, char *) = copy;
  return MEGA_OK;
}

static mega_status set_enum(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  for (int k = 0; f->info.choices[k]; k++)
    if (strcmp(v, f->info.choices[k]) == 0) {
      *FIELD(s, f, int) = k;
      return MEGA_OK;
    }
  char list[256] = "";
  for (int k = 0; f->info.choices[k]; k++) {
    if (k) strncat(list, ", ", sizeof list - strlen(list) - 1);
    strncat(list, f->info.choices[k], sizeof list - strlen(list) - 1);
  }
  return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not one of %s", f->info.name, v, list);
}

static mega_status parse_int_text(const flagdef *f, const char *v, int *out, mega_err *err) {
  const char *name = f->info.name;
  if (!*v || isspace((unsigned char)*v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a whole number", name, v);
  errno = 0;
  char *end;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a whole number", name, v);
  if (errno == ERANGE || x > INT_MAX || x < INT_MIN)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is out of range (at most %d)", name, v,
                     INT_MAX);
  *out = (int)x;
  return MEGA_OK;
}

static mega_status parse_float_text(const char *name, const char *v, double *out, mega_err *err) {
  if (!*v || isspace((unsigned char)*v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a number", name, v);
  errno = 0;
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a number", name, v);
  if (errno == ERANGE)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is too %s to represent", name, v,
                     fabs(x) > 1 ? "large" : "small");
  if (!isfinite(x))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a finite number", name, v);
  *out = x;
  return MEGA_OK;
}

static mega_status set_int(mega_jobspec *s, const flagdef *f, int v, mega_err *err) {
  mega_status st = check_bounds(f, v, "", err);
  if (st == MEGA_OK) *FIELD(s, f, int) = v;
  return st;
}

static mega_status set_float(mega_jobspec *s, const flagdef *f, double v, mega_err *err) {
  mega_status st = check_bounds(f, v, "", err);
  if (st == MEGA_OK) *FIELD(s, f, double) = v;
  return st;
}

static mega_status set_text(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  mega_status st;
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: {
    int x = 0;
    if ((st = parse_int_text(f, v, &x, err)) != MEGA_OK) return st;
    return set_int(s, f, x, err);
  }
  case MEGA_JOBFLAG_FLOAT: {
    double x = 0;
    if ((st = parse_float_text(f->info.name, v, &x, err)) != MEGA_OK) return st;
    return set_float(s, f, x, err);
  }
  case MEGA_JOBFLAG_STRING: return set_string(s, f, v, err);
  case MEGA_JOBFLAG_ENUM: return set_enum(s, f, v, err);
  case MEGA_JOBFLAG_BOOL: break;
  }
  return mega_fail(err, MEGA_ERR_INTERNAL, "%s takes no value", f->info.name);
}

/* ---- parsing ---- */

static int edit_distance(const char *a, const char *b) {
  size_t n = strlen(b);
  if (strlen(a) > 64 || n > 64) return 99;
  int row[65];
  for (size_t j = 0; j <= n; j++) row[j] = (int)j;
  for (size_t i = 1; a[i - 1]; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= n; j++) {
      int up = row[j];
      int sub = diag + (a[i - 1] != b[j - 1]);
      int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
      row[j] = sub < best ? sub : best;
      diag = up;
    }
  }
  return row[n];
}

static mega_status unknown_flag(const char *arg, size_t n, mega_err *err) {
  char name[80];
  snprintf(name, sizeof name, "%.*s", (int)(n < 79 ? n : 79), arg);
  const char *best = NULL;
  int best_d = 3;
  for (int i = 0; i < NFLAGS; i++) {
    int d = edit_distance(name, table[i].info.name);
    if (d < best_d) best_d = d, best = table[i].info.name;
  }
  if (best)
    return mega_fail(err, MEGA_ERR_NOT_FOUND, "unknown flag '%s'; did you mean %s?", name, best);
  return mega_fail(err, MEGA_ERR_NOT_FOUND, "unknown flag '%s'", name);
}

mega_status mega_jobspec_parse_flag(mega_jobspec *s, int argc, char *const *argv, int *i,
                                    mega_err *err) {
  if (*i < 0 || *i >= argc || !argv[*i])
    return mega_fail(err, MEGA_ERR_INVALID, "no argument at position %d", *i);
  const char *arg = argv[*i];
  if (strncmp(arg, "--", 2) != 0)
    return mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "unexpected argument '%s' (job flags start with --)", arg);
  const char *eq = strchr(arg, '=');
  size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
  const flagdef *f = find_n(arg, n);
  if (!f) return unknown_flag(arg, n, err);
  if (f->info.type == MEGA_JOBFLAG_BOOL) {
    if (eq)
      return mega_fail(err, MEGA_ERR_INVALID, "%s takes no value (got '%s')", f->info.name, arg);
    *FIELD(s, f, bool) = true;
    *i += 1;
    return MEGA_OK;
  }
  const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!eq && (!v || strncmp(v, "--", 2) == 0))
    return mega_fail(err, MEGA_ERR_INVALID, "%s needs a value (%s %s)", f->info.name,
                     f->info.name, f->info.metavar);
  mega_status st = set_text(s, f, v, err);
  if (st == MEGA_OK) *i += eq ? 1 : 2;
  return st;
}

mega_status mega_jobspec_parse(mega_jobspec *s, int argc, char *const *argv, mega_err *err) {
  for (int i = 0; i < argc;) {
    mega_status st = mega_jobspec_parse_flag(s, argc, argv, &i, err);
    if (st == MEGA_ERR_NOT_FOUND) {
      if (err) err->status = MEGA_ERR_INVALID;
      return MEGA_ERR_INVALID;
    }
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}

/* ---- derived values ---- */

int mega_jobspec_dp(const mega_jobspec *s, int world_size) {
  long long mp = (long long)s->tensor_model_parallel_size * s->pipeline_model_parallel_size;
  if (mp < 1 || world_size < 1 || world_size % mp) return 0;
  return (int)(world_size / mp);
}

int mega_jobspec_group_size(const mega_jobspec *s) {
  return s->microbatch_group_size_per_vp_stage > 0 ? s->microbatch_group_size_per_vp_stage
                                                   : s->pipeline_model_parallel_size;
}

int mega_jobspec_num_microbatches(const mega_jobspec *s, int world_size) {
  long long per = (long long)s->micro_batch_size * mega_jobspec_dp(s, world_size);
  return per > 0 ? (int)(s->global_batch_size / per) : 0;
}

long long mega_jobspec_tokens_per_iter(const mega_jobspec *s) {
  return (long long)s->global_batch_size * s->seq_length;
}

int mega_jobspec_max_position_embeddings(const mega_jobspec *s) {
  return s->max_position_embeddings > 0 ? s->max_position_embeddings : s->seq_length;
}

int mega_jobspec_lr_decay_iters(const mega_jobspec *s) {
  return s->lr_decay_iters > 0 ? s->lr_decay_iters : s->train_iters;
}

int mega_jobspec_padded_vocab(const mega_jobspec *s) {
  int multiple = 128 * (s->tensor_model_parallel_size > 0 ? s->tensor_model_parallel_size : 1);
  return (MEGA_VOCAB_SIZE + multiple - 1) / multiple * multiple;
}

#define BAD(...) mega_fail(err, MEGA_ERR_INVALID, "invalid job: " __VA_ARGS__)

/* The layout, and with it VP, as Megatron derives them: from the layout
 * string, else from --num-layers-per-virtual-pipeline-stage, else from the
 * VP flag with the uniform split. */
mega_status mega_jobspec_layout(const mega_jobspec *s, mega_layout *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  int pp = s->pipeline_model_parallel_size, vp_flag = s->virtual_pipeline_model_parallel_size;
  int first = s->decoder_first_pipeline_num_layers, last = s->decoder_last_pipeline_num_layers;
  int nlpvs = s->num_layers_per_virtual_pipeline_stage;
  bool uneven = first >= 0 || last >= 0;
  const char *uneven_flag =
      first >= 0 ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers";
  mega_err sub = {0};
  if (s->pipeline_model_parallel_layout) {
    if (uneven)
      return BAD("--pipeline-model-parallel-layout cannot be combined with %s; the layout "
                 "already places every layer",
                 uneven_flag);
    if (nlpvs > 0)
      return BAD("--pipeline-model-parallel-layout cannot be combined with "
                 "--num-layers-per-virtual-pipeline-stage; the layout's stage count sets VP");
    mega_status st = mega_layout_parse(s->pipeline_model_parallel_layout, pp, out, &sub);
    if (st != MEGA_OK)
      return mega_fail(err, st, "invalid job: --pipeline-model-parallel-layout: %s", sub.msg);
    int stages = out->nstages;
    if (vp_flag > 0 && vp_flag != out->vp) {
      mega_layout_free(out);
      return BAD("--virtual-pipeline-model-parallel-size %d disagrees with the layout, whose %d "
                 "stages at PP = %d mean VP = %d",
                 vp_flag, stages, pp, stages / pp);
    }
    if (pp == 1 && stages > 1) {
      mega_layout_free(out);
      return BAD("the layout's %d stages at PP = 1 make a virtual pipeline (VP = %d), which "
                 "needs --pipeline-model-parallel-size > 1",
                 stages, stages);
    }
    return MEGA_OK;
  }
  int vp = vp_flag > 0 ? vp_flag : 1;
  if (nlpvs > 0) {
    if (uneven)
      return BAD("--num-layers-per-virtual-pipeline-stage cannot be combined with %s; give "
                 "--virtual-pipeline-model-parallel-size instead",
                 uneven_flag);
    if (s->num_layers % pp)
      return BAD("--num-layers %d is not divisible by --pipeline-model-parallel-size %d, so "
                 "--num-layers-per-virtual-pipeline-stage cannot split it",
                 s->num_layers, pp);
    int per_rank = s->num_layers / pp;
    if (per_rank % nlpvs)
      return BAD("the %d layers per pipeline rank (--num-layers %d / PP %d) are not divisible "
                 "by --num-layers-per-virtual-pipeline-stage %d",
                 per_rank, s->num_layers, pp, nlpvs);
    if (vp_flag > 0 && vp_flag != per_rank / nlpvs)
      return BAD("--virtual-pipeline-model-parallel-size %d disagrees with "
                 "--num-layers-per-virtual-pipeline-stage %d, which gives VP = %d "
                 "(%d layers per pipeline rank)",
                 vp_flag, nlpvs, per_rank / nlpvs, per_rank);
    vp = per_rank / nlpvs;
  }
  if (vp > 1 && pp == 1)
    return BAD("a virtual pipeline (VP = %d) needs --pipeline-model-parallel-size > 1", vp);
  mega_status st = mega_layout_uniform(s->num_layers, pp, vp, first, last, out, &sub);
  if (st != MEGA_OK) return mega_fail(err, st, "invalid job: %s", sub.msg);
  return MEGA_OK;
}

int mega_jobspec_vp(const mega_jobspec *s) {
  mega_layout l;
  if (mega_jobspec_layout(s, &l, NULL) != MEGA_OK) {
    int vp = s->virtual_pipeline_model_parallel_size;
    return vp > 0 ? vp : 1;
  }
  int vp = l.vp;
  mega_layout_free(&l);
  return vp;
}

mega_status mega_jobspec_parse_simulate_compute(const char *str, mega_sim_compute *out,
                                                mega_err *err) {
  static const char *const part_names[] = {"F_MS", "B_MS", "W_MS"};
  mega_sim_compute r = {0};
  double v[3] = {0};
  int n = 0;
  const char *p = str ? str : "";
  char part[64];
  for (;;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (n == 3 || len >= sizeof part)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--simulate-compute '%s': expected F_MS:B_MS or F_MS:B_MS:W_MS, "
                       "e.g. 2:4 or 2:2:2",
                       str ? str : "");
    memcpy(part, p, len);
    part[len] = '\0';
    char what[96];
    snprintf(what, sizeof what, "--simulate-compute %s", part_names[n]);
    mega_status st = parse_float_text(what, part, &v[n], err);
    if (st != MEGA_OK) return st;
    if (v[n] < 0)
      return mega_fail(err, MEGA_ERR_INVALID, "%s must be at least 0 ms (got %s)", what, part);
    n++;
    if (!colon) break;
    p = colon + 1;
  }
  if (n < 2)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--simulate-compute '%s': expected F_MS:B_MS or F_MS:B_MS:W_MS, "
                     "e.g. 2:4 or 2:2:2",
                     str ? str : "");
  r.f_ms = v[0];
  r.b_ms = v[1];
  r.w_ms = v[2];
  r.has_w = n == 3;
  if (out) *out = r;
  return MEGA_OK;
}

/* ---- checking ---- */

static mega_status check_flag(const mega_jobspec *s, const flagdef *f, mega_err *err) {
  const mega_jobflag *in = &f->info;
  switch (in->type) {
  case MEGA_JOBFLAG_INT: {
    int v = *CFIELD(s, f, int);
    if (in->required && v == f->idef) return BAD("%s is required", in->name);
    if (v == f->idef) return MEGA_OK;
    return check_bounds(f, v, "invalid job: ", err);
  }
  case MEGA_JOBFLAG_FLOAT: {
    double v = *CFIELD(s, f, double);
    if (in->required && isnan(v)) return BAD("%s is required", in->name);
    return check_bounds(f, v, "invalid job: ", err);
  }
  case MEGA_JOBFLAG_STRING: {
    const char *v = *CFIELD(s, f, char *);
    if (in->required && !v) return BAD("%s is required", in->name);
    if (v && !*v) return BAD("%s is empty", in->name);
    return MEGA_OK;
  }
  case MEGA_JOBFLAG_ENUM: {
    int v = *CFIELD(s, f, int);
    if (v == f->idef || (v >= 0 && v < nchoices(f))) return MEGA_OK;
    return BAD("%s has no choice number %d; it takes %s", in->name, v, in->metavar);
  }
  case MEGA_JOBFLAG_BOOL: return MEGA_OK;
  }
  return MEGA_OK;
}

static mega_status check_parallel(const mega_jobspec *s, mega_err *err) {
  mega_layout l;
  mega_status st = mega_jobspec_layout(s, &l, err);
  if (st != MEGA_OK) return st;
  int decoders = mega_layout_total(&l, MEGA_LAYER_DECODER);
  int mtp = mega_layout_total(&l, MEGA_LAYER_MTP);
  mega_layout_free(&l);
  if (s->pipeline_model_parallel_layout) {
    if (decoders != s->num_layers)
      return BAD("--pipeline-model-parallel-layout has %d decoder layers ('t') but "
                 "--num-layers is %d",
                 decoders, s->num_layers);
    if (mtp > 0)
      return BAD("--pipeline-model-parallel-layout has %d multi-token prediction layer%s "
                 "('m'), which mega's GPT model does not have; remove them",
                 mtp, mtp == 1 ? "" : "s");
  }
  if (s->overlap_p2p_comm_warmup_flush && !s->overlap_p2p_comm)
    return BAD("--overlap-p2p-comm-warmup-flush needs --overlap-p2p-comm");
  if (s->overlap_p2p_comm_warmup_flush && s->batch_p2p_comm)
    return BAD("--overlap-p2p-comm-warmup-flush cannot be used with --batch-p2p-comm");
  if (s->overlap_p2p_comm && s->batch_p2p_comm)
    return BAD("--overlap-p2p-comm cannot be used with --batch-p2p-comm; pick one");
  return MEGA_OK;
}

mega_status mega_jobspec_check(const mega_jobspec *s, int world_size, long long data_bytes,
                               mega_err *err) {
  mega_status st;
  for (int i = 0; i < NFLAGS; i++)
    if ((st = check_flag(s, &table[i], err)) != MEGA_OK) return st;

  int tp = s->tensor_model_parallel_size, pp = s->pipeline_model_parallel_size, dp = 0;
  if (world_size < 0) return BAD("world size must be at least 1 (got %d)", world_size);
  if (world_size > 0) {
    mega_topo t;
    mega_err sub = {0};
    if ((st = mega_topo_init(&t, world_size, tp, pp, &sub)) != MEGA_OK)
      return mega_fail(err, st, "invalid job: %s", sub.msg);
    dp = t.dp;
  }

  if (s->hidden_size % s->num_attention_heads)
    return BAD("--hidden-size %d is not divisible by --num-attention-heads %d", s->hidden_size,
               s->num_attention_heads);
  if (s->num_attention_heads % tp)
    return BAD("--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d",
               s->num_attention_heads, tp);
  int max_pos = mega_jobspec_max_position_embeddings(s);
  if (s->seq_length > max_pos)
    return BAD("--seq-length %d is longer than --max-position-embeddings %d", s->seq_length,
               max_pos);
  if (data_bytes >= 0 && data_bytes < (long long)s->seq_length + 1)
    return BAD("the data file %s has %lld bytes, fewer than one window of --seq-length + 1 = "
               "%lld bytes",
               s->data_path, data_bytes, (long long)s->seq_length + 1);

  if (dp > 0) {
    long long per = (long long)s->micro_batch_size * dp;
    if (s->global_batch_size % per)
      return BAD("--global-batch-size %d is not divisible by --micro-batch-size %d × "
                 "data-parallel size %d = %lld",
                 s->global_batch_size, s->micro_batch_size, dp, per);
  } else if (s->global_batch_size % s->micro_batch_size) {
    return BAD("--global-batch-size %d is not divisible by --micro-batch-size %d",
               s->global_batch_size, s->micro_batch_size);
  }

  if (s->min_lr > s->lr)
    return BAD("--min-lr %g is larger than --lr %g", s->min_lr, s->lr);
  int decay = mega_jobspec_lr_decay_iters(s);
  if (s->lr_warmup_iters >= decay)
    return BAD("--lr-warmup-iters %d must be less than the decay iterations %d "
               "(--lr-decay-iters, by default --train-iters)",
               s->lr_warmup_iters, decay);

  if (!s->save && s->save_interval > 0) return BAD("--save-interval needs --save DIR");
  if (!s->save && s->save_initial) return BAD("--save-initial needs --save DIR");
  if (s->trace_iteration > s->train_iters)
    return BAD("--trace-iteration %d is past the last iteration (--train-iters %d)",
               s->trace_iteration, s->train_iters);

  if ((st = check_parallel(s, err)) != MEGA_OK) return st;

  if (s->simulate_compute) {
    mega_err sub = {0};
    if ((st = mega_jobspec_parse_simulate_compute(s->simulate_compute, NULL, &sub)) != MEGA_OK)
      return mega_fail(err, st, "invalid job: %s", sub.msg);
  }
  return MEGA_OK;
}

/* ---- serialization ---- */

static void value_text(const mega_jobspec *s, const flagdef *f, char *buf, size_t n) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: snprintf(buf, n, "%d", *CFIELD(s, f, int)); break;
  case MEGA_JOBFLAG_FLOAT: format_double(*CFIELD(s, f, double), buf, n); break;
  case MEGA_JOBFLAG_ENUM: {
    int v = *CFIELD(s, f, int);
    snprintf(buf, n, "%s", v >= 0 && v < nchoices(f) ? f->info.choices[v] : "?");
    break;
  }
  default: buf[0] = '\0';
  }
}

void mega_jobspec_argv_free(char **argv) {
  if (!argv) return;
  for (char **p = argv; *p; p++) free(*p);
  free(argv);
}

char **mega_jobspec_to_argv(const mega_jobspec *s, int *argc) {
  char **out = calloc(2 * NFLAGS + 1, sizeof *out);
  int n = 0;
  if (!out) goto nomem;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &table[i];
    if (is_default(s, f)) continue;
    const char *name = f->info.name;
    if (f->info.type == MEGA_JOBFLAG_BOOL) {
      if (!(out[n++] = strdup(name))) goto nomem;
      continue;
    }
    if (f->info.type == MEGA_JOBFLAG_STRING) {
      const char *v = *CFIELD(s, f, char *);
      /* a value that looks like a flag travels in the --flag=value form */
      if (v[0] == '-') {
        if (asprintf(&out[n], "%s=%s", name, v) < 0) goto nomem;
        n++;
      } else if (!(out[n++] = strdup(name)) || !(out[n++] = strdup(v))) {
        goto nomem;
      }
      continue;
    }
    char buf[64];
    value_text(s, f, buf, sizeof buf);
    if (!(out[n++] = strdup(name)) || !(out[n++] = strdup(buf))) goto nomem;
  }
  if (argc) *argc = n;
  return out;
nomem:
  mega_jobspec_argv_free(out);
  if (argc) *argc = 0;
  return NULL;
}

static bool is_absent(const mega_jobspec *s, const flagdef *f) {
  if (!is_default(s, f)) return false;
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return f->idef == -1 || f->info.required;
  case MEGA_JOBFLAG_FLOAT: return isnan(f->fdef);
  case MEGA_JOBFLAG_STRING: return true;
  case MEGA_JOBFLAG_BOOL: return false;
  }
  return false;
}

json_t *mega_jobspec_to_json(const mega_jobspec *s) {
  json_t *obj = json_object();
  if (!obj) return NULL;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &table[i];
    json_t *v;
    if (is_absent(s, f)) {
      v = json_null();
    } else {
      switch (f->info.type) {
      case MEGA_JOBFLAG_INT: v = json_integer(*CFIELD(s, f, int)); break;
      case MEGA_JOBFLAG_FLOAT: v = json_real(*CFIELD(s, f, double)); break;
      case MEGA_JOBFLAG_STRING: v = json_string(*CFIELD(s, f, char *)); break;
      case MEGA_JOBFLAG_BOOL: v = json_boolean(*CFIELD(s, f, bool)); break;
      default: {
        char buf[64];
        value_text(s, f, buf, sizeof buf);
        v = json_string(buf);
      }
      }
    }
    if (!v || json_object_set_new(obj, f->info.key, v) != 0) {
      json_decref(obj);
      return NULL;
    }
  }
  return obj;
}

static mega_status from_json_value(mega_jobspec *s, const flagdef *f, json_t *v, mega_err *err) {
  const char *name = f->info.name;
  if (json_is_null(v)) {
    if (f->info.type == MEGA_JOBFLAG_STRING) free(*FIELD(s, f, char *));
    set_default(s, f);
    return MEGA_OK;
  }
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: {
    if (!json_is_integer(v)) break;
    json_int_t x = json_integer_value(v);
    if (x > INT_MAX || x < INT_MIN)
      return mega_fail(err, MEGA_ERR_INVALID, "%s: %lld is out of range (at most %d)", name,
                       (long long)x, INT_MAX);
    return set_int(s, f, (int)x, err);
  }
  case MEGA_JOBFLAG_FLOAT:
    if (!json_is_number(v)) break;
    return set_float(s, f, json_number_value(v), err);
  case MEGA_JOBFLAG_STRING:
    if (!json_is_string(v)) break;
    return set_string(s, f, json_string_value(v), err);
  case MEGA_JOBFLAG_BOOL:
    if (!json_is_boolean(v)) break;
    *FIELD(s, f, bool) = json_is_true(v);
    return MEGA_OK;
  case MEGA_JOBFLAG_ENUM:
    if (!json_is_string(v)) break;
    return set_enum(s, f, json_string_value(v), err);
  }
  static const char *const want[] = {"an integer", "a number", "a string", "true or false",
                                     "a string"};
  return mega_fail(err, MEGA_ERR_INVALID, "%s (JSON key \"%s\") must be %s", name, f->info.key,
                   want[f->info.type]);
}

mega_status mega_jobspec_from_json(mega_jobspec *s, const json_t *obj, mega_err *err) {
  if (!json_is_object(obj))
    return mega_fail(err, MEGA_ERR_INVALID, "a job spec in JSON must be an object");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    const flagdef *f = NULL;
    for (int i = 0; i < NFLAGS && !f; i++)
      if (strcmp(table[i].info.key, key) == 0) f = &table[i];
    if (!f) return mega_fail(err, MEGA_ERR_INVALID, "unknown job spec key \"%s\"", key);
    mega_status st = from_json_value(s, f, v, err);
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}
