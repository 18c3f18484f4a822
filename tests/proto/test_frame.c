/* Worker pipe framing: encode, the incremental decoder under every chunking,
 * and the blocking reader and writer on a real pipe. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/frame.h"
#include "proto/mega.pb-c.h"

/* Three frames of different shapes: a hello, a step report with spans, and
 * a KV wait, packed back to back. */
typedef struct stream3 {
  uint8_t *bytes;
  size_t len;
  size_t ends[3]; /* offset just past each frame */
} stream3;

static void make_stream(stream3 *s) {
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  uint8_t *parts[3];
  size_t lens[3];
  mega_err err;

  Mega__V1__WorkerHello hello = MEGA__V1__WORKER_HELLO__INIT;
  hello.rank = 7;
  hello.pid = 4242;
  hello.version = "0.1.0";
  hello.device = "cpu";
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_HELLO;
  f.hello = &hello;
  assert_int_equal(mega_frame_encode(&f.base, 0, &parts[0], &lens[0], &err), MEGA_OK);

  Mega__V1__StepReport step = MEGA__V1__STEP_REPORT__INIT;
  Mega__V1__RankMetrics rm = MEGA__V1__RANK_METRICS__INIT;
  Mega__V1__ActionSpan spans[40], *sp[40];
  char names[40][16];
  for (int i = 0; i < 40; i++) {
    mega__v1__action_span__init(&spans[i]);
    snprintf(names[i], sizeof names[i], "F%d.0", i);
    spans[i].name = names[i];
    spans[i].cat = "compute";
    spans[i].start_us = i * 100.0;
    spans[i].dur_us = 90.0;
    sp[i] = &spans[i];
  }
  rm.rank = 7;
  rm.pp_rank = 3;
  rm.bubble_s = 0.25;
  step.iteration = 12;
  step.metrics = &rm;
  step.has_loss = 1;
  step.loss = 3.5;
  step.n_spans = 40;
  step.spans = sp;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_STEP;
  f.step = &step;
  assert_int_equal(mega_frame_encode(&f.base, 0, &parts[1], &lens[1], &err), MEGA_OK);

  Mega__V1__KvRequest kv = MEGA__V1__KV_REQUEST__INIT;
  Mega__V1__KvWaitRequest wait = MEGA__V1__KV_WAIT_REQUEST__INIT;
  char *keys[] = {"j-1/0/rank0", "j-1/0/rank1"};
  wait.n_keys = 2;
  wait.keys = keys;
  wait.timeout_ms = 30000;
  kv.request_id = 99;
  kv.op_case = MEGA__V1__KV_REQUEST__OP_WAIT;
  kv.wait = &wait;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_KV;
  f.kv = &kv;
  assert_int_equal(mega_frame_encode(&f.base, 0, &parts[2], &lens[2], &err), MEGA_OK);

  s->len = lens[0] + lens[1] + lens[2];
  s->bytes = malloc(s->len);
  size_t off = 0;
  for (int i = 0; i < 3; i++) {
    memcpy(s->bytes + off, parts[i], lens[i]);
    off += lens[i];
    s->ends[i] = off;
    free(parts[i]);
  }
}

static void check_frame(int i, ProtobufCMessage *m) {
  Mega__V1__WorkerFrame *f = (void *)m;
  switch (i) {
  case 0:
    assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_HELLO);
    assert_int_equal(f->hello->rank, 7);
    assert_int_equal(f->hello->pid, 4242);
    assert_string_equal(f->hello->device, "cpu");
    break;
  case 1:
    assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_STEP);
    assert_int_equal(f->step->iteration, 12);
    assert_true(f->step->has_loss);
    assert_true(f->step->loss == 3.5);
    assert_int_equal(f->step->metrics->pp_rank, 3);
    assert_int_equal(f->step->n_spans, 40);
    assert_string_equal(f->step->spans[39]->name, "F39.0");
    break;
  default:
    assert_int_equal(f->msg_case, MEGA__V1__WORKER_FRAME__MSG_KV);
    assert_int_equal(f->kv->request_id, 99);
    assert_int_equal(f->kv->op_case, MEGA__V1__KV_REQUEST__OP_WAIT);
    assert_string_equal(f->kv->wait->keys[1], "j-1/0/rank1");
  }
}

/* Feeds s in chunks cut at a (and b), draining after each; returns how many
 * frames came out, checking each. */
static int feed_split(const stream3 *s, size_t a, size_t b) {
  mega_frame_decoder d;
  mega_frame_decoder_init(&d, &mega__v1__worker_frame__descriptor, 0);
  size_t cuts[] = {0, a, b, s->len};
  int got = 0;
  mega_err err;
  for (int c = 0; c < 3; c++) {
    assert_int_equal(
        mega_frame_decoder_feed(&d, s->bytes + cuts[c], cuts[c + 1] - cuts[c], &err), MEGA_OK);
    ProtobufCMessage *m;
    for (;;) {
      assert_int_equal(mega_frame_decoder_next(&d, &m, &err), MEGA_OK);
      if (!m) break;
      check_frame(got, m);
      assert_true(cuts[c + 1] >= s->ends[got]); /* never before its last byte */
      got++;
      protobuf_c_message_free_unpacked(m, NULL);
    }
  }
  assert_int_equal(mega_frame_decoder_end(&d, &err), MEGA_OK);
  assert_int_equal(mega_frame_decoder_pending(&d), 0);
  mega_frame_decoder_free(&d);
  return got;
}

static void test_every_two_cut_chunking(void **state) {
  (void)state;
  stream3 s;
  make_stream(&s);
  /* Every single cut, and two cuts at every pair of frame-boundary
   * neighbourhoods (where off-by-ones live) plus a stride through the rest. */
  for (size_t a = 0; a <= s.len; a++) assert_int_equal(feed_split(&s, a, a), 3);
  size_t near[32], nn = 0;
  for (int f = 0; f < 3; f++)
    for (int d = -5; d <= 5; d++) {
      long p = (long)s.ends[f] + d;
      if (p >= 0 && (size_t)p <= s.len && nn < 32) near[nn++] = (size_t)p;
    }
  for (size_t i = 0; i < nn; i++)
    for (size_t b = near[i]; b <= s.len; b++) assert_int_equal(feed_split(&s, near[i], b), 3);
  for (size_t a = 0; a <= s.len; a += 7)
    for (size_t b = a; b <= s.len; b += 11) assert_int_equal(feed_split(&s, a, b), 3);
  free(s.bytes);
}

static void test_byte_at_a_time(void **state) {
  (void)state;
  stream3 s;
  make_stream(&s);
  mega_frame_decoder d;
  mega_frame_decoder_init(&d, &mega__v1__worker_frame__descriptor, 0);
  mega_err err;
  int got = 0;
  for (size_t i = 0; i < s.len; i++) {
    assert_int_equal(mega_frame_decoder_feed(&d, s.bytes + i, 1, &err), MEGA_OK);
    ProtobufCMessage *m;
    assert_int_equal(mega_frame_decoder_next(&d, &m, &err), MEGA_OK);
    if (m) {
      assert_int_equal(i + 1, s.ends[got]); /* exactly at its last byte */
      check_frame(got++, m);
      protobuf_c_message_free_unpacked(m, NULL);
    }
  }
  assert_int_equal(got, 3);
  mega_frame_decoder_free(&d);
  free(s.bytes);
}

static void test_oversized_length_rejected_early(void **state) {
  (void)state;
  mega_frame_decoder d;
  mega_frame_decoder_init(&d, &mega__v1__worker_frame__descriptor, 1024);
  /* A header claiming 3 GB: an error from the header alone. */
  const uint8_t hdr[4] = {0x00, 0x00, 0x00, 0xc0};
  mega_err err;
  assert_int_equal(mega_frame_decoder_feed(&d, hdr, 4, &err), MEGA_OK);
  ProtobufCMessage *m;
  assert_int_equal(mega_frame_decoder_next(&d, &m, &err), MEGA_ERR_INVALID);
  assert_null(m);
  assert_string_equal(err.msg,
                      "a mega.v1.WorkerFrame frame of 3221225472 bytes exceeds the limit of 1024 "
                      "bytes (garbage on the pipe, or a message that needs a bigger limit)");
  /* Sticky: the stream is out of step. */
  assert_int_equal(mega_frame_decoder_feed(&d, hdr, 4, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_frame_decoder_next(&d, &m, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_frame_decoder_end(&d, &err), MEGA_ERR_INVALID);
  mega_frame_decoder_free(&d);

  /* The encoder refuses too. */
  Mega__V1__WorkerFrame f = MEGA__V1__WORKER_FRAME__INIT;
  Mega__V1__WorkerError we = MEGA__V1__WORKER_ERROR__INIT;
  char big[2048];
  memset(big, 'e', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  we.message = big;
  f.msg_case = MEGA__V1__WORKER_FRAME__MSG_ERROR;
  f.error = &we;
  uint8_t *buf;
  size_t len;
  assert_int_equal(mega_frame_encode(&f.base, 1024, &buf, &len, &err), MEGA_ERR_INVALID);
  assert_null(buf);
}

static void test_truncated_input(void **state) {
  (void)state;
  stream3 s;
  make_stream(&s);
  mega_err err;
  /* Cut inside the header of frame 2, then inside its body. */
  size_t cuts[] = {s.ends[0] + 2, s.ends[1] - 5};
  const char *want[] = {"the pipe closed in the middle of a frame header (2 of 4 bytes)",
                        "the pipe closed in the middle of a frame"};
  for (int k = 0; k < 2; k++) {
    mega_frame_decoder d;
    mega_frame_decoder_init(&d, &mega__v1__worker_frame__descriptor, 0);
    assert_int_equal(mega_frame_decoder_feed(&d, s.bytes, cuts[k], &err), MEGA_OK);
    ProtobufCMessage *m;
    int got = 0;
    while (mega_frame_decoder_next(&d, &m, &err) == MEGA_OK && m) {
      got++;
      protobuf_c_message_free_unpacked(m, NULL);
    }
    assert_int_equal(got, 1);
    assert_int_equal(mega_frame_decoder_end(&d, &err), MEGA_ERR_IO);
    assert_int_equal(strncmp(err.msg, want[k], strlen(want[k])), 0);
    mega_frame_decoder_free(&d);
  }
  free(s.bytes);
}

static void test_garbage_never_crashes(void **state) {
  (void)state;
  unsigned seed = 1;
  int errors = 0, frames = 0;
  for (int round = 0; round < 300; round++) {
    uint8_t junk[512];
    size_t n = (size_t)(rand_r(&seed) % sizeof junk);
    for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)rand_r(&seed);
    if (round % 3 == 0 && n >= 4) { /* plausible small lengths, garbage bodies */
      junk[0] = (uint8_t)(rand_r(&seed) % 64);
      junk[1] = junk[2] = junk[3] = 0;
    }
    mega_frame_decoder d;
    mega_frame_decoder_init(&d, &mega__v1__worker_frame__descriptor, 4096);
    mega_err err;
    size_t off = 0;
    mega_status st = MEGA_OK;
    while (off < n && st == MEGA_OK) {
      size_t c = 1 + (size_t)(rand_r(&seed) % 37);
      if (c > n - off) c = n - off;
      st = mega_frame_decoder_feed(&d, junk + off, c, &err);
      off += c;
      ProtobufCMessage *m;
      while (st == MEGA_OK && (st = mega_frame_decoder_next(&d, &m, &err)) == MEGA_OK && m) {
        frames++;
        protobuf_c_message_free_unpacked(m, NULL);
      }
    }
    if (st != MEGA_OK) {
      errors++;
      assert_true(err.msg[0] != '\0');
      assert_true(st == MEGA_ERR_INVALID);
    }
    assert_true(mega_frame_decoder_pending(&d) <= 4096 + 4 + 37);
    mega_frame_decoder_free(&d);
  }
  assert_true(errors > 100); /* most garbage is caught, and none crashed */
  (void)frames;
}

/* Bootstrap's kv_address (2) is reserved: no field by that name or
 * number, and an older megad's Bootstrap that still carries it unpacks
 * with the fields that remain intact. */
static void test_bootstrap_kv_address_reserved(void **state) {
  (void)state;
  const ProtobufCMessageDescriptor *d = &mega__v1__bootstrap__descriptor;
  assert_null(protobuf_c_message_descriptor_get_field_by_name(d, "kv_address"));
  assert_null(protobuf_c_message_descriptor_get_field(d, 2));
  /* kv_address "h:1" (2), kv_prefix "p/" (3), kv_timeout_ms 7 (4) */
  static const uint8_t old[] = {0x12, 3, 'h', ':', '1', 0x1a, 2, 'p', '/', 0x20, 7};
  Mega__V1__Bootstrap *b = mega__v1__bootstrap__unpack(NULL, sizeof old, old);
  assert_non_null(b);
  assert_string_equal(b->kv_prefix, "p/");
  assert_int_equal(b->kv_timeout_ms, 7);
  mega__v1__bootstrap__free_unpacked(b, NULL);
}

static void test_blocking_pipe_round_trip(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  int p[2];
  assert_int_equal(pipe(p), 0);
  mega_err err;
  Mega__V1__DaemonFrame f = MEGA__V1__DAEMON_FRAME__INIT;
  Mega__V1__Assignment a = MEGA__V1__ASSIGNMENT__INIT;
  Mega__V1__Bootstrap b = MEGA__V1__BOOTSTRAP__INIT;
  char *args[] = {"--pipeline-model-parallel-size", "2", "--num-layers", "4"};
  a.job_id = "j-3";
  a.n_args = 4;
  a.args = args;
  a.rank = 1;
  a.world_size = 2;
  a.pp = 2;
  a.tp = a.dp = 1;
  a.device = -1;
  b.kv_prefix = "j-3/0/";
  a.bootstrap = &b;
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ASSIGNMENT;
  f.assignment = &a;
  assert_int_equal(mega_frame_write(p[1], &f.base, 0, &err), MEGA_OK);
  Mega__V1__Abort ab = MEGA__V1__ABORT__INIT;
  ab.reason = "rank 0 exited";
  f.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ABORT;
  f.abort = &ab;
  assert_int_equal(mega_frame_write(p[1], &f.base, 0, &err), MEGA_OK);
  close(p[1]);

  ProtobufCMessage *m;
  assert_int_equal(mega_frame_read(p[0], &mega__v1__daemon_frame__descriptor, 0, &m, &err),
                   MEGA_OK);
  Mega__V1__DaemonFrame *g = (void *)m;
  assert_int_equal(g->msg_case, MEGA__V1__DAEMON_FRAME__MSG_ASSIGNMENT);
  assert_string_equal(g->assignment->args[3], "4");
  assert_int_equal(g->assignment->device, -1);
  assert_string_equal(g->assignment->bootstrap->kv_prefix, "j-3/0/");
  protobuf_c_message_free_unpacked(m, NULL);
  assert_int_equal(mega_frame_read(p[0], &mega__v1__daemon_frame__descriptor, 0, &m, &err),
                   MEGA_OK);
  assert_string_equal(((Mega__V1__DaemonFrame *)m)->abort->reason, "rank 0 exited");
  protobuf_c_message_free_unpacked(m, NULL);
  /* Closed between frames: a clean end. */
  assert_int_equal(mega_frame_read(p[0], &mega__v1__daemon_frame__descriptor, 0, &m, &err),
                   MEGA_OK);
  assert_null(m);
  close(p[0]);

  /* Truncated and oversized on a pipe. */
  assert_int_equal(pipe(p), 0);
  const uint8_t part[] = {10, 0, 0, 0, 0x0a, 0x02};
  assert_int_equal(write(p[1], part, sizeof part), (ssize_t)sizeof part);
  close(p[1]);
  assert_int_equal(mega_frame_read(p[0], &mega__v1__daemon_frame__descriptor, 0, &m, &err),
                   MEGA_ERR_IO);
  assert_string_equal(err.msg, "the pipe closed in the middle of a frame (2 of 10 bytes)");
  close(p[0]);
  assert_int_equal(pipe(p), 0);
  const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f};
  assert_int_equal(write(p[1], huge, sizeof huge), (ssize_t)sizeof huge);
  assert_int_equal(mega_frame_read(p[0], &mega__v1__daemon_frame__descriptor, 0, &m, &err),
                   MEGA_ERR_INVALID);
  close(p[0]);
  /* Writing to a pipe nobody reads: an error, not SIGPIPE. */
  assert_int_equal(mega_frame_write(p[1], &f.base, 0, &err), MEGA_ERR_IO);
  assert_string_equal(err.msg, "cannot write a frame: the other end closed the pipe");
  close(p[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_two_cut_chunking),
      cmocka_unit_test(test_byte_at_a_time),
      cmocka_unit_test(test_oversized_length_rejected_early),
      cmocka_unit_test(test_truncated_input),
      cmocka_unit_test(test_garbage_never_crashes),
      cmocka_unit_test(test_blocking_pipe_round_trip),
      cmocka_unit_test(test_bootstrap_kv_address_reserved),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
