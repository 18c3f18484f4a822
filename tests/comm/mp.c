#include "tests/comm/mp.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MP_MAX 16

double mp_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void mp_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void mp_die_after_ms(int ms) {
  mp_sleep_ms(ms);
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

static int rm_one(const char *path, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int mp_run(int n, mp_fn fn, void *arg, int deadline_ms, unsigned killed_ok) {
  static int counter;
  if (n < 1 || n > MP_MAX) {
    fprintf(stderr, "mp_run: %d ranks is out of range\n", n);
    return 1;
  }
  char dir[] = "/tmp/mega-comm-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "job%d/a%d", (int)getpid(), counter++);
  mp_env env = {dir, prefix, n, arg};

  fflush(stdout);
  fflush(stderr);
  pid_t pids[MP_MAX];
  int failed = 0, started = 0;
  for (int i = 0; i < n; i++) {
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      failed++;
      break;
    }
    if (p == 0) {
      int rc = fn(i, &env);
      fflush(stdout);
      fflush(stderr);
      _exit(rc ? 1 : 0);
    }
    pids[started++] = p;
  }

  bool reaped[MP_MAX] = {false};
  int status[MP_MAX];
  int left = started;
  double end = mp_now_ms() + deadline_ms;
  while (left > 0) {
    for (int i = 0; i < started; i++) {
      if (reaped[i]) continue;
      pid_t r = waitpid(pids[i], &status[i], WNOHANG);
      if (r == pids[i]) {
        reaped[i] = true;
        left--;
      }
    }
    if (left == 0) break;
    if (mp_now_ms() > end) {
      for (int i = 0; i < started; i++) {
        if (reaped[i]) continue;
        fprintf(stderr, "rank %d still running after %d ms: killed\n", i, deadline_ms);
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status[i], 0);
        reaped[i] = true;
        status[i] = -1;
        failed++;
      }
      break;
    }
    mp_sleep_ms(5);
  }
  for (int i = 0; i < started; i++) {
    int st = status[i];
    if (st == -1) continue;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && (killed_ok & (1u << i)))
      continue;
    if (WIFEXITED(st))
      fprintf(stderr, "rank %d exited with %d\n", i, WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
      fprintf(stderr, "rank %d died of signal %d\n", i, WTERMSIG(st));
    failed++;
  }
  nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
  return failed;
}

mega_store *mp_store(const mp_env *env, bool kv) {
  mega_store *s = NULL;
  mega_err err = {0};
  mega_status st = kv ? mega_store_open_kv(&mp_kv_dir_ops, (void *)env->dir,
                                           env->prefix, &s, &err)
                      : mega_store_open_file(env->dir, env->prefix, &s, &err);
  if (st != MEGA_OK) {
    fprintf(stderr, "opening the store: %s: %s\n", mega_status_str(st), err.msg);
    return NULL;
  }
  return s;
}

/* ---- The directory key-value store ------------------------------------ */

static int key_path(const char *dir, const char *key, char *out, size_t cap) {
  size_t len = strlen(key);
  int n = snprintf(out, cap, "%s/kv-", dir);
  if (n < 0 || (size_t)n + 2 * len + 1 > cap) return -1;
  for (size_t i = 0; i < len; i++)
    n += snprintf(out + n, cap - n, "%02x", (unsigned char)key[i]);
  return 0;
}

static mega_status kv_set(void *ctx, const char *key, const void *value,
                          size_t len, mega_err *err) {
  char path[1024], tmp[1100];
  if (key_path(ctx, key, path, sizeof path) != 0)
    return mega_fail(err, MEGA_ERR_INVALID, "key '%s' is too long", key);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  if (access(path, F_OK) == 0)
    return mega_fail(err, MEGA_ERR_INVALID, "key '%s' is already set", key);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return mega_fail(err, MEGA_ERR_IO, "open %s: %s", tmp, strerror(errno));
  const char *p = value;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      close(fd);
      return mega_fail(err, MEGA_ERR_IO, "write %s: %s", tmp, strerror(errno));
    }
    p += w;
    left -= (size_t)w;
  }
  close(fd);
  if (rename(tmp, path) != 0)
    return mega_fail(err, MEGA_ERR_IO, "rename %s: %s", tmp, strerror(errno));
  return MEGA_OK;
}

static bool wait_path(const char *path, int timeout_ms) {
  double end = mp_now_ms() + timeout_ms;
  while (access(path, F_OK) != 0) {
    if (mp_now_ms() > end) return false;
    mp_sleep_ms(2);
  }
  return true;
}

static mega_status kv_get(void *ctx, const char *key, void **value,
                          size_t *len, int timeout_ms, mega_err *err) {
  char path[1024];
  if (key_path(ctx, key, path, sizeof path) != 0)
    return mega_fail(err, MEGA_ERR_INVALID, "key '%s' is too long", key);
  if (!wait_path(path, timeout_ms))
    return mega_fail(err, MEGA_ERR_TIMEOUT, "key '%s' not set within %d ms", key,
                     timeout_ms);
  FILE *f = fopen(path, "rb");
  if (!f) return mega_fail(err, MEGA_ERR_IO, "open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
    free(buf);
    fclose(f);
    return mega_fail(err, MEGA_ERR_IO, "read %s failed", path);
  }
  fclose(f);
  *value = buf;
  *len = (size_t)n;
  return MEGA_OK;
}

static mega_status kv_wait(void *ctx, const char *const *keys, size_t nkeys,
                           int timeout_ms, mega_err *err) {
  double end = mp_now_ms() + timeout_ms;
  for (size_t i = 0; i < nkeys; i++) {
    char path[1024];
    if (key_path(ctx, keys[i], path, sizeof path) != 0)
      return mega_fail(err, MEGA_ERR_INVALID, "key '%s' is too long", keys[i]);
    int left = (int)(end - mp_now_ms());
    if (!wait_path(path, left > 0 ? left : 0))
      return mega_fail(err, MEGA_ERR_TIMEOUT, "key '%s' not set within %d ms",
                       keys[i], timeout_ms);
  }
  return MEGA_OK;
}

const mega_kv_ops mp_kv_dir_ops = {kv_set, kv_get, kv_wait};
