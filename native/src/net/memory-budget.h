// MemoryBudget: the bytes of request payloads and reply buffers that all the connections of
// one server (an NBD export, a replica server) may hold at once. A connection's reader
// acquires a request's bytes before it reads the payload or queues the request, and the
// bytes are released once the reply has been sent. A reader that does not get them waits,
// and while it waits it reads nothing more from its socket (back-pressure); its client sees
// a slower server, never an error.
//
// Progress: a reserve past the limit is kept for the connections the server trusts to give
// bytes back (`reserve_ok`: those that take their replies), so that peers holding the budget
// cannot lock a well-behaved client out; a waiting reader calls `on_wait` every slice, with
// which a server drops the connections that hold budget without reading their replies; and
// a request always fits an empty budget, however large. So at most limit + reserve (or one
// request) is ever held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

namespace mooring {

// While a server's budget is exhausted, a connection whose replies have made no progress for
// this long is dropped (engines and QEMU read their replies at once; QEMU's reconnect-delay
// re-sends): Acceptor::DropStalled.
constexpr int kStalledUnderPressureMs = 2000;
// A connection with a reply stuck longer than this is not "responsive": it may not use the
// budget's reserve.
constexpr int kResponsiveStallMs = 200;

class MemoryBudget {
 public:
  // How often a waiting reader re-checks whether it should stop waiting.
  static constexpr int kWaitSliceMs = 100;

  MemoryBudget(uint64_t limit_bytes, uint64_t reserve_bytes) : limit_(limit_bytes), reserve_(reserve_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes`, waiting while they do not fit; `reserve_ok()` says whether the caller's
  // connection may use the reserve (asked again after each wait). Returns false, taking
  // nothing, once `give_up()` is true. `on_wait` (may be empty) runs every slice while it
  // waits, without the budget's lock.
  bool Acquire(uint64_t bytes, const std::function<bool()>& reserve_ok, const std::function<bool()>& give_up,
               const std::function<void()>& on_wait) {
    std::unique_lock<std::mutex> lk(mu_);
    bool waited = false;
    while (!FitsLocked(bytes, reserve_ok())) {
      if (give_up()) return false;
      if (!waited) {
        waited = true;
        ++waits_;
      }
      if (on_wait) {
        lk.unlock();
        on_wait();
        lk.lock();
        if (FitsLocked(bytes, reserve_ok())) break;
      }
      cv_.wait_for(lk, std::chrono::milliseconds(kWaitSliceMs));
    }
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return true;
  }

  // Acquire without waiting: false (nothing taken) when the bytes do not fit now, counted as
  // a wait unless `count` is false (a retry of the same request).
  bool TryAcquire(uint64_t bytes, bool reserve_ok, bool count = true) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!FitsLocked(bytes, reserve_ok)) {
      if (count) ++waits_;
      return false;
    }
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return true;
  }

  void Release(uint64_t bytes) {
    if (bytes == 0) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      used_ = bytes > used_ ? 0 : used_ - bytes;
    }
    cv_.notify_all();
  }

  uint64_t limit() const { return limit_; }
  uint64_t used() const {
    std::lock_guard<std::mutex> lk(mu_);
    return used_;
  }
  uint64_t peak() const {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  // Requests that had to wait for budget (back-pressure events).
  uint64_t waits() const {
    std::lock_guard<std::mutex> lk(mu_);
    return waits_;
  }

 private:
  bool FitsLocked(uint64_t bytes, bool reserve_ok) const {
    return used_ == 0 || used_ + bytes <= limit_ || (reserve_ok && used_ + bytes <= limit_ + reserve_);
  }

  const uint64_t limit_;
  const uint64_t reserve_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  uint64_t waits_ = 0;
};

// Gives `bytes` back to a budget when it goes out of scope, unless Transfer() handed them
// on (to a request that releases them once answered).
class BudgetHold {
 public:
  BudgetHold(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  ~BudgetHold() {
    if (budget_ && bytes_ > 0) budget_->Release(bytes_);
  }
  BudgetHold(const BudgetHold&) = delete;
  BudgetHold& operator=(const BudgetHold&) = delete;
  uint64_t Transfer() {
    const uint64_t b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  MemoryBudget* const budget_;
  uint64_t bytes_;
};

}  // namespace mooring
