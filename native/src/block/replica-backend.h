// ReplicaBackend: what the Engine talks to for each replica. A local Replica (store/)
// implements it directly; RemoteReplica (remote/) implements it over the replica protocol
// (TCP, optionally TLS) against a ReplicaServer on another host. All data-path methods are
// thread-safe and return 0 or -errno.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "block/block-device.h"
#include "block/replica-set.h"
#include "util/byte-buffer.h"
#include "util/status.h"

namespace mooring {

struct Range {
  uint64_t off;
  uint64_t len;
};

using Labels = std::map<std::string, std::string>;

// Rebuild compares layers in units of kDigestUnitBytes: one 4 KiB block, so scattered
// small changes cost only the blocks that changed (a 64 KiB unit would resend 16 blocks
// for each changed one); the digest traffic is 42 bytes per allocated block (about 1%).
constexpr uint32_t kDigestUnitBytes = 4096;
constexpr uint32_t kDigestBlocksPerUnit = kDigestUnitBytes / 4096;

// What one layer holds in one digest unit: which of its blocks the layer itself allocates
// (bit i = block i of the unit), and SHA-256 over the data of those blocks, in address
// order. Units where the layer allocates nothing are not listed.
struct UnitDigest {
  uint64_t off = 0;        // multiple of kDigestUnitBytes
  uint16_t mask = 0;       // never 0 in a listed digest
  uint8_t sha256[32] = {};
};

// One layer of a replica's chain, as listed to the control plane.
struct LayerInfo {
  std::string id;          // stable, e.g. "L000003"; never reused within a replica
  std::string file;        // file name inside the replica directory
  std::string parent;      // parent layer id, "" for the bottom layer
  std::string name;        // snapshot name; "" for the head
  bool head = false;
  bool removed = false;    // deleted by the user but kept (pruned) because the head sits on it
  bool user_created = true;
  int64_t created_ms = 0;
  Labels labels;
  uint64_t size_bytes = 0;       // virtual size when the layer was created
  uint64_t allocated_bytes = 0;  // real disk usage (st_blocks * 512)
};

// Of `all` (a ListLayers answer, bottom first): the snapshot named `name` (not removed, not
// the head) and its ancestors up to and including the nearest one that is neither removed
// nor the head, bottom first. Empty when there is no such snapshot. Bounded by all.size()
// whatever the parent links say.
inline void SelectSnapshotLayers(const std::vector<LayerInfo>& all, const std::string& name, std::vector<LayerInfo>* out) {
  out->clear();
  const LayerInfo* cur = nullptr;
  for (const LayerInfo& l : all) {
    if (!l.head && !l.removed && l.name == name) cur = &l;
  }
  if (!cur) return;
  out->push_back(*cur);
  std::unordered_map<std::string, const LayerInfo*> by_id;
  for (const LayerInfo& l : all) by_id[l.id] = &l;
  for (size_t hops = 0; hops < all.size() && !cur->parent.empty(); ++hops) {
    auto it = by_id.find(cur->parent);
    if (it == by_id.end()) break;
    const LayerInfo* p = it->second;
    out->push_back(*p);
    if (!p->head && !p->removed) break;
    cur = p;
  }
  std::reverse(out->begin(), out->end());
}

// The pseudo layer id under which LayerExtents and ReadLayer expose the backing image, so
// that a snapshot's content (engine/snapshot-reader.h) can read it like the bottom of the
// chain, also from a remote replica. It is not a valid layer id: ListLayers never lists it,
// so reconcile and rebuild never copy image data, and WriteLayer/UnmapLayer/LayerDigest
// answer it as an unknown layer.
constexpr const char* kBackingImageLayerId = "backing-image";
// LayerExtents lists the blocks where the image holds data (kNotFound: no backing image);
// ReadLayer reads it, zeros above its virtual size.

// Largest range one LayerDigest call covers (bounds the reply: 1024 units of 4 KiB).
constexpr uint64_t kMaxDigestRangeBytes = 4ull << 20;
// What LayerDigest computes: masks and SHA-256 of every unit, or the masks alone.
enum class DigestDetail { kHashes, kMasksOnly };

class ReplicaBackend {
 public:
  virtual ~ReplicaBackend() = default;

  virtual std::string id() const = 0;   // the replica's directory, or host:port/path when remote
  // Reached over the network (its writes complete asynchronously, StartWrite only sends).
  virtual bool remote() const { return false; }
  virtual uint64_t size() const = 0;
  virtual uint64_t epoch() const = 0;   // highest epoch claimed on this replica (durable)
  virtual bool clean() const = 0;       // last engine closed it cleanly (MarkClean after flush)

  // Durably records `epoch` (must be > epoch(), else Code::kStaleEpoch) and marks the
  // replica not clean. After this returns, writes carrying an older epoch are refused
  // with -kErrStaleEpoch and no write carrying an older epoch is still in progress.
  // `stored` (may be null) receives the replica set stored on the replica when the claim
  // took effect (docs/single-writer.md). `was_clean` (may be null) receives whether the
  // replica was clean just before this claim, read under the same lock as the claim (false
  // when it cannot be known, e.g. from a replica server that predates the answer): the
  // engine skips the reconcile only when every RW replica it claimed was.
  virtual Status ClaimEpoch(uint64_t epoch, ReplicaSet* stored, bool* was_clean) = 0;
  // Durably stores `set` as this replica's replica set. Refused with kStaleEpoch unless
  // set.epoch == epoch() and `set` is newer than the stored one (the same set again is
  // accepted: a retry). kInvalidArgument for a malformed set. `self_rw`: this replica is RW
  // in `set` (the engine knows its member name; the replica does not), so the replica
  // records the set as its last RW one (see LastRw); a replica server that predates the
  // record stores the set without it.
  virtual Status SetReplicaSet(const ReplicaSet& set, bool self_rw) = 0;
  // The stored replica set (empty if none), without claiming anything; refreshes epoch().
  virtual Status PeekReplicaSet(ReplicaSet* out) = 0;
  // The newest replica set stored here in which this replica was RW (empty if none):
  // salvage ranks replicas by it (docs/salvage.md). kUnsupported from a replica server
  // that predates the record.
  virtual Status LastRw(ReplicaSetId* out) = 0;
  // Durably marks the replica clean. Caller has flushed and will write no more.
  virtual Status MarkClean(uint64_t epoch) = 0;
  // Grows the replica to size_bytes (a multiple of 4096, at most 2^60): every layer file
  // is extended first (the new range is a hole in each, so it reads as zeros through the
  // whole chain), then one metadata commit records the size (invariant 4). The same size
  // again is a retry: Ok. kInvalidArgument for a smaller size (replicas only grow) or a
  // malformed one. Not fenced by epoch, like Snapshot: a grow loses no data, and an engine
  // grows its replicas only under its own checks (Engine::Resize).
  virtual Status Grow(uint64_t size_bytes) = 0;
  // False for a replica whose server predates GROW (remote/replica-protocol.h), so an
  // engine can refuse a resize before it changes any replica.
  virtual bool CanGrow() const { return true; }

  // Data path. `epoch` is the writer's epoch: refused with -kErrStaleEpoch unless it is
  // epoch() (an older writer, or one whose claim never reached this replica).
  virtual int Read(uint64_t off, uint32_t len, uint8_t* buf) = 0;
  virtual int Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) = 0;
  // Split-phase Write, so an engine can have a write in flight on every replica at once:
  // StartWrite begins it (`buf` must stay valid until FinishWrite returns), FinishWrite
  // waits for it and returns what Write would have. Every StartWrite is paired with one
  // FinishWrite on the same PendingIo. By default StartWrite does the whole Write
  // (a local replica completes in the page cache at once); a remote one only sends it.
  //
  // With `waker` set before StartWrite, the backend calls waker->Wake() exactly once, when
  // FinishWrite would no longer wait: on the thread that completed the write (a
  // connection loop's, never under the backend's locks), or on the caller's before
  // StartWrite returns. So nobody has to block in FinishWrite (Engine::WriteAsync).
  // A PendingIo serves one StartWrite or StartRead at a time.
  struct Waker {
    virtual void Wake() = 0;

   protected:
    ~Waker() = default;
  };
  struct PendingIo {
    int rc = 0;
    std::vector<std::shared_ptr<void>> calls;  // backend-specific in-flight state
    Waker* waker = nullptr;
    std::atomic<uint32_t> unfinished{0};       // backend-specific: parts not yet answered
    // Set before StartWrite or StartRead: a backend that sends to another host may queue
    // the request without sending it, until SendDeferred (so several go in one message).
    // Its deadline runs from the start, so one never sent fails by timeout, not hangs.
    bool defer_send = false;
    // Optionally set before StartWrite: the write's bytes copied once into a buffer every
    // replica may send its frames' payloads from, instead of a copy of its own (a backend
    // keeps a reference until its frames are on the wire).
    std::shared_ptr<const ByteBuffer> shared_bytes;
    // Set before StartWrite (with defer_send): TryReserveWrite said yes for this write, so
    // queueing it never waits. The backend clears it once the slot is used or given back.
    bool reserved = false;
    // As new, the capacity of calls kept (for a record that is reused).
    void Reset() {
      rc = 0;
      calls.clear();
      waker = nullptr;
      unfinished.store(0);
      defer_send = false;
      shared_bytes.reset();
      reserved = false;
    }
  };
  virtual void StartWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua, PendingIo* p) {
    p->rc = Write(epoch, off, len, buf, fua);
    if (p->waker) p->waker->Wake();
  }
  virtual int FinishWrite(PendingIo* p) { return p->rc; }
  // Room to queue a write of len bytes (StartWrite with defer_send and reserved) without
  // waiting, taken now for it: true, or false when queueing it might wait (a full queue, a
  // backend that cannot tell). A reservation is used by that StartWrite or given back
  // (CancelReservedWrite). For callers on a thread that must not wait.
  virtual bool TryReserveWrite(uint32_t len) {
    (void)len;
    return false;
  }
  virtual void CancelReservedWrite() {}
  // Sends whatever StartWrite and StartRead queued with defer_send (nothing to do by
  // default). With may_wait, it may wait for room to send, as StartWrite may; without, what
  // cannot be sent at once is left to another thread.
  virtual void SendDeferred(bool may_wait = true) { (void)may_wait; }
  // Split-phase Read, the same way (`buf` is filled by FinishRead; the waker as above).
  virtual void StartRead(uint64_t off, uint32_t len, uint8_t* buf, PendingIo* p) {
    p->rc = Read(off, len, buf);
    if (p->waker) p->waker->Wake();
  }
  virtual int FinishRead(PendingIo* p, uint8_t* buf) {
    (void)buf;
    return p->rc;
  }
  // A Write (no FUA) done only if it cannot wait: -EWOULDBLOCK, with nothing changed, when
  // it might (a lock held by another operation, a first write that must commit the
  // replica's dirty mark, a partial block that must be read first, or a backend that cannot
  // tell). For callers on a thread that must not wait (the replica server's connection
  // loop, which then hands the write to a worker). Else what Write returns.
  virtual int TryWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf) {
    (void)epoch, (void)off, (void)len, (void)buf;
    return -EWOULDBLOCK;
  }
  // A Read done only if it cannot wait: -EWOULDBLOCK when it might (a lock held by another
  // operation, bytes not in the page cache, a backing image to read, or a backend that
  // cannot tell); `buf` is then unspecified. Else what Read returns.
  virtual int TryRead(uint64_t off, uint32_t len, uint8_t* buf) {
    (void)off, (void)len, (void)buf;
    return -EWOULDBLOCK;
  }
  virtual int Trim(uint64_t epoch, uint64_t off, uint64_t len) = 0;
  virtual int WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim, bool fast_only, bool fua) = 0;
  virtual int Flush() = 0;
  // Allocation across the whole chain (see BlockDevice::BlockStatus).
  virtual int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) = 0;

  // Per-layer access (reconcile, rebuild, export).
  virtual Status ListLayers(std::vector<LayerInfo>* out) = 0;       // every layer, bottom first
  // SelectSnapshotLayers of ListLayers: what a snapshot's info needs (its layer and the way to
  // its visible parent). A local replica answers from memory at a cost independent of the
  // chain's depth; this default lists everything.
  virtual Status SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) {
    std::vector<LayerInfo> all;
    Status s = ListLayers(&all);
    if (s.ok()) SelectSnapshotLayers(all, name, out);
    return s;
  }
  virtual Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) = 0;
  virtual int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) = 0;

  // Snapshots. The caller (Engine) has quiesced I/O to this replica.
  virtual Status Snapshot(const std::string& name, int64_t created_ms, const Labels& labels,
                          bool user_created) = 0;
  virtual Status DeleteSnapshot(const std::string& name) = 0;
  virtual Status Revert(const std::string& name, int64_t created_ms) = 0;

  // --- Rebuild (engine/rebuilder.cc drives these; see docs/rebuild.md). ---
  // True while a rebuild of this replica has not finished: durable, so an engine that
  // opens a replica left mid-rebuild treats it as ERR (it may miss data; invariant 3).
  virtual bool rebuilding() const = 0;
  // Makes this replica a rebuild target: its layer list becomes exactly `layers` (ids,
  // names, parents, flags, the head; as listed by a RW replica). Layers whose id it
  // already has keep their files (their data is compared by digest, not trusted); the
  // others get new empty files; layers not in the list are dropped. Sets rebuilding and
  // epoch = `epoch` (kStaleEpoch if the replica's epoch is already higher: another engine
  // owns it). Writes with `epoch` are accepted afterwards.
  virtual Status AdoptChain(const std::vector<LayerInfo>& layers, uint64_t epoch) = 0;
  // Digests of the units of one layer that intersect [off, off+len), in address order.
  // off and len are multiples of kDigestUnitBytes; len at most kMaxDigestRangeBytes.
  // kMasksOnly: the same units and masks, sha256 left zero (nothing read or hashed): for a
  // rebuild window the target holds nothing of, where only the source's blocks matter.
  virtual Status LayerDigest(const std::string& layer_id, uint64_t off, uint64_t len, DigestDetail detail,
                             std::vector<UnitDigest>* out) = 0;
  // Rebuild target only (rebuilding() true): writes whole blocks into one layer (any
  // layer, the head included) and records that the layer now holds them. `epoch` is the
  // rebuilding engine's: refused with -kErrStaleEpoch if older than epoch(), so an engine
  // fenced mid-rebuild cannot touch a target that a newer engine now rebuilds.
  virtual int WriteLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint32_t len, const uint8_t* buf) = 0;
  // Rebuild target only: the layer no longer holds whole blocks [off, off+len); reads of
  // them fall through to the layers below. Space is released. `epoch` as for WriteLayer.
  virtual int UnmapLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint64_t len) = 0;
  // Flushes and clears the rebuilding flag (durably). After this the replica is an equal.
  virtual Status FinishRebuild() = 0;

  // Called (once, from an internal thread) when the backend learns without being asked
  // that it can no longer serve: a remote replica's connection dropped or its keepalive
  // went unanswered. Lets an engine mark it ERR while idle instead of at the next write.
  // Not called for Close(). nullptr clears it; after Set returns, the old one is not
  // running and will not run. Local replicas never call it.
  using FailureListener = std::function<void(int neg_errno)>;
  virtual void SetFailureListener(FailureListener) {}

  virtual uint64_t AllocatedBytes() = 0;  // sum over all layer files
  virtual Status Close() = 0;             // idempotent; later calls return -EBADF / kClosed
};

}  // namespace mooring
