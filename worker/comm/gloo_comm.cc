// Communicators over Gloo: creation, abort, destruction (their failures:
// gloo_fail.cc).
#include <signal.h>

#include <new>

#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include "worker/comm/gloo_internal.hh"

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
