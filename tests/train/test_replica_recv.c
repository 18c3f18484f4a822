/* What donors send a rank that recovers from replicas, read by
 * worker/rank/replica_recv.c from a file as it would be from the socket:
 * the parameters from one donor and the moments in halves from another
 * fill the rank; a piece sent twice (so that the totals still add up while
 * a tensor is never written), a piece whose offset wraps past the end of
 * the numbers, and an empty piece are refused and write nothing outside
 * the tensors. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "worker/rank/replica_recv.h"

enum { NT = 2, LEN = 4, PAD = 4, KINDS = 3 };
#define END 0
#define PARAM MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_PARAM
#define AVG MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_EXP_AVG
#define SQ MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_EXP_AVG_SQ

/* Each buffer sits between PAD floats that must stay 0. */
static float arena[NT][KINDS][PAD + LEN + PAD];
static mega_ckpt_param params[NT];
static mega_backend *be;
static FILE *out; /* the donors' bytes, in order */

static int setup(void **state) {
  (void)state;
  memset(arena, 0, sizeof arena);
  for (int t = 0; t < NT; t++)
    params[t] = (mega_ckpt_param){.name = t ? "ln.b" : "wte", .ndim = 1, .shape = {LEN},
                                  .numel = LEN, .param = arena[t][0] + PAD,
                                  .exp_avg = arena[t][1] + PAD, .exp_avg_sq = arena[t][2] + PAD};
  mega_err err = {0};
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  out = tmpfile();
  assert_non_null(out);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  mega_backend_destroy(be);
  fclose(out);
  return 0;
}

static void frame(const ProtobufCMessage *m) {
  fflush(out);
  mega_err err = {0};
  assert_int_equal(mega_frame_write(fileno(out), m, 0, &err), MEGA_OK);
}

static void header(int donor) {
  Mega__V1__ReplicaHeader h = MEGA__V1__REPLICA_HEADER__INIT;
  h.job_id = "j-1";
  h.attempt = 2;
  h.rank = (uint32_t)donor;
  h.iteration = 9;
  h.optimizer_steps = 9;
  h.eval_done = 1;
  h.ntensors = NT;
  frame(&h.base);
}

/* A piece of count floats, value kind * 100 + tensor * 10 + element. */
static void piece(int kind, uint64_t tensor, uint64_t offset, uint64_t count) {
  Mega__V1__ReplicaPiece p = MEGA__V1__REPLICA_PIECE__INIT;
  p.kind = (Mega__V1__ReplicaPieceKind)kind;
  p.tensor = tensor;
  p.offset = offset;
  p.count = count;
  frame(&p.base);
  for (uint64_t i = 0; i < count && kind != END; i++) {
    float x = (float)(kind * 100 + (int)tensor * 10) + (float)(offset + i);
    assert_int_equal(write(fileno(out), &x, sizeof x), sizeof x);
  }
}

/* Reads every donor written so far; the first refusal's status. */
static mega_status receive(mega_replica_recv *rv, int donors, mega_err *err) {
  fflush(out);
  int fd = dup(fileno(out));
  assert_true(fd >= 0);
  lseek(fd, 0, SEEK_SET);
  mega_status st = MEGA_OK;
  for (int d = 0; d < donors && st == MEGA_OK; d++) {
    mega_replica_want want = {.job_id = "j-1", .attempt = 2, .donor_rank = d, .iteration = 9};
    st = mega_replica_recv_stream(rv, fd, &want, "donor", err);
  }
  close(fd);
  return st;
}

static void assert_nothing_outside(void) {
  for (int t = 0; t < NT; t++)
    for (int k = 0; k < KINDS; k++)
      for (int i = 0; i < PAD; i++) {
        assert_true(arena[t][k][i] == 0);
        assert_true(arena[t][k][PAD + LEN + i] == 0);
      }
}

static void test_two_donors_fill_the_rank(void **state) {
  (void)state;
  header(0);
  for (int t = 0; t < NT; t++) piece(PARAM, (uint64_t)t, 0, LEN);
  piece(END, 0, 0, 0);
  header(1);
  for (int t = 0; t < NT; t++)
    for (int kind = AVG; kind <= SQ; kind++) {
      piece(kind, (uint64_t)t, LEN / 2, LEN - LEN / 2);
      piece(kind, (uint64_t)t, 0, LEN / 2);
    }
  piece(END, 0, 0, 0);
  mega_replica_recv rv;
  mega_err err = {0};
  assert_int_equal(mega_replica_recv_init(&rv, params, NT, be, false, &err), MEGA_OK);
  if (receive(&rv, 2, &err) != MEGA_OK || mega_replica_recv_whole(&rv, &err) != MEGA_OK)
    fail_msg("%s", err.msg);
  assert_int_equal(rv.steps, 9);
  assert_int_equal(rv.eval_done, 1);
  assert_int_equal(rv.bytes, NT * KINDS * LEN * sizeof(float));
  for (int t = 0; t < NT; t++)
    for (int k = 0; k < KINDS; k++)
      for (int i = 0; i < LEN; i++)
        assert_true(arena[t][k][PAD + i] == (float)((k + 1) * 100 + t * 10 + i));
  assert_nothing_outside();
  mega_replica_recv_free(&rv);
}

/* Refused with words in the message, nothing written outside. */
static void assert_refused(const char *words) {
  mega_replica_recv rv;
  mega_err err = {0};
  assert_int_equal(mega_replica_recv_init(&rv, params, NT, be, false, &err), MEGA_OK);
  mega_status st = receive(&rv, 1, &err);
  if (st == MEGA_OK) st = mega_replica_recv_whole(&rv, &err);
  assert_int_equal(st, MEGA_ERR_PEER);
  if (!strstr(err.msg, words)) fail_msg("'%s' does not say '%s'", err.msg, words);
  assert_nothing_outside();
  mega_replica_recv_free(&rv);
}

/* Everything, but wte's parameters twice and ln.b's never: the counts
 * alone add up. */
static void test_a_piece_sent_twice_is_refused(void **state) {
  (void)state;
  header(0);
  piece(PARAM, 0, 0, LEN);
  piece(PARAM, 0, 1, LEN - 1);
  piece(PARAM, 0, 0, 1);
  for (int t = 0; t < NT; t++)
    for (int kind = AVG; kind <= SQ; kind++) piece(kind, (uint64_t)t, 0, LEN);
  piece(END, 0, 0, 0);
  assert_refused("sent floats 1..3 of wte again");
}

static void test_an_offset_that_wraps_is_refused(void **state) {
  (void)state;
  header(0);
  piece(PARAM, 1, UINT64_MAX, 2); /* offset + count is 1 */
  piece(END, 0, 0, 0);
  assert_refused("a piece out of bounds");
}

static void test_an_empty_piece_is_refused(void **state) {
  (void)state;
  header(0);
  piece(PARAM, 0, 0, 0);
  piece(END, 0, 0, 0);
  assert_refused("a piece out of bounds");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_donors_fill_the_rank, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_piece_sent_twice_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_offset_that_wraps_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_empty_piece_is_refused, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
