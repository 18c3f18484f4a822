// Collectives through shared memory for a group whose ranks are all on this
// node (mega_store_group_here): each rank copies its part into its slot of
// a segment the group maps, meets the others at a barrier, and reads what
// it needs from theirs. On loopback TCP the kernel copies every byte twice
// and Gloo's event loop thread wakes for each message: bench_comm lanes'
// 1M-float all-reduce at 2 ranks took 2.78 ms that way and 1.07 ms here.
//
// Failures keep comm.h's contract: a barrier's wait wakes every 10 ms to
// look at the group's `broken` word (set by a rank whose communicator broke
// or was aborted, with why) and at its peers' pidfds (a rank that died), and
// gives up at the collective's deadline.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <gloo/allgatherv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

constexpr size_t kLine = 64;
// One set's slots (all ranks) in floats: 2 MB, so a segment is 4 MB at any
// group size, reserved up front (a tmpfs page first touched past the
// mount's size is a SIGBUS).
constexpr size_t kSetFloats = size_t{1} << 19;
constexpr size_t kMinSlotFloats = 4096;
constexpr ms kSlice(10);  // how often a waiting rank looks for failures
// How long a barrier spins before it sleeps (PP=4 x DP=2, 3 rounds: the
// engine's 1M-float all-reduce 2.3 -> 1.7 ms against no spin).
constexpr std::chrono::microseconds kSpin(300);
constexpr uint32_t kSetupTag = 0xfffffff0u;

struct Header {
  alignas(kLine) std::atomic<uint32_t> arrive;
  alignas(kLine) std::atomic<uint32_t> gen;  // the barrier's generation (a futex)
  // 0; -1 while `why` is written; then 1 + the rank to blame: one whose
  // communicator broke or was aborted, or one seen dead
  alignas(kLine) std::atomic<int32_t> broken;
  char why[512];
};

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

// After the header: each rank's pid, then two sets of each rank's
// description of its collective (gloo_agree.cc), then the sets of slots
// from a page boundary.
std::atomic<int32_t> *pids(Header *h) {
  return reinterpret_cast<std::atomic<int32_t> *>(reinterpret_cast<char *>(h) +
                                                  round_up(sizeof(Header), kLine));
}

size_t descs_at(int n) {
  return round_up(round_up(sizeof(Header), kLine) + sizeof(int32_t) * static_cast<size_t>(n),
                  kLine);
}

size_t header_bytes(int n) {
  return round_up(descs_at(n) + 2 * sizeof(AgreeDesc) * static_cast<size_t>(n), 4096);
}

long futex(std::atomic<uint32_t> *a, int op, uint32_t val, const struct timespec *t) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(a), op, val, t, nullptr, 0);
}

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

// A group's mapping, and what a rank needs to watch its peers.
struct ShmGroup {
  int n = 0, rank = 0;
  void *base = MAP_FAILED;
  size_t len = 0;
  Header *h = nullptr;
  float *sets = nullptr;  // two sets of n slots of slot floats
  size_t slot = 0;
  uint64_t piece = 0;  // pieces run so far: the next one's set is piece % 2
  AgreeDesc *descs = nullptr;  // two sets of n
  // The running collective's description, compared with the others' at its
  // first barrier (nullptr once compared). A collective runs a piece at
  // least, so that a rank's next description goes to the other set, which
  // no rank still reads.
  const AgreeDesc *agree = nullptr;
  AgreeDesc *agree_set = nullptr;
  std::vector<int> pidfd;  // per rank (-1: this rank, or none)
  std::vector<pid_t> pid;

  ~ShmGroup() {
    for (int fd : pidfd)
      if (fd >= 0) close(fd);
    if (base != MAP_FAILED) munmap(base, len);
  }
  float *slot_of(int r) { return sets + ((piece % 2) * n + static_cast<size_t>(r)) * slot; }
};

void shm_free(ShmGroup *g) { delete g; }

namespace {

// The first to mark the group broken says why and whom to blame.
void mark_broken(ShmGroup &g, int blame, const std::string &why) {
  Header &h = *g.h;
  int32_t none = 0;
  if (h.broken.compare_exchange_strong(none, -1)) {
    size_t n = std::min(why.size(), sizeof h.why - 1);
    memcpy(h.why, why.data(), n);
    h.why[n] = '\0';
    h.broken.store(blame + 1, std::memory_order_release);
  }
  futex(&h.gen, FUTEX_WAKE, INT_MAX, nullptr);
}

void check_broken(State &s, ShmGroup &g) {
  int32_t b = g.h->broken.load(std::memory_order_acquire);
  if (b > 0 && b - 1 != g.rank)
    throw ShmPeerError(b - 1, std::string(g.h->why, strnlen(g.h->why, sizeof g.h->why)));
  if (b > 0 || s.failed.load()) throw gloo::IoException("the communicator broke during the collective");
}

// A peer whose process has ended, or -1.
int dead_peer(ShmGroup &g) {
  for (int q = 0; q < g.n; q++) {
    if (q == g.rank) continue;
    if (g.pidfd[q] >= 0) {
      struct pollfd p = {g.pidfd[q], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) return q;
    } else if (kill(g.pid[q], 0) != 0 && errno == ESRCH) {
      return q;
    }
  }
  return -1;
}

void meet(State &s, ShmGroup &g, steady::time_point deadline) {
  check_broken(s, g);
  Header &h = *g.h;
  uint32_t gen = h.gen.load(std::memory_order_acquire);
  if (h.arrive.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(g.n)) {
    h.arrive.store(0, std::memory_order_relaxed);
    h.gen.fetch_add(1, std::memory_order_release);
    futex(&h.gen, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  // Spin a while, giving the core to anything runnable, before sleeping:
  // a rank woken from the futex took 0.3-0.6 ms to run again on this
  // 2-core VM, and the peer is usually a piece's copy away.
  const auto spin_end = steady::now() + kSpin;
  for (int i = 0; h.gen.load(std::memory_order_acquire) == gen; i++) {
    cpu_relax();
    if (i % 64 == 63) {
      if (steady::now() >= spin_end) break;
      sched_yield();
    }
  }
  while (h.gen.load(std::memory_order_acquire) == gen) {
    check_broken(s, g);
    auto now = steady::now();
    if (now >= deadline)
      throw gloo::IoException("timed out at a shared-memory barrier");
    auto left = std::min<steady::duration>(deadline - now, kSlice);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    struct timespec t = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    if (futex(&h.gen, FUTEX_WAIT, gen, &t) != 0 && errno == ETIMEDOUT) {
      int q = dead_peer(g);
      if (q >= 0 && h.gen.load(std::memory_order_acquire) == gen) {
        std::string why = "rank " + std::to_string(q) + " (pid " + std::to_string(g.pid[q]) +
                          ") exited";
        mark_broken(g, q, why);  // the others need not wait for its pidfd
        check_broken(s, g);
        throw ShmPeerError(q, why);
      }
    }
  }
}

// A barrier; the first of a collective compares every rank's description
// with this rank's (each rank reads them all, so each names the same
// disagreement).
void barrier(State &s, ShmGroup &g, steady::time_point deadline) {
  meet(s, g, deadline);
  if (!g.agree) return;
  const AgreeDesc *mine = g.agree;
  g.agree = nullptr;
  for (int q = 0; q < g.n; q++)
    if (q != g.rank) agree_check(*mine, g.agree_set[q], q);
}

template <typename Op>
void reduce_into(float *o, float *mine, const ShmGroup &g, float *const *slots, size_t a, size_t e,
                 Op op) {
  for (size_t i = a; i < e; i++) {
    float x = slots[0][i];
    for (int q = 1; q < g.n; q++) x = op(x, slots[q][i]);
    o[i] = x;
    mine[i] = x;
  }
}

// Pieces of slot floats: in, a barrier, each rank sums its share of the
// piece into its own buffer and its slot, a barrier, each copies the
// others' shares out. Every share is summed by one rank in rank order, so
// all ranks end with the same bits. Two ranks each sum the whole piece
// (the same order on both, so the same bits): as many bytes read and
// written as shares, and one barrier a piece instead of two (DP=2 alone,
// 1M-float buckets: 3.5-4.2 -> 2.6 ms a bucket).
void all_reduce(State &s, ShmGroup &g, Job &j, steady::time_point deadline) {
  float *buf = static_cast<float *>(j.out);
  std::vector<float *> slots(g.n);
  for (size_t at = 0; at < j.count; at += g.slot) {
    size_t p = std::min(g.slot, j.count - at);
    for (int q = 0; q < g.n; q++) slots[q] = g.slot_of(q);
    memcpy(slots[g.rank], buf + at, p * sizeof(float));
    barrier(s, g, deadline);
    if (g.n == 2) {
      const float *x = slots[0], *y = slots[1];
      float *o = buf + at;
      if (j.max)
        for (size_t i = 0; i < p; i++) o[i] = y[i] > x[i] ? y[i] : x[i];
      else
        for (size_t i = 0; i < p; i++) o[i] = x[i] + y[i];
      g.piece++;
      continue;
    }
    size_t share = round_up((p + g.n - 1) / g.n, 16);
    size_t a = std::min(p, share * g.rank), e = std::min(p, a + share);
    if (j.max)
      reduce_into(buf + at, slots[g.rank], g, slots.data(), a, e,
                  [](float x, float y) { return y > x ? y : x; });
    else
      reduce_into(buf + at, slots[g.rank], g, slots.data(), a, e,
                  [](float x, float y) { return x + y; });
    barrier(s, g, deadline);
    for (int q = 0; q < g.n; q++) {
      size_t qa = std::min(p, share * q), qe = std::min(p, qa + share);
      if (q != g.rank && qe > qa)
        memcpy(buf + at + qa, slots[q] + qa, (qe - qa) * sizeof(float));
    }
    g.piece++;  // the next piece writes the other set: no third barrier
  }
}

// Window k of every rank's part: each rank puts the windows of all parts in
// its slot, and after a barrier sums the window of its own.
void reduce_scatter(State &s, ShmGroup &g, Job &j, steady::time_point deadline) {
  const float *in = static_cast<const float *>(j.in);
  float *out = static_cast<float *>(j.out);
  std::vector<size_t> off(g.n + 1, 0);
  size_t maxc = 0;
  for (int q = 0; q < g.n; q++) {
    off[q + 1] = off[q] + j.counts[q];
    maxc = std::max(maxc, j.counts[q]);
  }
  const size_t w = g.slot / g.n / 16 * 16;
  std::vector<float *> slots(g.n);
  for (size_t at = 0; at < maxc; at += w) {
    for (int q = 0; q < g.n; q++) slots[q] = g.slot_of(q);
    for (int q = 0; q < g.n; q++) {
      size_t len = j.counts[q] > at ? std::min(w, j.counts[q] - at) : 0;
      if (len) memcpy(slots[g.rank] + q * w, in + off[q] + at, len * sizeof(float));
    }
    barrier(s, g, deadline);
    size_t mine = j.counts[g.rank] > at ? std::min(w, j.counts[g.rank] - at) : 0;
    const size_t base = static_cast<size_t>(g.rank) * w;
    for (size_t i = 0; i < mine; i++) {
      float x = slots[0][base + i];
      for (int q = 1; q < g.n; q++) x += slots[q][base + i];
      out[at + i] = x;
    }
    g.piece++;
  }
}

void all_gather(State &s, ShmGroup &g, Job &j, size_t elem, steady::time_point deadline) {
  uint8_t *out = static_cast<uint8_t *>(j.out);
  const uint8_t *in = static_cast<const uint8_t *>(j.in);
  std::vector<size_t> off(g.n + 1, 0);
  size_t maxb = 0;
  for (int q = 0; q < g.n; q++) {
    off[q + 1] = off[q] + j.counts[q] * elem;
    maxb = std::max(maxb, j.counts[q] * elem);
  }
  size_t mine = off[g.rank + 1] - off[g.rank];
  if (mine && in != out + off[g.rank]) memmove(out + off[g.rank], in, mine);
  const size_t w = g.slot * sizeof(float);  // bytes of a rank's window
  for (size_t at = 0; at < maxb; at += w) {
    auto len_of = [&](int q) {
      size_t b = off[q + 1] - off[q];
      return b > at ? std::min(w, b - at) : size_t{0};
    };
    if (len_of(g.rank)) memcpy(g.slot_of(g.rank), out + off[g.rank] + at, len_of(g.rank));
    barrier(s, g, deadline);
    for (int q = 0; q < g.n; q++)
      if (q != g.rank && len_of(q)) memcpy(out + off[q] + at, g.slot_of(q), len_of(q));
    g.piece++;
  }
}

void broadcast(State &s, ShmGroup &g, Job &j, size_t elem, steady::time_point deadline) {
  uint8_t *buf = static_cast<uint8_t *>(j.out);
  const size_t total = j.count * elem, w = g.slot * sizeof(float) * g.n;
  for (size_t at = 0; at < total; at += w) {
    size_t len = std::min(w, total - at);
    uint8_t *set = reinterpret_cast<uint8_t *>(g.slot_of(0));
    if (g.rank == j.root) memcpy(set, buf + at, len);
    barrier(s, g, deadline);
    if (g.rank != j.root) memcpy(buf + at, set, len);
    g.piece++;
  }
}

// Maps the segment rank 0 named; nullptr (errno kept) when it cannot.
std::unique_ptr<ShmGroup> map_segment(const std::string &name, int n, int rank, bool create) {
  auto g = std::make_unique<ShmGroup>();
  g->n = n;
  g->rank = rank;
  // at least 16 floats a part in a reduce-scatter's window
  g->slot = std::max({kMinSlotFloats, kSetFloats / static_cast<size_t>(n) / 16 * 16,
                      16 * static_cast<size_t>(n)});
  g->len = header_bytes(n) + 2 * static_cast<size_t>(n) * g->slot * sizeof(float);
  int fd = shm_open(name.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create) {
    int e = ftruncate(fd, static_cast<off_t>(g->len)) != 0 ? errno
                                                           : posix_fallocate(fd, 0, static_cast<off_t>(g->len));
    if (e) {
      close(fd);
      shm_unlink(name.c_str());
      errno = e;
      return nullptr;
    }
  }
  g->base = mmap(nullptr, g->len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (g->base == MAP_FAILED) return nullptr;
  g->h = static_cast<Header *>(g->base);
  g->sets = reinterpret_cast<float *>(static_cast<char *>(g->base) + header_bytes(n));
  g->descs = reinterpret_cast<AgreeDesc *>(static_cast<char *>(g->base) + descs_at(n));
  pids(g->h)[rank].store(static_cast<int32_t>(getpid()));
  return g;
}

}  // namespace

ShmPeerError::ShmPeerError(int p, const std::string &msg) : std::runtime_error(msg), peer(p) {}

void shm_attach(State &s) {
  if (s.size < 2) return;
  // A rank told not to still takes part, saying no, so that ranks started
  // with different environments agree instead of waiting for each other.
  const char *env = getenv("MEGA_COMM_SHM");
  const bool off = env && strcmp(env, "0") == 0;
  static std::atomic<unsigned> seq{0};
  char name[64] = {0};
  std::unique_ptr<ShmGroup> g;
  if (s.rank == 0 && !off) {
    snprintf(name, sizeof name, "/mega-%d-%u", static_cast<int>(getpid()), seq++);
    g = map_segment(name, s.size, 0, true);
    if (!g) name[0] = '\0';
  }
  // Rank 0 unlinks the name on every way out: once all have mapped it, the
  // mappings keep the segment; on a failure nobody will.
  struct Unlink {
    const char *name;
    ~Unlink() {
      if (name && name[0]) shm_unlink(name);
    }
  } unlink_at_end{s.rank == 0 ? name : nullptr};
  gloo::BroadcastOptions b(s.ctx);
  b.setOutput(name, sizeof name);
  b.setRoot(0);
  b.setTag(kSetupTag);
  b.setTimeout(s.timeout);
  gloo::broadcast(b);
  name[sizeof name - 1] = '\0';
  if (s.rank != 0 && name[0] && !off) g = map_segment(name, s.size, s.rank, false);
  // Every rank's verdict; the segment is used only if all mapped it.
  std::vector<char> ok(s.size, 0);
  char mine = g ? 1 : 0;
  gloo::AllgathervOptions a(s.ctx);
  a.setInput(&mine, 1);
  a.setOutput(ok.data(), std::vector<size_t>(s.size, 1));
  a.setTag(kSetupTag + 1);
  a.setTimeout(s.timeout);
  gloo::allgatherv(a);
  if (std::count(ok.begin(), ok.end(), 1) != s.size) return;
  g->pidfd.assign(s.size, -1);
  g->pid.assign(s.size, 0);
  for (int q = 0; q < s.size; q++) {
    g->pid[q] = pids(g->h)[q].load();
    if (q != s.rank) g->pidfd[q] = pidfd_open(g->pid[q]);
  }
  s.shm.reset(g.release());
}

bool shm_run(State &s, Job &j) {
  if (!s.shm) return false;
  ShmGroup &g = *s.shm;
  const auto deadline = steady::now() + j.timeout;
  const size_t elem = j.dt == MEGA_DT_F32 ? sizeof(float) : 1;
  const AgreeDesc mine = agree_desc(j);
  g.agree_set = g.descs + (g.piece % 2) * static_cast<size_t>(g.n);
  g.agree_set[g.rank] = mine;
  g.agree = &mine;
  switch (j.kind) {
  case Job::ALL_REDUCE: all_reduce(s, g, j, deadline); break;
  case Job::REDUCE_SCATTER: reduce_scatter(s, g, j, deadline); break;
  case Job::ALL_GATHER: all_gather(s, g, j, elem, deadline); break;
  case Job::BROADCAST: broadcast(s, g, j, elem, deadline); break;
  case Job::BARRIER: break;
  }
  if (g.agree) {  // nothing to move: still a piece, to compare
    barrier(s, g, deadline);
    g.piece++;
  }
  return true;
}

void shm_break(State &s, const std::string &why) {
  if (s.shm) mark_broken(*s.shm, s.rank, "rank " + std::to_string(s.rank) + " broke the group: " + why);
}

const char *shm_transport(const State &s) { return s.shm ? "gloo+shm" : "gloo"; }

}  // namespace mega_gloo
