/* Generators: parameter checks, the seed tables, the order of compute
 * actions per kind, and the lowering of communication. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/schedule.h"

#define assert_msg_has(err, text)                                                   \
  do {                                                                              \
    if (!strstr((err).msg, (text))) fail_msg("message '%s' lacks '%s'", (err).msg, (text)); \
  } while (0)

static void generate(mega_sched_kind kind, int pp, int vp, int m, int group, mega_schedule *s) {
  mega_sched_params p = {kind, pp, vp, m, group};
  mega_err err = {0};
  if (mega_sched_generate(&p, s, &err) != MEGA_OK) fail_msg("generate: %s", err.msg);
}

/* One rank's compute actions (F, B, W) as text, communication left out. */
static char *compute_text(const mega_schedule *s, int rank) {
  static char buf[8192];
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < s->ranks[rank].n; i++) {
    mega_action a = s->ranks[rank].acts[i];
    if (a.kind > MEGA_ACT_W) continue;
    char tok[24];
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? " " : "", mega_action_format(a, tok));
  }
  return buf;
}

static void default_kind_follows_seed_000(void **state) {
  (void)state;
  assert_int_equal(mega_sched_default_kind(1, 1), MEGA_SCHED_NO_PIPELINING);
  assert_int_equal(mega_sched_default_kind(1, 4), MEGA_SCHED_NO_PIPELINING);
  assert_int_equal(mega_sched_default_kind(4, 1), MEGA_SCHED_1F1B);
  assert_int_equal(mega_sched_default_kind(8, 4), MEGA_SCHED_INTERLEAVED);
}

static void check_params_refuses_with_a_fix(void **state) {
  (void)state;
  static const struct {
    mega_sched_params p;
    const char *msg;
  } bad[] = {
      {{MEGA_SCHED_1F1B, 0, 1, 4, 0}, "--pipeline-model-parallel-size must be at least 1"},
      {{MEGA_SCHED_1F1B, 2, 0, 4, 0}, "--virtual-pipeline-model-parallel-size must be at least 1"},
      {{MEGA_SCHED_1F1B, 2, 1, 0, 0}, "microbatches must be at least 1"},
      {{MEGA_SCHED_INTERLEAVED, 2, 2, 4, -1}, "must not be negative"},
      {{MEGA_SCHED_CUSTOM, 2, 1, 4, 0}, "mega_sched_parse"},
      {{MEGA_SCHED_NO_PIPELINING, 2, 1, 4, 0}, "use 1f1b"},
      {{MEGA_SCHED_INTERLEAVED, 1, 2, 4, 0}, "needs --pipeline-model-parallel-size > 1"},
      {{MEGA_SCHED_INTERLEAVED, 4, 1, 8, 0}, "needs --virtual-pipeline-model-parallel-size > 1"},
      {{MEGA_SCHED_1F1B, 4, 2, 8, 0}, "1f1b has no virtual stages, but vp=2; use the interleaved"},
      {{MEGA_SCHED_ZB_H1, 4, 2, 8, 0}, "zb-h1 has no virtual stages"},
      {{MEGA_SCHED_GPIPE, 4, 2, 8, 0}, "gpipe has no virtual stages"},
      {{MEGA_SCHED_INTERLEAVED, 4, 2, 3, 0}, "needs at least pp=4 microbatches, but there are 3"},
      {{MEGA_SCHED_INTERLEAVED, 4, 2, 8, 3}, "--microbatch-group-size-per-vp-stage 3 must be between pp=4"},
      {{MEGA_SCHED_INTERLEAVED, 4, 2, 8, 9}, "must be between pp=4 and the number of microbatches (8)"},
      {{MEGA_SCHED_FORWARD_ONLY, 4, 2, 8, 9}, "must be between pp=4"},
      /* Megatron's second check: the last group is 9 % 4 = 1 < pp. */
      {{MEGA_SCHED_INTERLEAVED, 4, 3, 9, 4}, "the last group has 1, fewer than pp=4"},
      {{MEGA_SCHED_1F1B, 4096, 1, 4096, 0}, "more than this planner handles"},
      /* past what a schedule holds: named by the flag, not as pp=... (megactl plan's exit 2) */
      {{MEGA_SCHED_1F1B, 100000, 1, 8, 0}, "--pipeline-model-parallel-size 100000 is more than"},
      {{MEGA_SCHED_INTERLEAVED, 4, 5000, 8, 0}, "--virtual-pipeline-model-parallel-size 5000 is"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mega_sched_params p = bad[i].p;
    mega_err err = {0};
    mega_schedule s;
    assert_int_equal(mega_sched_check_params(&p, &err), MEGA_ERR_INVALID);
    assert_msg_has(err, bad[i].msg);
    p = bad[i].p;
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_ERR_INVALID);
    assert_null(s.ranks);
  }
  mega_sched_params ok = {MEGA_SCHED_INTERLEAVED, 4, 2, 8, 0};
  assert_int_equal(mega_sched_check_params(&ok, NULL), MEGA_OK);
  assert_int_equal(ok.group_size, 4); /* the default is pp */
  mega_sched_params last_group_ok = {MEGA_SCHED_INTERLEAVED, 4, 2, 10, 6}; /* 10 % 6 = 4 >= pp */
  assert_int_equal(mega_sched_check_params(&last_group_ok, NULL), MEGA_OK);
  mega_sched_params pp1 = {MEGA_SCHED_1F1B, 1, 1, 3, 0}; /* pipelined kinds run at pp=1 */
  assert_int_equal(mega_sched_check_params(&pp1, NULL), MEGA_OK);
}

/* Seed 000, "Phase Transition Summary": PP=4, M=8. */
static void phase_table_for_pp4_m8(void **state) {
  (void)state;
  const int warmup[] = {3, 2, 1, 0}, steady[] = {5, 6, 7, 8}, cooldown[] = {3, 2, 1, 0};
  mega_sched_params p = {MEGA_SCHED_1F1B, 4, 1, 8, 0};
  mega_schedule s;
  generate(MEGA_SCHED_1F1B, 4, 1, 8, 0, &s);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(mega_sched_num_warmup(&p, r), warmup[r]); /* P - r - 1 */
    mega_phases ph = mega_sched_phases(&s, r);
    assert_int_equal(ph.warmup, warmup[r]);
    assert_int_equal(ph.steady, steady[r]);
    assert_int_equal(ph.cooldown, cooldown[r]);
    int nf = 0, nb = 0;
    for (int i = 0; i < s.ranks[r].n; i++) {
      nf += s.ranks[r].acts[i].kind == MEGA_ACT_F;
      nb += s.ranks[r].acts[i].kind == MEGA_ACT_B;
    }
    assert_int_equal(nf, 8);
    assert_int_equal(nb, 8);
  }
  /* Seed 000's timeline for rank 0 (F0..F7 then B0..B7) is drawn without
   * the steady phase; the phase table above (warmup 3, then 1F1B) and
   * schedules.py stand: F0 F1 F2 | F3 B0 F4 B1 ... F7 B4 | B5 B6 B7. */
  assert_string_equal(compute_text(&s, 0),
                      "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 F6.0 B3.0 F7.0 B4.0 B5.0 "
                      "B6.0 B7.0");
  assert_string_equal(compute_text(&s, 3),
                      "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0 F6.0 B6.0 "
                      "F7.0 B7.0");
  mega_sched_free(&s);
}

static void interleaved_warmup_formula(void **state) {
  (void)state;
  /* Seed 000: PP=4, rank 1, VP=2, N=3 -> (4-1-1)*2 + (2-1)*3 = 7. */
  mega_sched_params p = {MEGA_SCHED_INTERLEAVED, 4, 2, 8, 3};
  assert_int_equal(mega_sched_num_warmup(&p, 1), 7);
  for (int r = 0; r < 4; r++) assert_int_equal(mega_sched_num_warmup(&p, r), (4 - r - 1) * 2 + 3);
  p.group_size = 0; /* default N = pp */
  assert_int_equal(mega_sched_num_warmup(&p, 0), 3 * 2 + 4);
}

/* Seed 003: when every microbatch would be warmup, warmup is total-1 and
 * one microbatch remains for the steady phase. */
static void all_microbatches_in_warmup(void **state) {
  (void)state;
  /* Interleaved PP=4 VP=2 M=4 N=4: rank 0 would warm up 3*2 + 4 = 10 >= 8. */
  mega_sched_params p = {MEGA_SCHED_INTERLEAVED, 4, 2, 4, 4};
  assert_int_equal(mega_sched_num_warmup(&p, 0), 7);
  assert_int_equal(mega_sched_num_warmup(&p, 1), 7); /* 2*2 + 4 = 8 = total */
  assert_int_equal(mega_sched_num_warmup(&p, 2), 6); /* 1*2 + 4 */
  mega_schedule s;
  generate(MEGA_SCHED_INTERLEAVED, 4, 2, 4, 4, &s);
  mega_phases ph = mega_sched_phases(&s, 0);
  assert_int_equal(ph.warmup, 7);
  assert_int_equal(ph.steady, 1);
  assert_int_equal(ph.cooldown, 7);
  mega_sched_free(&s);
  /* 1F1B with fewer microbatches than stages: min(P-r-1, M) = M is all of
   * them, so one moves to the steady phase; the order is unchanged. */
  mega_sched_params q = {MEGA_SCHED_1F1B, 4, 1, 2, 0};
  assert_int_equal(mega_sched_num_warmup(&q, 0), 1);
  assert_int_equal(mega_sched_num_warmup(&q, 2), 1);
  assert_int_equal(mega_sched_num_warmup(&q, 3), 0);
  generate(MEGA_SCHED_1F1B, 4, 1, 2, 0, &s);
  ph = mega_sched_phases(&s, 0);
  assert_int_equal(ph.warmup, 1);
  assert_int_equal(ph.steady, 1);
  assert_int_equal(ph.cooldown, 1);
  assert_string_equal(compute_text(&s, 0), "F0.0 F1.0 B0.0 B1.0");
  mega_sched_free(&s);
  /* GPipe and forward-only put everything in warmup, so total-1 too. */
  mega_sched_params g = {MEGA_SCHED_GPIPE, 4, 1, 6, 0};
  assert_int_equal(mega_sched_num_warmup(&g, 3), 5);
  mega_sched_params f = {MEGA_SCHED_FORWARD_ONLY, 2, 2, 4, 0};
  assert_int_equal(mega_sched_num_warmup(&f, 0), 7);
  mega_sched_params n = {MEGA_SCHED_NO_PIPELINING, 1, 1, 6, 0};
  assert_int_equal(mega_sched_num_warmup(&n, 0), 0);
}

static void schedule_table_of_seed_000(void **state) {
  (void)state;
  /* PP=2, M=5, VP=2, N=3. */
  int table[10][2];
  const int mb[] = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4}, chunk[] = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
  mega_sched_table(5, 2, 3, table);
  for (int k = 0; k < 10; k++) {
    assert_int_equal(table[k][0], mb[k]);
    assert_int_equal(table[k][1], chunk[k]);
  }
  /* N = M is one group: every microbatch on chunk 0, then on chunk 1. */
  int one[6][2];
  mega_sched_table(3, 2, 3, one);
  assert_int_equal(one[3][0], 0);
  assert_int_equal(one[3][1], 1);
}

static void simple_orders(void **state) {
  (void)state;
  mega_schedule s;
  generate(MEGA_SCHED_NO_PIPELINING, 1, 1, 3, 0, &s);
  char *text = mega_sched_format(&s);
  assert_string_equal(text, "mega-schedule v1 kind=no-pipelining pp=1 vp=1 microbatches=3 group=1\n"
                            "0: F0.0 B0.0 F1.0 B1.0 F2.0 B2.0\n");
  free(text);
  mega_sched_free(&s);

  generate(MEGA_SCHED_GPIPE, 3, 1, 3, 0, &s);
  for (int r = 0; r < 3; r++)
    assert_string_equal(compute_text(&s, r), "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
  mega_sched_free(&s);

  /* The example in schedule.h is the generated 1F1B for pp=2, M=2. */
  generate(MEGA_SCHED_1F1B, 2, 1, 2, 0, &s);
  text = mega_sched_format(&s);
  assert_string_equal(text, "mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2\n"
                            "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n"
                            "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n");
  free(text);
  mega_sched_free(&s);

  generate(MEGA_SCHED_FORWARD_ONLY, 3, 1, 2, 0, &s);
  text = mega_sched_format(&s);
  assert_string_equal(text, "mega-schedule v1 kind=forward-only pp=3 vp=1 microbatches=2 group=3\n"
                            "0: F0.0 SF0.0 F1.0 SF1.0\n"
                            "1: RF0.0 F0.0 SF0.0 RF1.0 F1.0 SF1.0\n"
                            "2: RF0.0 F0.0 RF1.0 F1.0\n");
  free(text);
  mega_sched_free(&s);

  /* Forward-only with virtual stages walks the schedule table. */
  generate(MEGA_SCHED_FORWARD_ONLY, 2, 2, 5, 3, &s);
  assert_string_equal(compute_text(&s, 1), "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 F3.0 F4.0 F3.1 F4.1");
  mega_sched_free(&s);
}

/* Megatron's interleaved order, worked by hand from schedules.py for PP=2,
 * VP=2, M=4, N=2: table (0,0)(1,0)(0,1)(1,1)(2,0)(3,0)(2,1)(3,1); backward k
 * uses table[k] with the chunk reversed. */
static void interleaved_order_follows_the_table(void **state) {
  (void)state;
  mega_schedule s;
  generate(MEGA_SCHED_INTERLEAVED, 2, 2, 4, 2, &s);
  /* rank 0: warmup (2-0-1)*2 + 2 = 4 */
  assert_string_equal(compute_text(&s, 0),
                      "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 "
                      "B2.0 B3.0");
  /* rank 1: warmup 2 */
  assert_string_equal(compute_text(&s, 1),
                      "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
                      "B2.0 B3.0");
  mega_phases ph = mega_sched_phases(&s, 0);
  assert_int_equal(ph.warmup, 4);
  assert_int_equal(ph.steady, 4);
  assert_int_equal(ph.cooldown, 4);
  mega_sched_free(&s);
}

/* Strips communication and lowers again the literal way: each receive
 * right before its consumer, each send right after its producer. */
static void literal_lowering(const mega_schedule *s, mega_schedule *out) {
  assert_int_equal(mega_sched_init(out, s->kind, s->pp, s->vp, s->microbatches, s->group_size, NULL),
                   MEGA_OK);
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      mega_action a = s->ranks[r].acts[i], c = a;
      if (a.kind > MEGA_ACT_W) continue;
      bool first = mega_sched_is_first_stage(s, r, a.chunk), last = mega_sched_is_last_stage(s, r, a.chunk);
      if ((a.kind == MEGA_ACT_F && !first) || (a.kind == MEGA_ACT_B && !last)) {
        c.kind = a.kind == MEGA_ACT_F ? MEGA_ACT_RECV_F : MEGA_ACT_RECV_B;
        assert_int_equal(mega_sched_push(out, r, c, NULL), MEGA_OK);
      }
      assert_int_equal(mega_sched_push(out, r, a, NULL), MEGA_OK);
      if ((a.kind == MEGA_ACT_F && !last) || (a.kind == MEGA_ACT_B && !first)) {
        c.kind = a.kind == MEGA_ACT_F ? MEGA_ACT_SEND_F : MEGA_ACT_SEND_B;
        assert_int_equal(mega_sched_push(out, r, c, NULL), MEGA_OK);
      }
    }
}

/* 1F1B, GPipe and ZB-H1 get exactly Megatron's pairing. */
static void lowering_is_literal_where_it_can_be(void **state) {
  (void)state;
  const mega_sched_kind kinds[] = {MEGA_SCHED_1F1B, MEGA_SCHED_GPIPE, MEGA_SCHED_ZB_H1};
  for (size_t k = 0; k < 3; k++)
    for (int pp = 1; pp <= 8; pp++)
      for (int m = 1; m <= 3 * pp; m++) {
        mega_schedule s, lit;
        generate(kinds[k], pp, 1, m, 0, &s);
        literal_lowering(&s, &lit);
        if (!mega_sched_equal(&s, &lit))
          fail_msg("%s pp=%d M=%d is not literally lowered", mega_sched_kind_name(kinds[k]), pp, m);
        mega_sched_free(&lit);
        mega_sched_free(&s);
      }
}

/* Megatron's interleaved order lowered literally deadlocks under NCCL's
 * rendezvous (Megatron itself prefetches the next iteration's receives);
 * the lowering moves the receives that need it and the result validates. */
static void lowering_moves_receives_only_where_rendezvous_needs_it(void **state) {
  (void)state;
  mega_schedule s, lit;
  mega_err err = {0};
  generate(MEGA_SCHED_INTERLEAVED, 2, 2, 4, 2, &s);
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_OK);
  literal_lowering(&s, &lit);
  assert_int_equal(mega_sched_validate(&lit, &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "deadlock: rank 0 waits at SB0.1");
  assert_msg_has(err, "rank 1 waits at SB1.1");
  /* Same actions, a few receives earlier: every receive still precedes
   * its consumer, and most sit right before it. */
  int moved = 0, total = 0;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(s.ranks[r].n, lit.ranks[r].n);
    for (int i = 0; i < s.ranks[r].n; i++) {
      mega_action a = s.ranks[r].acts[i];
      if (a.kind != MEGA_ACT_RECV_F && a.kind != MEGA_ACT_RECV_B) continue;
      total++;
      int j = i + 1;
      while (s.ranks[r].acts[j].kind > MEGA_ACT_W) j++;
      mega_action c = s.ranks[r].acts[j];
      if (!(c.mb == a.mb && c.chunk == a.chunk)) moved++;
    }
  }
  assert_true(moved > 0);
  assert_true(moved * 4 < total);
  char *t = mega_sched_format_rank(&s, 1);
  /* As in Megatron's batched calls, rank 1 posts the receive of B0.0's
   * gradient before F2.0, and F3.0's input before B0.0. */
  assert_non_null(strstr(t, "SB1.1 RF2.0 RB0.0 F2.0 SF2.0 RF3.0 B0.0 SB0.0 RB1.0 F3.0"));
  free(t);
  mega_sched_free(&lit);
  mega_sched_free(&s);
}

/* ZB-H1: 1F1B's F and B order, a W for every B, W's delayed up to the
 * bound; its bubble is checked in test_sim. */
static void zb_h1_keeps_1f1b_order_and_memory(void **state) {
  (void)state;
  for (int pp = 1; pp <= 8; pp++)
    for (int m = 1; m <= 2 * pp + 2; m++) {
      mega_schedule z, o;
      generate(MEGA_SCHED_ZB_H1, pp, 1, m, 0, &z);
      generate(MEGA_SCHED_1F1B, pp, 1, m, 0, &o);
      for (int r = 0; r < pp; r++) {
        int fb = 0, w = 0, in_f_to_b = 0, peak_f_to_b = 0;
        const mega_sched_rank *q = &o.ranks[r];
        for (int i = 0; i < z.ranks[r].n; i++) {
          mega_action a = z.ranks[r].acts[i];
          if (a.kind == MEGA_ACT_W) {
            w++;
            continue;
          }
          if (a.kind != MEGA_ACT_F && a.kind != MEGA_ACT_B) continue;
          while (q->acts[fb].kind != MEGA_ACT_F && q->acts[fb].kind != MEGA_ACT_B) fb++;
          assert_int_equal(a.kind, q->acts[fb].kind);
          assert_int_equal(a.mb, q->acts[fb].mb);
          fb++;
          in_f_to_b += a.kind == MEGA_ACT_F ? 1 : -1;
          if (in_f_to_b > peak_f_to_b) peak_f_to_b = in_f_to_b;
        }
        assert_int_equal(w, m);
        assert_true(peak_f_to_b <= (pp - r < m ? pp - r : m));
        assert_true(mega_sched_peak_inflight(&z, r) <= (pp < m ? pp : m));
      }
      mega_sched_free(&z);
      mega_sched_free(&o);
    }
  /* The first rank holds no more than 1F1B's first rank, so it runs each W
   * right after its B; the last rank delays pp-1 of them. */
  mega_schedule z;
  generate(MEGA_SCHED_ZB_H1, 4, 1, 8, 0, &z);
  assert_string_equal(compute_text(&z, 0),
                      "F0.0 F1.0 F2.0 F3.0 B0.0 W0.0 F4.0 B1.0 W1.0 F5.0 B2.0 W2.0 F6.0 B3.0 "
                      "W3.0 F7.0 B4.0 W4.0 B5.0 W5.0 B6.0 W6.0 B7.0 W7.0");
  assert_string_equal(compute_text(&z, 3),
                      "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 W0.0 F4.0 B4.0 W1.0 F5.0 B5.0 "
                      "W2.0 F6.0 B6.0 W3.0 F7.0 B7.0 W4.0 W5.0 W6.0 W7.0");
  assert_int_equal(mega_sched_peak_inflight(&z, 3), 4);
  mega_sched_free(&z);
}

/* The grid of seed 000/003 parameters: everything generated validates, and
 * the peak of in-flight activations reaches the kind's bound. */
static void every_generated_schedule_validates(void **state) {
  (void)state;
  int n = 0;
  for (int kind = 0; kind < MEGA_SCHED_CUSTOM; kind++)
    for (int pp = 1; pp <= 8; pp++)
      for (int vp = 1; vp <= 4; vp++)
        for (int m = 1; m <= 2 * pp + 3; m++)
          for (int g = 0; g <= m; g += (g == 0 ? pp : 1)) {
            if (vp == 1 && g > 0) break; /* the group size only matters with vp > 1 */
            mega_sched_params p = {(mega_sched_kind)kind, pp, vp, m, g};
            mega_schedule s;
            mega_err err = {0};
            if (mega_sched_check_params(&p, NULL) != MEGA_OK) continue;
            p.group_size = g;
            if (mega_sched_generate(&p, &s, &err) != MEGA_OK)
              fail_msg("%s pp=%d vp=%d M=%d N=%d: %s", mega_sched_kind_name(p.kind), pp, vp, m, g,
                       err.msg);
            if (mega_sched_validate(&s, &err) != MEGA_OK)
              fail_msg("%s pp=%d vp=%d M=%d N=%d: %s", mega_sched_kind_name(p.kind), pp, vp, m, g,
                       err.msg);
            for (int r = 0; r < pp; r++) {
              int peak = mega_sched_peak_inflight(&s, r), bound = mega_sched_inflight_bound(&s, r);
              assert_true(peak <= bound);
              switch (p.kind) {
              case MEGA_SCHED_1F1B: assert_int_equal(peak, pp - r < m ? pp - r : m); break;
              case MEGA_SCHED_GPIPE: assert_int_equal(peak, m); break;
              case MEGA_SCHED_INTERLEAVED:
              case MEGA_SCHED_NO_PIPELINING:
              case MEGA_SCHED_FORWARD_ONLY: assert_int_equal(peak, bound); break;
              default: break;
              }
            }
            mega_sched_free(&s);
            n++;
          }
  assert_true(n > 1000);
}

static void generate_sync(mega_sched_kind kind, int pp, int vp, int m, mega_grad_sync gs,
                          mega_schedule *s) {
  mega_sched_params p = {kind, pp, vp, m, 0, gs};
  mega_err err = {0};
  if (mega_sched_generate(&p, s, &err) != MEGA_OK) fail_msg("generate: %s", err.msg);
  if (mega_sched_validate(s, &err) != MEGA_OK) fail_msg("validate: %s", err.msg);
}

/* Seed 003: each chunk's GS right after its last backward (so the buckets
 * launch during it and the reduction runs in the cooldown), or after the
 * schedule (no overlap), or offset by pipeline rank (--align-grad-reduce);
 * the GWs close each rank's list. */
static void grad_sync_placement(void **state) {
  (void)state;
  mega_schedule s;
  char *t;
  generate_sync(MEGA_SCHED_1F1B, 2, 1, 2, MEGA_GRAD_SYNC_LAST_BACKWARD, &s);
  t = mega_sched_format_rank(&s, 0);
  assert_string_equal(t, "F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0 GW0.0");
  free(t);
  t = mega_sched_format_rank(&s, 1);
  assert_string_equal(t, "RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 GS0.0 SB1.0 GW0.0");
  free(t);
  /* the text form round-trips */
  char *text = mega_sched_format(&s);
  mega_schedule back;
  mega_err err = {0};
  assert_int_equal(mega_sched_parse(text, &back, &err), MEGA_OK);
  assert_true(mega_sched_equal(&s, &back));
  mega_sched_free(&back);
  free(text);
  mega_sched_free(&s);

  generate_sync(MEGA_SCHED_1F1B, 2, 1, 2, MEGA_GRAD_SYNC_END, &s);
  t = mega_sched_format_rank(&s, 1);
  assert_string_equal(t, "RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0 GS0.0 GW0.0");
  free(t);
  mega_sched_free(&s);

  /* 1F1B aligned: rank 0 launches in its last backward, the others after
   * their schedule (Megatron's grad_sync_func path) */
  generate_sync(MEGA_SCHED_1F1B, 2, 1, 2, MEGA_GRAD_SYNC_ALIGNED, &s);
  t = mega_sched_format_rank(&s, 0);
  assert_string_equal(t, "F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0 GS0.0 GW0.0");
  free(t);
  t = mega_sched_format_rank(&s, 1);
  assert_string_equal(t, "RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0 GS0.0 GW0.0");
  free(t);
  mega_sched_free(&s);

  /* zero bubble: the last W completes a chunk's gradients */
  generate_sync(MEGA_SCHED_ZB_H1, 2, 1, 3, MEGA_GRAD_SYNC_LAST_BACKWARD, &s);
  for (int r = 0; r < 2; r++) {
    const mega_sched_rank *q = &s.ranks[r];
    int gs = -1, lastw = -1;
    for (int i = 0; i < q->n; i++) {
      if (q->acts[i].kind == MEGA_ACT_W) lastw = i;
      if (q->acts[i].kind == MEGA_ACT_GRAD_SYNC) gs = i;
    }
    assert_int_equal(gs, lastw + 1);
    assert_int_equal(q->acts[q->n - 1].kind, MEGA_ACT_GRAD_WAIT);
  }
  mega_sched_free(&s);

  /* Interleaved PP=2 VP=2 M=4: each chunk's GS after its last backward;
   * aligned, rank 1 launches each one backward later (chunk 0's, whose last
   * backward is the rank's last, after the schedule). GWs in launch order:
   * chunk 1 (nearer the loss) first. */
  for (int aligned = 0; aligned < 2; aligned++) {
    generate_sync(MEGA_SCHED_INTERLEAVED, 2, 2, 4,
                  aligned ? MEGA_GRAD_SYNC_ALIGNED : MEGA_GRAD_SYNC_LAST_BACKWARD, &s);
    for (int r = 0; r < 2; r++) {
      const mega_sched_rank *q = &s.ranks[r];
      int nb = 0, lastb[2] = {-1, -1}, gs_after[2] = {-1, -1}, gs_at[2] = {-1, -1};
      for (int i = 0; i < q->n; i++) {
        mega_action a = q->acts[i];
        if (a.kind == MEGA_ACT_B) lastb[a.chunk] = nb++;
        if (a.kind == MEGA_ACT_GRAD_SYNC) {
          gs_after[a.chunk] = nb - 1;
          gs_at[a.chunk] = i;
        }
      }
      for (int c = 0; c < 2; c++) {
        int want = lastb[c] + (aligned ? r : 0);
        if (want >= nb) assert_true(gs_at[c] >= q->n - 3); /* at the end, before the GWs */
        else assert_int_equal(gs_after[c], want);
        assert_int_equal(q->acts[gs_at[c] - (want >= nb ? 0 : 1)].kind,
                         want >= nb ? MEGA_ACT_GRAD_SYNC : MEGA_ACT_B);
      }
      assert_int_equal(q->acts[q->n - 2].kind, MEGA_ACT_GRAD_WAIT);
      assert_int_equal(q->acts[q->n - 2].chunk, 1);
      assert_int_equal(q->acts[q->n - 1].chunk, 0);
    }
    mega_sched_free(&s);
  }

  /* every kind, every placement validates; forward-only has none */
  for (int kind = 0; kind < MEGA_SCHED_CUSTOM; kind++)
    for (int gs = MEGA_GRAD_SYNC_END; gs < MEGA_GRAD_SYNC_KINDS; gs++)
      for (int pp = 1; pp <= 4; pp++)
        for (int vp = 1; vp <= 3; vp++) {
          mega_sched_params p = {(mega_sched_kind)kind, pp, vp, 2 * pp, 0, (mega_grad_sync)gs};
          if (mega_sched_check_params(&p, &err) != MEGA_OK) {
            if (kind == MEGA_SCHED_FORWARD_ONLY && vp == 1)
              assert_true(strstr(err.msg, "no gradients to synchronise") != NULL);
            continue;
          }
          generate_sync(p.kind, pp, vp, 2 * pp, p.grad_sync, &s);
          for (int r = 0; r < pp; r++) {
            int n = 0;
            for (int i = 0; i < s.ranks[r].n; i++)
              n += s.ranks[r].acts[i].kind == MEGA_ACT_GRAD_SYNC;
            assert_int_equal(n, vp);
          }
          mega_sched_free(&s);
        }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(default_kind_follows_seed_000),
      cmocka_unit_test(check_params_refuses_with_a_fix),
      cmocka_unit_test(phase_table_for_pp4_m8),
      cmocka_unit_test(interleaved_warmup_formula),
      cmocka_unit_test(all_microbatches_in_warmup),
      cmocka_unit_test(schedule_table_of_seed_000),
      cmocka_unit_test(simple_orders),
      cmocka_unit_test(interleaved_order_follows_the_table),
      cmocka_unit_test(lowering_is_literal_where_it_can_be),
      cmocka_unit_test(lowering_moves_receives_only_where_rendezvous_needs_it),
      cmocka_unit_test(zb_h1_keeps_1f1b_order_and_memory),
      cmocka_unit_test(every_generated_schedule_validates),
      cmocka_unit_test(grad_sync_placement),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
