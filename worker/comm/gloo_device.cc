// Gloo's TCP device, with an event loop that never preempts a sender.
//
// Gloo's loop thread busy-waits: when a pair's lock is held (by a thread
// posting a send, which writes in place under it), handleEvents returns
// and the level-triggered epoll_wait reports the socket again at once.
// Woken by a write, the loop of one end preempted the other end's sender
// while that sender held its pair's lock, and the two ends' loops spun
// until a time slice ran out: on two cores at PP=4 x DP=2, a pipeline
// send or receive took 1-5 ms to post (involuntary switches, 0.1 ms of
// CPU), a few per iteration, and the data-parallel replicas drifted
// apart by as much. SCHED_BATCH has no wakeup preemption; a loop thread
// still runs at once on an idle core and gets its fair share otherwise.
// It also made a 1M-float all-reduce between two ranks (bench_comm
// lanes) about a fifth faster. Gloo starts the thread when the device is
// made and keeps it from us; a thread inherits its creator's policy.
#include <pthread.h>
#include <sched.h>

#include <gloo/transport/tcp/device.h>

#include "worker/comm/gloo_internal.hh"

namespace mega_gloo {

std::shared_ptr<gloo::transport::Device> create_device(const gloo::transport::tcp::attr &attr) {
  int policy;
  sched_param mine{};
  bool batch = pthread_getschedparam(pthread_self(), &policy, &mine) == 0 &&
               policy == SCHED_OTHER;
  if (batch) {
    sched_param zero{};
    batch = pthread_setschedparam(pthread_self(), SCHED_BATCH, &zero) == 0;
  }
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    if (batch) pthread_setschedparam(pthread_self(), policy, &mine);
    throw;
  }
  if (batch) pthread_setschedparam(pthread_self(), policy, &mine);
  return dev;
}

}  // namespace mega_gloo
