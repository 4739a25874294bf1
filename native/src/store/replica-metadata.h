// ReplicaMetadata: the contents of <dir>/replica.json, parsed and validated as hostile input.
//
// Parse() accepts only what Serialize() could have produced for a consistent replica:
// anything else (bad JSON, wrong types, unknown format, unsafe file names, dangling
// parents, cycles...) is Code::kCorrupt with a message naming the problem.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "block/replica-backend.h"
#include "util/status.h"

namespace mooring {

struct LayerRecord {
  uint32_t num = 0;        // numeric part of id; parents always have smaller numbers
  std::string id;          // "L" + at least 6 digits, e.g. L000003
  std::string file;        // always "layer-<id>.img"
  std::string parent;      // "" for the bottom layer
  std::string name;        // snapshot name, "" for the head
  bool removed = false;    // deleted by the user, kept because other layers need it
  bool user_created = true;
  int64_t created_ms = 0;
  Labels labels;
  uint64_t size_bytes = 0;

  bool operator==(const LayerRecord& o) const {
    return num == o.num && id == o.id && file == o.file && parent == o.parent && name == o.name &&
           removed == o.removed && user_created == o.user_created && created_ms == o.created_ms &&
           labels == o.labels && size_bytes == o.size_bytes;
  }
  bool operator!=(const LayerRecord& o) const { return !(*this == o); }
};

// The backing image beneath a replica's chain (seed 003): the bottom, read-only layer. The
// file is DISK/backing-images/<dir>/image, DISK being the directory two levels above the
// replica's (a data engine's DIR holds its replicas at DIR/replicas/<name>).
struct BackingImageRef {
  std::string dir;                  // [A-Za-z0-9._-]{1,127}, not "." or ".."
  std::string format;               // "raw" or "qcow2": forced, never probed
  uint64_t virtual_size_bytes = 0;  // > 0, a multiple of 512, at most the replica's size

  bool operator==(const BackingImageRef& o) const {
    return dir == o.dir && format == o.format && virtual_size_bytes == o.virtual_size_bytes;
  }
  bool operator!=(const BackingImageRef& o) const { return !(*this == o); }
};

struct ReplicaMetadata {
  // Format 1: replica.json holds everything. Format 2: replica.json is the base and
  // replica.log (store/metadata-journal.h) holds the commits made since, as records of the
  // base's `journal` generation. Builds that know only format 1 refuse format 2 instead of
  // reading a stale base; a replica closed cleanly is left in format 1.
  static constexpr int kFormatVersion = 1;
  static constexpr int kJournalFormatVersion = 2;
  static constexpr const char* kFileName = "replica.json";
  // Named limits on what a replica may hold (and metadata may claim).
  static constexpr size_t kMaxLayers = 65536;
  static constexpr size_t kMaxNameLength = 255;
  static constexpr size_t kMaxLabels = 64;
  static constexpr size_t kMaxLabelKeyLength = 255;
  static constexpr size_t kMaxLabelValueLength = 4096;
  static constexpr uint64_t kMaxSizeBytes = 1ull << 60;

  int format = kFormatVersion;
  // The generation of replica.log records that apply on top of this base (format 2); 0 =
  // no journal (format 1). A random positive number below 2^53, new at every compaction,
  // so records a crash left behind from an earlier base never match a later one.
  uint64_t journal = 0;
  uint64_t size_bytes = 0;
  uint32_t block_size = 4096;
  uint64_t epoch = 0;
  bool clean = true;
  // A rebuild of this replica started (AdoptChain) and has not finished (FinishRebuild):
  // its data may be incomplete. Optional in the file ("rebuilding": true), absent = false,
  // so replicas written before the field existed open unchanged.
  bool rebuilding = false;
  // Optional in the file ("backingImage": {...}); absent = none, so the format stays 1 and
  // replicas written before the field existed open unchanged.
  std::optional<BackingImageRef> backing_image;
  // The last replica set an engine stored here (docs/single-writer.md). Optional in the
  // file ("replicaSet": {...}); absent = none, so replicas written before the protocol open
  // unchanged. Its epoch is never above `epoch`.
  ReplicaSet replica_set;
  // The newest replica set stored here in which this replica was RW (the engine says so
  // when it stores the set): the replica holds every write acknowledged up to that set.
  // A replica dropped from rw keeps storing later sets, so replica_set alone cannot tell
  // how fresh its data is; salvage (docs/salvage.md) ranks replicas by this. Optional in
  // the file ("lastRw": {"epoch", "generation"}), absent = none; never above replica_set.
  ReplicaSetId last_rw;
  std::string head;
  uint32_t next_layer_num = 1;
  std::vector<LayerRecord> layers;  // ordered by num (bottom first)

  static Status Parse(const std::string& text, ReplicaMetadata* out);
  // The whole document: format 1 when journal == 0, else format 2 naming the generation.
  std::string Serialize() const;
  // A journal record's payload: every top-level field, the layer records that differ from
  // `prev` (new or changed) and the ids of those `prev` had and this has not.
  std::string SerializeChange(const ReplicaMetadata& prev) const;
  // Applies a SerializeChange payload (read back from replica.log) in place; on an error
  // the metadata is half-changed and must be discarded. Does not Validate: the caller
  // checks the result of the whole log.
  Status ApplyChange(const std::string& payload);
  // Structural checks shared by Parse and by writers (a writer bug must not persist).
  Status Validate() const;

  // Reads replica.json and, in format 2, applies replica.log's records of its generation.
  static Status Load(const std::string& dir, ReplicaMetadata* out);
  // Writes the whole document with WriteFileAtomic (Create, journal compactions).
  Status Save(const std::string& dir) const;

  LayerRecord* Find(const std::string& id);
  const LayerRecord* Find(const std::string& id) const;
  // The same by binary search: only while `layers` is in ascending id order, as Validate
  // requires of every state that is stored or read back.
  const LayerRecord* FindOrdered(const std::string& id) const;
  // The non-removed, non-head layer with this snapshot name.
  const LayerRecord* FindSnapshot(const std::string& name) const;
  std::vector<const LayerRecord*> Children(const std::string& id) const;
  // Allocates the next layer id (does not add a record).
  LayerRecord NewLayer(const std::string& parent, int64_t created_ms);

  static std::string LayerId(uint32_t num);
  static std::string LayerFile(const std::string& id) { return "layer-" + id + ".img"; }
  // Parses "L000123" -> 123. False for anything else.
  static bool ParseLayerId(const std::string& id, uint32_t* num);
  static bool ValidSnapshotName(const std::string& name);
  static Status ValidateLabels(const Labels& labels, Code code);
  // Checks a backing image reference against a replica of replica_size_bytes; `code` is the
  // code of the error (kCorrupt from Parse, kInvalidArgument from Create).
  static Status ValidateBackingImage(const BackingImageRef& ref, uint64_t replica_size_bytes, Code code);
  static constexpr size_t kMaxBackingImageDirLength = 127;
  // Where the backing image file of the replica at replica_dir lives.
  static std::string BackingImagePath(const std::string& replica_dir, const std::string& image_dir);
};

}  // namespace mooring
