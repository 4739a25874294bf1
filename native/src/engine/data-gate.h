// DataGate: the engine's gate between its data path and its control operations.
//
// An RwLock (util/rw-lock.h; writer-preferring, so a steady stream of requests cannot
// starve a snapshot): the data path holds it shared, control operations (snapshot, epoch
// claim, hand-over, rebuild start, shutdown) exclusive. Plus the reads and writes still in
// flight after the thread that started them let go of the shared side (Engine::ReadAsync
// and WriteAsync: the replicas' answers finish them on another thread). lock() waits for
// those too, so an exclusive holder never runs beside one, wherever it is finished.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "util/rw-lock.h"

namespace mooring {

class DataGate {
 public:
  void lock() {
    rw_.lock();
    std::unique_lock<std::mutex> lk(mu_);
    waiting_.store(true);
    cv_.wait(lk, [this] { return detached_.load() == 0; });
    waiting_.store(false);
  }
  void unlock() { rw_.unlock(); }
  void lock_shared() { rw_.lock_shared(); }
  bool try_lock_shared() { return rw_.try_lock_shared(); }
  void unlock_shared() { rw_.unlock_shared(); }

  // Under the shared side: a request goes on after its starter lets go.
  void Detach() { detached_.fetch_add(1); }
  // Any thread, the gate not held: that request is finished.
  void Finish() {
    if (detached_.fetch_sub(1) == 1 && waiting_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
  }

 private:
  RwLock rw_;
  std::atomic<uint64_t> detached_{0};
  std::atomic<bool> waiting_{false};  // an exclusive locker waits for detached_ to reach 0
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace mooring
