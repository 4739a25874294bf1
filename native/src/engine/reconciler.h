// Reconciler: makes one replica's head layer equal to another's after an unclean close.
//
// Only head layers can differ after a crash: snapshots are created, deleted and reverted
// under quiesce and their layer lists are compared separately (Engine::Start). The walk
// covers the union of both heads' allocated extents, so its cost follows what was written,
// not the volume size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "block/replica-backend.h"

namespace mooring {

class Reconciler {
 public:
  // Bytes compared per step; also the size of the two buffers it holds.
  static constexpr uint32_t kChunkBytes = 1u << 20;
  // Granularity of comparison inside a chunk: only differing blocks are rewritten.
  static constexpr uint32_t kCompareBytes = 4096;

  struct Result {
    int error = 0;               // 0 or negative errno
    bool source_failed = false;  // which side `error` came from
    uint64_t bytes_written = 0;
    uint64_t bytes_trimmed = 0;
  };

  // `epoch` is the engine's claimed epoch; the target refuses writes from older ones.
  Reconciler(ReplicaBackend* source, uint64_t epoch);

  Result Run(ReplicaBackend* target);

 private:
  // Head layer id and its allocated extents (sorted, merged).
  static int LoadHead(ReplicaBackend* r, std::string* head, std::vector<Range>* extents);
  int SyncChunk(ReplicaBackend* target, const std::string& target_head, uint64_t off,
                uint64_t len, const std::vector<Range>& src, const std::vector<Range>& dst,
                Result* res);

  ReplicaBackend* source_;
  uint64_t epoch_;
  std::string source_head_;
  std::vector<Range> source_extents_;
  int source_error_ = 0;
  bool loaded_ = false;
  std::vector<uint8_t> src_buf_;
  std::vector<uint8_t> dst_buf_;
};

}  // namespace mooring
