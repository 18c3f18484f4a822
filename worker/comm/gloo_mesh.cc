// Gloo's full mesh over our rendezvous: one set and one gather per rank.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>

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
  store.set(key + std::to_string(rank), mine);
  std::vector<std::vector<char>> by_rank(size);
  if (size < 2) return by_rank;
  std::vector<std::string> keys;
  std::vector<uint32_t> part;
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    keys.push_back(key + std::to_string(j));
    part.push_back(static_cast<uint32_t>(rank < j ? rank : rank - 1));
  }
  std::vector<std::vector<char>> got = store.gather(keys, static_cast<uint32_t>(size - 1), part);
  for (size_t k = 0; k < keys.size(); k++) {
    int j = static_cast<int>(k) < rank ? static_cast<int>(k) : static_cast<int>(k) + 1;
    get_record(got[k], j);  // checks it before anything uses it
    by_rank[j] = std::move(got[k]);
  }
  return by_rank;
}

}  // namespace

std::vector<std::string> MeshContext::peer_names(int j) const {
  std::vector<std::string> out;
  if (j < 0 || static_cast<size_t>(j) >= records_.size()) return out;
  for (const std::vector<char> *r : {&ends_[j], &records_[j]}) {
    try {
      if (!r->empty()) out.push_back(no_seq(get_record(*r, j).str()));
    } catch (...) {
      // An unnamed peer is reported as "a peer".
    }
  }
  return out;
}


// Two rounds: under "<r>" each pair's listening address, as Gloo's own
// rendezvous has (whole), then, connected, under "ends/<r>" each pair's own
// end of its connection: a pair that accepted prints the peer's end, not
// the address the peer published, in its errors, and only the peer knows it
// (Gloo keeps it from us).
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
    std::vector<char> ends;
    for (int j = 0; j < size; j++)
      if (j != rank) put_record(ends, tc->getPair(j)->address());
    ends_ = exchange(store, "ends/", rank, size, ends);
  }
  device_ = dev;
  transportContext_ = std::move(tc);
}

}  // namespace mega_gloo
