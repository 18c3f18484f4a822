/* Nodes of different builds of mega in one cluster (a rolling upgrade):
 * what a node of this build does with calls an older or newer one makes.
 * No older build is built here: each case makes the other build's bytes by
 * hand (a LaunchRanks without the newer fields, a Join that names another
 * version). Each case runs as a test of its own (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A flag the node cannot parse: the refusal names the flag and what the
 * parser said, not an empty reason. (A newer coordinator's flags reach a
 * node of another build no more, which refuses it first; the words are
 * the same for any flag a node cannot parse.) */
static void test_unparsed_flag_is_named(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "v1", 1, NULL, NULL, NULL));
  const char *newer[] = {"--a-flag-from-a-newer-mega", NULL};
  mega_err err = {0};
  assert_int_not_equal(hd_launch_by_hand(&d, "j-1-v1", NULL, newer, &err), MEGA_OK);
  printf("refusal: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--a-flag-from-a-newer-mega"));
  assert_null(strstr(err.msg, "flags: node")); /* its prefix once */
  assert_int_equal(hd_workers(&d, NULL, 0), 0);
  hd_cleanup(&d);
}

/* megad --version is "megad 0.1.0+COMMIT" from a git tree; outside one
 * every build says "0.1.0" and builds cannot be told apart (core/version.h):
 * then the cases that need another build skip. */
static bool names_its_build(hd *d, char *v, size_t len) {
  assert_true(hd_version(d, v, len));
  if (strchr(v, '+')) return true;
  printf("megad %s names no commit (built outside git): nothing tells builds apart\n", v);
  return false;
}

/* A coordinator of another build (one older than the field, which names
 * none, or one that names another) gets no ranks started: refused as a busy
 * node is (RESOURCE_EXHAUSTED), so its job waits rather than fails, with
 * both builds named. */
static void test_other_build_coordinator_refused(void **state) {
  (void)state;
  hd d;
  assert_true(hd_start(&d, "v2", 1, NULL, NULL, NULL));
  char own[128];
  if (!names_its_build(&d, own, sizeof own)) {
    hd_cleanup(&d);
    skip();
  }
  mega_err err = {0};
  assert_int_equal(hd_launch_by_hand(&d, "j-1-v2", "", NULL, &err), MEGA_ERR_NOMEM);
  printf("older: %s\n", err.msg);
  assert_non_null(strstr(err.msg, own));
  assert_non_null(strstr(err.msg, "an older build"));
  assert_non_null(strstr(err.msg, "a job's ranks run one build"));
  assert_int_equal(hd_launch_by_hand(&d, "j-2-v2", "0.1.0+0123456789ab", NULL, &err),
                   MEGA_ERR_NOMEM);
  assert_non_null(strstr(err.msg, "which runs 0.1.0+0123456789ab"));
  assert_int_equal(hd_workers(&d, NULL, 0), 0);
  /* its own build is started as ever */
  assert_int_equal(hd_launch_by_hand(&d, "j-3-v2", NULL, NULL, &err), MEGA_OK);
  hd_cleanup(&d);
}

/* A node of another build joins (as an older megad's Join reads: its
 * version, 0.1.0, names no commit): megad says so, megactl nodes shows it,
 * and a job that needs it waits, saying why, instead of running on two
 * builds. */
static void test_other_build_node_not_placed(void **state) {
  (void)state;
  hd d;
  /* the joined node never heartbeats: it stays alive for the test */
  const char *slow[] = {"--heartbeat-timeout", "600s", NULL};
  assert_true(hd_start(&d, "v3", 1, NULL, NULL, slow));
  char own[128];
  if (!names_its_build(&d, own, sizeof own)) {
    hd_cleanup(&d);
    skip();
  }
  Mega__V1__Node node = MEGA__V1__NODE__INIT;
  node.id = "old1";
  node.address = "127.0.0.1:1";
  node.state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  node.slots = 4;
  node.backend = "cpu";
  node.incarnation = 1;
  node.version = "0.1.0";
  Mega__V1__JoinRequest jr = MEGA__V1__JOIN_REQUEST__INIT;
  jr.node = &node;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  assert_int_equal(mega_rpc_unary(d.ch, &mega_peer_join, &jr.base, 5000, &resp, &err), MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
  assert_true(hd_wait_log(&d, "node old1 runs mega 0.1.0, this node", 5000));

  char out[4096], args[160];
  snprintf(args, sizeof args, "--server %s nodes", d.addr);
  assert_int_equal(hd_megactl(out, sizeof out, args), 0);
  printf("%s", out);
  assert_non_null(strstr(out, "VERSION"));
  assert_non_null(strstr(out, own));
  assert_non_null(strstr(out, "2 builds of mega run here"));

  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  spec.nnodes_min = 2;
  spec.nproc_per_node = 1;
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_true(hd_wait_log(&d, "1 more runs another build of mega (old1: 0.1.0), not this coordinator's", 10000));
  Mega__V1__Job *j = hd_get_job(&d, id, &err);
  assert_non_null(j);
  assert_int_equal(j->state, MEGA__V1__JOB_STATE__JOB_STATE_PENDING);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  assert_int_equal(hd_workers(&d, NULL, 0), 0);
  assert_int_equal(hd_cancel(&d, id, NULL, &err), MEGA_OK);
  hd_cleanup(&d);
}

/* A megaw that is not megad's build (replaced under a running megad by an
 * upgrade): its rank is stopped, naming both, before it trains. */
static void test_worker_of_other_build_refused(void **state) {
  (void)state;
  const char *other = getenv("MEGAW_OTHER_BUILD");
  assert_non_null(other);
  const char *own_megaw = getenv("MEGAW");
  setenv("MEGAW", other, 1); /* hd_start's --worker */
  hd d;
  bool up = hd_start(&d, "v4", 1, NULL, NULL, NULL);
  setenv("MEGAW", own_megaw ? own_megaw : "", 1);
  assert_true(up);
  char own[128];
  if (!names_its_build(&d, own, sizeof own)) {
    hd_cleanup(&d);
    skip();
  }
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&d, id, true, 30000, &w);
  assert_non_null(w.final);
  printf("error: %s\n", w.final->error);
  assert_int_equal(w.final->state, MEGA__V1__JOB_STATE__JOB_STATE_FAILED);
  assert_non_null(strstr(w.final->error, "megaw_other_build) is mega 0.1.0, but megad on node v4 is"));
  assert_non_null(strstr(w.final->error, own));
  hd_watch_free(&w);
  hd_cleanup(&d);
}

/* How many of job_id's events (as d has them) are of kind and hold text
 * (NULL: any). */
static int events_of(hd *d, const char *job_id, Mega__V1__JobEventKind kind, const char *text) {
  Mega__V1__GetJobResponse *r = hd_get_job_history(d, job_id, NULL);
  assert_non_null(r);
  int n = 0;
  for (size_t i = 0; i < r->n_events; i++)
    n += r->events[i]->kind == kind && (!text || strstr(r->events[i]->message, text));
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return n;
}

#define EVK(k) MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_##k

/* A rolling upgrade half done, with real megads of two builds: a job that
 * needs two nodes of its coordinator's build waits on one line that says
 * which node runs which build, asks the node of the other build nothing (no
 * attempt refused, none retried), and is placed as soon as a node of its
 * build joins; a job of the other build's coordinator waits in turn. */
static void test_mixed_builds_wait_then_place(void **state) {
  (void)state;
  const char *other = getenv("MEGAD_OTHER_BUILD");
  assert_non_null(other);
  const char *own_megad = getenv("MEGAD");
  hd a, b, c;
  assert_true(hd_start(&a, "va", 1, NULL, NULL, NULL));
  char own[128];
  if (!names_its_build(&a, own, sizeof own)) {
    hd_cleanup(&a);
    skip();
  }
  setenv("MEGAD", other, 1); /* hd_start's program */
  bool up = hd_start(&b, "vb", 1, a.addr, NULL, NULL);
  setenv("MEGAD", own_megad ? own_megad : "", 1);
  assert_true(up);
  assert_true(hd_wait_log(&a, "node vb runs mega 0.1.0, this node", 10000));
  assert_true(hd_wait_log(&b, "node va runs mega 0.1.0+", 10000));

  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, a.dir, 2, NULL);
  spec.nnodes_min = 2;
  spec.nproc_per_node = 1;
  char id[64], bid[64], want[512];
  mega_err err = {0};
  assert_int_equal(hd_submit(&a, &spec, id, sizeof id, &err), MEGA_OK);
  snprintf(want, sizeof want, "waiting: not enough nodes: the job needs 2 nodes with 1 free slot "
           "each, and 1 of 2 alive nodes has them; 1 more runs another build of mega (vb: "
           "0.1.0), not this coordinator's %s, and a job's ranks run one build: upgrade it", own);
  assert_true(hd_wait_log(&a, want, 10000));
  hd_tiny_spec(&spec, b.dir, 2, NULL);
  spec.nnodes_min = 2;
  spec.nproc_per_node = 1;
  assert_int_equal(hd_submit(&b, &spec, bid, sizeof bid, &err), MEGA_OK);
  snprintf(want, sizeof want, "1 more runs another build of mega (va: %s), not this "
           "coordinator's 0.1.0", own);
  assert_true(hd_wait_log(&b, want, 10000));

  /* a node of the coordinator's build: the job runs there and on va */
  assert_true(hd_start(&c, "vc", 1, a.addr, NULL, NULL));
  hd_watch w;
  hd_watch_job(&a, id, true, 60000, &w);
  assert_non_null(w.final);
  printf("%s", w.events_text);
  assert_int_equal(w.final->state, MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED);
  hd_watch_free(&w);
  assert_int_equal(events_of(&a, id, EVK(PLACED), "on vc"), 1);
  assert_int_equal(events_of(&a, id, EVK(PLACED), "on vb"), 0);
  assert_int_equal(events_of(&a, id, EVK(RESTARTING), NULL), 0);
  /* said once, or once more as vc joined (a view that knew vc before its
   * slots): one line per change of the view, not per try */
  int waits = events_of(&a, id, EVK(INFO), "waiting: ");
  assert_true(waits >= 1 && waits <= 2);

  /* the other build's job: still waiting, never placed, naming vc too (and
   * va, when its view had va's slot free then) */
  snprintf(want, sizeof want, "vc: %s), not this coordinator's 0.1.0", own);
  assert_true(hd_wait_log(&b, want, 10000));
  assert_int_equal(events_of(&b, bid, EVK(PLACED), NULL), 0);
  assert_int_equal(hd_cancel(&b, bid, NULL, &err), MEGA_OK);
  hd_cleanup(&c);
  hd_cleanup(&b);
  hd_cleanup(&a);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_unparsed_flag_is_named, teardown),
      cmocka_unit_test_teardown(test_other_build_coordinator_refused, teardown),
      cmocka_unit_test_teardown(test_other_build_node_not_placed, teardown),
      cmocka_unit_test_teardown(test_worker_of_other_build_refused, teardown),
      cmocka_unit_test_teardown(test_mixed_builds_wait_then_place, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
