// Replica: one copy of a volume, stored as a directory.
//
//   <dir>/replica.json      metadata (format, size, epoch, clean, head, layers), written
//                           atomically: tmp file, fsync, rename, fsync dir (invariant 4)
//   <dir>/replica.log       commits since replica.json was last written whole, appended
//                           and synced one record each (store/metadata-journal.h)
//   <dir>/layer-<id>.img    sparse layer files, all of the volume's size
//   <dir>/lock              flock'd (exclusive) while the replica is open
//
// Layers form a tree through `parent`; the head is the only writable layer and the
// chain read through is head -> parent -> ... -> bottom. Which layer holds each 4 KiB
// block is kept in memory as extent maps (store/extent-map.h), whose memory grows with
// allocated extents, not volume size. They are rebuilt on open from the files (FIEMAP, SEEK_DATA).
// docs/replica-format.md describes the format and the crash-safety of each operation.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "block/replica-backend.h"
#include "image/image-reader.h"
#include "store/extent-map.h"
#include "store/layer.h"
#include "store/metadata-journal.h"
#include "store/replica-metadata.h"
#include "util/rw-lock.h"

namespace mooring {

// What Replica::Inspect reads from a replica directory without opening it.
struct ReplicaInfo {
  uint64_t size_bytes = 0;
  uint64_t epoch = 0;
  bool clean = false;
  bool rebuilding = false;
  uint64_t allocated_bytes = 0;  // sum of st_blocks * 512 over the layer files
  std::optional<BackingImageRef> backing_image;
};


// The writer a data-path call on a shared replica comes from: the registry handle
// (ReplicaRegistry::Handle sets it around each call it forwards; calls are synchronous, so
// a thread-local carries it), 0 when the replica was opened directly. A claim or a rebuild
// start (AdoptChain) makes its caller's handle the replica's only writer, so writes that
// arrive late on an older handle of the same engine (a connection that timed out, whose
// frames the network delivers after a partition heals) are refused like an older epoch's.
class WriterScope {
 public:
  explicit WriterScope(uint64_t token);
  ~WriterScope();
  static uint64_t Current();

 private:
  uint64_t prev_;
};

class Replica : public ReplicaBackend {
 public:
  static constexpr uint32_t kBlockSize = 4096;

  // Creates <dir> (must not exist or be empty) with an empty head layer and epoch 0. With
  // `backing`, the chain reads that image beneath its bottom layer: the image must open
  // with the given format and have exactly the given virtual size.
  static Status Create(const std::string& dir, uint64_t size_bytes, const BackingImageRef* backing = nullptr);
  // Opens an existing replica. Damaged or hostile metadata -> Code::kCorrupt, never a crash.
  static Status Open(const std::string& dir, std::unique_ptr<Replica>* out);
  // Reads a replica's metadata and layer file sizes without taking its lock, so it works
  // while the replica is open (here or in another process): replica.json is only ever
  // replaced by rename, so the read sees a whole old or whole new file.
  static Status Inspect(const std::string& dir, ReplicaInfo* out);

  ~Replica() override;
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  std::string id() const override { return dir_; }
  uint64_t size() const override { return size_.load(); }
  uint64_t epoch() const override { return epoch_.load(); }
  bool clean() const override { return clean_.load(); }

  Status ClaimEpoch(uint64_t epoch, ReplicaSet* stored, bool* was_clean) override;
  Status SetReplicaSet(const ReplicaSet& set, bool self_rw) override;
  Status PeekReplicaSet(ReplicaSet* out) override;
  Status LastRw(ReplicaSetId* out) override;
  Status MarkClean(uint64_t epoch) override;
  Status Grow(uint64_t size_bytes) override;

  int Read(uint64_t off, uint32_t len, uint8_t* buf) override;
  int Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) override;
  int TryWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf) override;
  int TryRead(uint64_t off, uint32_t len, uint8_t* buf) override;
  int Trim(uint64_t epoch, uint64_t off, uint64_t len) override;
  int WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim, bool fast_only,
                  bool fua) override;
  int Flush() override;
  int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) override;

  Status ListLayers(std::vector<LayerInfo>* out) override;
  Status SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) override;
  Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) override;
  int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) override;

  Status Snapshot(const std::string& name, int64_t created_ms, const Labels& labels,
                  bool user_created) override;
  Status DeleteSnapshot(const std::string& name) override;
  Status Revert(const std::string& name, int64_t created_ms) override;

  bool rebuilding() const override { return rebuilding_.load(); }
  Status AdoptChain(const std::vector<LayerInfo>& layers, uint64_t epoch) override;
  Status LayerDigest(const std::string& layer_id, uint64_t off, uint64_t len, DigestDetail detail,
                     std::vector<UnitDigest>* out) override;
  int WriteLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint32_t len, const uint8_t* buf) override;
  int UnmapLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint64_t len) override;
  Status FinishRebuild() override;

  uint64_t AllocatedBytes() override;
  Status Close() override;

  // Upper bound on the extents one BlockStatus call returns (on top of max_extents).
  static constexpr uint32_t kMaxBlockStatusExtents = 1u << 16;
  // Largest buffer used when writing zeros or copying layer data.
  static constexpr uint32_t kCopyChunkBytes = 1u << 20;

 private:
  struct Segment {
    uint64_t off;
    uint64_t len;
    Layer* layer;  // null: reads as zeros, or from the backing image when `image` is set
    bool image;
  };
  static constexpr size_t kEdgeLockStripes = 256;

  explicit Replica(std::string dir);

  // --- data path helpers (caller holds io_mu_ shared) ---
  int StartWrite(uint64_t epoch);
  Status EnsureDirty();
  // Calls fn(first_block, end_block, layer_num) for each run of [b0, b1) in chain order;
  // layer_num 0 = no layer holds it; fn returns false to stop. Caller holds map_mu_.
  template <typename Fn>
  void ResolveLocked(uint64_t b0, uint64_t b1, bool include_head, Fn&& fn) const;
  void CollectSegments(uint64_t off, uint64_t len, bool include_head, std::vector<Segment>* out) const;
  // `cached_only` (TryRead): -EWOULDBLOCK rather than wait for the disk or the image.
  int ReadSegments(uint64_t off, uint64_t len, uint8_t* buf, bool include_head, bool cached_only = false);
  // Reads [off, off+len) of the backing image; zeros above its virtual size.
  int ReadImage(uint64_t off, uint64_t len, uint8_t* buf);
  // Block runs in [b0, b1) where the backing image holds data (rounded out to whole
  // blocks), appended to *out in address order (merged with its last run when they touch,
  // so *out must not hold runs beyond b0). 0 or -errno. Takes no replica lock.
  int ImageDataBlocks(uint64_t b0, uint64_t b1, std::vector<std::pair<uint64_t, uint64_t>>* out);
  // Image allocation of [off, end) as extents appended to *out (coalescing with its last),
  // at most `limit` extents in *out; *stopped = true when the limit cut it short.
  // Block runs in [b0, b1) that some layer below the head or the backing image holds data
  // for, merged, in address order. 0 or -errno.
  int BelowBlocks(uint64_t b0, uint64_t b1, std::vector<std::pair<uint64_t, uint64_t>>* out);
  int AppendImageStatus(uint64_t off, uint64_t end, uint32_t limit, std::vector<Extent>* out, bool* stopped);
  // Writes [off, off+len) into the head; src == nullptr writes zeros.
  int WriteHead(uint64_t off, uint64_t len, const uint8_t* src);
  // Writes part of one block under its edge lock, copying the block up into the head first
  // if the head does not hold it. only_if_owned: do nothing unless the head holds it.
  int WriteEdge(uint64_t block, uint32_t in_off, uint32_t n, const uint8_t* src, bool only_if_owned);
  int WriteBlocks(uint64_t b0, uint64_t b1, const uint8_t* src);
  int PunchHead(uint64_t b0, uint64_t b1);

  // --- control helpers (caller holds ctl_mu_ and io_mu_ exclusive) ---
  Status CheckOpen() const;
  // Makes m the replica's metadata: durable (through journal_), then meta_.
  Status SaveMeta(ReplicaMetadata m);
  // The same with meta_mu_ already held.
  Status CommitMetaLocked(ReplicaMetadata m);
  // A new empty layer file of size_bytes for `rec`, synced with the directory.
  Status NewLayerFile(const LayerRecord& rec, uint64_t size_bytes, std::unique_ptr<Layer>* out);
  // Sets every open layer file's length to size_bytes (synced). On failure the files
  // already changed are set back to `undo_bytes` (best effort: Open cuts longer files back).
  Status ResizeLayers(uint64_t size_bytes, uint64_t undo_bytes);
  void ForgetLayer(const std::string& id, bool unlink_file);
  // Makes a new, empty layer over `parent` the head: creates its file, commits `m` (meta_
  // with the caller's edits) plus the new layer, and installs the layer. When the commit
  // fails the file is removed and nothing changed. `before_switch` runs under map_mu_
  // just before the new head replaces head_. (`parent` is a copy: callers name it from
  // meta_, which the commit replaces.)
  Status CommitNewHead(ReplicaMetadata m, std::string parent, int64_t created_ms,
                       const std::function<void()>& before_switch = nullptr);
  Status DropLayer(const std::string& id);
  // Commits `m` (meta_ with the caller's edits) without layer `id`, then forgets the
  // layer and unlinks its file. `id` must not point into meta_.
  Status CommitWithoutLayer(ReplicaMetadata m, const std::string& id);
  Status MergeInto(const std::string& id, const std::string& child_id);
  Status Prune(const std::string& id);
  Status Collect();
  void RebuildBase();
  Layer* FindLayer(const std::string& id) const;
  // ListLayers' entry for one record (one stat for its allocation); under meta_mu_.
  LayerInfo InfoOfLocked(const LayerRecord& rec) const;

  // --- rebuild helpers ---
  // The layers the head reads through, nearest first (head excluded). Caller holds io_mu_.
  std::vector<Layer*> ChainBelowHead();
  // Recomputes base_ over blocks [b0, b1) from the per-layer sets after a rebuild op
  // changed a layer below the head. Caller holds map_mu_ exclusively.
  void RecomputeBaseLocked(const std::vector<Layer*>& chain, uint64_t b0, uint64_t b1);
  // Common checks of WriteLayer/UnmapLayer: rebuilding, open, whole blocks, in range.
  int CheckRebuildOp(uint64_t epoch, uint64_t off, uint64_t len) const;

  const std::string dir_;
  // Changes only under io_mu_ exclusive (Grow, AdoptChain); read without locks by size().
  std::atomic<uint64_t> size_{0};
  int lock_fd_ = -1;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> epoch_{0};
  // The one handle that may write at epoch_ (see WriterScope); 0: any.
  std::atomic<uint64_t> writer_token_{0};
  std::atomic<bool> clean_{true};
  std::atomic<bool> rebuilding_{false};

  // Lock order: ctl_mu_ -> io_mu_ -> edge stripe -> meta_mu_ -> map_mu_.
  std::mutex ctl_mu_;                // serialises control operations
  mutable RwLock io_mu_;          // data path shared; epoch claim, layer changes, close exclusive
  std::mutex meta_mu_;               // meta_ and replica.json
  mutable RwLock map_mu_;         // head extents and base_ (the data path updates them)
  std::array<std::mutex, kEdgeLockStripes> edge_locks_;

  // Allocation of the layers below the head, kept until one of them may change (a stat of
  // every layer file per call cost 1-2 ms at depth 1,000, and engines ask at every control
  // operation). below_gen_ moves at the end of every operation that changes those layers
  // (BelowChange); a figure computed across a move is not kept.
  std::atomic<uint64_t> below_gen_{1};
  std::mutex below_mu_;
  uint64_t below_cached_gen_ = 0;  // below_mu_
  uint64_t below_bytes_ = 0;       // below_mu_
  struct BelowChange {
    Replica* r;
    ~BelowChange() { r->below_gen_.fetch_add(1); }
  };

  ReplicaMetadata meta_;
  // Where meta_'s commits go (replica.log between whole writes of replica.json); meta_mu_.
  MetadataJournal journal_;
  // Layer objects change only under io_mu_ exclusive.
  std::map<std::string, std::unique_ptr<Layer>> layers_;
  std::unordered_map<uint32_t, Layer*> by_num_;
  Layer* head_ = nullptr;
  // For each block, the layer below the head that the head's chain reads it from.
  ExtentMap base_;
  // The backing image beneath the bottom layer (null: none). Set by Open, closed by Close;
  // its Read/BlockStatus are thread-safe, so the data path calls it under io_mu_ shared.
  std::unique_ptr<ImageReader> image_;
  uint64_t image_size_ = 0;
};

}  // namespace mooring
