/* megad with --etcd-endpoints: membership from a real etcd (etcd_fixture.h;
 * skipped when etcd is not installed). Three megads with no --peers see each
 * other; one stopped (SIGSTOP) past its lease comes back as a new
 * incarnation; a kill -9 of one is seen by the others within seconds and a
 * clean stop as LEFT; --peers with --etcd-endpoints is refused; and a kill -9 of
 * one member of a 3-member etcd loses no node and does not disturb a job,
 * which trains on in the same attempt. A job's start and end change the
 * nodes' loads (mega/load/), which each node lists for the others, and not
 * the records every megad watches (mega/nodes/). A job of a thousand events
 * keeps its first and newest, in memory and in etcd; a cancel of an ended
 * job whose coordinator died is answered at once. A node that refused a
 * launch for want of slots is not placed on again before a newer view. A
 * --save that a live job of any node uses is refused on every node. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/model/jobhist.h"
#include "etcd_fixture.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s
#define NODE(s) MEGA__V1__NODE_STATE__NODE_STATE_##s

static etcd_fx fx;

static bool start_node(hd *d, const char *name, int slots) {
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  return hd_start(d, name, slots, NULL, NULL, extra);
}

/* node's state as d sees it; -1 when d does not list it. */
static int state_of(hd *d, const char *node) {
  Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
  int st = -1;
  for (size_t i = 0; r && i < r->n_nodes; i++)
    if (!strcmp(r->nodes[i]->id, node)) st = (int)r->nodes[i]->state;
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return st;
}

/* Seconds until d sees node in state want; -1 after ms. */
static double wait_state(hd *d, const char *node, int want, int ms) {
  double t0 = hd_now_s();
  while (hd_now_s() - t0 < ms / 1000.0) {
    if (state_of(d, node) == want) return hd_now_s() - t0;
    usleep(50 * 1000);
  }
  return -1;
}

static void test_nodes_meet_in_etcd(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 1));
  hd n1, n2, n3;
  assert_true(start_node(&n1, "n1", 2));
  assert_true(start_node(&n2, "n2", 2));
  assert_true(start_node(&n3, "n3", 2));
  assert_true(hd_wait_alive(&n1, 3, 10000));
  assert_true(hd_wait_alive(&n2, 3, 10000));
  assert_true(hd_wait_alive(&n3, 3, 10000));
  Mega__V1__ListNodesResponse *ln = hd_list_nodes(&n2, NULL);
  assert_non_null(ln);
  assert_int_equal(ln->n_nodes, 3);
  for (size_t i = 0; i < ln->n_nodes; i++) {
    assert_int_equal(ln->nodes[i]->slots, 2);
    assert_non_null(strstr(ln->nodes[i]->address, "127.0.0.1:"));
  }
  protobuf_c_message_free_unpacked(&ln->base, NULL);

  /* Stopped (SIGSTOP) past its TTL: the others lose it; when it runs again
   * it finds its session lost and comes back as a new incarnation. */
  Mega__V1__ListNodesResponse *before = hd_list_nodes(&n1, NULL);
  uint64_t inc = 0;
  for (size_t i = 0; before && i < before->n_nodes; i++)
    if (!strcmp(before->nodes[i]->id, "n2")) inc = before->nodes[i]->incarnation;
  if (before) protobuf_c_message_free_unpacked(&before->base, NULL);
  kill(n2.pid, SIGSTOP);
  assert_true(wait_state(&n1, "n2", NODE(DEAD), 15000) >= 0);
  kill(n2.pid, SIGCONT);
  assert_true(wait_state(&n1, "n2", NODE(ALIVE), 15000) >= 0);
  assert_true(hd_wait_alive(&n2, 3, 10000));
  assert_true(hd_log_has(&n2, "etcd session lost"));
  Mega__V1__ListNodesResponse *after = hd_list_nodes(&n1, NULL);
  for (size_t i = 0; after && i < after->n_nodes; i++)
    if (!strcmp(after->nodes[i]->id, "n2")) assert_true(after->nodes[i]->incarnation != inc);
  if (after) protobuf_c_message_free_unpacked(&after->base, NULL);

  /* kill -9: the lease (2 s) expires and everyone watching hears it */
  hd_kill(&n3);
  double t1 = wait_state(&n1, "n3", NODE(DEAD), 15000);
  double t2 = wait_state(&n2, "n3", NODE(DEAD), 15000);
  fprintf(stderr, "kill -9 of n3 seen as lost after %.2f s (n1), %.2f s (n2)\n", t1, t2);
  assert_true(t1 >= 0 && t2 >= 0);
  assert_true(hd_log_has(&n1, "lost its etcd registration"));

  /* a clean stop is a LEFT, at once */
  assert_int_equal(hd_stop(&n2), 0);
  double t3 = wait_state(&n1, "n2", NODE(LEFT), 5000);
  fprintf(stderr, "clean stop of n2 seen as LEFT after %.2f s\n", t3);
  assert_true(t3 >= 0);

  /* n3 comes back (a new incarnation on its state dir): alive again */
  assert_true(hd_restart(&n3, (const char *const[]){"--etcd-endpoints", fx.endpoints, NULL}));
  assert_true(wait_state(&n1, "n3", NODE(ALIVE), 10000) >= 0);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
  hd_cleanup(&n3);
  etcd_fx_stop(&fx);
}

static void test_peers_with_etcd_refused(void **state) {
  (void)state;
  hd d;
  const char *extra[] = {"--etcd-endpoints", "http://127.0.0.1:1", NULL};
  assert_false(hd_start(&d, "x", 1, "127.0.0.1:2", NULL, extra));
  assert_true(hd_log_has(&d, "--peers and --etcd-endpoints exclude each other"));
  hd_cleanup(&d);
  const char *bad[] = {"--etcd-endpoints", "127.0.0.1", NULL};
  assert_false(hd_start(&d, "y", 1, NULL, NULL, bad));
  assert_true(hd_log_has(&d, "is not host:port"));
  hd_cleanup(&d);
}

typedef struct kill_at {
  uint64_t iteration;
  bool done;
  double when;
} kill_at;

/* Kills etcd member 0 (every megad's first endpoint) mid-job. */
static void on_item(void *arg, const Mega__V1__WatchJobResponse *it) {
  kill_at *k = arg;
  if (k->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < k->iteration)
    return;
  k->done = true;
  k->when = hd_now_s();
  etcd_fx_kill(&fx, 0);
  fprintf(stderr, "killed etcd member e1 at iteration %llu\n",
          (unsigned long long)it->step->iteration);
}

#define ITERS 500 /* a few seconds of training across the kill */

static void test_etcd_member_loss_keeps_job(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 3));
  hd n1, n2;
  assert_true(start_node(&n1, "n1", 1));
  assert_true(start_node(&n2, "n2", 1));
  assert_true(hd_wait_alive(&n1, 2, 10000));
  assert_true(hd_wait_alive(&n2, 2, 10000));

  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, n1.dir, ITERS, extra);
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  kill_at k = {.iteration = 20};
  hd_watch w;
  hd_watch_job_cb(&n1, id, true, 120000, &w, on_item, &k);
  double after = hd_now_s() - k.when;
  fprintf(stderr, "the job trained %.1f s past the kill\n", after);
  assert_true(k.done);
  assert_true(hd_succeeded(&n1, &w));
  assert_int_equal(w.last_iteration, ITERS);
  assert_int_equal(w.redone, 0); /* no iteration trained twice: one attempt */
  for (int i = 1; i <= ITERS; i++) assert_int_equal(w.attempt[i], w.attempt[1]);
  hd_watch_free(&w);
  /* nobody was lost, on either side, over more than a lease's TTL (2 s)
   * after the kill: a node whose keepalives had not moved to a live member
   * would have been lost by then */
  if (after < 3.5) usleep((useconds_t)((3.5 - after) * 1e6));
  assert_int_equal(state_of(&n1, "n2"), NODE(ALIVE));
  assert_int_equal(state_of(&n2, "n1"), NODE(ALIVE));
  assert_false(hd_log_has(&n1, "lost its etcd registration"));
  assert_false(hd_log_has(&n2, "lost its etcd registration"));
  assert_false(hd_log_has(&n1, "etcd session lost"));
  assert_false(hd_log_has(&n2, "etcd session lost"));
  hd_cleanup(&n1);
  hd_cleanup(&n2);
  etcd_fx_stop(&fx);
}

/* ---- a job's start and end leave the watched node records alone ---- */

/* One etcd member and two megads, n1 and n2, one slot each, that see each other. */
static void start_pair(hd *n1, hd *n2) {
  assert_true(etcd_fx_start(&fx, 1));
  assert_true(start_node(n1, "n1", 1));
  assert_true(start_node(n2, "n2", 1));
  assert_true(hd_wait_alive(n1, 2, 10000));
  assert_true(hd_wait_alive(n2, 2, 10000));
}

/* "key mod_revision" of every key under root (a prefix under mega/) into
 * out, one a line, sorted as etcd lists them; the count of keys. */
static int revisions(const char *root, char *out, size_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "ETCDCTL_API=3 etcdctl --endpoints=%s --command-timeout=5s get %s --prefix "
           "--keys-only -w json 2>&1",
           fx.endpoints, root);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char json[65536];
  size_t n = fread(json, 1, sizeof json - 1, p);
  json[n] = 0;
  pclose(p);
  /* etcdctl's JSON gives keys in base64; a key's mod_revision is what moves */
  int keys = 0;
  size_t off = 0;
  out[0] = 0;
  for (const char *k = strstr(json, "\"key\":\""); k; k = strstr(k + 1, "\"key\":\"")) {
    const char *m = strstr(k, "\"mod_revision\":");
    assert_non_null(m);
    char key[256] = "";
    sscanf(k + 7, "%255[^\"]", key);
    off += (size_t)snprintf(out + off, len > off ? len - off : 0, "%s %lld\n", key,
                            atoll(m + 15));
    keys++;
  }
  return keys;
}

/* n's load as d lists it: slots used, and whether job id is among its jobs. */
static uint32_t load_of(hd *d, const char *node, const char *id, bool *has_job) {
  Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
  uint32_t used = UINT32_MAX;
  *has_job = false;
  for (size_t i = 0; r && i < r->n_nodes; i++) {
    if (strcmp(r->nodes[i]->id, node)) continue;
    used = r->nodes[i]->slots_used;
    for (size_t k = 0; k < r->nodes[i]->n_job_ids; k++)
      if (!strcmp(r->nodes[i]->job_ids[k], id)) *has_job = true;
  }
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return used;
}

/* Waits (up to ms) until d lists node with used slots and (or without) job id. */
static bool wait_load(hd *d, const char *node, uint32_t used, const char *id, bool job, int ms) {
  double t0 = hd_now_s();
  while (hd_now_s() - t0 < ms / 1000.0) {
    bool has;
    if (load_of(d, node, id, &has) == used && has == job) return true;
    usleep(50 * 1000);
  }
  return false;
}

static void test_job_leaves_node_records_alone(void **state) {
  (void)state;
  hd n1, n2;
  start_pair(&n1, &n2);
  char before[4096], after[4096], loads0[4096], loads1[4096];
  assert_int_equal(revisions("mega/nodes/", before, sizeof before), 2);
  assert_int_equal(revisions("mega/load/", loads0, sizeof loads0), 2);

  Mega__V1__JobSpec spec;
  const char *extra[] = {"--pipeline-model-parallel-size", "2", NULL};
  hd_tiny_spec(&spec, n1.dir, 1000000, extra); /* until cancelled */
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&n1, &spec, id, sizeof id, &err), MEGA_OK);
  /* each node lists the other's load, read from etcd, not watched */
  assert_true(wait_load(&n1, "n2", 1, id, true, 30000));
  assert_true(wait_load(&n2, "n1", 1, id, true, 30000));
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = id;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(mega_rpc_unary(n1.ch, &mega_control_cancel_job, &req.base, 10000, &resp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
  hd_watch w;
  hd_watch_job(&n1, id, true, 60000, &w);
  assert_non_null(w.final);
  assert_int_equal(w.final->state, STATE(CANCELLED));
  hd_watch_free(&w);
  assert_true(wait_load(&n1, "n2", 0, id, false, 30000));
  assert_true(wait_load(&n2, "n1", 0, id, false, 30000));

  /* the loads moved; the records every megad watches did not */
  assert_int_equal(revisions("mega/nodes/", after, sizeof after), 2);
  assert_int_equal(revisions("mega/load/", loads1, sizeof loads1), 2);
  if (strcmp(before, after)) fprintf(stderr, "before:\n%safter:\n%s", before, after);
  assert_string_equal(before, after);
  assert_string_not_equal(loads0, loads1);
  hd_cleanup(&n1);
  hd_cleanup(&n2);
  etcd_fx_stop(&fx);
}

/* ---- a long history stays bounded; an ended job needs no coordinator ---- */

/* How many keys etcd holds under prefix (a prefix under mega/). */
static int count_keys(const char *prefix) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "ETCDCTL_API=3 etcdctl --endpoints=%s --command-timeout=5s get %s --prefix "
           "--keys-only 2>&1",
           fx.endpoints, prefix);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, p))
    if (!strncmp(line, prefix, strlen(prefix))) n++;
  pclose(p);
  return n;
}

/* A job of 3 nodes on a cluster of 2 waits, for as long as it is let. */
static void submit_waiting(hd *d, char *id, size_t len) {
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "6", NULL};
  hd_tiny_spec(&spec, d->dir, 10, extra);
  spec.nnodes_min = spec.nnodes_max = 3;
  spec.nproc_per_node = 1;
  mega_err err = {0};
  mega_status st = hd_submit(d, &spec, id, len, &err);
  if (st != MEGA_OK) fprintf(stderr, "submit: %s\n", err.msg);
  assert_int_equal(st, MEGA_OK);
}

/* GetJob's events on d: the first MEGA_JOB_EVENTS_FIRST numbered from 1,
 * then the newest in a row up to the newest's number (returned), and the
 * count of those left out between. */
#define FIRST MEGA_JOB_EVENTS_FIRST
#define KEPT (MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST)
static uint64_t check_history(hd *d, const char *id) {
  mega_err err = {0};
  Mega__V1__GetJobResponse *h = hd_get_job_history(d, id, &err);
  if (!h) fprintf(stderr, "GetJob on %s: %s\n", d->name, err.msg);
  assert_non_null(h);
  if (h->n_events != KEPT)
    fprintf(stderr, "GetJob on %s: %zu events, %llu left out\n", d->name, h->n_events,
            (unsigned long long)h->events_left_out);
  assert_int_equal(h->n_events, KEPT);
  uint64_t last = h->events[KEPT - 1]->number;
  for (size_t i = 0; i < FIRST; i++) assert_int_equal(h->events[i]->number, i + 1);
  for (size_t i = FIRST; i < KEPT; i++) assert_int_equal(h->events[i]->number, last - KEPT + 1 + i);
  assert_int_equal(h->events_left_out, last - KEPT);
  assert_int_equal(h->events[0]->kind, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED);
  protobuf_c_message_free_unpacked(&h->base, NULL);
  return last;
}

/* megactl status (--json) of id through d, and where it says how many of
 * GetJob's events were left out: the count n1 gives, asked again should an
 * event (the job's "waiting", which a placement pass says up to 10 s after
 * the submit) come between the count and the status. NULL if it never says. */
static const char *status_gap(hd *d, const char *id, bool json, char *out, size_t cap) {
  for (int t = 0; t < 3; t++) {
    uint64_t left = check_history(d, id) - KEPT;
    char args[512], gap[64];
    snprintf(args, sizeof args, "--server %s status %s%s", d->addr, id, json ? " --json" : "");
    assert_int_equal(hd_megactl(out, cap, args), 0);
    snprintf(gap, sizeof gap, json ? "\"events_left_out\": %llu" : "... %llu events left out ...",
             (unsigned long long)left);
    const char *at = strstr(out, gap);
    if (at) return at;
  }
  return NULL;
}

/* A job with more than a thousand events (each RescaleJob of a waiting job
 * is one): GetJob answers its first and newest events and how many it left
 * out, megactl status says so where they were, etcd keeps only those
 * events' keys, and the node that takes the job over reads just those and
 * goes on numbering where the job was. */
static void test_long_history_is_bounded(void **state) {
  (void)state;
  hd n1, n2;
  start_pair(&n1, &n2);
  char id[64];
  submit_waiting(&n1, id, sizeof id);
  Mega__V1__RescaleJobRequest req = MEGA__V1__RESCALE_JOB_REQUEST__INIT;
  req.job_id = id;
  req.nnodes = 3;
  for (int i = 0; i < 1200; i++) {
    ProtobufCMessage *resp = NULL;
    mega_err err = {0};
    assert_int_equal(mega_rpc_unary(n1.ch, &mega_control_rescale_job, &req.base, 5000, &resp, &err),
                     MEGA_OK);
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  uint64_t last = check_history(&n1, id);
  assert_true(last > 1200);
  check_history(&n2, id); /* forwarded to n1 */

  static char out[65536];
  const char *at = status_gap(&n2, id, false, out, sizeof out);
  if (!at) fprintf(stderr, "megactl status:\n%s", out);
  assert_non_null(at);
  assert_non_null(strstr(at, "rescale to 3 nodes requested")); /* the newest follow */
  at = status_gap(&n1, id, true, out, sizeof out);
  if (!at) fprintf(stderr, "megactl status --json:\n%s", out);
  assert_non_null(at);
  last = check_history(&n1, id);

  /* etcd holds the kept events' keys, no more (the writes drain in order).
   * KEPT keys alone can be a moment of the drain (each new key's write
   * trims an old one): wait for the newest event's key too, or n2 takes the
   * job over from an older history and numbers on from there. */
  char prefix[128], newest[160];
  snprintf(prefix, sizeof prefix, "mega/j/%s/e/", id);
  snprintf(newest, sizeof newest, "%s%010llu", prefix, (unsigned long long)last - 1);
  int keys = 0;
  for (int t = 0; t < 100 && ((keys = count_keys(prefix)) != KEPT || count_keys(newest) != 1);
       t++)
    usleep(100 * 1000);
  assert_int_equal(keys, KEPT);
  assert_int_equal(count_keys(newest), 1);

  /* the coordinator killed: n2 takes the waiting job over from those keys */
  hd_kill(&n1);
  bool taken = false;
  for (int t = 0; t < 150 && !taken; t++) {
    Mega__V1__Job *j = hd_get_job(&n2, id, NULL);
    taken = j && !strcmp(j->coordinator_node_id, "n2") && !j->coordinator_unreachable_unix_ms;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    if (!taken) usleep(100 * 1000);
  }
  assert_true(taken);
  assert_true(hd_event_ms(&n2, id, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, 0,
                          "took the pending job over") > 0);
  assert_true(check_history(&n2, id) > last);
  assert_int_equal(hd_cancel(&n2, id, NULL, NULL), MEGA_OK);
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  etcd_fx_stop(&fx);
}

/* Waits up to ms until d lists job id in state want (etcd mode: from its
 * copy of the cluster's jobs, not asking the coordinator). */
static bool wait_copy_state(hd *d, const char *id, Mega__V1__JobState want, int ms) {
  for (int t = 0; t < ms; t += 50) {
    Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    bool seen = false;
    if (mega_rpc_unary(d->ch, &mega_control_list_jobs, &req.base, 5000, &resp, NULL) == MEGA_OK) {
      const Mega__V1__ListJobsResponse *r = (const void *)resp;
      for (size_t i = 0; i < r->n_jobs; i++)
        seen |= !strcmp(r->jobs[i]->id, id) && r->jobs[i]->state == want;
      protobuf_c_message_free_unpacked(resp, NULL);
    }
    if (seen) return true;
    usleep(50 * 1000);
  }
  return false;
}

/* CancelJob of a job that ended, asked of a survivor once the job's
 * coordinator is dead: answered at once from etcd's record (nothing to
 * stop), within the coordinator's lease and after it, and megactl says so
 * rather than wait for a takeover. */
static void test_cancel_ended_job_without_coordinator(void **state) {
  (void)state;
  hd n1, n2;
  start_pair(&n1, &n2);
  char id[64];
  submit_waiting(&n1, id, sizeof id);
  mega_err err = {0};
  assert_int_equal(hd_cancel(&n1, id, "done with it", &err), MEGA_OK);
  /* the end is in etcd (n2's copy has it) before the coordinator dies */
  assert_true(wait_copy_state(&n2, id, STATE(CANCELLED), 10000));
  hd_kill(&n1);

  for (int round = 0; round < 2; round++) {
    if (round) assert_true(wait_state(&n2, "n1", NODE(DEAD), 15000) >= 0); /* lease gone */
    Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
    req.job_id = id;
    ProtobufCMessage *resp = NULL;
    double t0 = hd_now_s();
    mega_status st = mega_rpc_unary(n2.ch, &mega_control_cancel_job, &req.base, 10000, &resp, &err);
    double took = hd_now_s() - t0;
    if (st != MEGA_OK) fprintf(stderr, "CancelJob on n2 (round %d): %s\n", round, err.msg);
    assert_int_equal(st, MEGA_OK);
    const Mega__V1__CancelJobResponse *r = (const void *)resp;
    assert_true(r->already_over);
    assert_int_equal(r->job->state, STATE(CANCELLED));
    assert_true(took < 2.0);
    protobuf_c_message_free_unpacked(resp, NULL);

    char out[4096], args[256];
    snprintf(args, sizeof args, "--server %s cancel %s", n2.addr, id);
    t0 = hd_now_s();
    int rc = hd_megactl(out, sizeof out, args);
    took = hd_now_s() - t0;
    if (rc || !strstr(out, "already cancelled; nothing to cancel") || took >= 3.0)
      fprintf(stderr, "megactl cancel on n2 (round %d, %.1f s, exit %d):\n%s", round, took, rc,
              out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "already cancelled; nothing to cancel"));
    assert_true(took < 3.0);
  }
  hd_cleanup(&n2);
  hd_cleanup(&n1);
  etcd_fx_stop(&fx);
}

/* State of job id on d, waiting up to ms for it to reach want; the last
 * state seen (-1: none). */
static int wait_job_state(hd *d, const char *id, int want, int ms) {
  int st = -1;
  for (double t0 = hd_now_s(); hd_now_s() - t0 < ms / 1000.0 && st != want;) {
    Mega__V1__Job *j = hd_get_job(d, id, NULL);
    st = j ? (int)j->state : -1;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    if (st != want) usleep(50 * 1000);
  }
  return st;
}

/* Nodes that refused a launch (their slots taken, by jobs of other
 * coordinators that their loads in etcd do not show yet) are not given the
 * next attempts as well: the coordinator counts each full until it has a
 * newer view of it, and tries the next node after a heartbeat interval
 * (half a second at most; no back-off, which is for nodes that do not
 * answer), so the job runs on the one that is free.
 * Here the loads are published only at registration (--heartbeat-interval
 * 30s), so the view stays stale for the whole test. Once, every retry went
 * to the first busy node again (the placement's order), backing off up to
 * 8 s, while a free node waited. */
static void test_refused_node_not_placed_again(void **state) {
  (void)state;
  assert_true(etcd_fx_start(&fx, 1));
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, "--heartbeat-interval", "30s",
                         "--heartbeat-timeout", "60s", NULL};
  hd n[5];
  for (int i = 0; i < 5; i++) { /* n1 lists them in this order */
    char name[8];
    snprintf(name, sizeof name, "n%d", i + 1);
    assert_true(hd_start(&n[i], name, 1, NULL, NULL, extra));
    assert_true(hd_wait_alive(&n[0], i + 1, 10000));
  }
  Mega__V1__JobSpec spec;
  char busy[3][64], id[64];
  mega_err err = {0};
  for (int i = 0; i < 3; i++) { /* n2, n3, n4 each run a job of their own */
    hd_tiny_spec(&spec, n[i + 1].dir, 1000000, NULL); /* runs until cancelled */
    spec.nnodes_min = spec.nnodes_max = 1;
    spec.nproc_per_node = 1;
    assert_int_equal(hd_submit(&n[i + 1], &spec, busy[i], sizeof busy[i], &err), MEGA_OK);
  }
  for (int i = 0; i < 3; i++)
    assert_int_equal(wait_job_state(&n[i + 1], busy[i], STATE(RUNNING), 10000), STATE(RUNNING));
  hd_tiny_spec(&spec, n[0].dir, 5, NULL); /* two nodes: n1 and, in n1's order, the free n5 */
  spec.nnodes_min = spec.nnodes_max = 2;
  spec.nproc_per_node = 1;
  assert_int_equal(hd_submit(&n[0], &spec, id, sizeof id, &err), MEGA_OK);
  assert_int_equal(wait_job_state(&n[0], id, STATE(SUCCEEDED), 10000), STATE(SUCCEEDED));
  Mega__V1__GetJobResponse *h = hd_get_job_history(&n[0], id, &err);
  assert_non_null(h);
  const Mega__V1__Job *j = h->job;
  assert_int_equal(j->attempt, 3); /* n2, n3 and n4 refused one attempt each */
  assert_int_equal(j->n_placement, 2);
  assert_string_equal(j->placement[1]->node_id, "n5");
  for (size_t i = 0; i < h->n_events; i++)
    if (strstr(h->events[i]->message, "next try in"))
      fail_msg("backed off: %s", h->events[i]->message);
  protobuf_c_message_free_unpacked(&h->base, NULL);
  for (int i = 0; i < 3; i++) { /* none of them disturbed */
    assert_int_equal(wait_job_state(&n[i + 1], busy[i], STATE(RUNNING), 1000), STATE(RUNNING));
    assert_int_equal(hd_cancel(&n[i + 1], busy[i], "done with it", &err), MEGA_OK);
  }
  hd_cleanup_all();
}

/* Two jobs saving into one directory overwrite each other's checkpoints. On
 * etcd the check must cover every node's jobs, not only the coordinator's
 * own: once, a second node took the same --save without a word. */
static void submit_saving(hd *d, const char *save, char *id, size_t len, mega_err *err,
                          mega_status want) {
  Mega__V1__JobSpec spec;
  const char *extra[] = {"--micro-batch-size", "1", "--global-batch-size", "6", "--save", save,
                         NULL};
  hd_tiny_spec(&spec, d->dir, 10, extra);
  spec.nnodes_min = spec.nnodes_max = 3; /* two nodes: it waits, pending */
  spec.nproc_per_node = 1;
  mega_status st = hd_submit(d, &spec, id, len, err);
  if (st != want) fprintf(stderr, "submit to %s: %s\n", d->name, err->msg);
  assert_int_equal(st, want);
}

static void test_save_in_use_on_any_node(void **state) {
  (void)state;
  hd n1, n2;
  start_pair(&n1, &n2);
  char save[300], first[64], other[64], want[160];
  snprintf(save, sizeof save, "%s/ck", n1.dir);
  mega_err err = {0};
  submit_saving(&n1, save, first, sizeof first, &err, MEGA_OK);
  assert_true(wait_copy_state(&n2, first, STATE(PENDING), 10000));
  snprintf(want, sizeof want, "is the checkpoint directory of job %s", first);
  hd *both[] = {&n2, &n1}; /* another node's job, then the coordinator's own */
  for (int i = 0; i < 2; i++) {
    memset(&err, 0, sizeof err);
    submit_saving(both[i], save, other, sizeof other, &err, MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, want));
  }
  /* once it has ended, its directory is free to resume from */
  assert_int_equal(hd_cancel(&n1, first, "done with it", &err), MEGA_OK);
  assert_true(wait_copy_state(&n2, first, STATE(CANCELLED), 10000));
  submit_saving(&n2, save, other, sizeof other, &err, MEGA_OK);
  assert_int_equal(hd_cancel(&n2, other, "done with it", &err), MEGA_OK);
  hd_cleanup_all();
  etcd_fx_stop(&fx);
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  etcd_fx_stop(&fx);
  return 0;
}

int main(int argc, char **argv) {
  etcd_fx_require();
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_nodes_meet_in_etcd, teardown),
      cmocka_unit_test_teardown(test_peers_with_etcd_refused, teardown),
      cmocka_unit_test_teardown(test_etcd_member_loss_keeps_job, teardown),
      cmocka_unit_test_teardown(test_job_leaves_node_records_alone, teardown),
      cmocka_unit_test_teardown(test_long_history_is_bounded, teardown),
      cmocka_unit_test_teardown(test_cancel_ended_job_without_coordinator, teardown),
      cmocka_unit_test_teardown(test_refused_node_not_placed_again, teardown),
      cmocka_unit_test_teardown(test_save_in_use_on_any_node, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
