// Rebuilder: the copy loop of a rebuild (Engine::AddReplica; docs/rebuild.md).
//
// Makes one layer of a rebuild target equal to the same layer of a RW source. It walks
// the union of both sides' allocated extents of that layer in windows of
// kMaxDigestRangeBytes, asks both sides for per-unit digests (LayerDigest: whether the
// layer holds each 4 KiB block, and SHA-256 of it), and for each unit that differs sends
// the source's blocks (ReadLayer -> WriteLayer) and unmaps the target's blocks the source
// does not hold. Units that match are not sent, so a replica that comes back after
// missing some writes receives only the blocks that changed.
//
// Foreground writes reach the target too (it is WO), so the head layer changes under the
// copy: each head window is compared and copied while the engine's RangeLock holds that
// window, so a foreground write to it lands wholly before or wholly after the copy.
// Up to kWindowsInFlight windows are in flight at once, each under its own lock (windows
// are disjoint), so the source's digest and read of one overlap the target's write of
// another.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "block/replica-backend.h"
#include "engine/engine.h"
#include "engine/range-lock.h"

namespace mooring {

class Rebuilder {
 public:
  // Window of one compare step; also the size of the copy buffer.
  static constexpr uint64_t kWindowBytes = kMaxDigestRangeBytes;
  // Windows compared and copied at once (each by its own thread, under its own range lock).
  static constexpr size_t kWindowsInFlight = 4;

  struct Hooks {
    RangeLock* ranges = nullptr;  // the engine's: held for each head-layer window
    // Called for every window (after the range lock): 0 to go on, or a negative errno that
    // stops the copy (rebuild stopped, or the target failed on the data path).
    std::function<int()> check;
    // Called for every window (after the range lock): false once the source is no longer
    // RW, from when it may miss writes, so nothing more may be copied from it.
    std::function<bool()> source_ok;
    // Called after every window with the running totals.
    std::function<void(const RebuildResult&)> on_progress;
    // The engine's current epoch, carried by every write to the target (a fence during the
    // rebuild raises it; an engine fenced by a newer one is refused by the target).
    std::function<uint64_t()> epoch;
  };

  Rebuilder(ReplicaBackend* target, Hooks hooks);

  // Allocated bytes of the union of source and target extents of a layer (bytes to scan).
  // Sets *source_failed when the error came from the source.
  int UnionBytes(ReplicaBackend* source, const std::string& layer_id, uint64_t* out, bool* source_failed);

  // Copies one layer. Returns 0 or a negative errno; *source_failed tells whether the
  // source failed (or stopped being RW) rather than the target or a stop request.
  int CopyLayer(ReplicaBackend* source, const LayerInfo& layer, bool* source_failed);

  // Running totals (scanned, sent, unmapped); the engine adds the duration.
  const RebuildResult& totals() const { return totals_; }

 private:
  int LoadUnion(ReplicaBackend* source, const std::string& layer_id, std::vector<Range>* src,
                std::vector<Range>* all, bool* source_failed);
  // Bytes one window sent and unmapped (added to totals_ by CopyLayer).
  struct WindowTotals {
    uint64_t sent = 0;
    uint64_t unmapped = 0;
  };
  int CopyWindow(ReplicaBackend* source, const std::string& id, bool head, uint64_t off, uint64_t len,
                 const std::vector<Range>& src, std::vector<uint8_t>* buf, WindowTotals* wt, bool* source_failed);
  // Sends source blocks [off, off+len) of layer `id` to the target through `buf`.
  int Send(ReplicaBackend* source, const std::string& id, uint64_t off, uint64_t len, std::vector<uint8_t>* buf,
           WindowTotals* wt, bool* source_failed);

  // Runs a target write with the engine's epoch. An engine's epoch does not change while
  // it rebuilds (it is handed one epoch; only Activate, on a standby, gives it another), so
  // a stale refusal means another engine owns the target.
  template <typename Op>
  int WithEpoch(Op op) {
    return op(hooks_.epoch ? hooks_.epoch() : 0);
  }

  ReplicaBackend* target_;
  Hooks hooks_;
  RebuildResult totals_;
  std::vector<std::vector<uint8_t>> bufs_;  // one copy buffer per window in flight
};

}  // namespace mooring
