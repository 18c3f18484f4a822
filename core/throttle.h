/* Failed logins counted per source address: after a few, a source is held
 * off for a while that doubles with each further failure. Used for the
 * cluster token (proto/rpc_server.c) and the web view's login form
 * (daemon/web/weblogin.c). Bounded: at most MEGA_THROTTLE_SOURCES sources
 * are remembered; a new one takes the place of the one that failed least
 * recently. Times are the caller's milliseconds (any monotonic clock). */
#ifndef MEGA_CORE_THROTTLE_H
#define MEGA_CORE_THROTTLE_H

#include <stddef.h>
#include <stdint.h>

#define MEGA_THROTTLE_SOURCES 1024
#define MEGA_THROTTLE_FREE 5              /* failures before a source is held off */
#define MEGA_THROTTLE_FIRST_MS 1000       /* the first hold; doubled by each failure on */
#define MEGA_THROTTLE_MAX_MS 60000        /* the longest */
#define MEGA_THROTTLE_FORGET_MS 600000    /* a source quiet this long starts afresh */
#define MEGA_THROTTLE_KEY_MAX 64

typedef struct mega_throttle mega_throttle;

/* NULL when out of memory. */
mega_throttle *mega_throttle_new(void);
void mega_throttle_free(mega_throttle *t);

/* Milliseconds until source may be heard again (0: now). */
int64_t mega_throttle_wait(const mega_throttle *t, const char *source, int64_t now_ms);

/* Counts a failure from source; returns the wait it has from now on (0
 * while it has failed at most MEGA_THROTTLE_FREE times). */
int64_t mega_throttle_fail(mega_throttle *t, const char *source, int64_t now_ms);

/* A success from source: it starts afresh. */
void mega_throttle_forget(mega_throttle *t, const char *source);

/* The address in a peer string, without its port, into buf:
 * "ipv4:10.0.0.5:4711" and "10.0.0.5" are "10.0.0.5", "ipv6:[::1]:80" and
 * gRPC's "ipv6:%5B::1%5D:80" are "::1", an IPv4-mapped "::ffff:10.0.0.5" is
 * "10.0.0.5", "unix:/run/x.sock" is "unix". Returns buf. */
const char *mega_throttle_source(const char *peer, char *buf, size_t cap);

#endif
