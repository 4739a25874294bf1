// LeaseArea: reads a span of a lockspace's storage (host leases, resource index) straight
// from the file or block device with O_DIRECT, as sanlock itself reads it, so a write made
// by another host's daemon is seen rather than a copy cached on this host. Mooring uses it
// where no daemon call answers: to see which hosts hold leases and which locks exist in a
// lockspace this host has not joined (Lockspace.delete).
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace mooring {

struct LeaseArea {
  // Largest span read at once: a lockspace's host leases and its resource index are
  // 1 MiB each at sanlock's smallest alignment.
  static constexpr uint64_t kLengthMax = 4ull << 20;

  // Reads `length` bytes at `offset` (both multiples of 512, length 1..kLengthMax) into
  // `out`. Fewer bytes when the storage ends first. Blocking: call from a worker thread.
  static Status Read(const std::string& path, uint64_t offset, uint64_t length, std::string* out);
};

}  // namespace mooring
