// Communicators over Gloo: creation, failures and abort, destruction.
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <new>

#include <gloo/common/error.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

// Gloo's own collectives put prefixes 0x01..0x08 in a slot's top byte;
// ours use 0x20 (user P2P tags) and 0x21 (the reduce-scatter ring).
uint64_t p2p_slot(uint32_t tag) {
  return (uint64_t{0x20} << 56) | (uint64_t{tag} << 8);
}
uint64_t ring_slot(uint32_t tag) {
  return (uint64_t{0x21} << 56) | (uint64_t{tag} << 8);
}

std::string clean_what(const char *what) {
  std::string s = what ? what : "";
  // GLOO_ERROR_MSG puts "[/path/file.cc:123] " in front, sometimes twice.
  while (!s.empty() && s[0] == '[') {
    size_t end = s.find("] ");
    if (end == std::string::npos) break;
    std::string inner = s.substr(1, end - 1);
    if (inner.find(".cc:") == std::string::npos &&
        inner.find(".h:") == std::string::npos)
      break;
    s.erase(0, end + 2);
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string State::peer_of(const std::string &msg) const {
  for (size_t j = 0; j < peer_addr.size(); j++) {
    for (const std::string &a : peer_addr[j]) {
      if (a.empty()) continue;
      for (size_t at = msg.find(a); at != std::string::npos; at = msg.find(a, at + 1)) {
        size_t end = at + a.size();  // "...:4444" must not match "...:44441"
        if (end == msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end])))
          return "rank " + std::to_string(j);
      }
    }
  }
  return "";
}

namespace {

struct Classified {
  mega_status status;
  std::string reason;
};

bool mentions_timeout(const std::string &msg) {
  std::string low(msg);
  std::transform(low.begin(), low.end(), low.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return low.find("timeout") != std::string::npos ||
         low.find("timed out") != std::string::npos;
}

Classified classify(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const StoreError &e) {
    return {e.status, e.what()};
  } catch (const ShmPeerError &e) {
    return {MEGA_ERR_PEER, e.what()};
  } catch (const gloo::IoException &e) {
    std::string r = clean_what(e.what());
    return {mentions_timeout(r) ? MEGA_ERR_TIMEOUT : MEGA_ERR_PEER, r};
  } catch (const std::bad_alloc &) {
    return {MEGA_ERR_NOMEM, "out of memory"};
  } catch (const std::exception &e) {
    return {MEGA_ERR_INTERNAL, "gloo: " + clean_what(e.what())};
  } catch (...) {
    return {MEGA_ERR_INTERNAL, "unknown C++ exception"};
  }
}

// Makes every operation in flight on the group fail now. A Gloo wait that
// times out signals an error on every pair of its context (the pairs close,
// their pending operations throw, the peers read EOF); a 1 ms wait on a
// buffer nobody writes is the one public way to trigger that.
void poison(State &s) {
  if (s.size < 2 || !s.ctx || s.poisoned.exchange(true)) return;
  try {
    char b = 0;
    auto ub = s.ctx->createUnboundBuffer(&b, 1);
    ub->waitRecv(nullptr, ms(1));
  } catch (...) {
    // The expected outcome: the timeout error.
  }
}

}  // namespace

mega_status report_locked(State &s, mega_err *err) {
  if (s.aborted) return mega_fail(err, MEGA_ERR_CANCELLED, "%s", s.abort_msg.c_str());
  if (s.cause != MEGA_OK) return mega_fail(err, s.cause, "%s", s.cause_msg.c_str());
  return MEGA_OK;
}

mega_status report(State &s, mega_err *err) {
  std::lock_guard<std::mutex> lock(s.mu);
  return report_locked(s, err);
}

void break_comm(State &s, mega_status st, const std::string &msg, bool abort) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (abort) {
      if (!s.aborted) {
        s.aborted = true;
        s.abort_msg = msg;
        if (s.cause != MEGA_OK) s.abort_msg += "; it had failed before: " + s.cause_msg;
      }
    } else if (s.cause == MEGA_OK && !s.aborted) {
      s.cause = st;
      s.cause_msg = msg;
    }
    s.failed = true;
    // Before any waiter wakes (its free of a request breaks the group
    // too): the peers must read this first cause.
    shm_break(s, msg);
    for (GlooReq *r : s.live) {
      if (r->kind == GlooReq::SEND)
        r->buf->abortWaitSend();
      else
        r->buf->abortWaitRecv();
    }
    mega_err e = {};
    mega_status rs = report_locked(s, &e);
    for (auto &j : s.queue) {
      j->done = true;
      j->status = rs;
      j->msg = e.msg;
    }
    s.queue.clear();
    s.cv.notify_all();
  }
  poison(s);
  // After the pairs are closed, so the running collective's next post fails.
  std::lock_guard<std::mutex> lock(s.mu);
  for (gloo::transport::UnboundBuffer *b : s.coll_bufs) {
    b->abortWaitSend();
    b->abortWaitRecv();
    s.coll_cut = true;
  }
}

mega_status fail(State &s, std::exception_ptr ep, const std::string &what,
                 int peer, mega_err *err) {
  Classified c = classify(ep);
  std::string msg = what + ": ";
  if (c.status == MEGA_ERR_PEER) {
    std::string who = peer >= 0 ? "rank " + std::to_string(peer) : s.peer_of(c.reason);
    msg += (who.empty() ? std::string("a peer") : who) + " of group '" + s.group +
           "' failed or closed its connection (" + c.reason + ")";
  } else if (c.status == MEGA_ERR_TIMEOUT) {
    msg += "timed out (" + c.reason + "); a peer is stuck or gone";
  } else {
    msg += c.reason;
  }
  break_comm(s, c.status, msg, false);
  return report(s, err);
}

}  // namespace mega_gloo

using namespace mega_gloo;

namespace {

void ignore_sigpipe() {
  struct sigaction sa;
  if (sigaction(SIGPIPE, nullptr, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
      sa.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
}

// Gloo names a failed connection by an address of the peer (gloo_mesh.cc).
void name_peers(State &s, const MeshContext &ctx) {
  s.peer_addr.assign(s.size, {});
  for (int j = 0; j < s.size; j++)
    if (j != s.rank) s.peer_addr[j] = ctx.peer_names(j);
}

mega_status create_fail(std::exception_ptr ep, const std::string &what,
                        int timeout_ms, mega_err *err) {
  Classified c = classify(ep);
  if (c.reason.find("File already exists") != std::string::npos)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: the group's keys already exist in the store; use a "
                     "new store prefix (job/attempt) for every rendezvous (%s)",
                     what.c_str(), c.reason.c_str());
  if (c.status == MEGA_ERR_TIMEOUT)
    return mega_fail(err, MEGA_ERR_TIMEOUT,
                     "%s: not every rank joined within %d ms (%s); check that "
                     "all ranks use the same store, prefix, group and size",
                     what.c_str(), timeout_ms, c.reason.c_str());
  if (c.status == MEGA_ERR_PEER)
    return mega_fail(err, MEGA_ERR_PEER, "%s: a peer failed while connecting (%s)",
                     what.c_str(), c.reason.c_str());
  if (c.status == MEGA_ERR_INTERNAL)  // e.g. an address Gloo cannot bind
    return mega_fail(err, MEGA_ERR_IO, "%s: %s", what.c_str(), c.reason.c_str());
  return mega_fail(err, c.status, "%s: %s", what.c_str(), c.reason.c_str());
}

}  // namespace

extern "C" {

mega_status gloo_comm_create(mega_store *store, const char *group, int rank,
                             int size, const char *hostname, int timeout_ms,
                             GlooComm **out, mega_err *err) {
  if (!out) return mega_fail(err, MEGA_ERR_INVALID, "mega_comm_create: out is NULL");
  *out = nullptr;
  if (!store)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "mega_comm_create: store is NULL; open one with "
                     "mega_store_open_file or mega_store_open_kv");
  if (!group || !group[0])
    return mega_fail(err, MEGA_ERR_INVALID, "mega_comm_create: the group name is empty");
  if (size < 1 || rank < 0 || rank >= size)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "mega_comm_create: rank %d is not in a group of size %d",
                     rank, size);
  if (timeout_ms <= 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "mega_comm_create: timeout_ms is %d; it must be > 0, "
                     "since every wait is bounded", timeout_ms);
  ignore_sigpipe();
  std::string what = "creating group '" + std::string(group) + "' (rank " +
                     std::to_string(rank) + " of " + std::to_string(size) + ")";
  try {
    auto s = std::make_shared<State>();
    s->group = group;
    s->rank = rank;
    s->size = size;
    s->timeout = ms(timeout_ms);
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname ? hostname : "127.0.0.1";
    s->dev = create_device(attr);
    auto ctx = std::make_shared<MeshContext>(rank, size);
    ctx->setTimeout(s->timeout);
    GroupStore gs(*store, group, s->timeout);
    ctx->connect(gs, s->dev);
    ctx->name_ends(ctx);
    s->ctx = ctx;
    name_peers(*s, *ctx);
    if (store->here.count(group)) shm_attach(*s);
    auto c = std::make_unique<GlooComm>();
    c->s = s;
    s->thread = std::thread(comm_thread, s);
    *out = c.release();
    return MEGA_OK;
  } catch (...) {
    return create_fail(std::current_exception(), what, timeout_ms, err);
  }
}

void gloo_comm_destroy(GlooComm *comm) {
  if (!comm) return;
  std::shared_ptr<State> s = comm->s;
  delete comm;
  bool busy;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    busy = !s->queue.empty() || s->running || !s->live.empty();
  }
  if (busy)
    break_comm(*s, MEGA_ERR_CANCELLED,
               "group '" + s->group + "' was destroyed with work pending", true);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping = true;
    s->cv.notify_all();
    s->pool_cv.notify_all();
  }
  if (s->thread.joinable()) s->thread.join();
  for (auto &t : s->pool)
    if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->aborted) {
    s->aborted = true;
    s->abort_msg = "group '" + s->group + "' was destroyed";
    s->failed = true;
  }
  // TCP peers see the connections close; shared-memory peers, this.
  shm_break(*s, s->abort_msg);
}

mega_status gloo_comm_status(const GlooComm *comm, mega_err *err) {
  if (!comm) return mega_fail(err, MEGA_ERR_INVALID, "mega_comm_status: comm is NULL");
  return report(*comm->s, err);
}

const char *gloo_comm_transport(const GlooComm *comm) {
  return comm ? shm_transport(*comm->s) : "";
}

void gloo_comm_abort(GlooComm *comm) {
  if (!comm) return;
  State &s = *comm->s;
  break_comm(s, MEGA_ERR_CANCELLED,
             "group '" + s.group + "' (rank " + std::to_string(s.rank) +
                 ") was aborted (mega_comm_abort)",
             true);
}

}  // extern "C"
