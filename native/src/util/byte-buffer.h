// ByteBuffer: the replica protocol's payload memory, a byte vector whose resize leaves the
// new bytes uninitialised: a payload is always filled by a recv or a read before anyone
// looks at it, so zeroing it first (what std::vector<uint8_t>::resize does) is pure cost,
// 4 MiB per rebuild request. Large ones are reused through net/buffer-pool.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

}  // namespace mooring
