#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/step_bubble.h"

/* Daemons started and not yet cleaned up, by state dir. Copies, not
 * pointers: a failed test leaves its stack frame before the teardown. */
#define MAX_LIVE 64 /* bench_scale runs 32 */
typedef struct live_ent {
  bool used;
  pid_t pid;
  mega_rpc_channel *ch; /* the test's client channel, freed with the entry */
  char dir[128], log[160];
} live_ent;
static live_ent live[MAX_LIVE];

static live_ent *entry(const char *dir, bool add) {
  live_ent *free_ent = NULL;
  for (int i = 0; i < MAX_LIVE; i++) {
    if (live[i].used && !strcmp(live[i].dir, dir)) return &live[i];
    if (!live[i].used && !free_ent) free_ent = &live[i];
  }
  if (!add || !free_ent) return NULL;
  free_ent->used = true;
  snprintf(free_ent->dir, sizeof free_ent->dir, "%s", dir);
  return free_ent;
}

static void note_pid(const hd *d) {
  live_ent *e = entry(d->dir, d->pid > 0);
  if (!e) return;
  e->pid = d->pid;
  snprintf(e->log, sizeof e->log, "%s", d->log);
}

void hd_cleanup_all(void) {
  for (int i = 0; i < MAX_LIVE; i++) {
    live_ent *e = &live[i];
    if (!e->used) continue;
    if (e->pid > 0) {
      kill(e->pid, SIGKILL);
      waitpid(e->pid, NULL, 0);
    }
    if (e->ch) mega_rpc_channel_free(e->ch);
    unlink(e->log);
    hd_rmdir(e->dir);
    memset(e, 0, sizeof *e);
  }
}

static const mega_rpc_auth *client_auth;

void hd_set_auth(const mega_rpc_auth *a) { client_auth = a; }

double hd_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void hd_tmpdir(char *buf, size_t len) {
  snprintf(buf, len, "/tmp/megad-test-XXXXXX");
  if (!mkdtemp(buf)) buf[0] = '\0';
}

void hd_rmdir(const char *dir) {
  if (!dir[0] || strncmp(dir, "/tmp/megad-test-", 16)) return;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) {
    /* leftovers in /tmp are harmless */
  }
}

static const char *prog(const char *env, const char *fallback) {
  const char *p = getenv(env);
  return p && p[0] ? p : fallback;
}

void hd_dump_log(const hd *d) {
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  fprintf(stderr, "---- megad %s log (%s) ----\n", d->name, d->log);
  char line[1024];
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fprintf(stderr, "---- end of %s log ----\n", d->name);
  fclose(f);
  /* and its workers' own logs (what a rank said before megad saw it end) */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "find '%s' -name 'rank-*.log' 2>/dev/null", d->dir);
  FILE *list = popen(cmd, "r");
  if (!list) return;
  char path[512];
  while (fgets(path, sizeof path, list)) {
    path[strcspn(path, "\n")] = 0;
    FILE *r = fopen(path, "r");
    if (!r) continue;
    fprintf(stderr, "---- %s ----\n", path);
    while (fgets(line, sizeof line, r)) fputs(line, stderr);
    fclose(r);
  }
  pclose(list);
}

int hd_log_line(const hd *d, const char *text) {
  FILE *f = fopen(d->log, "r");
  if (!f) return -1;
  char line[4096];
  int at = -1;
  for (int n = 0; at < 0 && fgets(line, sizeof line, f); n++)
    if (strstr(line, text)) at = n;
  fclose(f);
  return at;
}

bool hd_log_has(const hd *d, const char *text) { return hd_log_line(d, text) >= 0; }

bool hd_wait_log(const hd *d, const char *text, int ms) {
  for (int waited = 0; !hd_log_has(d, text); waited += 50) {
    if (waited >= ms) { /* every caller needs the line: say what came instead */
      fprintf(stderr, "no \"%s\" in megad %s's log after %d ms\n", text, d->name, ms);
      hd_dump_log(d);
      return false;
    }
    usleep(50 * 1000);
  }
  return true;
}

bool hd_start(hd *d, const char *name, int slots, const char *peers, const char *state_dir,
              const char *const *extra) {
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->slots = slots;
  snprintf(d->peers, sizeof d->peers, "%s", peers ? peers : "");
  if (state_dir) snprintf(d->dir, sizeof d->dir, "%s", state_dir);
  else hd_tmpdir(d->dir, sizeof d->dir);
  snprintf(d->log, sizeof d->log, "%s.log", d->dir);
  char slots_s[16];
  snprintf(slots_s, sizeof slots_s, "%d", slots);
  const char *argv[32];
  int n = 0;
  argv[n++] = prog("MEGAD", "megad");
  argv[n++] = "serve";
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  argv[n++] = "--state-dir";
  argv[n++] = d->dir;
  argv[n++] = "--slots";
  argv[n++] = slots_s;
  argv[n++] = "--node-name";
  argv[n++] = d->name;
  argv[n++] = "--worker";
  argv[n++] = prog("MEGAW", "megaw");
  if (peers) {
    argv[n++] = "--peers";
    argv[n++] = peers;
  }
  for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int out[2];
  if (pipe(out)) return false;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int log = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(out[1], 1);
    if (log >= 0) dup2(log, 2);
    close(out[0]);
    execvp(argv[0], (char **)argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(out[1]);
  d->pid = pid;
  static bool registered;
  if (!registered) atexit(hd_cleanup_all);
  registered = true;
  note_pid(d);
  /* "megad: listening on 127.0.0.1:PORT" */
  FILE *f = fdopen(out[0], "r");
  char line[256] = "";
  bool ok = f && fgets(line, sizeof line, f) && sscanf(line, "megad: listening on %63s", d->addr) == 1;
  if (f) fclose(f);
  if (!ok) {
    fprintf(stderr, "megad %s did not start (first line: '%s')\n", name, line);
    hd_dump_log(d);
    hd_kill(d);
    return false;
  }
  mega_rpc_channel_opts o = {.peer_name = "megad", .max_backoff_ms = 200, .auth = client_auth};
  if (mega_rpc_channel_new(d->addr, &o, &d->ch, NULL) != MEGA_OK) return false;
  live_ent *e = entry(d->dir, false);
  if (e) e->ch = d->ch;
  return true;
}

bool hd_restart(hd *d, const char *const *extra) {
  hd_kill(d);
  live_ent *e = entry(d->dir, false);
  if (e) e->ch = NULL;
  if (d->ch) mega_rpc_channel_free(d->ch);
  d->ch = NULL;
  hd was = *d;
  return hd_start(d, was.name, was.slots, was.peers[0] ? was.peers : NULL, was.dir, extra);
}

int hd_stop(hd *d) {
  if (d->pid <= 0) return -1;
  kill(d->pid, SIGTERM);
  for (int i = 0; i < 2000; i++) {
    int st;
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r == d->pid) {
      d->pid = 0;
      note_pid(d);
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    usleep(10000);
  }
  hd_kill(d);
  return -1;
}

void hd_kill(hd *d) {
  if (d->pid <= 0) return;
  kill(d->pid, SIGKILL);
  waitpid(d->pid, NULL, 0);
  d->pid = 0;
  note_pid(d);
}

void hd_stop_node_at(void *arg, const Mega__V1__WatchJobResponse *it) {
  hd_node_stopper *k = arg;
  if (k->done || it->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP ||
      it->step->iteration < k->at)
    return;
  k->when_ms = hd_unix_ms();
  if (k->sig)
    kill(k->victim->pid, k->sig);
  else
    hd_kill(k->victim); /* megad and (PR_SET_PDEATHSIG) its workers */
  k->done = true;
}

void hd_cleanup(hd *d) {
  if (d->pid > 0) hd_kill(d);
  live_ent *e = entry(d->dir, false);
  if (e) memset(e, 0, sizeof *e); /* d->ch is freed here, not by the entry */
  if (d->ch) mega_rpc_channel_free(d->ch);
  d->ch = NULL;
  unlink(d->log);
  hd_rmdir(d->dir);
}

int hd_workers(const hd *d, pid_t *pids, int max) {
  DIR *dir = opendir("/proc");
  if (!dir) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) && n < max) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = '\0';
    /* pid (comm) state ppid ...; comm may hold spaces, so go from the last ')' */
    char *rp = strrchr(buf, ')');
    char state;
    long ppid;
    if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == d->pid && state != 'Z')
      pids[n++] = (pid_t)pid;
  }
  closedir(dir);
  return n;
}

bool hd_wait_workers(const hd *d, int n, int ms, pid_t *pids) {
  for (int t = 0; t < ms; t += 20) {
    if (hd_workers(d, pids, 64) >= n) return true;
    usleep(20000);
  }
  return false;
}

bool hd_pid_alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

void hd_tiny_spec(Mega__V1__JobSpec *spec, const char *dir, int iters, const char *const *extra) {
  static char data[256], iters_s[16];
  static const char *argv[64];
  snprintf(data, sizeof data, "%s/tiny.txt", dir);
  if (access(data, R_OK)) {
    FILE *f = fopen(data, "w");
    for (int i = 0; f && i < 200; i++)
      fprintf(f, "The quick brown fox jumps over the lazy dog, line %d of a tiny corpus.\n", i);
    if (f) fclose(f);
  }
  snprintf(iters_s, sizeof iters_s, "%d", iters);
  const char *base[] = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
                        "--lr", "0.001", "--train-iters", iters_s, "--data-path", data};
  int n = 0;
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[n++] = base[i];
  for (int i = 0; extra && extra[i] && n < 63; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  mega__v1__job_spec__init(spec);
  spec->name = "tiny";
  spec->args = (char **)argv;
  spec->n_args = (size_t)n;
}

mega_status hd_submit(hd *d, const Mega__V1__JobSpec *spec, char *job_id, size_t len,
                      mega_err *err) {
  Mega__V1__SubmitJobRequest req = MEGA__V1__SUBMIT_JOB_REQUEST__INIT;
  req.spec = (Mega__V1__JobSpec *)spec;
  ProtobufCMessage *resp = NULL;
  mega_status s = mega_rpc_unary(d->ch, &mega_control_submit_job, &req.base, 10000, &resp, err);
  if (s != MEGA_OK) return s;
  snprintf(job_id, len, "%s", ((Mega__V1__SubmitJobResponse *)resp)->job->id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return MEGA_OK;
}

bool hd_version(hd *d, char *buf, size_t len) {
  buf[0] = '\0';
  Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
  for (size_t i = 0; r && i < r->n_nodes; i++)
    if (!strcmp(r->nodes[i]->id, r->self_node_id)) snprintf(buf, len, "%s", r->nodes[i]->version);
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return buf[0] != '\0';
}

mega_status hd_launch_by_hand(hd *d, const char *job_id, const char *version,
                              const char *const *extra, mega_err *err) {
  char own[128];
  if (!version) version = hd_version(d, own, sizeof own) ? own : "";
  Mega__V1__JobSpec spec;
  hd_tiny_spec(&spec, d->dir, 2, extra);
  Mega__V1__Bootstrap bs = MEGA__V1__BOOTSTRAP__INIT;
  bs.kv_prefix = "x/0/";
  bs.kv_timeout_ms = 2000;
  uint32_t rank = 0;
  Mega__V1__LaunchRanksRequest req = MEGA__V1__LAUNCH_RANKS_REQUEST__INIT;
  req.job_id = (char *)job_id;
  req.spec = &spec;
  req.world_size = req.tp = req.pp = req.dp = 1;
  req.ranks = &rank;
  req.n_ranks = 1;
  req.bootstrap = &bs;
  req.coordinator_node_id = d->name;
  req.coordinator_address = d->addr;
  req.coordinator_version = (char *)version;
  ProtobufCMessage *resp = NULL;
  mega_status s = mega_rpc_unary(d->ch, &mega_peer_launch_ranks, &req.base, 10000, &resp, err);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return s;
}

Mega__V1__GetJobResponse *hd_get_job_history(hd *d, const char *job_id, mega_err *err) {
  Mega__V1__GetJobRequest req = MEGA__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)job_id;
  ProtobufCMessage *resp = NULL;
  if (mega_rpc_unary(d->ch, &mega_control_get_job, &req.base, 5000, &resp, err) != MEGA_OK)
    return NULL;
  return (Mega__V1__GetJobResponse *)resp;
}

int64_t hd_event_ms(hd *d, const char *job_id, Mega__V1__JobEventKind kind, int nth,
                    const char *text) {
  Mega__V1__GetJobResponse *r = hd_get_job_history(d, job_id, NULL);
  int64_t at = 0;
  for (size_t i = 0; r && i < r->n_events && !at; i++)
    if (r->events[i]->kind == kind && (!text || strstr(r->events[i]->message, text)) &&
        nth-- == 0)
      at = r->events[i]->time_unix_ms;
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
  return at;
}

mega_status hd_cancel(hd *d, const char *job_id, const char *reason, mega_err *err) {
  Mega__V1__CancelJobRequest req = MEGA__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)job_id;
  req.reason = (char *)reason;
  ProtobufCMessage *resp = NULL;
  mega_status st = mega_rpc_unary(d->ch, &mega_control_cancel_job, &req.base, 10000, &resp, err);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return st;
}

Mega__V1__Job *hd_get_job(hd *d, const char *job_id, mega_err *err) {
  Mega__V1__GetJobResponse *r = hd_get_job_history(d, job_id, err);
  if (!r) return NULL;
  Mega__V1__Job *j = r->job;
  r->job = NULL;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return j;
}

Mega__V1__ListNodesResponse *hd_list_nodes(hd *d, mega_err *err) {
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  if (mega_rpc_unary(d->ch, &mega_control_list_nodes, &req.base, 5000, &resp, err) != MEGA_OK)
    return NULL;
  return (Mega__V1__ListNodesResponse *)resp;
}

uint64_t hd_wait_checkpoint(hd *d, const char *job_id, uint64_t iteration, int ms) {
  for (int t = 0; t < ms; t += 50) {
    Mega__V1__Job *j = hd_get_job(d, job_id, NULL);
    uint64_t k = j ? j->checkpoint_iteration : 0;
    if (j) protobuf_c_message_free_unpacked(&j->base, NULL);
    if (k && k >= iteration) return k;
    usleep(50000);
  }
  return 0;
}

bool hd_wait_alive(hd *d, int want, int ms) {
  for (int t = 0; t < ms; t += 100) {
    Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
    int alive = 0;
    for (size_t i = 0; r && i < r->n_nodes; i++)
      alive += r->nodes[i]->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    if (alive >= want) return true;
    usleep(100000);
  }
  return false;
}

bool hd_wait_node_busy(hd *d, const char *node, uint32_t used, int ms) {
  for (int t = 0; t < ms; t += 50) {
    Mega__V1__ListNodesResponse *r = hd_list_nodes(d, NULL);
    bool busy = false;
    for (size_t i = 0; r && i < r->n_nodes; i++)
      busy |= !strcmp(r->nodes[i]->id, node) && r->nodes[i]->slots_used >= used;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    if (busy) return true;
    usleep(50000);
  }
  fprintf(stderr, "megad %s does not see %u slot(s) of node %s in use after %d ms\n", d->name,
          used, node, ms);
  return false;
}

void hd_watch_job(hd *d, const char *job_id, bool replay, unsigned timeout_ms, hd_watch *w) {
  hd_watch_job_cb(d, job_id, replay, timeout_ms, w, NULL, NULL);
}

void hd_watch_job_cb(hd *d, const char *job_id, bool replay, unsigned timeout_ms, hd_watch *w,
                     hd_item_fn fn, void *arg) {
  memset(w, 0, sizeof *w);
  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)job_id;
  req.replay = replay;
  mega_rpc_stream *s = NULL;
  w->end = mega_rpc_stream_open(d->ch, &mega_control_watch_job, &req.base, timeout_ms, &s, &w->err);
  size_t off = 0;
  while (w->end == MEGA_OK) {
    ProtobufCMessage *m = NULL;
    w->end = mega_rpc_stream_next(s, &m, &w->err);
    if (w->end != MEGA_OK || !m) break;
    Mega__V1__WatchJobResponse *it = (void *)m;
    if (fn) fn(arg, it);
    if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP) {
      w->steps++;
      w->last_iteration = it->step->iteration;
      w->last_loss = it->step->loss;
      w->ranks = mega_step_world(it->step);
      uint64_t k = it->step->iteration;
      if (k <= HD_MAX_ITERS) {
        if (w->seen[k]) w->redone++;
        w->seen[k] = true;
        w->loss[k] = it->step->loss;
        w->attempt[k] = it->step->attempt;
        w->world[k] = mega_step_world(it->step);
      }
    } else if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT) {
      w->events++;
      if (off < sizeof w->events_text)
        off += (size_t)snprintf(w->events_text + off, sizeof w->events_text - off, "%s\n",
                                it->event->message);
    } else if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_GAP) {
      w->gaps++;
      w->missed += it->gap->missed_steps;
    } else if (it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE) {
      if (w->final) protobuf_c_message_free_unpacked(&w->final->base, NULL);
      w->final = it->final_state;
      it->final_state = NULL;
      it->item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM__NOT_SET;
    }
    protobuf_c_message_free_unpacked(m, NULL);
  }
  mega_rpc_stream_close(s);
}

void hd_watch_free(hd_watch *w) {
  if (w->final) protobuf_c_message_free_unpacked(&w->final->base, NULL);
  w->final = NULL;
}

int hd_procs_matching(const char *needle, pid_t *pids, int max) {
  DIR *dir = opendir("/proc");
  if (!dir) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) && n < max) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == getpid()) continue;
    char path[64], buf[16384];
    ssize_t k = 0;
    for (int part = 0; part < 2; part++) { /* the command line, then the environment */
      snprintf(path, sizeof path, "/proc/%ld/%s", pid, part ? "environ" : "cmdline");
      int fd = open(path, O_RDONLY);
      if (fd < 0) continue;
      ssize_t r = read(fd, buf + k, sizeof buf - 1 - (size_t)k);
      close(fd);
      if (r > 0) k += r;
    }
    if (k <= 0) continue;
    for (ssize_t i = 0; i < k; i++)
      if (!buf[i]) buf[i] = ' ';
    buf[k] = '\0';
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    char st[512] = "";
    if (f) {
      size_t r = fread(st, 1, sizeof st - 1, f);
      st[r] = '\0';
      fclose(f);
    }
    char *rp = strrchr(st, ')');
    bool zombie = rp && rp[1] == ' ' && rp[2] == 'Z';
    if (!zombie && strstr(buf, needle)) pids[n++] = (pid_t)pid;
  }
  closedir(dir);
  return n;
}

static void read_small(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY);
  ssize_t r = fd >= 0 ? read(fd, buf, cap - 1) : 0;
  if (fd >= 0) close(fd);
  buf[r > 0 ? r : 0] = '\0';
}

bool hd_workers_gone(pid_t megad_pid, int ms) {
  char needle[32];
  snprintf(needle, sizeof needle, "MEGAD_PID=%d", (int)megad_pid);
  pid_t pids[64];
  for (int t = 0; t < ms; t += 50) {
    if (hd_procs_matching(needle, pids, 64) == 0) return true;
    usleep(50000);
  }
  int n = hd_procs_matching(needle, pids, 64);
  fprintf(stderr, "%d process(es) of megad %d still alive, the first pid %d\n", n, (int)megad_pid,
          n ? (int)pids[0] : 0);
  for (int i = 0; i < n; i++) { /* which: its MEGA_ variables (job, attempt, rank) */
    char path[64], env[16384];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[i]);
    int fd = open(path, O_RDONLY);
    ssize_t k = fd >= 0 ? read(fd, env, sizeof env - 1) : 0;
    if (fd >= 0) close(fd);
    for (ssize_t at = 0; k > 0 && at < k; at += (ssize_t)strlen(env + at) + 1) {
      env[k] = '\0';
      if (!strncmp(env + at, "MEGA_", 5)) fprintf(stderr, "  pid %d: %s\n", (int)pids[i], env + at);
    }
    /* where it waits: each thread's state and kernel wait channel */
    snprintf(path, sizeof path, "/proc/%d/task", (int)pids[i]);
    DIR *tasks = opendir(path);
    for (struct dirent *t; tasks && (t = readdir(tasks));) {
      if (t->d_name[0] == '.') continue;
      char p2[320], st[512] = "", wchan[64] = "";
      snprintf(p2, sizeof p2, "/proc/%d/task/%s/stat", (int)pids[i], t->d_name);
      read_small(p2, st, sizeof st);
      snprintf(p2, sizeof p2, "/proc/%d/task/%s/wchan", (int)pids[i], t->d_name);
      read_small(p2, wchan, sizeof wchan);
      const char *rp = strrchr(st, ')');
      fprintf(stderr, "  pid %d thread %s: state %c, waits in %s\n", (int)pids[i], t->d_name,
              rp && rp[1] && rp[2] ? rp[2] : '?', wchan[0] ? wchan : "?");
    }
    if (tasks) closedir(tasks);
  }
  return false;
}

/* Every rank log under dir (jobs/<id>/<attempt>/rank-N.log), recursively. */
static void dump_rank_logs(const char *dir, int depth) {
  DIR *d = depth < 4 ? opendir(dir) : NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t n = strlen(e->d_name);
    if (!strncmp(e->d_name, "rank-", 5) && n > 4 && !strcmp(e->d_name + n - 4, ".log")) {
      FILE *f = fopen(path, "r");
      if (!f) continue;
      fprintf(stderr, "---- %s ----\n", path);
      char line[1024];
      while (fgets(line, sizeof line, f)) fputs(line, stderr);
      fclose(f);
    } else if (e->d_type == DT_DIR) {
      dump_rank_logs(path, depth + 1);
    }
  }
  if (d) closedir(d);
}

bool hd_node_workers_gone(const hd *d, int ms) {
  if (hd_workers_gone(d->pid, ms)) return true;
  hd_dump_log(d);
  dump_rank_logs(d->dir, 0);
  return false;
}

bool hd_text_ok(const char *what, const char *text, const char *const *has,
                const char *const *lacks) {
  bool ok = true;
  for (size_t i = 0; has && has[i]; i++)
    if (!strstr(text, has[i])) {
      fprintf(stderr, "%s lack \"%s\"\n", what, has[i]);
      ok = false;
    }
  for (size_t i = 0; lacks && lacks[i]; i++)
    if (strstr(text, lacks[i])) {
      fprintf(stderr, "%s hold \"%s\"\n", what, lacks[i]);
      ok = false;
    }
  if (!ok) fprintf(stderr, "%s:\n%s", what, text);
  return ok;
}

bool hd_succeeded(const hd *d, const hd_watch *w) {
  if (w->final && w->final->state == MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED) return true;
  fprintf(stderr, "watch: %s\nfinal: %s\nevents:\n%s", w->err.msg,
          w->final ? w->final->error : "none", w->events_text);
  hd_dump_log(d);
  return false;
}

int hd_free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) ||
      getsockname(s, (struct sockaddr *)&sa, &sl)) {
    fprintf(stderr, "harness: no free port: %s\n", strerror(errno));
    abort();
  }
  close(s);
  return ntohs(sa.sin_port);
}

char *hd_http_get(int port, const char *path, const char *auth) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  char *page = malloc(1 << 16);
  if (!page || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    fprintf(stderr, "harness: cannot connect to 127.0.0.1:%d: %s\n", port, strerror(errno));
    abort();
  }
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n%s%s%s\r\n", path,
                   auth ? "Authorization: " : "", auth ? auth : "", auth ? "\r\n" : "");
  size_t got = 0;
  ssize_t r;
  if (write(fd, req, (size_t)n) == n)
    while (got < (1 << 16) - 1 && (r = read(fd, page + got, (1 << 16) - 1 - got)) > 0)
      got += (size_t)r;
  close(fd);
  page[got] = '\0';
  return page;
}

int64_t hd_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
