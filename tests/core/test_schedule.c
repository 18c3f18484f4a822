/* The schedule IR: building, names, peers, and the text form. */
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

static mega_action act(mega_act_kind k, int mb, int chunk) {
  return (mega_action){.kind = (uint8_t)k, .chunk = (uint16_t)chunk, .mb = mb};
}

/* The example in schedule.h, built by hand. */
static const char *header_example =
    "mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2\n"
    "0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0\n"
    "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\n";

static void build_header_example(mega_schedule *s) {
  mega_err err = {0};
  assert_int_equal(mega_sched_init(s, MEGA_SCHED_1F1B, 2, 1, 2, 0, &err), MEGA_OK);
  assert_int_equal(s->group_size, 2); /* 0 means pp */
  const mega_action r0[] = {act(MEGA_ACT_F, 0, 0),      act(MEGA_ACT_SEND_F, 0, 0),
                            act(MEGA_ACT_F, 1, 0),      act(MEGA_ACT_SEND_F, 1, 0),
                            act(MEGA_ACT_RECV_B, 0, 0), act(MEGA_ACT_B, 0, 0),
                            act(MEGA_ACT_RECV_B, 1, 0), act(MEGA_ACT_B, 1, 0)};
  const mega_action r1[] = {act(MEGA_ACT_RECV_F, 0, 0), act(MEGA_ACT_F, 0, 0),
                            act(MEGA_ACT_B, 0, 0),      act(MEGA_ACT_SEND_B, 0, 0),
                            act(MEGA_ACT_RECV_F, 1, 0), act(MEGA_ACT_F, 1, 0),
                            act(MEGA_ACT_B, 1, 0),      act(MEGA_ACT_SEND_B, 1, 0)};
  for (size_t i = 0; i < 8; i++) {
    assert_int_equal(mega_sched_push(s, 0, r0[i], &err), MEGA_OK);
    assert_int_equal(mega_sched_push(s, 1, r1[i], &err), MEGA_OK);
  }
}

static void format_matches_the_header_example(void **state) {
  (void)state;
  mega_schedule s;
  build_header_example(&s);
  char *text = mega_sched_format(&s);
  assert_string_equal(text, header_example);
  char *line = mega_sched_format_rank(&s, 1);
  assert_string_equal(line, "RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0");
  free(line);
  free(text);
  mega_sched_free(&s);
}

static void parse_reads_the_header_example(void **state) {
  (void)state;
  mega_schedule want, got;
  mega_err err = {0};
  build_header_example(&want);
  assert_int_equal(mega_sched_parse(header_example, &got, &err), MEGA_OK);
  assert_true(mega_sched_equal(&want, &got));
  mega_sched_free(&got);
  /* Comments, blank lines, CRLF and "0:F0.0" without a space are fine. */
  const char *loose = "# a comment\n\n"
                      "mega-schedule v1 pp=2 kind=1f1b group=2 microbatches=2 vp=1\r\n"
                      "1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0\r\n"
                      "   # another\n"
                      "0:F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0";
  assert_int_equal(mega_sched_parse(loose, &got, &err), MEGA_OK);
  assert_true(mega_sched_equal(&want, &got));
  mega_sched_free(&got);
  mega_sched_free(&want);
}

static void parse_errors_name_the_line_and_token(void **state) {
  (void)state;
  static const struct {
    const char *text, *msg;
  } cases[] = {
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=8 group=1\n\n0: F0.0 X4.0\n",
       "line 3: unknown action 'X4.0'"},
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=8 group=1\n0: F0.0 F.0\n",
       "line 2: unknown action 'F.0'"},
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=8 group=1\n0: F0.0 F1\n",
       "line 2: unknown action 'F1'"},
      {"mega-schedule v1 kind=1f1b pp=4 vp=1 microbatches=2 group=4\n5: F0.0\n",
       "line 2: rank 5 is out of range for pp=4"},
      {"0: F0.0\n", "line 1: missing header"},
      {"", "missing header"},
      {"# only a comment\n", "missing header"},
      {"mega-schedule v2 kind=1f1b\n", "line 1: unsupported schedule format version 'v2'"},
      {"mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2 speed=fast\n",
       "line 1: bad key=value 'speed=fast'"},
      {"mega-schedule v1 kind=1f1b pp=two vp=1 microbatches=2 group=2\n",
       "line 1: bad key=value 'pp=two'"},
      /* a whole number, too long to be a size: the message gave no reason */
      {"mega-schedule v1 kind=1f1b pp=2000000000 vp=1 microbatches=2 group=2\n",
       "line 1: bad key=value 'pp=2000000000' in the header; pp needs a whole number of at most "
       "9 digits"},
      {"mega-schedule v1 kind=1f1b pp=2 pp=2 vp=1 microbatches=2 group=2\n",
       "line 1: 'pp' is given twice"},
      {"mega-schedule v1 kind=fast pp=2 vp=1 microbatches=2 group=2\n",
       "line 1: unknown schedule kind 'fast'"},
      {"mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2\n0:\n1:\n",
       "line 1: the header lacks group="},
      {"mega-schedule v1 kind=1f1b pp=0 vp=1 microbatches=2 group=2\n", "line 1: pp=0"},
      {"mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2\n0: F0.0\n0: F1.0\n",
       "line 3: duplicate line for rank 0"},
      {"mega-schedule v1 kind=1f1b pp=3 vp=1 microbatches=2 group=3\n0: F0.0\n2: F0.0\n",
       "missing rank lines: the header (line 1) says pp=3 but there is no line for rank 1"},
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=2 group=1\n0: F2.0\n",
       "line 2: action 'F2.0' is out of range for microbatches=2 vp=1"},
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=2 group=1\n0: F0.1\n",
       "line 2: action 'F0.1' is out of range"},
      {"mega-schedule v1 kind=1f1b pp=1 vp=1 microbatches=2 group=1\nzero: F0.0\n",
       "line 2: expected 'RANK: actions...', found 'zero:'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mega_schedule s;
    mega_err err = {0};
    assert_int_equal(mega_sched_parse(cases[i].text, &s, &err), MEGA_ERR_INVALID);
    assert_int_equal(err.status, MEGA_ERR_INVALID);
    assert_msg_has(err, cases[i].msg);
    assert_null(s.ranks); /* nothing left to free */
  }
}

static void every_generated_schedule_round_trips(void **state) {
  (void)state;
  int n = 0;
  for (int kind = 0; kind < MEGA_SCHED_CUSTOM; kind++)
    for (int pp = 1; pp <= 6; pp++)
      for (int vp = 1; vp <= 3; vp++)
        for (int m = 1; m <= 2 * pp + 3; m++)
          for (int g = 0; g <= m; g++) {
            mega_sched_params p = {(mega_sched_kind)kind, pp, vp, m, g};
            mega_schedule s, back;
            mega_err err = {0};
            if (mega_sched_generate(&p, &s, &err) != MEGA_OK) continue;
            char *text = mega_sched_format(&s);
            assert_non_null(text);
            if (mega_sched_parse(text, &back, &err) != MEGA_OK)
              fail_msg("%s pp=%d vp=%d M=%d: %s", mega_sched_kind_name(p.kind), pp, vp, m, err.msg);
            assert_true(mega_sched_equal(&s, &back));
            free(text);
            mega_sched_free(&back);
            mega_sched_free(&s);
            n++;
          }
  assert_true(n > 500);
}

static void equal_compares_parameters_and_actions(void **state) {
  (void)state;
  mega_schedule a, b;
  mega_err err = {0};
  build_header_example(&a);
  build_header_example(&b);
  assert_true(mega_sched_equal(&a, &b));
  b.ranks[1].acts[3].mb = 1;
  assert_false(mega_sched_equal(&a, &b));
  b.ranks[1].acts[3].mb = 0;
  b.kind = MEGA_SCHED_CUSTOM;
  assert_false(mega_sched_equal(&a, &b));
  b.kind = MEGA_SCHED_1F1B;
  assert_int_equal(mega_sched_push(&b, 0, act(MEGA_ACT_W, 0, 0), &err), MEGA_OK);
  assert_false(mega_sched_equal(&a, &b));
  mega_sched_free(&a);
  mega_sched_free(&b);
}

static void push_and_init_refuse_bad_input(void **state) {
  (void)state;
  mega_schedule s;
  mega_err err = {0};
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_1F1B, 0, 1, 1, 0, &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "pp=0 is out of range");
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_1F1B, 2, 0, 1, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_1F1B, 2, 1, 0, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_1F1B, 2, 1, 1, -1, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_KINDS, 2, 1, 1, 0, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_CUSTOM, 2, 2, 3, 0, &err), MEGA_OK);
  assert_int_equal(mega_sched_push(&s, 2, act(MEGA_ACT_F, 0, 0), &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "rank 2 is out of range for pp=2");
  assert_int_equal(mega_sched_push(&s, 0, act(MEGA_ACT_F, 3, 0), &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "F3.0 names microbatch 3, but microbatches=3");
  assert_int_equal(mega_sched_push(&s, 0, act(MEGA_ACT_F, 0, 2), &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "names chunk 2, but vp=2");
  assert_int_equal(mega_sched_push(&s, 0, act(MEGA_ACT_KINDS, 0, 0), &err), MEGA_ERR_INVALID);
  for (int i = 0; i < 1000; i++) /* growth */
    assert_int_equal(mega_sched_push(&s, 1, act(MEGA_ACT_W, i % 3, i % 2), &err), MEGA_OK);
  assert_int_equal(s.ranks[1].n, 1000);
  mega_sched_free(&s);
  mega_sched_free(&s); /* twice is harmless */
}

static void names_round_trip(void **state) {
  (void)state;
  for (int k = 0; k < MEGA_SCHED_KINDS; k++) {
    mega_sched_kind back;
    assert_int_equal(mega_sched_kind_parse(mega_sched_kind_name((mega_sched_kind)k), &back, NULL),
                     MEGA_OK);
    assert_int_equal(back, k);
  }
  assert_string_equal(mega_sched_kind_name(MEGA_SCHED_1F1B), "1f1b");
  assert_string_equal(mega_sched_kind_name(MEGA_SCHED_ZB_H1), "zb-h1");
  mega_sched_kind k;
  mega_err err = {0};
  assert_int_equal(mega_sched_kind_parse("interleaved-1f1b", &k, &err), MEGA_OK);
  assert_int_equal(k, MEGA_SCHED_INTERLEAVED);
  assert_int_equal(mega_sched_kind_parse("pipedream", &k, &err), MEGA_ERR_INVALID);
  assert_msg_has(err, "unknown schedule kind 'pipedream'; use one of");
  static const char *acts[] = {"F", "B", "W", "SF", "RF", "SB", "RB", "GS", "GW"};
  for (int a = 0; a < MEGA_ACT_KINDS; a++)
    assert_string_equal(mega_act_kind_name((mega_act_kind)a), acts[a]);
  char buf[24];
  assert_string_equal(mega_action_format(act(MEGA_ACT_SEND_B, 12, 3), buf), "SB12.3");
  assert_string_equal(mega_action_format(act(MEGA_ACT_F, 3, 1), buf), "F3.1");
}

static void peers_follow_virtual_stages(void **state) {
  (void)state;
  mega_schedule s;
  assert_int_equal(mega_sched_init(&s, MEGA_SCHED_INTERLEAVED, 4, 2, 4, 0, NULL), MEGA_OK);
  int r, c;
  /* Chunk 0 of rank 3 is virtual stage 3; its output goes to stage 4, rank 0 chunk 1. */
  mega_sched_peer(&s, 3, act(MEGA_ACT_SEND_F, 0, 0), &r, &c);
  assert_int_equal(r, 0);
  assert_int_equal(c, 1);
  mega_sched_peer(&s, 0, act(MEGA_ACT_RECV_F, 0, 1), &r, &c);
  assert_int_equal(r, 3);
  assert_int_equal(c, 0);
  mega_sched_peer(&s, 0, act(MEGA_ACT_SEND_B, 0, 1), &r, &c);
  assert_int_equal(r, 3);
  assert_int_equal(c, 0);
  mega_sched_peer(&s, 3, act(MEGA_ACT_RECV_B, 0, 0), &r, &c);
  assert_int_equal(r, 0);
  assert_int_equal(c, 1);
  mega_sched_peer(&s, 1, act(MEGA_ACT_SEND_F, 0, 1), &r, &c);
  assert_int_equal(r, 2);
  assert_int_equal(c, 1);
  /* The ends of the model and compute actions have no peer. */
  mega_sched_peer(&s, 3, act(MEGA_ACT_SEND_F, 0, 1), &r, &c);
  assert_int_equal(r, -1);
  mega_sched_peer(&s, 0, act(MEGA_ACT_RECV_F, 0, 0), &r, &c);
  assert_int_equal(r, -1);
  mega_sched_peer(&s, 1, act(MEGA_ACT_F, 0, 0), &r, &c);
  assert_int_equal(r, -1);
  assert_true(mega_sched_is_first_stage(&s, 0, 0));
  assert_false(mega_sched_is_first_stage(&s, 0, 1));
  assert_true(mega_sched_is_last_stage(&s, 3, 1));
  assert_false(mega_sched_is_last_stage(&s, 3, 0));
  mega_sched_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(format_matches_the_header_example),
      cmocka_unit_test(parse_reads_the_header_example),
      cmocka_unit_test(parse_errors_name_the_line_and_token),
      cmocka_unit_test(every_generated_schedule_round_trips),
      cmocka_unit_test(equal_compares_parameters_and_actions),
      cmocka_unit_test(push_and_init_refuse_bad_input),
      cmocka_unit_test(names_round_trip),
      cmocka_unit_test(peers_follow_virtual_stages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
