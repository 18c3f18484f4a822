#include "worker/rank/replica_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static void set_io_timeout(int fd, int ms) {
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* host:port into an IPv4 or IPv6 address (numeric or a name). */
static mega_status resolve(const char *host, const char *port, bool passive,
                           struct addrinfo **out, mega_err *err) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int rc = getaddrinfo(host, port, &hints, out);
  if (rc)
    return mega_fail(err, MEGA_ERR_IO, "cannot resolve %s: %s", host, gai_strerror(rc));
  return MEGA_OK;
}

mega_status mega_net_listen(const char *host, int *fd, char *addr, size_t len, mega_err *err) {
  *fd = -1;
  if (!host || !host[0]) host = "127.0.0.1";
  struct addrinfo *ai;
  mega_status st = resolve(host, "0", true, &ai, err);
  if (st != MEGA_OK) return st;
  int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, 64)) {
    int e = errno;
    if (s >= 0) close(s);
    freeaddrinfo(ai);
    return mega_fail(err, MEGA_ERR_IO, "cannot listen on %s for replica fetches: %s", host,
                     strerror(e));
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(s, (struct sockaddr *)&ss, &sl);
  int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                      : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  bool v6 = strchr(host, ':') != NULL;
  snprintf(addr, len, v6 ? "[%s]:%d" : "%s:%d", host, port);
  *fd = s;
  return MEGA_OK;
}

mega_status mega_net_accept(int lfd, int timeout_ms, int io_timeout_ms, int *fd, mega_err *err) {
  *fd = -1;
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  int n = poll(&p, 1, timeout_ms);
  if (n < 0 && errno != EINTR)
    return mega_fail(err, MEGA_ERR_IO, "waiting for replica fetches: %s", strerror(errno));
  if (n <= 0) return MEGA_OK;
  int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (s < 0) return MEGA_OK; /* the peer gave up already; the next poll goes on */
  set_io_timeout(s, io_timeout_ms);
  *fd = s;
  return MEGA_OK;
}

/* Splits "host:port" or "[v6]:port". */
static bool split_addr(const char *addr, char *host, size_t hl, char *port, size_t pl) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1]) return false;
  const char *h = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n == 0 || n >= hl || strlen(colon + 1) >= pl) return false;
  memcpy(host, h, n);
  host[n] = '\0';
  snprintf(port, pl, "%s", colon + 1);
  return true;
}

mega_status mega_net_connect(const char *addr, int timeout_ms, int io_timeout_ms, int *fd,
                             mega_err *err) {
  *fd = -1;
  char host[256], port[16];
  if (!split_addr(addr, host, sizeof host, port, sizeof port))
    return mega_fail(err, MEGA_ERR_INVALID, "'%s' is not host:port", addr);
  struct addrinfo *ai;
  mega_status st = resolve(host, port, false, &ai, err);
  if (st != MEGA_OK) return st;
  int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = s < 0 ? -1 : connect(s, ai->ai_addr, ai->ai_addrlen);
  int e = rc ? errno : 0;
  freeaddrinfo(ai);
  if (rc && e == EINPROGRESS) {
    struct pollfd p = {.fd = s, .events = POLLOUT};
    int n;
    do n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    socklen_t el = sizeof e;
    if (n == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0) rc = 0;
    else if (n == 0) e = ETIMEDOUT;
  }
  if (rc) {
    if (s >= 0) close(s);
    return mega_fail(err, MEGA_ERR_PEER, "cannot connect to the replica at %s: %s", addr,
                     strerror(e));
  }
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
  set_io_timeout(s, io_timeout_ms);
  *fd = s;
  return MEGA_OK;
}

mega_status mega_net_write_all(int fd, const void *buf, size_t n, const char *what,
                               mega_err *err) {
  const char *p = buf;
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return mega_fail(err, MEGA_ERR_PEER, "sending %s: %s", what,
                       k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out"
                                                                          : strerror(errno));
    p += k;
    n -= (size_t)k;
  }
  return MEGA_OK;
}

mega_status mega_net_read_all(int fd, void *buf, size_t n, const char *what, mega_err *err) {
  char *p = buf;
  while (n) {
    ssize_t k = read(fd, p, n); /* as recv on a socket; a test may hand it a file */
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) return mega_fail(err, MEGA_ERR_PEER, "receiving %s: the peer closed", what);
    if (k < 0)
      return mega_fail(err, MEGA_ERR_PEER, "receiving %s: %s", what,
                       errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
    p += k;
    n -= (size_t)k;
  }
  return MEGA_OK;
}

mega_status mega_net_token(uint8_t out[16], mega_err *err) {
  size_t got = 0;
  while (got < 16) {
    ssize_t k = getrandom(out + got, 16 - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return mega_fail(err, MEGA_ERR_IO, "getrandom: %s", strerror(errno));
    got += (size_t)k;
  }
  return MEGA_OK;
}
