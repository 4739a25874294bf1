// ByteBuffer and BufferPool: the replica protocol's payload memory.
//
// ByteBuffer is a byte vector whose resize leaves the new bytes uninitialised: a payload is
// always filled by a recv or a read before anyone looks at it, so zeroing it first (what
// std::vector<uint8_t>::resize does) is pure cost, 4 MiB per rebuild request.
//
// BufferPool keeps a few large spare buffers per process, so that a large payload per
// request (rebuild windows, large reads) reuses pages already mapped instead of faulting in
// and zeroing fresh ones from the kernel each time. Bounded: buffers under kMinBytes are not
// worth keeping, over kMaxBytes are freed, and at most kCapBytes of spare memory is kept;
// what does not fit is freed as usual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace mooring {

template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  // Value-initialisation (resize, vector(n)) becomes default-initialisation: no zeroing.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using ByteBuffer = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

class BufferPool {
 public:
  static constexpr size_t kMinBytes = 256u << 10;  // smaller buffers are not kept
  static constexpr size_t kMaxBytes = 16u << 20;   // larger ones are freed
  static constexpr size_t kCapBytes = 32u << 20;   // spare memory kept per process

  static BufferPool& Get() {
    static BufferPool* pool = new BufferPool();  // never destroyed: used until exit
    return *pool;
  }

  // A buffer of n bytes, contents unspecified.
  ByteBuffer Take(size_t n) {
    ByteBuffer b;
    if (n >= kMinBytes && n <= kMaxBytes) {
      std::lock_guard<std::mutex> lk(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].capacity() >= n && (best == free_.size() || free_[i].capacity() < free_[best].capacity())) best = i;
      }
      if (best != free_.size()) {
        b = std::move(free_[best]);
        free_[best] = std::move(free_.back());
        free_.pop_back();
        bytes_ -= b.capacity();
        hits_++;
      }
    }
    b.resize(n);
    return b;
  }

  // Takes b back (it is left empty). Kept if it is worth keeping and there is room.
  void Give(ByteBuffer&& b) {
    ByteBuffer gone = std::move(b);  // freed at return unless kept
    const size_t cap = gone.capacity();
    if (cap < kMinBytes || cap > kMaxBytes) return;
    gone.clear();
    std::lock_guard<std::mutex> lk(mu_);
    if (bytes_ + cap > kCapBytes) return;
    bytes_ += cap;
    free_.push_back(std::move(gone));
  }

  // For tests and metrics: spare bytes kept, and Takes served from them.
  size_t spare_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
  }
  uint64_t hits() {
    std::lock_guard<std::mutex> lk(mu_);
    return hits_;
  }

 private:
  BufferPool() = default;
  std::mutex mu_;
  std::vector<ByteBuffer> free_;  // guarded by mu_
  size_t bytes_ = 0;              // capacity of free_, guarded by mu_
  uint64_t hits_ = 0;             // guarded by mu_
};

}  // namespace mooring
