/* megactl plan in a child process (plan_run.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan_run.h"

extern char **environ;

static const char *megactl;
static char tmpdir[] = "/tmp/mega-test-plan-XXXXXX";

int plan_init(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-MEGACTL\n", argv[0]);
    return -1;
  }
  megactl = argv[1];
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return -1;
  }
  setenv("COLUMNS", "80", 1);
  return 0;
}

/* Every file a test left in the directory goes with it. */
int plan_cleanup(void) {
  DIR *d = opendir(tmpdir);
  if (!d) {
    fprintf(stderr, "cannot open %s: %s\n", tmpdir, strerror(errno));
    return 1;
  }
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(tmp_path(e->d_name));
  closedir(d);
  if (rmdir(tmpdir) == 0) return 0;
  fprintf(stderr, "cannot remove %s: %s\n", tmpdir, strerror(errno));
  return 1;
}

char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  char chunk[8192];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, n, m);
  fclose(m);
  fclose(f);
  return buf;
}

void spit(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

result plan(const char *first, ...) {
  const char *argv[64] = {megactl, "plan"};
  int argc = 2;
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a; a = va_arg(ap, const char *)) {
    assert_true(argc < 63);
    argv[argc++] = a;
  }
  va_end(ap);
  argv[argc] = NULL;

  char out_path[512], err_path[512];
  snprintf(out_path, sizeof out_path, "%s/stdout", tmpdir);
  snprintf(err_path, sizeof err_path, "%s/stderr", tmpdir);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  int rc = posix_spawn(&pid, megactl, &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  assert_int_equal(rc, 0);
  int ws;
  /* bounded: a plan that spins (as one did on a makespan of inf) fails here */
  pid_t got = 0;
  for (int ms = 0; ms < 60000 && (got = waitpid(pid, &ws, WNOHANG)) == 0; ms += 10) usleep(10000);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    char words[1024] = "";
    for (int i = 2; i < argc; i++)
      snprintf(words + strlen(words), sizeof words - strlen(words), " %s", argv[i]);
    fail_msg("megactl plan%s did not finish in 60 s", words);
  }
  assert_int_equal(got, pid);
  if (!WIFEXITED(ws)) fail_msg("megactl plan died with signal %d", WTERMSIG(ws));
  result r = {WEXITSTATUS(ws), slurp(out_path), slurp(err_path)};
  return r;
}

void refused(result r, const char *why) {
  assert_int_equal(r.status, 2);
  if (!strstr(r.err, why)) fail_msg("'%s' is not in: %s", why, r.err);
  result_free(&r);
}

void result_free(result *r) {
  free(r->out);
  free(r->err);
}

json_t *parse_json(const char *text) {
  json_error_t e;
  json_t *j = json_loads(text, 0, &e);
  if (!j) fail_msg("not JSON (%s, line %d): %.200s", e.text, e.line, text);
  return j;
}

double num(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v)) fail_msg("field '%s' is not a number", key);
  return json_number_value(v);
}

void ok_json(result *r, json_t **out) {
  if (r->status != 0) fail_msg("exit %d: %s", r->status, r->err);
  assert_string_equal(r->err, "");
  *out = parse_json(r->out);
}

void expect_error(result r, int status, const char *needle) {
  if (r.status != status) fail_msg("exit %d, wanted %d: %s", r.status, status, r.err);
  assert_string_equal(r.out, "");
  assert_true(!strncmp(r.err, "megactl plan: ", 14));
  if (!strstr(r.err, needle)) fail_msg("'%s' lacks '%s'", r.err, needle);
  char *nl = strchr(r.err, '\n');
  assert_non_null(nl);
  assert_string_equal(nl + 1, "");
  result_free(&r);
}
