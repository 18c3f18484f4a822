/* A rendezvous at scale without the machines: N emulated nodes of 8 ranks
 * (no workers, no Gloo) speak the Peer protocol to one real megad, the job's
 * coordinator, making the calls their megad would make for their ranks'
 * groups, and this program times the whole rendezvous.
 *
 * The job: TP 8 x PP 8 x DP (ranks / 64), 8 ranks a node (one TP group a
 * node), the tiny GPT's groups in megaw's order (rank_comm.c): pp, dp,
 * embd (the first and last stage, tied embeddings), tp; one Gloo
 * communicator a group (a cpu rank). Each emulated node has a connection of
 * its own to the coordinator, as real nodes do. Every rank starts at once.
 *
 *   new (default): what megaw and megad do now (worker/comm/gloo_mesh.cc),
 *     per rank and group: one KvGather that sets its 36-byte records (one
 *     per peer) and returns the records meant for it (one slice of each
 *     peer's value). A TP group (all 8 ranks on one node) never reaches the
 *     coordinator: the node's megad serves it, so it is not played here.
 *   --old: what they did before (Gloo's connectFullMesh and the peer naming
 *     through the old store, each worker call one Peer call): KvSet of its
 *     hostname, a KvGet (that waits) of each lower rank's hostname, KvSet of
 *     its (S-1) 136-byte addresses, a KvWait and a KvGet of each peer's,
 *     KvSet of its connections' ends as text, a KvGet of each peer's.
 * Every answer is checked: a rank must get exactly what its peers put for
 * it (new), or values of the size they put (old).
 *
 * Printed per size: the wall time from the start to the last rank done,
 * the calls and bytes (requests, responses) the coordinator served, and
 * the CPU seconds of the coordinator (/proc) and of this program (which
 * plays every node, sharing the machine's cores with the coordinator).
 *
 *   build/bench/bench_rdv_load [--old] [--deadline S] [RANKS ...]
 *     RANKS: multiples of 64 (default 64 128 256 512 1024 2048 4096 8000);
 *     --deadline: give up on a size after S seconds (default 120), and skip
 *     the larger ones. MEGAD names the coordinator's megad (default: this
 *     build's), so an older build's megad can be measured with --old. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "core/topology.h"
#include "proto/mega_rpc.h"
#include "proto/rpc_bridge.h"
#include "proto/rpc_client.h"
#include "tests/daemon/harness.h"

#define PER_NODE 8
#define TP 8
#define PP 8
#define RECORD 36     /* gloo_mesh.cc's record */
#define GLOO_ADDR 136 /* Gloo's tcp address bytes */
#define NAME_LINE 18  /* "[127.0.0.1]:45678\n" */
#define CALL_MS 90000
#define WAIT_MS 60000

typedef struct group {
  char name[16];
  int pos, size;
} group;

enum step { S_GATHER, /* new */
            O_SET_HOST, O_GET_HOST, O_SET_ADDR, O_WAIT, O_GET, O_SET_NAMES, O_GET_NAMES, /* old */
            S_DONE };

typedef struct lg lg;

typedef struct rk {
  lg *g;
  int rank;
  mega_rpc_channel *ch; /* its node's */
  group groups[4];
  int ngroups, gi;
  enum step step;
  int i; /* the peer in an old loop */
  mega_rpc_pending *pending;
} rk;

struct lg {
  bool old;
  char prefix[64];
  mega_rpc_cq *cq;
  uv_loop_t *loop;
  uv_timer_t deadline;
  rk *ranks;
  int nranks, done, failed, in_flight;
  bool gave_up;
  double calls, sent, received;
  char first_error[512];
};

static void advance(rk *r);

static void fail(rk *r, const char *what) {
  lg *g = r->g;
  if (!g->first_error[0])
    snprintf(g->first_error, sizeof g->first_error, "rank %d, group %s: %s", r->rank,
             r->gi < r->ngroups ? r->groups[r->gi].name : "-", what);
  g->failed++;
  r->step = S_DONE;
}

/* The bytes rank `from` of a group puts for rank `to` (new: a record). */
static void record_for(const group *gr, int from, int to, bool ends, uint8_t *out) {
  memset(out, 0, RECORD);
  snprintf((char *)out, RECORD, "%s%s %d>%d", ends ? "e" : "a", gr->name, from, to);
}

static void key_of(const lg *g, const group *gr, const char *sub, int pos, char *out, size_t n) {
  snprintf(out, n, "%s/%s/%s%d", g->prefix, gr->name, sub, pos);
}

static void on_reply(void *arg, ProtobufCMessage *resp, const mega_err *err);

static void call(rk *r, const mega_rpc_method *m, const ProtobufCMessage *req) {
  lg *g = r->g;
  mega_err e = {0};
  g->calls++;
  g->sent += (double)protobuf_c_message_get_packed_size(req);
  if (mega_rpc_unary_async(r->ch, g->cq, m, req, CALL_MS, on_reply, r, &r->pending, &e) !=
      MEGA_OK) {
    fail(r, e.msg);
    g->done++;
    return;
  }
  g->in_flight++;
}

static void set_key(rk *r, const char *key, const uint8_t *val, size_t len) {
  Mega__V1__KvSetRequest q = MEGA__V1__KV_SET_REQUEST__INIT;
  q.key = (char *)key;
  q.value = (ProtobufCBinaryData){len, (uint8_t *)val};
  call(r, &mega_peer_kv_set, &q.base);
}

static void get_key(rk *r, const char *key) {
  Mega__V1__KvGetRequest q = MEGA__V1__KV_GET_REQUEST__INIT;
  q.key = (char *)key;
  q.wait_ms = WAIT_MS;
  call(r, &mega_peer_kv_get, &q.base);
}

/* ---- new: one gather (with the rank's set) a group ---- */

static void new_gather(rk *r, bool ends) {
  const group *gr = &r->groups[r->gi];
  size_t n = (size_t)gr->size - 1, at = 0;
  uint8_t *v = malloc(n * RECORD + 1);
  for (int j = 0; j < gr->size; j++)
    if (j != gr->pos) record_for(gr, gr->pos, j, ends, v + RECORD * at++);
  char **keys = calloc(n, sizeof *keys), *store = calloc(n, 16), prefix[96], mine[16];
  uint32_t *part = calloc(n, sizeof *part);
  snprintf(prefix, sizeof prefix, "%s/%s/", r->g->prefix, gr->name);
  snprintf(mine, sizeof mine, "%d", gr->pos);
  for (int j = 0, k = 0; j < gr->size; j++) {
    if (j == gr->pos) continue;
    keys[k] = store + 16 * k;
    snprintf(keys[k], 16, "%d", j);
    part[k++] = (uint32_t)(gr->pos < j ? gr->pos : gr->pos - 1);
  }
  Mega__V1__KvSetRequest set = MEGA__V1__KV_SET_REQUEST__INIT;
  set.key = mine;
  set.value = (ProtobufCBinaryData){n * RECORD, v};
  Mega__V1__KvGatherRequest q = MEGA__V1__KV_GATHER_REQUEST__INIT;
  q.prefix = prefix;
  q.set = &set;
  q.keys = keys;
  q.n_keys = n;
  q.timeout_ms = WAIT_MS;
  q.parts = (uint32_t)n;
  q.part = part;
  q.n_part = n;
  call(r, &mega_peer_kv_gather, &q.base);
  free(keys);
  free(store);
  free(part);
  free(v);
}

static bool new_check(rk *r, const Mega__V1__KvGatherResponse *g, bool ends) {
  const group *gr = &r->groups[r->gi];
  if (g->n_values != (size_t)gr->size - 1) {
    fail(r, "a gather answered with the wrong number of values");
    return false;
  }
  uint8_t want[RECORD];
  for (int j = 0, k = 0; j < gr->size; j++) {
    if (j == gr->pos) continue;
    record_for(gr, j, gr->pos, ends, want);
    if (g->values[k].len != RECORD || memcmp(g->values[k].data, want, RECORD)) {
      fail(r, "a gather answered with another rank's record");
      return false;
    }
    k++;
  }
  return true;
}

/* ---- old: Gloo's connectFullMesh and the peer naming, call by call ---- */

static void old_step(rk *r) {
  const group *gr = &r->groups[r->gi];
  char key[128];
  uint8_t *v;
  switch (r->step) {
  case O_SET_HOST:
    snprintf((char *)key, sizeof key, "%s/%s/rank_%d", r->g->prefix, gr->name, gr->pos);
    char host[32];
    snprintf(host, sizeof host, "node%d", r->rank / PER_NODE);
    set_key(r, key, (const uint8_t *)host, strlen(host));
    return;
  case O_GET_HOST:
    snprintf(key, sizeof key, "%s/%s/rank_%d", r->g->prefix, gr->name, r->i);
    get_key(r, key);
    return;
  case O_SET_ADDR:
    v = calloc((size_t)gr->size - 1, GLOO_ADDR);
    key_of(r->g, gr, "", gr->pos, key, sizeof key);
    set_key(r, key, v, ((size_t)gr->size - 1) * GLOO_ADDR);
    free(v);
    return;
  case O_WAIT: {
    key_of(r->g, gr, "", r->i, key, sizeof key);
    char *keys[1] = {key};
    Mega__V1__KvWaitRequest q = MEGA__V1__KV_WAIT_REQUEST__INIT;
    q.keys = keys;
    q.n_keys = 1;
    q.timeout_ms = WAIT_MS;
    call(r, &mega_peer_kv_wait, &q.base);
    return;
  }
  case O_GET:
    key_of(r->g, gr, "", r->i, key, sizeof key);
    get_key(r, key);
    return;
  case O_SET_NAMES:
    v = malloc((size_t)gr->size * NAME_LINE);
    memset(v, 'a', (size_t)gr->size * NAME_LINE);
    key_of(r->g, gr, "mega-addrs/", gr->pos, key, sizeof key);
    set_key(r, key, v, (size_t)gr->size * NAME_LINE);
    free(v);
    return;
  case O_GET_NAMES:
    key_of(r->g, gr, "mega-addrs/", r->i, key, sizeof key);
    get_key(r, key);
    return;
  default:
    return;
  }
}

/* The next peer of an old loop from r->i on (skipping r's own position);
 * false when the loop is over. */
static bool next_peer(rk *r, int limit) {
  if (r->i == r->groups[r->gi].pos) r->i++;
  return r->i < limit;
}

static bool old_check(rk *r, ProtobufCMessage *resp) {
  const group *gr = &r->groups[r->gi];
  if (resp->descriptor != &mega__v1__kv_get_response__descriptor) return true;
  const Mega__V1__KvGetResponse *g = (const void *)resp;
  size_t want = r->step == O_GET_HOST ? 0
                : r->step == O_GET    ? ((size_t)gr->size - 1) * GLOO_ADDR
                                      : (size_t)gr->size * NAME_LINE;
  if (!g->found || (want && g->value.len != want)) {
    fail(r, g->found ? "a get answered with a value of another size" : "a get found nothing");
    return false;
  }
  return true;
}

/* ---- the state machine ---- */

static void next_group(rk *r) {
  r->gi++;
  r->step = r->gi >= r->ngroups ? S_DONE : r->g->old ? O_SET_HOST : S_GATHER;
}

/* After the answer to the step in r->step: the step after it. */
static void after(rk *r) {
  const group *gr = &r->groups[r->gi];
  switch (r->step) {
  case S_GATHER: next_group(r); break;
  case O_SET_HOST:
    r->i = 0;
    r->step = r->i < gr->pos ? O_GET_HOST : O_SET_ADDR;
    break;
  case O_GET_HOST:
    if (++r->i >= gr->pos) r->step = O_SET_ADDR;
    break;
  case O_SET_ADDR:
    r->i = 0;
    r->step = next_peer(r, gr->size) ? O_WAIT : O_SET_NAMES;
    break;
  case O_WAIT: r->step = O_GET; break;
  case O_GET:
    r->i++;
    r->step = next_peer(r, gr->size) ? O_WAIT : O_SET_NAMES;
    break;
  case O_SET_NAMES:
    r->i = 0;
    if (next_peer(r, gr->size)) r->step = O_GET_NAMES;
    else next_group(r);
    break;
  case O_GET_NAMES:
    r->i++;
    if (!next_peer(r, gr->size)) next_group(r);
    break;
  default: break;
  }
}

static void advance(rk *r) {
  lg *g = r->g;
  if (g->gave_up && r->step != S_DONE) {
    fail(r, "not done by the deadline");
    g->done++;
    return;
  }
  switch (r->step) {
  case S_GATHER: new_gather(r, false); break;
  case S_DONE: g->done++; break;
  default: old_step(r); break;
  }
}

static void on_reply(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  rk *r = arg;
  lg *g = r->g;
  r->pending = NULL;
  g->in_flight--;
  if (!resp) {
    fail(r, err->msg);
    g->done++;
  } else {
    g->received += (double)protobuf_c_message_get_packed_size(resp);
    bool ok = true;
    if (r->step == S_GATHER) ok = new_check(r, (const void *)resp, false);
    else if (g->old)
      ok = old_check(r, resp);
    protobuf_c_message_free_unpacked(resp, NULL);
    if (ok) after(r);
    if (ok || r->step != S_DONE) advance(r);
    else g->done++;
  }
  if (g->done == g->nranks) uv_timer_stop(&g->deadline);
}

static void on_deadline(uv_timer_t *t) {
  lg *g = t->data;
  g->gave_up = true;
  for (int i = 0; i < g->nranks; i++)
    if (g->ranks[i].pending) mega_rpc_pending_cancel(g->ranks[i].pending);
}

/* ---- a size ---- */

/* old: every group at the coordinator; new: a TP group (one node's 8
 * ranks) stays on its node. */
static void plan_groups(rk *r, const mega_topo *t, bool old) {
  static const struct {
    mega_group_kind kind;
    const char *name;
  } order[] = {{MEGA_GROUP_PP, "pp"}, {MEGA_GROUP_DP, "dp"}, {MEGA_GROUP_EMBD, "embd"},
               {MEGA_GROUP_TP, "tp"}};
  for (size_t k = 0; k < 4; k++) {
    int pos = 0, idx = mega_topo_group_of(t, order[k].kind, r->rank, &pos);
    int size = mega_topo_group_size(t, order[k].kind);
    if (idx < 0 || size < 2 || (!old && order[k].kind == MEGA_GROUP_TP)) continue;
    group *gr = &r->groups[r->ngroups++];
    snprintf(gr->name, sizeof gr->name, "%s%d", order[k].name, idx);
    gr->pos = pos;
    gr->size = size;
  }
}

static double cpu_s_of(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt
   * cmajflt utime stime */
  if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

static void on_warm(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  (void)err;
  int *left = arg;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  (*left)--;
}

static void cq_closed(void *arg) { (void)arg; }

/* One rendezvous of nranks; false when it failed or ran out of time. */
static bool run_size(int nranks, bool old, int deadline_s) {
  mega_err e = {0};
  mega_topo t;
  if (mega_topo_init(&t, nranks, TP, PP, &e) != MEGA_OK) {
    fprintf(stderr, "%d ranks: %s\n", nranks, e.msg);
    return false;
  }
  hd d;
  if (!hd_start(&d, "coord", 1, NULL, NULL, NULL)) return false;
  uv_loop_t loop;
  uv_loop_init(&loop);
  lg g = {.old = old, .loop = &loop, .nranks = nranks};
  snprintf(g.prefix, sizeof g.prefix, "j-1-bench/1");
  if (mega_rpc_cq_new(&loop, &g.cq, &e) != MEGA_OK) {
    fprintf(stderr, "%s\n", e.msg);
    return false;
  }
  int nnodes = nranks / PER_NODE;
  mega_rpc_channel **ch = calloc((size_t)nnodes, sizeof *ch);
  mega_rpc_channel_opts o = {.peer_name = "the coordinator", .own_connection = true};
  int left = nnodes;
  for (int n = 0; n < nnodes; n++) {
    if (mega_rpc_channel_new(d.addr, &o, &ch[n], &e) != MEGA_OK) {
      fprintf(stderr, "%s\n", e.msg);
      return false;
    }
    /* a connection before the clock starts, as a node's megad has one */
    Mega__V1__KvGetRequest q = MEGA__V1__KV_GET_REQUEST__INIT;
    q.key = "warm";
    if (mega_rpc_unary_async(ch[n], g.cq, &mega_peer_kv_get, &q.base, 30000, on_warm, &left,
                             NULL, &e) != MEGA_OK)
      left--;
  }
  while (left > 0) uv_run(&loop, UV_RUN_ONCE);
  g.ranks = calloc((size_t)nranks, sizeof *g.ranks);
  for (int i = 0; i < nranks; i++) {
    rk *r = &g.ranks[i];
    r->g = &g;
    r->rank = i;
    r->ch = ch[i / PER_NODE];
    plan_groups(r, &t, old);
    r->step = r->ngroups ? (old ? O_SET_HOST : S_GATHER) : S_DONE;
  }
  uv_timer_init(&loop, &g.deadline);
  g.deadline.data = &g;
  uv_timer_start(&g.deadline, on_deadline, (uint64_t)deadline_s * 1000, 0);
  double cpu0 = cpu_s_of(d.pid), self0 = self_cpu_s(), t0 = hd_now_s();
  for (int i = 0; i < nranks; i++) advance(&g.ranks[i]);
  while (g.done < g.nranks || g.in_flight) uv_run(&loop, UV_RUN_ONCE);
  double wall = hd_now_s() - t0, cpu = cpu_s_of(d.pid) - cpu0, self = self_cpu_s() - self0;
  bool ok = !g.failed;
  if (ok)
    printf("%6d %6d %4d %9.0f %8.1f %8.1f %8.2f %8.2f %8.2f\n", nranks, nnodes, t.dp, g.calls,
           g.sent / 1e6, g.received / 1e6, wall, cpu, self);
  else
    printf("%6d %6d %4d %9.0f %8.1f %8.1f  %s after %.1f s (%d of %d ranks failed; first: %s)\n",
           nranks, nnodes, t.dp, g.calls, g.sent / 1e6, g.received / 1e6,
           g.gave_up ? "NOT DONE" : "FAILED", wall, g.failed, nranks, g.first_error);
  fflush(stdout);
  uv_close((uv_handle_t *)&g.deadline, NULL);
  for (int n = 0; n < nnodes; n++) mega_rpc_channel_free(ch[n]);
  free(ch);
  mega_rpc_cq_close(g.cq, cq_closed, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(g.ranks);
  hd_kill(&d);
  hd_cleanup(&d);
  return ok;
}

int main(int argc, char **argv) {
  setenv("MEGAD", BENCH_MEGAD, 0);
  setenv("MEGAW", BENCH_MEGAW, 0);
  bool old = false;
  int deadline_s = 120, sizes[32], n = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--old")) old = true;
    else if (!strcmp(argv[i], "--deadline") && i + 1 < argc) deadline_s = atoi(argv[++i]);
    else if (n < 32 && atoi(argv[i]) > 0 && atoi(argv[i]) % (TP * PP) == 0)
      sizes[n++] = atoi(argv[i]);
    else {
      fprintf(stderr, "usage: %s [--old] [--deadline S] [RANKS (multiples of %d) ...]\n", argv[0],
              TP * PP);
      return 2;
    }
  }
  if (!n) {
    int def[] = {64, 128, 256, 512, 1024, 2048, 4096, 8000};
    for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) sizes[n++] = def[i];
  }
  double load[3] = {0};
  getloadavg(load, 3);
  printf("rendezvous of TP %d x PP %d x DP ranks/64, %d ranks a node, %s protocol, against %s; "
         "load average %.2f at the start\n",
         TP, PP, PER_NODE, old ? "the old" : "the new", getenv("MEGAD"), load[0]);
  printf("%6s %6s %4s %9s %8s %8s %8s %8s %8s\n", "ranks", "nodes", "DP", "calls", "MB in",
         "MB out", "wall s", "coord s", "gen s");
  for (int i = 0; i < n; i++)
    if (!run_size(sizes[i], old, deadline_s)) {
      for (int k = i + 1; k < n; k++)
        printf("%6d  skipped (a smaller size did not finish)\n", sizes[k]);
      break;
    }
  printf("calls: Peer calls made (one per worker call, as the node's megad forwards them); MB "
         "in/out: their requests and responses (protobuf bytes); coord s, gen s: CPU seconds of "
         "the coordinator and of this generator (all nodes) during the rendezvous\n");
  return 0;
}
