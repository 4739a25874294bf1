// Engine (replicator): serves one volume as a BlockDevice over N replicas.
//
// - Writes (and trims, write-zeroes) fan out to every RW replica; the call returns only
//   when all have it (invariant 1). Reads go to an RW replica in this process when there
//   is one (no network hop), else round-robin over RW replicas; a failed read is retried on
//   the next RW replica.
// - One writer (docs/single-writer.md): the engine is handed a unique epoch and never
//   changes it. The volume's replica set {epoch, generation, members, rw} is committed to
//   a majority of the members; a write is acknowledged only when every RW member has it.
// - A replica whose I/O fails is marked ERR and no longer used, as long as one RW replica
//   remains; before the failed request is answered the engine commits the replica set
//   without it, so the ERR replica is durably out of `rw` for every later engine
//   (invariant 3). Without a majority the request is held (quorum_hold_ms), then fails:
//   it is never acknowledged. If the last RW replica fails, the error goes to the caller
//   and the replica stays RW.
// - Start claims its epoch on every reachable replica (invariant 2), takes the latest
//   replica set among their answers, needs a majority of its members, uses the claimed
//   replicas in its rw (others are ERR), reconciles heads if any was not closed cleanly
//   (the first RW replica is the source), and commits (epoch, 1, members, rw) before it
//   serves.
// - Snapshot/Delete/Revert quiesce I/O (an exclusive lock against the data path's shared
//   lock) and apply to every RW replica.
// - A replica answering -ESTALE means another engine claimed a newer epoch: this engine is
//   fenced. It marks nothing ERR (the replicas are fine, the engine is not) and from then
//   on every call returns -ESTALE / Code::kStaleEpoch.
// - Replica failures that do not mark ERR: -EINVAL, -ENOTSUP, -EOVERFLOW (they describe
//   the request) and, on the control path, refusals such as kAlreadyExists/kNotFound.
// - A WO replica (rebuild target, AddReplica) gets every write, trim, write-zeroes and
//   snapshot after the RW replicas, never a read, flush or FUA; its failure marks it ERR
//   and fails its rebuild, never the request. Start opens a replica whose rebuild did not
//   finish (rebuilding()) as ERR (invariant 3). docs/rebuild.md has the details.
// - Hand-over (migration; docs/data-engine.md). Two engines may be open over the same
//   replicas, at most one of them active. A standby (Options.standby) opens and checks
//   its replicas but claims no epoch, reconciles and marks nothing, and serves nothing:
//   every BlockDevice call returns -EPERM, Snapshot/DeleteSnapshot/Revert/AddReplica
//   kInvalidState. Deactivate turns an active engine into a standby after stopping its
//   rebuild, draining and flushing, and hands over {epoch, generation, ids of its RW
//   replicas}; Activate(hand-over, new epoch) on a standby claims the new epoch, checks
//   that the latest replica set is the hand-over's, and commits its own. A hand-over is
//   good once: if another engine committed since, Activate fails with kStaleEpoch.
//   Activate does not reconcile: the deactivated engine
//   left its RW replicas identical, except where a write failed on every one of them
//   (all full), which may have landed on some only; NBD lets an unacknowledged write
//   read back as anything. A standby (never active, or handed over) closes its replicas
//   without flushing or marking them clean: another engine may be writing them.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "block/block-device.h"
#include "block/replica-backend.h"

namespace mooring {

enum class ReplicaMode { kRW, kWO, kERR };

inline const char* ReplicaModeName(ReplicaMode m) {
  switch (m) {
    case ReplicaMode::kRW: return "RW";
    case ReplicaMode::kWO: return "WO";
    case ReplicaMode::kERR: return "ERR";
  }
  return "ERR";
}

// Emitted: kEpochClaimed by Start and Activate; kReplicaSetChanged after every commit;
// kReplicaError for every replica marked ERR (at Start: fenced by a lower epoch, a
// different layer list, a failed claim; at Activate: not RW in the hand-over, a failed
// claim; later: a failed I/O, a lost connection), after the fence that makes it stale; kReconciled
// once by Start when heads were reconciled. Events raised by Start are delivered before
// Start returns.
// Rebuild events (AddReplica): kRebuildStarted once the target is WO; kRebuildProgress at
// most every kRebuildProgressIntervalBytes of scanned data; then kRebuildCompleted (the
// target is RW) or kRebuildFailed (the target is ERR, or was removed).
struct EngineEvent {
  enum class Type {
    kReplicaError,
    kEpochClaimed,
    kReconciled,
    kRebuildStarted,
    kRebuildProgress,
    kRebuildCompleted,
    kRebuildFailed,
    // A replica set was committed (docs/single-writer.md): epoch, generation, rw_members.
    kReplicaSetChanged,
    // Raised by the binding (not the engine) while a snapshot is exported or copied
    // (engine/snapshot-reader.h): bytes = data bytes read so far, total_bytes = all of them.
    kSnapshotCopyProgress,
    // Start with Options.salvage: replica_id = the source replica, epoch/generation = its
    // last RW set (0: none recorded), bytes = 1 when every acknowledged write is known to
    // be on it (the normal rules would have served from it), else 0; message says why.
    kSalvaged,
  };
  Type type;
  std::string replica_id;  // kReplicaError, kRebuild*
  int error = 0;           // negative errno: kReplicaError, kRebuildFailed
  uint64_t epoch = 0;      // kEpochClaimed: the new epoch
  uint64_t bytes = 0;      // kReconciled: bytes copied; kRebuild*: bytes sent to the target so far
  std::string message;
  uint64_t scanned_bytes = 0;  // kRebuild*: allocated bytes compared so far (source or target)
  uint64_t total_bytes = 0;    // kRebuild*, kSnapshotCopyProgress: bytes to handle in all
  std::string snapshot = {};   // kSnapshotCopyProgress: the snapshot being read
  uint64_t generation = 0;           // kReplicaSetChanged
  std::vector<std::string> rw_members = {};  // kReplicaSetChanged: member names of the RW replicas
};

// Progress events of a rebuild are at least this far apart (plus one at the end).
constexpr uint64_t kRebuildProgressIntervalBytes = 64ull << 20;

// What AddReplica did.
struct RebuildResult {
  uint64_t scanned_bytes = 0;  // allocated bytes compared (union of source and target, per layer)
  uint64_t sent_bytes = 0;     // data bytes written to the target
  uint64_t unmapped_bytes = 0; // bytes the target held that the source does not (unmapped)
  uint64_t duration_ms = 0;
};

// Called from I/O threads; must not block for long (the binding queues to JS).
using EngineEventSink = std::function<void(const EngineEvent&)>;

struct ReplicaState {
  std::string id;
  ReplicaMode mode;
  uint64_t epoch;
  uint64_t allocated_bytes;
  int last_error;  // negative errno of the failure that made it ERR, else 0
};

// What an engine hands to the next writer of its volume (Deactivate -> Activate).
struct HandOver {
  uint64_t epoch = 0;               // the epoch the deactivated engine held
  uint64_t generation = 0;          // the generation of its last committed replica set
  std::vector<std::string> rw_ids;  // its RW replicas (ReplicaBackend::id()), identical and flushed
};

class Engine : public BlockDevice {
 public:
  struct Options {
    std::vector<std::shared_ptr<ReplicaBackend>> replicas;
    EngineEventSink on_event;  // may be empty
    // Open as a migration standby (see the file comment): replicas are opened, an
    // unreachable one is ERR; nothing is claimed or changed.
    bool standby = false;
    // The writer epoch to claim (not for a standby): allocated by the caller so that no
    // other engine ever holds it (docs/single-writer.md). The engine never changes it.
    uint64_t epoch = 0;
    // The replicas' member names (control-plane replica ids), one per replica.
    std::vector<std::string> members;
    // How long a request waits for a replica-set commit that lacks a majority.
    uint32_t quorum_hold_ms = 15000;
    // Salvage (docs/salvage.md): the caller asserts that the volume's replicas not given
    // here are gone for good, and wants the volume back from the best of these. Start then
    // needs no majority of the latest replica set's members (only of these, to commit),
    // and when none of the claimed replicas is RW in the latest set it serves from the one
    // whose last RW set is newest (ReplicaBackend::LastRw). Without a claimed majority or
    // an RW replica of the latest set, acknowledged writes may be missing: kSalvaged says
    // so. Not for a standby.
    bool salvage = false;
  };

  // Fails with kNoHealthyReplica if no replica can be used, kInvalidArgument for 0 or
  // more than 16 replicas, duplicates, no epoch or member names,
  // kStaleEpoch if a replica promised an epoch at or above ours (the message names the
  // highest seen), kNoQuorum without a majority. On failure the replicas have been closed.
  static Status Start(Options opts, std::unique_ptr<Engine>* out);

  // BlockDevice: see block-device.h. After Shutdown every call returns -ESHUTDOWN.
  // (Implemented in engine.cc.)

  // The writer epoch held (a handed-over engine keeps the last one; 0 if never active).
  virtual uint64_t epoch() const = 0;
  // True while the engine serves nothing: opened as standby, or handed over.
  virtual bool standby() const = 0;
  virtual std::vector<ReplicaState> Replicas() const = 0;

  // Active -> standby, for a hand-over. Stops a running rebuild (its target stays
  // rebuilding on disk, so ERR for the next writer too), waits for requests in flight
  // (those queued behind it then fail with -EPERM), runs a pending fence, flushes every
  // RW replica (one that fails is marked ERR and fenced; the last one failing fails the
  // call and the engine stays active), then returns the epoch and the RW replicas. Does
  // not mark replicas clean. kInvalidState if standby already, kStaleEpoch if fenced,
  // kBusy if a Deactivate runs already or a snapshot read (export, copy) is open: its pin
  // holds only on this engine. Blocks for the drain and flush: worker thread.
  virtual Status Deactivate(HandOver* out) = 0;
  // Standby -> active with `epoch` (allocated by the caller, above every replica's).
  // Replicas not in h.rw_ids, unreachable, ERR here already, or left mid-rebuild become
  // ERR. kStaleEpoch (still standby) if a replica refuses the claim or the latest replica
  // set is not the hand-over's (it was used or overtaken); kNoQuorum if a majority of its
  // members cannot be claimed or committed; kNoHealthyReplica (still standby) if none of
  // the hand-over's replicas could be claimed; kInvalidState if active. Afterwards the
  // engine is like a started one. Blocks: worker thread.
  virtual Status Activate(const HandOver& h, uint64_t epoch) = 0;

  // Grows the volume to size_bytes (a positive multiple of 4096, at most 2^60) while it
  // serves: with I/O quiesced, every RW replica grows (in parallel, one metadata commit
  // each), then size(). Requests are checked against size(), so nothing reaches the new
  // range before every RW replica has it. A replica whose grow fails while another's
  // succeeds is ERR and dropped from the replica set (as for a failed write; its rebuild
  // gives it the new size); if none grew, nothing changed and the error is returned. The
  // size already: Ok. kInvalidArgument (smaller or malformed), kBusy (a rebuild runs: its
  // target would miss the grow), kUnsupported (a RW replica's server predates GROW; nothing
  // changed), kInvalidState (standby), kStaleEpoch, kClosed, kNoQuorum (the drop could not
  // be committed; the size stays). ERR replicas are left alone. Blocks: worker thread.
  //
  // The size rule at Start and Activate: the volume is as large as the largest size a RW
  // replica recorded, and smaller RW replicas are grown to it (one that cannot be is ERR),
  // so a resize cut short by a crash is finished by the next engine, never undone.
  virtual Status Resize(uint64_t size_bytes) = 0;

  virtual Status Snapshot(const std::string& name, const Labels& labels, bool user_created) = 0;
  // Every layer (snapshots, removed-but-kept ones, and the head), bottom first, from the
  // first RW replica.
  virtual Status ListSnapshots(std::vector<LayerInfo>* out) = 0;
  // Of the same replica: what a snapshot's info needs (ReplicaBackend::SnapshotLayers), at
  // a cost independent of the chain's depth for a local replica.
  virtual Status SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) = 0;
  virtual Status DeleteSnapshot(const std::string& name) = 0;
  virtual Status Revert(const std::string& name) = 0;

  // Rebuild (engine/rebuilder.cc). Blocks for the whole copy: call from a worker thread.
  // Adds `target` write-only (it gets every mutation from now on and no reads; unaligned
  // ones are not widened: see docs/rebuild.md), makes its layer list equal to a RW replica's (AdoptChain),
  // copies what it lacks layer by layer, bottom first — units whose digests already match
  // are not sent — then flushes, clears its rebuilding flag and makes it RW. Foreground
  // I/O continues throughout; snapshot delete and revert are refused (kBusy) meanwhile.
  // If `target`'s id is already a slot (an ERR replica coming back), that slot is reused.
  // `member` is its member name; it joins the replica set (members and rw) when it turns RW,
  // by a commit (kNoQuorum if that lacks a majority: the target is then ERR).
  // Fails with kNoHealthyReplica if no RW replica exists, kInvalidState if the slot is
  // RW/WO already, kOutOfRange beyond 16 replicas, kBusy if another rebuild runs on this
  // engine, kClosed if stopped by RemoveReplica/Shutdown, or the target's error (then it
  // is ERR). `target` is always consumed: closed if it could not be added.
  virtual Status AddReplica(std::shared_ptr<ReplicaBackend> target, const std::string& member, RebuildResult* out) = 0;
  // Removes a replica that is not RW (ERR, or WO: that aborts its rebuild) and closes it;
  // it leaves the replica set's members by a commit first (kNoQuorum: it stays).
  // kInvalidState for a RW replica, unless allow_rw and another replica is RW (a healthy
  // replica moved off its host: every acknowledged write is on every RW replica, so the
  // others hold them all); kNotFound for an unknown id.
  virtual Status RemoveReplica(const std::string& id, bool allow_rw) = 0;

  // Waits for in-flight calls, flushes, marks replicas clean, closes them (a standby only
  // closes them). Idempotent.
  // Replicas() keeps answering afterwards with the last known state.
  virtual Status Shutdown() = 0;

  // --- Snapshot reads (SnapshotReader, engine/snapshot-reader.h, drives these) ---------
  // One read of snapshot layers, from one RW replica at a time. While any read is open,
  // DeleteSnapshot and Revert fail with kBusy, so no layer is merged, pruned or dropped
  // under it; writes, trims and Snapshot go on (they change only the head, or turn the
  // head into a new layer). Calls are thread-safe; the object must not outlive its engine.
  class SnapshotRead {
   public:
    virtual ~SnapshotRead() = default;  // ends the read
    // The replica read from (its ReplicaBackend id).
    virtual std::string replica_id() const = 0;
    // As the ReplicaBackend calls of that replica. Besides the replica's own errors they
    // fail with -ESHUTDOWN / kClosed once the engine is shut down, -ESTALE / kStaleEpoch
    // once it is fenced, and -EIO / kIoError once the replica is no longer RW.
    virtual Status ListLayers(std::vector<LayerInfo>* out) = 0;
    virtual Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) = 0;
    virtual int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) = 0;
    // After the replica failed with `neg_errno`: marks it ERR as a failed read would
    // (fenced before the next write is answered), unless it is the last RW replica, and
    // goes on with another RW replica (whose layer list is the same). Fails with
    // kNoHealthyReplica when there is none.
    virtual Status Failover(int neg_errno) = 0;
  };
  // Opens a read (kClosed, kStaleEpoch, kNoHealthyReplica; kBusy beyond 16 at once).
  virtual Status OpenSnapshotRead(std::unique_ptr<SnapshotRead>* out) = 0;
};

}  // namespace mooring
