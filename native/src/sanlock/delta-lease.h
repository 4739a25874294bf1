// DeltaLease: reads one host's delta lease (the per-host heartbeat record of a lockspace)
// straight from the lockspace's storage, without the daemon. Mooring uses it before a
// join to tell "this host id is renewed by another live host" from "free" or "stale",
// which sanlock itself only reports after waiting 8 * io_timeout + 60 s.
//
// On-disk facts (sanlock 3.x leader record, little-endian, the first 256 bytes of the
// host's sector at offset + (host_id - 1) * sector_size): magic u32 @0 (0x12212010 for a
// delta lease), sector_size u32 @12, owner_id u64 @32, owner_generation u64 @40,
// space_name char[48] @56, resource_name (the host name) char[48] @104, timestamp u64 @152
// (0 = free).
#pragma once

#include <cstdint>
#include <string>

#include "util/status.h"

namespace mooring {

struct DeltaLease {
  static constexpr uint32_t kMagic = 0x12212010;

  bool valid = false;  // the sector holds a delta lease (magic matches)
  uint64_t owner_id = 0;
  uint64_t generation = 0;
  uint64_t timestamp = 0;
  std::string lockspace;  // space_name
  std::string host_name;  // resource_name: the owning daemon's host name

  // Reads host `host_id`'s lease with O_DIRECT (so another host's latest write is seen,
  // not a cached copy). Blocking: call from a worker thread.
  static Status Read(const std::string& path, uint64_t offset, uint64_t host_id, uint32_t sector_size,
                     DeltaLease* out);
};

}  // namespace mooring
