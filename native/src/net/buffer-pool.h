// BufferPool: a few large spare payload buffers per process (the replica protocol's, both
// ends), so that a large payload per request (rebuild windows, large reads) reuses pages
// already mapped instead of faulting in and zeroing fresh ones from the kernel each time.
//
// Bounded and given back: buffers under kMinBytes are not worth keeping, over kMaxBytes are
// freed, at most kCapBytes of spares are kept, and a spare not taken again within kIdleMs is
// freed by a timer on the process's poller, so an idle process holds none (a burst of large
// requests leaves no memory behind once it is over).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "util/byte-buffer.h"

namespace mooring {

class BufferPool {
 public:
  static constexpr size_t kMinBytes = 256u << 10;  // smaller buffers are not kept
  static constexpr size_t kMaxBytes = 16u << 20;   // larger ones are freed
  static constexpr size_t kCapBytes = 32u << 20;   // spare memory kept per process
  static constexpr int64_t kIdleMs = 1000;         // a spare unused this long is freed

  static BufferPool& Get();

  // A buffer of n bytes, contents unspecified.
  ByteBuffer Take(size_t n);
  // Takes b back (it is left empty). Kept if it is worth keeping and there is room.
  void Give(ByteBuffer&& b);

  // For tests and stats: spare bytes kept, and Takes served from them.
  size_t spare_bytes();
  uint64_t hits();

 private:
  BufferPool() = default;
  void ArmLocked(int64_t at_ms);
  void OnTimer();

  struct Spare {
    ByteBuffer buf;
    int64_t given_ms = 0;
  };
  std::mutex mu_;
  std::vector<Spare> free_;  // guarded by mu_
  size_t bytes_ = 0;         // capacity of free_, guarded by mu_
  uint64_t hits_ = 0;        // guarded by mu_
  uint64_t timer_id_ = 0;    // the poller registration (0: none yet), guarded by mu_
  int timer_fd_ = -1;        // an eventfd never signalled: the registration's fd
  bool armed_ = false;       // guarded by mu_
};

}  // namespace mooring
