/* Where a job's ranks meet: megad's key-value store or etcd (issue 14 asks
 * which is faster, and why).
 *
 * W threads are W ranks, each with its own channel, doing what rendezvous
 * does: publish one key (its address), then wait until all W keys exist.
 *   megad: KvSet, then KvWait on all W keys (one call that answers when
 *          they exist), on the coordinator; workers reach it through their
 *          node's megad, a hop left out here for both stores.
 *   etcd:  Put, then a Watch of the prefix from the revision before the
 *          run, counting keys until W (a Range first, then a watch, would
 *          race; a watch from an old revision replays what it missed).
 * Each W runs 5 times on fresh keys; the figure is the median wall time
 * from the first publish to the last rank seeing all W keys.
 *
 *   build/bench/bench_rendezvous [W ...]   (default 8 32 128; skips without etcd) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/etcd_rpc.h"
#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"
#include "tests/daemon/etcd_fixture.h"
#include "tests/daemon/harness.h"

#define RUNS 5

typedef struct rank_ctx {
  const char *target;
  bool etcd;
  int rank, world, run;
  int64_t start_rev;
  pthread_barrier_t *go;
  double done_s;
  char err[MEGA_ERR_MSG_MAX];
} rank_ctx;

static void key_of(char *buf, size_t len, int run, int rank) {
  snprintf(buf, len, "rdv/%d/%05d", run, rank);
}

static bool megad_rank(rank_ctx *c, mega_rpc_channel *ch) {
  char key[64], val[64];
  key_of(key, sizeof key, c->run, c->rank);
  snprintf(val, sizeof val, "127.0.0.1:%d", 20000 + c->rank);
  Mega__V1__KvSetRequest set = MEGA__V1__KV_SET_REQUEST__INIT;
  set.key = key;
  set.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
  ProtobufCMessage *resp = NULL;
  mega_err e = {0};
  if (mega_rpc_unary(ch, &mega_peer_kv_set, &set.base, 30000, &resp, &e) != MEGA_OK) goto fail;
  protobuf_c_message_free_unpacked(resp, NULL);
  char **keys = calloc((size_t)c->world, sizeof *keys);
  char *store = calloc((size_t)c->world, 64);
  for (int r = 0; r < c->world; r++) {
    keys[r] = store + 64 * r;
    key_of(keys[r], 64, c->run, r);
  }
  Mega__V1__KvWaitRequest wait = MEGA__V1__KV_WAIT_REQUEST__INIT;
  wait.keys = keys;
  wait.n_keys = (size_t)c->world;
  wait.timeout_ms = 30000;
  mega_status s = mega_rpc_unary(ch, &mega_peer_kv_wait, &wait.base, 40000, &resp, &e);
  free(keys);
  free(store);
  if (s != MEGA_OK) goto fail;
  protobuf_c_message_free_unpacked(resp, NULL);
  return true;
fail:
  snprintf(c->err, sizeof c->err, "%s", e.msg);
  return false;
}

static bool etcd_rank(rank_ctx *c, mega_rpc_channel *ch) {
  char key[64], val[64], prefix[64], end[64];
  key_of(key, sizeof key, c->run, c->rank);
  snprintf(val, sizeof val, "127.0.0.1:%d", 20000 + c->rank);
  snprintf(prefix, sizeof prefix, "rdv/%d/", c->run);
  snprintf(end, sizeof end, "%s", prefix);
  end[strlen(end) - 1]++; /* the prefix's range end: its last byte plus one */
  Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
  put.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
  put.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
  ProtobufCMessage *resp = NULL;
  mega_err e = {0};
  if (mega_rpc_unary(ch, &etcd_kv_put, &put.base, 30000, &resp, &e) != MEGA_OK) goto fail;
  protobuf_c_message_free_unpacked(resp, NULL);
  Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
  cr.key = (ProtobufCBinaryData){strlen(prefix), (uint8_t *)prefix};
  cr.range_end = (ProtobufCBinaryData){strlen(end), (uint8_t *)end};
  cr.start_revision = c->start_rev + 1;
  Etcdserverpb__WatchRequest wr = ETCDSERVERPB__WATCH_REQUEST__INIT;
  wr.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
  wr.create_request = &cr;
  mega_rpc_stream *st = NULL;
  if (mega_rpc_stream_open(ch, &etcd_watch_watch, &wr.base, 40000, &st, &e) != MEGA_OK) goto fail;
  int seen = 0;
  while (seen < c->world) {
    ProtobufCMessage *m = NULL;
    if (mega_rpc_stream_next(st, &m, &e) != MEGA_OK || !m) {
      mega_rpc_stream_close(st);
      if (!m && !e.msg[0]) snprintf(e.msg, sizeof e.msg, "the watch ended early");
      goto fail;
    }
    seen += (int)((Etcdserverpb__WatchResponse *)m)->n_events;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  mega_rpc_stream_close(st);
  return true;
fail:
  snprintf(c->err, sizeof c->err, "%s", e.msg);
  return false;
}

static void *rank_main(void *arg) {
  rank_ctx *c = arg;
  mega_rpc_channel *ch = NULL;
  mega_err e = {0};
  if (mega_rpc_channel_new(c->target, NULL, &ch, &e) != MEGA_OK) {
    snprintf(c->err, sizeof c->err, "%s", e.msg);
    pthread_barrier_wait(c->go);
    return NULL;
  }
  /* connect before the clock starts: a job's ranks reach their store at
   * different times, but a connection is not what is compared */
  pthread_barrier_wait(c->go);
  if (c->etcd ? etcd_rank(c, ch) : megad_rank(c, ch)) c->done_s = hd_now_s();
  mega_rpc_channel_free(ch);
  return NULL;
}

static int64_t etcd_revision(const char *target) {
  mega_rpc_channel *ch = NULL;
  if (mega_rpc_channel_new(target, NULL, &ch, NULL) != MEGA_OK) return -1;
  Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
  rq.key = (ProtobufCBinaryData){1, (uint8_t *)"x"};
  ProtobufCMessage *resp = NULL;
  int64_t rev = -1;
  if (mega_rpc_unary(ch, &etcd_kv_range, &rq.base, 5000, &resp, NULL) == MEGA_OK) {
    rev = ((Etcdserverpb__RangeResponse *)resp)->header->revision;
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  mega_rpc_channel_free(ch);
  return rev;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One rendezvous of world ranks; its wall time in seconds (< 0: failed). */
static double one(const char *target, bool etcd, int world, int run) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)world + 1);
  rank_ctx *c = calloc((size_t)world, sizeof *c);
  pthread_t *t = calloc((size_t)world, sizeof *t);
  int64_t rev = etcd ? etcd_revision(target) : 0;
  for (int r = 0; r < world; r++) {
    c[r] = (rank_ctx){.target = target, .etcd = etcd, .rank = r, .world = world, .run = run,
                      .start_rev = rev, .go = &go};
    pthread_create(&t[r], NULL, rank_main, &c[r]);
  }
  pthread_barrier_wait(&go);
  double t0 = hd_now_s(), last = 0;
  for (int r = 0; r < world; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < world; r++) {
    if (c[r].err[0]) {
      fprintf(stderr, "rank %d (%s): %s\n", r, etcd ? "etcd" : "megad", c[r].err);
      last = -1;
      break;
    }
    if (c[r].done_s > last) last = c[r].done_s;
  }
  pthread_barrier_destroy(&go);
  free(c);
  free(t);
  return last < 0 ? -1 : last - t0;
}

int main(int argc, char **argv) {
  etcd_fx_require();
  int worlds[16] = {8, 32, 128}, nw = 3;
  if (argc > 1) {
    nw = 0;
    for (int i = 1; i < argc && nw < 16; i++) worlds[nw++] = atoi(argv[i]);
  }
  setenv("MEGAD", BENCH_MEGAD, 0);
  setenv("MEGAW", BENCH_MEGAW, 0);
  etcd_fx fx;
  hd d;
  if (!etcd_fx_start(&fx, 1) || !hd_start(&d, "rdv", 1, NULL, NULL, NULL)) return 1;
  const char *etcd_target = strstr(fx.endpoints, "//") ? strstr(fx.endpoints, "//") + 2
                                                       : fx.endpoints;
  char first[128];
  snprintf(first, sizeof first, "%.*s", (int)strcspn(etcd_target, ","), etcd_target);
  printf("rendezvous of W ranks (publish one key, wait for all W), median of %d, 1 etcd member\n",
         RUNS);
  printf("%6s %14s %14s\n", "W", "megad KV (ms)", "etcd (ms)");
  int run = 0;
  for (int i = 0; i < nw; i++) {
    double m[RUNS], e[RUNS];
    for (int k = 0; k < RUNS; k++) {
      m[k] = one(d.addr, false, worlds[i], run++);
      e[k] = one(first, true, worlds[i], run++);
    }
    qsort(m, RUNS, sizeof *m, cmp_d);
    qsort(e, RUNS, sizeof *e, cmp_d);
    printf("%6d %14.1f %14.1f\n", worlds[i], m[RUNS / 2] * 1000, e[RUNS / 2] * 1000);
    fflush(stdout);
  }
  hd_cleanup(&d);
  etcd_fx_stop(&fx);
  return 0;
}
