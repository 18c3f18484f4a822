/* etcd away, end to end: megad on a real etcd (loopback) that is killed
 * and started again on its data, real workers. A running job trains on and
 * new jobs are refused until etcd is back; checkpoints do not stall
 * training while their commits wait for it. Skipped (77) where etcd is not
 * installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "etcd_fixture.h"
#include "harness.h"

#define STATE(s) MEGA__V1__JOB_STATE__JOB_STATE_##s

static etcd_fx fx;

/* ---- etcd away: jobs go on, new ones are refused until it is back ---- */

static uint64_t iteration_of(hd *d, const char *id) {
  Mega__V1__Job *j = hd_get_job(d, id, NULL);
  uint64_t it = j ? j->last_iteration : 0;
  if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
  return it;
}

static void test_etcd_away_refuses_new_jobs(void **state) {
  (void)state;
  const char *extra[] = {"--etcd-endpoints", fx.endpoints, NULL};
  hd d;
  assert_true(hd_start(&d, "a1", 2, NULL, NULL, extra));
  assert_true(hd_wait_alive(&d, 1, 10000));
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 20000, NULL);
  spec.nproc_per_node = 1;
  char id[64], id2[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  for (int t = 0; t < 100 && iteration_of(&d, id) < 5; t++) usleep(100000);
  etcd_fx_kill(&fx, 0);
  mega_status st = MEGA_OK;
  for (int t = 0; t < 100 && st == MEGA_OK; t++) { /* refused once a keepalive is a TTL late */
    st = hd_submit(&d, &spec, id2, sizeof id2, &err);
    if (st == MEGA_OK) usleep(100000);
  }
  assert_int_not_equal(st, MEGA_OK);
  if (!strstr(err.msg, "takes no new jobs while etcd is unreachable")) { fprintf(stderr, "refused: %s\n", err.msg); hd_dump_log(&d); }
  assert_non_null(strstr(err.msg, "takes no new jobs while etcd is unreachable"));
  uint64_t it = iteration_of(&d, id);
  usleep(1500000);
  assert_true(iteration_of(&d, id) > it); /* the running job trains on */
  assert_true(etcd_fx_restart(&fx, 0));
  st = !MEGA_OK;
  for (int t = 0; t < 100 && st != MEGA_OK; t++) {
    st = hd_submit(&d, &spec, id2, sizeof id2, &err);
    if (st != MEGA_OK) usleep(100000);
  }
  assert_int_equal(st, MEGA_OK);
  Mega__V1__Job *j = hd_get_job(&d, id, NULL);
  assert_non_null(j);
  assert_int_equal(j->attempt, 0); /* the same attempt throughout */
  assert_int_equal(j->state, STATE(RUNNING));
  protobuf_c_message_free_unpacked(&j->base, NULL);
  hd_cleanup(&d);
}

/* ---- etcd away for a while: checkpoints do not stall training ---- */

#define OUTAGE_ITERS 400000 /* more than any run trains: the test cancels the job */

typedef struct outage {
  hd *d;
  const char *id;
  hd_watch w;
  pthread_mutex_t mu;
  uint64_t last; /* the newest merged iteration */
  /* each merged iteration: when (unix ms), and how long its step took */
  int64_t *merged_ms;
  double *step_s;
} outage;

static void on_outage_item(void *arg, const Mega__V1__WatchJobResponse *it) {
  outage *o = arg;
  if (it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) return;
  uint64_t k = it->step->iteration;
  if (k > OUTAGE_ITERS) return;
  pthread_mutex_lock(&o->mu);
  o->merged_ms[k] = it->step->time_unix_ms;
  o->step_s[k] = it->step->step_time_s;
  o->last = k;
  pthread_mutex_unlock(&o->mu);
}

static void *outage_watch(void *arg) {
  outage *o = arg;
  hd_watch_job_cb(o->d, o->id, true, 300000, &o->w, on_outage_item, o);
  return NULL;
}

static uint64_t outage_last(outage *o) {
  pthread_mutex_lock(&o->mu);
  uint64_t k = o->last;
  pthread_mutex_unlock(&o->mu);
  return k;
}

/* Iterations of SAVE/.tmp.iter_NNNNNNN* at or below `upto` (temp
 * directories of saves that are over); the first one's name in left. */
static int temps_upto(const char *dir, uint64_t upto, char *left, size_t len) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    unsigned long long it;
    if (sscanf(e->d_name, ".tmp.iter_%llu", &it) != 1 || it > upto) continue;
    if (!n++) snprintf(left, len, "%s", e->d_name);
  }
  if (d) closedir(d);
  return n;
}

/* A job saving every 5 iterations trains through an etcd outage of
 * `seconds`: no save stalls it (rank 0 used to wait for a go-ahead that
 * could not come, up to the 60 s key-value timeout, and never got the one
 * pending when etcd came back), a commit skipped while the lease is not
 * known alive is an event, commits resume once etcd is back, and the
 * skipped saves leave no temp directory. */
static void etcd_outage(int seconds) {
  const char *eargs[] = {"--etcd-endpoints", fx.endpoints, NULL};
  hd d;
  assert_true(hd_start(&d, "o1", 1, NULL, NULL, eargs));
  assert_true(hd_wait_alive(&d, 1, 10000));
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", d.dir);
  const char *extra[] = {"--save", ckpt, "--save-interval", "5", NULL};
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, OUTAGE_ITERS, extra);
  spec.nproc_per_node = 1;
  char id[64];
  mega_err err = {0};
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);

  outage *o = calloc(1, sizeof *o);
  assert_non_null(o);
  o->d = &d;
  o->id = id;
  o->merged_ms = calloc(OUTAGE_ITERS + 1, sizeof *o->merged_ms);
  o->step_s = calloc(OUTAGE_ITERS + 1, sizeof *o->step_s);
  assert_true(o->merged_ms && o->step_s);
  pthread_mutex_init(&o->mu, NULL);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, outage_watch, o), 0);
  assert_true(hd_wait_checkpoint(&d, id, 10, 60000) >= 10);

  /* etcd away: kill -9 of its one member, started again on its data */
  etcd_fx_kill(&fx, 0);
  int64_t down_ms = hd_unix_ms();
  uint64_t down_at = outage_last(o);
  sleep((unsigned)seconds);
  uint64_t back_at = outage_last(o);
  assert_true(etcd_fx_restart(&fx, 0));
  int64_t back_ms = hd_unix_ms();
  fprintf(stderr, "etcd away %.1f s: iterations %llu to %llu trained meanwhile\n",
          (double)(back_ms - down_ms) / 1000, (unsigned long long)down_at,
          (unsigned long long)back_at);
  assert_true(back_at > down_at + 5); /* trained on, across saves */

  /* commits resume: one past what was trained while etcd was away */
  uint64_t resumed = hd_wait_checkpoint(&d, id, back_at + 1, 30000);
  if (!resumed) hd_dump_log(&d);
  assert_true(resumed > back_at);
  /* the saves that were over left no temp directory */
  char left[256] = "";
  int temps = temps_upto(ckpt, resumed, left, sizeof left);
  if (temps) fprintf(stderr, "%d temp directories left in %s, e.g. %s\n", temps, ckpt, left);
  assert_int_equal(temps, 0);

  /* the skipped commits were said, while etcd was away */
  Mega__V1__GetJobResponse *h = hd_get_job_history(&d, id, &err);
  assert_non_null(h);
  int64_t skipped_ms = 0, again_ms = 0;
  for (size_t i = 0; i < h->n_events; i++) {
    if (strstr(h->events[i]->message, "not committed") && !skipped_ms)
      skipped_ms = h->events[i]->time_unix_ms;
    if (strstr(h->events[i]->message, "checkpoints commit again") && !again_ms)
      again_ms = h->events[i]->time_unix_ms;
  }
  if (!skipped_ms || skipped_ms > back_ms || again_ms < down_ms)
    for (size_t i = 0; i < h->n_events; i++) fprintf(stderr, "event: %s\n", h->events[i]->message);
  assert_true(skipped_ms >= down_ms && skipped_ms <= back_ms);
  assert_true(again_ms >= skipped_ms);
  assert_int_equal(h->job->state, STATE(RUNNING));
  assert_int_equal(h->job->attempt, 0); /* the same attempt throughout */
  protobuf_c_message_free_unpacked(&h->base, NULL);

  Mega__V1__CancelJobRequest cr = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  cr.job_id = id;
  ProtobufCMessage *resp = NULL;
  assert_int_equal(mega_rpc_unary(d.ch, &mega_control_cancel_job, &cr.base, 10000, &resp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
  pthread_join(th, NULL);
  assert_true(o->w.final && o->w.final->state == STATE(CANCELLED));

  /* the longest time between two merged steps from the outage to the
   * resumed commit, less the later step's own time: a save's pause (the
   * tiny model saves in milliseconds), which must not wait for etcd */
  double worst = 0;
  uint64_t worst_at = 0;
  for (uint64_t k = down_at + 1; k <= resumed; k++) {
    if (!o->merged_ms[k] || !o->merged_ms[k - 1]) continue;
    double stall = (double)(o->merged_ms[k] - o->merged_ms[k - 1]) / 1000 - o->step_s[k];
    if (stall > worst) {
      worst = stall;
      worst_at = k;
    }
  }
  fprintf(stderr, "longest pause beyond a step while etcd was away or coming back: %.3f s "
                  "(before iteration %llu); commits resumed at iteration %llu\n",
          worst, (unsigned long long)worst_at, (unsigned long long)resumed);
  assert_true(worst < 3.0);
  hd_watch_free(&o->w);
  pthread_mutex_destroy(&o->mu);
  free(o->merged_ms);
  free(o->step_s);
  free(o);
  hd_cleanup(&d);
}

static void test_etcd_outage_keeps_saving(void **state) {
  (void)state;
  etcd_outage(5);
}

/* The setting: 20 s (suite long). */
static void test_etcd_outage_20s_keeps_saving(void **state) {
  (void)state;
  etcd_outage(20);
}

static int setup(void **state) {
  (void)state;
  return etcd_fx_start(&fx, 1) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  hd_cleanup_all();
  etcd_fx_stop(&fx);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  etcd_fx_require();
  const struct CMUnitTest all[] = {
      cmocka_unit_test_setup_teardown(test_etcd_away_refuses_new_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_etcd_outage_keeps_saving, setup, teardown),
      cmocka_unit_test_setup_teardown(test_etcd_outage_20s_keeps_saving, setup, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
