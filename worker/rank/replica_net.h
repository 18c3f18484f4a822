/* The sockets of a replica transfer (rank_hold.c serves, rank_fetch.c
 * fetches): one TCP connection per fetch, frames of proto/frame.h for the
 * messages and raw floats after each piece. Every read and write is
 * bounded by the socket's timeout, so a peer that dies or stops midway is
 * an error, not a hang. Private to worker/rank. */
#ifndef MEGA_WORKER_REPLICA_NET_H
#define MEGA_WORKER_REPLICA_NET_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Listens on host (NULL: 127.0.0.1), any port; *fd is the caller's, addr
 * gets "host:port". */
mega_status mega_net_listen(const char *host, int *fd, char *addr, size_t len, mega_err *err);

/* Waits up to timeout_ms for a connection: *fd -1 (and MEGA_OK) when none
 * came. The connection gets timeout_ms as its read and write timeout. */
mega_status mega_net_accept(int lfd, int timeout_ms, int io_timeout_ms, int *fd, mega_err *err);

/* Connects to "host:port" within timeout_ms; reads and writes then time
 * out after io_timeout_ms. */
mega_status mega_net_connect(const char *addr, int timeout_ms, int io_timeout_ms, int *fd,
                             mega_err *err);

/* All n bytes, or an error naming what (what: "the parameters", ...). */
mega_status mega_net_write_all(int fd, const void *buf, size_t n, const char *what,
                               mega_err *err);
/* read_all takes any fd: a socket, or the file a test hands it. */
mega_status mega_net_read_all(int fd, void *buf, size_t n, const char *what, mega_err *err);

/* 16 random bytes (getrandom). */
mega_status mega_net_token(uint8_t out[16], mega_err *err);

#endif
