/* The etcd tests' shared pieces: a loop with a megad_etcd client on it,
 * calls that wait for their answer and copy it, and recorders for a
 * session's and a watch's callbacks; a 1-member etcd for a test group.
 * Every helper fails the running cmocka test. */
#ifndef MEGA_TESTS_ETCD_ENV_H
#define MEGA_TESTS_ETCD_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/etcd/etcd.h"
#include "etcd_fixture.h"

/* A 1-member etcd, started by etcd_one_setup and stopped by
 * etcd_one_teardown (cmocka's group setup and teardown). */
extern etcd_fx etcd_one;
int etcd_one_setup(void **state);
int etcd_one_teardown(void **state);

typedef struct env {
  uv_loop_t loop;
  uv_timer_t tick; /* wakes uv_run(ONCE) so waits can check the clock */
  megad_base b;
  megad_etcd *e;
  char dir[64];
} env;

/* A loop and a client of endpoints on it, with a state dir of its own. */
void env_open(env *v, const char *endpoints);
/* Frees the client (unless v->e is NULL), the loop and the state dir. */
void env_close(env *v);
/* Runs the loop until *flag or ms pass; whether *flag. */
bool run_until(env *v, const bool *flag, int ms);
void run_for(env *v, int ms);

/* ---- a call's answer, copied ---- */

typedef struct res {
  bool done;
  mega_err err;
  int64_t revision, lease, ttl;
  bool succeeded;
  size_t nkvs;
  struct {
    char key[64], value[64];
    int64_t create_revision, mod_revision, lease;
  } kv[8];
} res;

/* A call's callback: copies the answer into the res at arg. */
void on_res(void *arg, const megad_etcd_reply *r, const mega_err *err);
/* Waits for the answer; asserts it came and was OK. */
void await_ok(env *v, res *x);
/* The calls, waited for and asserted OK. */
res put(env *v, const char *key, const char *value, int64_t lease);
res get(env *v, const char *key, bool prefix);
res del(env *v, const char *key, bool prefix);
res txn(env *v, const megad_etcd_cmp *c, size_t nc, const megad_etcd_op *t, size_t nt,
        const megad_etcd_op *o, size_t no);

/* ---- the session ---- */

typedef struct sess {
  bool up, lost, unreachable, reachable_again;
  int64_t lease;
  char why[512];
} sess;

/* Starts the session (TTL 2 s) recording into s, and waits until it is up. */
void session_up(env *v, sess *s);

/* ---- watches ---- */

typedef struct seen {
  int n;
  bool reset;
  char why[512];
  struct {
    megad_etcd_evtype type;
    char key[64], value[64];
    int64_t rev;
  } ev[64];
} seen;

/* A watch's callbacks recording into s, emptied. */
megad_etcd_watch_cbs seen_cbs(seen *s);
/* Runs the loop until s has n events or ms pass; whether it has. */
bool run_until_events(env *v, seen *s, int n, int ms);
/* A watch of prefix from revision from (0: now) recording into s. */
megad_etcd_watch *watch(env *v, const char *prefix, int64_t from, seen *s);

#endif
