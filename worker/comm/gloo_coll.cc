// Collectives over Gloo, run in issue order by each communicator's comm
// thread; the blocking calls are the asynchronous ones plus a wait.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

namespace {

size_t elem_size(mega_dtype dt) { return dt == MEGA_DT_F32 ? sizeof(float) : 1; }

const char *kind_name(Job::Kind k) {
  switch (k) {
  case Job::ALL_REDUCE: return "all_reduce";
  case Job::ALL_GATHER: return "all_gather";
  case Job::BROADCAST: return "broadcast";
  case Job::REDUCE_SCATTER: return "reduce_scatter";
  case Job::BARRIER: return "barrier";
  }
  return "collective";
}

template <typename T>
void all_gather(State &s, Job &j) {
  size_t total = 0, before = 0;
  for (int i = 0; i < s.size; i++) {
    if (i < s.rank) before += j.counts[i];
    total += j.counts[i];
  }
  T *out = static_cast<T *>(j.out);
  const T *in = static_cast<const T *>(j.in);
  bool in_place = in == out + before || j.counts[s.rank] == 0;
  if (total == 0) return;
  if (s.size == 1) {
    if (!in_place) memmove(out, in, total * sizeof(T));
    return;
  }
  if (s.size > 2 && total * sizeof(T) <= kDirectGatherBytes) {
    all_gather_direct(s, j, sizeof(T));
    return;
  }
  gloo::AllgathervOptions o(s.ctx);
  CollBufs listed(s);
  if (!in_place) o.setInput<T>(listed.make(const_cast<T *>(in), j.counts[s.rank] * sizeof(T)));
  o.setOutput<T>(listed.make(out, total * sizeof(T)), j.counts);
  o.setTag(j.tag);
  o.setTimeout(j.timeout);
  gloo::allgatherv(o);
}

template <typename T>
void broadcast(State &s, Job &j) {
  gloo::BroadcastOptions o(s.ctx);
  CollBufs listed(s);
  o.setOutput<T>(listed.make(j.out, j.count * sizeof(T)));
  o.setRoot(j.root);
  o.setTag(j.tag);
  o.setTimeout(j.timeout);
  gloo::broadcast(o);
}

// This thread's CPU time and time runnable but not running, in seconds,
// from Linux's schedstat (kept open); cpu only, runq -1, without it.
class ThreadClock {
 public:
  ThreadClock() { fd_ = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC); }
  ~ThreadClock() {
    if (fd_ >= 0) close(fd_);
  }
  void read(double *cpu, double *runq) {
    char buf[128];
    ssize_t n = fd_ >= 0 ? pread(fd_, buf, sizeof buf - 1, 0) : -1;
    unsigned long long on = 0, wait = 0;
    if (n > 0) {
      buf[n] = '\0';
      if (sscanf(buf, "%llu %llu", &on, &wait) == 2) {
        *cpu = 1e-9 * (double)on;
        *runq = 1e-9 * (double)wait;
        return;
      }
    }
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    *cpu = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    *runq = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace

double wall_now() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

std::string Job::describe(const State &s) const {
  std::string what = kind_name(kind);
  size_t n = count;
  if (kind == ALL_GATHER || kind == REDUCE_SCATTER) {
    n = 0;
    for (size_t c : counts) n += c;
  }
  if (kind != BARRIER)
    what += " of " + std::to_string(n) + (dt == MEGA_DT_F32 ? " floats" : " bytes");
  return what + " (collective #" + std::to_string(tag) + ") in group '" + s.group + "'";
}

void run_job(State &s, Job &j) {
  if (shm_run(s, j)) return;
  agree_tcp(s, j);
  switch (j.kind) {
  case Job::ALL_REDUCE:
    if (j.count == 0 || s.size == 1) return;
    all_reduce_ring(s, j);
    return;
  case Job::ALL_GATHER:
    if (j.dt == MEGA_DT_F32)
      all_gather<float>(s, j);
    else
      all_gather<uint8_t>(s, j);
    return;
  case Job::BROADCAST:
    if (j.count == 0 || s.size == 1) return;
    if (j.dt == MEGA_DT_F32)
      broadcast<float>(s, j);
    else
      broadcast<uint8_t>(s, j);
    return;
  case Job::REDUCE_SCATTER:
    reduce_scatter_ring(s, j);
    return;
  case Job::BARRIER: {
    if (s.size == 1) return;
    gloo::BarrierOptions o(s.ctx);
    o.setTag(j.tag);
    o.setTimeout(j.timeout);
    gloo::barrier(o);
    return;
  }
  }
}

void comm_thread(std::shared_ptr<State> sp) {
  State &s = *sp;
  ThreadClock clock;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] { return s.stopping || !s.queue.empty(); });
    if (s.queue.empty()) return;
    std::shared_ptr<Job> job = s.queue.front();
    s.queue.pop_front();
    job->started = true;
    job->start = steady::now();
    job->start_wall = wall_now();
    s.running = job;
    s.coll_cut = false;
    s.cv.notify_all();  // waiters start counting their timeout now
    bool failed = s.failed;
    lock.unlock();
    mega_err e = {};
    mega_status st = MEGA_OK;
    double cpu0, runq0, cpu1, runq1;
    clock.read(&cpu0, &runq0);
    if (failed) {
      st = report(s, &e);
    } else {
      try {
        run_job(s, *job);
      } catch (const ShmPeerError &pe) {
        st = fail(s, std::current_exception(), job->describe(s), pe.peer, &e);
      } catch (...) {
        st = fail(s, std::current_exception(), job->describe(s), -1, &e);
      }
    }
    clock.read(&cpu1, &runq1);
    double end = wall_now();
    lock.lock();
    // Gloo's algorithms go on after an aborted wait; only a later post
    // throws, and the last wait has none after it.
    if (st == MEGA_OK && s.coll_cut) st = report_locked(s, &e);
    s.running.reset();
    job->done_wall = end;
    job->cpu_s = cpu1 - cpu0;
    job->runq_s = runq0 >= 0 && runq1 >= 0 ? runq1 - runq0 : -1;
    job->done = true;
    job->status = st;
    job->msg = e.msg;
    s.cv.notify_all();
  }
}

}  // namespace mega_gloo

using namespace mega_gloo;

namespace {

mega_status enqueue(GlooComm *comm, const char *fn, std::shared_ptr<Job> job,
                    int timeout_ms, GlooReq **req, mega_err *err) {
  State &s = *comm->s;
  job->timeout = timeout_ms > 0 ? ms(timeout_ms) : s.timeout;
  GlooReq *r;
  try {
    r = new GlooReq();
  } catch (...) {
    return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  }
  r->kind = GlooReq::COLL;
  r->s = comm->s;
  r->job = job;
  job->queued_wall = wall_now();
  std::lock_guard<std::mutex> lock(s.mu);
  mega_status st = report_locked(s, err);
  if (st != MEGA_OK) {
    delete r;
    return st;
  }
  try {
    job->tag = s.coll_seq++;
    s.queue.push_back(job);
  } catch (...) {
    delete r;
    return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  }
  s.cv.notify_all();
  *req = r;
  return MEGA_OK;
}

mega_status start(GlooComm *comm, const char *fn, GlooReq **req,
                  mega_err *err) {
  if (!req) return mega_fail(err, MEGA_ERR_INVALID, "%s: req is NULL", fn);
  *req = nullptr;
  if (!comm) return mega_fail(err, MEGA_ERR_INVALID, "%s: comm is NULL", fn);
  return MEGA_OK;
}

std::shared_ptr<Job> new_job(Job::Kind kind) {
  try {
    auto j = std::make_shared<Job>();
    j->kind = kind;
    return j;
  } catch (...) {
    return nullptr;
  }
}

// Sum of counts, refusing overflow of the byte size.
bool total_of(const size_t *counts, int n, size_t esz, size_t *total) {
  size_t t = 0;
  for (int i = 0; i < n; i++) {
    if (counts[i] > SIZE_MAX / esz - t) return false;
    t += counts[i];
  }
  *total = t;
  return true;
}

}  // namespace

extern "C" {

mega_status gloo_iall_reduce(GlooComm *comm, float *buf, size_t count, bool max,
                             int timeout_ms, GlooReq **req, mega_err *err) {
  const char *fn = "mega_comm_iall_reduce";
  mega_status st = start(comm, fn, req, err);
  if (st != MEGA_OK) return st;
  if (!buf && count)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: buf is NULL for %zu floats", fn, count);
  auto j = new_job(Job::ALL_REDUCE);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  j->out = buf;
  j->count = count;
  j->max = max;
  return enqueue(comm, fn, j, timeout_ms, req, err);
}

mega_status gloo_iall_gather(GlooComm *comm, const void *in, void *out,
                                  const size_t *counts, mega_dtype dt,
                                  int timeout_ms, GlooReq **req,
                                  mega_err *err) {
  const char *fn = "mega_comm_iall_gather";
  mega_status st = start(comm, fn, req, err);
  if (st != MEGA_OK) return st;
  State &s = *comm->s;
  if (!counts) return mega_fail(err, MEGA_ERR_INVALID, "%s: counts is NULL", fn);
  if (dt != MEGA_DT_F32 && dt != MEGA_DT_BYTE)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: unknown dtype %d", fn, (int)dt);
  size_t total;
  if (!total_of(counts, s.size, elem_size(dt), &total))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: counts overflow", fn);
  if (total && !out) return mega_fail(err, MEGA_ERR_INVALID, "%s: out is NULL", fn);
  if (counts[s.rank] && !in) return mega_fail(err, MEGA_ERR_INVALID, "%s: in is NULL", fn);
  auto j = new_job(Job::ALL_GATHER);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  try {
    j->counts.assign(counts, counts + s.size);
  } catch (...) {
    return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  }
  j->in = in;
  j->out = out;
  j->dt = dt;
  return enqueue(comm, fn, j, timeout_ms, req, err);
}

mega_status gloo_ibroadcast(GlooComm *comm, void *buf, size_t count,
                                 mega_dtype dt, int root, int timeout_ms,
                                 GlooReq **req, mega_err *err) {
  const char *fn = "mega_comm_ibroadcast";
  mega_status st = start(comm, fn, req, err);
  if (st != MEGA_OK) return st;
  State &s = *comm->s;
  if (dt != MEGA_DT_F32 && dt != MEGA_DT_BYTE)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: unknown dtype %d", fn, (int)dt);
  if (root < 0 || root >= s.size)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: root %d is not in group '%s' of size %d",
                     fn, root, s.group.c_str(), s.size);
  if (count > SIZE_MAX / elem_size(dt))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: count overflows", fn);
  if (!buf && count) return mega_fail(err, MEGA_ERR_INVALID, "%s: buf is NULL", fn);
  auto j = new_job(Job::BROADCAST);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  j->out = buf;
  j->count = count;
  j->dt = dt;
  j->root = root;
  return enqueue(comm, fn, j, timeout_ms, req, err);
}

mega_status gloo_ireduce_scatter(GlooComm *comm, const float *in,
                                      float *out, const size_t *counts,
                                      int timeout_ms, GlooReq **req,
                                      mega_err *err) {
  const char *fn = "mega_comm_ireduce_scatter";
  mega_status st = start(comm, fn, req, err);
  if (st != MEGA_OK) return st;
  State &s = *comm->s;
  if (!counts) return mega_fail(err, MEGA_ERR_INVALID, "%s: counts is NULL", fn);
  size_t total;
  if (!total_of(counts, s.size, sizeof(float), &total))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: counts overflow", fn);
  if (total && !in) return mega_fail(err, MEGA_ERR_INVALID, "%s: in is NULL", fn);
  if (counts[s.rank] && !out) return mega_fail(err, MEGA_ERR_INVALID, "%s: out is NULL", fn);
  size_t before = 0;
  for (int i = 0; i < s.rank; i++) before += counts[i];
  /* In place: out is this rank's own part of in. The ring reads that part
   * only in its last step, element by element as it writes the sum. */
  bool in_place = out == in + before;
  if (counts[s.rank] && total && !in_place) {
    uintptr_t a = (uintptr_t)in, b = (uintptr_t)out;
    if (b < a + total * sizeof(float) && a < b + counts[s.rank] * sizeof(float))
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: out overlaps in; reduce-scatter needs its input "
                       "intact until the end", fn);
  }
  auto j = new_job(Job::REDUCE_SCATTER);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  try {
    j->counts.assign(counts, counts + s.size);
  } catch (...) {
    return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  }
  j->in = in;
  j->out = out;
  return enqueue(comm, fn, j, timeout_ms, req, err);
}

mega_status gloo_ibarrier(GlooComm *comm, int timeout_ms, GlooReq **req,
                               mega_err *err) {
  const char *fn = "mega_comm_ibarrier";
  mega_status st = start(comm, fn, req, err);
  if (st != MEGA_OK) return st;
  auto j = new_job(Job::BARRIER);
  if (!j) return mega_fail(err, MEGA_ERR_NOMEM, "%s: out of memory", fn);
  return enqueue(comm, fn, j, timeout_ms, req, err);
}

}  // extern "C"
