/* Nodes gone for good (--peers mode): a dead node is asked less and less
 * often whether it is back, and `megactl nodes forget` drops it from every
 * view, refused while it answers or has ranks of a job; forgotten, it joins
 * again when its megad starts again. With etcd (skipped without it) a dead
 * node is forgotten the same way. Each case runs as a test of its own
 * (meson). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "etcd_fixture.h"
#include "harness.h"

static int state_of(hd *d, const char *id) {
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(d, NULL);
  int st = -1;
  for (size_t i = 0; ln && i < ln->n_nodes; i++)
    if (!strcmp(ln->nodes[i]->id, id)) st = ln->nodes[i]->state;
  if (ln) protobuf_c_message_free_unpacked(&ln->base, NULL);
  return st;
}

/* Waits up to ms until every one of d[0..n) lists id in state st (-1: not at all). */
static bool wait_state(hd *d, int n, const char *id, int st, int ms) {
  for (double t0 = hd_now_s(); hd_now_s() - t0 < ms / 1000.0; usleep(50000)) {
    int agree = 0;
    for (int i = 0; i < n; i++) agree += state_of(&d[i], id) == st;
    if (agree == n) return true;
  }
  return false;
}

/* Heartbeats the megad with /metrics on port has served (-1: no page). */
static long heartbeats_served(int port) {
  char *page = hd_http_get(port, "/metrics", NULL);
  const char *key = "mega_rpc_served_total{method=\"/mega.v1.Peer/Heartbeat\"} ";
  const char *at = page ? strstr(page, key) : NULL;
  long n = at ? atol(at + strlen(key)) : -1;
  free(page);
  return n;
}

/* megactl --server d nodes ARGS: its exit status, its output in out. */
static int nodes_cmd(hd *d, const char *args, char *out, size_t len) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "--server %s nodes %s", d->addr, args);
  return hd_megactl(out, len, cmd);
}

/* A node killed for good: its peers list it DEAD and heartbeated its
 * address every interval for ever (what answers there now counts them).
 * They back off to a probe every few seconds; forgotten, it leaves every
 * live view at once, and when its megad starts again it is back. */
static void test_dead_node_backs_off_then_is_forgotten(void **state) {
  (void)state;
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", hd_free_port());
  const char *fixed[] = {"--listen", listen, NULL};
  hd n[5];
  assert_true(hd_start(&n[0], "f1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "f2", 1, n[0].addr, NULL, fixed));
  assert_true(hd_start(&n[2], "f3", 1, n[0].addr, NULL, NULL));
  assert_true(hd_start(&n[4], "f4", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 4, 10000));
  assert_true(hd_wait_alive(&n[2], 4, 10000));
  char out[2048];
  /* refused: a node that answers, this node, a name nobody lists */
  assert_int_equal(nodes_cmd(&n[0], "forget f2", out, sizeof out), 1);
  assert_non_null(strstr(out, "node f2 is alive here"));
  assert_non_null(strstr(out, "stop its megad first"));
  assert_int_equal(nodes_cmd(&n[0], "forget f1", out, sizeof out), 1);
  assert_non_null(strstr(out, "cannot forget itself"));
  assert_int_equal(nodes_cmd(&n[0], "forget f7", out, sizeof out), 1);
  assert_non_null(strstr(out, "lists no node 'f7'"));
  assert_int_equal(nodes_cmd(&n[0], "forget", out, sizeof out), 2);
  assert_non_null(strstr(out, "which node?"));

  hd_kill(&n[1]);
  hd_kill(&n[4]);
  int dead = MEGA__V1__NODE_STATE__NODE_STATE_DEAD;
  hd pair[2] = {n[0], n[2]};
  assert_true(wait_state(pair, 2, "f2", dead, 10000));
  assert_true(wait_state(pair, 2, "f4", dead, 10000));
  /* another megad where f2 listened, knowing nobody: it counts the
   * heartbeats f1 and f3 still send to f2's address */
  int mport = hd_free_port();
  char maddr[64];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", mport);
  const char *there[] = {"--listen", listen, "--metrics-listen", maddr, NULL};
  assert_true(hd_start(&n[3], "f9", 1, NULL, NULL, there));
  long first = 0;
  for (double t0 = hd_now_s(); first < 1 && hd_now_s() - t0 < 15; usleep(50000))
    first = heartbeats_served(mport);
  assert_true(first >= 1); /* a dead node is still asked: it may come back */
  double t0 = hd_now_s();
  sleep(6); /* a rate, measured over a window */
  long probes = heartbeats_served(mport) - first;
  fprintf(stderr, "f1 and f3 sent %ld heartbeats to dead f2 in %.1f s\n", probes,
          hd_now_s() - t0);
  /* every 250 ms this would be about 48 */
  assert_true(probes <= 12);
  assert_int_equal(state_of(&n[0], "f2"), dead);
  assert_int_equal(state_of(&n[0], "f9"), -1);

  /* forgotten: no live view lists it */
  int rc = nodes_cmd(&n[0], "forget f2", out, sizeof out);
  fprintf(stderr, "%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "node f2 forgotten by: f1, f3\n"));
  assert_non_null(strstr(out, "not asked, being down: f4\n")); /* it keeps listing f2 */
  assert_int_equal(state_of(&n[0], "f2"), -1);
  assert_int_equal(state_of(&n[2], "f2"), -1);
  assert_true(hd_log_has(&n[2], "node f2 (127.0.0.1:"));
  assert_int_equal(state_of(&n[2], "f4"), dead);
  assert_int_equal(nodes_cmd(&n[2], "forget f4", out, sizeof out), 0);
  assert_non_null(strstr(out, "node f4 forgotten by: f3, f1\n"));
  assert_null(strstr(out, "down"));
  /* forgetting it again finds nothing to forget */
  assert_int_equal(nodes_cmd(&n[2], "forget f2", out, sizeof out), 1);
  assert_non_null(strstr(out, "lists no node 'f2'"));

  /* its megad starts again: it is back in both views */
  hd_kill(&n[3]);
  assert_true(hd_restart(&n[1], fixed));
  int alive = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  assert_true(wait_state(pair, 2, "f2", alive, 10000));
  hd_cleanup(&n[4]);
  hd_cleanup(&n[3]);
  hd_cleanup(&n[2]);
  hd_cleanup(&n[1]);
  hd_cleanup(&n[0]);
}

/* A node with ranks of a running job is not forgotten, on its own
 * coordinator's word; once the job is over it still answers, so it is not
 * forgotten either. */
static void test_forget_refused_while_job_has_ranks(void **state) {
  (void)state;
  hd n[2];
  assert_true(hd_start(&n[0], "r1", 1, NULL, NULL, NULL));
  assert_true(hd_start(&n[1], "r2", 1, n[0].addr, NULL, NULL));
  assert_true(hd_wait_alive(&n[0], 2, 10000));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, n[0].dir, 100000, NULL);
  spec.nproc_per_node = 1;
  spec.nnodes_min = spec.nnodes_max = 2;
  char id[64], out[2048];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  pid_t pids[64];
  assert_true(hd_wait_workers(&n[1], 1, 30000, pids));
  assert_int_equal(nodes_cmd(&n[0], "forget r2", out, sizeof out), 1);
  char want[128];
  snprintf(want, sizeof want, "node r2 has ranks of job %s (attempt 0)", id);
  if (!strstr(out, want)) fprintf(stderr, "got: %s\n", out);
  assert_non_null(strstr(out, want));
  assert_int_equal(hd_cancel(&n[0], id, "done", &err), MEGA_OK);
  assert_int_equal(nodes_cmd(&n[0], "forget r2", out, sizeof out), 1);
  assert_non_null(strstr(out, "node r2 is alive here"));
  assert_int_equal(state_of(&n[0], "r2"), MEGA__V1__NODE_STATE__NODE_STATE_ALIVE);
  hd_cleanup(&n[1]);
  hd_cleanup(&n[0]);
}

/* etcd mode: a node whose lease expired stays listed DEAD until forgotten;
 * its megad started again registers anew and is back. */
static void test_forget_in_etcd_mode(void **state) {
  (void)state;
  etcd_fx_require();
  etcd_fx fx;
  assert_true(etcd_fx_start(&fx, 1));
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  hd n[3];
  assert_true(hd_start(&n[0], "e1", 1, NULL, NULL, extra));
  assert_true(hd_start(&n[1], "e2", 1, NULL, NULL, extra));
  assert_true(hd_start(&n[2], "e3", 1, NULL, NULL, extra));
  assert_true(hd_wait_alive(&n[0], 3, 10000));
  assert_true(hd_wait_alive(&n[2], 3, 10000));
  hd_kill(&n[1]);
  hd pair[2] = {n[0], n[2]};
  assert_true(wait_state(pair, 2, "e2", MEGA__V1__NODE_STATE__NODE_STATE_DEAD, 15000));
  char out[2048];
  assert_int_equal(nodes_cmd(&n[0], "forget e2", out, sizeof out), 0);
  assert_non_null(strstr(out, "node e2 forgotten by: e1, e3\n"));
  assert_int_equal(state_of(&n[0], "e2"), -1);
  assert_int_equal(state_of(&n[2], "e2"), -1);
  assert_true(hd_restart(&n[1], extra));
  assert_true(wait_state(pair, 2, "e2", MEGA__V1__NODE_STATE__NODE_STATE_ALIVE, 15000));
  hd_cleanup(&n[2]);
  hd_cleanup(&n[1]);
  hd_cleanup(&n[0]);
  etcd_fx_stop(&fx);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_dead_node_backs_off_then_is_forgotten, teardown),
      cmocka_unit_test_teardown(test_forget_refused_while_job_has_ranks, teardown),
      cmocka_unit_test_teardown(test_forget_in_etcd_mode, teardown),
  };
  /* one test by name: test_megad_nodes NAME (meson runs each as its own test) */
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
