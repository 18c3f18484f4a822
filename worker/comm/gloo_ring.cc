// Collectives of ours on Gloo's P2P, over buffers the communicator lists
// (CollBufs), so that break_comm can wake every wait: the all-reduce and
// reduce-scatter rings (Gloo's all-reduce keeps a scratch buffer out of
// reach; Gloo has no reduce-scatter), the small all-gather in one round,
// and the exchange with both neighbours that checks a collective first.
#include <cstring>

#include <gloo/common/error.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

// Top byte 0x22: beside p2p_slot's 0x20 and ring_slot's 0x21. One slot for
// every collective: a pair matches its messages in the order posted.
constexpr uint64_t kAgreeSlot = uint64_t{0x22} << 56;
constexpr const char *kAgreeWhat = "checking the collective with its peers";

// Gloo's all-reduce cuts at 1M elements too: big enough for a loopback
// write to pay off, small enough that a segment's sum hides the next one's
// transfer.
constexpr size_t kSegmentFloats = size_t{1} << 20;
// Up to this many floats a rank, one segment a chunk: two in flight would
// hide no transfer worth the messages (bench_comm lanes 1024, 2 ranks: a
// median 1.0 ms a call against 1.6 with two).
constexpr size_t kOneSegmentFloats = size_t{1} << 14;

void sum_f32(float *o, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) o[i] += x[i];
}

void max_f32(float *o, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) o[i] = x[i] > o[i] ? x[i] : o[i];
}

// send_then_recv: a ring posts each send before the receive beside it.
// Gloo's TCP pair writes a send's bytes from the caller's thread, holding
// the pair's lock, when the peer's receive was announced already; its
// event loop, finding the lock taken, goes back to epoll_wait, which
// reports the socket readable at once, and spins until the write is done:
// at 2 ranks one pair carries both directions (545,000 epoll_waits in a
// 10 s PP=4 x DP=2 run). A send posted before the peer's receive waits for
// the announcement, and the loop thread writes it. It helps when this rank
// is ahead of its peer: a fifth fewer epoll_waits, bench_comm lanes' 1M
// floats at 2 ranks 4.5 -> 4.1 ms (medians of 4, interleaved).

ms remaining(steady::time_point deadline) {
  auto left = std::chrono::duration_cast<ms>(deadline - steady::now());
  return left.count() < 1 ? ms(1) : left;
}

void wait_recv(gloo::transport::UnboundBuffer *b, steady::time_point deadline, const char *what) {
  if (!b->waitRecv(nullptr, remaining(deadline)))
    throw gloo::IoException(std::string(what) + ": receive aborted");
}

void wait_send(gloo::transport::UnboundBuffer *b, steady::time_point deadline, const char *what) {
  if (!b->waitSend(nullptr, remaining(deadline)))
    throw gloo::IoException(std::string(what) + ": send aborted");
}

// The ring's receive segments: a fresh 2 MB vector a call was zeroed for
// nothing, 4.5% of the cores while every stage's buckets reduced at once
// (perf over --align-grad-reduce at PP=4 x DP=2).
float *ring_scratch(State &s, size_t n) {
  if (s.ring_scratch_n < n) {
    s.ring_scratch.reset(new float[n]);
    s.ring_scratch_n = n;
  }
  return s.ring_scratch.get();
}

}  // namespace

// The buffer is cut into n*K equal segments (the last ones shorter or
// empty), K per rank's chunk: 1 for small chunks, else at least 2.
// Transfer i (0 <= i < M = 2(n-1)K) is segment i%K of a chunk: in the
// first (n-1)K, step k = i/K, rank r sends chunk r-k to r+1 and receives
// chunk r-k-1 from r-1 into a scratch segment, which it adds into its own;
// after them, r holds chunk r+1 reduced, and in the rest it forwards each
// chunk it received last round and receives the next one in place.
// Transfer i sends what transfer i-K received, and the loop waits for
// transfer i-D (D = min(K, 2) in flight) before posting i: what a send
// needs is always in.
void all_reduce_ring(State &s, Job &j) {
  const size_t n = static_cast<size_t>(s.size), r = static_cast<size_t>(s.rank);
  const size_t count = j.count;
  const size_t k_per = (count + n - 1) / n <= kOneSegmentFloats
                           ? 1
                           : std::max<size_t>(2, (count + n * kSegmentFloats - 1) /
                                                     (n * kSegmentFloats));
  const size_t depth = std::min<size_t>(k_per, 2);
  const size_t seg = (count + n * k_per - 1) / (n * k_per);
  const size_t rs_end = (n - 1) * k_per, total = 2 * rs_end;
  float *buf = static_cast<float *>(j.out);
  auto len_of = [&](size_t segment) {
    size_t at = segment * seg;
    return at >= count ? size_t{0} : std::min(seg, count - at);
  };
  // Segment of transfer i: what this rank sends (dir 0) or receives (1).
  auto segment_of = [&](size_t i, int dir) {
    bool rs = i < rs_end;
    size_t step = (rs ? i : i - rs_end) / k_per, q = i % k_per;
    size_t base = rs ? r : r + 1;  // the chunk sent at the phase's step 0
    size_t chunk = (base + 2 * n - step - static_cast<size_t>(dir)) % n;
    return chunk * k_per + q;
  };
  const auto deadline = steady::now() + j.timeout;
  const int left = static_cast<int>((r + n - 1) % n), right = static_cast<int>((r + 1) % n);
  const uint64_t slot = ring_slot(j.tag);
  float *scratch = ring_scratch(s, 2 * seg);
  auto whole = s.ctx->createUnboundBuffer(buf, count * sizeof(float));
  std::unique_ptr<gloo::transport::UnboundBuffer> tmp[2] = {
      s.ctx->createUnboundBuffer(scratch, seg * sizeof(float)),
      s.ctx->createUnboundBuffer(scratch + seg, seg * sizeof(float))};
  CollBufs listed(s);
  listed.add(whole.get());
  listed.add(tmp[0].get());
  listed.add(tmp[1].get());
  for (size_t i = 0; i < total + depth; i++) {
    if (i >= depth) {
      size_t d = i - depth, rseg = segment_of(d, 1), rlen = len_of(rseg);
      if (rlen) {
        if (d < rs_end) {
          wait_recv(tmp[d % 2].get(), deadline, "all_reduce");
          (j.max ? max_f32 : sum_f32)(buf + rseg * seg, scratch + (d % 2) * seg, rlen);
        } else {
          wait_recv(whole.get(), deadline, "all_reduce");
        }
      }
      if (len_of(segment_of(d, 0))) wait_send(whole.get(), deadline, "all_reduce");
    }
    if (i < total) {
      // The send first (send_then_recv)
      size_t sseg = segment_of(i, 0), slen = len_of(sseg);
      if (slen) whole->send(right, slot, sseg * seg * sizeof(float), slen * sizeof(float));
      size_t rseg = segment_of(i, 1), rlen = len_of(rseg);
      if (rlen) {
        if (i < rs_end)
          tmp[i % 2]->recv(left, slot, 0, rlen * sizeof(float));
        else
          whole->recv(left, slot, rseg * seg * sizeof(float), rlen * sizeof(float));
      }
    }
  }
}

// At step k (0..n-2) rank r sends chunk (r-k-1) to r+1 and receives chunk
// (r-k-2) from r-1, adds its own part of that chunk, and forwards the sum
// at the next step; after n-1 steps it holds chunk r summed over all ranks.
// Two scratch chunks alternate so the chunk being forwarded is never the
// one being received.
void reduce_scatter_ring(State &s, Job &j) {
  const int n = s.size, r = s.rank;
  const float *in = static_cast<const float *>(j.in);
  float *out = static_cast<float *>(j.out);
  std::vector<size_t> off(n + 1, 0);
  size_t maxc = 0;
  for (int i = 0; i < n; i++) {
    off[i + 1] = off[i] + j.counts[i];
    if (j.counts[i] > maxc) maxc = j.counts[i];
  }
  if (n == 1) {
    if (j.counts[0] && out != in) memcpy(out, in, j.counts[0] * sizeof(float));
    return;
  }
  if (off[n] == 0) return;
  const auto deadline = steady::now() + j.timeout;
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const uint64_t slot = ring_slot(j.tag);
  // the ring's scratch, kept between calls as the all-reduce's is
  float *scratch[2] = {ring_scratch(s, 2 * maxc), nullptr};
  scratch[1] = scratch[0] + maxc;
  auto src = s.ctx->createUnboundBuffer(const_cast<float *>(in), off[n] * sizeof(float));
  std::unique_ptr<gloo::transport::UnboundBuffer> tmp[2] = {
      s.ctx->createUnboundBuffer(scratch[0], maxc * sizeof(float)),
      s.ctx->createUnboundBuffer(scratch[1], maxc * sizeof(float))};
  CollBufs listed(s);
  listed.add(src.get());
  listed.add(tmp[0].get());
  listed.add(tmp[1].get());
  for (int k = 0; k < n - 1; k++) {
    const int si = (r - k - 1 + 2 * n) % n, ri = (r - k - 2 + 2 * n) % n;
    auto &rbuf = tmp[k % 2];
    gloo::transport::UnboundBuffer *sbuf = k == 0 ? src.get() : tmp[(k + 1) % 2].get();
    size_t soff = k == 0 ? off[si] * sizeof(float) : 0;
    sbuf->send(right, slot, soff, j.counts[si] * sizeof(float));  // first: send_then_recv
    rbuf->recv(left, slot, 0, j.counts[ri] * sizeof(float));
    wait_recv(rbuf.get(), deadline, "reduce_scatter");
    const float *mine = in + off[ri];
    float *acc = scratch[k % 2];
    float *dst = k == n - 2 ? out : acc;  // the last chunk received is ours
    for (size_t i = 0; i < j.counts[ri]; i++) dst[i] = acc[i] + mine[i];
    wait_send(sbuf, deadline, "reduce_scatter");
  }
}

// Every rank sends its part to each other rank and receives theirs, all at
// once: one round where Gloo's ring takes n-1, each waiting for the next
// rank's threads to wake (pipeline_stats' 16 bytes over PP=4 took 7.6 ms a
// call at an iteration's end on 2 busy cores, 3.4 of them waiting for one).
void all_gather_direct(State &s, Job &j, size_t elem) {
  const int n = s.size;
  std::vector<size_t> off(n + 1, 0);
  for (int i = 0; i < n; i++) off[i + 1] = off[i] + j.counts[i] * elem;
  uint8_t *out = static_cast<uint8_t *>(j.out);
  const uint8_t *in = static_cast<const uint8_t *>(j.in);
  size_t mine = off[s.rank + 1] - off[s.rank];
  if (mine && in != out + off[s.rank]) memmove(out + off[s.rank], in, mine);
  const auto deadline = steady::now() + j.timeout;
  const uint64_t slot = ring_slot(j.tag);
  auto whole = s.ctx->createUnboundBuffer(out, off[n]);
  CollBufs listed(s);  // after the buffer, so that it goes first
  listed.add(whole.get());
  int sends = 0, recvs = 0;
  for (int k = 1; k < n; k++) {
    int from = (s.rank + n - k) % n, to = (s.rank + k) % n;
    if (off[from + 1] > off[from]) {
      whole->recv(from, slot, off[from], off[from + 1] - off[from]);
      recvs++;
    }
    if (mine) {
      whole->send(to, slot, off[s.rank], mine);
      sends++;
    }
  }
  while (recvs-- > 0) wait_recv(whole.get(), deadline, "all_gather");
  while (sends-- > 0) wait_send(whole.get(), deadline, "all_gather");
}

// The agreement check on TCP (gloo_agree.cc): each rank sends its
// description to both ring neighbours and checks theirs: every disagreement has a rank on each side that sees it, and
// the others learn of it when those break the group. A rank waits for its
// own sends too, so that its neighbour reads its description before the
// connections close. One small message each way per collective.
void agree_tcp(State &s, Job &j) {
  const int n = s.size;
  if (n < 2) return;
  const int left = (s.rank + n - 1) % n, right = (s.rank + 1) % n;
  const int npeers = n == 2 ? 1 : 2;
  const int peers[2] = {right, left};
  const auto deadline = steady::now() + j.timeout;
  AgreeDesc mine = agree_desc(j), theirs[2] = {};
  auto out = s.ctx->createUnboundBuffer(&mine, sizeof mine);
  std::unique_ptr<gloo::transport::UnboundBuffer> in[2];
  for (int i = 0; i < npeers; i++) in[i] = s.ctx->createUnboundBuffer(&theirs[i], sizeof theirs[i]);
  CollBufs listed(s);  // after the buffers: it must go first (an abort may be using the list)
  listed.add(out.get());
  for (int i = 0; i < npeers; i++) listed.add(in[i].get());
  for (int i = 0; i < npeers; i++) {
    out->send(peers[i], kAgreeSlot, 0, sizeof mine);
    in[i]->recv(peers[i], kAgreeSlot, 0, sizeof theirs[i]);
  }
  for (int i = 0; i < npeers; i++) wait_send(out.get(), deadline, kAgreeWhat);
  for (int i = 0; i < npeers; i++) wait_recv(in[i].get(), deadline, kAgreeWhat);
  for (int i = 0; i < npeers; i++) agree_check(mine, theirs[i], peers[i]);
}

}  // namespace mega_gloo
