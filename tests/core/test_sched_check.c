/* The validator: each broken schedule is refused with a message that names
 * the rank and the action. Also phases, peak in-flight and the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/schedule.h"

#define HEADER_1F1B_PP2_M2 "mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2\n"
#define GOOD_RANK0 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n"
#define GOOD_RANK1 "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n"

#define LITERAL_INTERLEAVED                                                                     \
  "mega-schedule v1 kind=interleaved pp=2 vp=2 microbatches=4 group=2\n"                        \
  "0: F0.0 SF0.0 F1.0 SF1.0 RF0.1 F0.1 SF0.1 RF1.1 F1.1 SF1.1 F2.0 SF2.0 RB0.1 B0.1 SB0.1 F3.0 "  \
  "SF3.0 RB1.1 B1.1 SB1.1 RF2.1 F2.1 SF2.1 RB0.0 B0.0 RF3.1 F3.1 SF3.1 RB1.0 B1.0 RB2.1 B2.1 "    \
  "SB2.1 RB3.1 B3.1 SB3.1 RB2.0 B2.0 RB3.0 B3.0\n"                                               \
  "1: RF0.0 F0.0 SF0.0 RF1.0 F1.0 SF1.0 RF0.1 F0.1 B0.1 SB0.1 RF1.1 F1.1 B1.1 SB1.1 RF2.0 F2.0 "  \
  "SF2.0 RB0.0 B0.0 SB0.0 RF3.0 F3.0 SF3.0 RB1.0 B1.0 SB1.0 RF2.1 F2.1 B2.1 SB2.1 RF3.1 F3.1 "    \
  "B3.1 SB3.1 RB2.0 B2.0 SB2.0 RB3.0 B3.0 SB3.0\n"

/* Parses text (which must parse) and validates it; want is NULL for a
 * valid schedule, else a part of the expected message. */
static void check(const char *text, const char *want) {
  mega_schedule s;
  mega_err err = {0};
  if (mega_sched_parse(text, &s, &err) != MEGA_OK) fail_msg("parse: %s", err.msg);
  mega_status st = mega_sched_validate(&s, &err);
  mega_sched_free(&s);
  if (!want) {
    if (st != MEGA_OK) fail_msg("valid schedule refused: %s", err.msg);
    return;
  }
  if (st != MEGA_ERR_INVALID) fail_msg("accepted, but wanted '%s'", want);
  if (!strstr(err.msg, want)) fail_msg("message '%s' lacks '%s'", err.msg, want);
}

static void a_sound_schedule_validates(void **state) {
  (void)state;
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 GOOD_RANK1, NULL);
  /* Receives may come early, as long as they pair up in order. */
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 RB1.0 B0.0 B1.0\n"
                           "1: RF0.0 RF1.0 F0.0 B0.0 SB0.0 F1.0 B1.0 SB1.0\n",
        NULL);
  /* B and W apart; zb-h1 at pp=1 allows one activation, custom M*vp. */
  check("mega-schedule v1 kind=custom pp=1 vp=1 microbatches=2 group=1\n"
        "0: F0.0 B0.0 F1.0 B1.0 W0.0 W1.0\n",
        NULL);
  check("mega-schedule v1 kind=zb-h1 pp=1 vp=1 microbatches=2 group=1\n"
        "0: F0.0 B0.0 F1.0 B1.0 W0.0 W1.0\n",
        "rank 0, action 2 (F1.0): 2 activations in flight, more than the bound of 1 for zb-h1");
}

/* GS/GW: one of each per chunk after its last backward, or none. */
static void grad_sync_actions(void **state) {
  (void)state;
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0 GW0.0\n"
                           "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 GS0.0 SB1.0 GW0.0\n",
        NULL);
  /* a rank may have none while another has them */
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0 GS0.0 GW0.0\n",
        NULL);
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 GS0.0 RB1.0 B1.0 GW0.0\n" GOOD_RANK1,
        "rank 0, action 6 (GS0.0): launches chunk 0's gradient reduction before its last backward "
        "(1 of 2 done)");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0 GS0.0 GW0.0\n"
                           GOOD_RANK1,
        "rank 0, action 9 (GS0.0): chunk 0's gradient reduction is launched twice");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GW0.0 GS0.0\n" GOOD_RANK1,
        "rank 0, action 8 (GW0.0): waits for chunk 0's gradient reduction before its GS");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0\n" GOOD_RANK1,
        "rank 0 has gradient-sync actions but no GW for chunk 0");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS1.0 GW1.0\n" GOOD_RANK1,
        "per chunk and name microbatch 0 (GS0.0)");
  /* with W's the last W completes the gradients */
  check("mega-schedule v1 kind=custom pp=1 vp=1 microbatches=2 group=1\n"
        "0: F0.0 B0.0 F1.0 B1.0 W0.0 GS0.0 W1.0 GW0.0\n",
        "before its last backward (1 of 2 done); a GS goes after the chunk's last W");
  check("mega-schedule v1 kind=custom pp=1 vp=1 microbatches=2 group=1\n"
        "0: F0.0 B0.0 F1.0 B1.0 W0.0 W1.0 GS0.0 GW0.0\n",
        NULL);
  check("mega-schedule v1 kind=forward-only pp=1 vp=1 microbatches=1 group=1\n0: F0.0 GS0.0 GW0.0\n",
        "a forward-only schedule has no backward, weight-gradient or gradient-sync actions");
}

static void per_rank_mistakes(void **state) {
  (void)state;
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F0.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0, action 2 (F0.0): forwarded twice");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 RB0.0 B0.0\n" GOOD_RANK1, "rank 0 never runs F1.0");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 0 (F0.0): not preceded by RF0.0, the receive of its input");
  check(HEADER_1F1B_PP2_M2 "0: RF0.0 F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0, action 0 (RF0.0): stray receive: the first virtual stage has no previous stage");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 1 (RF0.0): the input of this forward is received twice");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 B0.0 F0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 1 (B0.0): runs before its forward F0.0");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0, action 4 (B0.0): not preceded by RB0.0, the receive of its output gradient");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 RB0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 2 (RB0.0): stray receive: the last virtual stage has no next stage");
  check(HEADER_1F1B_PP2_M2 "0: SF0.0 F0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0, action 0 (SF0.0): sends before F0.0 produced it");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 SF0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 2 (SF0.0): stray send: the last virtual stage has no next stage");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 SB0.0 B0.0 RF1.0 F1.0 B1.0 SB1.0\n",
        "rank 1, action 2 (SB0.0): sends before B0.0 produced it");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 RB0.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0 never sends its forward output (SF1.0)");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0\n",
        "rank 1 never sends its input gradient (SB1.0)");
  check(HEADER_1F1B_PP2_M2 GOOD_RANK0 "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0\n",
        "rank 1 never runs B1.0");
  check("mega-schedule v1 kind=zb-h1 pp=1 vp=1 microbatches=1 group=1\n0: F0.0 W0.0 B0.0\n",
        "rank 0, action 1 (W0.0): runs before its backward B0.0");
  check("mega-schedule v1 kind=zb-h1 pp=1 vp=1 microbatches=2 group=1\n"
        "0: F0.0 B0.0 W0.0 F1.0 B1.0\n",
        "rank 0 has W actions but not W1.0; a rank has a W for every B or for none");
  check("mega-schedule v1 kind=zb-h1 pp=1 vp=1 microbatches=1 group=1\n0: F0.0 B0.0 W0.0 W0.0\n",
        "rank 0, action 3 (W0.0): weight gradient computed twice");
  check("mega-schedule v1 kind=forward-only pp=1 vp=1 microbatches=1 group=1\n0: F0.0 B0.0\n",
        "rank 0, action 1 (B0.0): a forward-only schedule has no backward");
}

static void messages_pair_in_order(void **state) {
  (void)state;
  /* Rank 0 sends microbatch 1 first, rank 1 expects microbatch 0 first. */
  check(HEADER_1F1B_PP2_M2 "0: F0.0 F1.0 SF1.0 SF0.0 RB0.0 B0.0 RB1.0 B1.0\n" GOOD_RANK1,
        "rank 0, action 2 (SF1.0) pairs with rank 1, action 0 (RF0.0): the 1st forward message "
        "from rank 0 to rank 1");
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 F1.0 SF1.0 RB1.0 RB0.0 B0.0 B1.0\n" GOOD_RANK1,
        "rank 1, action 3 (SB0.0) pairs with rank 0, action 4 (RB1.0): the 1st backward message "
        "from rank 1 to rank 0");
}

static void deadlocks_name_every_stuck_rank(void **state) {
  (void)state;
  /* Rank 0 waits for B0's gradient before sending F1's output; rank 1
   * wants F1 before it runs B0. */
  check(HEADER_1F1B_PP2_M2 "0: F0.0 SF0.0 RB0.0 B0.0 F1.0 SF1.0 RB1.0 B1.0\n"
                           "1: RF0.0 F0.0 RF1.0 F1.0 B0.0 SB0.0 B1.0 SB1.0\n",
        "deadlock: rank 0 waits at RB0.0 (action 2), rank 1 waits at RF1.0 (action 2)");
  /* Rendezvous only: Megatron's interleaved order for PP=2 VP=2 M=4 N=2
   * with each receive right before its consumer. With buffered sends it
   * would run (test_sim runs it); under NCCL's rendezvous rank 0's step
   * SB0.1 needs rank 1's RB0.0, which comes after rank 1's step SB1.1 RF2.0,
   * which needs rank 0's RB1.1, which comes after SB0.1. */
  check(LITERAL_INTERLEAVED,
        "deadlock: rank 0 waits at SB0.1 (action 14), rank 1 waits at SB1.1 (action 13)");
}

static void the_memory_bound_is_enforced(void **state) {
  (void)state;
  mega_sched_params p = {MEGA_SCHED_GPIPE, 2, 1, 3, 0};
  mega_schedule s;
  mega_err err = {0};
  assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_OK);
  s.kind = MEGA_SCHED_1F1B; /* GPipe's order breaks 1F1B's memory bound */
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "rank 0, action 4 (F2.0): 3 activations in flight, more than the "
                               "bound of 2 for 1f1b");
  s.kind = MEGA_SCHED_CUSTOM; /* custom: only M*vp */
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_OK);
  mega_sched_free(&s);
}

static void malformed_values_are_refused(void **state) {
  (void)state;
  mega_schedule s;
  mega_err err = {0};
  assert_int_equal(mega_sched_parse(HEADER_1F1B_PP2_M2 GOOD_RANK0 GOOD_RANK1, &s, &err), MEGA_OK);
  s.ranks[1].acts[3].mb = 99; /* written directly, past mega_sched_push */
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "rank 1, action 3 (SB99.0): out of range for microbatches=2 vp=1");
  s.ranks[1].acts[3].mb = 0;
  s.ranks[1].acts[3].kind = 42;
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "rank 1, action 3: unknown action kind 42");
  mega_sched_free(&s);
  mega_schedule empty = {0};
  assert_int_equal(mega_sched_validate(&empty, &err), MEGA_ERR_INVALID);
}

static void phases_peak_and_bound(void **state) {
  (void)state;
  mega_schedule s;
  mega_err err = {0};
  assert_int_equal(mega_sched_parse(HEADER_1F1B_PP2_M2 GOOD_RANK0 GOOD_RANK1, &s, &err), MEGA_OK);
  assert_int_equal(mega_sched_peak_inflight(&s, 0), 2);
  assert_int_equal(mega_sched_peak_inflight(&s, 1), 1);
  mega_phases ph = mega_sched_phases(&s, 0);
  assert_int_equal(ph.warmup, 1);
  assert_int_equal(ph.steady, 1);
  assert_int_equal(ph.cooldown, 1);
  ph = mega_sched_phases(&s, 7); /* out of range: zeros */
  assert_int_equal(ph.warmup + ph.steady + ph.cooldown, 0);
  mega_sched_free(&s);

  /* ZB-H1 counts an activation until its W. */
  assert_int_equal(mega_sched_parse("mega-schedule v1 kind=zb-h1 pp=1 vp=1 microbatches=3 group=1\n"
                                    "0: F0.0 B0.0 F1.0 B1.0 F2.0 W0.0 B2.0 W1.0 W2.0\n",
                                    &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_sched_peak_inflight(&s, 0), 3);
  mega_sched_free(&s);

  static const struct {
    mega_sched_kind kind;
    int vp, group, bound[4];
  } bounds[] = {
      {MEGA_SCHED_1F1B, 1, 0, {4, 3, 2, 1}},
      {MEGA_SCHED_ZB_H1, 1, 0, {4, 4, 4, 4}},
      {MEGA_SCHED_GPIPE, 1, 0, {8, 8, 8, 8}},
      {MEGA_SCHED_INTERLEAVED, 2, 4, {11, 9, 7, 5}}, /* (3-r)*2 + 4, plus one */
      {MEGA_SCHED_FORWARD_ONLY, 1, 0, {1, 1, 1, 1}},
  };
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
    mega_sched_params p = {bounds[i].kind, 4, bounds[i].vp, 8, bounds[i].group};
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
    for (int r = 0; r < 4; r++) assert_int_equal(mega_sched_inflight_bound(&s, r), bounds[i].bound[r]);
    s.kind = MEGA_SCHED_CUSTOM;
    assert_int_equal(mega_sched_inflight_bound(&s, 0), 8 * bounds[i].vp);
    mega_sched_free(&s);
  }
  mega_sched_params np = {MEGA_SCHED_NO_PIPELINING, 1, 1, 5, 0};
  assert_int_equal(mega_sched_generate(&np, &s, &err), MEGA_OK);
  assert_int_equal(mega_sched_inflight_bound(&s, 0), 1);
  assert_int_equal(mega_sched_peak_inflight(&s, 0), 1);
  mega_sched_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_sound_schedule_validates),
      cmocka_unit_test(per_rank_mistakes),
      cmocka_unit_test(grad_sync_actions),
      cmocka_unit_test(messages_pair_in_order),
      cmocka_unit_test(deadlocks_name_every_stuck_rank),
      cmocka_unit_test(the_memory_bound_is_enforced),
      cmocka_unit_test(malformed_values_are_refused),
      cmocka_unit_test(phases_peak_and_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
