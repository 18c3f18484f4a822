/* megaw end to end: JSON lines, a falling loss, exit codes for bad flags,
 * resume across processes, and stopping on SIGTERM/SIGINT with the
 * checkpoints intact.
 *
 *   test_megaw PATH_TO_MEGAW */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "ckpt_util.h"

extern char **environ;

static const char *megaw;
static char dir[256], data[512];

typedef struct proc {
  pid_t pid;
  int out, err; /* read ends */
} proc;

static proc start(char *const *args) {
  int o[2], e[2];
  assert_int_equal(pipe(o), 0);
  assert_int_equal(pipe(e), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, o[1], 1);
  posix_spawn_file_actions_adddup2(&fa, e[1], 2);
  posix_spawn_file_actions_addclose(&fa, o[0]);
  posix_spawn_file_actions_addclose(&fa, e[0]);
  proc p;
  int rc = posix_spawn(&p.pid, megaw, &fa, NULL, args, environ);
  posix_spawn_file_actions_destroy(&fa);
  assert_int_equal(rc, 0);
  close(o[1]);
  close(e[1]);
  p.out = o[0];
  p.err = e[0];
  return p;
}

/* Reads both pipes to EOF into malloc'd strings; returns the exit code
 * (128 + signal when killed). */
static int finish(proc p, char **out, char **err) {
  size_t cap[2] = {4096, 4096}, len[2] = {0, 0};
  char *buf[2] = {malloc(cap[0]), malloc(cap[1])};
  int fds[2] = {p.out, p.err};
  bool open_[2] = {true, true};
  while (open_[0] || open_[1]) {
    struct pollfd pf[2];
    int n = 0, idx[2];
    for (int k = 0; k < 2; k++)
      if (open_[k]) {
        pf[n] = (struct pollfd){.fd = fds[k], .events = POLLIN};
        idx[n++] = k;
      }
    if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < n; i++) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int k = idx[i];
      if (len[k] + 4096 > cap[k]) buf[k] = realloc(buf[k], cap[k] *= 2);
      ssize_t r = read(fds[k], buf[k] + len[k], 4095);
      if (r <= 0) {
        open_[k] = false;
        close(fds[k]);
      } else {
        len[k] += (size_t)r;
      }
    }
  }
  buf[0][len[0]] = buf[1][len[1]] = '\0';
  int status;
  waitpid(p.pid, &status, 0);
  if (out) *out = buf[0]; else free(buf[0]);
  if (err) *err = buf[1]; else free(buf[1]);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs megaw with the tiny model's flags plus extra (NULL-terminated). */
#define MAX_ARGS 64
static int run(const char *const *extra, bool base, char **out, char **err) {
  const char *args[MAX_ARGS];
  int n = 0;
  args[n++] = megaw;
  if (base) {
    static const char *const b[] = {"--num-layers", "2", "--hidden-size", "32",
                                    "--num-attention-heads", "2", "--seq-length", "32",
                                    "--micro-batch-size", "4", "--global-batch-size", "8",
                                    "--lr", "3e-3", "--data-path", NULL};
    for (int i = 0; b[i]; i++) args[n++] = b[i];
    args[n++] = data;
  }
  for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
  args[n] = NULL;
  return finish(start((char *const *)args), out, err);
}

/* The "loss" of each JSON line, in order; returns how many (max cap). */
static int parse_losses(const char *out, double *loss, int cap, char texts[][32]) {
  int n = 0;
  const char *line = out;
  while (*line && n < cap) {
    const char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    if (!j) fail_msg("not a JSON line: %.*s (%s)", (int)len, line, je.text);
    assert_int_equal(json_integer_value(json_object_get(j, "iteration")), n + 1);
    static const char *const keys[] = {"loss", "grad_norm", "lr", "step_time_s", "tokens_per_s"};
    for (size_t k = 0; k < 5; k++)
      if (!json_is_number(json_object_get(j, keys[k]))) fail_msg("line %d lacks %s", n + 1, keys[k]);
    loss[n] = json_number_value(json_object_get(j, "loss"));
    if (texts) {
      /* the loss exactly as printed, for bit-for-bit comparison */
      const char *p = strstr(line, "\"loss\":");
      assert_non_null(p);
      p += 7;
      size_t m = strcspn(p, ",}");
      snprintf(texts[n], 32, "%.*s", (int)m, p);
    }
    json_decref(j);
    n++;
    line = nl ? nl + 1 : line + len;
  }
  return n;
}

static void test_help(void **state) {
  (void)state;
  const char *const a[] = {"--help", NULL};
  char *out, *err;
  assert_int_equal(run(a, false, &out, &err), 0);
  assert_non_null(strstr(out, "--num-layers"));
  assert_non_null(strstr(out, "--lr-decay-style"));
  assert_non_null(strstr(out, "--json"));
  free(out);
  free(err);
}

static void test_json_and_loss_falls(void **state) {
  (void)state;
  const char *const a[] = {"--train-iters", "30", "--lr-warmup-iters", "3", "--lr-decay-style",
                           "cosine", "--json", NULL};
  char *out, *err;
  assert_int_equal(run(a, true, &out, &err), 0);
  double loss[64];
  assert_int_equal(parse_losses(out, loss, 64, NULL), 30);
  double first = loss[0], last = (loss[25] + loss[26] + loss[27] + loss[28] + loss[29]) / 5;
  printf("# loss %.4f -> %.4f over 30 iterations\n", first, last);
  assert_true(first > 5.0);      /* about ln 256 = 5.55 at the start */
  assert_true(last < 0.8 * first);
  assert_string_equal(err, "");
  free(out);
  free(err);

  /* readable lines without --json */
  const char *const b[] = {"--train-iters", "2", NULL};
  assert_int_equal(run(b, true, &out, &err), 0);
  /* Megatron's line (training_log's fields, in its order) */
  assert_non_null(strstr(out, "] iteration        2/       2 | consumed samples:           16 |"));
  assert_non_null(strstr(out, " | learning rate: "));
  assert_non_null(strstr(out, " | global batch size:     8 | lm loss: "));
  assert_non_null(strstr(out, " | loss scale: 1.0 | grad norm: "));
  free(out);
  free(err);
}

/* The losses of three iterations with weights large enough (init 0.2)
 * that GELU's inputs reach where its two forms differ, as printed. */
static void gelu_losses(const char *f1, const char *f2, char texts[][32]) {
  const char *const a[] = {"--train-iters", "3", "--init-method-std", "0.2", "--json", f1, f2,
                           NULL};
  char *out, *err;
  assert_int_equal(run(a, true, &out, &err), 0);
  double loss[8];
  assert_int_equal(parse_losses(out, loss, 8, texts), 3);
  free(out);
  free(err);
}

/* GPT-2's GELU as Megatron picks it: --no-bias-gelu-fusion trains the
 * exact (erf) one, so other losses than the default tanh one; with
 * --openai-gelu as well it is tanh again (the cpu backend runs the same
 * ops as by default, so bit for bit). */
static void test_gelu_form_flags(void **state) {
  (void)state;
  char tanh_form[8][32], erf_form[8][32], openai[8][32];
  gelu_losses(NULL, NULL, tanh_form);
  gelu_losses("--no-bias-gelu-fusion", NULL, erf_form);
  gelu_losses("--no-bias-gelu-fusion", "--openai-gelu", openai);
  for (int i = 0; i < 3; i++) {
    printf("# iteration %d: tanh %s, erf %s, --openai-gelu %s\n", i + 1, tanh_form[i],
           erf_form[i], openai[i]);
    assert_string_equal(openai[i], tanh_form[i]);
    double d = strtod(erf_form[i], NULL) - strtod(tanh_form[i], NULL);
    assert_true(fabs(d) > 1e-6 * strtod(tanh_form[i], NULL));
  }
}

static void expect_flag_error(const char *const *extra, bool base, const char *needle) {
  char *out, *err;
  int rc = run(extra, base, &out, &err);
  if (rc != 2 || !strstr(err, needle) || strncmp(err, "megaw: ", 7) != 0 ||
      strchr(err, '\n') != err + strlen(err) - 1)
    fail_msg("rc %d, stderr '%s' (want 2 and one line with '%s')", rc, err, needle);
  free(out);
  free(err);
}

static void test_bad_flags(void **state) {
  (void)state;
  char shortf[600];
  snprintf(shortf, sizeof shortf, "%s/short.txt", dir);
  tu_write_repetitive(shortf, 20);
  const char *const bad_int[] = {"--train-iters", "3", "--hidden-size", "abc", NULL};
  expect_flag_error(bad_int, true, "--hidden-size");
  const char *const unknown[] = {"--train-iters", "3", "--bogus", NULL};
  expect_flag_error(unknown, true, "--bogus");
  const char *const missing[] = {"--num-layers", "2", NULL};
  expect_flag_error(missing, false, "required");
  const char *const short_data[] = {"--train-iters", "3", "--data-path", shortf, NULL};
  expect_flag_error(short_data, true, "window");
  const char *const no_data[] = {"--train-iters", "3", "--data-path", "/nonexistent/d", NULL};
  expect_flag_error(no_data, true, "/nonexistent/d");
  const char *const batch[] = {"--train-iters", "3", "--global-batch-size", "6", NULL};
  expect_flag_error(batch, true, "--global-batch-size");
  const char *const pp[] = {"--train-iters", "3", "--pipeline-model-parallel-size", "2", NULL};
  expect_flag_error(pp, true, "megad");
  const char *const no_rank[] = {"--train-iters", "3", "--world-size", "2", "--rendezvous-dir",
                                 dir, NULL};
  expect_flag_error(no_rank, true, "needs --rank");
  /* found at the start, not after training: a --load that is a file, a
   * --finetune with nothing to start from, a --save that cannot be made */
  char afile[600], nothere[600], badsave[600];
  snprintf(afile, sizeof afile, "%s/afile", dir);
  snprintf(nothere, sizeof nothere, "%s/nothere", dir);
  snprintf(badsave, sizeof badsave, "%s/afile/ck", dir);
  tu_write_text(afile, "x\n");
  const char *const load_file[] = {"--train-iters", "3", "--load", afile, NULL};
  const char *const finetune[] = {"--train-iters", "3", "--load", nothere, "--finetune", NULL};
  const char *const save_bad[] = {"--train-iters", "3", "--save", badsave, NULL};
  static const char *const why[] = {"is a file", "holds no checkpoint", "cannot create"};
  const char *const *cases[] = {load_file, finetune, save_bad};
  for (int c = 0; c < 3; c++) {
    char *out, *err;
    int rc = run(cases[c], true, &out, &err);
    if (rc != 1 || !strstr(err, why[c]) || strstr(out, "iteration"))
      fail_msg("rc %d, stdout '%s', stderr '%s' (want 1, no iteration, '%s')", rc, out, err,
               why[c]);
    free(out);
    free(err);
  }
}

/* N copies from a launcher (torchrun, srun -n N) without --world-size each
 * trained alone, all saving to one --save; told at start instead. Given
 * --world-size, the flags rule. */
static void test_launcher_copies(void **state) {
  (void)state;
  char ck[600];
  snprintf(ck, sizeof ck, "%s/launched-ck", dir);
  const char *const launched[] = {"--train-iters", "3", "--save", ck, NULL};
  setenv("WORLD_SIZE", "2", 1);
  expect_flag_error(launched, true, "WORLD_SIZE=2: torchrun started 2 copies of megaw");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  expect_flag_error(launched, true, "--rank R --world-size 4 --rendezvous-dir DIR");
  assert_int_not_equal(access(ck, F_OK), 0); /* refused before anything was saved */
  const char *const one[] = {"--train-iters", "1", "--world-size", "1", NULL};
  char *out, *err;
  int rc = run(one, true, &out, &err);
  unsetenv("SLURM_STEP_NUM_TASKS");
  if (rc != 0) fail_msg("--world-size 1 under srun -n 4: rc %d, stderr '%s'", rc, err);
  free(out);
  free(err);
}

/* A file size limit (ulimit -f) reached while saving: megaw says which file
 * and exits 1, where SIGXFSZ killed it without a word, and no checkpoint
 * is committed. */
static void test_file_size_limit(void **state) {
  (void)state;
  char ck[600];
  snprintf(ck, sizeof ck, "%s/limited-ck", dir);
  const char *const save[] = {"--train-iters", "4", "--save", ck, "--save-interval", "2", NULL};
  struct rlimit was, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
  lim = was;
  lim.rlim_cur = 16384; /* the model's safetensors is larger */
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  char *out, *err;
  int rc = run(save, true, &out, &err); /* the child inherits the limit */
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
  if (rc != 1 || !strstr(err, "File too large") || !strstr(err, "model.safetensors"))
    fail_msg("rc %d, stderr '%s' (want 1 and the file that was too large)", rc, err);
  char latest[700];
  snprintf(latest, sizeof latest, "%s/latest_checkpointed_iteration.txt", ck);
  assert_int_not_equal(access(latest, F_OK), 0);
  free(out);
  free(err);
}

/* A model too big for the memory megaw may use (its address space limited
 * to 16 GiB, so the refusal does not hang on what the machine overcommits)
 * stops at the first allocation that fails: which tensor, how much, and
 * what to change. */
static void test_memory_limit(void **state) {
  (void)state;
  const char *const huge[] = {"--num-layers", "48", "--hidden-size", "16384",
                              "--num-attention-heads", "128", "--seq-length", "16",
                              "--micro-batch-size", "2", "--global-batch-size", "4",
                              "--lr", "3e-3", "--train-iters", "1", "--backend", "cpu",
                              "--data-path", data, NULL};
  struct rlimit was, lim;
  assert_int_equal(getrlimit(RLIMIT_AS, &was), 0);
  lim = was;
  lim.rlim_cur = (rlim_t)16 << 30; /* 576 GiB of parameters do not fit */
  if (was.rlim_cur != RLIM_INFINITY && was.rlim_cur < lim.rlim_cur) lim.rlim_cur = was.rlim_cur;
  assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
  char *out, *err;
  int rc = run(huge, false, &out, &err); /* the child inherits the limit */
  assert_int_equal(setrlimit(RLIMIT_AS, &was), 0);
  static const char *const want[] = {"gpt: parameters", "576.1 GiB", "out of memory",
                                     "rank 0 needs more memory", "--pipeline-model-parallel-size",
                                     "--micro-batch-size"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (rc != 1 || !strstr(err, want[i]))
      fail_msg("rc %d, stderr '%s' (want 1 and '%s')", rc, err, want[i]);
  free(out);
  free(err);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Ranks started by hand: rank 0 cannot hold its stage (the position
 * embedding of 1M positions, 2 GiB, under a 1 GiB address space) and fails
 * in setup. Rank 1, which fits, stops at once naming rank 0's reason,
 * where it waited out the rendezvous' 60 s for a rank "not started". */
static void test_hand_launch_rank_out_of_memory(void **state) {
  (void)state;
  char rdv[600];
  snprintf(rdv, sizeof rdv, "%s/oom-rdv", dir);
  assert_int_equal(mkdir(rdv, 0700), 0);
  const char *args[2][40];
  for (int r = 0; r < 2; r++) {
    static const char rank_s[2][2] = {"0", "1"};
    const char *const a[] = {megaw, "--rank", rank_s[r], "--world-size", "2", "--rendezvous-dir",
                             rdv, "--num-layers", "2", "--hidden-size", "512",
                             "--num-attention-heads", "8", "--seq-length", "16",
                             "--max-position-embeddings", "1048576", "--micro-batch-size", "2",
                             "--global-batch-size", "4", "--lr", "3e-3", "--train-iters", "1",
                             "--pipeline-model-parallel-size", "2", "--backend", "cpu",
                             "--data-path", data, NULL};
    memcpy(args[r], a, sizeof a);
  }
  struct rlimit was, lim;
  assert_int_equal(getrlimit(RLIMIT_AS, &was), 0);
  lim = was;
  lim.rlim_cur = (rlim_t)1 << 30;
  assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
  proc p0 = start((char *const *)args[0]); /* inherits the limit */
  assert_int_equal(setrlimit(RLIMIT_AS, &was), 0);
  proc p1 = start((char *const *)args[1]);
  double t0 = now_s();
  char *err0, *err1;
  int rc1 = finish(p1, NULL, &err1);
  double took = now_s() - t0;
  int rc0 = finish(p0, NULL, &err0);
  if (rc0 != 1 || !strstr(err0, "cannot allocate 2.0 GiB") || !strstr(err0, "out of memory"))
    fail_msg("rank 0: rc %d, stderr '%s' (want 1 and its allocation)", rc0, err0);
  if (rc1 != 1 || !strstr(err1, "rank 0 failed before the ranks met: gpt: parameters") ||
      took > 30)
    fail_msg("rank 1: rc %d after %.1f s, stderr '%s' (want 1, at once, naming rank 0's reason)",
             rc1, took, err1);
  free(err0);
  free(err1);
}

static void test_resume_across_processes(void **state) {
  (void)state;
  char save[600];
  snprintf(save, sizeof save, "%s/resume", dir);
  /* decay over 6 iterations in every run, so the schedules agree */
  const char *const straight[] = {"--train-iters", "6", "--lr-decay-iters", "6", "--json", NULL};
  const char *const first[] = {"--train-iters", "3", "--lr-decay-iters", "6", "--json",
                               "--save", save, NULL};
  const char *const second[] = {"--train-iters", "6", "--lr-decay-iters", "6", "--json",
                                "--load", save, NULL};
  char *out, *err;
  double l[8];
  char a[8][32], b[8][32];
  assert_int_equal(run(straight, true, &out, &err), 0);
  assert_int_equal(parse_losses(out, l, 8, a), 6);
  free(out);
  free(err);
  assert_int_equal(run(first, true, &out, &err), 0);
  assert_int_equal(parse_losses(out, l, 8, b), 3);
  assert_non_null(strstr(err, "saved checkpoint of iteration 3"));
  free(out);
  free(err);
  assert_int_equal(run(second, true, &out, &err), 0);
  assert_non_null(strstr(err, "resumed from"));
  /* the resumed run prints iterations 4..6 */
  const char *p = out;
  for (int i = 3; i < 6; i++) {
    char want[64];
    snprintf(want, sizeof want, "{\"iteration\":%d,\"loss\":%s,", i + 1, a[i]);
    if (strncmp(p, want, strlen(want)) != 0) fail_msg("got %.80s, want %s", p, want);
    p = strchr(p, '\n') + 1;
  }
  free(out);
  free(err);

  /* a job that does not match the checkpoint is refused */
  const char *const other[] = {"--train-iters", "6", "--lr-decay-iters", "7", "--load", save, NULL};
  assert_int_equal(run(other, true, &out, &err), 1);
  assert_non_null(strstr(err, "--lr-decay-iters 6"));
  free(out);
  free(err);
}

/* Relative paths are made absolute where megaw starts, so a checkpoint's
 * job record names its files from anywhere (megaw generate reads the
 * vocabulary through it). */
static void test_relative_paths(void **state) {
  (void)state;
  char *here = getcwd(NULL, 0);
  assert_int_equal(chdir(dir), 0);
  const char *const args[] = {"--num-layers", "1", "--hidden-size", "32",
                              "--num-attention-heads", "2", "--seq-length", "32",
                              "--micro-batch-size", "4", "--global-batch-size", "4",
                              "--lr", "3e-3", "--train-iters", "1", "--data-path", "data.txt",
                              "--save", "./rel", NULL};
  char *out, *err;
  int rc = run(args, false, &out, &err);
  assert_int_equal(chdir(here), 0);
  free(here);
  if (rc != 0) fail_msg("rc %d: %s", rc, err);
  free(out);
  free(err);
  char state_path[700], want_data[700], want_save[700];
  snprintf(state_path, sizeof state_path, "%s/rel/iter_0000001/trainer_state.json", dir);
  snprintf(want_data, sizeof want_data, "%s/data.txt", dir);
  snprintf(want_save, sizeof want_save, "%s/rel", dir);
  json_t *j = json_load_file(state_path, 0, NULL);
  assert_non_null(j);
  json_t *job = json_object_get(j, "job");
  json_t *paths = json_object_get(job, "data_path");
  const char *d = json_is_array(paths) ? json_string_value(json_array_get(paths, 0))
                                       : json_string_value(paths);
  assert_non_null(d);
  assert_string_equal(d, want_data);
  assert_string_equal(json_string_value(json_object_get(job, "save")), want_save);
  json_decref(j);
}

static void test_signals(void **state) {
  (void)state;
  const int sigs[2] = {SIGTERM, SIGINT};
  for (int s = 0; s < 2; s++) {
    char save[600];
    snprintf(save, sizeof save, "%s/sig%d", dir, s);
    const char *args[MAX_ARGS];
    int n = 0;
    static const char *const b[] = {"--num-layers", "2", "--hidden-size", "32",
                                    "--num-attention-heads", "2", "--seq-length", "32",
                                    "--micro-batch-size", "4", "--global-batch-size", "8",
                                    "--lr", "3e-3", "--train-iters", "1000000", "--lr-decay-iters", "1000000",
                                    "--save-interval", "5", "--save-initial", "--json", NULL};
    args[n++] = megaw;
    for (int i = 0; b[i]; i++) args[n++] = b[i];
    args[n++] = "--data-path";
    args[n++] = data;
    args[n++] = "--save";
    args[n++] = save;
    args[n] = NULL;
    proc p = start((char *const *)args);
    /* wait for 12 lines, then signal */
    int lines = 0;
    char c;
    while (lines < 12 && read(p.out, &c, 1) == 1) lines += c == '\n';
    assert_int_equal(lines, 12);
    kill(p.pid, sigs[s]);
    char *out, *err;
    int rc = finish(p, &out, &err);
    assert_int_equal(rc, 128 + sigs[s]);
    assert_non_null(strstr(err, "stopped by signal"));
    free(out);
    free(err);
    /* --save-initial wrote iteration 0; the latest is complete and loads */
    char path[700];
    snprintf(path, sizeof path, "%s/iter_0000000/trainer_state.json", save);
    assert_true(tu_exists(path));
    assert_int_equal(tu_count_prefix(save, ".tmp"), 0);
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", save);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long it = -1;
    assert_int_equal(fscanf(f, "%ld", &it), 1);
    fclose(f);
    assert_true(it >= 10 && it % 5 == 0);
    char iters[32];
    snprintf(iters, sizeof iters, "%ld", it + 1);
    const char *const more[] = {"--train-iters", iters, "--lr-decay-iters", "1000000",
                                 "--load", save, "--json", NULL};
    assert_int_equal(run(more, true, &out, &err), 0);
    char want[64];
    snprintf(want, sizeof want, "{\"iteration\":%ld,", it + 1);
    assert_true(strncmp(out, want, strlen(want)) == 0);
    free(out);
    free(err);
  }
}

static int setup(void **state) {
  (void)state;
  tu_mkdtemp(dir, "megaw");
  snprintf(data, sizeof data, "%s/data.txt", dir);
  tu_write_repetitive(data, 20000);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_megaw PATH_TO_MEGAW\n");
    return 2;
  }
  static char abs_megaw[4096]; /* test_relative_paths runs it from another directory */
  megaw = realpath(argv[1], abs_megaw) ? abs_megaw : argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_json_and_loss_falls),
      cmocka_unit_test(test_gelu_form_flags),
      cmocka_unit_test(test_bad_flags),
      cmocka_unit_test(test_launcher_copies),
      cmocka_unit_test(test_file_size_limit),
      cmocka_unit_test(test_memory_limit),
      cmocka_unit_test(test_hand_launch_rank_out_of_memory),
      cmocka_unit_test(test_resume_across_processes),
      cmocka_unit_test(test_relative_paths),
      cmocka_unit_test(test_signals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
