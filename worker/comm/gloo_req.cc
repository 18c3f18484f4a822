// P2P over Gloo unbound buffers, and the request handle shared with the
// collectives: wait, test, free.
#include <new>
#include <system_error>

#include "worker/comm/gloo_internal.hh"

using namespace mega_gloo;

namespace {

std::string describe(const GlooReq &r) {
  bool send = r.kind == GlooReq::SEND;
  return std::string(send ? "send" : "recv") + " of " + std::to_string(r.nbytes) +
         " bytes " + (send ? "to" : "from") + " rank " + std::to_string(r.peer) +
         " (tag " + std::to_string(r.tag) + ") in group '" + r.s->group + "'";
}

// Records the result; a finished P2P request leaves the abort list.
void finish_locked(State &s, GlooReq *r, mega_status st, const char *msg) {
  r->done = true;
  r->status = st;
  r->msg = st == MEGA_OK ? "" : msg;
  if (r->kind != GlooReq::COLL) s.live.erase(r);
}

void finish(State &s, GlooReq *r, mega_status st, const char *msg) {
  std::lock_guard<std::mutex> lock(s.mu);
  finish_locked(s, r, st, msg);
}

mega_status cached(const GlooReq *r, mega_err *err) {
  if (r->status == MEGA_OK) return MEGA_OK;
  return mega_fail(err, r->status, "%s", r->msg.c_str());
}

ms at_least_1ms(ms t) { return t.count() < 1 ? ms(1) : t; }

// Blocks in Gloo until the P2P request completes (or fails, or is aborted).
mega_status gloo_wait(GlooReq &r, ms t, mega_err *err) {
  State &s = *r.s;
  try {
    bool ok = r.kind == GlooReq::SEND ? r.buf->waitSend(nullptr, t)
                                       : r.buf->waitRecv(nullptr, t);
    if (ok) return MEGA_OK;
    mega_status st = report(s, err);  // aborted by break_comm
    return st != MEGA_OK ? st
                         : mega_fail(err, MEGA_ERR_CANCELLED, "%s: cancelled",
                                     describe(r).c_str());
  } catch (...) {
    return fail(s, std::current_exception(), describe(r), r.peer, err, kP2pSizeHint);
  }
}

mega_status post(GlooComm *comm, GlooReq::Kind kind, void *buf,
                 size_t nbytes, int peer, uint32_t tag, GlooReq **req,
                 mega_err *err) {
  const char *fn = kind == GlooReq::SEND ? "mega_comm_isend" : "mega_comm_irecv";
  if (!req) return mega_fail(err, MEGA_ERR_INVALID, "%s: req is NULL", fn);
  *req = nullptr;
  if (!comm) return mega_fail(err, MEGA_ERR_INVALID, "%s: comm is NULL", fn);
  State &s = *comm->s;
  if (peer < 0 || peer >= s.size || peer == s.rank)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: peer rank %d is not another rank of group '%s' "
                     "(rank %d of %d)", fn, peer, s.group.c_str(), s.rank, s.size);
  if (!buf && nbytes)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: buf is NULL for %zu bytes", fn, nbytes);
  if (s.failed) return report(s, err);
  GlooReq *r = nullptr;
  try {
    r = new GlooReq();
    r->kind = kind;
    r->s = comm->s;
    r->peer = peer;
    r->tag = tag;
    r->nbytes = nbytes;
    r->buf = s.ctx->createUnboundBuffer(buf, nbytes);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.live.insert(r);
    }
    if (kind == GlooReq::SEND)
      r->buf->send(peer, p2p_slot(tag, nbytes), 0, nbytes);
    else
      r->buf->recv(peer, p2p_slot(tag, nbytes), 0, nbytes);
  } catch (...) {
    std::exception_ptr ep = std::current_exception();
    mega_status st;
    if (r && r->buf) {
      st = fail(s, ep, describe(*r), peer, err);
      std::lock_guard<std::mutex> lock(s.mu);
      s.live.erase(r);
    } else {
      st = mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
    }
    delete r;
    return st;
  }
  *req = r;
  return MEGA_OK;
}

mega_status wait_p2p(GlooReq *r, ms t, mega_err *err) {
  State &s = *r->s;
  mega_err e = {};
  if (!r->pooled) {
    mega_status st = s.failed ? report(s, &e) : gloo_wait(*r, t, &e);
    finish(s, r, st, e.msg);
    return cached(r, err);
  }
  // A helper thread is blocked in Gloo for this request: wait for it.
  std::unique_lock<std::mutex> lock(s.mu);
  auto deadline = steady::now() + t;
  while (!r->pool_done) {
    if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout &&
        !r->pool_done) {
      lock.unlock();
      break_comm(s, MEGA_ERR_TIMEOUT,
                 describe(*r) + ": not done after " + std::to_string(t.count()) +
                     " ms; a peer is stuck or gone" + kP2pSizeHint,
                 false);
      lock.lock();
      s.cv.wait(lock, [&] { return r->pool_done; });
    }
  }
  finish_locked(s, r, r->pool_status, r->pool_msg.c_str());
  lock.unlock();
  return cached(r, err);
}

mega_status wait_coll(GlooReq *r, ms t, mega_err *err) {
  State &s = *r->s;
  Job &j = *r->job;
  // Let Gloo's own timeout (same length) speak first when both fire.
  const ms grace(100);
  const auto called = steady::now();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (j.done) {
      finish_locked(s, r, j.status, j.msg.c_str());
      break;
    }
    if (s.failed) {
      mega_err e = {};
      mega_status st = report_locked(s, &e);
      finish_locked(s, r, st, e.msg);
      break;
    }
    if (!j.started) {
      // Queued behind collectives that are bounded by their own timeouts;
      // the comm thread wakes us when this one starts.
      s.cv.wait_for(lock, t);
      continue;
    }
    auto deadline = std::max(j.start, called) + t + grace;
    if (steady::now() >= deadline) {
      lock.unlock();
      break_comm(s, MEGA_ERR_TIMEOUT,
                 j.describe(s) + ": not done after " + std::to_string(t.count()) +
                     " ms; a peer is stuck or gone",
                 false);
      lock.lock();
      continue;
    }
    s.cv.wait_until(lock, deadline);
  }
  lock.unlock();
  return cached(r, err);
}

}  // namespace

namespace mega_gloo {

void pool_thread(std::shared_ptr<State> sp) {
  State &s = *sp;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.pool_cv.wait(lock, [&] { return s.stopping || !s.pool_queue.empty(); });
    if (s.pool_queue.empty()) return;
    GlooReq *r = s.pool_queue.front();
    s.pool_queue.pop_front();
    s.pool_idle--;
    bool failed = s.failed;
    lock.unlock();
    mega_err e = {};
    mega_status st = failed ? report(s, &e) : gloo_wait(*r, s.timeout, &e);
    lock.lock();
    r->pool_done = true;
    r->pool_busy = false;
    r->pool_status = st;
    r->pool_msg = e.msg;
    s.pool_idle++;
    s.cv.notify_all();
  }
}

}  // namespace mega_gloo

extern "C" {

mega_status gloo_isend(GlooComm *comm, const void *buf, size_t nbytes,
                            int peer, uint32_t tag, GlooReq **req,
                            mega_err *err) {
  // Gloo's buffer type is not const-aware; a send only reads it.
  return post(comm, GlooReq::SEND, const_cast<void *>(buf), nbytes, peer, tag,
              req, err);
}

mega_status gloo_irecv(GlooComm *comm, void *buf, size_t nbytes,
                            int peer, uint32_t tag, GlooReq **req,
                            mega_err *err) {
  return post(comm, GlooReq::RECV, buf, nbytes, peer, tag, req, err);
}

mega_status gloo_req_wait(GlooReq *req, int timeout_ms, mega_err *err) {
  if (!req) return mega_fail(err, MEGA_ERR_INVALID, "mega_req_wait: req is NULL");
  if (req->done) return cached(req, err);
  ms t = at_least_1ms(timeout_ms > 0 ? ms(timeout_ms) : req->s->timeout);
  return req->kind == GlooReq::COLL ? wait_coll(req, t, err)
                                     : wait_p2p(req, t, err);
}

mega_status gloo_req_test(GlooReq *req, bool *done, mega_err *err) {
  if (!req || !done)
    return mega_fail(err, MEGA_ERR_INVALID, "mega_req_test: req or done is NULL");
  *done = false;
  if (req->done) {
    *done = true;
    return cached(req, err);
  }
  State &s = *req->s;
  std::unique_lock<std::mutex> lock(s.mu);
  if (req->kind == GlooReq::COLL) {
    if (req->job->done) {
      finish_locked(s, req, req->job->status, req->job->msg.c_str());
    } else if (s.failed) {
      mega_err e = {};
      mega_status st = report_locked(s, &e);
      finish_locked(s, req, st, e.msg);
    }
  } else if (req->pooled) {
    if (req->pool_done)
      finish_locked(s, req, req->pool_status, req->pool_msg.c_str());
  } else if (s.failed) {
    mega_err e = {};
    mega_status st = report_locked(s, &e);
    finish_locked(s, req, st, e.msg);
  } else {
    // Hand the request to a helper thread that blocks in Gloo for it.
    try {
      s.pool_queue.push_back(req);
      if (s.pool_idle < s.pool_queue.size()) {
        s.pool.emplace_back(pool_thread, req->s);
        s.pool_idle++;
      }
    } catch (...) {
      if (!s.pool_queue.empty() && s.pool_queue.back() == req) s.pool_queue.pop_back();
      return mega_fail(err, MEGA_ERR_NOMEM,
                       "mega_req_test: cannot start a helper thread");
    }
    req->pooled = true;
    req->pool_busy = true;
    s.pool_cv.notify_one();
  }
  lock.unlock();
  if (!req->done) return MEGA_OK;
  *done = true;
  return cached(req, err);
}

void gloo_req_free(GlooReq *req) {
  if (!req) return;
  State &s = *req->s;
  std::unique_lock<std::mutex> lock(s.mu);
  if (req->kind == GlooReq::COLL) {
    if (!req->job->done) {
      lock.unlock();
      break_comm(s, MEGA_ERR_CANCELLED,
                 req->job->describe(s) + " was freed before it completed", false);
      lock.lock();
      // The comm thread must let go of the caller's buffers first.
      s.cv.wait(lock, [&] { return req->job->done; });
    }
  } else {
    bool finished = req->done || (req->pooled && req->pool_done);
    if (!finished) {
      lock.unlock();
      break_comm(s, MEGA_ERR_CANCELLED, describe(*req) + " was freed before it completed",
                 false);
      lock.lock();
      s.cv.wait(lock, [&] { return !req->pool_busy; });
    }
    s.live.erase(req);
  }
  lock.unlock();
  // Destroying Gloo's buffer waits until its I/O thread lets go of the memory.
  delete req;
}

bool gloo_req_times(const GlooReq *req, mega_req_times *t) {
  *t = mega_req_times{};
  if (!req || req->kind != GlooReq::COLL || !req->done) return false;
  std::lock_guard<std::mutex> lock(req->s->mu);
  const Job &j = *req->job;
  if (!j.done) return false;  // failed before the comm thread got to it
  *t = mega_req_times{j.queued_wall, j.start_wall, j.done_wall, j.cpu_s, j.runq_s};
  return true;
}

}  // extern "C"
