// Internals of the Gloo communicator shim, shared by gloo_*.cc, whose calls
// go down (test `calls`): gloo_ops.c's table over gloo_comm.cc (creation,
// abort, destruction) and gloo_req.cc (P2P), over gloo_coll.cc (the comm
// thread's collectives), over gloo_ring.cc, gloo_mesh.cc, gloo_store.cc and
// the rest, over gloo_fail.cc (a communicator's failures, which any of them
// may cause), over gloo_shm.cc. Nothing here crosses the C boundary: every
// entry point in comm.h catches all C++ exceptions and turns them into a
// mega_status.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/unbound_buffer.h>

#include "worker/comm/comm.h"
#include "worker/comm/gloo.h"

namespace mega_gloo {

using ms = std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

// A failure reported by the caller's mega_kv_ops, carried through Gloo's
// rendezvous code unchanged.
struct StoreError : std::runtime_error {
  mega_status status;
  StoreError(mega_status s, const std::string &msg)
      : std::runtime_error(msg), status(s) {}
};

// The store seen by one group's rendezvous: keys get "<prefix>/<group>/",
// and every wait is bounded by the group's timeout.
class GroupStore : public gloo::rendezvous::Store {
 public:
  GroupStore(mega_store &base, const std::string &group, ms timeout);
  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys, const ms &timeout) override;
  // Sets key to value, waits for every one of keys, then returns their
  // values: whole (parts 0) or slice part[i] of value i in `parts` equal
  // slices. One call to a store with mega_kv_ops.gather; a set, and a wait
  // and a get per key, otherwise.
  std::vector<std::vector<char>> exchange(const std::string &key, const std::vector<char> &value,
                                          const std::vector<std::string> &keys, uint32_t parts,
                                          const std::vector<uint32_t> &part);

 private:
  mega_store &base_;
  std::string prefix_;
  ms timeout_;
  bool here_;  // every rank of the group is on this node
};

struct Job;

// A group's shared-memory segment (gloo_shm.cc), when all its ranks are on
// this node.
struct ShmGroup;
void shm_free(ShmGroup *g);
struct ShmDeleter {
  void operator()(ShmGroup *g) const { shm_free(g); }
};

// A peer that broke the group or died, seen through shared memory.
struct ShmPeerError : std::runtime_error {
  int peer;
  ShmPeerError(int p, const std::string &msg);
};

// What a rank called (gloo_agree.cc), as it goes to its peers before the
// collective's data: plain bytes, the same layout on every rank.
struct AgreeDesc {
  uint32_t magic;
  uint32_t kind;  // Job::Kind
  uint32_t dt;    // mega_dtype
  int32_t root;   // a broadcast's; else 0
  uint32_t max;   // an all-reduce of maxima
  uint32_t pad;
  uint64_t total;        // elements: the count, or the sum of counts
  uint64_t counts_hash;  // the counts of a gather or scatter; else 0
};

// Ranks that called different collectives (MEGA_ERR_INVALID): peer is the
// rank whose call differs, the message says how.
struct AgreeError : std::runtime_error {
  int peer;
  AgreeError(int p, const std::string &msg);
};

// Gloo's full mesh with a rendezvous of one call per rank (gloo_mesh.cc).
// Gloo's own connectFullMesh reads every other rank's key whole (each holds
// an address for every rank of the group: O(S^2) bytes per rank) with a
// wait and a get apiece, and the ranks before it once more for their
// hostnames: O(S) calls and O(S^2) bytes per rank. Here each rank publishes
// one 36-byte record per peer and fetches only those meant for it, in the
// same call.
class MeshContext : public gloo::rendezvous::Context {
 public:
  MeshContext(int r, int n) : gloo::rendezvous::Context(r, n) {}
  void connect(GroupStore &store, std::shared_ptr<gloo::transport::Device> &dev);
  // How Gloo's messages print rank j (after connect): the other end of the
  // connection to j, and the address j published for this rank. A "$seq"
  // suffix is left out.
  std::vector<std::string> peer_names(int j) const;
  // After connect, with the shared_ptr that holds this context: learns
  // each peer's end of its connection from the peer (an all-to-all), for
  // peer_names. Throws as a collective does.
  void name_ends(const std::shared_ptr<MeshContext> &self);

 private:
  // The record rank j published for this rank (empty before connect): the
  // address its pair listened on.
  std::vector<std::vector<char>> records_;
  // Rank j's end of its connection to this rank, as Gloo prints it.
  std::vector<std::string> ends_;
};

// One communicator. Requests hold a shared_ptr, so a request outliving
// mega_comm_destroy stays safe.
struct State {
  std::string group;
  int rank = 0, size = 1;
  ms timeout{0};
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  // peer_addr[j]: how rank j's addresses print in Gloo's messages, to name
  // the rank behind "Connection closed by peer [ip]:port". A pair that
  // dialled shows the peer's listening address, one that accepted shows the
  // peer's end of the connection; both are kept.
  std::vector<std::vector<std::string>> peer_addr;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  mega_status cause = MEGA_OK;  // first failure; the communicator is broken
  std::string cause_msg;
  bool aborted = false;
  std::string abort_msg;
  std::atomic<bool> failed{false};  // cause != OK || aborted, for fast paths
  std::atomic<bool> poisoned{false};
  std::set<GlooReq *> live;  // posted P2P requests, for abort
  // The running collective's Gloo buffers (CollBufs). Gloo's TCP pair does
  // not wake a wait on a transfer half written to or read from its socket
  // when the pair fails (Pair::signalException skips the unbound buffers of
  // tx_ and rx_), so break_comm aborts these waits itself; coll_cut tells
  // the comm thread that the collective it runs was cut short.
  std::set<gloo::transport::UnboundBuffer *> coll_bufs;
  bool coll_cut = false;
  // Helper threads that wait on P2P requests handed over by mega_req_test
  // (Gloo has no non-blocking completion check, so someone must block).
  std::condition_variable pool_cv;
  std::deque<GlooReq *> pool_queue;
  std::vector<std::thread> pool;
  size_t pool_idle = 0;
  std::deque<std::shared_ptr<Job>> queue;
  std::shared_ptr<Job> running;
  uint32_t coll_seq = 0;
  // The rings' two receive buffers, kept between calls: the all-reduce's
  // segments (at most 2M floats: they are cut at 1M), the reduce-scatter's
  // largest chunk twice. The comm thread's alone.
  std::unique_ptr<float[]> ring_scratch;
  size_t ring_scratch_n = 0;
  // Set at creation when the group's collectives go through shared memory.
  std::unique_ptr<ShmGroup, ShmDeleter> shm;
  bool stopping = false;
  std::thread thread;

  std::string peer_of(const std::string &msg) const;  // "rank 2" or ""
};

// A collective, queued to the comm thread.
struct Job {
  enum Kind { ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE_SCATTER, BARRIER };
  Kind kind;
  const void *in = nullptr;
  void *out = nullptr;
  size_t count = 0;
  std::vector<size_t> counts;
  mega_dtype dt = MEGA_DT_F32;
  bool max = false;  // ALL_REDUCE: the maximum instead of the sum
  int root = 0;
  ms timeout{0};
  uint32_t tag = 0;
  // Guarded by State::mu.
  bool started = false, done = false;
  steady::time_point start;
  // Wall clock (mega_req_times): issued, begun and finished on the comm
  // thread, with that thread's CPU and run-queue seconds over the run.
  double queued_wall = 0, start_wall = 0, done_wall = 0;
  double cpu_s = -1, runq_s = -1;
  mega_status status = MEGA_OK;
  std::string msg;

  std::string describe(const State &s) const;
};

// A communicator's failures (gloo_fail.cc, below every other Gloo file).
// What an exception means: a status, and why (Gloo's text cleaned).
struct Classified {
  mega_status status;
  std::string reason;
};
Classified classify(std::exception_ptr ep);
// Records the failure of `what` (the exception in flight, or ep) as the
// communicator's cause if it is the first, breaks the communicator, and
// returns the status to report, with err filled. peer is the rank the
// operation talked to, or -1.
// hint: what a timeout's "a peer is stuck or gone" goes on with.
mega_status fail(State &s, std::exception_ptr ep, const std::string &what,
                 int peer, mega_err *err, const char *hint = "");
// Reports an already broken or aborted communicator; MEGA_OK if healthy.
mega_status report(State &s, mega_err *err);
mega_status report_locked(State &s, mega_err *err);  // State::mu held
// Marks the communicator broken with (st, msg) unless it already is, then
// wakes every waiter and closes the group's connections.
void break_comm(State &s, mega_status st, const std::string &msg,
                bool abort);

// Exception text without Gloo's "[file:line] " prefixes.
std::string clean_what(const char *what);

// Lists the buffers one collective hands to Gloo in State::coll_bufs while
// it lives. Declare it after whatever owns the buffers (Gloo's options, or
// the buffers themselves), so that it goes first.
class CollBufs {
 public:
  explicit CollBufs(State &s) : s_(s) {}
  ~CollBufs();
  CollBufs(const CollBufs &) = delete;
  CollBufs &operator=(const CollBufs &) = delete;
  // A new buffer over n bytes at p, listed: for an owner declared before
  // this (Gloo's options), never a variable declared after it.
  std::unique_ptr<gloo::transport::UnboundBuffer> make(void *p, size_t n);
  void add(gloo::transport::UnboundBuffer *b);

 private:
  State &s_;
  std::vector<gloo::transport::UnboundBuffer *> mine_;
};

// CLOCK_REALTIME in seconds.
double wall_now();

// The comm thread, and one collective's work (throws on failure).
void comm_thread(std::shared_ptr<State> s);
void run_job(State &s, Job &job);
// The rings on Gloo's P2P (gloo_ring.cc); j.out in place for the all-reduce.
void all_reduce_ring(State &s, Job &j);
void reduce_scatter_ring(State &s, Job &j);
// An all-gather of elem-byte elements in one round (gloo_ring.cc).
void all_gather_direct(State &s, Job &j, size_t elem);
// Up to this many bytes in all, an all-gather of 3 ranks or more goes in
// one round (all_gather_direct) instead of Gloo's ring of n-1.
constexpr size_t kDirectGatherBytes = 64 * 1024;
// Shared memory for a group whose ranks are all on this node (gloo_shm.cc):
// attach at creation (every rank, after the mesh connects; without it, or
// when a rank cannot map the segment, collectives stay on Gloo's TCP);
// shm_run runs a collective there (false: not attached); shm_break tells
// the peers, with why, and wakes every wait.
void shm_attach(State &s);
bool shm_run(State &s, Job &j);
void shm_break(State &s, const std::string &why);
const char *shm_transport(const State &s);
// The agreement check: this rank's description of j and a comparison with
// a peer's that throws AgreeError when they differ (gloo_agree.cc); the
// exchange with the ring neighbours that a collective on TCP begins with
// (gloo_ring.cc, over CollBufs).
AgreeDesc agree_desc(const Job &j);
void agree_check(const AgreeDesc &mine, const AgreeDesc &theirs, int peer);
void agree_tcp(State &s, Job &j);
// A helper thread of the P2P wait pool.
void pool_thread(std::shared_ptr<State> s);

// A pair's socket whose receive buffer holds fewer than kNarrowSegments of
// its segments gets kWindowSegments of them (gloo_sock.cc: on loopback the
// defaults stall 40 ms).
constexpr int kNarrowSegments = 8;
constexpr int kWindowSegments = 128;
// Widens the receive buffer of tc's narrow pair sockets; returns how many.
int widen_receive_windows(gloo::transport::Context &tc, int rank, int size);

// Gloo's TCP device for attr, its event loop thread under SCHED_BATCH
// (gloo_device.cc: woken, it preempted senders holding a pair's lock and
// spun). The calling thread's policy is left as it was.
std::shared_ptr<gloo::transport::Device> create_device(const gloo::transport::tcp::attr &attr);

// Gloo's own collectives put prefixes 0x01..0x08 in a slot's top byte;
// ours use 0x20 (user P2P tags), 0x21 (the rings) and 0x22 (gloo_agree.cc).
// A P2P message's slot holds its tag and 24 bits of a hash of its size
// (bits 40..55 and 0..7): a send and a receive of other sizes never match
// (Gloo's TCP pair would end the process on a send larger than its
// receive); both wait, and time out.
inline uint64_t p2p_slot(uint32_t tag, size_t nbytes) {
  uint64_t h = (uint64_t{nbytes} * 0x9e3779b97f4a7c15ull) >> 40;  // 24 bits
  return (uint64_t{0x20} << 56) | ((h & 0xffff) << 40) | (uint64_t{tag} << 8) | (h >> 16);
}
inline uint64_t ring_slot(uint32_t tag) { return (uint64_t{0x21} << 56) | (uint64_t{tag} << 8); }
// What a P2P timeout adds to "a peer is stuck or gone".
inline const char *const kP2pSizeHint =
    ", or posted another size (a send and its receive must have the same size)";

}  // namespace mega_gloo

struct mega_store {
  std::string prefix;
  std::set<std::string> here;  // groups whose ranks are all on this node
  std::unique_ptr<gloo::rendezvous::FileStore> file;
  std::mutex file_mu;  // FileStore::set appends to a vector
  const mega_kv_ops *ops = nullptr;
  void *ctx = nullptr;
};

struct GlooComm {
  std::shared_ptr<mega_gloo::State> s;
};

struct GlooReq {
  enum Kind { SEND, RECV, COLL } kind;
  std::shared_ptr<mega_gloo::State> s;
  // P2P
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
  int peer = -1;
  uint32_t tag = 0;
  size_t nbytes = 0;
  // Handed to the wait pool (by mega_req_test); guarded by State::mu.
  bool pooled = false, pool_busy = false, pool_done = false;
  mega_status pool_status = MEGA_OK;
  std::string pool_msg;
  // Collective
  std::shared_ptr<mega_gloo::Job> job;
  // Result, once known.
  bool done = false;
  mega_status status = MEGA_OK;
  std::string msg;
};
