/* megad's operations end to end: FIFO queueing on busy slots, the Chrome
 * trace and GetTrace, GET /metrics, sd_notify, a watcher too slow to keep
 * up, and `megad run` stopped by a signal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <jansson.h>

#include "core/trace.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

/* Two jobs that each need both slots: the second waits PENDING, then runs. */
static void test_fifo_when_slots_are_busy(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "f1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, d.dir, 30, extra);
  char a[64], b[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, a, sizeof a, &err), MEGA_OK);
  assert_int_equal(hd_submit(&d, &spec, b, sizeof b, &err), MEGA_OK);
  Mega__V1__Job *jb = hd_get_job(&d, b, &err);
  assert_non_null(jb);
  assert_int_equal(jb->state, STATE(PENDING));
  protobuf_c_message_free_unpacked(&jb->base, NULL);
  hd_watch w;
  hd_watch_job(&d, b, true, 60000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  assert_non_null(strstr(w.events_text, "waiting: "));
  Mega__V1__Job *ja = hd_get_job(&d, a, &err);
  assert_int_equal(ja->state, STATE(SUCCEEDED));
  /* b started only after a had ended */
  assert_true(w.final->started_unix_ms >= ja->ended_unix_ms);
  protobuf_c_message_free_unpacked(&ja->base, NULL);
  hd_watch_free(&w);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* The job's trace through GetTrace, parsed. */
static json_t *fetch_trace(hd *d, const char *id) {
  Mega__V1__GetTraceRequest req = MEGA__V1__GET_TRACE_REQUEST__INIT;
  req.job_id = (char *)id;
  mega_err err = {0};
  mega_rpc_stream *s = NULL;
  ProtobufCMessage *m = NULL;
  assert_int_equal(mega_rpc_stream_open(d->ch, &mega_control_get_trace, &req.base, 5000, &s, &err),
                   MEGA_OK);
  size_t len = 0, total = 0, cap = 1 << 20;
  char *buf = malloc(cap);
  while (mega_rpc_stream_next(s, &m, &err) == MEGA_OK && m) {
    Mega__V1__TraceChunk *c = (void *)m;
    total = c->total_bytes;
    if (len + c->data.len + 1 > cap) buf = realloc(buf, cap = 2 * (len + c->data.len + 1));
    memcpy(buf + len, c->data.data, c->data.len);
    len += c->data.len;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  mega_rpc_stream_close(s);
  assert_int_equal(err.status, MEGA_OK);
  assert_int_equal(len, total);
  buf[len] = '\0';
  json_error_t je;
  json_t *t = json_loads(buf, 0, &je);
  free(buf);
  assert_non_null(t);
  return t;
}

/* --trace-iteration: one Chrome trace, one track per rank, via GetTrace. */
static void test_trace(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "t1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--trace-iteration", "2", NULL};
  hd_tiny_spec(&spec, d.dir, 3, extra);
  char id[64];
  mega_err err = {0};
  Mega__V1__GetTraceRequest req = MEGA__V1__GET_TRACE_REQUEST__INIT;
  req.job_id = "j-9-nope";
  mega_rpc_stream *s = NULL;
  ProtobufCMessage *m = NULL;
  assert_int_equal(mega_rpc_stream_open(d.ch, &mega_control_get_trace, &req.base, 5000, &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_rpc_stream_next(s, &m, &err), MEGA_ERR_NOT_FOUND);
  mega_rpc_stream_close(s);

  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, id, true, 60000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  assert_non_null(strstr(w.events_text, "trace of iteration 2 written"));
  hd_watch_free(&w);

  json_t *t = fetch_trace(&d, id);
  json_t *evs = json_object_get(t, "traceEvents");
  /* tracks 0 and 1: the ranks' actions; 2 and 3: their communicators (the
   * tied embedding's exchange between the two stages) */
  int tracks[4] = {0, 0, 0, 0}, spans = 0;
  for (size_t i = 0; i < json_array_size(evs); i++) {
    json_t *e = json_array_get(evs, i);
    const char *ph = json_string_value(json_object_get(e, "ph"));
    const char *cat = json_string_value(json_object_get(e, "cat"));
    json_int_t tid = json_integer_value(json_object_get(e, "tid"));
    if (ph && !strcmp(ph, "X") && tid >= 0 && tid < 4) {
      assert_true((tid >= 2) == mega_trace_cat_is_comm(cat));
      tracks[tid]++;
      spans++;
    }
  }
  assert_true(tracks[0] > 0 && tracks[1] > 0 && tracks[2] > 0 && tracks[3] > 0);
  json_decref(t);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* The spans of every track nest: each one ends before the next starts or
 * holds it whole, the outer written first where they start together, as Chrome's trace format wants of one thread's complete
 * events (Perfetto drops or misdraws one that overlaps another partly).
 * With data parallelism and --overlap-grad-reduce a rank's reductions queue
 * behind one another and the schedule's GWs wait past the last one's end,
 * which once put the norm's span across a GW's and the queued buckets
 * across the running ones on one track. */
static void test_trace_spans_nest(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "t1", 4, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--overlap-grad-reduce",
                         "--trace-iteration", "2", NULL};
  hd_tiny_spec(&spec, d.dir, 3, extra);
  spec.nproc_per_node = 4;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, id, true, 60000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(SUCCEEDED));
  hd_watch_free(&w);
  json_t *t = fetch_trace(&d, id);
  json_t *evs = json_object_get(t, "traceEvents");
  enum { TRACKS = 64, SPANS = 512 };
  static double sp[TRACKS][SPANS][2];
  int n[TRACKS] = {0}, comm = 0;
  for (size_t i = 0; i < json_array_size(evs); i++) {
    json_t *e = json_array_get(evs, i);
    const char *ph = json_string_value(json_object_get(e, "ph"));
    json_int_t tid = json_integer_value(json_object_get(e, "tid"));
    if (!ph || strcmp(ph, "X")) continue;
    assert_true(tid >= 0 && tid < TRACKS && n[tid] < SPANS);
    double ts = json_number_value(json_object_get(e, "ts"));
    double dur = json_number_value(json_object_get(e, "dur"));
    assert_true(dur >= 0);
    comm += mega_trace_cat_is_comm(json_string_value(json_object_get(e, "cat")));
    sp[tid][n[tid]][0] = ts;
    sp[tid][n[tid]++][1] = ts + dur;
  }
  assert_true(comm > 0); /* the reductions are there */
  for (int k = 0; k < TRACKS; k++)
    for (int a = 0; a < n[k]; a++)
      for (int b = 0; b < n[k]; b++) {
        const double *x = sp[k][a], *y = sp[k][b];
        /* y starts inside x: then it ends inside x too (a tolerance of a
         * microsecond's thousandth for the doubles) */
        if (a != b && y[0] > x[0] && y[0] < x[1] - 1e-3 && y[1] > x[1] + 1e-3)
          fail_msg("track %d: [%.3f, %.3f] and [%.3f, %.3f] overlap partly", k, x[0], x[1],
                   y[0], y[1]);
        /* two that start together: the one written first holds the other
         * (a viewer opens them in the file's order) */
        if (a < b && fabs(y[0] - x[0]) < 1e-3 && y[1] > x[1] + 1e-3)
          fail_msg("track %d: [%.3f, %.3f] is written before [%.3f, %.3f], which holds it", k,
                   x[0], x[1], y[0], y[1]);
      }
  json_decref(t);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

typedef struct metrics_seen {
  hd *d;
  int port;
  char *running; /* the page while the job ran */
  int held;      /* its workers, stopped while the page was read */
} metrics_seen;

/* The page at the first step, the job's worker stopped meanwhile: the tiny
 * job trains its 20 iterations in tens of milliseconds, and on a loaded
 * machine it once ended before megad served the page ("running" 0). */
static void fetch_on_step(void *arg, const Mega__V1__WatchJobResponse *item) {
  metrics_seen *m = arg;
  if (item->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP || m->running) return;
  pid_t pids[64];
  m->held = hd_workers(m->d, pids, 64);
  for (int i = 0; i < m->held; i++) kill(pids[i], SIGSTOP);
  m->running = hd_http_get(m->port, "/metrics", NULL);
  for (int i = 0; i < m->held; i++) kill(pids[i], SIGCONT);
}

/* Enough iterations that the first step reaches the test well before the
 * last one is trained. */
#define METRICS_ITERS 200

/* GET /metrics: Prometheus text. A running job has series by its id (never
 * by its user-given name); a finished one leaves only the counters. */
static void test_metrics_page(void **state) {
  (void)state;
  int port = hd_free_port();
  char maddr[64];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
  const char *extra[] = {"--metrics-listen", maddr, NULL};
  hd d;
  assert_true(hd_start(&d, "m1", 1, NULL, NULL, extra));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, METRICS_ITERS, NULL);
  spec.name = "user-name";
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  metrics_seen m = {.d = &d, .port = port};
  hd_watch w;
  hd_watch_job_cb(&d, id, false, 60000, &w, fetch_on_step, &m);
  assert_true(hd_succeeded(&d, &w));
  hd_watch_free(&w);

  char want[160];
  assert_non_null(m.running);
  if (m.held != 1) fprintf(stderr, "the job had %d workers when its first step came\n", m.held);
  assert_int_equal(m.held, 1); /* still running: its worker was there to hold */
  assert_non_null(strstr(m.running, " 200 OK\r\n"));
  assert_non_null(strstr(m.running, "mega_jobs{state=\"running\"} 1\n"));
  snprintf(want, sizeof want, "mega_job_iteration{job=\"%s\"} ", id);
  assert_non_null(strstr(m.running, want));
  snprintf(want, sizeof want, "mega_job_loss{job=\"%s\"} ", id);
  assert_non_null(strstr(m.running, want));
  snprintf(want, sizeof want, "mega_job_stage_bubble_ratio{job=\"%s\",stage=\"0\"} ", id);
  assert_non_null(strstr(m.running, want));
  snprintf(want, sizeof want, "mega_job_tokens_per_second{job=\"%s\"} ", id);
  assert_non_null(strstr(m.running, want));
  /* the merge's own clock, in seconds (an hour either way: never the machine's speed) */
  snprintf(want, sizeof want, "mega_job_last_step_timestamp_seconds{job=\"%s\"} ", id);
  const char *at = strstr(m.running, want);
  assert_non_null(at);
  double merged = strtod(at + strlen(want), NULL);
  assert_true(fabs(merged - (double)time(NULL)) < 3600);
  assert_null(strstr(m.running, "user-name"));
  free(m.running);

  char *page = hd_http_get(m.port, "/metrics", NULL);
  assert_non_null(strstr(page, " 200 OK\r\n"));
  assert_non_null(strstr(page, "Content-Type: text/plain; version=0.0.4"));
  assert_non_null(strstr(page, "\nmega_jobs{state=\"succeeded\"} 1\n"));
  assert_non_null(strstr(page, "\nmega_jobs_submitted_total 1\n"));
  assert_non_null(strstr(page, "\nmega_jobs_finished_total{state=\"succeeded\"} 1\n"));
  snprintf(want, sizeof want, "\nmega_steps_merged_total %d\n", METRICS_ITERS);
  assert_non_null(strstr(page, want));
  snprintf(want, sizeof want, "\nmega_step_report_delay_seconds_count %d\n", METRICS_ITERS);
  assert_non_null(strstr(page, want));
  assert_non_null(
      strstr(page, "\nmega_rpc_served_total{method=\"/mega.v1.Control/SubmitJob\"} 1\n"));
  assert_null(strstr(page, "\nmega_worker_steps_relayed_total 0\n"));
  assert_non_null(strstr(page, "\nprocess_resident_memory_bytes "));
  assert_non_null(strstr(page, "\nprocess_open_fds "));
  assert_null(strstr(page, id)); /* the job is over: no series of its own */
  free(page);

  page = hd_http_get(m.port, "/nope", NULL);
  assert_non_null(strstr(page, " 404 "));
  free(page);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* Under systemd: READY=1 with a status, WATCHDOG=1 at half the interval,
 * STOPPING=1 on the way out. A datagram socket plays systemd. */
static void test_sd_notify(void **state) {
  (void)state;
  char dir[128];
  hd_tmpdir(dir, sizeof dir);
  char path[100];
  snprintf(path, sizeof path, "%.80s/notify", dir);
  int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un su = {.sun_family = AF_UNIX};
  snprintf(su.sun_path, sizeof su.sun_path, "%s", path);
  assert_int_equal(bind(s, (struct sockaddr *)&su, sizeof su), 0);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setenv("NOTIFY_SOCKET", path, 1);
  setenv("WATCHDOG_USEC", "200000", 1);
  hd d;
  bool up = hd_start(&d, "s1", 1, NULL, NULL, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  assert_true(up);
  char msg[512];
  bool ready = false;
  int watchdogs = 0;
  double t0 = hd_now_s();
  while (hd_now_s() - t0 < 3 && watchdogs < 3) {
    ssize_t n = recv(s, msg, sizeof msg - 1, 0);
    if (n <= 0) break;
    msg[n] = '\0';
    if (strstr(msg, "READY=1")) {
      ready = true;
      assert_non_null(strstr(msg, "STATUS=node s1 listening on"));
    }
    if (strstr(msg, "WATCHDOG=1")) watchdogs++;
  }
  assert_true(ready);
  assert_int_equal(watchdogs, 3);
  kill(d.pid, SIGTERM);
  bool stopping = false;
  for (int i = 0; i < 50 && !stopping; i++) {
    ssize_t n = recv(s, msg, sizeof msg - 1, 0);
    if (n <= 0) break;
    msg[n] = '\0';
    stopping = strstr(msg, "STOPPING=1") != NULL;
  }
  assert_true(stopping);
  assert_int_equal(hd_stop(&d), 0);
  close(s);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* A watcher that stops reading (a stopped process: its socket fills, and
 * HTTP/2 flow control holds megad's sends) is skipped steps once it is far
 * behind, and told so: a gap marker counts every step it missed, so the
 * steps it got plus the missed ones are all of them, and the stream still
 * ends with the job's final state. The job and a watcher that keeps up
 * carry on, missing nothing. The slow watcher is this program run again in
 * --slow-watcher mode, since gRPC does not survive fork alone. */
typedef struct watch_thread {
  hd *d;
  const char *id;
  hd_watch w;
} watch_thread;

static void *watch_main(void *arg) {
  watch_thread *t = arg;
  hd_watch_job(t->d, t->id, true, 120000, &t->w);
  return NULL;
}

/* --slow-watcher ADDR JOB: a WatchJob client on gRPC core directly, with a
 * small flow-control window and no BDP probing (what a slow link looks
 * like), so megad's sends back up instead of vanishing into buffers. It
 * reads one item, says "ready", lags (reads nothing) until SIGUSR1, then reads to
 * the end and prints "steps S missed M gaps G final F code C: details". */
static volatile sig_atomic_t told_to_read;
static void tell_to_read(int sig) { (void)sig; told_to_read = 1; }

/* Reads nothing until SIGUSR1, but keeps polling: the transport answers
 * megad's keepalive pings (a stopped process would be cut off after 40 s
 * on a slow machine) while the stream's window stays shut. */
static void lag_until_told(grpc_completion_queue *cq) {
  while (!told_to_read) {
    gpr_timespec t =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(100, GPR_TIMESPAN));
    grpc_completion_queue_pluck(cq, (void *)99, t, NULL); /* no such tag: a poll */
  }
}

static int slow_watcher(const char *addr, const char *job) {
  signal(SIGUSR1, tell_to_read);
  grpc_init();
  grpc_arg args[2];
  memset(args, 0, sizeof args);
  args[0].type = args[1].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_HTTP2_BDP_PROBE;
  args[0].value.integer = 0;
  args[1].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
  args[1].value.integer = 4096;
  grpc_channel_args ca = {2, args};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_channel *ch = grpc_channel_create(addr, creds, &ca);
  grpc_channel_credentials_release(creds);
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice method = grpc_slice_from_static_string(mega_control_watch_job.path);
  grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                             gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  req.replay = true; /* from the first step: what came before the watch counts too */
  size_t len = protobuf_c_message_get_packed_size(&req.base);
  grpc_slice body = grpc_slice_malloc(len);
  protobuf_c_message_pack(&req.base, GRPC_SLICE_START_PTR(body));
  grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
  grpc_slice_unref(body);
  grpc_metadata_array md, trailing;
  grpc_metadata_array_init(&md);
  grpc_metadata_array_init(&trailing);
  grpc_status_code code = GRPC_STATUS_OK;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  if (grpc_call_start_batch(call, ops, 4, (void *)1, NULL) != GRPC_CALL_OK) return 1;
  grpc_completion_queue_pluck(cq, (void *)1, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_byte_buffer_destroy(send);
  int items = 0, steps = 0, gaps = 0, final = 0;
  unsigned long long missed = 0;
  for (;;) {
    grpc_byte_buffer *got = NULL;
    grpc_op r;
    memset(&r, 0, sizeof r);
    r.op = GRPC_OP_RECV_MESSAGE;
    r.data.recv_message.recv_message = &got;
    if (grpc_call_start_batch(call, &r, 1, (void *)2, NULL) != GRPC_CALL_OK) break;
    grpc_completion_queue_pluck(cq, (void *)2, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!got) break;
    grpc_byte_buffer_reader rd;
    grpc_byte_buffer_reader_init(&rd, got);
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    Mega__V1__WatchJobResponse *m = mega__v1__watch_job_response__unpack(
        NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    if (m && m->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) steps++;
    if (m && m->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE) final++;
    if (m && m->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_GAP) {
      gaps++;
      missed += m->gap->missed_steps;
    }
    if (m) mega__v1__watch_job_response__free_unpacked(m, NULL);
    grpc_byte_buffer_destroy(got);
    if (++items == 1) {
      printf("ready\n");
      fflush(stdout);
      lag_until_told(cq);
    }
  }
  grpc_op st;
  memset(&st, 0, sizeof st);
  st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  st.data.recv_status_on_client.trailing_metadata = &trailing;
  st.data.recv_status_on_client.status = &code;
  st.data.recv_status_on_client.status_details = &details;
  grpc_call_start_batch(call, &st, 1, (void *)3, NULL);
  grpc_completion_queue_pluck(cq, (void *)3, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  char *d = grpc_slice_to_c_string(details);
  printf("steps %d missed %llu gaps %d final %d code %d: %s\n", steps, missed, gaps, final,
         (int)code, d);
  fflush(stdout);
  gpr_free(d);
  _exit(0); /* the test needs the line, not a tidy gRPC shutdown */
}

static const char *self_exe;

static void test_slow_watcher_told_of_gap(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "w1", 2, NULL, NULL, NULL));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "0:0", NULL};
  hd_tiny_spec(&spec, d.dir, 4000, extra);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);

  int out[2];
  assert_int_equal(pipe(out), 0);
  pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(self_exe, self_exe, "--slow-watcher", d.addr, id, (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  FILE *f = fdopen(out[0], "r");
  char line[512] = "";
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "ready\n");

  watch_thread fast = {&d, id, {0}};
  pthread_t th;
  pthread_create(&th, NULL, watch_main, &fast);
  pthread_join(th, NULL);
  kill(child, SIGUSR1);
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  waitpid(child, NULL, 0);
  fprintf(stderr, "slow watcher: %s", line);
  assert_non_null(fast.w.final);
  assert_int_equal(fast.w.final->state, STATE(SUCCEEDED));
  assert_int_equal(fast.w.steps, 4000); /* the one that kept up missed nothing */
  hd_watch_free(&fast.w);
  int steps = 0, gaps = 0, final = 0, code = -1;
  unsigned long long missed = 0;
  assert_int_equal(sscanf(line, "steps %d missed %llu gaps %d final %d code %d", &steps, &missed,
                          &gaps, &final, &code), 5);
  assert_int_equal(code, MEGA_RPC_OK);
  assert_int_equal(final, 1);
  assert_true(gaps >= 1);
  assert_true(missed > 0);
  assert_int_equal((unsigned long long)steps + missed, 4000); /* nothing lost silently */
  /* a replay of the ended job: 4000 steps are more than megad keeps, but
   * only steps went (its events once went with them), and one gap says so */
  hd_watch r;
  hd_watch_job(&d, id, true, 30000, &r);
  assert_int_equal(r.end, MEGA_OK);
  assert_non_null(r.final);
  if (!strstr(r.events_text, "submitted") || r.events < 3)
    fail_msg("the replay lost events (%d): %s", r.events, r.events_text);
  assert_int_equal(r.gaps, 1);
  assert_true(r.missed > 0);
  assert_int_equal((uint64_t)r.steps + r.missed, 4000);
  hd_watch_free(&r);
  assert_int_equal(hd_stop(&d), 0);
  hd_cleanup(&d);
}

/* megad run stopped by a signal: the job is cancelled, no worker is left,
 * and megad exits 128 + sig. */
static void run_signalled(int sig) {
  char dir[128];
  hd_tmpdir(dir, sizeof dir);
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", "--simulate-compute", "5:10", NULL};
  hd_tiny_spec(&spec, dir, 100000, extra);
  const char *argv[64];
  int n = 0;
  argv[n++] = getenv("MEGAD");
  argv[n++] = "run";
  argv[n++] = "--slots";
  argv[n++] = "2";
  argv[n++] = "--json";
  argv[n++] = "--worker";
  argv[n++] = getenv("MEGAW");
  for (size_t i = 0; i < spec.n_args; i++) argv[n++] = spec.args[i];
  argv[n] = NULL;
  int out[2];
  assert_int_equal(pipe(out), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execv(argv[0], (char **)argv);
    _exit(127);
  }
  close(out[1]);
  FILE *f = fdopen(out[0], "r");
  char line[8192];
  assert_non_null(fgets(line, sizeof line, f)); /* training has begun */
  hd fake = {.pid = pid};
  pid_t workers[64];
  int nw = hd_workers(&fake, workers, 64);
  assert_int_equal(nw, 2);
  kill(pid, sig);
  while (fgets(line, sizeof line, f)) {
  }
  fclose(f);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 128 + sig);
  for (int i = 0; i < nw; i++) assert_false(hd_pid_alive(workers[i]));
  hd_rmdir(dir);
}

/* SIGINT (^C), and SIGHUP (its terminal closed), stop the job in order */
static void test_run_interrupted(void **state) {
  (void)state;
  run_signalled(SIGINT);
  run_signalled(SIGHUP);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc == 4 && !strcmp(argv[1], "--slow-watcher")) return slow_watcher(argv[2], argv[3]);
  self_exe = argv[0];
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_fifo_when_slots_are_busy, teardown),
      cmocka_unit_test_teardown(test_trace, teardown),
      cmocka_unit_test_teardown(test_trace_spans_nest, teardown),
      cmocka_unit_test_teardown(test_metrics_page, teardown),
      cmocka_unit_test_teardown(test_sd_notify, teardown),
      cmocka_unit_test_teardown(test_slow_watcher_told_of_gap, teardown),
      cmocka_unit_test_teardown(test_run_interrupted, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
