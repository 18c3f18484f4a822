/* The base layer: logging, the state directory and its lock, job
 * directories, and async calls over channels cached by address. */
#include "daemon/base.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/dirperm.h"

/* ---- logging ---- */

static void vlog(const megad_base *b, bool warn, const char *fmt, va_list ap) {
  if (b->quiet && !warn) return;
  char line[1024];
  vsnprintf(line, sizeof line, fmt, ap);
  /* Under systemd the journal adds time and name; a terminal gets both. */
  if (getenv("JOURNAL_STREAM")) {
    fprintf(stderr, "%s%s\n", warn ? "<4>" : "<6>", line);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof stamp, "%H:%M:%S", localtime_r(&ts.tv_sec, &tm));
    fprintf(stderr, "megad[%s] %s.%03ld %s%s\n", b->node_id ? b->node_id : "-", stamp,
            ts.tv_nsec / 1000000, warn ? "warning: " : "", line);
  }
}

void megad_log(const megad_base *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(b, false, fmt, ap);
  va_end(ap);
}

void megad_warn(const megad_base *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(b, true, fmt, ap);
  va_end(ap);
}

/* ---- the state directory ---- */

bool megad_write_state_file(const megad_base *b, const char *name, const char *text) {
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s/%s", b->state_dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  bool ok = f && fputs(text, f) >= 0;
  ok = f && fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
  int e = errno;
  if (f && fclose(f) != 0 && ok) ok = false, e = errno;
  if (ok && rename(tmp, path) != 0) ok = false, e = errno;
  if (ok) return true;
  if (f) unlink(tmp);
  megad_warn(b, "cannot write %s: %s (a full disk? free space there; it is rewritten at the "
                "next start)", path, strerror(e));
  return false;
}

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0700) && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(buf, 0700) && errno != EEXIST ? -1 : 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

bool megad_rmtree(const char *path) {
  return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT;
}

bool megad_job_id_is_name(const char *job_id) {
  size_t n = job_id ? strlen(job_id) : 0;
  if (!n || n > 128 || !strcmp(job_id, ".") || !strcmp(job_id, "..")) return false;
  return strspn(job_id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == n;
}

char *megad_job_dir(const megad_base *b, const char *job_id) {
  char *dir = NULL;
  if (!megad_job_id_is_name(job_id)) {
    errno = EINVAL;
    return NULL;
  }
  if (asprintf(&dir, "%s/jobs/%s", b->state_dir, job_id) < 0) return NULL;
  if (mkdir_p(dir)) {
    int e = errno;
    megad_warn(b, "cannot create %s: %s", dir, strerror(e));
    free(dir);
    errno = e; /* for the caller's message */
    return NULL;
  }
  return dir;
}

/* One megad per state dir: a second one would append to the first one's
 * journal and undo its jobs. The lock dies with the process. */
static mega_status lock_state_dir(megad_base *b, mega_err *err) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/lock", b->state_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    close(fd);
    if (e == EWOULDBLOCK)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "the state directory %s is in use by another megad (pid %s); give each "
                       "megad its own --state-dir", b->state_dir, pid[0] ? pid : "unknown");
    return mega_fail(err, MEGA_ERR_IO, "cannot lock %s: %s", path, strerror(e));
  }
  char text[32];
  int len = snprintf(text, sizeof text, "%d\n", (int)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) {
    /* the lock holds without the pid; the message just says "unknown" */
  }
  b->lock_fd = fd;
  return MEGA_OK;
}

/* The journal and logs say what jobs ran and hold their flags: megad's
 * directory is made private. Only its own, though: a file is refused before
 * anything is changed, and so is a directory others share (world-writable
 * or sticky, like /tmp), whose mode is not megad's to take away, and a
 * directory another user owns: its owner could put a journal there for
 * megad to recover and run, or links for megad to write through (as root,
 * anywhere). */
static mega_status private_state_dir(megad_base *b, const char *given, mega_err *err) {
  struct stat st;
  if (stat(b->state_dir, &st) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot look at the state directory %s: %s", given,
                     strerror(errno));
  unsigned mode = (unsigned)(st.st_mode & 07777);
  if (!S_ISDIR(st.st_mode))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--state-dir %s is not a directory; give a directory of megad's own (it is "
                     "made if missing)", given);
  /* sticky alone too: megad would take its mode away from those who share it */
  const char *shared = (st.st_mode & S_ISVTX) ? "sticky, like /tmp" : mega_dir_others_write(mode);
  if (shared)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--state-dir %s is a shared directory (mode %04o: %s), and megad makes its "
                     "state directory private; give a directory of its own, such as %s/megad "
                     "(it is made if missing)",
                     given, mode, shared, b->state_dir);
  if (st.st_uid != geteuid())
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--state-dir %s belongs to uid %u, not to megad's uid %u: its owner could "
                     "put a journal there for megad to run, or links for it to write through; "
                     "give a directory of megad's own (it is made if missing) or chown it",
                     given, (unsigned)st.st_uid, (unsigned)geteuid());
  if ((st.st_mode & 077) && chmod(b->state_dir, mode & 07700) == 0)
    megad_log(b, "made the state directory %s private (mode %04o, was %04o)", b->state_dir,
              mode & 07700, mode);
  return MEGA_OK;
}

mega_status megad_base_init(megad_base *b, uv_loop_t *loop, const char *node_id,
                            const char *state_dir, bool quiet, mega_err *err) {
  memset(b, 0, sizeof *b);
  b->loop = loop;
  b->quiet = quiet;
  b->lock_fd = -1;
  if (!(b->node_id = strdup(node_id))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  b->state_dir = realpath(state_dir, NULL);
  if (!b->state_dir && (mkdir_p(state_dir) || !(b->state_dir = realpath(state_dir, NULL))))
    return mega_fail(err, MEGA_ERR_IO, "cannot create the state directory %s: %s", state_dir,
                     strerror(errno));
  mega_status s = private_state_dir(b, state_dir, err);
  if (s == MEGA_OK) s = lock_state_dir(b, err);
  if (s == MEGA_OK) s = mega_rpc_cq_new(loop, &b->cq, err);
  return s;
}

/* ---- stalls ---- */

static uint64_t hr_ms(uint64_t ns) { return ns / 1000000u; }

/* The tick bounds every poll's wait (uv_backend_timeout cannot say the
 * wait: it answers 0 while the loop has fd changes to apply). */
#define STALL_TICK_MS 250

static void on_stall_tick(uv_timer_t *t) { (void)t; }

/* How late the turn running now is: its poll outlasted the tick's next
 * due time. */
static uint64_t late_now(const megad_base *b) {
  if (!b->stall.on || !b->stall.poll_ns) return 0;
  uint64_t took = hr_ms(uv_hrtime() - b->stall.poll_ns);
  return took > b->stall.poll_max ? took - b->stall.poll_max : 0;
}

static void stalled(megad_base *b, uint64_t ms) {
  uv_update_time(b->loop);
  b->stall.end_ms = uv_now(b->loop);
  b->stall.ms = ms;
  if (ms >= 1000)
    megad_warn(b, "this megad stalled for %.1f s (its process was stopped or starved of CPU, or "
                  "a call blocked it): what other nodes and workers did not hear from it then is "
                  "not counted against them", (double)ms / 1000);
  if (b->stall.cb) b->stall.cb(b->stall.arg, ms);
}

/* Before the poll: the callbacks since the last check ran this long. */
static void on_prepare(uv_prepare_t *h) {
  megad_base *b = h->data;
  uint64_t now = uv_hrtime();
  if (b->stall.turn_ns && hr_ms(now - b->stall.turn_ns) >= MEGAD_STALL_MS)
    stalled(b, hr_ms(now - b->stall.turn_ns));
  b->stall.poll_ns = uv_hrtime();
  b->stall.poll_max = uv_timer_get_due_in(&b->stall.tick);
}

/* After the poll and its callbacks: later than its timeout allowed? */
static void on_check(uv_check_t *h) {
  megad_base *b = h->data;
  uint64_t late = late_now(b);
  b->stall.poll_ns = 0;
  if (late >= MEGAD_STALL_MS) stalled(b, late);
  b->stall.turn_ns = uv_hrtime();
}

void megad_base_on_stall(megad_base *b, void (*cb)(void *arg, uint64_t ms), void *arg) {
  b->stall.cb = cb;
  b->stall.arg = arg;
  if (b->stall.on) return;
  uv_prepare_init(b->loop, &b->stall.prepare);
  uv_check_init(b->loop, &b->stall.check);
  uv_timer_init(b->loop, &b->stall.tick);
  b->stall.prepare.data = b->stall.check.data = b;
  uv_prepare_start(&b->stall.prepare, on_prepare);
  uv_check_start(&b->stall.check, on_check);
  uv_timer_start(&b->stall.tick, on_stall_tick, STALL_TICK_MS, STALL_TICK_MS);
  /* they only measure: a loop with nothing else to do may end */
  uv_unref((uv_handle_t *)&b->stall.prepare);
  uv_unref((uv_handle_t *)&b->stall.check);
  uv_unref((uv_handle_t *)&b->stall.tick);
  b->stall.on = true;
}

uint64_t megad_quiet_ms(const megad_base *b, uint64_t since_ms) {
  uint64_t now = uv_now(b->loop);
  if (late_now(b) >= MEGAD_STALL_MS) return 0; /* waking: nothing could be heard */
  uint64_t from = since_ms > b->stall.end_ms ? since_ms : b->stall.end_ms;
  return now > from ? now - from : 0;
}

uint64_t megad_stall_recent(const megad_base *b, uint64_t window_ms, uint64_t *start_ms) {
  uint64_t late = late_now(b);
  if (late >= MEGAD_STALL_MS) {
    if (start_ms) *start_ms = hr_ms(b->stall.poll_ns) + b->stall.poll_max;
    return late;
  }
  if (!b->stall.ms || uv_now(b->loop) > b->stall.end_ms + window_ms) return 0;
  if (start_ms) *start_ms = b->stall.end_ms - b->stall.ms;
  return b->stall.ms;
}

/* ---- calls ---- */

struct megad_chan {
  megad_chan *next;
  char *address;
  mega_rpc_channel *ch;
};

struct megad_rpc {
  megad_rpc *next, *prev;
  megad_base *b;
  mega_rpc_pending *p;
  mega_rpc_reply_fn cb;
  mega_rpc_item_fn on_item;
  mega_rpc_end_fn on_end;
  void *arg;
};

static mega_status channel_for(megad_base *b, const char *address, mega_rpc_channel **out,
                               mega_err *err) {
  for (megad_chan *c = b->chans; c; c = c->next)
    if (!strcmp(c->address, address)) {
      *out = c->ch;
      return MEGA_OK;
    }
  megad_chan *c = calloc(1, sizeof *c);
  if (!c || !(c->address = strdup(address))) {
    free(c);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  mega_rpc_channel_opts o = {.peer_name = "megad", .max_backoff_ms = 1000, .auth = b->auth,
                             .auth_hint = "give every megad the same --token-file (and --peer-token-file)"};
  mega_status s = mega_rpc_channel_new(address, &o, &c->ch, err);
  if (s != MEGA_OK) {
    free(c->address);
    free(c);
    return s;
  }
  c->next = b->chans;
  b->chans = c;
  *out = c->ch;
  return MEGA_OK;
}

void megad_forget_channel(megad_base *b, const char *address) {
  for (megad_chan **p = &b->chans; *p; p = &(*p)->next)
    if (!strcmp((*p)->address, address)) {
      megad_chan *c = *p;
      *p = c->next;
      mega_rpc_channel_free(c->ch); /* calls in flight keep it until they end */
      free(c->address);
      free(c);
      return;
    }
}

static void rpc_unlink(megad_rpc *r) {
  if (r->prev) r->prev->next = r->next;
  else r->b->rpcs = r->next;
  if (r->next) r->next->prev = r->prev;
}

static void rpc_done(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  megad_rpc *r = arg;
  rpc_unlink(r);
  r->cb(r->arg, resp, err);
  free(r);
}

static void rpc_item(void *arg, ProtobufCMessage *msg) {
  megad_rpc *r = arg;
  r->on_item(r->arg, msg);
}

static void rpc_end(void *arg, const mega_err *err) {
  megad_rpc *r = arg;
  rpc_unlink(r);
  r->on_end(r->arg, err);
  free(r);
}

static megad_rpc *rpc_new(megad_base *b, void *arg) {
  megad_rpc *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->b = b;
  r->arg = arg;
  return r;
}

static void rpc_link(megad_base *b, megad_rpc *r) {
  r->next = b->rpcs;
  if (b->rpcs) b->rpcs->prev = r;
  b->rpcs = r;
}

mega_status megad_call(megad_base *b, const char *address, const mega_rpc_method *m,
                       const ProtobufCMessage *req, unsigned timeout_ms, mega_rpc_reply_fn cb,
                       void *arg, mega_err *err) {
  mega_rpc_channel *ch;
  mega_status s = channel_for(b, address, &ch, err);
  if (s != MEGA_OK) return s;
  megad_rpc *r = rpc_new(b, arg);
  if (!r) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  r->cb = cb;
  s = mega_rpc_unary_async(ch, b->cq, m, req, timeout_ms, rpc_done, r, &r->p, err);
  if (s != MEGA_OK) {
    free(r);
    return s;
  }
  rpc_link(b, r);
  return MEGA_OK;
}

mega_status megad_call_stream(megad_base *b, const char *address, const mega_rpc_method *m,
                              const ProtobufCMessage *req, unsigned timeout_ms,
                              mega_rpc_item_fn on_item, mega_rpc_end_fn on_end, void *arg,
                              mega_rpc_pending **handle, mega_err *err) {
  mega_rpc_channel *ch;
  mega_status s = channel_for(b, address, &ch, err);
  if (s != MEGA_OK) return s;
  megad_rpc *r = rpc_new(b, arg);
  if (!r) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  r->on_item = on_item;
  r->on_end = on_end;
  s = mega_rpc_stream_async(ch, b->cq, m, req, timeout_ms, rpc_item, rpc_end, r, &r->p, err);
  if (s != MEGA_OK) {
    free(r);
    return s;
  }
  rpc_link(b, r);
  if (handle) *handle = r->p;
  return MEGA_OK;
}

void megad_calls_cancel(megad_base *b) {
  for (megad_rpc *r = b->rpcs; r; r = r->next) mega_rpc_pending_cancel(r->p);
}

bool megad_calls_idle(const megad_base *b) { return b->rpcs == NULL; }

void megad_base_close_cq(megad_base *b, void (*done)(void *arg), void *arg) {
  mega_rpc_cq *cq = b->cq;
  b->cq = NULL;
  if (cq) mega_rpc_cq_close(cq, done, arg);
  else if (done) done(arg);
}

void megad_base_free(megad_base *b) {
  while (b->chans) {
    megad_chan *c = b->chans;
    b->chans = c->next;
    mega_rpc_channel_free(c->ch);
    free(c->address);
    free(c);
  }
  if (b->lock_fd >= 0) close(b->lock_fd);
  b->lock_fd = -1;
  if (b->stall.on) {
    uv_close((uv_handle_t *)&b->stall.prepare, NULL);
    uv_close((uv_handle_t *)&b->stall.check, NULL);
    uv_close((uv_handle_t *)&b->stall.tick, NULL);
    b->stall.on = false;
  }
  free(b->node_id);
  free(b->state_dir);
  b->node_id = b->state_dir = NULL;
}
