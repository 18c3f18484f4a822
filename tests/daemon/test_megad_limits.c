/* What a job may ask of megad, end to end: the paths it may name
 * (--data-root, --save-root), input bounded before any arithmetic and the
 * queue's limit (--max-pending), and how long ended jobs are kept
 * (--retain-jobs, --retain-age). Who may call megad at all:
 * test_megad_security.c. Each case runs as a test of its own (meson). */
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

#define TOKEN "c2VjcmV0LXRva2VuLWZvci10ZXN0cw=="

/* How many jobs d lists; a ListJobs that fails fails the test. */
static size_t count_jobs(hd *d) {
  Mega__V1__ListJobsRequest req = MEGA__V1__LIST_JOBS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  if (mega_rpc_unary(d->ch, &mega_control_list_jobs, &req.base, 5000, &resp, &err) != MEGA_OK)
    fail_msg("ListJobs: %s", err.msg);
  size_t n = ((Mega__V1__ListJobsResponse *)resp)->n_jobs;
  protobuf_c_message_free_unpacked(resp, NULL);
  return n;
}

/* ---- the paths a job may name ---- */

static mega_status submit_paths(hd *d, const char *data, const char *save, const char *load,
                                char *id, mega_err *err) {
  Mega__V1__JobSpec spec;
  const char *extra[8];
  int n = 0;
  if (save) extra[n++] = "--save", extra[n++] = save;
  if (load) extra[n++] = "--load", extra[n++] = load;
  extra[n] = NULL;
  hd_tiny_spec(&spec, d->dir, 2, extra);
  for (size_t i = 0; i + 1 < spec.n_args; i++)
    if (!strcmp(spec.args[i], "--data-path")) spec.args[i + 1] = (char *)data;
  spec.nnodes_min = 2; /* waits for a second node: nothing runs */
  return hd_submit(d, &spec, id, 64, err);
}

static void test_path_roots(void **state) {
  (void)state;
  char dir[64], droot[128], sroot[128], cmd[1024], p[256], q[256], id[64];
  hd_tmpdir(dir, sizeof dir);
  snprintf(droot, sizeof droot, "%s/data", dir);
  snprintf(sroot, sizeof sroot, "%s/ckpt", dir);
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s %s/old && cp /etc/hostname %s/secret.txt && "
           "yes 'some text to train on' | head -c 4000 > %s/ok.txt && "
           "ln -s %s/secret.txt %s/link.txt && yes 'more text' | head -c 4000 > %s/outside.txt",
           droot, sroot, dir, droot, dir, droot, dir);
  assert_int_equal(system(cmd), 0);
  const char *extra[] = {"--data-root", droot, "--save-root", sroot, NULL};
  hd d;
  assert_true(hd_start(&d, "p1", 1, NULL, NULL, extra));
  mega_err err = {0};

  snprintf(p, sizeof p, "%s/ok.txt", droot);
  snprintf(q, sizeof q, "%s/new/run1", sroot); /* does not exist yet */
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_OK);
  snprintf(q, sizeof q, "%s/old", sroot);
  assert_int_equal(submit_paths(&d, p, NULL, q, id, &err), MEGA_OK);

  snprintf(p, sizeof p, "%s/outside.txt", dir);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "outside: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--data-path"));
  assert_non_null(strstr(err.msg, "outside this megad's --data-root"));
  assert_non_null(strstr(err.msg, droot));

  { /* a blend is checked dataset by dataset: the second one is outside */
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, d.dir, 2, NULL);
    char *words[72], ok[256];
    size_t n = 0;
    snprintf(ok, sizeof ok, "%s/ok.txt", droot);
    for (size_t i = 0; i < spec.n_args && n < 64; i++) {
      words[n++] = spec.args[i];
      if (!strcmp(spec.args[i], "--data-path")) {
        words[n++] = "0.5", words[n++] = ok, words[n++] = "0.5", words[n++] = p;
        i++;
      }
    }
    spec.args = words;
    spec.n_args = n;
    spec.nnodes_min = 2;
    assert_int_equal(hd_submit(&d, &spec, id, 64, &err), MEGA_ERR_INVALID);
    fprintf(stderr, "blend: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "outside.txt"));
    assert_non_null(strstr(err.msg, "outside this megad's --data-root"));
  }

  snprintf(p, sizeof p, "%s/link.txt", droot); /* a symlink out of the root */
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "resolves to"));
  snprintf(p, sizeof p, "%s/../secret.txt", droot);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);

  snprintf(p, sizeof p, "%s/ok.txt", droot);
  snprintf(q, sizeof q, "%s/new/../../escape", sroot);
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "save: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--save"));
  snprintf(q, sizeof q, "%s/elsewhere", dir);
  assert_int_equal(submit_paths(&d, p, q, NULL, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--save-root"));
  assert_int_equal(submit_paths(&d, p, NULL, dir, id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--load"));
  hd_cleanup(&d);

  /* on the network without roots: no job may name a path */
  char tok[128];
  snprintf(tok, sizeof tok, "%s/token", dir);
  hd_write_file(tok, TOKEN, 0600);
  mega_rpc_auth a = {.token = TOKEN};
  hd_set_auth(&a);
  const char *open_net[] = {"--listen", "0.0.0.0:0", "--advertise", "127.0.0.1", "--token-file",
                            tok, NULL};
  assert_true(hd_start(&d, "p2", 1, NULL, NULL, open_net));
  snprintf(p, sizeof p, "%s/ok.txt", droot);
  assert_int_equal(submit_paths(&d, p, NULL, NULL, id, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "no roots: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "has no --data-root configured"));
  hd_set_auth(NULL);
  hd_cleanup(&d);
  hd_rmdir(dir);
}

/* ---- bounded input, checked before any arithmetic ---- */

static mega_status submit_with(hd *d, const char *name, uint32_t nmin, uint32_t nproc,
                               const char *const *extra, mega_err *err) {
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 2, extra);
  spec.name = (char *)name;
  spec.nnodes_min = nmin;
  spec.nproc_per_node = nproc;
  char id[64];
  return hd_submit(d, &spec, id, sizeof id, err);
}

static void test_bounded_input(void **state) {
  (void)state;
  const char *extra[] = {"--max-pending", "2", NULL};
  hd d;
  assert_true(hd_start(&d, "b1", 2, NULL, NULL, extra));
  mega_err err = {0};
  assert_int_equal(submit_with(&d, "x", UINT32_MAX, 0, NULL, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "nnodes: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "at most 1024 nodes"));
  assert_int_equal(submit_with(&d, "x", 1, 65536, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "at most 4096"));
  const char *gbs8[] = {"--global-batch-size", "8", NULL}; /* a valid job of 4 ranks */
  assert_int_equal(submit_with(&d, "x", 1, 4, gbs8, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "nproc: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "no node of the cluster has that many slots"));
  const char *tp[] = {"--tensor-model-parallel-size", "4", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 2, tp, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "tp: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "a TP group stays inside one node"));
  const char *gpt3[] = {"--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads",
                        "96", "--seq-length", "2048", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, gpt3, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "memory: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "the model needs about"));
  assert_non_null(strstr(err.msg, "but node b1 has"));
  /* Llama 3 8B's shape counts its 8.03B parameters */
  const char *llama3[] = {"--num-layers", "32", "--hidden-size", "4096",
                          "--num-attention-heads", "32", "--seq-length", "2048",
                          "--position-embedding-type", "rope", "--normalization", "RMSNorm",
                          "--swiglu", "--ffn-hidden-size", "14336", "--group-query-attention",
                          "--num-query-groups", "8", "--untie-embeddings-and-output-weights",
                          "--disable-bias-linear", "--tokenizer-type", "NullTokenizer",
                          "--vocab-size", "128255", "--max-position-embeddings", "8192", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, llama3, &err), MEGA_ERR_INVALID);
  fprintf(stderr, "memory: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "for 8.03B parameters"));
  const char *layers[] = {"--num-layers", "100000", NULL};
  assert_int_equal(submit_with(&d, "x", 1, 1, layers, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--num-layers 100000 is larger than the 4096 allowed"));

  char name[1024];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  assert_int_equal(submit_with(&d, name, 1, 1, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "longer than the 128 allowed"));
  assert_int_equal(submit_with(&d, "bad\nname\x1b[31mred", 1, 1, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "control character"));
  size_t big = 10u << 20; /* a 10 MB name: refused before it is parsed */
  char *huge = malloc(big + 1);
  memset(huge, 'h', big);
  huge[big] = '\0';
  assert_int_not_equal(submit_with(&d, huge, 1, 1, NULL, &err), MEGA_OK);
  fprintf(stderr, "10 MB name: %.200s\n", err.msg);
  free(huge);

  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  static char *many[700];
  size_t n = 0;
  for (; n < spec.n_args; n++) many[n] = spec.args[n];
  while (n + 2 <= 700) many[n++] = "--seed", many[n++] = "1";
  spec.args = many;
  spec.n_args = n;
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "flag words"));

  /* the queue: two jobs wait (for a second node), the third is refused */
  assert_int_equal(submit_with(&d, "w1", 2, 1, NULL, &err), MEGA_OK);
  assert_int_equal(submit_with(&d, "w2", 2, 1, NULL, &err), MEGA_OK);
  assert_int_equal(submit_with(&d, "w3", 2, 1, NULL, &err), MEGA_ERR_NOMEM); /* RESOURCE_EXHAUSTED */
  fprintf(stderr, "queue: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "--max-pending 2"));

  /* still answering, listing the two waiting jobs only, and nothing of the
   * refused jobs reached the journal */
  assert_int_equal(count_jobs(&d), 2);
  char path[256];
  snprintf(path, sizeof path, "%s/journal", d.dir);
  struct stat st;
  if (stat(path, &st) == 0) assert_true(st.st_size < 64 * 1024);
  hd_cleanup(&d);
}

/* ---- retention of ended jobs ---- */

/* The count once megad has applied --retain-jobs: it does so on the turn
 * of its loop after a job ends, and a ListJobs the same turn already holds
 * (the reply to the cancel went out first) still counts the job. */
static size_t count_settled(hd *d, size_t want) {
  size_t n = count_jobs(d);
  for (int i = 0; i < 100 && n != want; i++) {
    usleep(20 * 1000);
    n = count_jobs(d);
  }
  return n;
}

static void cancel(hd *d, const char *id) {
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  ProtobufCMessage *resp = NULL;
  mega_err err = {0};
  assert_int_equal(mega_rpc_unary(d->ch, &mega_control_cancel_job, &req.base, 5000, &resp, &err),
                   MEGA_OK);
  protobuf_c_message_free_unpacked(resp, NULL);
}

static void test_retention(void **state) {
  (void)state;
  const char *extra[] = {"--retain-jobs", "2", NULL};
  hd d;
  assert_true(hd_start(&d, "k1", 1, NULL, NULL, extra));
  char ids[6][64], path[256];
  mega_err err = {0};
  /* --retain-jobs holds at every end, not at the next 10 s tick (a stream
   * of short jobs once listed 36 with --retain-jobs 5) */
  for (int i = 0; i < 6; i++) {
    Mega__V1__JobSpec spec;
    hd_tiny_spec(&spec, d.dir, 2, NULL);
    spec.nnodes_min = 2; /* waits: nothing runs */
    assert_int_equal(hd_submit(&d, &spec, ids[i], sizeof ids[i], &err), MEGA_OK);
    if (i == 0) {
      snprintf(path, sizeof path, "%s/jobs/%s", d.dir, ids[0]);
      mkdir(path, 0700); /* as a job that ran leaves it (logs) */
    }
    cancel(&d, ids[i]);
    size_t listed = count_settled(&d, i < 2 ? (size_t)i + 1 : 2);
    if (listed != (i < 2 ? (size_t)i + 1 : 2)) hd_dump_log(&d);
    assert_int_equal(listed, i < 2 ? (size_t)i + 1 : 2);
  }
  Mega__V1__Job *j = hd_get_job(&d, ids[0], &err);
  assert_null(j);
  assert_int_equal(access(path, F_OK), -1); /* its directory went with it */
  j = hd_get_job(&d, ids[5], &err); /* the newest ended are kept */
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* those that ended longest ago go first, not the oldest submitted: x,
   * submitted before y, ends after it and is kept */
  char x[64], y[64];
  Mega__V1__JobSpec wait_spec;
  hd_tiny_spec(&wait_spec, d.dir, 2, NULL);
  wait_spec.nnodes_min = 2;
  assert_int_equal(hd_submit(&d, &wait_spec, x, sizeof x, &err), MEGA_OK);
  assert_int_equal(hd_submit(&d, &wait_spec, y, sizeof y, &err), MEGA_OK);
  /* ends are kept to the millisecond, and two RPCs on loopback can fit in
   * one: a tie has no "longest ago", so each end gets its own */
  usleep(2000);
  cancel(&d, y);
  assert_int_equal(count_settled(&d, 3), 3); /* x waits; ids[5] and y ended */
  usleep(2000);
  cancel(&d, x);
  assert_int_equal(count_settled(&d, 2), 2);
  assert_null(hd_get_job(&d, ids[5], &err));
  j = hd_get_job(&d, x, &err);
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* at start too, for a journal of more */
  assert_true(hd_restart(&d, (const char *const[]){"--retain-jobs", "1", NULL}));
  assert_int_equal(count_jobs(&d), 1);
  j = hd_get_job(&d, x, &err);
  assert_non_null(j);
  protobuf_c_message_free_unpacked(&j->base, NULL);
  /* ids are never given twice, even once their jobs are forgotten */
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d.dir, 2, NULL);
  spec.nnodes_min = 2;
  char id[64];
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_string_equal(id, "j-9-k1");
  cancel(&d, id);
  const char *age[] = {"--retain-age", "1s", NULL};
  usleep(1200000);
  assert_true(hd_restart(&d, age));
  assert_int_equal(count_jobs(&d), 0);
  assert_int_equal(hd_submit(&d, &spec, id, sizeof id, &err), MEGA_OK);
  assert_string_equal(id, "j-10-k1");
  /* the forgets were journaled whole (they were once empty records: the
   * record's bytes were read before the call that made them) */
  assert_false(hd_log_has(&d, "JOURNAL DAMAGED"));
  assert_false(hd_log_has(&d, "empty record"));
  hd_cleanup(&d);
}

static int teardown(void **state) {
  (void)state;
  hd_set_auth(NULL);
  hd_cleanup_all();
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_path_roots, teardown),
      cmocka_unit_test_teardown(test_bounded_input, teardown),
      cmocka_unit_test_teardown(test_retention, teardown),
  };
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(all, NULL, NULL);
}
