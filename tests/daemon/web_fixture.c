/* The web tests' shared pieces (web_fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "web_fixture.h"

char *wf_args[] = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                   "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size",
                   "8", "--train-iters", "100", "--pipeline-model-parallel-size", "2"};
const size_t wf_nargs = sizeof wf_args / sizeof wf_args[0];

void wf_step(Mega__V1__StepMetrics *s, Mega__V1__RankMetrics *rm, Mega__V1__RankMetrics **rp,
             uint64_t it, uint32_t attempt, uint32_t world) {
  *s = (Mega__V1__StepMetrics)MEGA__V1__STEP_METRICS__INIT;
  s->iteration = it;
  s->attempt = attempt;
  s->loss = 5.0 - (double)it / 100;
  s->tokens_per_s = 1000;
  s->step_time_s = 0.1;
  s->time_unix_ms = 1000 + (int64_t)it * 100;
  s->has_eval_loss = it % 10 == 0;
  s->eval_loss = 4.5;
  for (uint32_t r = 0; r < world; r++) {
    rm[r] = (Mega__V1__RankMetrics)MEGA__V1__RANK_METRICS__INIT;
    rm[r].rank = r;
    rm[r].pp_rank = r % 2;
    rm[r].step_time_s = 0.1;
    rm[r].bubble_s = 0.02;
    rm[r].bubble_warmup_s = 0.01;
    rm[r].bubble_cooldown_s = 0.01;
    rm[r].grad_sync_exposed_s = 0.001 * (r + 1);
    rp[r] = &rm[r];
  }
  s->ranks = rp;
  s->n_ranks = world;
}

void wf_push_step(mega_job *j, uint64_t it, uint32_t attempt, uint32_t world) {
  Mega__V1__StepMetrics s;
  Mega__V1__RankMetrics rm[4];
  Mega__V1__RankMetrics *rp[4];
  wf_step(&s, rm, rp, it, attempt, world);
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = &s;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
}

static char *load_trace(void *arg, const char *job_id, size_t *len) {
  wf *f = arg;
  (void)job_id;
  if (!f->trace) return NULL;
  *len = strlen(f->trace);
  return strdup(f->trace);
}

int wf_setup(void **state) {
  wf *f = calloc(1, sizeof *f);
  mega_jobs_init(&f->t);
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = HOSTILE;
  spec.args = wf_args;
  spec.n_args = wf_nargs;
  mega_job *j = NULL;
  assert_int_equal(mega_job_new("j-1-n1", &spec, "n1", 1000, &j, NULL), MEGA_OK);
  mega_job_node place = {.node_id = "n1", .first_rank = 0, .nranks = 2};
  assert_int_equal(mega_job_place(j, &place, 1, 2, 1, 2, 1, NULL), MEGA_OK);
  assert_int_equal(mega_job_transition(j, MEGA_JOB_RUNNING, 2000, NULL, NULL), MEGA_OK);
  for (uint64_t it = 1; it <= 25; it++) wf_push_step(j, it, 0, 2);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST;
  ev.message = "node n2 " HOSTILE;
  ev.node_id = "n2";
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  assert_int_equal(mega_job_hist_push(&j->hist, &item, NULL), MEGA_OK);
  for (uint64_t it = 21; it <= 30; it++) wf_push_step(j, it, 1, 2); /* restarted at 20 */
  j->last_iteration = 30;  /* megad_job_step's part */
  j->train_iters = 100;    /* the coordinator's, from the spec */
  assert_int_equal(mega_jobs_add(&f->t, j, NULL), MEGA_OK);
  static char *ids[] = {"j-1-n1"};
  f->self = (megad_node){.id = "n1", .address = "127.0.0.1:7000", .version = "0.1.0",
                         .backend = "cuda", .device_name = "2 x NVIDIA H100 80GB HBM3",
                         .state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE,
                         .slots = 4, .slots_used = 2, .job_ids = ids, .njob_ids = 1};
  f->nodes[0] = &f->self;
  f->d = (megad_web_data){.jobs = &f->t, .nodes = f->nodes, .nnodes = 1,
                          .load_trace = load_trace, .arg = f};
  *state = f;
  return 0;
}

int wf_teardown(void **state) {
  wf *f = *state;
  mega_jobs_free(&f->t);
  free(f);
  return 0;
}

/* GET path?query (web_fixture.h). */
json_t *wf_get(wf *f, const char *path, const char *query, int want_status) {
  megad_web_resp r;
  megad_web_handle(&f->d, "GET", path, query, &r);
  if (r.status != want_status) fail_msg("GET %s: %d, want %d: %s", path, r.status, want_status,
                                        r.body);
  json_t *doc = NULL;
  if (r.status == 200 && !strcmp(r.type, "application/json")) {
    json_error_t e;
    doc = json_loadb(r.body, r.len, 0, &e);
    if (!doc) fail_msg("GET %s: not JSON: %s", path, e.text);
  }
  megad_web_resp_free(&r);
  return doc;
}
