/* The simulator against the closed forms of seed 000 and the papers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sim.h"

#define EPS 1e-9

static void generate(mega_sched_kind kind, int pp, int vp, int m, int group, mega_schedule *s) {
  mega_sched_params p = {kind, pp, vp, m, group};
  mega_err err = {0};
  if (mega_sched_generate(&p, s, &err) != MEGA_OK) fail_msg("generate: %s", err.msg);
}

static void run(const mega_schedule *s, double tf, double tb, double tw, mega_sim *sim) {
  mega_cost c = {.t_f = tf, .t_b = tb, .t_w = tw};
  mega_err err = {0};
  if (mega_sim_run(s, &c, sim, &err) != MEGA_OK) fail_msg("sim: %s", err.msg);
}

static void near(double got, double want, const char *what, int pp, int vp, int m) {
  if (fabs(got - want) > EPS * (1 + fabs(want)))
    fail_msg("%s: got %.12g, want %.12g (pp=%d vp=%d M=%d)", what, got, want, pp, vp, m);
}

/* 1F1B, T_f = T_b: makespan (M+P-1)(T_f+T_b), bubble (P-1)/(M+P-1) on
 * every rank (the Megatron paper's formula, per rank against the global
 * makespan). */
static void one_f_one_b_closed_form(void **state) {
  (void)state;
  const int pps[] = {1, 2, 3, 4, 8};
  for (size_t i = 0; i < sizeof pps / sizeof pps[0]; i++)
    for (int m = 1; m <= 3 * pps[i] + 1; m++)
      for (double t = 1; t <= 2.5; t += 1.5) {
        int p = pps[i];
        mega_schedule s;
        mega_sim sim;
        generate(p == 1 ? MEGA_SCHED_NO_PIPELINING : MEGA_SCHED_1F1B, p, 1, m, 0, &s);
        run(&s, t, t, 0, &sim);
        near(sim.makespan, (m + p - 1) * 2 * t, "makespan", p, 1, m);
        for (int r = 0; r < p; r++) {
          near(sim.ranks[r].bubble_fraction, (double)(p - 1) / (m + p - 1), "bubble", p, 1, m);
          near(sim.ranks[r].busy, m * 2 * t, "busy", p, 1, m);
          near(sim.ranks[r].idle, (p - 1) * 2 * t, "idle", p, 1, m);
          assert_int_equal(sim.ranks[r].peak_inflight, p - r < m ? p - r : m);
        }
        near(sim.bubble_fraction, (double)(p - 1) / (m + p - 1), "mean bubble", p, 1, m);
        mega_sim_free(&sim);
        mega_sched_free(&s);
      }
}

/* Interleaved, T_f = T_b: bubble (P-1)/(V*M+P-1). Seed 000 states it for M
 * a multiple of P; Megatron's order reaches it exactly for every
 * combination Megatron accepts (pp <= N <= M, last group 0 or >= pp), so
 * the cases below include N > P and M not a multiple of P. */
static void interleaved_closed_form(void **state) {
  (void)state;
  static const int cases[][4] = {
      /* P, V, M, N */
      {2, 2, 4, 2},  {2, 2, 8, 2},  {2, 4, 6, 2},  {3, 2, 6, 3},  {3, 3, 9, 3},
      {4, 2, 8, 4},  {4, 2, 16, 4}, {4, 3, 12, 4}, {4, 4, 8, 4},  {8, 2, 16, 8},
      {8, 4, 32, 8}, {4, 2, 8, 8},  {4, 2, 12, 6}, {3, 2, 7, 4},  {4, 2, 10, 6},
      {5, 3, 13, 8}, {2, 3, 5, 5},  {4, 2, 4, 4}, /* all of rank 0 in warmup */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int p = cases[i][0], v = cases[i][1], m = cases[i][2], n = cases[i][3];
    mega_schedule s;
    mega_sim sim;
    generate(MEGA_SCHED_INTERLEAVED, p, v, m, n, &s);
    run(&s, 1, 1, 0, &sim);
    near(sim.makespan, 2.0 * (v * m + p - 1) / v, "makespan", p, v, m);
    for (int r = 0; r < p; r++)
      near(sim.ranks[r].bubble_fraction, (double)(p - 1) / (v * m + p - 1), "bubble", p, v, m);
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
}

/* ZB-H1 with T_f = T_b = T_w and free communication: 1F1B's bubble is
 * (P-1)(T_f+T_b+T_w) per rank, the paper's ZB-H1 (P-1)(T_f+T_b-T_w), a
 * third. Ours reaches exactly that once M >= P. */
static void zb_h1_has_a_third_of_1f1b_bubble(void **state) {
  (void)state;
  static const int cases[][2] = {{2, 2}, {2, 8}, {3, 3}, {3, 10}, {4, 4}, {4, 8},
                                 {4, 13}, {6, 12}, {8, 8}, {8, 16}, {8, 33}, {16, 32}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int p = cases[i][0], m = cases[i][1];
    mega_schedule z, o;
    mega_sim zs, os;
    generate(MEGA_SCHED_ZB_H1, p, 1, m, 0, &z);
    generate(MEGA_SCHED_1F1B, p, 1, m, 0, &o);
    run(&z, 1, 1, 1, &zs);
    run(&o, 1, 1, 1, &os);
    for (int r = 0; r < p; r++) {
      near(os.ranks[r].idle, 3.0 * (p - 1), "1f1b idle", p, 1, m);
      near(zs.ranks[r].idle, 1.0 * (p - 1), "zb-h1 idle", p, 1, m);
      near(zs.ranks[r].busy, 3.0 * m, "zb-h1 busy", p, 1, m);
    }
    assert_true(zs.bubble_fraction < os.bubble_fraction);
    mega_sim_free(&zs);
    mega_sim_free(&os);
    mega_sched_free(&z);
    mega_sched_free(&o);
  }
  /* With fewer microbatches than stages there is too little to fill the
   * cooldown: PP=8, M=2 idles 13 units against 1F1B's 21. */
  mega_schedule z;
  mega_sim zs;
  generate(MEGA_SCHED_ZB_H1, 8, 1, 2, 0, &z);
  run(&z, 1, 1, 1, &zs);
  near(zs.ranks[0].idle, 13, "zb-h1 idle", 8, 1, 2);
  mega_sim_free(&zs);
  mega_sched_free(&z);
}

/* Seed 000's "Bubble Visualization" (PP=4, M=8, T_f = T_b = 1) draws rank 0
 * running B0 at t=4 and the step ending at t=16. The dependencies forbid
 * it: F0 reaches rank 3 at t=3, B0 runs there at t=4 and must then pass
 * ranks 2 and 1 before rank 0 can start it at t=7, and the makespan is
 * (M+P-1)(T_f+T_b) = 22, the paper's formula, which stands. */
static void seed_000_drawing_versus_dependencies(void **state) {
  (void)state;
  mega_schedule s;
  mega_sim sim;
  generate(MEGA_SCHED_1F1B, 4, 1, 8, 0, &s);
  run(&s, 1, 1, 0, &sim);
  near(sim.makespan, 22, "makespan", 4, 1, 8);
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < s.ranks[r].n; i++) {
      mega_action a = s.ranks[r].acts[i];
      if (a.kind == MEGA_ACT_F && a.mb == 0) near(sim.ranks[r].spans[i].start, r, "F0 start", 4, 1, 8);
      if (a.kind == MEGA_ACT_B && a.mb == 0)
        near(sim.ranks[r].spans[i].start, 4 + (3 - r), "B0 start", 4, 1, 8);
    }
  }
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

static void gpipe_has_1f1b_bubble(void **state) {
  (void)state;
  mega_schedule g, o;
  mega_sim gs, os;
  generate(MEGA_SCHED_GPIPE, 4, 1, 6, 0, &g);
  generate(MEGA_SCHED_1F1B, 4, 1, 6, 0, &o);
  run(&g, 1, 2, 0, &gs);
  run(&o, 1, 2, 0, &os);
  near(gs.makespan, os.makespan, "makespan", 4, 1, 6);
  assert_int_equal(gs.ranks[3].peak_inflight, 6);
  assert_int_equal(os.ranks[3].peak_inflight, 1);
  mega_sim_free(&gs);
  mega_sim_free(&os);
  mega_sched_free(&g);
  mega_sched_free(&o);
}

/* The cost model by hand: PP=2, M=1, T_f=1, T_b=2, a message takes
 * 0.5 + 50/100 = 1. */
static void communication_costs_and_spans(void **state) {
  (void)state;
  mega_schedule s;
  mega_sim sim;
  mega_err err = {0};
  generate(MEGA_SCHED_1F1B, 2, 1, 1, 0, &s);
  /* rank 0: F0.0 SF0.0 RB0.0 B0.0 ; rank 1: RF0.0 F0.0 B0.0 SB0.0 */
  mega_cost c = {.t_f = 1, .t_b = 2, .p2p_latency = 0.5, .p2p_bandwidth = 100, .activation_bytes = 50};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
  const mega_span want0[] = {{0, 1}, {1, 1}, {1, 6}, {6, 8}};
  const mega_span want1[] = {{0, 2}, {2, 3}, {3, 5}, {5, 5}};
  for (int i = 0; i < 4; i++) {
    near(sim.ranks[0].spans[i].start, want0[i].start, "rank 0 start", 2, 1, 1);
    near(sim.ranks[0].spans[i].end, want0[i].end, "rank 0 end", 2, 1, 1);
    near(sim.ranks[1].spans[i].start, want1[i].start, "rank 1 start", 2, 1, 1);
    near(sim.ranks[1].spans[i].end, want1[i].end, "rank 1 end", 2, 1, 1);
  }
  near(sim.makespan, 8, "makespan", 2, 1, 1);
  near(sim.ranks[0].busy, 3, "busy", 2, 1, 1);
  near(sim.ranks[0].idle, 5, "idle", 2, 1, 1);
  near(sim.ranks[1].end, 5, "end", 2, 1, 1);
  near(sim.ranks[1].bubble_fraction, 5.0 / 8, "bubble", 2, 1, 1);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

/* Each F, B, W costs T/vp; B costs T_b + T_w on a rank without W's. */
static void compute_costs_per_chunk(void **state) {
  (void)state;
  static const struct {
    mega_sched_kind kind;
    int pp, vp, m;
  } cases[] = {
      {MEGA_SCHED_1F1B, 3, 1, 5},        {MEGA_SCHED_INTERLEAVED, 2, 3, 4},
      {MEGA_SCHED_INTERLEAVED, 4, 2, 8}, {MEGA_SCHED_ZB_H1, 3, 1, 5},
      {MEGA_SCHED_GPIPE, 2, 1, 3},       {MEGA_SCHED_NO_PIPELINING, 1, 1, 4},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mega_schedule s;
    mega_sim sim;
    generate(cases[i].kind, cases[i].pp, cases[i].vp, cases[i].m, 0, &s);
    run(&s, 1.5, 2.25, 0.75, &sim);
    for (int r = 0; r < cases[i].pp; r++) {
      near(sim.ranks[r].busy, cases[i].m * (1.5 + 2.25 + 0.75), "busy", cases[i].pp, cases[i].vp,
           cases[i].m);
      near(sim.ranks[r].busy + sim.ranks[r].idle, sim.makespan, "busy + idle", cases[i].pp,
           cases[i].vp, cases[i].m);
      double t = 0;
      for (int a = 0; a < s.ranks[r].n; a++) { /* spans run forward, back to back or waiting */
        mega_span sp = sim.ranks[r].spans[a];
        assert_true(sp.start >= t - EPS && sp.end >= sp.start);
        t = sp.end;
        mega_act_kind k = (mega_act_kind)s.ranks[r].acts[a].kind;
        double want = k == MEGA_ACT_F ? 1.5 : k == MEGA_ACT_W ? 0.75
                      : k == MEGA_ACT_B ? (cases[i].kind == MEGA_SCHED_ZB_H1 ? 2.25 : 3.0) : -1;
        if (want >= 0) near(sp.end - sp.start, want / cases[i].vp, "duration", cases[i].pp, cases[i].vp, cases[i].m);
        if (k == MEGA_ACT_SEND_F || k == MEGA_ACT_SEND_B) near(sp.end, sp.start, "send", 0, 0, 0);
      }
      near(sim.ranks[r].end, t, "end", cases[i].pp, cases[i].vp, cases[i].m);
      assert_int_equal(sim.ranks[r].peak_inflight, mega_sched_peak_inflight(&s, r));
    }
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
}

static void fails_cleanly_when_it_cannot_finish(void **state) {
  (void)state;
  mega_schedule s;
  mega_sim sim;
  mega_err err = {0};
  mega_cost c = {1, 1, 0, 0, 0, 0};
  /* Rank 0 waits for B0's gradient before sending F1's output; rank 1
   * wants F1 before it runs B0. */
  assert_int_equal(mega_sched_parse("mega-schedule v1 kind=custom pp=2 vp=1 microbatches=2 group=2\n"
                                    "0: F0.0 SF0.0 RB0.0 B0.0 F1.0 SF1.0 RB1.0 B1.0\n"
                                    "1: RF0.0 F0.0 RF1.0 F1.0 B0.0 SB0.0 B1.0 SB1.0\n",
                                    &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "the schedule cannot finish: rank 0 waits at RB0.0 (action 2), "
                               "rank 1 waits at RF1.0 (action 2)");
  assert_null(sim.ranks);
  mega_sched_free(&s);
  /* A receive with no send at all. */
  assert_int_equal(mega_sched_parse("mega-schedule v1 kind=custom pp=2 vp=1 microbatches=1 group=2\n"
                                    "0: F0.0\n1: RF0.0 F0.0\n",
                                    &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "the schedule cannot finish: rank 1 waits at RF0.0 (action 0)");
  mega_sched_free(&s);
  /* A receive that would take another microbatch's message. */
  assert_int_equal(mega_sched_parse("mega-schedule v1 kind=custom pp=2 vp=1 microbatches=2 group=2\n"
                                    "0: F1.0 SF1.0 F0.0 SF0.0\n1: RF0.0 F0.0 RF1.0 F1.0\n",
                                    &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_string_equal(err.msg, "rank 1, action 0 (RF0.0) would receive the message of SF1.0 from "
                               "rank 0; validate the schedule");
  mega_sched_free(&s);
  /* Bad costs. */
  generate(MEGA_SCHED_1F1B, 2, 1, 2, 0, &s);
  mega_cost neg = {1, -1, 0, 0, 0, 0}, nan_cost = {NAN, 1, 0, 0, 0, 0};
  assert_int_equal(mega_sim_run(&s, &neg, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "costs must be finite and not negative"));
  assert_int_equal(mega_sim_run(&s, &nan_cost, &sim, &err), MEGA_ERR_INVALID);
  mega_sched_free(&s);
}

/* Sends never block in the simulator, so an order that deadlocks only
 * under NCCL's rendezvous (see test_sched_check) still runs here. */
static void buffered_sends_run_a_rendezvous_deadlock(void **state) {
  (void)state;
  mega_schedule s;
  mega_sim sim;
  mega_err err = {0};
  assert_int_equal(
      mega_sched_parse(
          "mega-schedule v1 kind=interleaved pp=2 vp=2 microbatches=4 group=2\n"
          "0: F0.0 SF0.0 F1.0 SF1.0 RF0.1 F0.1 SF0.1 RF1.1 F1.1 SF1.1 F2.0 SF2.0 RB0.1 B0.1 SB0.1 "
          "F3.0 SF3.0 RB1.1 B1.1 SB1.1 RF2.1 F2.1 SF2.1 RB0.0 B0.0 RF3.1 F3.1 SF3.1 RB1.0 B1.0 "
          "RB2.1 B2.1 SB2.1 RB3.1 B3.1 SB3.1 RB2.0 B2.0 RB3.0 B3.0\n"
          "1: RF0.0 F0.0 SF0.0 RF1.0 F1.0 SF1.0 RF0.1 F0.1 B0.1 SB0.1 RF1.1 F1.1 B1.1 SB1.1 RF2.0 "
          "F2.0 SF2.0 RB0.0 B0.0 SB0.0 RF3.0 F3.0 SF3.0 RB1.0 B1.0 SB1.0 RF2.1 F2.1 B2.1 SB2.1 "
          "RF3.1 F3.1 B3.1 SB3.1 RB2.0 B2.0 SB2.0 RB3.0 B3.0 SB3.0\n",
          &s, &err),
      MEGA_OK);
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_ERR_INVALID);
  run(&s, 1, 1, 0, &sim);
  near(sim.makespan, 2.0 * (2 * 4 + 1) / 2, "makespan", 2, 2, 4);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

/* The data-parallel reduction: a communicator per rank, buckets launched
 * during the chunk's last backward when GS follows it, exposed grad sync as
 * the part that outlasts the pipeline. 1F1B PP=2 M=2, T_f = T_b = 1: rank 0
 * ends its work at 6, rank 1 at 5. Rank 1's reductions end in the drain;
 * its norm leaves its copy of the tied embedding out, so it does not wait
 * for rank 0 to sum it (finalize_model_grads): none of it is exposed. */
/* A bucket count past MEGA_SIM_MAX_REDUCTIONS is refused at once: a
 * billion buckets once took a minute and 19 GB before anything failed. */
static void refuses_too_many_reductions(void **state) {
  (void)state;
  mega_err err = {0};
  mega_sched_params p = {MEGA_SCHED_1F1B, 4, 1, 8, 0, MEGA_GRAD_SYNC_END};
  mega_schedule s;
  mega_sim sim;
  assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
  mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_buckets = 1000000000};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "4000000000 bucket reductions"));
  c.grad_buckets = MEGA_SIM_MAX_REDUCTIONS / 4; /* the most there may be, all run */
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
  assert_int_equal(sim.ranks[0].nreduce, MEGA_SIM_MAX_REDUCTIONS / 4);
  mega_sim_free(&sim);
  mega_sched_free(&s);
}

static void grad_sync_costs_and_exposure(void **state) {
  (void)state;
  mega_err err = {0};
  struct {
    mega_grad_sync gs;
    int buckets;
    double exposed0, exposed1, makespan;
  } cases[] = {
      {MEGA_GRAD_SYNC_END, 1, 1, 0, 7},
      {MEGA_GRAD_SYNC_LAST_BACKWARD, 1, 1, 0, 7},  /* one bucket: ready at the end of B1 */
      {MEGA_GRAD_SYNC_LAST_BACKWARD, 4, 0.25, 0, 6.25}, /* 3 of 4 buckets during B1 */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mega_sched_params p = {MEGA_SCHED_1F1B, 2, 1, 2, 0, cases[k].gs};
    mega_schedule s;
    mega_sim sim;
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
    mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_buckets = cases[k].buckets};
    assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
    near(sim.ranks[0].work_end, 6, "work end 0", 2, 1, 2);
    near(sim.ranks[1].work_end, 5, "work end 1", 2, 1, 2);
    near(sim.ranks[0].grad_sync_exposed, cases[k].exposed0, "exposed 0", 2, 1, 2);
    near(sim.ranks[1].grad_sync_exposed, cases[k].exposed1, "exposed 1", 2, 1, 2);
    near(sim.grad_sync_exposed, (cases[k].exposed0 + cases[k].exposed1) / 2, "mean", 2, 1, 2);
    near(sim.makespan, cases[k].makespan, "makespan", 2, 1, 2);
    assert_int_equal(sim.ranks[0].nreduce, cases[k].buckets);
    near(sim.ranks[0].busy, 4, "busy", 2, 1, 2); /* GS and GW are not compute */
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
  /* Interleaved VP=2: each chunk reduces half; chunk 1's reduction, launched
   * in the cooldown, is hidden; GWs wait only for what outlasts the work. */
  mega_sched_params p = {MEGA_SCHED_INTERLEAVED, 2, 2, 4, 0, MEGA_GRAD_SYNC_LAST_BACKWARD};
  mega_schedule s;
  mega_sim sim;
  assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
  mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_buckets = 1};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
  assert_int_equal(sim.ranks[0].nreduce, 2);
  near(sim.ranks[0].reduce[1].end - sim.ranks[0].reduce[1].start, 0.5, "chunk share", 2, 2, 4);
  assert_true(sim.ranks[0].grad_sync_exposed <= 0.5 + EPS);
  assert_true(sim.ranks[1].grad_sync_exposed <= sim.ranks[0].grad_sync_exposed + EPS);
  mega_sim_free(&sim);
  mega_sched_free(&s);

  /* A negative cost is refused. */
  c.grad_sync = -1;
  generate(MEGA_SCHED_1F1B, 2, 1, 2, 0, &s);
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  mega_sched_free(&s);
}

/* A collective's latency: 1F1B PP=2 M=2, T_f = T_b = 1, a reduction of 1
 * in two buckets, 0.5 more per collective, so each bucket costs 1. Rank 0's
 * GS follows its last B (5..6): its buckets are ready at 5.5 and 6; rank
 * 1's follows a send, both ready at 5. The pipeline drains at 6. Own
 * links: rank 1 reduces 5..7 (exposed 1), rank 0 5.5..7.5 (exposed 1.5:
 * the tied embedding's sum is in its last bucket, worker/engine/grads.h).
 * One lane: rank 1 alone 5..5.5, then two at half speed: rank 1's first
 * done at 6.5, rank 0's first at 7.5, rank 1's second at 8.5 (exposed
 * 2.5), rank 0's second alone from 8.5 to 9 (exposed 3). */
static void grad_sync_latency(void **state) {
  (void)state;
  mega_err err = {0};
  const struct {
    double lanes, exposed0, exposed1, end1;
  } cases[] = {{0, 1.5, 1, 7}, {1, 3, 2.5, 8.5}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mega_sched_params p = {MEGA_SCHED_1F1B, 2, 1, 2, 0, MEGA_GRAD_SYNC_END};
    mega_schedule s;
    mega_sim sim;
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
    mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_buckets = 2,
                   .grad_sync_lanes = cases[k].lanes, .grad_sync_latency = 0.5};
    assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
    near(sim.ranks[0].grad_sync_exposed, cases[k].exposed0, "exposed 0", 2, 1, 2);
    near(sim.ranks[1].grad_sync_exposed, cases[k].exposed1, "exposed 1", 2, 1, 2);
    near(sim.ranks[1].end, cases[k].end1, "end 1", 2, 1, 2);
    near(sim.ranks[0].reduce[0].end - sim.ranks[0].reduce[0].start, k ? 2 : 1, "bucket", 2, 1,
         2);
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
  /* a negative latency is refused */
  mega_schedule s;
  mega_sim sim;
  generate(MEGA_SCHED_1F1B, 2, 1, 2, 0, &s);
  mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_sync_latency = -1};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "grad_sync_latency=-1"));
  mega_sched_free(&s);
}

/* Buckets of the sizes given: each costs its share and is ready when the
 * backward is as far through as the buckets up to it are through the
 * chunk. 1F1B PP=2 M=2, T_f = T_b = 1; each rank's GS follows its last B
 * (rank 1's runs 4..5, rank 0's 5..6, when the pipeline drains). A
 * reduction of 1 in sizes 3:1: rank 0's first is ready at 5.75 and done at
 * 6.5, its second (ready at 6) at 6.75: 0.75 exposed where equal halves
 * expose 0.5; 1:3 ends its first at 5.5, its second (0.75 from 6) at 6.75.
 * A reduction of 2 in 3:1: rank 1 reduces 4.75..6.25..6.75, rank 0
 * 5.75..7.25..7.75 on links of their own; on one lane both run at half
 * speed from 5.75 until rank 1's first is done at 6.75, and again while its
 * second runs, to 7.75; rank 0's first ends alone at 8.25, its second at
 * 8.75. Slowdowns say the same as one lane with {1, 2}, or with {1}, whose
 * one reduction's speed two then share; with {1, 1.5} the two run at 2/3
 * from 5.75: rank 1's first done at 6.5, its second at 7.25, rank 0's
 * first at 7.75 and its second at 8.25. */
static void grad_sync_bucket_sizes_and_slowdowns(void **state) {
  (void)state;
  mega_err err = {0};
  const struct {
    double a, b, grad_sync, lanes, exposed0, exposed1;
    int nslow;
    double slow[2];
  } cases[] = {{3, 1, 1, 0, 0.75, 0},        {1, 1, 1, 0, 0.5, 0},
               {1, 3, 1, 0, 0.75, 0},        {3, 1, 2, 0, 1.75, 0.75},
               {3, 1, 2, 1, 2.75, 1.75},     {3, 1, 2, 0, 2.75, 1.75, 2, {1, 2}},
               {3, 1, 2, 0, 2.75, 1.75, 1, {1}}, {3, 1, 2, 0, 2.25, 1.25, 2, {1, 1.5}}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mega_sched_params p = {MEGA_SCHED_1F1B, 2, 1, 2, 0, MEGA_GRAD_SYNC_LAST_BACKWARD};
    mega_schedule s;
    mega_sim sim;
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
    double sizes[2] = {cases[k].a, cases[k].b};
    mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = cases[k].grad_sync, .grad_buckets = 2,
                   .grad_bucket_sizes = sizes, .grad_sync_lanes = cases[k].lanes,
                   .grad_sync_slowdown = cases[k].nslow ? cases[k].slow : NULL,
                   .grad_sync_slowdown_n = cases[k].nslow};
    assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
    near(sim.ranks[0].grad_sync_exposed, cases[k].exposed0, "exposed 0", 2, 1, 2);
    near(sim.ranks[1].grad_sync_exposed, cases[k].exposed1, "exposed 1", 2, 1, 2);
    double share = cases[k].a / (cases[k].a + cases[k].b);
    near(sim.ranks[0].reduce[0].start, 5 + share, "first ready", 2, 1, 2);
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
  /* sizes that are negative, or add up to nothing, are refused */
  mega_schedule s;
  mega_sim sim;
  generate(MEGA_SCHED_1F1B, 2, 1, 2, 0, &s);
  double bad[2][2] = {{1, -1}, {0, 0}};
  const char *why[2] = {"bucket 1's size", "add up to nothing"};
  for (int k = 0; k < 2; k++) {
    mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_buckets = 2,
                   .grad_bucket_sizes = bad[k]};
    assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, why[k]));
  }
  /* and slowdowns under 1, or beside lanes */
  double slow[2] = {1, 0.5};
  mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_sync_slowdown = slow,
                 .grad_sync_slowdown_n = 2};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "2 reductions at once run 0.5 times slower"));
  slow[1] = 2;
  c.grad_sync_lanes = 2;
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "not both"));
  mega_sched_free(&s);
}

/* Shared links: at most `lanes` reductions at full speed at once. 1F1B
 * PP=2 M=2, T_f = T_b = 1, a reduction of 2 after each rank's schedule:
 * rank 1 reduces from 5, rank 0 from 6. With their own links they end at
 * 7 and 8. With one lane rank 1 runs alone for 1, then both at half speed
 * until rank 1's last unit is done at 8, then rank 0 alone for its last
 * unit: 9. Two lanes are as good as their own links; with 1.5 both run at
 * 3/4 from 6, so rank 1 ends at 7 1/3 and rank 0 at 8 1/3. */
static void grad_sync_shared_lanes(void **state) {
  (void)state;
  mega_err err = {0};
  const struct {
    double lanes, end0, end1;
  } cases[] = {{0, 8, 7}, {1, 9, 8}, {2, 8, 7}, {1.5, 8 + 1.0 / 3, 7 + 1.0 / 3}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mega_sched_params p = {MEGA_SCHED_1F1B, 2, 1, 2, 0, MEGA_GRAD_SYNC_END};
    mega_schedule s;
    mega_sim sim;
    assert_int_equal(mega_sched_generate(&p, &s, &err), MEGA_OK);
    mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 2, .grad_sync_lanes = cases[k].lanes};
    assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
    near(sim.ranks[0].end, cases[k].end0, "end 0", 2, 1, 2);
    near(sim.ranks[1].end, cases[k].end1, "end 1", 2, 1, 2);
    near(sim.ranks[0].grad_sync_exposed, cases[k].end0 - 6, "exposed 0", 2, 1, 2);
    near(sim.ranks[1].grad_sync_exposed, cases[k].end1 > 6 ? cases[k].end1 - 6 : 0, "exposed 1",
         2, 1, 2);
    near(sim.makespan, cases[k].end0, "makespan", 2, 1, 2);
    near(sim.ranks[0].reduce[0].end, cases[k].end0, "reduced 0", 2, 1, 2);
    mega_sim_free(&sim);
    mega_sched_free(&s);
  }
  /* A GW before other actions (a hand-written schedule) would make the
   * reductions change the pipeline: refused with lanes, fine without. */
  mega_schedule s;
  mega_sim sim;
  assert_int_equal(mega_sched_parse("mega-schedule v1 kind=custom pp=2 vp=1 microbatches=1 "
                                    "group=2\n"
                                    "0: F0.0 SF0.0 RB0.0 B0.0 GS0.0 GW0.0\n"
                                    "1: RF0.0 F0.0 B0.0 GS0.0 GW0.0 SB0.0\n",
                                    &s, &err),
                   MEGA_OK);
  assert_int_equal(mega_sched_validate(&s, &err), MEGA_OK);
  mega_cost c = {.t_f = 1, .t_b = 1, .grad_sync = 1, .grad_sync_lanes = 1};
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "rank 1 has SB0.0"));
  c.grad_sync_lanes = 0;
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_OK);
  mega_sim_free(&sim);
  c.grad_sync_lanes = -1; /* and under one: grad_sync is the time of one alone */
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  c.grad_sync_lanes = 0.5;
  assert_int_equal(mega_sim_run(&s, &c, &sim, &err), MEGA_ERR_INVALID);
  mega_sched_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_f_one_b_closed_form),
      cmocka_unit_test(grad_sync_costs_and_exposure),
      cmocka_unit_test(refuses_too_many_reductions),
      cmocka_unit_test(grad_sync_bucket_sizes_and_slowdowns),
      cmocka_unit_test(grad_sync_shared_lanes),
      cmocka_unit_test(grad_sync_latency),
      cmocka_unit_test(interleaved_closed_form),
      cmocka_unit_test(zb_h1_has_a_third_of_1f1b_bubble),
      cmocka_unit_test(seed_000_drawing_versus_dependencies),
      cmocka_unit_test(gpipe_has_1f1b_bubble),
      cmocka_unit_test(communication_costs_and_spans),
      cmocka_unit_test(compute_costs_per_chunk),
      cmocka_unit_test(fails_cleanly_when_it_cannot_finish),
      cmocka_unit_test(buffered_sends_run_a_rendezvous_deadlock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
