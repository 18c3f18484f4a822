/* megactl submit, status, ls and cancel: one Control call each. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "client/commands.h"
#include "client/conn.h"
#include "client/tables.h"
#include "client/view.h"
#include "core/duration.h"
#include "core/jobspec.h"
#include "core/schedule.h"
#include "core/version.h"
#include "proto/pb_json.h"

#define SUBMIT_TIMEOUT_MS 30000 /* the daemon journals the job before answering */
#define CANCEL_WAIT_MS 30000    /* for a takeover (etcd) of a job whose coordinator is gone */

/* ---------------------------------------------------------------- submit */

static void submit_help(FILE *f) {
  fprintf(f,
          "usage: megactl submit [job flags] [--name N] [--nnodes MIN[:MAX]]\n"
          "                      [--nproc-per-node K] [--max-restarts N]\n"
          "                      [--step-timeout D] [--server ADDR]\n\n"
          "Submits a training job to megad, which journals it, places its ranks on nodes and\n"
          "runs it. Prints a summary, then the job id alone on the last line:\n"
          "  id=$(megactl submit ... | tail -1)\n\n"
          "The job flags are checked here as megad checks them. Relative paths in the data flags\n"
          "(--data-path and its kin, --vocab-file, --merge-file), --save and --load are made\n"
          "absolute against this directory.\n\n"
          "submit flags:\n"
          "  --name N              a name for the job (default: megad picks one)\n"
          "  --nnodes MIN[:MAX]    nodes to run on (default: 1). With a MAX above MIN the\n"
          "                        job runs on as many as it can; when nodes are lost it\n"
          "                        goes on with fewer data-parallel replicas (same global\n"
          "                        batch) from its newest checkpoint, and grows back at a\n"
          "                        checkpoint when they return\n"
          "  --nproc-per-node K    ranks per node (default: every slot of a node)\n"
          "  --max-restarts N      restarts after a rank fails (crash, hang, error), each\n"
          "                        from the newest checkpoint (default 0: the job fails).\n"
          "                        Lost nodes and megad's own restarts never count\n"
          "  --step-timeout D      a rank with no progress this long is hung (e.g. 30s;\n"
          "                        default: 10 x its median step time, at least 2s)\n"
          "  --server ADDR         megad's address (default: $MEGA_SERVER, else %s)\n",
          MEGACTL_DEFAULT_SERVER);
  char *flags = mega_jobspec_help_text();
  if (flags) fputs(flags, f);
  free(flags);
}

/* "4" or "2:4". */
static bool parse_nnodes(const char *s, uint32_t *lo, uint32_t *hi) {
  char buf[64];
  if (strlen(s) >= sizeof buf) return false;
  strcpy(buf, s);
  char *colon = strchr(buf, ':');
  if (colon) *colon = '\0';
  if (!megactl_parse_count(buf, lo)) return false;
  *hi = *lo;
  if (colon && !megactl_parse_count(colon + 1, hi)) return false;
  return *hi >= *lo;
}

/* The checks megad makes too. world 0: unknown here (megad knows it once it
 * places the job), so the checks that need DP wait for megad. */
static mega_status check_job(const mega_jobspec *s, int world, mega_err *err) {
  struct stat stt;
  const char *one = mega_jobspec_data_single(s);
  long long bytes = one && stat(one, &stt) == 0 && S_ISREG(stt.st_mode) ? (long long)stt.st_size
                                                                        : -1;
  return mega_jobspec_check_all(s, world, bytes, err);
}

int megactl_submit(int argc, char **argv) {
  const char *cmd = "submit";
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_err err = {0};
  const char *name = "", *nnodes = NULL, *nproc = NULL, *server = NULL, *restarts = NULL,
             *step_timeout = NULL;
  int rc = 0;
  for (int i = 1; i < argc && !rc;) {
    if (megactl_is_help(argv[i])) {
      submit_help(stdout);
      mega_jobspec_free(&s);
      return 0;
    }
    mega_status st = mega_jobspec_parse_flag(&s, argc, argv, &i, &err);
    if (st == MEGA_OK) continue;
    if (st != MEGA_ERR_NOT_FOUND) {
      rc = megactl_usage(cmd, "%s", err.msg);
      break;
    }
    int r;
    if ((r = megactl_flag_value(cmd, argc, argv, &i, "--name", &name)) ||
        (r = megactl_flag_value(cmd, argc, argv, &i, "--nnodes", &nnodes)) ||
        (r = megactl_flag_value(cmd, argc, argv, &i, "--nproc-per-node", &nproc)) ||
        (r = megactl_flag_value(cmd, argc, argv, &i, "--max-restarts", &restarts)) ||
        (r = megactl_flag_value(cmd, argc, argv, &i, "--step-timeout", &step_timeout)) ||
        (r = megactl_flag_value(cmd, argc, argv, &i, "--server", &server)) ||
        (r = megactl_security_flag(cmd, argc, argv, &i))) {
      if (r < 0) rc = MEGACTL_EXIT_USAGE;
      continue;
    }
    /* the job flags' message: a suggestion, or Megatron's flag's reason */
    rc = megactl_is_flag(argv[i]) ? megactl_usage(cmd, "%s", err.msg)
                                  : megactl_usage(cmd, "unexpected word '%s'", argv[i]);
  }
  if (!rc) rc = megactl_server_usage(server);
  uint32_t lo = 0, hi = 0, per = 0;
  if (!rc && nnodes && !parse_nnodes(nnodes, &lo, &hi))
    rc = megactl_usage(cmd, "--nnodes: '%s' is not MIN or MIN:MAX with 1 <= MIN <= MAX", nnodes);
  if (!rc && nproc && !megactl_parse_count(nproc, &per))
    rc = megactl_usage(cmd, "--nproc-per-node: '%s' is not a positive integer", nproc);
  uint32_t max_restarts = 0;
  if (!rc && restarts && strcmp(restarts, "0") && !megactl_parse_count(restarts, &max_restarts))
    rc = megactl_usage(cmd, "--max-restarts: '%s' is not a count (0 or more)", restarts);
  unsigned step_ms = 0;
  if (!rc && step_timeout &&
      mega_duration_parse("--step-timeout", step_timeout, 100, 86400000, &step_ms, &err) != MEGA_OK)
    rc = megactl_usage(cmd, "%s", err.msg);
  /* PREFIX.bin or PREFIX.idx seen here: sent as PREFIX, as Megatron takes it */
  char note[2048] = "";
  if (!rc && mega_jobspec_fix_data_paths(&s, true, note, sizeof note, &err) != MEGA_OK)
    rc = megactl_usage(cmd, "%s", err.msg);
  if (!rc && note[0]) fprintf(stderr, "megactl submit: %s\n", note);
  /* relative paths (the data lists, --vocab-file, --merge-file, --save,
   * --load) made absolute: megad reads them from elsewhere */
  if (!rc && mega_jobspec_absolute_paths(&s, &err) != MEGA_OK) rc = megactl_fail("%s", err.msg);
  int world = per && lo == hi ? (int)(per * (lo ? lo : 1)) : 0;
  if (!rc && (check_job(&s, world, &err) != MEGA_OK ||
              (per && mega_jobspec_check_node(&s, (int)per, &err) != MEGA_OK))) {
    megactl_fail("%s", err.msg);
    rc = MEGACTL_EXIT_USAGE;
  }
  if (rc) {
    mega_jobspec_free(&s);
    return rc;
  }

  int nargs = 0;
  char **args = mega_jobspec_to_argv(&s, &nargs);
  mega_jobspec_free(&s);
  if (!args) return megactl_fail("out of memory");
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = (char *)name;
  spec.n_args = (size_t)nargs;
  spec.args = args;
  spec.nnodes_min = lo;
  spec.nnodes_max = hi;
  spec.nproc_per_node = per;
  spec.max_restarts = max_restarts;
  spec.step_timeout_ms = step_ms;
  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  req.spec = &spec;

  ProtobufCMessage *out = NULL;
  if (megactl_unary(server, &mega_control_submit_job, &req.base, SUBMIT_TIMEOUT_MS, &out, &err) != MEGA_OK) {
    if (err.status == MEGA_ERR_INVALID) {
      /* megactl took the flags: megad's words, not megactl's, and maybe
       * another build's */
      char v[128], hint[400] = "";
      if (megactl_server_version(server, v, sizeof v))
        tables_other_build(v, mega_version(), hint, sizeof hint);
      megactl_fail("megad refused the job: %s%s", err.msg, hint);
      rc = MEGACTL_EXIT_USAGE;
    } else {
      rc = megactl_fail("%s", err.msg);
    }
  } else {
    const Mega__V1__Job *j = ((Mega__V1__SubmitJobResponse *)out)->job;
    if (!j || !j->id || !j->id[0]) {
      rc = megactl_fail("megad accepted the job but sent back no job id");
    } else {
      char escaped_name[512];
      view_escape(j->name, escaped_name, sizeof escaped_name);
      printf("submitted %s%s%s%s: %s", j->id, escaped_name[0] ? " (" : "", escaped_name,
             escaped_name[0] ? ")" : "", view_state_name(j->state));
      if (j->world_size)
        printf(", world %u = TP %u x PP %u x DP %u", j->world_size, j->tp, j->pp, j->dp);
      printf(", %" PRIu64 " iterations\n", j->train_iters);
      printf("watch it with: megactl watch %s\n", j->id);
      printf("%s\n", j->id);
    }
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  mega_jobspec_argv_free(args);
  return rc;
}

/* ---------------------------------------------------------------- status */

int megactl_status(int argc, char **argv) {
  megactl_common cf;
  int rc = megactl_parse_common("status", argc, argv, true, true, &cf, NULL, NULL);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl status JOB [--json] [--server ADDR]\n\n"
           "Shows one job: its state (and why it failed), world and parallel layout,\n"
           "progress, restarts, the newest checkpoint, times, placement, flags, and its\n"
           "history of events: the first ones and the newest, and a line saying how many\n"
           "megad left out between them (a long job's). --json prints the Job message as\n"
           "JSON (fields under their mega.proto names) with the history as \"events\"\n"
           "(each with time_unix_ms, kind, message, node_id and number) and\n"
           "\"events_left_out\". Any node of the cluster answers.\n");
    return 0;
  }
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)cf.job;
  if (megactl_unary(cf.server, &mega_control_get_job, &req.base, MEGACTL_TIMEOUT_MS, &out, &err) != MEGA_OK) {
    rc = megactl_job_error(cf.job, &err);
  } else {
    const Mega__V1__GetJobResponse *r = (const void *)out;
    const Mega__V1__Job *j = r->job;
    if (!j) {
      rc = megactl_fail("megad answered GetJob without a job");
    } else if (cf.json) {
      json_t *o = mega_pb_json(&j->base), *ev = json_array();
      for (size_t i = 0; o && ev && i < r->n_events; i++)
        json_array_append_new(ev, mega_pb_json(&r->events[i]->base));
      if (o && ev) json_object_set_new(o, "events", ev);
      else json_decref(ev);
      if (o) json_object_set_new(o, "events_left_out", json_integer((json_int_t)r->events_left_out));
      rc = megactl_print_json(o, JSON_INDENT(2));
    } else {
      tables_job_detail(stdout, j, megactl_now_ms());
      if (r->n_events) printf("events\n");
      view_opts vo = {0};
      for (size_t i = 0; i < r->n_events; i++) {
        /* megad keeps a job's first and newest events: a jump in their
         * numbers is where it left some out */
        uint64_t before = i ? r->events[i - 1]->number : 0, n = r->events[i]->number;
        if (n > before + 1)
          printf("  ... %" PRIu64 " event%s left out ...\n", n - before - 1,
                 n - before - 1 == 1 ? "" : "s");
        printf("  ");
        view_event_line(stdout, r->events[i], &vo);
      }
    }
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}

/* ---------------------------------------------------------------- ls */

/* Index k is Mega__V1__JobState k. */
static const char *const state_names[] = {"", "pending", "running", "succeeded", "failed",
                                          "cancelled", "restarting", "stopped"};
_Static_assert(MEGA__V1__JOB_STATE__JOB_STATE_STOPPED == 7 &&
                   sizeof state_names / sizeof *state_names == 8,
               "ls --state names every job state");

typedef struct ls_opts {
  Mega__V1__JobState states[16];
  size_t n_states;
  uint32_t limit;
} ls_opts;

static int ls_extra(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  ls_opts *o = ctx;
  const char *v;
  int r = megactl_flag_value(cmd, argc, argv, i, "--state", &v);
  if (r > 0) {
    /* "running,pending" or repeated flags */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
      size_t k = 1;
      while (k < sizeof state_names / sizeof *state_names && strcmp(w, state_names[k])) k++;
      if (k == sizeof state_names / sizeof *state_names) {
        megactl_usage(cmd,
                      "--state: '%s' is not a job state (pending, running, succeeded, failed, "
                      "cancelled, restarting, stopped)",
                      w);
        return -1;
      }
      if (o->n_states < sizeof o->states / sizeof *o->states)
        o->states[o->n_states++] = (Mega__V1__JobState)k;
    }
    return 1;
  }
  if (r < 0) return r;
  r = megactl_flag_value(cmd, argc, argv, i, "--limit", &v);
  if (r > 0 && !megactl_parse_count(v, &o->limit)) {
    megactl_usage(cmd, "--limit: '%s' is not a positive integer", v);
    return -1;
  }
  return r;
}

int megactl_ls(int argc, char **argv) {
  megactl_common cf;
  ls_opts o = {0};
  int rc = megactl_parse_common("ls", argc, argv, false, true, &cf, ls_extra, &o);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl ls [--state S[,S...]] [--limit N] [--json] [--server ADDR]\n\n"
           "Lists the cluster's jobs, newest first: id, name, state, world, TP/PP/DP,\n"
           "iteration/train-iters and age. Any node answers for every node (a node that is\n"
           "down or does not answer in 2 s is named on stderr: its jobs are missing). A state\n"
           "with '?' is a copy: the job's coordinator does not answer (etcd keeps the copy).\n\n"
           "  --state S   only jobs in these states (pending, running, succeeded, failed,\n"
           "              cancelled, restarting, stopped); comma-separated or repeated\n"
           "  --limit N   at most N jobs, the newest of the whole cluster\n"
           "  --json      a JSON array of Job messages (fields under their mega.proto names)\n");
    return 0;
  }
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  req.n_states = o.n_states;
  req.states = o.states;
  req.limit = o.limit;
  if (megactl_unary(cf.server, &mega_control_list_jobs, &req.base, MEGACTL_TIMEOUT_MS, &out, &err) != MEGA_OK) {
    rc = megactl_fail("%s", err.msg);
  } else {
    const Mega__V1__ListJobsResponse *r = (const void *)out;
    if (cf.json) {
      json_t *a = json_array();
      for (size_t i = 0; a && i < r->n_jobs; i++)
        if (json_array_append_new(a, mega_pb_json(&r->jobs[i]->base)) != 0) {
          json_decref(a);
          a = NULL;
        }
      rc = megactl_print_json(a, JSON_INDENT(2));
    } else {
      tables_jobs(stdout, r->jobs, r->n_jobs, megactl_now_ms());
    }
    for (size_t i = 0; i < r->n_unanswered; i++)
      fprintf(stderr, "megactl: node %s did not answer; its jobs are not listed\n",
              r->unanswered[i]);
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}

/* ---------------------------------------------------------------- cancel */

typedef struct cancel_opts {
  const char *reason;
  bool all_pending;
  const char **ids;
  size_t n;
} cancel_opts;

/* --reason, --all-pending, and the job ids (several) */
static int cancel_extra(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  cancel_opts *o = ctx;
  if (!strcmp(argv[*i], "--all-pending")) {
    o->all_pending = true;
    (*i)++;
    return 1;
  }
  int r = megactl_flag_value(cmd, argc, argv, i, "--reason", &o->reason);
  if (r || megactl_is_flag(argv[*i])) return r;
  o->ids[o->n++] = argv[(*i)++];
  return 1;
}

static int cancel_one(const char *server, const char *id, const char *reason) {
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  req.reason = (char *)reason;
  int rc = 0;
  /* a job whose coordinator is gone (etcd) is taken over within seconds:
   * wait for that rather than fail (megad says "ask again") */
  int64_t t0 = megactl_now_ms();
  bool said = false;
  mega_status called;
  while ((called = megactl_unary(server, &mega_control_cancel_job, &req.base, MEGACTL_TIMEOUT_MS,
                                 &out, &err)) == MEGA_ERR_PEER &&
         strstr(err.msg, "so ask again") && megactl_now_ms() - t0 < CANCEL_WAIT_MS) {
    if (!said) fprintf(stderr, "megactl: %s; waiting\n", err.msg);
    said = true;
    usleep(500 * 1000);
  }
  if (called != MEGA_OK) {
    rc = megactl_job_error(id, &err);
  } else {
    const Mega__V1__CancelJobResponse *r = (const void *)out;
    const Mega__V1__Job *j = r->job;
    Mega__V1__JobState st = j ? j->state : MEGA__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
    if (r->already_over) /* ended before this call, cancelled included */
      printf("%s already %s; nothing to cancel\n", id, view_state_name(st));
    else if (st == MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED)
      printf("cancelled %s\n", id);
    else if (st == MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
             st == MEGA__V1__JOB_STATE__JOB_STATE_FAILED ||
             st == MEGA__V1__JOB_STATE__JOB_STATE_STOPPED)
      printf("%s already %s; nothing to cancel\n", id, view_state_name(st));
    else
      printf("cancelling %s (now %s)\n", id, view_state_name(st));
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}

int megactl_cancel(int argc, char **argv) {
  megactl_common cf;
  cancel_opts o = {.reason = "", .ids = calloc((size_t)argc + 1, sizeof(char *))};
  if (!o.ids) return megactl_fail("out of memory");
  int rc = megactl_parse_common("cancel", argc, argv, false, false, &cf, cancel_extra, &o);
  if (!rc && cf.help) {
    printf("usage: megactl cancel JOB... [--reason R] [--server ADDR]\n"
           "       megactl cancel --all-pending [--reason R] [--server ADDR]\n\n"
           "Cancels jobs: megad stops their workers and marks them cancelled. The reason is\n"
           "shown in each job's events. --all-pending cancels every job still waiting to\n"
           "start (on the node that answers and the jobs it knows).\n");
  } else if (!rc && !o.n && !o.all_pending) {
    rc = megactl_usage("cancel", "which job? give its id, e.g. j-1, or --all-pending");
  } else if (!rc && o.n && o.all_pending) {
    rc = megactl_usage("cancel", "give job ids or --all-pending, not both");
  }
  if (rc || cf.help) {
    free(o.ids);
    return rc;
  }
  Mega__V1__ListJobsResponse *pending = NULL;
  if (o.all_pending) {
    Mega__V1__JobState want = MEGA__V1__JOB_STATE__JOB_STATE_PENDING;
    Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
    req.states = &want;
    req.n_states = 1;
    mega_err err = {0};
    ProtobufCMessage *out = NULL;
    if (megactl_unary(cf.server, &mega_control_list_jobs, &req.base, MEGACTL_TIMEOUT_MS, &out,
                      &err) != MEGA_OK) {
      free(o.ids);
      return megactl_fail("%s", err.msg);
    }
    pending = (Mega__V1__ListJobsResponse *)out;
    const char **ids = realloc(o.ids, (pending->n_jobs + 1) * sizeof *ids);
    if (!ids) {
      protobuf_c_message_free_unpacked(out, NULL);
      free(o.ids);
      return megactl_fail("out of memory");
    }
    o.ids = ids;
    for (size_t i = 0; i < pending->n_jobs; i++) o.ids[o.n++] = pending->jobs[i]->id;
    if (!o.n) printf("no pending jobs\n");
  }
  for (size_t i = 0; i < o.n; i++)
    if (cancel_one(cf.server, o.ids[i], o.reason)) rc = MEGACTL_EXIT_FAIL;
  if (pending) protobuf_c_message_free_unpacked(&pending->base, NULL);
  free(o.ids);
  return rc;
}

/* ---------------------------------------------------------------- resume, rescale */

static void print_job_line(const char *verb, const Mega__V1__Job *j) {
  printf("%s %s: %s", verb, j->id, view_state_name(j->state));
  if (j->checkpoint_iteration)
    printf(", from the checkpoint of iteration %" PRIu64, j->checkpoint_iteration);
  printf("\n");
}

int megactl_resume(int argc, char **argv) {
  megactl_common cf;
  int rc = megactl_parse_common("resume", argc, argv, true, false, &cf, NULL, NULL);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl resume JOB [--server ADDR]\n\n"
           "Restarts a failed or stopped job from its newest complete checkpoint, as a new\n"
           "attempt (from the start when it has none). Follow it with megactl watch JOB.\n");
    return 0;
  }
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__ResumeJobRequest req = MEGA__V1__RESUME_JOB_REQUEST__INIT;
  req.job_id = (char *)cf.job;
  if (megactl_unary(cf.server, &mega_control_resume_job, &req.base, MEGACTL_TIMEOUT_MS, &out,
                    &err) != MEGA_OK)
    rc = megactl_job_error(cf.job, &err);
  else
    print_job_line("resumed", ((Mega__V1__ResumeJobResponse *)out)->job);
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}

static int rescale_extra(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  return megactl_flag_value(cmd, argc, argv, i, "--nnodes", (const char **)ctx);
}

int megactl_rescale(int argc, char **argv) {
  megactl_common cf;
  const char *nnodes = NULL;
  int rc = megactl_parse_common("rescale", argc, argv, true, false, &cf, rescale_extra, &nnodes);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl rescale JOB --nnodes N [--server ADDR]\n\n"
           "Re-plans a running job on N nodes (within its --nnodes MIN:MAX) at its next\n"
           "checkpoint: it goes on from that checkpoint with the data-parallel size N nodes\n"
           "give, and the same global batch. The job then stays at N nodes.\n");
    return 0;
  }
  uint32_t n = 0;
  if (!nnodes) return megactl_usage("rescale", "--nnodes N is required");
  if (!megactl_parse_count(nnodes, &n))
    return megactl_usage("rescale", "--nnodes: '%s' is not a positive integer", nnodes);
  mega_err err = {0};
  ProtobufCMessage *out = NULL;
  Mega__V1__RescaleJobRequest req = MEGA__V1__RESCALE_JOB_REQUEST__INIT;
  req.job_id = (char *)cf.job;
  req.nnodes = n;
  if (megactl_unary(cf.server, &mega_control_rescale_job, &req.base, MEGACTL_TIMEOUT_MS, &out,
                    &err) != MEGA_OK) {
    rc = megactl_job_error(cf.job, &err);
  } else {
    const Mega__V1__Job *j = ((Mega__V1__RescaleJobResponse *)out)->job;
    printf("%s will re-plan on %u node%s at its next checkpoint (now %u)\n", j->id, n,
           n == 1 ? "" : "s", (unsigned)j->n_placement);
  }
  if (out) protobuf_c_message_free_unpacked(out, NULL);
  return rc;
}
