/* The harness's command runners: megactl, and megad started only to see
 * it refuse its flags (harness.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

/* Runs cmd; out gets the tail of its output (stdout and stderr), and *seen
 * whether needle came anywhere in it. Its exit status, -1 if none. */
static int run(const char *cmd, char *out, size_t len, const char *needle, bool *seen) {
  FILE *p = popen(cmd, "r");
  if (!p) {
    snprintf(out, len, "cannot run %s: %s", cmd, strerror(errno));
    return -1;
  }
  size_t n = 0, keep = needle ? strlen(needle) : 0;
  if (seen) *seen = false;
  out[0] = '\0';
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, p)) > 0) {
    if (n + got > len - 1) { /* keep the tail, and enough to find needle across reads */
      size_t drop = n + got - (len - 1);
      if (drop > n) drop = n;
      memmove(out, out + drop, n - drop);
      n -= drop;
    }
    size_t take = got < len - 1 - n ? got : len - 1 - n;
    memcpy(out + n, chunk + got - take, take);
    n += take;
    out[n] = '\0';
    size_t from = n > take + keep ? n - take - keep : 0;
    if (seen && needle && n >= keep && strstr(out + from, needle)) *seen = true;
  }
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int hd_megad_exits(char *out, size_t len, const char *args) {
  char cmd[2048];
  /* a megad that starts where it should refuse is ended: 124 */
  snprintf(cmd, sizeof cmd, "timeout 15 '%s' serve --slots 1 --worker '%s' %s 2>&1 </dev/null",
           getenv("MEGAD"), getenv("MEGAW"), args);
  return run(cmd, out, len, NULL, NULL);
}

int hd_megactl_seen(char *out, size_t len, const char *args, const char *needle, bool *seen) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 </dev/null", getenv("MEGACTL"), args);
  return run(cmd, out, len, needle, seen);
}

int hd_megactl(char *out, size_t len, const char *args) {
  return hd_megactl_seen(out, len, args, NULL, NULL);
}
