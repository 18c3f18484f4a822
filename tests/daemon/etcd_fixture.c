#include "etcd_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static etcd_fx *live[8]; /* for the atexit sweep */

static void sweep(void) {
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
    if (live[i]) etcd_fx_stop(live[i]);
}

static void track(etcd_fx *f, bool on) {
  static bool registered;
  if (!registered) atexit(sweep);
  registered = true;
  for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
    if (on && !live[i]) {
      live[i] = f;
      return;
    }
    if (!on && live[i] == f) live[i] = NULL;
  }
}

static bool on_path(const char *prog) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
  return system(cmd) == 0;
}

void etcd_fx_require(void) {
  if (on_path("etcd") && on_path("etcdctl")) return;
  fprintf(stderr, "SKIP: etcd or etcdctl is not installed (Debian: etcd-server etcd-client; "
                  "scripts/install-deps installs them)\n");
  exit(77);
}

static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t len = sizeof sa;
  int port = 0;
  if (s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      getsockname(s, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  if (s >= 0) close(s);
  return port;
}

const char *etcd_fx_endpoint(const etcd_fx *f, int i) {
  static char buf[ETCD_FX_MAX][40];
  snprintf(buf[i], sizeof buf[i], "%s://127.0.0.1:%d", f->tls ? "https" : "http",
           f->m[i].client_port);
  return buf[i];
}

static void spawn(etcd_fx *f, int i) {
  etcd_fx_member *m = &f->m[i];
  char data[128], log[128], curl[64], purl[64], cluster[256] = "";
  snprintf(data, sizeof data, "%s/%s", f->dir, m->name);
  snprintf(log, sizeof log, "%s/%s.log", f->dir, m->name);
  snprintf(curl, sizeof curl, "%s://127.0.0.1:%d", f->tls ? "https" : "http", m->client_port);
  char ca[96], cert[96], key[96];
  snprintf(ca, sizeof ca, "%s/ca.pem", f->dir);
  snprintf(cert, sizeof cert, "%s/server.pem", f->dir);
  snprintf(key, sizeof key, "%s/server.key", f->dir);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", m->peer_port);
  for (int j = 0; j < f->n; j++) {
    size_t len = strlen(cluster);
    snprintf(cluster + len, sizeof cluster - len, "%s%s=http://127.0.0.1:%d", j ? "," : "",
             f->m[j].name, f->m[j].peer_port);
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    if (getppid() != parent) _exit(1);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    if (f->tls)
      execlp("etcd", "etcd", "--name", m->name, "--data-dir", data, "--listen-client-urls", curl,
             "--advertise-client-urls", curl, "--listen-peer-urls", purl,
             "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
             "--initial-cluster-state", "new", "--initial-cluster-token", f->dir,
             "--log-level", "warn", "--experimental-watch-progress-notify-interval", "300ms", "--cert-file", cert, "--key-file", key,
             "--trusted-ca-file", ca, "--client-cert-auth", (char *)NULL);
    else
      execlp("etcd", "etcd", "--name", m->name, "--data-dir", data, "--listen-client-urls", curl,
             "--advertise-client-urls", curl, "--listen-peer-urls", purl,
             "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
             "--initial-cluster-state", "new", "--initial-cluster-token", f->dir,
             "--log-level", "warn", "--experimental-watch-progress-notify-interval", "300ms", (char *)NULL);
    _exit(127);
  }
  m->pid = pid > 0 ? pid : 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* etcdctl's TLS flags for f (empty without TLS). */
static const char *ctl_tls(const etcd_fx *f) {
  static char buf[400];
  buf[0] = 0;
  if (f->tls)
    snprintf(buf, sizeof buf, "--cacert=%s/ca.pem --cert=%s/client.pem --key=%s/client.key",
             f->dir, f->dir, f->dir);
  return buf;
}

/* Polls etcdctl endpoint health on endpoints until it passes or ms pass. */
static bool wait_healthy(const etcd_fx *f, const char *endpoints, int ms) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "ETCDCTL_API=3 etcdctl --endpoints=%s %s --dial-timeout=1s --command-timeout=2s "
           "endpoint health >>%s/ctl.log 2>&1",
           endpoints, ctl_tls(f), f->dir);
  double end = now_s() + ms / 1000.0;
  while (now_s() < end) {
    if (system(cmd) == 0) return true;
    usleep(200 * 1000);
  }
  return false;
}

/* Whether every member still runs a moment after its start: one that found
 * its port taken (free_port let go of it, and another process of a busy
 * machine took it meanwhile) exits at once. */
static bool members_stay(etcd_fx *f) {
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  for (int i = 0; i < f->n; i++) {
    if (waitpid(f->m[i].pid, NULL, WNOHANG) == 0) continue;
    f->m[i].pid = 0;
    return false;
  }
  return true;
}

/* The CA, the server's certificate (127.0.0.1) and a client's (CN root). */
static bool make_certs(const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "(cd '%s' && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext.cnf && "
           "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
           "-subj '/CN=etcd test CA' && "
           "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
           "-subj '/CN=etcd' && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
           "-CAcreateserial -out server.pem -days 1 -extfile ext.cnf && "
           "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
           "-subj '/CN=root' && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key "
           "-CAcreateserial -out client.pem -days 1 && chmod 600 client.key server.key) "
           ">/dev/null 2>&1", dir);
  return system(cmd) == 0;
}

static bool start(etcd_fx *f, int n, bool tls) {
  if (n != 1 && n != 3) {
    fprintf(stderr, "etcd_fx_start: %d members (1 or 3)\n", n);
    return false;
  }
  for (int attempt = 0; attempt < 5; attempt++) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/etcd-test-XXXXXX");
    if (!mkdtemp(f->dir)) {
      fprintf(stderr, "etcd_fx_start: mkdtemp: %s\n", strerror(errno));
      return false;
    }
    f->tls = tls;
    if (tls && !make_certs(f->dir)) {
      fprintf(stderr, "etcd_fx_start: openssl could not make the certificates\n");
      etcd_fx_stop(f);
      return false;
    }
    f->n = n;
    for (int i = 0; i < n; i++) {
      snprintf(f->m[i].name, sizeof f->m[i].name, "e%d", i + 1);
      f->m[i].client_port = free_port();
      f->m[i].peer_port = free_port();
      size_t len = strlen(f->endpoints);
      snprintf(f->endpoints + len, sizeof f->endpoints - len, "%s%s", i ? "," : "",
               etcd_fx_endpoint(f, i));
    }
    track(f, true);
    for (int i = 0; i < n; i++) spawn(f, i);
    if (!members_stay(f)) { /* a port was taken meanwhile: again, on others */
      etcd_fx_stop(f);
      continue;
    }
    if (wait_healthy(f, f->endpoints, 30000)) return true;
    fprintf(stderr, "etcd_fx_start: the %d-member etcd in %s did not become healthy in 30 s\n", n,
            f->dir);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "tail -n 20 %s/*.log >&2", f->dir);
    if (system(cmd)) {}
    etcd_fx_stop(f);
    return false;
  }
  fprintf(stderr, "etcd_fx_start: a member's port was taken five times in a row\n");
  return false;
}

bool etcd_fx_start(etcd_fx *f, int n) { return start(f, n, false); }

bool etcd_fx_start_tls(etcd_fx *f) { return start(f, 1, true); }

void etcd_fx_kill(etcd_fx *f, int i) {
  if (!f->m[i].pid) return;
  kill(f->m[i].pid, SIGKILL);
  waitpid(f->m[i].pid, NULL, 0);
  f->m[i].pid = 0;
}

bool etcd_fx_restart(etcd_fx *f, int i) {
  etcd_fx_kill(f, i);
  spawn(f, i); /* on an existing data dir, etcd ignores the --initial-* flags */
  return wait_healthy(f, etcd_fx_endpoint(f, i), 20000);
}

bool etcd_fx_wait(const etcd_fx *f, int ms) {
  char eps[256] = "";
  for (int i = 0; i < f->n; i++)
    if (f->m[i].pid) {
      size_t len = strlen(eps);
      snprintf(eps + len, sizeof eps - len, "%s%s", len ? "," : "", etcd_fx_endpoint(f, i));
    }
  return eps[0] && wait_healthy(f, eps, ms);
}

int etcd_fx_ctl(const etcd_fx *f, const char *args) {
  char cmd[1600];
  snprintf(cmd, sizeof cmd,
           "ETCDCTL_API=3 etcdctl --endpoints=%s %s --command-timeout=5s %s >>%s/ctl.log 2>&1",
           f->endpoints, ctl_tls(f), args, f->dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void etcd_fx_stop(etcd_fx *f) {
  for (int i = 0; i < f->n; i++) etcd_fx_kill(f, i);
  if (f->dir[0] && !strncmp(f->dir, "/tmp/etcd-test-", 15)) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd)) {}
  }
  f->dir[0] = 0;
  f->n = 0;
  track(f, false);
}
