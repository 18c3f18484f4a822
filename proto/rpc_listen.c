/* Whether a server could listen on addr (HOST:PORT or unix:PATH), asked
 * before gRPC is: gRPC reports a failed bind only to its log, takes a host
 * alone as port 443 and a port past 65535 as a random one. */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/port.h"
#include "proto/rpc_internal.h"

static void errno_sentence(int e, char *buf, size_t n) {
  snprintf(buf, n, "%s", strerror(e));
  buf[0] = (char)tolower((unsigned char)buf[0]);
}

mega_status mega_rpc_probe_listen(const char *addr, mega_err *err) {
  char why[128];
  if (strncmp(addr, "unix:", 5) == 0) {
    const char *path = addr + 5;
    if (strncmp(path, "//", 2) == 0) path += 2;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
      return mega_fail(err, MEGA_ERR_INVALID, "cannot listen on %s: the path is longer than %zu bytes",
                       addr, sizeof sa.sun_path - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return MEGA_OK;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    if (rc == 0) /* gRPC would unlink a live server's socket: refuse instead */
      return mega_fail(err, MEGA_ERR_IO,
                       "cannot listen on %s: address already in use (a server answers there)",
                       addr);
    return MEGA_OK;
  }
  char host[256], port[32];
  const char *colon = strrchr(addr, ':');
  /* gRPC takes a host alone as port 443 (https's): say instead. A bare
   * IPv6 address ("::1") has colons but no port either. */
  const char *bracket = strchr(addr, ']');
  bool bare_v6 = colon && addr[0] != '[' && memchr(addr, ':', (size_t)(colon - addr));
  if (!colon || (bracket && colon < bracket) || bare_v6)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cannot listen on %s: give HOST:PORT, such as %s%s%s:7070 (megactl's "
                     "default port; 0 picks a free one)",
                     addr, bare_v6 ? "[" : "", addr, bare_v6 ? "]" : "");
  if (strlen(colon + 1) >= sizeof port)
    return mega_fail(err, MEGA_ERR_INVALID, "cannot listen on %s: the port is not a number in "
                     "0..65535", addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  size_t hl = (size_t)(colon - addr);
  if (hl >= sizeof host) return MEGA_OK;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  /* gRPC binds a port past 65535 as a random one: refuse it instead */
  unsigned pn;
  if (!mega_port_parse(port, strlen(port), &pn))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "cannot listen on %s: '%s' is not a port (0..65535; 0 picks a free one)",
                     addr, port);
  if (pn == 0) return MEGA_OK;
  struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host[0] ? host : NULL, port, &hints, &res) != 0) return MEGA_OK;
  mega_status st = MEGA_OK;
  for (struct addrinfo *ai = res; ai && st == MEGA_OK; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1; /* as gRPC does, so a closed socket in TIME_WAIT is no conflict */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      errno_sentence(errno, why, sizeof why);
      st = mega_fail(err, MEGA_ERR_IO, "cannot listen on %s: %s", addr, why);
    }
    close(fd);
  }
  freeaddrinfo(res);
  return st;
}
