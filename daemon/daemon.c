/* megad's life cycle: every layer started in order and wired through the
 * callbacks each registers with the one below, and shutdown in order. */
#include "daemon/daemon.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "daemon/etcd/etcd.h"
#include "daemon/model/stepring.h"
#include "daemon/model/util.h"
#include "worker/backend/cuda_devices.h"

/* ---- wiring: what one layer tells the layers above ---- */

static void on_node_up(void *arg, megad_node *n) {
  megad *d = arg;
  megad_coord_node_up(&d->coord, n);
}

static void on_node_lost(void *arg, megad_node *n, const char *why) {
  megad *d = arg;
  megad_coord_node_lost(&d->coord, n, why);
  char abort_why[512];
  snprintf(abort_why, sizeof abort_why, "the job's coordinator is gone: %s", why);
  /* what they hold may be wanted: with etcd by the node that takes the job
   * over, without by the coordinator once it restarts */
  megad_launch_abort_coord(&d->launcher, n->id, abort_why, true);
}

/* This node's loop stood still (stopped or starved): the attempts it
 * coordinates may not have outlived it. */
static void on_stall(void *arg, uint64_t ms) {
  megad *d = arg;
  megad_coord_stalled(&d->coord, ms);
  megad_launch_stalled(&d->launcher);
}

static uint32_t self_load(void *arg, const char **ids, size_t max, size_t *n) {
  megad *d = arg;
  return megad_launch_load(&d->launcher, ids, max, n);
}

static void on_worker_step(void *arg, const char *job_id, uint32_t attempt, const char *node_id,
                           const Mega__V1__StepReport *r) {
  megad *d = arg;
  megad_coord_step(&d->coord, job_id, attempt, node_id, r);
}

static void on_worker_event(void *arg, const char *job_id, uint32_t attempt, const char *node_id,
                            const Mega__V1__RankEvent *ev) {
  megad *d = arg;
  /* a rank that holds state for an attempt already over: nobody will
   * fetch it (a remote node learns this from its refused report). Asked
   * before the event, which may itself end the attempt. */
  bool late = ev->kind_case == MEGA__V1__RANK_EVENT__KIND_HELD &&
              !megad_coord_runs(&d->coord, job_id, attempt) &&
              !megad_coord_keeps(&d->coord, job_id, attempt);
  megad_coord_event(&d->coord, job_id, attempt, node_id, ev);
  if (late)
    megad_launch_abort(&d->launcher, job_id, attempt, false,
                       "the attempt ended before this rank held its state", MEGAD_ABORT_GRACE_MS);
}

/* etcd mode: what the jobs layer tells the coordinator */
static void on_job_fenced(void *arg, mega_job *j, const char *why) {
  megad *d = arg;
  megad_coord_fenced(&d->coord, j, why);
}

static void on_job_orphan(void *arg, const char *job_id) {
  megad *d = arg;
  megad_coord_orphan(&d->coord, job_id);
}

static void on_job_refused(void *arg, mega_job *j, const char *why) {
  megad *d = arg;
  megad_coord_refused(&d->coord, j, why);
}

/* Steps this node kept since a job's coordinator died go to its new one. */
static void on_job_coordinator(void *arg, const char *job_id, const char *node_id) {
  megad *d = arg;
  megad_node *n = megad_members_find(&d->members, node_id);
  if (n && n->address) megad_launch_coord_moved(&d->launcher, job_id, node_id, n->address);
}

static mega_status on_resent(void *arg, const char *job_id, uint32_t attempt, uint32_t world,
                             const char *node_id, Mega__V1__StepReport *const *r, size_t n,
                             mega_err *err) {
  megad *d = arg;
  return megad_coord_resent(&d->coord, job_id, attempt, world, node_id, r, n, err);
}

static void on_launch_ended(void *arg, const char *job_id) {
  (void)job_id;
  megad *d = arg;
  megad_coord_launch_ended(&d->coord);
}

static void on_job_claimed(void *arg, mega_job *j) {
  (void)j;
  megad *d = arg;
  megad_coord_schedule(&d->coord);
}

/* This node's lease is gone: everyone has counted it lost, so its jobs are
 * being taken over and its workers are stale. */
static void on_self_fenced(void *arg, const char *why) {
  megad *d = arg;
  char msg[512];
  snprintf(msg, sizeof msg, "node %s lost its etcd lease (%s); standing down", d->base.node_id, why);
  megad_warn(&d->base, "%s", msg);
  megad_coord_stand_down(&d->coord, msg);
  megad_launch_abort_all(&d->launcher, msg);
}

/* ---- start ---- */

/* megaw next to megad (installed), or in ../worker (the build tree). */
static char *find_worker(void) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = '\0';
  const char *tries[] = {"%s/megaw", "%s/../worker/megaw"};
  for (int i = 0; i < 2; i++) {
    char *p = NULL;
    if (asprintf(&p, tries[i], exe) < 0) return NULL;
    if (access(p, X_OK) == 0) {
      char *real = realpath(p, NULL);
      free(p);
      return real;
    }
    free(p);
  }
  return NULL;
}

/* A node's name is part of every job id it makes, of its etcd keys and of
 * paths under the state dir, and fixed buffers hold it (MEGAD_NODE_NAME_MAX):
 * letters, digits, '.', '-' and '_' only, as host names are. */
static mega_status check_node_name(const char *name, bool given, mega_err *err) {
  const char *from = given ? "--node-name" : "the host name (megad's default node name)";
  size_t n = strlen(name);
  if (!n) return mega_fail(err, MEGA_ERR_INVALID, "%s is empty; give --node-name NAME", from);
  if (n > MEGAD_NODE_NAME_MAX)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s '%s' is %zu bytes long; a node name has at most %d (give a shorter "
                     "--node-name)", from, name, n, MEGAD_NODE_NAME_MAX);
  size_t bad = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");
  if (bad < n)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s '%s' holds '%c' (byte %zu); a node name has only letters, digits, '.', "
                     "'-' and '_', as a host name (give --node-name)", from, name,
                     (unsigned char)name[bad] >= 0x20 && (unsigned char)name[bad] < 0x7f
                         ? name[bad] : '?', bad + 1);
  return MEGA_OK;
}

/* --advertise is a host alone (the port is --listen's): a name, an IPv4
 * address or an IPv6 one in brackets. Anything else made an address no
 * peer or worker could dial ("10.0.0.1:7070:7070", ":7070"). */
static mega_status check_advertise(const char *host, mega_err *err) {
  const char *colon = strchr(host, ':');
  size_t n = strlen(host);
  if (!n) return mega_fail(err, MEGA_ERR_INVALID, "--advertise is empty; give the host peers and "
                           "workers reach this node at, or leave the flag out");
  if (strpbrk(host, "/ \t\n@"))
    return mega_fail(err, MEGA_ERR_INVALID, "--advertise %s: give a host alone (a name or an "
                     "address), not a URL", host);
  if (host[0] == '[') {
    if (n < 3 || host[n - 1] != ']' || strchr(host + 1, '[') || strchr(host, ']') != host + n - 1)
      return mega_fail(err, MEGA_ERR_INVALID, "--advertise %s: an IPv6 address in brackets, "
                       "such as [fd00::1], and no port (the port is --listen's)", host);
    return MEGA_OK;
  }
  if (colon && strchr(colon + 1, ':'))
    return mega_fail(err, MEGA_ERR_INVALID, "--advertise %s: write an IPv6 address in "
                     "brackets, [%s]", host, host);
  if (colon)
    return mega_fail(err, MEGA_ERR_INVALID, "--advertise %s: give the host alone, %.*s; the "
                     "port is --listen's", host, (int)(colon - host), host);
  return MEGA_OK;
}

/* host:port others use to reach this node, and the host workers bind. */
static mega_status make_address(megad *d, mega_err *err) {
  const char *l = d->o.listen;
  if (!strncmp(l, "unix:", 5)) {
    d->address = strdup(l);
    d->worker_host = strdup(d->o.advertise ? d->o.advertise : "127.0.0.1");
  } else {
    const char *colon = strrchr(l, ':');
    char host[256];
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - l) : (int)strlen(l), l);
    if (d->o.advertise) {
      snprintf(host, sizeof host, "%s", d->o.advertise);
    } else if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "[::]")) {
      if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "127.0.0.1");
    }
    if (asprintf(&d->address, "%s:%d", host, d->port) < 0) d->address = NULL;
    /* Workers bind Gloo to a plain host; strip IPv6 brackets. */
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = '\0';
    }
    d->worker_host = strdup(host);
  }
  if (!d->address || !d->worker_host) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  return MEGA_OK;
}

/* ---- security ---- */

/* A refused call (no or a wrong token), logged with its peer; a flood of
 * them yields one line a second with a count. */
static void on_refused(void *arg, const char *peer, const char *method, const char *why) {
  megad *d = arg;
  d->refused++;
  uint64_t now = uv_now(d->base.loop);
  if (d->refused_logged_ms && now - d->refused_logged_ms < 1000) return;
  if (d->refused == 1)
    megad_warn(&d->base, "refused a call to %s from %s: %s", method, peer, why);
  else
    megad_warn(&d->base, "refused %llu calls without the token they need; the last, to %s from %s: %s",
               (unsigned long long)d->refused, method, peer, why);
  d->refused = 0;
  d->refused_logged_ms = now;
}

/* The token and TLS files, and the rule that only a local listener (gRPC or
 * HTTP) may run without a token. */
/* *secs_left: seconds until --tls-cert expires (untouched without it). */
static mega_status load_security(megad *d, const megad_opts *o, long *secs_left, mega_err *err) {
  bool local = mega_rpc_addr_is_local(o->listen);
  if (!local && !o->token_file)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--listen %s reaches beyond this machine: give --token-file FILE (the "
                     "cluster token, mode 600) or listen on 127.0.0.1 or a unix: socket",
                     o->listen);
  /* the web view shows every job's flags (its paths), events and traces */
  if (o->metrics_listen && !o->token_file && !mega_rpc_addr_is_local(o->metrics_listen))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--metrics-listen %s reaches beyond this machine, and without --token-file "
                     "its web view and /metrics would be open to anyone there: give --token-file "
                     "FILE (the cluster token, mode 600) or listen on 127.0.0.1",
                     o->metrics_listen);
  if (!o->tls_cert != !o->tls_key)
    return mega_fail(err, MEGA_ERR_INVALID, "--tls-cert and --tls-key go together");
  if (o->tls_cert && !o->tls_ca)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--tls-cert needs --tls-ca too: megad calls its peers over TLS and checks "
                     "their certificates against it");
  if (o->peer_token_file && !o->token_file)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--peer-token-file needs --token-file too: the peer token is the nodes' "
                     "own, the cluster token the clients'");
  if (o->tls_client_auth && !o->tls_cert)
    return mega_fail(err, MEGA_ERR_INVALID, "--tls-client-auth needs --tls-cert, --tls-key and "
                     "--tls-ca");
  mega_status s = MEGA_OK;
  if (o->token_file) s = mega_rpc_read_token("--token-file", o->token_file, true, &d->token, err);
  if (s == MEGA_OK && o->peer_token_file)
    s = mega_rpc_read_token("--peer-token-file", o->peer_token_file, true, &d->peer_token, err);
  if (s == MEGA_OK && d->peer_token && !strcmp(d->peer_token, d->token))
    s = mega_fail(err, MEGA_ERR_INVALID,
                  "--peer-token-file %s holds the same token as --token-file %s: the peer token "
                  "must be one that clients do not hold; make another with `head -c 32 "
                  "/dev/urandom | base64 > %s`",
                  o->peer_token_file, o->token_file, o->peer_token_file);
  if (s == MEGA_OK && o->tls_cert)
    s = mega_rpc_read_pem("--tls-cert", o->tls_cert, false, &d->tls_cert, err);
  if (s == MEGA_OK && o->tls_key)
    s = mega_rpc_read_pem("--tls-key", o->tls_key, true, &d->tls_key, err);
  if (s == MEGA_OK && o->tls_ca) s = mega_rpc_read_pem("--tls-ca", o->tls_ca, false, &d->tls_ca, err);
  char cf[PATH_MAX + 16], kf[PATH_MAX + 16], caf[PATH_MAX + 16];
  if (o->tls_cert) {
    snprintf(cf, sizeof cf, "--tls-cert %s", o->tls_cert);
    snprintf(kf, sizeof kf, "--tls-key %s", o->tls_key);
    snprintf(caf, sizeof caf, "--tls-ca %s", o->tls_ca);
  }
  if (s == MEGA_OK && o->tls_cert)
    s = mega_rpc_check_tls(cf, d->tls_cert, kf, d->tls_key, caf, d->tls_ca, secs_left, err);
  if (s == MEGA_OK)
    s = megad_roots_init(&d->roots, o->data_roots, o->n_data_roots, o->save_roots,
                         o->n_save_roots, local, err);
  d->auth = (mega_rpc_auth){.token = d->token, .peer_token = d->peer_token, .tls_ca = d->tls_ca,
                            .tls_cert = d->tls_cert, .tls_key = d->tls_key,
                            .tls_client_auth = o->tls_client_auth};
  d->peer_auth = d->auth; /* Peer calls and forwarded Control ones: the peer token */
  d->peer_auth.token = d->peer_token ? d->peer_token : d->token;
  d->peer_auth.peer_token = NULL;
  return s;
}

/* The etcd client from the --etcd-* flags (their files read here). */
static mega_status open_etcd(megad *d, const megad_opts *o, mega_err *err) {
  const char *files[3] = {o->etcd_cacert, o->etcd_cert, o->etcd_key};
  static const char *const flags[3] = {"--etcd-cacert", "--etcd-cert", "--etcd-key"};
  mega_status s = MEGA_OK;
  for (int i = 0; i < 3 && s == MEGA_OK; i++)
    if (files[i]) s = mega_rpc_read_pem(flags[i], files[i], i == 2, &d->etcd_pem[i], err);
  char cf[PATH_MAX + 16], kf[PATH_MAX + 16];
  if (s == MEGA_OK && d->etcd_pem[1] && d->etcd_pem[2]) { /* etcd checks it with its own CA */
    snprintf(cf, sizeof cf, "--etcd-cert %s", o->etcd_cert);
    snprintf(kf, sizeof kf, "--etcd-key %s", o->etcd_key);
    s = mega_rpc_check_tls(cf, d->etcd_pem[1], kf, d->etcd_pem[2], NULL, NULL, NULL, err);
  }
  if (s == MEGA_OK && o->etcd_password_file)
    s = mega_rpc_read_password("--etcd-password-file", o->etcd_password_file,
                               &d->etcd_password, err);
  megad_etcd_opts eo = {.endpoints = o->etcd_endpoints, .prefix = o->etcd_prefix,
                        .cacert = d->etcd_pem[0], .cert = d->etcd_pem[1], .key = d->etcd_pem[2],
                        .user = o->etcd_user, .password = d->etcd_password};
  if (s == MEGA_OK && (s = megad_etcd_open(&d->base, &eo, &d->etcd, err)) != MEGA_OK &&
      !strstr(err->msg, "--etcd-"))
    mega_err_prefix(err, "--etcd-endpoints");
  return s;
}

static void free_security(megad *d) {
  for (int i = 0; i < 3; i++) {
    if (i == 2 && d->etcd_pem[i]) memset(d->etcd_pem[i], 0, strlen(d->etcd_pem[i]));
    free(d->etcd_pem[i]);
    d->etcd_pem[i] = NULL;
  }
  if (d->etcd_password) memset(d->etcd_password, 0, strlen(d->etcd_password));
  free(d->etcd_password);
  d->etcd_password = NULL;
  if (d->token) memset(d->token, 0, strlen(d->token));
  if (d->peer_token) memset(d->peer_token, 0, strlen(d->peer_token));
  if (d->tls_key) memset(d->tls_key, 0, strlen(d->tls_key));
  free(d->token);
  free(d->peer_token);
  free(d->tls_cert);
  free(d->tls_key);
  free(d->tls_ca);
  d->token = d->peer_token = d->tls_cert = d->tls_key = d->tls_ca = NULL;
  megad_roots_free(&d->roots);
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

mega_status megad_start(megad *d, uv_loop_t *loop, const megad_opts *o, mega_err *err) {
  memset(d, 0, sizeof *d);
  d->o = *o;
  char gpu_name[160];
  int gpus = mega_cuda_devices_describe(gpu_name, sizeof gpu_name); /* a slot each */
  if (!d->o.slots) d->o.slots = gpus ? gpus : d->o.cpu_slots;
  o = &d->o;
  if (!d->o.heartbeat_interval_ms) d->o.heartbeat_interval_ms = 250;
  if (!d->o.heartbeat_timeout_ms) d->o.heartbeat_timeout_ms = 1500;
  if (!d->o.rendezvous_timeout_ms) d->o.rendezvous_timeout_ms = 60000;
  if (!o->slots)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--slots: this node has no GPU the cuda module can use; give the number of "
                     "CPU worker slots (1..4096)");
  if (o->slots < 1 || o->slots > 4096)
    return mega_fail(err, MEGA_ERR_INVALID, "--slots %d: give the number of worker slots (1..4096)",
                     o->slots);
  /* a GPU per slot, when there are as many GPUs as slots or more */
  bool per_gpu = gpus > 0 && o->slots <= gpus;
  if (d->o.heartbeat_timeout_ms < 2 * d->o.heartbeat_interval_ms)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--heartbeat-timeout %u ms must be at least twice --heartbeat-interval %u ms",
                     d->o.heartbeat_timeout_ms, d->o.heartbeat_interval_ms);
  char host[256];
  if (o->node_name) snprintf(host, sizeof host, "%s", o->node_name);
  else if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "localhost");
  mega_status s = check_node_name(o->node_name ? o->node_name : host, o->node_name, err);
  if (s == MEGA_OK && o->advertise) s = check_advertise(o->advertise, err);
  if (s != MEGA_OK) return s;
  d->incarnation = megad_new_incarnation();
  /* the web view's curves get epochs this megad's previous life did not
   * hand out (at odds of 2^21 to 1): a page's cursor of then is reset */
  uint32_t seed;
  if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
    seed = (uint32_t)(d->incarnation ^ d->incarnation >> 29);
  mega_stepring_seed(seed);
  if (o->worker_path) d->worker_path = realpath(o->worker_path, NULL);
  else d->worker_path = find_worker();
  if (!d->worker_path || access(d->worker_path, X_OK))
    return mega_fail(err, MEGA_ERR_INVALID,
                     o->worker_path ? "--worker %s: not an executable file"
                                    : "cannot find megaw next to megad%s; give --worker PATH",
                     o->worker_path ? o->worker_path : "");
  long cert_secs = LONG_MAX;
  s = load_security(d, o, &cert_secs, err);
  if (s != MEGA_OK) {
    free_security(d);
    return s;
  }
  s = megad_base_init(&d->base, loop, host, o->state_dir, o->quiet, err);
  if (s == MEGA_OK && cert_secs < 14 * 86400) { /* every peer refuses it once it expires */
    bool days = cert_secs >= 2 * 86400;
    megad_warn(&d->base, "--tls-cert %s expires in %ld %s: renew it, then restart megad",
               o->tls_cert, days ? cert_secs / 86400 : cert_secs / 3600, days ? "days" : "hours");
  }
  if (s == MEGA_OK && d->token && !d->peer_token) /* the probe's finding: say it once */
    megad_warn(&d->base, "--token-file serves clients and nodes alike: whoever holds it can "
               "act as a node (join, take job launches, abort jobs, fetch replicas); give "
               "every megad --peer-token-file FILE, a second token clients do not get");
  d->base.auth = &d->peer_auth;
  if (s == MEGA_OK) d->started = true;
  if (s == MEGA_OK && o->etcd_endpoints) {
    if (o->peers && o->peers[0])
      s = mega_fail(err, MEGA_ERR_INVALID,
                    "--peers and --etcd-endpoints exclude each other: with etcd, every megad "
                    "learns its peers from etcd; drop --peers");
    else if ((s = open_etcd(d, o, err)) == MEGA_OK)
      s = megad_jobs_open_etcd(&d->jobs, &d->base, d->etcd, err);
  } else if (s == MEGA_OK) {
    s = megad_jobs_open(&d->jobs, &d->base, err);
  }
  if (s == MEGA_OK) s = megad_kvserve_init(&d->kvs, &d->base, err);
  mega_rpc_server_opts so = {.max_request_bytes = MEGAD_MAX_REQUEST_BYTES, .auth = &d->auth,
                             .peer_prefix = MEGA_PEER_PATH_PREFIX,
                             .on_refused = on_refused, .refused_arg = d};
  if (s == MEGA_OK) s = mega_rpc_server_new(d->base.cq, &so, &d->srv, err);
  if (s == MEGA_OK) s = mega_rpc_server_listen(d->srv, o->listen, &d->port, err);
  if (s == MEGA_OK) s = make_address(d, err);
  if (s != MEGA_OK) return s;

  megad_launcher_opts lo = {.worker_path = d->worker_path, .worker_host = d->worker_host,
                            .slots = (uint32_t)o->slots,
                            .rendezvous_timeout_ms = d->o.rendezvous_timeout_ms,
                            .orphan_hold_ms = d->o.held_state_timeout_ms,
                            .gpus = per_gpu, .roots = &d->roots};
  megad_launcher_cbs lc = {.step = on_worker_step, .event = on_worker_event,
                           .resent = on_resent, .ended = on_launch_ended, .arg = d};
  megad_members_opts mo = {.address = d->address, .slots = (uint32_t)o->slots,
                           .backend = per_gpu ? "cuda" : "cpu",
                           .device_name = per_gpu ? gpu_name : NULL,
                           .peers = o->peers,
                           .heartbeat_interval_ms = d->o.heartbeat_interval_ms,
                           .heartbeat_timeout_ms = d->o.heartbeat_timeout_ms,
                           .etcd_lease_s = (d->o.etcd_lease_ms + 999) / 1000};
  megad_members_cbs mc = {.node_up = on_node_up, .node_lost = on_node_lost,
                          .self_fenced = on_self_fenced,
                          .self_load = self_load, .arg = d};
  megad_coord_opts co = {.address = d->address,
                         .rendezvous_timeout_ms = d->o.rendezvous_timeout_ms,
                         .heartbeat_ms = d->o.heartbeat_interval_ms,
                         .heartbeat_timeout_ms = d->o.heartbeat_timeout_ms,
                         .roots = &d->roots,
                         .one_job = d->o.one_job,
                         .max_pending = d->o.max_pending ? d->o.max_pending : 1000,
                         .retain_jobs = d->o.retain_jobs ? d->o.retain_jobs : 1000,
                         .retain_ms = d->o.retain_ms ? d->o.retain_ms : 7 * 86400000u};
  s = megad_launcher_init(&d->launcher, &d->base, &d->kvs, &lo, &lc, err);
  if (s == MEGA_OK) s = megad_members_init(&d->members, &d->base, &mo, d->incarnation, d->etcd, &mc,
                                          err);
  if (s == MEGA_OK)
    s = megad_coord_init(&d->coord, &d->base, &d->jobs, &d->members, &d->launcher, &d->kvs, &co,
                         err);
  if (s != MEGA_OK) return s;
  megad_base_on_stall(&d->base, on_stall, d);
  megad_jobs_set_cbs(&d->jobs, &(megad_jobs_cbs){.fenced = on_job_fenced, .orphan = on_job_orphan,
                                                  .claimed = on_job_claimed,
                                                  .coordinator = on_job_coordinator,
                                                  .refused = on_job_refused, .arg = d});
  d->svc = (megad_services){.b = &d->base, .jobs = &d->jobs, .members = &d->members,
                            .L = &d->launcher, .coord = &d->coord, .srv = d->srv,
                            .token = d->token};
  megad_control_register(&d->svc, d->srv);
  megad_peer_register(&d->svc, d->srv);
  megad_kvserve_register(&d->kvs, d->srv);
  megad_members_register(&d->members, d->srv);
  if ((s = mega_rpc_server_start(d->srv, err)) != MEGA_OK) return s;
  if (o->metrics_listen &&
      (s = megad_metrics_start(&d->svc, o->metrics_listen, d->token, err)) != MEGA_OK)
    return s;

  megad_members_start(&d->members);
  megad_coord_start(&d->coord);
  uv_timer_init(loop, &d->watchdog);
  uv_timer_init(loop, &d->drain);
  d->drain.data = d;
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
    d->watchdog_on = true;
    uv_timer_start(&d->watchdog, on_watchdog, usec / 2000, usec / 2000);
  }
  sd_notifyf(0, "READY=1\nSTATUS=node %s listening on %s, %d slot%s", host, d->address, o->slots,
             o->slots == 1 ? "" : "s");
  megad_log(&d->base, "node %s listening on %s with %d slot%s; worker %s; state in %s", host,
            d->address, o->slots, o->slots == 1 ? "" : "s", d->worker_path, d->base.state_dir);
  if (d->roots.note[0]) megad_warn(&d->base, "%s", d->roots.note);
  return MEGA_OK;
}

/* ---- stop ----
 * Phases, each waiting for the last on a 50 ms timer:
 *   0 leave first: the coordinators of jobs with ranks here are told this
 *     node leaves, and answer, before its ranks are stopped, so their ends
 *     are a lost node (as a kill -9's are), never rank failures of a node
 *     still alive and placeable. Without etcd a node that coordinates no
 *     running attempt leaves every peer now; one that does tells only
 *     those coordinators (its own attempts' ranks elsewhere must still
 *     reach it), and the rest in phase 2
 *   1 workers: running attempts end (their jobs wait as RESTARTING), every
 *     worker is aborted (Abort frame, SIGKILL after the grace) and reaped;
 *     AbortJob reaches the other nodes of jobs this node coordinates
 *   2 peers: Leave, and every call in flight answered or cancelled
 *   3 the server: watchers end, the server shuts down, then the queue */

typedef struct stopper {
  megad *d;
  uv_timer_t t;
  int phase;
  uint64_t phase_start;
  void (*done)(void *);
  void *arg;
  char reason[256];
} stopper;

static void closed_free(uv_handle_t *h) { free(h->data); }

static void final_close(void *arg) {
  stopper *st = arg;
  megad *d = st->d;
  uv_close((uv_handle_t *)&d->watchdog, NULL);
  uv_close((uv_handle_t *)&d->drain, NULL);
  megad_coord_free(&d->coord);
  megad_launcher_free(&d->launcher);
  megad_members_free(&d->members);
  megad_kvserve_free(&d->kvs);
  megad_jobs_close(&d->jobs);
  megad_base_free(&d->base);
  free_security(d);
  free(d->address);
  free(d->worker_host);
  free(d->worker_path);
  d->address = d->worker_host = d->worker_path = NULL;
  void (*done)(void *) = st->done;
  void *done_arg = st->arg;
  st->t.data = st;
  uv_close((uv_handle_t *)&st->t, closed_free);
  if (done) done(done_arg);
}

static void server_down(void *arg) {
  stopper *st = arg;
  st->d->srv = NULL;
  megad_jobs_etcd_close(&st->d->jobs); /* its watches go with the client */
  megad_etcd_free(st->d->etcd); /* before the queue closes: its calls end on it */
  st->d->etcd = NULL;
  megad_base_close_cq(&st->d->base, final_close, st);
}

static void stop_step(uv_timer_t *t) {
  stopper *st = t->data;
  megad *d = st->d;
  uint64_t waited = uv_now(d->base.loop) - st->phase_start;
  switch (st->phase) {
  case 0:
    if (megad_members_leaving(&d->members) && waited < 1500) return;
    megad_coord_stop_all(&d->coord, st->reason);
    megad_launch_abort_all(&d->launcher, st->reason);
    st->phase = 1;
    st->phase_start = uv_now(d->base.loop);
    return;
  case 1:
    if ((!megad_launch_idle(&d->launcher) || megad_coord_stopping(&d->coord)) &&
        waited < MEGAD_ABORT_GRACE_MS + 4000)
      return;
    if (!megad_launch_idle(&d->launcher)) megad_warn(&d->base, "stopping with workers not yet reaped");
    megad_members_leave(&d->members);
    st->phase = 2;
    st->phase_start = uv_now(d->base.loop);
    return;
  case 2:
    if ((!megad_calls_idle(&d->base) || megad_members_leaving(&d->members)) && waited < 1500)
      return;
    megad_calls_cancel(&d->base);
    if (!megad_calls_idle(&d->base)) return;
    st->phase = 3;
    uv_timer_stop(&st->t);
    char why[128];
    snprintf(why, sizeof why, "megad on %s is shutting down", d->base.node_id);
    megad_watch_drop_all(&d->jobs.watchers, why);
    megad_metrics_stop(&d->svc);
    mega_rpc_server_shutdown(d->srv, 500, server_down, st);
    return;
  default:
    return;
  }
}

void megad_stop(megad *d, const char *reason, void (*done)(void *arg), void *arg) {
  if (d->base.stopping) return;
  d->base.stopping = true;
  sd_notifyf(0, "STOPPING=1\nSTATUS=stopping: %s", reason);
  megad_log(&d->base, "stopping: %s", reason);
  if (d->watchdog_on) uv_timer_stop(&d->watchdog);
  stopper *st = calloc(1, sizeof *st);
  if (!st) {
    megad_warn(&d->base, "out of memory while stopping");
    return;
  }
  st->d = d;
  st->done = done;
  st->arg = arg;
  snprintf(st->reason, sizeof st->reason, "%s", reason);
  st->phase = 0;
  st->phase_start = uv_now(d->base.loop);
  const char *coords[64];
  size_t ncoords = megad_launch_coordinators(&d->launcher, coords, 64);
  if (!d->etcd && !megad_coord_stopping(&d->coord)) megad_members_leave(&d->members);
  else megad_members_leave_to(&d->members, coords, ncoords);
  uv_timer_init(d->base.loop, &st->t);
  st->t.data = st;
  uv_timer_start(&st->t, stop_step, 0, 50);
}

/* ---- stop, saving first ---- */

static void on_drain(uv_timer_t *t) {
  megad *d = t->data;
  bool busy = megad_launch_graceful_live(&d->launcher) || megad_coord_saving(&d->coord);
  if (busy && uv_now(d->base.loop) - d->drain_since < MEGAD_DRAIN_MAX_MS) return;
  if (busy)
    megad_warn(&d->base, "jobs asked to save and stop had not after %u s; stopping anyway",
               MEGAD_DRAIN_MAX_MS / 1000);
  uv_timer_stop(t);
  megad_stop(d, d->drain_reason, d->drain_done, d->drain_arg);
}

void megad_stop_saving(megad *d, const char *reason, void (*done)(void *arg), void *arg) {
  if (d->base.stopping) return;
  if (d->draining) { /* asked again: no more waiting */
    uv_timer_stop(&d->drain);
    megad_stop(d, reason, done, arg);
    return;
  }
  size_t n = megad_coord_stop_saving(&d->coord, reason);
  n += megad_launch_stop_graceful(&d->launcher, NULL, reason);
  if (!n) {
    megad_stop(d, reason, done, arg);
    return;
  }
  d->draining = true;
  d->drain_since = uv_now(d->base.loop);
  snprintf(d->drain_reason, sizeof d->drain_reason, "%s", reason);
  d->drain_done = done;
  d->drain_arg = arg;
  sd_notifyf(0, "STATUS=saving before stopping: %s", reason);
  megad_log(&d->base, "%s: jobs with --exit-signal-handler save a checkpoint and stop first "
            "(another signal stops at once)", reason);
  uv_timer_start(&d->drain, on_drain, 100, 100);
}
