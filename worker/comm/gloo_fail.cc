// A communicator's failures: the first cause, breaking the group (every
// wait woken, the pairs closed) and reporting it, and the buffers of the
// running collective (CollBufs) that breaking wakes. Every other Gloo file
// calls down into these when something fails.
#include <algorithm>
#include <cctype>
#include <new>

#include <gloo/common/error.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

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

bool mentions_timeout(const std::string &msg) {
  std::string low(msg);
  std::transform(low.begin(), low.end(), low.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return low.find("timeout") != std::string::npos ||
         low.find("timed out") != std::string::npos;
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

Classified classify(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const StoreError &e) {
    return {e.status, e.what()};
  } catch (const ShmPeerError &e) {
    return {MEGA_ERR_PEER, e.what()};
  } catch (const AgreeError &e) {
    return {MEGA_ERR_INVALID, e.what()};
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
                 int peer, mega_err *err, const char *hint) {
  Classified c = classify(ep);
  std::string msg = what + ": ";
  if (c.status == MEGA_ERR_PEER) {
    std::string who = peer >= 0 ? "rank " + std::to_string(peer) : s.peer_of(c.reason);
    msg += (who.empty() ? std::string("a peer") : who) + " of group '" + s.group +
           "' failed or closed its connection (" + c.reason + ")";
  } else if (c.status == MEGA_ERR_TIMEOUT) {
    msg += "timed out (" + c.reason + "); a peer is stuck or gone" + hint;
  } else {
    msg += c.reason;
  }
  break_comm(s, c.status, msg, false);
  return report(s, err);
}

CollBufs::~CollBufs() {
  std::lock_guard<std::mutex> lock(s_.mu);
  for (gloo::transport::UnboundBuffer *b : mine_) s_.coll_bufs.erase(b);
}

std::unique_ptr<gloo::transport::UnboundBuffer> CollBufs::make(void *p, size_t n) {
  auto b = s_.ctx->createUnboundBuffer(p, n);
  add(b.get());
  return b;
}

void CollBufs::add(gloo::transport::UnboundBuffer *b) {
  mine_.reserve(mine_.size() + 1);  // may throw; the insert below must not fail half done
  std::lock_guard<std::mutex> lock(s_.mu);
  s_.coll_bufs.insert(b);
  mine_.push_back(b);
}

}  // namespace mega_gloo
