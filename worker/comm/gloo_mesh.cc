// Gloo's full mesh over our rendezvous: one gather (with the rank's set) per
// rank, and the ends of the connections over the mesh itself.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>

#include <gloo/alltoall.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

namespace tcp = gloo::transport::tcp;

// A pair's address as a record: its sockaddr (sockaddr_in6 is the largest
// the tcp transport binds) and sequence number. Gloo's own bytes are a whole
// sockaddr_storage, 136 bytes, mostly zeros.
constexpr size_t kSockaddr = 28;
constexpr size_t kRecord = kSockaddr + 8;
// The tag of the all-to-all that names the ends (mega's own count up from 0).
constexpr uint32_t kEndsTag = 0xfffffff0u;
static_assert(sizeof(sockaddr_in6) <= kSockaddr, "sockaddr_in6 no longer fits a record");

void put_record(std::vector<char> &out, const gloo::transport::Address &addr) {
  const auto *a = dynamic_cast<const tcp::Address *>(&addr);
  if (!a) throw std::runtime_error("the rendezvous knows only the tcp transport's addresses");
  const sockaddr_storage &ss = a->getSockaddr();
  const char *p = reinterpret_cast<const char *>(&ss);
  out.insert(out.end(), p, p + kSockaddr);
  int64_t seq = a->getSeq();
  p = reinterpret_cast<const char *>(&seq);
  out.insert(out.end(), p, p + sizeof seq);
}

tcp::Address get_record(const std::vector<char> &rec, int from) {
  if (rec.size() != kRecord)
    throw StoreError(MEGA_ERR_PEER, "rank " + std::to_string(from) + " published a record of " +
                                        std::to_string(rec.size()) + " bytes, not " +
                                        std::to_string(kRecord) + " (another megaw version?)");
  sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  memcpy(&ss, rec.data(), kSockaddr);
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
    throw StoreError(MEGA_ERR_PEER, "rank " + std::to_string(from) +
                                        " published an address of family " +
                                        std::to_string(ss.ss_family));
  int64_t seq;
  memcpy(&seq, rec.data() + kSockaddr, sizeof seq);
  return tcp::Address(ss, static_cast<tcp::sequence_number_t>(seq));
}

// The host part of a record, to count the ranks before this one on the
// same host (Gloo's "local rank"; it counts by hostname, the tcp transport
// does not read it).
std::string host_of(const std::vector<char> &rec) {
  sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  memcpy(&ss, rec.data(), kSockaddr);
  if (ss.ss_family == AF_INET) {
    const auto *in = reinterpret_cast<const sockaddr_in *>(&ss);
    return std::string(reinterpret_cast<const char *>(&in->sin_addr), sizeof in->sin_addr);
  }
  const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(&ss);
  return std::string(reinterpret_cast<const char *>(&in6->sin6_addr), sizeof in6->sin6_addr);
}

std::string no_seq(const std::string &a) { return a.substr(0, a.find('$')); }

// Rank r's records under key: one per other rank in rank order (r
// skipped), so the one for rank j is slice (j < r ? j : j - 1) of size - 1.
// Returns the records the others published for this rank, by rank.
std::vector<std::vector<char>> exchange(GroupStore &store, const std::string &key, int rank,
                                        int size, const std::vector<char> &mine) {
  std::vector<std::vector<char>> by_rank(size);
  std::vector<std::string> keys;
  std::vector<uint32_t> part;
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    keys.push_back(key + std::to_string(j));
    part.push_back(static_cast<uint32_t>(rank < j ? rank : rank - 1));
  }
  std::vector<std::vector<char>> got = store.exchange(
      key + std::to_string(rank), mine, keys, static_cast<uint32_t>(size - 1), part);
  for (size_t k = 0; k < keys.size(); k++) {
    int j = static_cast<int>(k) < rank ? static_cast<int>(k) : static_cast<int>(k) + 1;
    get_record(got[k], j);  // checks it before anything uses it
    by_rank[j] = std::move(got[k]);
  }
  return by_rank;
}

}  // namespace

// A pair that accepted its connection prints the peer's end of it in its
// errors (an ephemeral port), not the address the peer published, and only
// the peer knows it (Gloo keeps the socket from us). So each rank sends
// every peer its own end of their connection over that connection: an
// all-to-all of 36-byte records on the new mesh, no second round through
// the store (and so none at the coordinator).
void MeshContext::name_ends(const std::shared_ptr<MeshContext> &self) {
  ends_.assign(size, {});
  if (size < 2) return;
  std::vector<char> out(static_cast<size_t>(size) * kRecord), in(out.size());
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    std::vector<char> rec;
    put_record(rec, transportContext_->getPair(j)->address());
    memcpy(out.data() + static_cast<size_t>(j) * kRecord, rec.data(), kRecord);
  }
  gloo::AlltoallOptions o(self);
  o.setInput(out.data(), out.size());
  o.setOutput(in.data(), in.size());
  o.setTag(kEndsTag);
  gloo::alltoall(o);
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    auto at = in.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(j) * kRecord);
    ends_[j] = no_seq(get_record(std::vector<char>(at, at + kRecord), j).str());
  }
}

std::vector<std::string> MeshContext::peer_names(int j) const {
  std::vector<std::string> out;
  if (j < 0 || static_cast<size_t>(j) >= records_.size()) return out;
  if (static_cast<size_t>(j) < ends_.size() && !ends_[j].empty()) out.push_back(ends_[j]);
  try {
    if (!records_[j].empty()) out.push_back(no_seq(get_record(records_[j], j).str()));
  } catch (...) {
    // An unnamed peer is reported as "a peer".
  }
  return out;
}

// Under "<r>" each pair's listening address, as Gloo's own rendezvous has
// (whole); the pairs connect as Gloo's connectFullMesh connects them.
void MeshContext::connect(GroupStore &store, std::shared_ptr<gloo::transport::Device> &dev) {
  auto tc = dev->createContext(rank, size);
  tc->setTimeout(getTimeout());
  std::vector<char> mine;
  for (int i = 0; i < size; i++)
    if (i != rank) put_record(mine, tc->createPair(i)->address());
  records_ = exchange(store, "", rank, size, mine);
  if (size > 1) {
    std::string me = mine.empty() ? "" : host_of(std::vector<char>(mine.begin(),
                                                                  mine.begin() + kRecord));
    int local = 0;
    for (int j = 0; j < rank; j++) local += host_of(records_[j]) == me;
    // Gloo's order: every rank connects its pairs by increasing peer rank.
    for (int j = 0; j < size; j++) {
      if (j == rank) continue;
      auto &pair = tc->getPair(j);
      pair->setLocalRank(local);
      pair->connect(get_record(records_[j], j).bytes());
    }
    widen_receive_windows(*tc, rank, size);
  }
  device_ = dev;
  transportContext_ = std::move(tc);
}

}  // namespace mega_gloo
