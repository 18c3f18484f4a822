#include "daemon/model/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "core/jobspec.h"

ProtobufCMessage *megad_pb_copy(const ProtobufCMessage *m) {
  uint8_t *buf;
  size_t len;
  if (!megad_pb_pack(m, &buf, &len)) return NULL;
  ProtobufCMessage *c = protobuf_c_message_unpack(m->descriptor, NULL, len, buf);
  free(buf);
  return c;
}

bool megad_pb_pack(const ProtobufCMessage *m, uint8_t **buf, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n ? n : 1);
  if (!b) return false;
  protobuf_c_message_pack(m, b);
  *buf = b;
  *len = n;
  return true;
}

int64_t megad_unix_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t megad_unix_ms(void) { return megad_unix_us() / 1000; }

uint64_t megad_new_incarnation(void) {
  return ((uint64_t)megad_unix_ms() << 20) | ((uint64_t)getpid() & 0xfffff);
}

char *megad_strdup(const char *s) { return strdup(s ? s : ""); }

const char *megad_signal_name(int sig) {
  const char *s = strsignal(sig);
  return s ? s : "unknown signal";
}

const char *megad_signal_hint(int sig) {
  switch (sig) {
  case SIGKILL:
    return "something outside megad killed it: the kernel's out-of-memory killer does when the "
           "node runs out of memory (the node's kernel log says so: journalctl -k | grep -i "
           "oom), as does a kill -9; if it was memory, give each rank more (fewer ranks per "
           "node, more pipeline or tensor parallelism, a smaller --micro-batch-size)";
  case SIGBUS:
    return "megaw crashed on a bus error: a memory-mapped file it read (--data-path) shrank "
           "or was replaced while the job ran, or a memory limit was hit";
  case SIGSEGV:
  case SIGABRT:
  case SIGILL:
  case SIGFPE:
    return "megaw crashed (its last stderr lines are in the rank's log under megad's "
           "--state-dir, jobs/JOB/ATTEMPT/rank-R.log)";
  default:
    return NULL;
  }
}

/* path, or path + ext, is a regular file; else *why says why not. */
static bool is_file(const char *path, const char *ext, const char **why) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s%s", path, ext);
  struct stat st;
  if (stat(buf, &st) != 0) {
    *why = strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) *why = "it is not a file";
  return S_ISREG(st.st_mode);
}

bool megad_data_visible(const mega_jobspec *s, const char **flag, const char **bad,
                        const char **why) {
  const char *p;
  for (int k = 0; (p = mega_jobspec_data_file(s, k, flag)); k++) {
    const char *w = NULL;
    bool ok = is_file(p, ".idx", &w) ? is_file(p, ".bin", why) : is_file(p, "", why);
    if (!ok) {
      *bad = p;
      return false;
    }
  }
  return true;
}
