/* Real etcd members for tests: 1 or 3 on free loopback ports, in a temporary
 * directory, started, killed (-9), restarted and stopped by the test. No
 * member outlives its test: each dies with the process that started it
 * (PR_SET_PDEATHSIG) and at exit (atexit), whichever comes first.
 *
 *   etcd_fx_require();            // exit 77 (skip) when etcd is missing
 *   etcd_fx f;
 *   assert(etcd_fx_start(&f, 3));
 *   ... f.endpoints is "http://127.0.0.1:P1,http://127.0.0.1:P2,..."
 *   etcd_fx_kill(&f, 0);
 *   etcd_fx_stop(&f);
 *
 * Standalone (libc only), so the unit tests and the megad harness both use it. */
#ifndef MEGA_TESTS_ETCD_FIXTURE_H
#define MEGA_TESTS_ETCD_FIXTURE_H

#include <stdbool.h>
#include <sys/types.h>

#define ETCD_FX_MAX 3

typedef struct etcd_fx_member {
  char name[16];
  int client_port, peer_port;
  pid_t pid; /* 0 when not running */
} etcd_fx_member;

typedef struct etcd_fx {
  int n;
  bool tls;       /* etcd_fx_start_tls: https, client certificates required */
  char dir[64];   /* /tmp/etcd-test-XXXXXX: e1/, e1.log, ...; with tls ca.pem, client.pem,
                     client.key (CN root) */
  char endpoints[256];
  etcd_fx_member m[ETCD_FX_MAX];
} etcd_fx;

/* Exits 77 with the reason on stderr when etcd or etcdctl is not installed. */
void etcd_fx_require(void);
/* Starts n (1 or 3) members and waits (up to 30 s) until the cluster is
 * healthy; false (with why on stderr, and nothing left running) if not. */
bool etcd_fx_start(etcd_fx *f, int n);
/* One member serving TLS with client certificates required (etcd
 * --client-cert-auth), its certificates made with openssl in dir: the CA
 * (ca.pem), the server's (for 127.0.0.1), a client's (client.pem,
 * client.key; CN root); etcd_fx_ctl uses the client's. */
bool etcd_fx_start_tls(etcd_fx *f);
/* "http://127.0.0.1:PORT" of member i (https with tls; static buffer per member). */
const char *etcd_fx_endpoint(const etcd_fx *f, int i);
/* kill -9 member i and reap it. */
void etcd_fx_kill(etcd_fx *f, int i);
/* Starts member i again on its data dir and ports; waits until it answers
 * (up to 20 s). */
bool etcd_fx_restart(etcd_fx *f, int i);
/* Waits (up to ms) until every running member answers healthy. */
bool etcd_fx_wait(const etcd_fx *f, int ms);
/* Runs etcdctl against the cluster with args (a shell fragment); its exit
 * status. Output goes to the fixture's log. */
int etcd_fx_ctl(const etcd_fx *f, const char *args);
/* Stops every member and removes the directory. */
void etcd_fx_stop(etcd_fx *f);

#endif
