/* The rendezvous through megad end to end: real daemons on loopback, real
 * megaw workers. A group costs each rank one KvGather (its set in the same
 * call), a group whose ranks all run on one node never reaches the
 * coordinator, and a rank that dies while its peers wait in their gathers
 * fails the job within seconds with the rank named, leaving no worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  return 0;
}

/* The count of method on a /metrics page; 0 when it has none. */
static long served(const char *page, const char *method) {
  char want[128];
  snprintf(want, sizeof want, "\nmega_rpc_served_total{method=\"/mega.v1.Peer/%s\"} ", method);
  const char *p = strstr(page, want);
  return p ? strtol(p + strlen(want), NULL, 10) : 0;
}

/* TP 2 x PP 2 on two nodes of two slots: each node runs one stage, so the
 * TP groups stay on their node and only the pipeline's groups (pp and embd)
 * meet at the coordinator: one KvGather per remote rank and group, and no
 * other key-value call. Then a gather that times out. */
static void test_gather_per_rank_and_group(void **state) {
  (void)state;
  int port = hd_free_port();
  char maddr[64];
  snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
  const char *mx[] = {"--metrics-listen", maddr, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "g1", 2, NULL, NULL, mx));
  assert_true(hd_start(&n2, "g2", 2, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2",
                         "--tensor-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, n1.dir, 3, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 2;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  if (!hd_succeeded(&n1, &w)) hd_dump_log(&n2);
  assert_true(hd_succeeded(&n1, &w));
  assert_int_equal(w.final->world_size, 4);
  hd_watch_free(&w);

  char *page = hd_http_get(port, "/metrics", NULL);
  assert_non_null(page);
  long gathers = served(page, "KvGather"), sets = served(page, "KvSet"),
       gets = served(page, "KvGet"), waits = served(page, "KvWait");
  fprintf(stderr, "the coordinator served KvGather %ld, KvSet %ld, KvGet %ld, KvWait %ld\n",
          gathers, sets, gets, waits);
  /* g2's two ranks, each in groups pp and embd; its tp group stayed on g2,
   * and g1's own ranks use its store directly */
  assert_int_equal(gathers, 4);
  assert_int_equal(sets + gets + waits, 0);
  free(page);

  /* a gather whose keys never come ends at its timeout, naming the key
   * missing, and leaves no wait behind; its set stays */
  char *keys[] = {"0", "1"};
  Mega__V1__KvSetRequest set = MEGA__V1__KV_SET_REQUEST__INIT;
  set.key = "2";
  set.value = (ProtobufCBinaryData){3, (uint8_t *)"abc"};
  Mega__V1__KvGatherRequest q = MEGA__V1__KV_GATHER_REQUEST__INIT;
  q.prefix = "lonely/";
  q.keys = keys;
  q.n_keys = 2;
  q.timeout_ms = 300;
  q.set = &set;
  ProtobufCMessage *resp = NULL;
  double t0 = hd_now_s();
  assert_int_not_equal(mega_rpc_unary(n1.ch, &mega_peer_kv_gather, &q.base, 10000, &resp, &err),
                       MEGA_OK);
  double took = hd_now_s() - t0;
  fprintf(stderr, "a lonely gather: %.2f s: %s\n", took, err.msg);
  assert_non_null(strstr(err.msg, "timed out after 300 ms waiting for key 'lonely/0'"));
  assert_true(took >= 0.25 && took < 5);
  Mega__V1__KvGetRequest g = MEGA__V1__KV_GET_REQUEST__INIT;
  g.key = "lonely/2";
  assert_int_equal(mega_rpc_unary(n1.ch, &mega_peer_kv_get, &g.base, 5000, &resp, &err), MEGA_OK);
  assert_true(((Mega__V1__KvGetResponse *)resp)->found);
  protobuf_c_message_free_unpacked(resp, NULL);
  assert_int_equal(hd_stop(&n2), 0);
  assert_int_equal(hd_stop(&n1), 0);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
}

/* A worker for n1 that stops itself before it runs megaw: rank 0 holds
 * back, so rank 1 (on n2) is left waiting in its gather. */
static void write_held_worker(const char *dir, char *path, size_t len) {
  snprintf(path, len, "%s/held-megaw.sh", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "#!/bin/sh\nkill -STOP $$\nexec '%s' \"$@\"\n", getenv("MEGAW"));
  fclose(f);
  assert_int_equal(chmod(path, 0700), 0);
}

/* Whether key exists in d's rendezvous store (a Peer KvGet that does not wait). */
static bool has_key(hd *d, const char *key) {
  Mega__V1__KvGetRequest q = MEGA__V1__KV_GET_REQUEST__INIT;
  q.key = (char *)key;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(d->ch, &mega_peer_kv_get, &q.base, 5000, &resp, &err) != MEGA_OK)
    return false;
  bool found = ((Mega__V1__KvGetResponse *)resp)->found;
  protobuf_c_message_free_unpacked(resp, NULL);
  return found;
}

/* One job of PP 2 on n1 (rank 0, held) and n2 (rank 1): waits until rank 1
 * is in its gather of group pp0, kills rank `victim`, and checks that the
 * job fails within seconds naming it, with no worker left anywhere. */
static void die_mid_rendezvous(hd *n1, hd *n2, int victim) {
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, n1->dir, 3, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(n1, &spec, id, sizeof id, &err), MEGA_OK);
  pid_t p0[64], p1[64];
  assert_true(hd_wait_workers(n1, 1, 20000, p0));
  assert_true(hd_wait_workers(n2, 1, 20000, p1));
  Mega__V1__Job *j = hd_get_job(n1, id, &err);
  assert_non_null(j);
  char mine[160], held[160];
  snprintf(mine, sizeof mine, "%s/%u/pp0/1", id, j->attempt);
  snprintf(held, sizeof held, "%s/%u/pp0/0", id, j->attempt);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* rank 1 has made its gather (its set comes in the same call); rank 0 is held */
  bool waiting = false;
  for (int t = 0; t < 20000 && !(waiting = has_key(n1, mine)); t += 50) usleep(50000);
  if (!waiting) {
    hd_dump_log(n1);
    hd_dump_log(n2);
  }
  assert_true(waiting);
  assert_false(has_key(n1, held));
  usleep(300000); /* the gather stays pending: rank 0 cannot answer it */
  assert_true(hd_pid_alive(p1[0]));
  double t0 = hd_now_s();
  assert_int_equal(kill(victim == 0 ? p0[0] : p1[0], SIGKILL), 0);
  hd_watch w;
  hd_watch_job(n1, id, false, 30000, &w);
  double took = hd_now_s() - t0;
  assert_non_null(w.final);
  fprintf(stderr, "rank %d killed mid-rendezvous: %s in %.2f s: %s\n", victim,
          w.final->state == STATE(FAILED) ? "FAILED" : "not failed", took, w.final->error);
  assert_int_equal(w.final->state, STATE(FAILED));
  char want[32];
  snprintf(want, sizeof want, "rank %d", victim);
  assert_non_null(strstr(w.final->error, want));
  assert_non_null(strstr(w.final->error, "signal 9"));
  assert_true(took < 15);
  hd_watch_free(&w);
  assert_true(hd_node_workers_gone(n1, 10000));
  assert_true(hd_node_workers_gone(n2, 10000));
}

static void test_rank_dies_mid_rendezvous(void **state) {
  (void)state;
  char dir[128], worker[256];
  hd_tmpdir(dir, sizeof dir);
  write_held_worker(dir, worker, sizeof worker);
  const char *x1[] = {"--worker", worker, NULL};
  hd n1, n2;
  assert_true(hd_start(&n1, "r1", 1, NULL, NULL, x1));
  assert_true(hd_start(&n2, "r2", 1, n1.addr, NULL, NULL));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  /* the rank that never came dies: its peer's gather must not wait it out */
  die_mid_rendezvous(&n1, &n2, 0);
  /* the rank waiting in its gather (forwarded by n2 to n1) dies */
  die_mid_rendezvous(&n1, &n2, 1);
  assert_int_equal(hd_stop(&n2), 0);
  assert_int_equal(hd_stop(&n1), 0);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
  hd_rmdir(dir);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_gather_per_rank_and_group, teardown),
      cmocka_unit_test_teardown(test_rank_dies_mid_rendezvous, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
