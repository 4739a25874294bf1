// EngineSnapshotSink: a snapshot's content (SnapshotReader, engine/snapshot-reader.h)
// written into another engine of the same size: a clone.
//
// Writes go through the target's normal replicated write path, so the clone has as many
// replicas as the target engine and each holds every byte. Zero runs become write-zeroes
// that may trim, so the target stays sparse and whatever it held before is replaced too.
// Flushed at the end. A failed copy leaves the target with part of the content: it is the
// caller's to discard.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "engine/snapshot-reader.h"

namespace mooring {

class EngineSnapshotSink final : public SnapshotSink {
 public:
  // Write-zeroes go out in calls of at most this many bytes (the engine takes 32-bit lengths).
  static constexpr uint64_t kMaxZeroesCallBytes = 1ull << 30;

  // `target` must outlive the sink; checking its size is the caller's job.
  explicit EngineSnapshotSink(Engine* target) : target_(target) {}

  Status Data(uint64_t off, const uint8_t* buf, uint32_t len) override;
  Status Zeroes(uint64_t off, uint64_t len) override;
  Status Finish() override;
  void Abort() override {}

 private:
  Engine* target_;
};

}  // namespace mooring
