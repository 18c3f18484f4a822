/* megad: the daemon.
 *
 *   megad serve --listen ADDR --state-dir DIR --slots N [--node-name NAME]
 *               [--peers ADDR,... | --peers slurm | --etcd-endpoints URL,...]
 *               [--advertise HOST]
 *               [--worker PATH]
 *               [--metrics-listen ADDR] [--heartbeat-interval D]
 *               [--heartbeat-timeout D] [--rendezvous-timeout D]
 *               [--held-state-timeout D]
 *   megad run --slots N [--state-dir DIR] [--json] [--name NAME]
 *             [--nproc-per-node K] [--max-restarts N] [--worker PATH] [job flags]
 *
 * `run` is the same daemon on a private unix socket with one job: it prints
 * the merged steps and exits with the job's status (0 succeeded, 1 failed,
 * 130/143/129 after SIGINT/SIGTERM/SIGHUP, 2 for a bad flag or job, 92 when
 * the job stopped early as asked after its checkpoint: core/exitcode.h).
 *
 * SIGTERM asks jobs with --exit-signal-handler to save and stop first
 * (megad_stop_saving); a second signal, or SIGINT, stops at once. SIGUSR1
 * and SIGUSR2 (a scheduler's warning, a stray kill) and SIGHUP (a closed
 * terminal, a reload out of habit) are logged and change nothing, where
 * their default action would end megad and its jobs without a word. So is
 * SIGXFSZ (a file reached ulimit -f or LimitFSIZE=): the write fails with
 * EFBIG instead, and its own error names the file; it is logged once a
 * minute at most (megad's own log may be the file at the limit). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/duration.h"
#include "core/exitcode.h"
#include "core/jobspec.h"
#include "core/logline.h"
#include "daemon/daemon.h"
#include "daemon/slurm.h"
#include "proto/pb_json.h"
#include "proto/step_bubble.h"
#include "core/version.h"

#define EXIT_USAGE 2

typedef struct app {
  uv_loop_t loop;
  megad d;
  uv_signal_t sigint, sigterm, sigusr1, sigusr2, sighup, sigxfsz;
  uint64_t xfsz_said_ms;  /* when SIGXFSZ was last logged (loop time; 0: never) */
  unsigned xfsz_unsaid;   /* SIGXFSZ got since, not logged */
  bool started, json, run; /* run: `megad run`, else serve */
  int exit_code;
  /* run */
  mega_job *job;
  mega_jobspec spec; /* the job's flags, for the readable lines */
  mega_logline log;
  char *tmp_dir;
  int signal;
  char last_said[1024]; /* the last event line printed, so a cause prints once */
  int out_errno;        /* run: why stdout took no more of the job's lines (0: it takes all) */
} app;

static const char usage_head[] =
    "usage: megad serve --listen ADDR --state-dir DIR [--slots N] [options]\n"
    "       megad run --slots N [--json] [options] [job flags]\n\n";
static const char usage_serve[] =
    "serve: run the daemon of one node. Jobs come from megactl (or another megad).\n"
    "  --listen ADDR          host:port (port 0 picks one) or unix:/path\n"
    "  --state-dir DIR        journal, job files, worker logs\n"
    "  --slots N              worker processes this node runs at once (default: one\n"
    "                         per GPU the cuda module finds, as is an empty N;\n"
    "                         required without GPUs)\n"
    "  --node-name NAME       this node's name (default: the hostname): letters, digits,\n"
    "                         '.', '-' and '_', at most 63 bytes\n"
    "  --peers ADDR,...       megads to join (host:port of each)\n"
    "  --peers slurm          under srun: the other nodes of $SLURM_JOB_NODELIST, each\n"
    "                         at this megad's --listen port; the node's name from\n"
    "                         $SLURMD_NODENAME and, without --slots, its slots from\n"
    "                         $SLURM_GPUS_ON_NODE, the GPUs found, or\n"
    "                         $SLURM_CPUS_ON_NODE (deploy/slurm/)\n"
    "  --etcd-endpoints URL,...  keep the cluster's state in etcd (http://host:port of\n"
    "                         each member) instead of --peers: membership, every job,\n"
    "                         and a job's takeover when its coordinator dies (README\n"
    "                         \"No single point of failure\")\n"
    "  --etcd-prefix P        where this cluster keeps its keys in etcd (default mega/;\n"
    "                         ends with /): clusters with other prefixes share the etcd\n"
    "                         without seeing each other's nodes or jobs\n"
    "  --etcd-cacert FILE     the CA of etcd's certificates: TLS (https:// endpoints)\n"
    "  --etcd-cert FILE --etcd-key FILE  this node's client certificate for etcd\n"
    "                         (etcd --client-cert-auth; with etcd's auth on, its CN is\n"
    "                         the etcd user)\n"
    "  --etcd-user NAME --etcd-password-file FILE  etcd's user and password (the file\n"
    "                         mode 600)\n"
    "  --etcd-lease D         a node's etcd lease: lost this long after its last\n"
    "                         keepalive (default 2s, 2s..60s, whole seconds); longer\n"
    "                         rides out an overloaded machine, takes over later\n"
    "  --advertise HOST       the host peers and workers use to reach this node (a name,\n"
    "                         an IPv4 address or [IPv6]; the port is --listen's)\n"
    "  --metrics-listen ADDR  serve GET /metrics (Prometheus) on host:port (port 0:\n"
    "                         a free one, which the log names)\n"
    "  --worker PATH          the megaw program (default: next to megad)\n"
    "  --heartbeat-interval D how often nodes heartbeat each other (default 250ms)\n"
    "  --heartbeat-timeout D  a node silent this long is lost (default 1.5s)\n"
    "  --rendezvous-timeout D how long a rank waits for its peers to meet (default 60s)\n"
    "  --held-state-timeout D how long ranks that kept their state after their job's\n"
    "                         coordinator was lost wait for it (default 60s, at most 2m:\n"
    "                         a held rank lets go by itself after that)\n"
    "                         (D: a duration with its unit: 250ms, 1.5s, 2m)\n"
    "  --max-pending N        jobs this node coordinates that may wait at once\n"
    "                         (default 1000; more are refused: RESOURCE_EXHAUSTED)\n"
    "  --retain-jobs N        ended jobs kept (default 1000; older ones are forgotten)\n"
    "  --retain-age D         ended jobs are forgotten after D (default 168h; at most 720h)\n"
    "security (README \"Security\"):\n"
    "  --token-file FILE      the cluster token (mode 600) every call must carry; needed\n"
    "                         to listen on anything but 127.0.0.1 or a unix: socket\n"
    "  --peer-token-file FILE the nodes' own token (mode 600; the same on every megad,\n"
    "                         and not the cluster token): Peer calls (megad to megad)\n"
    "                         take only it, so a client's token serves Control alone\n"
    "  --tls-cert FILE --tls-key FILE  serve TLS with this certificate and key\n"
    "  --tls-ca FILE          the CA that signs the cluster's certificates (peers are\n"
    "                         called over TLS with it)\n"
    "  --tls-client-auth      require client certificates signed by --tls-ca (mTLS)\n"
    "  --data-root DIR        jobs' --data-path and --load must lie under one\n"
    "  --save-root DIR        jobs' --save (and --load) must lie under one\n"
    "                         (both repeatable; without any, a megad that listens\n"
    "                         beyond this machine refuses jobs that name paths)\n\n";
static const char usage_run[] =
    "run: train one job of N ranks on this machine and exit with its status.\n"
    "  --slots N              ranks (every slot runs one)\n"
    "  --json                 one JSON object per iteration on stdout\n"
    "  --name NAME            the job's name\n"
    "  --nproc-per-node K     ranks (default: N)\n"
    "  --max-restarts N       restarts after a rank fails, from the newest checkpoint\n"
    "                         (default 0: the job fails)\n"
    "  --state-dir DIR        keep the journal and job files there (default: a\n"
    "                         temporary directory, removed when the job succeeds)\n"
    "  --worker PATH          the megaw program\n"
    "  job flags: listed below with megad run --help (the same as megaw --help)\n";

/* which: NULL for both commands, else "serve" or "run" */
static void usage(FILE *f, const char *which) {
  fputs(usage_head, f);
  if (!which || !strcmp(which, "serve")) fputs(usage_serve, f);
  if (!which || !strcmp(which, "run")) fputs(usage_run, f);
  if (which && !strcmp(which, "run")) {
    char *flags = mega_jobspec_help_text();
    if (flags) fputs(flags, f);
    free(flags);
  }
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "megad: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see megad --help)\n");
  return EXIT_USAGE;
}

static bool parse_count(const char *s, long max, int *out) {
  char *end;
  errno = 0;
  long n = strtol(s, &end, 10);
  if (errno || *s == '\0' || *end || n < 1 || n > max) return false;
  *out = (int)n;
  return true;
}

static bool parse_slots(const char *s, int *out) { return parse_count(s, 4096, out); }

/* "--flag value" or "--flag=value" for the daemon's own flags. */
static int own_flag(int argc, char **argv, int *i, const char *name, const char **val) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n)) return 0;
  if (argv[*i][n] == '=') {
    *val = argv[*i] + n + 1;
    (*i)++;
    return 1;
  }
  if (argv[*i][n] != '\0') return 0;
  if (*i + 1 >= argc) return -1;
  *val = argv[*i + 1];
  *i += 2;
  return 1;
}

/* ---- shared ---- */

static void stopped(void *arg) {
  app *a = arg;
  uv_close((uv_handle_t *)&a->sigint, NULL);
  uv_close((uv_handle_t *)&a->sigterm, NULL);
  uv_close((uv_handle_t *)&a->sigusr1, NULL);
  uv_close((uv_handle_t *)&a->sigusr2, NULL);
  uv_close((uv_handle_t *)&a->sighup, NULL);
  uv_close((uv_handle_t *)&a->sigxfsz, NULL);
}

/* Caught rather than ignored: workers start with the default action, as
 * an ignored signal would be inherited across exec. */
static void on_signal(uv_signal_t *h, int sig);

static void on_user_signal(uv_signal_t *h, int sig) {
  app *a = h->data;
  if (sig == SIGHUP && a->run) { /* run's terminal closed: stop the job in order */
    on_signal(h, sig);
    return;
  }
  if (sig == SIGXFSZ) {
    /* once a minute at most: with megad's own log at the limit, each
     * warning's failed write raised SIGXFSZ again, and megad spun */
    uint64_t now = uv_now(&a->loop) + 1;
    if (a->xfsz_said_ms && now - a->xfsz_said_ms < 60000) {
      a->xfsz_unsaid++;
      return;
    }
    char more[80] = "";
    if (a->xfsz_unsaid)
      snprintf(more, sizeof more, " (%u more time%s since this was last logged)", a->xfsz_unsaid,
               a->xfsz_unsaid == 1 ? "" : "s");
    a->xfsz_said_ms = now;
    a->xfsz_unsaid = 0;
    megad_warn(&a->d.base, "got SIGXFSZ%s: a file reached this process's size limit (ulimit -f, "
               "systemd's LimitFSIZE=); the write failed, and its own error says which (unless "
               "it was this log's)", more);
    return;
  }
  if (sig == SIGHUP) {
    megad_warn(&a->d.base, "got SIGHUP; megad does nothing on it: it reads its flags, "
               "--token-file, --peer-token-file and the TLS files only at start, so restart "
               "it to take new ones (SIGTERM stops it, saving the jobs that have --exit-signal-handler)");
    return;
  }
  megad_warn(&a->d.base, "got %s; megad does nothing on it (SIGTERM stops it, saving the jobs "
             "that have --exit-signal-handler; SIGINT stops it at once)",
             sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
}

/* SIGTERM: what megad was told, for the record of a job that stops on it. */
static void sigterm_reason(const app *a, char *buf, size_t len) {
  const char *slurm_job = getenv("SLURM_JOB_ID");
  if (slurm_job)
    snprintf(buf, len, "megad on %s got SIGTERM (Slurm job %s: its time limit is near, or "
             "scancel --signal TERM)", a->d.base.node_id, slurm_job);
  else
    snprintf(buf, len, "megad on %s got SIGTERM", a->d.base.node_id);
}

static void on_signal(uv_signal_t *h, int sig) {
  app *a = h->data;
  char why[320];
  if (a->job && !mega_job_state_final(a->job->state)) { /* run: cancel, then stop */
    /* --exit-signal-handler: the first SIGTERM saves and stops the job */
    if (sig == SIGTERM && a->job->spec.exit_signal_handler && !a->signal) {
      a->signal = sig;
      sigterm_reason(a, why, sizeof why);
      megad_coord_stop_saving(&a->d.coord, why);
      return;
    }
    a->signal = sig;
    megad_coord_cancel(&a->d.coord, a->job,
                       sig == SIGINT   ? "interrupted (SIGINT)"
                       : sig == SIGHUP ? "hung up (SIGHUP)"
                                       : "terminated (SIGTERM)",
                       NULL, NULL);
    return;
  }
  if (sig == SIGTERM) {
    sigterm_reason(a, why, sizeof why);
    megad_stop_saving(&a->d, why, stopped, a);
    return;
  }
  megad_stop(&a->d, sig == SIGHUP ? "signal SIGHUP" : "signal SIGINT", stopped, a);
}

static int start(app *a, const megad_opts *o) {
  signal(SIGPIPE, SIG_IGN);
  /* Private by default: the state dir, journal and logs, and everything the
   * workers (who inherit it) write, checkpoints included, are 0600 in 0700
   * directories. Share a checkpoint on purpose, with chmod. */
  umask(077);
  uv_loop_init(&a->loop);
  mega_err err = {0};
  if (megad_start(&a->d, &a->loop, o, &err) != MEGA_OK) {
    fprintf(stderr, "megad: %s\n", err.msg);
    return err.status == MEGA_ERR_INVALID ? EXIT_USAGE : 1;
  }
  a->started = true;
  uv_signal_init(&a->loop, &a->sigint);
  uv_signal_init(&a->loop, &a->sigterm);
  uv_signal_init(&a->loop, &a->sigusr1);
  uv_signal_init(&a->loop, &a->sigusr2);
  uv_signal_init(&a->loop, &a->sighup);
  uv_signal_init(&a->loop, &a->sigxfsz);
  a->sigint.data = a->sigterm.data = a->sigusr1.data = a->sigusr2.data = a->sighup.data =
      a->sigxfsz.data = a;
  uv_signal_start(&a->sigint, on_signal, SIGINT);
  uv_signal_start(&a->sigterm, on_signal, SIGTERM);
  uv_signal_start(&a->sigusr1, on_user_signal, SIGUSR1);
  uv_signal_start(&a->sigusr2, on_user_signal, SIGUSR2);
  uv_signal_start(&a->sighup, on_user_signal, SIGHUP);
  uv_signal_start(&a->sigxfsz, on_user_signal, SIGXFSZ);
  return 0;
}

static void finish_loop(app *a) {
  uv_run(&a->loop, UV_RUN_DEFAULT);
  uv_loop_close(&a->loop);
  mega_rpc_wait_released(5000);
}

static int duration_flag(const char *flag, const char *v, unsigned min, unsigned max,
                         unsigned *out) {
  mega_err err = {0};
  if (!v || mega_duration_parse(flag, v, min, max, out, &err) == MEGA_OK) return 0;
  return usage_error("%s", err.msg);
}

/* ---- serve ---- */

/* --peers slurm: name, peers and slots from the allocation (daemon/slurm.h). */
static int slurm_peers(megad_opts *o, bool slots_given, megad_slurm *s) {
  if (o->etcd_endpoints)
    return usage_error("--peers slurm and --etcd-endpoints exclude each other: with etcd the "
                       "nodes find each other there; drop --peers%s", "");
  mega_err err = {0};
  if (megad_slurm_from_env(o->listen, o->node_name, s, &err) != MEGA_OK)
    return usage_error("%s", err.msg);
  if (!o->node_name) o->node_name = s->node_name;
  o->peers = s->peers[0] ? s->peers : NULL;
  if (!slots_given) {
    o->slots = s->gpu_slots; /* 0: megad_start counts the GPUs, else cpu_slots */
    o->cpu_slots = s->cpu_slots;
  }
  /* peers reach this node by the name Slurm gives it, as it reaches them */
  const char *colon = strrchr(o->listen, ':');
  size_t hl = colon ? (size_t)(colon - o->listen) : 0;
  bool wildcard = !hl || !strncmp(o->listen, "0.0.0.0", hl) || !strncmp(o->listen, "[::]", hl);
  if (!o->advertise && wildcard) o->advertise = o->node_name;
  return 0;
}

#define MAX_ROOTS 64

static int serve(int argc, char **argv) {
  megad_opts o = {0};
  const char *lease = NULL;
  const char *slots = NULL, *hbi = NULL, *hbt = NULL, *rdv = NULL, *held = NULL,
             *pending = NULL, *root,
             *retain = NULL, *retain_age = NULL;
  static const char *data_roots[MAX_ROOTS], *save_roots[MAX_ROOTS];
  o.data_roots = data_roots;
  o.save_roots = save_roots;
  for (int i = 2; i < argc;) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout, "serve");
      return 0;
    }
    if (!strcmp(argv[i], "--tls-client-auth")) {
      o.tls_client_auth = true;
      i++;
      continue;
    }
    bool data = !strncmp(argv[i], "--data-root", 11);
    if ((r = own_flag(argc, argv, &i, "--data-root", &root)) ||
        (r = own_flag(argc, argv, &i, "--save-root", &root))) {
      if (r < 0) return usage_error("%s needs a directory", argv[i]);
      size_t *n = data ? &o.n_data_roots : &o.n_save_roots;
      if (*n == MAX_ROOTS) return usage_error("more than 64 %s flags", data ? "--data-root" : "--save-root");
      (data ? data_roots : save_roots)[(*n)++] = root;
      continue;
    }
    if ((r = own_flag(argc, argv, &i, "--listen", &o.listen)) ||
        (r = own_flag(argc, argv, &i, "--token-file", &o.token_file)) ||
        (r = own_flag(argc, argv, &i, "--peer-token-file", &o.peer_token_file)) ||
        (r = own_flag(argc, argv, &i, "--tls-cert", &o.tls_cert)) ||
        (r = own_flag(argc, argv, &i, "--tls-key", &o.tls_key)) ||
        (r = own_flag(argc, argv, &i, "--tls-ca", &o.tls_ca)) ||
        (r = own_flag(argc, argv, &i, "--max-pending", &pending)) ||
        (r = own_flag(argc, argv, &i, "--retain-jobs", &retain)) ||
        (r = own_flag(argc, argv, &i, "--retain-age", &retain_age)) ||
        (r = own_flag(argc, argv, &i, "--state-dir", &o.state_dir)) ||
        (r = own_flag(argc, argv, &i, "--slots", &slots)) ||
        (r = own_flag(argc, argv, &i, "--node-name", &o.node_name)) ||
        (r = own_flag(argc, argv, &i, "--peers", &o.peers)) ||
        (r = own_flag(argc, argv, &i, "--etcd-endpoints", &o.etcd_endpoints)) ||
        (r = own_flag(argc, argv, &i, "--etcd-lease", &lease)) ||
        (r = own_flag(argc, argv, &i, "--etcd-prefix", &o.etcd_prefix)) ||
        (r = own_flag(argc, argv, &i, "--etcd-cacert", &o.etcd_cacert)) ||
        (r = own_flag(argc, argv, &i, "--etcd-cert", &o.etcd_cert)) ||
        (r = own_flag(argc, argv, &i, "--etcd-key", &o.etcd_key)) ||
        (r = own_flag(argc, argv, &i, "--etcd-user", &o.etcd_user)) ||
        (r = own_flag(argc, argv, &i, "--etcd-password-file", &o.etcd_password_file)) ||
        (r = own_flag(argc, argv, &i, "--advertise", &o.advertise)) ||
        (r = own_flag(argc, argv, &i, "--metrics-listen", &o.metrics_listen)) ||
        (r = own_flag(argc, argv, &i, "--heartbeat-interval", &hbi)) ||
        (r = own_flag(argc, argv, &i, "--heartbeat-timeout", &hbt)) ||
        (r = own_flag(argc, argv, &i, "--rendezvous-timeout", &rdv)) ||
        (r = own_flag(argc, argv, &i, "--held-state-timeout", &held)) ||
        (r = own_flag(argc, argv, &i, "--worker", &o.worker_path))) {
      if (r < 0) return usage_error("%s needs a value", argv[i]);
      continue;
    }
    return usage_error("serve: unknown flag '%s'", argv[i]);
  }
  if (!o.listen) return usage_error("serve needs --listen ADDR%s", "");
  if (!o.state_dir) return usage_error("serve needs --state-dir DIR%s", "");
  /* without --slots, one slot per GPU (megad_start finds them, or says why not);
   * an empty one is the same (systemd's --slots ${MEGAD_SLOTS} with none set) */
  if (slots && !slots[0]) slots = NULL;
  if (slots && !parse_slots(slots, &o.slots))
    return usage_error("--slots: '%s' is not a count in 1..4096", slots);
  int max_pending = 0;
  if (pending && (!parse_count(pending, 1000000, &max_pending)))
    return usage_error("--max-pending: '%s' is not a count in 1..1000000", pending);
  o.max_pending = (unsigned)max_pending;
  int retain_jobs = 0;
  if (retain && !parse_count(retain, 1000000, &retain_jobs))
    return usage_error("--retain-jobs: '%s' is not a count in 1..1000000", retain);
  o.retain_jobs = (unsigned)retain_jobs;
  static megad_slurm slurm;
  if (o.peers && !strcmp(o.peers, "slurm")) {
    int src = slurm_peers(&o, slots != NULL, &slurm);
    if (src) return src;
  }
  int rc = duration_flag("--heartbeat-interval", hbi, 10, 60000, &o.heartbeat_interval_ms);
  if (!rc) rc = duration_flag("--heartbeat-timeout", hbt, 20, 600000, &o.heartbeat_timeout_ms);
  if (!rc) rc = duration_flag("--rendezvous-timeout", rdv, 1000, 3600000, &o.rendezvous_timeout_ms);
  if (!rc)
    rc = duration_flag("--held-state-timeout", held, 1000, 120000, &o.held_state_timeout_ms);
  if (!rc) rc = duration_flag("--retain-age", retain_age, 1000, 30 * 86400000u, &o.retain_ms);
  if (!rc) rc = duration_flag("--etcd-lease", lease, 2000, 60000, &o.etcd_lease_ms);
  /* etcd's TTL is whole seconds: 2500ms would silently become 3 s */
  if (!rc && o.etcd_lease_ms % 1000)
    rc = usage_error("--etcd-lease %s: etcd's leases are whole seconds; give 2s, 3s, ...", lease);
  if (!rc && lease && !o.etcd_endpoints)
    return usage_error("--etcd-lease %s needs --etcd-endpoints (it is the etcd lease's TTL)", lease);
  const char *etcd_only = o.etcd_prefix ? "--etcd-prefix" : o.etcd_cacert ? "--etcd-cacert"
                          : o.etcd_cert ? "--etcd-cert" : o.etcd_key ? "--etcd-key"
                          : o.etcd_user ? "--etcd-user"
                          : o.etcd_password_file ? "--etcd-password-file" : NULL;
  if (!rc && etcd_only && !o.etcd_endpoints)
    return usage_error("%s needs --etcd-endpoints", etcd_only);
  /* its key, mega/nodes/NAME, would be read as another cluster's (one
   * under --etcd-prefix P/nodes/), and its jobs' ids hold the name */
  if (!rc && o.etcd_endpoints && o.node_name && strchr(o.node_name, '/'))
    return usage_error("--node-name %s: a node of an etcd cluster has a name without '/'",
                       o.node_name);
  if (rc) return rc;

  static app a;
  rc = start(&a, &o);
  if (rc) return rc;
  printf("megad: listening on %s\n", a.d.address);
  fflush(stdout);
  char line[300];
  snprintf(line, sizeof line, "%s\n", a.d.address);
  megad_write_state_file(&a.d.base, "address", line);
  finish_loop(&a);
  return 0;
}

/* ---- run ---- */

static void print_event(app *a, const Mega__V1__JobEvent *ev) {
  switch (ev->kind) {
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED:
    return; /* the steps say as much */
  default:
    /* a failure's cause is said once, not again as the job's end */
    if (!strcmp(ev->message, a->last_said)) return;
    snprintf(a->last_said, sizeof a->last_said, "%s", ev->message);
    fprintf(stderr, "megad: %s\n", ev->message);
  }
}

/* Megatron's line every --log-interval (core/logline.h), with the merged
 * step's pipeline bubble at its end, and its validation block. */
static void print_step(app *a, const Mega__V1__StepMetrics *s) {
  if (a->json) {
    mega_step_metrics_write(stdout, s);
    return;
  }
  mega_logline_add(&a->log, !s->no_loss, s->loss, s->skipped, s->step_time_s, s->tokens_per_s);
  if (mega_logline_due(&a->spec, (int64_t)s->iteration)) {
    char extra[64], line[1024];
    snprintf(extra, sizeof extra, " bubble: %.1f%% |", 100 * mega_step_bubble(s));
    mega_logline_step st = {.iteration = (int64_t)s->iteration,
                            .world = (int)mega_step_world(s),
                            .global_batch =
                                mega_jobspec_batch_of(&a->spec, (int64_t)s->iteration - 1),
                            .lr = s->lr, .grad_norm = s->grad_norm, .has_grad_norm = true,
                            .extra = extra};
    mega_logline_format(&a->log, &a->spec, &st, line, sizeof line);
    fputs(line, stdout);
  }
  if (s->has_eval_loss) {
    char block[1024];
    mega_logline_eval((int64_t)s->iteration, s->eval_loss, block, sizeof block);
    fputs(block, stdout);
  }
  char end[2048];
  mega_logline_end_eval((int64_t)s->iteration, s->has_final_eval_loss, s->final_eval_loss,
                        s->has_test_loss, s->test_loss, end, sizeof end);
  fputs(end, stdout);
  fflush(stdout);
}

/* The job's lines that stdout would not take (a full disk under megad run
 * --json > steps.jsonl) are said once, here, and fail the run at its end:
 * the job goes on, but a cut file must not pass for the whole. */
static void output_lost(app *a) {
  if (a->out_errno || !ferror(stdout)) return;
  a->out_errno = errno ? errno : EIO; /* print_*'s last call is its fflush */
  fprintf(stderr, "megad: cannot write the job's output (stdout): %s; the job goes on, and "
                  "megad run exits 1 after it even if it succeeds\n", strerror(a->out_errno));
}

static void on_item(void *arg, const Mega__V1__WatchJobResponse *item) {
  app *a = arg;
  switch (item->item_case) {
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP:
    print_step(a, item->step);
    output_lost(a);
    break;
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT:
    print_event(a, item->event);
    output_lost(a);
    break;
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE: {
    const Mega__V1__Job *j = item->final_state;
    if (j->state == MEGA_JOB_SUCCEEDED) a->exit_code = 0;
    else if (j->state == MEGA_JOB_STOPPED) a->exit_code = MEGA_EXIT_REQUEUE;
    else if (j->state == MEGA_JOB_CANCELLED && a->signal) a->exit_code = 128 + a->signal;
    else a->exit_code = 1;
    if (a->exit_code && a->exit_code != MEGA_EXIT_REQUEUE && a->tmp_dir)
      fprintf(stderr, "megad: the worker logs were in a temporary directory, now removed; give "
                      "--state-dir DIR to keep them\n");
    a->job = NULL; /* freed with the daemon */
    megad_stop(&a->d, "the job is over", stopped, a);
    break;
  }
  default:
    break;
  }
}

static int remove_tree(const char *dir) {
  char *cmd = NULL;
  if (asprintf(&cmd, "rm -rf -- '%s'", dir) < 0) return -1;
  int rc = system(cmd);
  free(cmd);
  return rc;
}

static int run(int argc, char **argv) {
  megad_opts o = {.quiet = true, .one_job = true};
  const char *slots = NULL, *name = "", *nproc = NULL, *restarts = NULL;
  static app a;
  a.run = true;
  mega_jobspec spec;
  mega_jobspec_defaults(&spec);
  mega_err err = {0};
  int rc = 0;
  for (int i = 2; i < argc && !rc;) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout, "run");
      mega_jobspec_free(&spec);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      a.json = true;
      i++;
      continue;
    }
    int r;
    if ((r = own_flag(argc, argv, &i, "--slots", &slots)) ||
        (r = own_flag(argc, argv, &i, "--state-dir", &o.state_dir)) ||
        (r = own_flag(argc, argv, &i, "--name", &name)) ||
        (r = own_flag(argc, argv, &i, "--nproc-per-node", &nproc)) ||
        (r = own_flag(argc, argv, &i, "--max-restarts", &restarts)) ||
        (r = own_flag(argc, argv, &i, "--worker", &o.worker_path))) {
      if (r < 0) rc = usage_error("%s needs a value", argv[i]);
      continue;
    }
    mega_status st = mega_jobspec_parse_flag(&spec, argc, argv, &i, &err);
    if (st == MEGA_ERR_NOT_FOUND && !strncmp(argv[i], "--", 2))
      rc = usage_error("run: %s", err.msg);
    else if (st == MEGA_ERR_NOT_FOUND)
      rc = usage_error("run: unexpected argument '%s'", argv[i]);
    else if (st != MEGA_OK) rc = usage_error("%s", err.msg);
  }
  int n = 0, per = 0;
  if (!rc && !slots) rc = usage_error("run needs --slots N%s", "");
  if (!rc && !parse_slots(slots, &n)) rc = usage_error("--slots: '%s' is not a count in 1..4096", slots);
  if (!rc && nproc && (!parse_slots(nproc, &per) || per > n))
    rc = usage_error("--nproc-per-node: '%s' is not a count from 1 to --slots", nproc);
  int max_restarts = 0;
  if (!rc && restarts && strcmp(restarts, "0") && !parse_slots(restarts, &max_restarts))
    rc = usage_error("--max-restarts: '%s' is not a count in 0..4096", restarts);
  char note[2048] = "";
  /* the vocabulary's size counts in the log line's FLOPs */
  if (!rc && (mega_jobspec_fix_data_paths(&spec, true, note, sizeof note, &err) != MEGA_OK ||
              mega_jobspec_absolute_paths(&spec, &err) != MEGA_OK ||
              mega_jobspec_load_vocab(&spec, &err) != MEGA_OK))
    rc = usage_error("%s", err.msg);
  if (!rc && note[0]) fprintf(stderr, "megad: %s\n", note);
  if (!rc && mega_jobspec_eval_note(&spec, note, sizeof note))
    fprintf(stderr, "megad: %s\n", note);
  int nargs = 0;
  char **args = rc ? NULL : mega_jobspec_to_argv(&spec, &nargs);
  a.spec = spec; /* kept for the readable lines; freed at the end */
  if (rc) {
    mega_jobspec_free(&a.spec);
    return rc;
  }
  if (!args) {
    fprintf(stderr, "megad: out of memory\n");
    mega_jobspec_free(&a.spec);
    return 1;
  }
  o.slots = n;
  if (!o.state_dir) {
    char tmpl[] = "/tmp/megad-run-XXXXXX";
    if (!mkdtemp(tmpl)) {
      fprintf(stderr, "megad: cannot create a temporary state directory: %s\n", strerror(errno));
      mega_jobspec_argv_free(args);
      mega_jobspec_free(&a.spec);
      return 1;
    }
    a.tmp_dir = strdup(tmpl);
    o.state_dir = a.tmp_dir;
  }
  char listen[PATH_MAX + 16];
  snprintf(listen, sizeof listen, "unix:%s/megad.sock", o.state_dir);
  o.listen = listen;
  o.node_name = "local";
  if ((rc = start(&a, &o)) != 0) {
    mega_jobspec_argv_free(args);
    mega_jobspec_free(&a.spec);
    if (a.tmp_dir) remove_tree(a.tmp_dir);
    return rc;
  }
  Mega__V1__JobSpec js = MEGA__V1__JOB_SPEC__INIT;
  js.name = (char *)name;
  js.args = args;
  js.n_args = (size_t)nargs;
  js.nnodes_min = js.nnodes_max = 1;
  js.nproc_per_node = (uint32_t)(per ? per : n);
  js.max_restarts = (uint32_t)max_restarts;
  if (megad_coord_submit(&a.d.coord, &js, &a.job, &err) != MEGA_OK) {
    fprintf(stderr, "megad: %s\n", err.msg);
    a.exit_code = err.status == MEGA_ERR_INVALID ? EXIT_USAGE : 1;
    megad_stop(&a.d, "the job was refused", stopped, &a);
  } else {
    megad_watch_local(&a.d.jobs.watchers, a.job, false, on_item, &a);
    megad_coord_schedule(&a.d.coord);
  }
  mega_jobspec_argv_free(args);
  finish_loop(&a);
  if (a.tmp_dir) remove_tree(a.tmp_dir);
  free(a.tmp_dir);
  mega_jobspec_free(&a.spec);
  bool lost = fflush(stdout) != 0 || ferror(stdout);
  if (lost && a.exit_code == 0) {
    fprintf(stderr, "megad: the job succeeded, but its output did not all reach stdout\n");
    a.exit_code = 1;
  }
  return a.exit_code;
}

/* 0, or 1 saying why when what went to stdout did not all reach it. */
static int printed(void) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
  fprintf(stderr, "megad: cannot write its output (stdout): %s\n",
          errno ? strerror(errno) : "a write failed (a full disk, or a closed file)");
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout, argc > 2 && !strcmp(argv[1], "help") ? argv[2] : NULL);
    return argc < 2 ? EXIT_USAGE : printed();
  }
  if (!strcmp(argv[1], "--version")) {
    printf("megad %s\n", mega_version());
    return printed();
  }
  if (!strcmp(argv[1], "serve")) return serve(argc, argv);
  if (!strcmp(argv[1], "run")) return run(argc, argv);
  return usage_error("unknown command '%s': use serve or run", argv[1]);
}
