// Receive windows wide enough for the loopback's 64 KiB segments.
//
// Gloo leaves its sockets at the kernel's defaults. On loopback a TCP
// segment is 64 KiB (the MTU) and a socket starts with a 128 KiB receive
// buffer, so the advertised window is about one segment and opens in steps
// of a whole segment: a pipeline activation of 128 KiB or more stalls
// until the receiver's delayed ACK, 40 ms later (at PP=4 x DP=2 a few
// messages an iteration, the replicas of a stage drifting 10-40 ms apart;
// with Linux's per-route quickack they did not). Gloo keeps the sockets
// from us, so each pair's socket is found by its local address (unique
// to a connection) among the process's descriptors.
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

namespace tcp = gloo::transport::tcp;

// A connected TCP socket of this process and its local address.
struct Sock {
  int fd;
  sockaddr_storage self;
};

size_t addr_len(const sockaddr_storage &a) {
  return a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

std::vector<Sock> connected_sockets() {
  std::vector<Sock> out;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return out;
  while (struct dirent *e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = atoi(e->d_name);
    if (fd == dirfd(d)) continue;
    Sock s{fd, {}};
    sockaddr_storage peer;
    socklen_t l = sizeof s.self, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&s.self), &l) != 0) continue;
    if (s.self.ss_family != AF_INET && s.self.ss_family != AF_INET6) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &pl) != 0) continue;
    out.push_back(s);
  }
  closedir(d);
  return out;
}

}  // namespace

int widen_receive_windows(gloo::transport::Context &tc, int rank, int size) {
  std::vector<Sock> socks = connected_sockets();
  int widened = 0;
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    const auto *a = dynamic_cast<const tcp::Address *>(&tc.getPair(j)->address());
    if (!a) continue;
    const sockaddr_storage &want = a->getSockaddr();
    for (const Sock &s : socks) {
      if (s.self.ss_family != want.ss_family ||
          memcmp(&s.self, &want, addr_len(want)) != 0)
        continue;
      int mss = 0, buf = 0;
      socklen_t l = sizeof mss, bl = sizeof buf;
      if (getsockopt(s.fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) != 0 ||
          getsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &buf, &bl) != 0)
        break;
      // Only a window of a few segments (loopback's): on a network's 1.5-9
      // KiB segments the default holds dozens, and setting the size would
      // end the kernel's own tuning of it. The size set is as large as that
      // tuning reaches for a bulk transfer (fewer segments cost the 10M-float
      // all-reduce a fifth), up to net.core.rmem_max.
      if (buf >= kNarrowSegments * mss) break;
      int target = kWindowSegments * mss;
      if (setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &target, sizeof target) == 0) widened++;
      break;
    }
  }
  return widened;
}

}  // namespace mega_gloo
