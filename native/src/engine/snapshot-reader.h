// SnapshotReader: a volume's content as of one snapshot, read from a running engine and
// handed to a SnapshotSink (a new raw file, or another engine: engine/snapshot-sinks.h).
//
// What "as of snapshot S" means (docs/replica-format.md): each 4 KiB block reads from the
// nearest layer on the chain S -> parent -> ... -> bottom that owns it, and as zeros where
// none does. That is exactly what the volume read when S was taken: a trim punched the
// head, so the range read through to the layers below; write-zeroes over lower-layer data
// stored real zeros in the head; both are captured by per-layer ownership. Layers above S
// (later snapshots, the head) are never read, so writes after S do not show.
//
// Over a backing image the chain ends in the image: a replica that has one answers for the
// pseudo layer kBackingImageLayerId (block/replica-backend.h) in LayerExtents/ReadLayer, so
// the reader appends it below S's bottom layer and blocks no layer owns read from the image.
//
// How: the reader opens an Engine::SnapshotRead (one RW replica; snapshot delete and revert
// are refused with kBusy until it ends), resolves S's chain from that replica's layer list,
// loads each chain layer's extent list, and walks the volume in windows of at most
// kWindowBytes. Per window it gives each block its owner (the first chain layer whose
// extents hold it), reads each run of blocks with the same owner with one ReadLayer into
// the window buffer, and hands the sink data runs; blocks owned by no layer, and owned
// blocks that read as all zeros, become zero runs, so the output stays sparse. Ranges no
// chain layer touches are skipped through the extent lists without being read.
//
// If the replica fails mid-way it is marked ERR (as a failed read would mark it) and the
// read goes on from another RW replica, from the window it was in.
//
// Memory: the window buffer, one owner slot per block of a window, and the chain layers'
// extent lists (16 bytes per extent per layer, as a rebuild holds them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "block/replica-backend.h"
#include "engine/engine.h"
#include "util/status.h"

namespace mooring {

// Where a snapshot's content goes. Calls come in address order from one thread; runs do
// not overlap and together cover [0, size) exactly once.
class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;
  // Bytes that hold data (len at most SnapshotReader::kWindowBytes).
  virtual Status Data(uint64_t off, const uint8_t* buf, uint32_t len) = 0;
  // A range that reads as zeros (any length).
  virtual Status Zeroes(uint64_t off, uint64_t len) = 0;
  // Everything was handed over: make it durable.
  virtual Status Finish() = 0;
  // The copy failed (or Finish did): undo what can be undone. Called at most once.
  virtual void Abort() = 0;
};

// What a copy did.
struct SnapshotCopyResult {
  uint64_t size_bytes = 0;    // the volume size (the length of the image written)
  uint64_t read_bytes = 0;    // bytes owned by the chain's layers, read from the replica
  uint64_t copied_bytes = 0;  // bytes handed to the sink as data (zero blocks and holes are not)
  uint64_t duration_ms = 0;
};

class SnapshotReader {
 public:
  // Largest window: the read buffer, and the longest Data() call.
  static constexpr uint64_t kWindowBytes = 4ull << 20;
  // Progress is reported at least this far apart (in bytes read).
  static constexpr uint64_t kProgressIntervalBytes = 64ull << 20;
  // Replica switches after failures, per copy (an engine has at most 16 replicas).
  static constexpr size_t kMaxFailovers = 16;

  // Called with (bytes read so far, bytes to read in all).
  using Progress = std::function<void(uint64_t, uint64_t)>;

  // Opens a read of the snapshot named `name` (a live one: not the head, not deleted) on
  // `engine`, which must outlive the reader. kNotFound if there is none; kClosed,
  // kStaleEpoch, kNoHealthyReplica from the engine.
  static Status Open(Engine* engine, const std::string& name, std::unique_ptr<SnapshotReader>* out);

  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Copies the content into `sink` and finishes it; on failure calls sink->Abort(). Once
  // per reader. `progress` may be empty.
  Status CopyTo(SnapshotSink* sink, const Progress& progress, SnapshotCopyResult* out);

 private:
  SnapshotReader(std::unique_ptr<Engine::SnapshotRead> read, std::string name, uint64_t size)
      : read_(std::move(read)), name_(std::move(name)), size_(size) {}

  // The chain of name_ (the snapshot's layer first) from the current replica's layer list.
  Status ResolveChain(std::vector<std::string>* chain);
  // After a replica failure: switches to another RW replica (marking the failed one ERR)
  // whose chain for name_ must be the same. Returns the failure if it cannot.
  Status Recover(Status failure, size_t* failovers);
  // The chain layers' extent lists, from the current replica.
  Status LoadExtents();
  Status LoadExtentsRecovering(size_t* failovers);
  Status Run(SnapshotSink* sink, const Progress& progress, SnapshotCopyResult* out);

  std::unique_ptr<Engine::SnapshotRead> read_;
  std::string name_;
  uint64_t size_;
  std::vector<std::string> chain_;          // layer ids, the snapshot's first
  std::vector<std::vector<Range>> extents_;  // per chain layer, sorted and merged
  bool used_ = false;
};

}  // namespace mooring
