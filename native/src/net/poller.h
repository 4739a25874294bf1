// Poller: a thread that waits on many file descriptors (epoll) and timers and calls their
// handlers. The process's poller (Get) holds the listening sockets, so that they cost no
// thread each: every Acceptor (NBD exports, replica servers) registers its listening socket
// and its wake eventfd there. A small fixed set of connection loops (ForConnection) reads
// the established replica connections, both the servers' ends and the engines' (remote
// replicas), so that a connection costs no thread either (docs/architecture.md, "Threads").
//
// Handlers run on the poller's thread, one at a time: they must be short and never wait for
// another handler. Remove() returns once the handler is not running and will not run again
// (called from within the handler itself it only unregisters).
#pragma once

#include <sys/epoll.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <set>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "util/status.h"

namespace mooring {

class Poller {
 public:
  // events: the EPOLL* bits that were ready; 0 when called for the registration's timer.
  using Handler = std::function<void(uint32_t events)>;

  // The process's poller, started on first use (never stopped).
  static Poller& Get();
  // One of the process's connection loops (mr-conn-loop), round robin; they start on first
  // use and are never stopped. Their number: MOORING_CONNECTION_LOOPS (1 to
  // kMaxConnectionLoops), kDefaultConnectionLoops when unset or invalid.
  static Poller& ForConnection();
  static constexpr int kDefaultConnectionLoops = 2;
  static constexpr int kMaxConnectionLoops = 16;
  static int ConnectionLoops();

  // Watches fd for `events` (level-triggered; 0: none yet). Returns an id for Modify/Remove,
  // or 0 with *st set on failure.
  uint64_t Add(int fd, uint32_t events, Handler h, Status* st);
  // Changes the events watched (0: none for now).
  void Modify(uint64_t id, uint32_t events);
  // Calls the handler with events 0 once the monotonic clock reaches at_ms (0: no timer).
  // One timer per registration; a new one replaces the old.
  void SetTimer(uint64_t id, int64_t at_ms);
  // Like SetTimer, but only ever earlier: a timer already due sooner stays. Any thread may
  // call it without losing another's wake-up.
  void ArmTimer(uint64_t id, int64_t at_ms);
  // Unregisters; see above. The fd is not closed.
  void Remove(uint64_t id);

  static int64_t NowMs();

 private:
  explicit Poller(const char* name);
  void Loop();
  void ArmOrSet(uint64_t id, int64_t at_ms, bool earlier_only);
  void SetTimerLocked(uint64_t id, int64_t at_ms, bool earlier_only);

  struct Reg {
    int fd = -1;
    bool in_epoll = false;  // events != 0: in the epoll set
    Handler handler;
    int64_t timer_ms = 0;
  };

  int epfd_ = -1;
  int wake_fd_ = -1;  // SetTimer from another thread shortens the wait
  std::mutex mu_;
  std::condition_variable idle_cv_;  // running_ went back to 0
  std::unordered_map<uint64_t, Reg> regs_;  // guarded by mu_
  std::set<std::pair<int64_t, uint64_t>> timers_;  // guarded by mu_: (at_ms, id) of timer_ms != 0
  uint64_t next_id_ = 1;
  uint64_t running_ = 0;  // the id whose handler runs now (0: none)
  std::thread::id thread_id_;
  const char* name_;
};

}  // namespace mooring
