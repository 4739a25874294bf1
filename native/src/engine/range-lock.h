// RangeLock: serialises overlapping byte ranges, lets disjoint ones run in parallel.
//
// The engine writes each request to its replicas one after another (or, later, in
// parallel). Two overlapping writes in flight at once could then land in one order on
// one replica and in the other order on another, leaving the replicas different for
// good. NBD leaves the outcome of overlapping in-flight writes undefined, but it must be
// the same outcome on every replica, so overlapping mutations wait for each other.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace mooring {

class RangeLock {
 public:
  class Guard {
   public:
    Guard() = default;
    Guard(RangeLock* lock, uint64_t off, uint64_t len) : lock_(lock), off_(off), len_(len) {}
    Guard(Guard&& o) noexcept : lock_(o.lock_), off_(o.off_), len_(o.len_) { o.lock_ = nullptr; }
    Guard& operator=(Guard&&) = delete;
    Guard(const Guard&) = delete;
    ~Guard() {
      if (lock_) lock_->Unlock(off_, len_);
    }

   private:
    RangeLock* lock_ = nullptr;
    uint64_t off_ = 0, len_ = 0;
  };

  // Blocks while an overlapping range is held.
  Guard Lock(uint64_t off, uint64_t len) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !OverlapsLocked(off, len); });
    held_.push_back({off, len});
    return Guard(this, off, len);
  }
  // Lock, unless an overlapping range is held: then false, and *out is left alone.
  bool TryLock(uint64_t off, uint64_t len, std::optional<Guard>* out) {
    std::lock_guard<std::mutex> lk(mu_);
    if (OverlapsLocked(off, len)) return false;
    held_.push_back({off, len});
    out->emplace(this, off, len);
    return true;
  }

 private:
  struct Held {
    uint64_t off, len;
  };

  bool OverlapsLocked(uint64_t off, uint64_t len) const {
    // Held ranges are few (one per request in flight), so a scan beats a tree.
    for (const Held& h : held_)
      if (off < h.off + h.len && h.off < off + len) return true;
    return false;
  }

  void Unlock(uint64_t off, uint64_t len) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (size_t i = 0; i < held_.size(); ++i) {
        if (held_[i].off == off && held_[i].len == len) {
          held_[i] = held_.back();
          held_.pop_back();
          break;
        }
      }
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held> held_;
};

}  // namespace mooring
