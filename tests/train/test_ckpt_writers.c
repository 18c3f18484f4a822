/* Several writers, one checkpoint (worker/ckpt/ckpt_writer.h): writers run as
 * threads, each with its own Gloo communicator from a FileStore, as the
 * ranks of a pipeline do. Shards are numbered across writers, the index and
 * the manifest cover every file, the manifest comes last (checked from
 * inside await_commit), a refused commit leaves nothing behind, and one
 * writer's failure fails the save without leaving files behind. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt_util.h"
#include "tiny_model.h"
#include "worker/backend/backend.h"
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_writer.h"
#include "worker/comm/comm.h"
#include "worker/model/gpt.h"
#include "worker/optim/optim.h"

#define W 3
#define LIMIT 8192 /* bytes: several shards per writer, wte alone in one */

typedef tu_model model;

static void model_make(model *m, uint64_t seed) { assert_true(tu_model_make(m, seed, 3, 0)); }
static void model_free(model *m) { tu_model_free(m); }

/* Writer k's tensors: a contiguous third of the model, as stages hold. */
static void part_of(const model *m, int k, size_t *first, size_t *count) {
  size_t per = (m->n + W - 1) / W;
  *first = (size_t)k * per;
  size_t end = *first + per < m->n ? *first + per : m->n;
  *count = end - *first;
}

typedef struct run {
  const char *save, *rdv;
  model *m;
  int64_t iteration;
  bool refuse;         /* await_commit says no */
  int dup_writer;      /* this writer gets two tensors of one name (-1: none) */
  /* filled by the writers */
  mega_status st[W];
  mega_err err[W];
  mega_ckpt_write_result res[W];
  uint64_t durable[W];
  int ndurable[W];
  bool manifest_seen_early, all_files_there;
  int awaited;
} run;

typedef struct writer_arg {
  run *r;
  int k;
  mega_ckpt_writer *w;
  mega_ckpt_param *params;
} writer_arg;

static void on_durable(void *arg, int64_t it, uint64_t bytes) {
  writer_arg *a = arg;
  (void)it;
  a->r->durable[a->k] = bytes;
  a->r->ndurable[a->k]++;
}

/* Called by the committer before it writes the manifest: every other file
 * is in the temp directory, and the manifest is not. */
static mega_status await_commit(void *arg, int64_t it, mega_err *err) {
  writer_arg *a = arg;
  run *r = a->r;
  r->awaited++;
  char tmp[700], p[800];
  snprintf(tmp, sizeof tmp, "%s/.tmp.iter_%07lld.a3", r->save, (long long)it);
  snprintf(p, sizeof p, "%s/manifest.json", tmp);
  r->manifest_seen_early = tu_exists(p);
  static const char *const want[] = {"config.json", "trainer_state.json",
                                     "model.safetensors.index.json",
                                     "optimizer.safetensors.index.json"};
  r->all_files_there = true;
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s", tmp, want[i]);
    r->all_files_there &= tu_exists(p);
  }
  r->all_files_there &= tu_count_prefix(tmp, "model-") > W;
  if (r->refuse) return mega_fail(err, MEGA_ERR_CANCELLED, "attempt 3 was superseded");
  return MEGA_OK;
}

static void *writer_main(void *arg) {
  writer_arg *a = arg;
  run *r = a->r;
  mega_store *store = NULL;
  mega_comm *comm = NULL;
  mega_err e = {0};
  mega_status st = mega_store_open_file(r->rdv, "writers", &store, &e);
  char group[32];
  snprintf(group, sizeof group, "ckpt%lld", (long long)r->iteration);
  if (st == MEGA_OK) st = mega_comm_create(store, group, a->k, W, NULL, 20000, &comm, &e);
  mega_store_close(store);
  if (st == MEGA_OK) {
    a->w = NULL;
    mega_ckpt_writer_config wc = {.save_dir = r->save, .cfg = &r->m->cfg, .comm = comm,
                                  .attempt = 3, .max_shard_bytes = LIMIT,
                                  .on_durable = on_durable, .await_commit = await_commit,
                                  .arg = a};
    size_t first, count;
    part_of(r->m, a->k, &first, &count);
    a->params = calloc(count + 1, sizeof *a->params);
    memcpy(a->params, r->m->cp + first, count * sizeof *a->params);
    if (a->k == r->dup_writer) a->params[1].name = a->params[0].name;
    st = mega_ckpt_writer_create(&wc, a->params, count, &a->w, &e);
    mega_ckpt_state s = {.iteration = r->iteration, .consumed_samples = 4 * r->iteration,
                         .optimizer_steps = r->iteration, .attempt = 3};
    /* the backend is the test's; staging only reads it */
    if (st == MEGA_OK) st = mega_ckpt_writer_stage(a->w, r->m->be, &s, &e);
    if (st == MEGA_OK) st = mega_ckpt_writer_write(a->w, &r->res[a->k], &e);
    mega_ckpt_writer_destroy(a->w);
    free(a->params);
  }
  mega_comm_destroy(comm);
  r->st[a->k] = st;
  r->err[a->k] = e;
  return NULL;
}

static void run_writers(run *r) {
  pthread_t t[W];
  writer_arg a[W];
  for (int k = 0; k < W; k++) {
    a[k] = (writer_arg){.r = r, .k = k};
    assert_int_equal(pthread_create(&t[k], NULL, writer_main, &a[k]), 0);
  }
  for (int k = 0; k < W; k++) pthread_join(t[k], NULL);
}

static void assert_same(const model *a, const model *b) {
  for (size_t i = 0; i < a->n; i++) {
    size_t bytes = a->cp[i].numel * sizeof(float);
    assert_memory_equal(a->cp[i].param, b->cp[i].param, bytes);
    assert_memory_equal(a->cp[i].exp_avg, b->cp[i].exp_avg, bytes);
    assert_memory_equal(a->cp[i].exp_avg_sq, b->cp[i].exp_avg_sq, bytes);
  }
}

static int64_t read_latest(const char *save) {
  char p[700];
  snprintf(p, sizeof p, "%s/latest_checkpointed_iteration.txt", save);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

static char dir[256], save[512], rdv[512];

static void fresh_rdv(const char *tag) {
  snprintf(rdv, sizeof rdv, "%s/rdv-%s", dir, tag);
  assert_int_equal(mkdir(rdv, 0755), 0);
}

static void test_writers_commit(void **state) {
  (void)state;
  model a, b;
  model_make(&a, 1);
  model_make(&b, 2);
  fresh_rdv("commit");
  run r = {.save = save, .rdv = rdv, .m = &a, .iteration = 5, .dup_writer = -1};
  run_writers(&r);
  for (int k = 0; k < W; k++)
    if (r.st[k] != MEGA_OK) fail_msg("writer %d: %s", k, r.err[k].msg);
  assert_int_equal(r.awaited, 1);          /* only the committer asks */
  assert_false(r.manifest_seen_early);     /* the manifest is written last */
  assert_true(r.all_files_there);
  assert_true(r.res[0].committer && r.res[0].committed);
  for (int k = 1; k < W; k++) assert_false(r.res[k].committer || r.res[k].committed);
  for (int k = 0; k < W; k++) {
    assert_int_equal(r.ndurable[k], 1);
    assert_int_equal(r.durable[k], r.res[k].bytes);
    assert_true(r.res[k].bytes > 0);
  }
  assert_int_equal(read_latest(save), 5);
  assert_int_equal(tu_count_prefix(save, ".tmp"), 0);

  char it[700], p[800];
  snprintf(it, sizeof it, "%s/iter_0000005", save);
  int nm = tu_count_prefix(it, "model-"), no = tu_count_prefix(it, "optimizer-");
  assert_true(nm > W && no > W);

  /* Each writer's tensors are in its own files, numbered in writer order. */
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", it);
  json_t *idx = json_load_file(p, 0, NULL);
  assert_non_null(idx);
  json_t *wmap = json_object_get(idx, "weight_map");
  assert_int_equal(json_object_size(wmap), a.n);
  int last_shard = 0;
  uint64_t data_bytes = 0;
  for (int k = 0; k < W; k++) {
    size_t first, count;
    part_of(&a, k, &first, &count);
    int lo = 1 << 30, hi = 0;
    for (size_t i = first; i < first + count; i++) {
      const char *f = json_string_value(json_object_get(wmap, a.cp[i].name));
      assert_non_null(f);
      int shard = 0, of = 0;
      assert_int_equal(sscanf(f, "model-%05d-of-%05d.safetensors", &shard, &of), 2);
      assert_int_equal(of, nm);
      lo = shard < lo ? shard : lo;
      hi = shard > hi ? shard : hi;
      data_bytes += a.cp[i].numel * 4;
    }
    assert_int_equal(lo, last_shard + 1); /* right after the previous writer's */
    last_shard = hi;
  }
  assert_int_equal(last_shard, nm);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(idx, "metadata"),
                                                      "total_size")), data_bytes);
  json_decref(idx);

  /* The manifest lists every other file with its size and crc32. */
  snprintf(p, sizeof p, "%s/manifest.json", it);
  json_t *man = json_load_file(p, 0, NULL);
  assert_non_null(man);
  assert_int_equal(json_integer_value(json_object_get(man, "iteration")), 5);
  assert_int_equal(json_integer_value(json_object_get(man, "attempt")), 3);
  json_t *files = json_object_get(man, "files");
  /* every file but the manifest itself (and ".", "..") */
  assert_int_equal(json_object_size(files) + 3, (size_t)tu_count_prefix(it, ""));
  uint64_t total = 0;
  const char *name;
  json_t *e;
  json_object_foreach(files, name, e) {
    char fp[900];
    snprintf(fp, sizeof fp, "%s/%s", it, name);
    uint64_t size;
    uint32_t crc;
    mega_err err = {0};
    assert_int_equal(mega_ckpt_file_sum(fp, &size, &crc, &err), MEGA_OK);
    assert_int_equal(size, json_integer_value(json_object_get(e, "size")));
    assert_int_equal(crc, json_integer_value(json_object_get(e, "crc32")));
    total += size;
  }
  assert_int_equal(r.res[0].total_bytes, total);
  json_decref(man);
  snprintf(p, sizeof p, "%s/trainer_state.json", it);
  json_t *ts = json_load_file(p, 0, NULL);
  assert_int_equal(json_integer_value(json_object_get(ts, "attempt")), 3);
  json_decref(ts);

  /* It loads whole, by name. */
  mega_err err = {0};
  char *path = NULL, *notice = NULL;
  assert_int_equal(mega_ckpt_resolve(save, &path, &notice, &err), MEGA_OK);
  assert_null(notice);
  mega_ckpt_state s;
  assert_int_equal(mega_ckpt_load(path, b.be, &b.cfg, NULL, b.cp, b.n, &s, &err), MEGA_OK);
  assert_same(&a, &b);
  assert_int_equal(s.iteration, 5);
  assert_int_equal(s.attempt, 3);
  free(path);
  model_free(&a);
  model_free(&b);
}

/* await_commit refusing: every writer's files are durable, nothing is
 * committed, latest still names the previous checkpoint, and the temp
 * directory is removed at once (a job that trains on through refusals, as
 * while etcd is away, once left one per save until its next start). */
static void test_writers_refused(void **state) {
  (void)state;
  model a;
  model_make(&a, 1);
  fresh_rdv("refused");
  run r = {.save = save, .rdv = rdv, .m = &a, .iteration = 6, .refuse = true, .dup_writer = -1};
  run_writers(&r);
  for (int k = 0; k < W; k++)
    if (r.st[k] != MEGA_OK) fail_msg("writer %d: %s", k, r.err[k].msg);
  assert_int_equal(r.awaited, 1);
  assert_false(r.res[0].committed);
  assert_int_equal(r.res[0].refused.status, MEGA_ERR_CANCELLED);
  assert_non_null(strstr(r.res[0].refused.msg, "superseded"));
  char p[700];
  snprintf(p, sizeof p, "%s/iter_0000006", save);
  assert_false(tu_exists(p));
  snprintf(p, sizeof p, "%s/.tmp.iter_0000006.a3/manifest.json", save);
  assert_false(tu_exists(p));
  assert_int_equal(tu_count_prefix(save, ".tmp"), 0);
  assert_true(read_latest(save) == 5 || read_latest(save) == -1);
  model_free(&a);
}

/* One writer fails: it and the committer both fail, naming it; the temp
 * directory is removed; latest is unchanged. */
static void test_writer_failure(void **state) {
  (void)state;
  model a;
  model_make(&a, 1);
  fresh_rdv("failure");
  int64_t before = read_latest(save);
  run r = {.save = save, .rdv = rdv, .m = &a, .iteration = 7, .dup_writer = 1};
  run_writers(&r);
  assert_int_equal(r.st[2], MEGA_OK); /* its own files were fine */
  assert_int_not_equal(r.st[1], MEGA_OK);
  assert_int_not_equal(r.st[0], MEGA_OK);
  if (!strstr(r.err[0].msg, "checkpoint writer 1") || !strstr(r.err[0].msg, "iteration 7"))
    fail_msg("committer: %s", r.err[0].msg);
  assert_int_equal(r.awaited, 0);
  char p[700];
  snprintf(p, sizeof p, "%s/iter_0000007", save);
  assert_false(tu_exists(p));
  assert_int_equal(tu_count_prefix(save, ".tmp"), 0);
  assert_int_equal(read_latest(save), before);
  model_free(&a);
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "writers");
  snprintf(save, sizeof save, "%s/save", dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_writers_commit),
      cmocka_unit_test(test_writers_refused),
      cmocka_unit_test(test_writer_failure),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
