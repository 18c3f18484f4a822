/* megad: every layer of the daemon (base.h lists them), wired together.
 *
 * One libuv loop runs everything: the gRPC server and async client calls
 * (through proto/rpc_bridge), worker processes and their pipes, timers and
 * signals. So none of this state needs a lock. */
#ifndef MEGA_DAEMON_DAEMON_H
#define MEGA_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/coord/coord.h"
#include "daemon/services/services.h"

typedef struct megad_opts {
  const char *listen;         /* "127.0.0.1:7070", "127.0.0.1:0" or "unix:/path" */
  const char *state_dir;      /* journal, jobs/<id>/ (traces, worker logs) */
  int slots;                  /* 0: one per GPU megad finds, else cpu_slots */
  int cpu_slots;              /* slots without --slots or GPUs (Slurm's CPUs); 0: none */
  const char *node_name;      /* NULL: the hostname */
  const char *peers;          /* "host:port,host:port"; NULL: none */
  const char *etcd_endpoints; /* "http://host:port,..." : cluster state in etcd (members.h);
                                 NULL: none (peers and the journal) */
  const char *etcd_prefix;    /* where this cluster's keys live in etcd; NULL: "mega/" */
  const char *etcd_cacert, *etcd_cert, *etcd_key; /* files: TLS towards etcd */
  const char *etcd_user, *etcd_password_file;     /* etcd's authentication */
  const char *advertise;      /* host peers and workers use; NULL: the listen host */
  const char *worker_path;    /* NULL: megaw next to megad */
  const char *metrics_listen; /* "127.0.0.1:9100"; NULL: no /metrics */
  bool quiet;                 /* megad run: no log lines on stderr but warnings */
  bool one_job;               /* megad run: the daemon ends with its one job */
  unsigned heartbeat_interval_ms; /* 0: 250 */
  unsigned heartbeat_timeout_ms;  /* 0: 1500 */
  unsigned rendezvous_timeout_ms; /* 0: 60000 */
  unsigned held_state_timeout_ms; /* held ranks of a lost coordinator; 0: 60000 */
  unsigned etcd_lease_ms;         /* etcd mode: a node's lease (whole seconds); 0: 2 s */
  /* security (README "Security"): a listener other than loopback or a unix
   * socket needs token_file */
  const char *token_file;     /* the cluster token (mode 0600 or stricter); NULL: none */
  const char *peer_token_file; /* the nodes' own token (the same checks): Peer calls take
                                  only it, and this megad's calls carry it; NULL: none,
                                  token_file serves both */
  const char *tls_cert, *tls_key; /* serve TLS; NULL: plaintext */
  const char *tls_ca;         /* the CA of peers' certificates (and of clients' with
                                 tls_client_auth); peers are called over TLS with it */
  bool tls_client_auth;       /* require client certificates signed by tls_ca */
  const char *const *data_roots, *const *save_roots; /* what jobs may read and write */
  size_t n_data_roots, n_save_roots;
  unsigned max_pending;       /* jobs this node coordinates that may wait; 0: 1000 */
  unsigned retain_jobs;       /* ended jobs kept; 0: 1000 */
  unsigned retain_ms;         /* ended jobs older than this are forgotten; 0: 7 days */
} megad_opts;

typedef struct megad {
  megad_opts o;
  megad_base base;
  megad_etcd *etcd; /* NULL without --etcd-endpoints; the layers borrow it */
  megad_jobs jobs;
  megad_kvserve kvs;
  megad_members members;
  megad_launcher launcher;
  megad_coord coord;
  megad_services svc;
  mega_rpc_server *srv;
  /* the token and TLS files' contents; auth and peer_auth point into them */
  char *token, *peer_token, *tls_cert, *tls_key, *tls_ca;
  char *etcd_pem[3], *etcd_password; /* etcd's CA, certificate and key; the password */
  mega_rpc_auth auth;      /* the server's: both tokens */
  mega_rpc_auth peer_auth; /* what this megad's calls to its peers carry */
  megad_roots roots;
  /* refused calls, logged at most once a second */
  uint64_t refused, refused_logged_ms;
  char *address, *worker_host, *worker_path;
  int port;
  uint64_t incarnation;
  uv_timer_t watchdog; /* sd_notify WATCHDOG=1 */
  bool watchdog_on, started;
  /* megad_stop_saving: waiting for jobs to save before megad_stop */
  uv_timer_t drain;
  bool draining;
  uint64_t drain_since;
  char drain_reason[256];
  void (*drain_done)(void *arg);
  void *drain_arg;
} megad;

/* Starts everything on loop: state dir (locked), journal replay, server,
 * peers, and the jobs that were running when this megad last stopped.
 * Prints nothing; ->port and ->address tell where it listens. */
mega_status megad_start(megad *d, uv_loop_t *loop, const megad_opts *o, mega_err *err);
/* Stops in order: no new jobs; running attempts end and their jobs wait as
 * RESTARTING (a megad started again on this state dir resumes them); every
 * worker aborted and reaped; Leave sent to peers; the server shut down,
 * calls drained, the queue closed. done runs at the end; keep running the
 * loop. */
void megad_stop(megad *d, const char *reason, void (*done)(void *arg), void *arg);
/* SIGTERM, which is how a batch scheduler warns of a time limit: the jobs
 * with --exit-signal-handler that run here or that this node coordinates
 * are asked to save a checkpoint at their next iteration boundary and stop
 * (they end STOPPED), and once they have (at most MEGAD_DRAIN_MAX_MS),
 * megad_stop. Without such jobs it is megad_stop at once; so is a second
 * call while it waits (a second signal). */
#define MEGAD_DRAIN_MAX_MS 600000
void megad_stop_saving(megad *d, const char *reason, void (*done)(void *arg), void *arg);

#endif
