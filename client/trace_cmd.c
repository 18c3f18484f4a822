/* megactl trace: download a job's Chrome trace (Control.GetTrace). The file
 * is written beside its final name (FILE.part) and renamed at the end, so a
 * failed download never leaves a truncated trace under that name; a failed
 * or interrupted one (SIGINT, SIGTERM, SIGHUP) removes FILE.part. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/commands.h"
#include "client/conn.h"

static int trace_extra(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  int r = megactl_flag_value(cmd, argc, argv, i, "-o", (const char **)ctx);
  return r ? r : megactl_flag_value(cmd, argc, argv, i, "--output", (const char **)ctx);
}

/* A NOT_FOUND from GetTrace means no job, or a job without a trace: ask
 * GetJob which, so the message says the right one. */
static int not_found(mega_rpc_channel *ch, const char *job, const mega_err *trace_err) {
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  ProtobufCMessage *out = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(ch, &mega_control_get_job, &req.base, MEGACTL_TIMEOUT_MS, &out, &err) !=
      MEGA_OK)
    return megactl_job_error(job, &err);
  protobuf_c_message_free_unpacked(out, NULL);
  return megactl_fail("%s", trace_err->msg);
}

/* Streams the trace into f; returns the exit status. */
static int download(mega_rpc_channel *ch, const char *job, FILE *f, const char *path,
                    uint64_t *bytes) {
  Mega__V1__GetTraceRequest req = MEGA__V1__GET_TRACE_REQUEST__INIT;
  req.job_id = (char *)job;
  mega_rpc_stream *s = NULL;
  mega_err err = {0};
  if (mega_rpc_stream_open(ch, &mega_control_get_trace, &req.base, 0, &s, &err) != MEGA_OK)
    return megactl_fail("%s", err.msg);
  int rc = 0;
  uint64_t total = 0;
  for (;;) {
    ProtobufCMessage *m = NULL;
    if (mega_rpc_stream_next(s, &m, &err) != MEGA_OK) {
      rc = err.status == MEGA_ERR_NOT_FOUND ? not_found(ch, job, &err) : megactl_fail("%s", err.msg);
      break;
    }
    if (!m) break;
    const Mega__V1__TraceChunk *c = (const void *)m;
    total = c->total_bytes;
    if (c->data.len && fwrite(c->data.data, 1, c->data.len, f) != c->data.len)
      rc = megactl_fail("cannot write %s: %s", path, strerror(errno));
    *bytes += c->data.len;
    protobuf_c_message_free_unpacked(m, NULL);
    if (rc) break;
  }
  mega_rpc_stream_close(s);
  if (!rc && total && *bytes != total)
    rc = megactl_fail("the trace of %s ended after %" PRIu64 " of %" PRIu64 " bytes", job, *bytes,
                      total);
  return rc;
}

/* The .part file being written, for the handler: an interrupted download
 * (Ctrl-C, a kill) removes it, then dies of the signal as it would have. */
static char part_path[1024];
static const int part_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction part_saved[3];

static void remove_part(int sig) {
  unlink(part_path);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* on: the handler for part_signals; off: what was there before. A signal
 * this process ignores (nohup, a background job's SIGINT) stays ignored. */
static void guard_part(bool on) {
  struct sigaction sa = {.sa_handler = remove_part};
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < 3; k++) {
    if (!on) {
      sigaction(part_signals[k], &part_saved[k], NULL);
      continue;
    }
    sigaction(part_signals[k], NULL, &part_saved[k]);
    if (part_saved[k].sa_handler != SIG_IGN) sigaction(part_signals[k], &sa, NULL);
  }
}

int megactl_trace(int argc, char **argv) {
  megactl_common cf;
  const char *output = NULL;
  int rc = megactl_parse_common("trace", argc, argv, true, false, &cf, trace_extra, &output);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl trace JOB [-o FILE] [--server ADDR]\n\n"
           "Downloads the Chrome trace (Trace Event Format JSON) of a job that ran with\n"
           "--trace-iteration N, to FILE (default: JOB-trace.json; '-' for stdout). Open it\n"
           "in chrome://tracing or https://ui.perfetto.dev.\n");
    return 0;
  }
  char def[512], *tmp = part_path;
  if (!output) {
    snprintf(def, sizeof def, "%s-trace.json", cf.job);
    output = def;
  }
  bool to_stdout = !strcmp(output, "-");
  mega_err err = {0};
  mega_rpc_channel *ch = NULL;
  if (megactl_connect(cf.server, &ch, &err) != MEGA_OK) return megactl_fail("%s", err.msg);
  FILE *f = stdout;
  if (!to_stdout) {
    snprintf(tmp, sizeof part_path, "%s.part", output);
    guard_part(true);
    if (!(f = fopen(tmp, "wb"))) {
      guard_part(false);
      mega_rpc_channel_free(ch);
      return megactl_fail("cannot create %s: %s", tmp, strerror(errno));
    }
  }
  uint64_t bytes = 0;
  rc = download(ch, cf.job, f, to_stdout ? "stdout" : tmp, &bytes);
  mega_rpc_channel_free(ch);
  if (to_stdout) {
    if (fflush(stdout) != 0 && !rc) rc = megactl_fail("cannot write stdout: %s", strerror(errno));
    return rc;
  }
  if (fclose(f) != 0 && !rc) rc = megactl_fail("cannot write %s: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, output) != 0)
    rc = megactl_fail("cannot rename %s to %s: %s", tmp, output, strerror(errno));
  if (rc) unlink(tmp);
  guard_part(false);
  if (rc) return rc;
  printf("wrote %s (%" PRIu64 " bytes)\n", output, bytes);
  return 0;
}
