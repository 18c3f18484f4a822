// Before a collective moves data its ranks check that they called the same
// one: the operation, the element type, the sizes, the root. Gloo's TCP pair
// enforces on its event loop thread that a message fits the receive posted
// for it, and an exception there is std::terminate; through shared memory a
// rank would read past what its peers wrote. Ranks disagree when they build
// other models (another --vocab-file on each node) or issue collectives in
// another order; each then fails with MEGA_ERR_INVALID naming both calls.
#include <cstring>

#include <gloo/common/error.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

constexpr uint32_t kMagic = 0x4d474147;  // "MGAG"

const char *op_name(uint32_t kind) {
  switch (kind) {
  case Job::ALL_REDUCE: return "all_reduce";
  case Job::ALL_GATHER: return "all_gather";
  case Job::BROADCAST: return "broadcast";
  case Job::REDUCE_SCATTER: return "reduce_scatter";
  case Job::BARRIER: return "barrier";
  }
  return "an unknown collective";
}

// What a rank called, as the message names it: "all_reduce of 200 floats",
// "broadcast of 64 bytes from root 1".
std::string call_text(const AgreeDesc &d) {
  std::string t = op_name(d.kind);
  if (d.kind == Job::ALL_REDUCE && d.max) t += " (max)";
  if (d.kind != Job::BARRIER)
    t += " of " + std::to_string(d.total) + (d.dt == MEGA_DT_F32 ? " floats" : " bytes");
  if (d.kind == Job::BROADCAST) t += " from root " + std::to_string(d.root);
  return t;
}

uint64_t fnv(const std::vector<size_t> &v) {
  uint64_t h = 1469598103934665603ull;
  for (size_t x : v)
    for (int b = 0; b < 8; b++) {
      h ^= (uint64_t{x} >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  return h;
}

}  // namespace

AgreeError::AgreeError(int p, const std::string &msg) : std::runtime_error(msg), peer(p) {}

AgreeDesc agree_desc(const Job &j) {
  AgreeDesc d{};
  d.magic = kMagic;
  d.kind = static_cast<uint32_t>(j.kind);
  d.dt = static_cast<uint32_t>(j.dt);
  d.max = j.kind == Job::ALL_REDUCE && j.max;
  d.root = j.kind == Job::BROADCAST ? j.root : 0;
  if (j.kind == Job::ALL_GATHER || j.kind == Job::REDUCE_SCATTER) {
    for (size_t c : j.counts) d.total += c;
    d.counts_hash = fnv(j.counts);
  } else if (j.kind != Job::BARRIER) {
    d.total = j.count;
  }
  return d;
}

void agree_check(const AgreeDesc &mine, const AgreeDesc &theirs, int peer) {
  if (theirs.magic != kMagic)
    throw AgreeError(peer, "rank " + std::to_string(peer) +
                               " sent no description of its collective (a megaw of "
                               "another version?)");
  bool same = mine.kind == theirs.kind && mine.dt == theirs.dt && mine.max == theirs.max &&
              mine.root == theirs.root && mine.total == theirs.total &&
              mine.counts_hash == theirs.counts_hash;
  if (same) return;
  std::string m = "rank " + std::to_string(peer) + " called " + call_text(theirs);
  m += ", this rank " + call_text(mine);
  if (mine.counts_hash != theirs.counts_hash && mine.total == theirs.total)
    m += ", split otherwise among the ranks";
  m += "; every rank of a group must call the same collectives with the same sizes, in the "
       "same order (do its ranks build the same model? another --vocab-file, checkpoint or "
       "flag on one node changes the sizes)";
  throw AgreeError(peer, m);
}

}  // namespace mega_gloo
