// MetadataJournal: <dir>/replica.log, where a replica's metadata commits go between two
// whole writes of replica.json, so a commit costs the same however many layers there are.
//
// replica.json in format 2 is the base; it names a generation (`journal`). Each commit
// appends one record to replica.log and syncs it:
//
//   u32 magic "MRJ1" | u32 payload bytes | u64 generation | u32 CRC-32C | payload
//
// (little-endian; the CRC covers the 16 header bytes before it and the payload; the payload
// is ReplicaMetadata::SerializeChange: every top-level field, the layer records that
// changed, the ids of those that went). Reading applies, in order, the records of the
// base's generation and stops at the first that is cut short, fails its CRC or is of
// another generation: a crash can only cut the last append, which was never acknowledged.
//
// A compaction writes replica.json whole with a new random generation (tmp, fsync, rename,
// fsync dir), then empties the log: a crash in between leaves records of the old
// generation, which the new base ignores. It happens at the first commit after open, when
// the log outgrows max(256 KiB, 2 x the base) (so its cost is spread over as many commits
// as the base has layers), when a record would exceed 1 MiB and after a failed append.
// Finish, at close, writes replica.json whole in format 1 and removes the log: a replica
// closed cleanly opens with builds that predate the journal. docs/replica-format.md.
#pragma once

#include <cstdint>
#include <string>

#include "store/replica-metadata.h"
#include "util/status.h"

namespace mooring {

class MetadataJournal {
 public:
  static constexpr const char* kFileName = "replica.log";
  static constexpr uint32_t kMagic = 0x314a524d;  // "MRJ1"
  static constexpr size_t kHeaderBytes = 20;
  static constexpr size_t kMaxRecordBytes = 1u << 20;
  static constexpr uint64_t kMinCompactBytes = 256u << 10;

  // Applies to *m, a base read from replica.json with m->journal != 0, the log's records
  // of that generation. kCorrupt when a whole record (its CRC matches) does not parse or
  // the result does not validate.
  static Status Replay(const std::string& dir, ReplicaMetadata* m);

  explicit MetadataJournal(std::string dir) : dir_(std::move(dir)) {}
  ~MetadataJournal();
  MetadataJournal(const MetadataJournal&) = delete;
  MetadataJournal& operator=(const MetadataJournal&) = delete;

  // Makes *next durable, prev being what is durable now: one appended record, or a
  // compaction (next->journal becomes the new generation). On error nothing of *next may
  // be relied on and the next commit compacts.
  Status Commit(const ReplicaMetadata& prev, ReplicaMetadata* next);
  // Leaves replica.json whole in format 1 (m->journal = 0) and removes the log.
  Status Finish(ReplicaMetadata* m);

  // Bytes of records appended since the last compaction (tests, stats).
  uint64_t log_bytes() const { return end_; }

 private:
  Status Compact(ReplicaMetadata* next);
  Status EnsureLog();
  void CloseLog();

  const std::string dir_;
  int fd_ = -1;
  uint64_t end_ = 0;         // where the next record goes
  uint64_t base_bytes_ = 0;  // size of replica.json at the last compaction
  bool appendable_ = false;  // a compaction ran this session and no append failed since
};

}  // namespace mooring
