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

#include "daemon/coord.h"
#include "daemon/services.h"

typedef struct megad_opts {
  const char *listen;         /* "127.0.0.1:7070", "127.0.0.1:0" or "unix:/path" */
  const char *state_dir;      /* journal, jobs/<id>/ (traces, worker logs) */
  int slots;
  const char *node_name;      /* NULL: the hostname */
  const char *peers;          /* "host:port,host:port"; NULL: none */
  const char *advertise;      /* host peers and workers use; NULL: the listen host */
  const char *worker_path;    /* NULL: megaw next to megad */
  const char *metrics_listen; /* "127.0.0.1:9100"; NULL: no /metrics */
  const char *metrics_token;  /* wanted as a bearer token on /metrics; NULL: open */
  bool quiet;                 /* megad run: no log lines on stderr but warnings */
  unsigned heartbeat_interval_ms; /* 0: 250 */
  unsigned heartbeat_timeout_ms;  /* 0: 1500 */
  unsigned rendezvous_timeout_ms; /* 0: 60000 */
} megad_opts;

typedef struct megad {
  megad_opts o;
  megad_base base;
  megad_jobs jobs;
  megad_kvserve kvs;
  megad_members members;
  megad_launcher launcher;
  megad_coord coord;
  megad_services svc;
  mega_rpc_server *srv;
  char *address, *worker_host, *worker_path;
  int port;
  uint64_t incarnation;
  uv_timer_t watchdog; /* sd_notify WATCHDOG=1 */
  bool watchdog_on, started;
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

#endif
