// ReplicatedEngine: the Engine over N ReplicaBackends (see engine.h for the contract).
//
// Locking:
// - gate_ (engine/data-gate.h: a writer-preferring RwLock, taken at most once per thread,
//   plus the async reads and writes in flight): the data path holds it shared;
//   snapshot/delete/revert, fencing and shutdown hold it exclusive, which also waits for
//   every async request to finish. Epoch changes happen only under the exclusive lock, so no write of ours can
//   ever carry an epoch older than a replica's: -ESTALE from a replica always means
//   another engine took the volume over.
// - Async writes (WriteAsync, for the NBD frontend): where every RW replica is remote and
//   nothing else is going on (no WO replica, no drop to fence), a write is started under
//   the shared gate and detached from it; the replicas' answers finish it on the thread
//   that reads the last one (SettleRw, as Mutate does), and only a drop to fence goes to a
//   worker (CommitDrops waits) before the answer. Async reads (ReadAsync) likewise, where
//   the read goes to a remote replica; a failed one is retried on a worker.
// - state_mu_: replica modes and the list of replicas marked ERR but not yet fenced.
//   Modes are also atomics so the data path picks targets without taking it. The slot
//   list itself changes (AddReplica, RemoveReplica) only under gate_ exclusive and
//   state_mu_ together, so the data path (gate_ shared) and Replicas() (state_mu_) each
//   see a stable list.
// - rebuild_mu_: the one running rebuild (AddReplica, engine/rebuilder.cc) and requests to
//   stop it. Taken before gate_, never while holding it.
//
// A WO replica (rebuild target) gets every mutation after the RW replicas have it, never
// a read, and no flush: its durability does not matter until FinishRebuild, which syncs
// everything. Its failure marks it ERR and fails the rebuild, never the client's request,
// and needs no fence: its rebuilding flag (durable since AdoptChain) already keeps any
// later engine from reading it (invariant 3).
//
// Hand-over (Deactivate/Activate): standby_ changes only under gate_ exclusive and
// state_mu_ together, so the data path (gate_ shared) and OnBackendLost (state_mu_) each
// see it stable. While standby the data path returns -EPERM before touching a replica,
// and nothing is claimed, fenced, flushed or marked clean: another engine may own the
// replicas. A hand-over is checked against the replicas: Activate refuses it before
// claiming anything if a replica promised a later epoch or holds a later replica set, and
// again after its claims if the latest replica set is not the hand-over's.
//
// Fan-out is sequential for writes (local replicas complete in the page cache) and
// parallel for flushes (Fanout::kParallel). A remote backend (later issue) makes writes
// submit-all-then-wait too; the settlement logic after the loop does not change.
#include "engine/engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <shared_mutex>
#include <system_error>
#include <thread>
#include <type_traits>

#include "engine/data-gate.h"
#include "engine/range-lock.h"
#include "engine/rebuilder.h"
#include "engine/reconciler.h"
#include "image/image-reader.h"
#include "nbd/worker-pool.h"
#include "net/buffer-pool.h"
#include "util/thread-name.h"

namespace mooring {
namespace {

// Upper bound on replicas per engine; the data path keeps target lists on the stack.
constexpr size_t kMaxReplicas = 16;
// Commit rounds: each round either commits or drops at least one more replica.
constexpr size_t kMaxFenceRounds = kMaxReplicas + 1;
// While a commit is held for a majority, it is tried again this often.
constexpr int kCommitRetryMs = 200;
// What the data path of a standby returns, and the stop reason of a rebuild that a
// Deactivate ended (NBD sends it as NBD_EPERM: this server may not serve the request).
constexpr int kErrStandby = EPERM;
// Copy passes of one rebuild: a pass copies the layers not copied yet; another pass is
// needed only when a snapshot was taken during the previous one, or the source failed.
constexpr size_t kMaxRebuildPasses = 64;
// Snapshot reads (exports, copies) open at once on one engine; each holds a pool thread.
constexpr uint32_t kMaxSnapshotReads = 16;
// Largest volume a replica can record (ReplicaMetadata::kMaxSizeBytes).
constexpr uint64_t kMaxVolumeBytes = 1ull << 60;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int ErrnoOf(const Status& st) { return st.sys_errno > 0 ? -st.sys_errno : -EIO; }

// A data-path error that describes the request, not the replica: it does not mark the
// replica ERR (every replica would answer the same).
bool IsRequestError(int rc) { return rc == -EINVAL || rc == -ENOTSUP || rc == -EOVERFLOW; }

// The control-path counterpart.
bool IsRequestError(Code c) {
  switch (c) {
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kAlreadyExists:
    case Code::kInvalidState:
    case Code::kBusy:
    case Code::kUnsupported:
    case Code::kOutOfRange:
      return true;
    default:
      return false;
  }
}

struct BusyFlag {
  explicit BusyFlag(std::atomic<bool>& f) : flag(f) { flag = true; }
  ~BusyFlag() { flag = false; }
  std::atomic<bool>& flag;
};

struct Slot {
  std::shared_ptr<ReplicaBackend> backend;
  std::string id;
  std::string member;            // its name in the volume's replica set (docs/single-writer.md)
  std::atomic<ReplicaMode> mode{ReplicaMode::kRW};
  int last_error = 0;            // guarded by state_mu_
  uint64_t closed_epoch = 0;     // guarded by state_mu_; Replicas() after Close
  bool reported = false;         // guarded by state_mu_: its replica-error event went out already
  bool clean_at_claim = false;   // under the gate: clean just before this engine's claim (ClaimLocked)
  std::atomic<uint64_t> cached_allocated{0};
};

using Events = std::vector<EngineEvent>;

struct Targets {
  size_t idx[kMaxReplicas];
  size_t n = 0;
};

class ReplicatedEngine final : public Engine {
 public:
  explicit ReplicatedEngine(Options opts)
      : sink_(std::move(opts.on_event)),
        open_epoch_(opts.epoch),
        quorum_hold_ms_(opts.quorum_hold_ms),
        members_given_(opts.members.size() == opts.replicas.size()),
        standby_(opts.standby),
        salvage_(opts.salvage) {
    slots_.reserve(opts.replicas.size());
    for (size_t i = 0; i < opts.replicas.size(); ++i) {
      auto s = std::make_unique<Slot>();
      s->backend = std::move(opts.replicas[i]);
      if (s->backend) s->id = s->backend->id();
      if (i < opts.members.size()) s->member = opts.members[i];
      slots_.push_back(std::move(s));
    }
  }
  ~ReplicatedEngine() override { Shutdown(); }

  Status Open();
  // Open() of a standby: sizes checked, unreachable replicas ERR, nothing claimed.
  Status OpenStandby();
  void CloseReplicas();
  // A backend that fails on its own (a remote replica's connection drops while idle) is
  // made ERR at once, as an I/O failure would: see ReplicaBackend::SetFailureListener.
  void WatchBackend(ReplicaBackend* b);
  void OnBackendLost(const ReplicaBackend* b, int rc);

  uint64_t size() const override { return size_.load(); }
  uint64_t epoch() const override { return epoch_.load(); }
  bool standby() const override { return standby_.load(); }
  std::vector<ReplicaState> Replicas() const override;
  Status Deactivate(HandOver* out) override;
  Status Activate(const HandOver& h, uint64_t epoch) override;
  Status Resize(uint64_t size_bytes) override;

  int Read(uint64_t off, uint32_t len, uint8_t* buf) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return ReadFrom([&](ReplicaBackend& b) { return b.Read(off, len, buf); });
  }
  int Write(uint64_t off, uint32_t len, const uint8_t* buf, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    // FUA is about the reply's durability, which only RW replicas carry.
    return Mutate(off, len, SplitWrite{off, len, buf, fua});
  }
  void WriteAsync(uint64_t off, uint32_t len, const uint8_t* buf, bool fua, IoCompletion* done) noexcept override {
    const AsyncWriteReq q{off, len, buf, fua, done};
    WriteAsyncMany(&q, 1);
  }
  void WriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept override;
  size_t TryWriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept override;
  void ReadAsync(uint64_t off, uint32_t len, uint8_t* buf, IoCompletion* done) noexcept override {
    const AsyncReadReq q{off, len, buf, done};
    ReadAsyncMany(&q, 1);
  }
  void ReadAsyncMany(const AsyncReadReq* q, size_t n) noexcept override;
  int TryRead(uint64_t off, uint32_t len, uint8_t* buf) override {
    if (len == 0 || !InRange(off, len, size_)) return -EWOULDBLOCK;
    std::shared_lock<DataGate> lk(gate_, std::try_to_lock);
    if (!lk.owns_lock() || RefusalLocked() != 0) return -EWOULDBLOCK;
    // Where ReadFrom would read, if that is a replica in this process; its errors are
    // left to ReadFrom, which drops the replica and reads from another.
    const size_t pick = PickReadSource();
    if (pick == slots_.size() || slots_[pick]->backend->remote()) return -EWOULDBLOCK;
    return slots_[pick]->backend->TryRead(off, len, buf) == 0 ? 0 : -EWOULDBLOCK;
  }
  int Flush() override {
    return Mutate(0, 0, [](ReplicaBackend& b, uint64_t, size_t, bool) { return b.Flush(); }, Fanout::kParallel, false);
  }
  int Trim(uint64_t off, uint32_t len, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return Mutate(off, len, [&](ReplicaBackend& b, uint64_t e, size_t, bool wo) {
      int rc = b.Trim(e, off, len);
      return rc == 0 && fua && !wo ? b.Flush() : rc;
    });
  }
  int WriteZeroes(uint64_t off, uint32_t len, bool may_trim, bool fast_only, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return Mutate(off, len, [&](ReplicaBackend& b, uint64_t e, size_t k, bool wo) {
      int rc = b.WriteZeroes(e, off, len, may_trim, fast_only, fua && !wo);
      // The first replica decides whether the fast path exists (an -ENOTSUP there
      // aborts with nothing changed); later ones must follow it, slowly if need be.
      if (rc == -ENOTSUP && fast_only && k > 0) rc = b.WriteZeroes(e, off, len, may_trim, false, fua && !wo);
      return rc;
    });
  }
  int BlockStatus(uint64_t off, uint32_t len, uint32_t max_extents, std::vector<Extent>* out) override {
    if (len == 0 || max_extents == 0 || !InRange(off, len, size_)) return -EINVAL;
    return ReadFrom([&](ReplicaBackend& b) {
      out->clear();
      return b.BlockStatus(off, len, max_extents, out);
    });
  }
  bool GroupsRequests() override {
    std::shared_lock<DataGate> lk(gate_, std::try_to_lock);  // asked on the NBD loop: never waits
    return lk.owns_lock() && RefusalLocked() == 0 && WoTargets().n == 0 && AllRemote(RwTargets());
  }
  bool BlockStatusIsCheap() override {
    // BlockStatus goes where a read goes (ReadFrom): a replica in this process if one is RW.
    std::shared_lock<DataGate> lk(gate_);
    for (const auto& s : slots_)
      if (s->mode.load() == ReplicaMode::kRW && !s->backend->remote()) return true;
    return false;
  }
  int Cache(uint64_t off, uint32_t len) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (closed_.load()) return -ESHUTDOWN;
    return standby_.load() ? -kErrStandby : 0;
  }

  // A snapshot during a rebuild is applied to the WO target too (the rebuild copies the new
  // layer afterwards); delete and revert would remove or rewrite layers under the copy.
  Status Snapshot(const std::string& name, const Labels& labels, bool user_created) override {
    const int64_t now = NowMs();  // one timestamp, identical on every replica
    return Control([&](ReplicaBackend& b) { return b.Snapshot(name, now, labels, user_created); }, true);
  }
  Status ListSnapshots(std::vector<LayerInfo>* out) override;
  Status SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) override;
  Status DeleteSnapshot(const std::string& name) override {
    return Control([&](ReplicaBackend& b) { return b.DeleteSnapshot(name); }, false);
  }
  Status Revert(const std::string& name) override {
    const int64_t now = NowMs();
    return Control([&](ReplicaBackend& b) { return b.Revert(name, now); }, false);
  }
  Status AddReplica(std::shared_ptr<ReplicaBackend> target, const std::string& member, RebuildResult* out) override;
  Status RemoveReplica(const std::string& id, bool allow_rw) override;
  Status Shutdown() override;
  Status OpenSnapshotRead(std::unique_ptr<SnapshotRead>* out) override;

 private:
  Targets TargetsIn(ReplicaMode m) const {
    Targets t;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i]->mode.load() == m) t.idx[t.n++] = i;
    return t;
  }
  Targets RwTargets() const { return TargetsIn(ReplicaMode::kRW); }
  // At least one target, and every one on another host.
  bool AllRemote(const Targets& t) const {
    for (size_t k = 0; k < t.n; ++k)
      if (!slots_[t.idx[k]]->backend->remote()) return false;
    return t.n > 0;
  }
  Targets WoTargets() const { return TargetsIn(ReplicaMode::kWO); }
  size_t RwCount() const { return RwTargets().n; }

  // Marks slot i ERR after a failure, unless it is the last RW replica (which keeps
  // serving and passes the error up). Returns true if i no longer counts as RW.
  bool MarkFailed(size_t i, int rc);
  bool MarkFailedLocked(size_t i, int rc);  // caller holds state_mu_
  // MarkFailed for a slot known by pointer (the rebuild's source); false if it is gone.
  bool MarkSlotFailed(const Slot* s, int rc);
  // A WO replica failed: ERR, which fails its rebuild. No fence (see the file comment).
  void MarkWoFailed(size_t i, int rc);
  // Unconditional (Start): the replica is unusable even if it is the last one.
  void MarkErr(size_t i, int rc, const std::string& why, Events* ev);
  // Commits the replica set without the replicas marked ERR since the last commit, if
  // any (docs/single-writer.md). With `hold`, waits up to quorum_hold_ms_ for a majority
  // (unless a hold expired already since the last commit: then one try). Caller holds
  // gate_ exclusively. Returns 0, -kErrStaleEpoch (fenced) or -kErrNoQuorum.
  int CommitDropsLocked(Events* ev, bool hold = true);
  int CommitDrops() {
    Events ev;
    int rc;
    {
      std::unique_lock<DataGate> lk(gate_);
      rc = CommitDropsLocked(&ev);
    }
    Emit(ev);
    return rc;
  }
  // Stores `next` on every reachable member of prev.members and next.members; committed
  // once a majority of each accepted. A RW member of `next` that fails the call is marked
  // failed and left out of a retry (next generation). Then set_ = next. Caller holds gate_
  // exclusively. Returns 0, -kErrStaleEpoch (fenced) or -kErrNoQuorum.
  int CommitLocked(const ReplicaSet& prev, ReplicaSet next, bool hold, Events* ev);
  // Claims `e` on every reachable slot (unreachable ones and failed claims become ERR) and
  // finds the latest replica set among the answers (the legacy set when none has one).
  // kStaleEpoch if a replica promised `e` or more; kNoQuorum without a majority of the
  // latest set's members (unless `need_quorum` is false: salvage). Caller holds gate_
  // exclusively.
  Status ClaimLocked(uint64_t e, ReplicaSet* latest, Events* ev, bool need_quorum = true);
  // Salvage at Start (Options.salvage), after the claim: keeps RW only the claimed RW
  // replicas of `latest` if there are any, else the one with the newest last RW set; the
  // others become ERR. Emits kSalvaged. `majority`: the claim reached a majority of
  // latest's members; `all_claimed`: every given replica. A salvage that may lose writes
  // (no majority, or no RW replica of latest) needs all of them, else kNoQuorum: one that
  // did not answer may be the freshest (test/model, BROKEN_SALVAGE_PARTIAL).
  Status ChooseSalvageSourceLocked(const ReplicaSet& latest, bool majority, bool all_claimed, Events* ev);
  // The replica set after `pending` were dropped and the replica-error events for them.
  void ReportDropped(const std::vector<size_t>& pending, Events* ev);
  // A copy of the committed replica set.
  ReplicaSet CommittedSet() const {
    std::lock_guard<std::mutex> lk(state_mu_);
    return set_;
  }
  void Emit(const Events& ev) const {
    if (!sink_) return;
    for (const EngineEvent& e : ev) {
      try {
        sink_(e);
      } catch (...) {
        // An event consumer must never take the data path down.
      }
    }
  }

  // Runs op(backend, epoch, k, wo) on every RW replica, then (with_wo) on every WO one.
  // [off, off+len) is the range it changes (len 0: none). kSerial calls replicas one after
  // another on this thread (cheap page-cache writes); kParallel runs each extra RW replica
  // on its own short-lived thread (slow calls such as fdatasync, where waiting for N
  // replicas in series would add their latencies).
  // With a SplitWrite op, kSerial starts the write on every RW replica before waiting for
  // any (StartWrite/FinishWrite), so remote replicas have it in flight at once.
  enum class Fanout { kSerial, kParallel };
  struct SplitWrite {
    uint64_t off;
    uint32_t len;
    const uint8_t* buf;
    bool fua;
    // FUA is about the reply's durability, which only RW replicas carry.
    void Start(ReplicaBackend& b, uint64_t e, bool wo, ReplicaBackend::PendingIo* p) const {
      b.StartWrite(e, off, len, buf, fua && !wo, p);
    }
    int Finish(ReplicaBackend& b, ReplicaBackend::PendingIo* p) const { return b.FinishWrite(p); }
    int operator()(ReplicaBackend& b, uint64_t e, size_t, bool wo) const {
      ReplicaBackend::PendingIo p;
      Start(b, e, wo, &p);
      return Finish(b, &p);
    }
  };
  template <typename Op>
  int Mutate(uint64_t off, uint64_t len, Op op, Fanout fanout = Fanout::kSerial, bool with_wo = true);
  // Under the gate: why the data path refuses every request now (closed, standby, fenced),
  // or 0.
  int RefusalLocked() const {
    if (closed_) return -ESHUTDOWN;
    if (standby_) return -kErrStandby;
    if (fenced_) return -kErrStaleEpoch;
    return 0;
  }
  // After a mutation ran on the RW targets t with results rcs: its result. A replica that
  // failed is marked ERR (*marked) unless it is the last RW one; STALE_EPOCH fences the
  // engine. Takes state_mu_ only.
  int SettleRw(const Targets& t, const int* rcs, bool* marked);

  // --- writes answered by the replicas' answers (WriteAsync) ---
  static constexpr uint32_t kFenceLaneCap = 2;  // workers fencing this engine's async writes at once
  static constexpr size_t kAsyncBatchMax = 64;  // writes started under one hold of the gate, at most
  // A write in flight on remote RW replicas only, detached from the gate (DataGate::Detach).
  // Every replica's PendingIo wakes it; the last wake finishes it (FinishAsync).
  struct AsyncWrite final : ReplicaBackend::Waker, WorkerPool::Job {
    ReplicatedEngine* engine = nullptr;
    IoCompletion* done = nullptr;
    Targets t;
    ReplicaBackend* backends[kMaxReplicas] = {};
    ReplicaBackend::PendingIo pending[kMaxReplicas];
    std::optional<RangeLock::Guard> range;
    std::atomic<uint32_t> unwoken{0};
    int result = 0;
    void Wake() override {
      if (unwoken.fetch_sub(1) == 1) engine->FinishAsync(this);
    }
    // As new (for WriteCache): what it holds is let go (the calls, the shared bytes).
    void Reset() {
      next = nullptr;
      run = nullptr;
      engine = nullptr;
      done = nullptr;
      t = Targets();
      for (ReplicaBackend::PendingIo& p : pending) p.Reset();
      range.reset();
      unwoken.store(0);
      result = 0;
    }
  };
  // Finished AsyncWrites kept for the next ones, by every engine of the process (bounded
  // memory however many volumes). Each is over 1 KiB, and glibc's malloc of that size first
  // consolidates the heap's fast bins: about 2% of the engine host's CPU on 4k writes, plus
  // the replicas' vectors of calls, which keep their capacity here.
  class WriteCache {
   public:
    // Never destroyed: engines give records back until the process ends.
    static WriteCache& Get() {
      static WriteCache* cache = new WriteCache();
      return *cache;
    }
    AsyncWrite* Take() {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (n_ > 0) return free_[--n_];
      }
      return new (std::nothrow) AsyncWrite();
    }
    // w as new (calls kept empty), or freed when the cache is full.
    void Give(AsyncWrite* w) {
      w->Reset();
      {
        std::lock_guard<std::mutex> g(mu_);
        if (n_ < kCap) {
          free_[n_++] = w;
          return;
        }
      }
      delete w;
    }

   private:
    WriteCache() = default;
    static constexpr size_t kCap = 256;  // 300 KiB at most
    std::mutex mu_;
    AsyncWrite* free_[kCap];
    size_t n_ = 0;  // guarded by mu_
  };
  // The replicas a group of requests queued frames on (Touch), to send at its end (SendTouched).
  struct Touched {
    ReplicaBackend* b[kMaxReplicas];
    size_t n = 0;
    // false (TryWriteAsyncMany): every replica must have room to queue a write at once
    // (ReplicaBackend::TryReserveWrite), and what a socket does not take at once goes to
    // a worker (SendDeferred).
    bool may_wait = true;
  };
  enum class Start { kStarted, kNotPlain, kRangeBusy, kNoRoom };
  // Under the shared gate: starts q as an async write if it is the plain case (see
  // WriteAsyncMany) and returns it, its own wake still to come (AsyncWrite::Wake); or
  // returns nullptr with nothing started, and *why. With `touched` (a group), the
  // replicas' frames are queued, not sent (*touched collects the backends to SendDeferred,
  // SendTouched), and an overlapping write in flight is kRangeBusy instead of a wait; a
  // group that may not wait (Touched::may_wait) gets kNoRoom where a replica has no room.
  // Throws only before anything is started (ENOMEM).
  AsyncWrite* StartPlainLocked(const AsyncWriteReq& q, Touched* touched, Start* why);
  static void Touch(Touched* touched, ReplicaBackend* b);  // b has deferred frames
  static std::shared_ptr<const ByteBuffer> SharedCopy(const uint8_t* buf, uint32_t len);
  // For WriteAsyncMany and ReadAsyncMany, under the shared gate (lk): if the engine refuses
  // I/O (closed, standby, fenced), lets the gate go, answers q[i..n) with that and returns
  // true.
  template <typename Req>
  bool RefuseRestLocked(std::shared_lock<DataGate>* lk, const Req* q, size_t n, size_t i) {
    const int rc = RefusalLocked();
    if (rc == 0) return false;
    lk->unlock();
    for (; i < n; ++i) q[i].done->IoDone(rc);
    return true;
  }
  // An empty request (0) or one outside the volume (EINVAL): answered, true.
  template <typename Req>
  bool AnswerTrivial(const Req& q) const {
    if (q.len > 0 && InRange(q.off, q.len, size_)) return false;
    q.done->IoDone(q.len == 0 ? 0 : -EINVAL);
    return true;
  }
  static void SendTouched(Touched* touched);
  // On the thread of the last answer (a connection loop: never waits). Settles the results,
  // lets the range and the gate go, and answers; or, when a replica was dropped and must be
  // fenced first (CommitDrops waits), leaves that and the answer to a worker (FenceAndAnswer).
  void FinishAsync(AsyncWrite* w);
  static void FenceAndAnswer(WorkerPool::Job* job);
  // A read in flight on one remote RW replica, detached from the gate.
  struct AsyncRead final : ReplicaBackend::Waker, WorkerPool::Job {
    ReplicatedEngine* engine = nullptr;
    IoCompletion* done = nullptr;
    size_t pick = 0;
    ReplicaBackend* backend = nullptr;
    ReplicaBackend::PendingIo pending;
    uint64_t off = 0;
    uint32_t len = 0;
    uint8_t* buf = nullptr;
    void Wake() override { engine->FinishAsyncRead(this); }
  };
  // The replica's answer, on its thread: the bytes, or a replica error that is the answer;
  // else the replica is dropped and a worker reads from another and fences (RetryRead).
  void FinishAsyncRead(AsyncRead* r);
  static void RetryRead(WorkerPool::Job* job);
  // A read's result that is its answer whichever replica gave it: the bytes, the request's
  // own error, or a damaged backing image, which fails the same read on every replica (each
  // disk holds a copy with the same checksum: no replica is dropped). Else the replica failed.
  static bool ReadIsAnswered(int rc) { return rc >= 0 || IsRequestError(rc) || rc == -kErrCorruptImage; }
  // Under the gate: the RW replica a read goes to (one in this process first, else round
  // robin), or slots_.size() if none.
  size_t PickReadSource() const;
  template <typename Op>
  int ReadFrom(Op op);
  // Runs op on every RW replica (and, if to_wo, on every WO one) with I/O quiesced.
  // !to_wo operations are refused with kBusy while a rebuild runs.
  template <typename Op>
  Status Control(Op op, bool to_wo);

  Status CheckLayers(Events* ev);
  // The size rule (docs/data-engine.md, "Resize"): the volume is as large as the largest
  // size a RW replica recorded; smaller RW replicas (a resize cut short by a crash) are
  // grown to it, and one that cannot be is ERR. Sets size_. Caller holds gate_ exclusively.
  void SettleSizeLocked(Events* ev);
  Status Reconcile(Events* ev);
  // Under the exclusive gate: the body of Activate once the states are checked.
  Status ActivateLocked(const HandOver& h, uint64_t epoch, Events* ev);
  // Runs f(k) for every target t.idx[k] at once: the first on this thread, the others on
  // short-lived threads (a flush is an fdatasync; N replicas in series add up).
  template <typename F>
  void ForEachParallel(const Targets& t, F f);

  // --- rebuild (AddReplica) ---
  // Under the exclusive gate: adopts the source's chain on `target` and installs it WO.
  Status StartRebuild(const std::shared_ptr<ReplicaBackend>& target, const std::string& member, Slot** out, Events* ev);
  // The copy passes and the switch to RW.
  Status RunRebuild(Slot* slot, RebuildResult* res, uint64_t* total);
  // Under the exclusive gate: if the source lists no layer outside `copied`, checks the
  // chains match, clears the target's rebuilding flag and makes it RW (*finished = true).
  Status FinishRebuildLocked(Slot* slot, const std::vector<std::string>& copied, bool* finished, Events* ev);
  // The first RW slot and its backend; false if none.
  bool PickSource(Slot** slot, std::shared_ptr<ReplicaBackend>* backend) const;
  // 0, or why the rebuild of `slot` must stop (a stop request, or the target failed).
  int RebuildCheck(const Slot* slot) const;
  void EmitRebuild(EngineEvent::Type type, const std::string& id, const RebuildResult& r, uint64_t total,
                   int error = 0, const std::string& message = "");
  // Asks the running rebuild (of `id`, or any if empty) to stop with `why` and waits
  // until it has. Caller holds neither rebuild_mu_ nor gate_.
  void StopRebuild(const std::string& id, int why);

  std::vector<std::unique_ptr<Slot>> slots_;
  EngineEventSink sink_;
  // Grows (Resize) under gate_ exclusive, after every RW replica has the new size; read
  // by the data path without the gate (a request checked against the old size is inside
  // the new one too).
  std::atomic<uint64_t> size_{0};
  std::atomic<uint64_t> epoch_{0};
  const uint64_t open_epoch_;        // Options.epoch: what Open claims
  const uint32_t quorum_hold_ms_;
  const bool members_given_;
  // The replica set last committed (docs/single-writer.md). Changed under gate_ exclusive
  // and state_mu_ together; read under either.
  ReplicaSet set_;
  // A hold for a majority expired since the last commit: later commits try once, no hold.
  std::atomic<bool> quorum_lost_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> fenced_{false};  // another engine claimed a newer epoch
  std::atomic<bool> control_busy_{false};  // a control operation holds the replicas
  std::atomic<bool> fence_pending_{false};  // unfenced_ is not empty
  // Serves nothing (opened as standby, or handed over). See the file comment.
  std::atomic<bool> standby_{false};
  const bool salvage_;  // Options.salvage: Open's rules for a volume brought back (salvage)
  mutable std::atomic<uint32_t> next_read_{0};
  // Writer-preferring, so a steady stream of requests cannot starve a snapshot.
  mutable DataGate gate_;
  RangeLock ranges_;
  mutable std::mutex state_mu_;
  std::vector<size_t> unfenced_;  // guarded by state_mu_

  std::mutex rebuild_mu_;
  std::condition_variable rebuild_cv_;
  bool rebuild_active_ = false;       // guarded by rebuild_mu_
  bool shutting_down_ = false;        // guarded by rebuild_mu_
  bool handing_over_ = false;         // guarded by rebuild_mu_: a Deactivate runs
  std::string rebuild_target_;        // guarded by rebuild_mu_
  std::atomic<bool> rebuilding_{false};  // == rebuild_active_, readable without the mutex
  std::atomic<int> rebuild_stop_{0};     // negative errno once a stop was requested

  // --- snapshot reads (OpenSnapshotRead) ---
  class SnapshotReadImpl;
  // Open SnapshotReads. Changed under gate_ (shared), read by Control under gate_
  // (exclusive), so a delete either sees the read or ran before it listed the layers.
  std::atomic<uint32_t> snapshot_reads_{0};

  // Where an async write that dropped a replica is fenced and answered (FenceAndAnswer).
  // Last, so it is destroyed first: its destructor waits for those jobs.
  WorkerPool::Lane fence_lane_{&WorkerPool::Nbd(), kFenceLaneCap};
};

bool ReplicatedEngine::MarkFailed(size_t i, int rc) {
  std::lock_guard<std::mutex> lk(state_mu_);
  return MarkFailedLocked(i, rc);
}

bool ReplicatedEngine::MarkFailedLocked(size_t i, int rc) {
  Slot& s = *slots_[i];
  if (s.mode.load() != ReplicaMode::kRW) return true;
  if (RwCount() <= 1) return false;
  fence_pending_ = true;  // before the mode change: see Mutate()
  s.mode = ReplicaMode::kERR;
  s.last_error = rc;
  unfenced_.push_back(i);
  return true;
}

bool ReplicatedEngine::MarkSlotFailed(const Slot* slot, int rc) {
  // One hold of state_mu_: the rebuild does not hold the gate, so the list may change
  // (RemoveReplica of another slot) between a lookup and a later lock.
  std::lock_guard<std::mutex> lk(state_mu_);
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].get() == slot) return MarkFailedLocked(i, rc);
  return true;
}

void ReplicatedEngine::MarkWoFailed(size_t i, int rc) {
  std::lock_guard<std::mutex> lk(state_mu_);
  Slot& s = *slots_[i];
  if (s.mode.load() != ReplicaMode::kWO) return;
  s.mode = ReplicaMode::kERR;
  s.last_error = rc;
}

void ReplicatedEngine::MarkErr(size_t i, int rc, const std::string& why, Events* ev) {
  {
    std::lock_guard<std::mutex> lk(state_mu_);
    slots_[i]->mode = ReplicaMode::kERR;
    slots_[i]->last_error = rc;
  }
  EngineEvent e{EngineEvent::Type::kReplicaError, slots_[i]->id, rc, 0, 0, why};
  ev->push_back(std::move(e));
}

int ReplicatedEngine::CommitDropsLocked(Events* ev, bool hold) {
  std::vector<size_t> pending;
  {
    std::lock_guard<std::mutex> lk(state_mu_);
    if (standby_.load()) {
      // No replica set is ours to change; Activate commits its own.
      unfenced_.clear();
      fence_pending_ = false;
      return 0;
    }
    // A fenced engine can commit nothing: the drops stay pending (every later request that
    // needs them fails too). Checked before taking them, or the next caller would find none
    // pending and answer a write that only a minority holds.
    if (fenced_) return -kErrStaleEpoch;
    pending.swap(unfenced_);
    if (pending.empty()) {
      fence_pending_ = false;
      return 0;
    }
  }
  const ReplicaSet prev = CommittedSet();
  ReplicaSet next = prev;
  next.generation = prev.generation + 1;
  next.rw.clear();
  for (const std::string& m : prev.rw) {
    for (const auto& sl : slots_)
      if (sl->member == m && sl->mode.load() == ReplicaMode::kRW) next.rw.push_back(m);
  }
  const int rc = CommitLocked(prev, next, hold, ev);
  std::vector<size_t> more;
  {
    std::lock_guard<std::mutex> lk(state_mu_);
    if (rc < 0) {
      // Kept pending, so the next request (or Shutdown) tries again.
      unfenced_.insert(unfenced_.end(), pending.begin(), pending.end());
      return rc;
    }
    // Replicas that failed the commit itself were dropped with it.
    more.swap(unfenced_);
    fence_pending_ = false;
  }
  pending.insert(pending.end(), more.begin(), more.end());
  ReportDropped(pending, ev);
  return 0;
}

void ReplicatedEngine::ReportDropped(const std::vector<size_t>& pending, Events* ev) {
  const ReplicaSet set = CommittedSet();
  for (size_t i : pending) {
    int err;
    {
      std::lock_guard<std::mutex> lk(state_mu_);
      err = slots_[i]->last_error;
      const bool reported = slots_[i]->reported;
      slots_[i]->reported = false;
      if (reported) continue;  // announced when its connection dropped (OnBackendLost)
    }
    ev->push_back({EngineEvent::Type::kReplicaError, slots_[i]->id, err, 0, 0,
                   "replica " + slots_[i]->id + " failed (errno " + std::to_string(-err) +
                       ") and was dropped from replica set " + std::to_string(set.epoch) + "/" +
                       std::to_string(set.generation)});
  }
}

int ReplicatedEngine::CommitLocked(const ReplicaSet& prev, ReplicaSet next, bool hold, Events* ev) {
  using Clock = std::chrono::steady_clock;
  const bool wait = hold && !quorum_lost_.load();
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait ? quorum_hold_ms_ : 0);
  // Each round either commits, drops one more RW member, or (while holding) waits.
  for (size_t round = 0;; ++round) {
    Targets t;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const std::string& m = slots_[i]->member;
      if (prev.IsMember(m) || next.IsMember(m)) t.idx[t.n++] = i;
    }
    Status sts[kMaxReplicas];
    ForEachParallel(t, [&](size_t k) {
      const Slot& sl = *slots_[t.idx[k]];
      sts[k] = sl.backend->SetReplicaSet(next, next.IsRw(sl.member));
    });
    std::set<std::string> stored;
    bool dropped = false;
    for (size_t k = 0; k < t.n; ++k) {
      Slot& sl = *slots_[t.idx[k]];
      if (sts[k].ok()) {
        stored.insert(sl.member);
      } else if (sts[k].code == Code::kStaleEpoch && sl.backend->epoch() > next.epoch) {
        fenced_ = true;  // a newer engine claimed it
      } else if (sts[k].code == Code::kStaleEpoch) {
        // Below our epoch: our claim never took there (it failed, or it was unreachable).
      } else if (next.IsRw(sl.member) && MarkFailed(t.idx[k], ErrnoOf(sts[k]))) {
        // It may hold the set or not: a new generation without it settles that.
        next.rw.erase(std::find(next.rw.begin(), next.rw.end(), sl.member));
        dropped = true;
      }
    }
    if (fenced_) return -kErrStaleEpoch;
    if (dropped && round < kMaxFenceRounds) {
      ++next.generation;
      continue;
    }
    if (HasMajority(prev.members, stored) && HasMajority(next.members, stored)) {
      {
        std::lock_guard<std::mutex> lk(state_mu_);
        set_ = next;
      }
      quorum_lost_ = false;
      EngineEvent e{EngineEvent::Type::kReplicaSetChanged, "", 0, next.epoch, 0,
                    "committed replica set " + std::to_string(next.epoch) + "/" + std::to_string(next.generation) +
                        " to " + std::to_string(stored.size()) + " of " + std::to_string(t.n) + " replicas"};
      e.generation = next.generation;
      e.rw_members = next.rw;
      ev->push_back(std::move(e));
      return 0;
    }
    const auto now = Clock::now();
    if (now >= deadline || closed_.load()) {
      quorum_lost_ = true;
      return -kErrNoQuorum;
    }
    // Held: the request that needs this commit is not answered meanwhile (nor is any other:
    // the gate is ours). A replica that answers later (a frozen peer resuming) counts.
    std::this_thread::sleep_for(std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(kCommitRetryMs)));
  }
}

Status ReplicatedEngine::ClaimLocked(uint64_t e, ReplicaSet* latest, Events* ev, bool need_quorum) {
  Targets reach;
  uint64_t before[kMaxReplicas] = {};
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->mode.load() == ReplicaMode::kERR) continue;
    if (slots_[i]->backend->size() == 0) {
      MarkErr(i, -ENOTCONN, "replica " + slots_[i]->id + " is unreachable", ev);
      continue;
    }
    before[i] = slots_[i]->backend->epoch();
    reach.idx[reach.n++] = i;
  }
  Status sts[kMaxReplicas];
  ReplicaSet sets[kMaxReplicas];
  ForEachParallel(reach, [&](size_t k) {
    Slot& sl = *slots_[reach.idx[k]];
    bool was_clean = false;
    sts[k] = sl.backend->ClaimEpoch(e, &sets[k], &was_clean);
    sl.clean_at_claim = sts[k].ok() && was_clean;
  });
  uint64_t highest = 0;
  std::string refused;
  for (size_t k = 0; k < reach.n; ++k) {
    if (sts[k].code != Code::kStaleEpoch) continue;
    const uint64_t seen = slots_[reach.idx[k]]->backend->epoch();
    if (refused.empty() || seen > highest) refused = slots_[reach.idx[k]]->id;
    highest = std::max(highest, seen);
  }
  if (!refused.empty())
    return Status::Error(Code::kStaleEpoch, "epoch " + std::to_string(e) + " is not above the epoch replica " + refused +
                                                " promised (highest epoch seen " + std::to_string(highest) +
                                                "): another engine was started with a newer one, or the epoch was "
                                                "not allocated above the replicas'",
                         ESTALE);
  std::set<std::string> claimed;
  bool any = false;
  uint64_t max_before = 0;
  for (size_t k = 0; k < reach.n; ++k) {
    const size_t i = reach.idx[k];
    if (!sts[k].ok()) {
      MarkErr(i, ErrnoOf(sts[k]), "claiming epoch " + std::to_string(e) + " on replica " + slots_[i]->id +
                                      " failed: " + sts[k].message, ev);
      continue;
    }
    claimed.insert(slots_[i]->member);
    max_before = std::max(max_before, before[i]);
    if (!sets[k].empty() && (!any || sets[k].NewerThan(*latest))) *latest = sets[k], any = true;
  }
  if (!any) {
    // No replica carries a replica set: new replicas, or written by a release before the
    // protocol, where the replicas at the highest epoch were the RW ones.
    *latest = ReplicaSet{};
    for (size_t k = 0; k < reach.n; ++k) {
      const size_t i = reach.idx[k];
      latest->members.push_back(slots_[i]->member);
      if (sts[k].ok() && before[i] == max_before) latest->rw.push_back(slots_[i]->member);
    }
    for (const auto& sl : slots_)
      if (!latest->IsMember(sl->member)) latest->members.push_back(sl->member);
  }
  if (need_quorum && !HasMajority(latest->members, claimed)) {
    size_t n = 0;
    for (const std::string& m : latest->members) n += claimed.count(m);
    return Status::Error(Code::kNoQuorum,
                         "claimed " + std::to_string(n) + " of the " + std::to_string(latest->members.size()) +
                             " replicas of replica set " + std::to_string(latest->epoch) + "/" +
                             std::to_string(latest->generation) +
                             ": a majority is needed to know that no other engine serves the volume",
                         kErrNoQuorum);
  }
  return Status::Ok();
}

template <typename Op>
int ReplicatedEngine::Mutate(uint64_t off, uint64_t len, Op op, Fanout fanout, bool with_wo) {
  int result = 0;
  bool marked = false;
  {
    std::shared_lock<DataGate> lk(gate_);
    if (const int rc = RefusalLocked(); rc != 0) return rc;
    const uint64_t e = epoch_.load();
    const Targets t = RwTargets();
    if (t.n == 0) return -EIO;
    const Targets w = with_wo ? WoTargets() : Targets{};
    // Released before CommitDrops() below: holding it while waiting for the exclusive gate
    // would deadlock against a writer that waits for it while holding the gate shared.
    // With a WO target it also orders this request against the rebuild's copy of the
    // range (Rebuilder locks each head window it compares).
    std::optional<RangeLock::Guard> range;
    if (len > 0 && t.n + w.n > 1) range.emplace(ranges_.Lock(off, len));
    int rcs[kMaxReplicas];
    if (fanout == Fanout::kParallel && t.n > 1) {
      // At most kMaxReplicas - 1 threads; a replica whose thread cannot start runs here.
      std::thread helpers[kMaxReplicas];
      for (size_t k = 1; k < t.n; ++k) {
        try {
          helpers[k] = std::thread([&, k] {
            NameThisThread("mr-fanout");
            rcs[k] = op(*slots_[t.idx[k]]->backend, e, k, false);
          });
        } catch (const std::system_error&) {
          rcs[k] = op(*slots_[t.idx[k]]->backend, e, k, false);
        }
      }
      rcs[0] = op(*slots_[t.idx[0]]->backend, e, 0, false);
      for (size_t k = 1; k < t.n; ++k)
        if (helpers[k].joinable()) helpers[k].join();
    } else if constexpr (std::is_same_v<Op, SplitWrite>) {
      // Remote replicas first, all in flight at once; local ones (page-cache writes) only
      // once the remote ones accepted: an engine cut off from the others and fenced
      // meanwhile (they refuse its epoch) then changes no replica at all, not even the one
      // on its own host that the new engine could not reach to fence.
      ReplicaBackend::PendingIo pending[kMaxReplicas];
      bool stale = false;
      for (size_t k = 0; k < t.n; ++k)
        if (slots_[t.idx[k]]->backend->remote()) op.Start(*slots_[t.idx[k]]->backend, e, false, &pending[k]);
      for (size_t k = 0; k < t.n; ++k) {
        if (!slots_[t.idx[k]]->backend->remote()) continue;
        rcs[k] = op.Finish(*slots_[t.idx[k]]->backend, &pending[k]);
        stale = stale || rcs[k] == -kErrStaleEpoch;
      }
      for (size_t k = 0; k < t.n; ++k) {
        if (slots_[t.idx[k]]->backend->remote()) continue;
        if (stale) {
          rcs[k] = 0;  // not attempted; the request fails with STALE_EPOCH below
          continue;
        }
        op.Start(*slots_[t.idx[k]]->backend, e, false, &pending[k]);
        rcs[k] = op.Finish(*slots_[t.idx[k]]->backend, &pending[k]);
      }
    } else {
      for (size_t k = 0; k < t.n; ++k) {
        rcs[k] = op(*slots_[t.idx[k]]->backend, e, k, false);
        if (k == 0 && IsRequestError(rcs[k])) return rcs[k];  // nothing changed anywhere
      }
    }
    result = SettleRw(t, rcs, &marked);
    // WO targets after the RW replicas. If the request failed on the RW side, what the RW
    // replicas now hold is unknown, so the target cannot be kept equal: it fails instead.
    for (size_t k = 0; k < w.n; ++k) {
      const int rc = result == 0 ? op(*slots_[w.idx[k]]->backend, e, t.n + k, true) : result;
      if (rc < 0) MarkWoFailed(w.idx[k], rc);
    }
  }
  // A dropped replica must be durably stale before this request is answered: it may have
  // skipped the replica, and if we crashed before fencing, the replica would reopen as an
  // equal and could be the reconcile source, losing this acknowledged write.
  if (marked || fence_pending_.load()) {
    int rc = CommitDrops();
    if (rc < 0 && result == 0) result = rc;
  }
  return result;
}

int ReplicatedEngine::SettleRw(const Targets& t, const int* rcs, bool* marked) {
  int result = 0;
  // Every RW replica failed alike for a reason that is not its own: all full at once
  // (ENOSPC), or a copy-up that met a damaged cluster of the backing image (each disk holds
  // an equal copy of it). The replicas were equal, applied the same request in the same
  // order and stopped at the same block, so they still are equal (this request was not
  // acknowledged, so any of it may have landed): none is dropped and the client gets the
  // error. Dropping all but one would leave a single copy for nothing.
  const bool all_alike = t.n > 0 && (rcs[0] == -ENOSPC || rcs[0] == -kErrCorruptImage) &&
                         std::all_of(rcs, rcs + t.n, [&](int rc) { return rc == rcs[0]; });
  if (all_alike) return rcs[0];
  for (size_t k = 0; k < t.n; ++k) {
    const int rc = rcs[k];
    if (rc >= 0) continue;
    if (rc == -kErrStaleEpoch) {
      fenced_ = true;
      result = rc;
    } else if (IsRequestError(rc)) {
      if (result == 0) result = rc;
    } else if (MarkFailed(t.idx[k], rc)) {
      *marked = true;
    } else if (result == 0) {
      result = rc;
    }
  }
  return result;
}

// The write path without a waiting thread. Only where it is the plain case: every RW
// replica remote, no WO replica (a rebuild orders its copy against writes), nothing to
// fence. Anything else runs Write (Mutate) on this thread, as before. Several writes given
// together are started under one hold of the gate, their frames queued and sent at the
// end, one message per replica for all of them.
void ReplicatedEngine::WriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept {
  AsyncWrite* started[kAsyncBatchMax];
  size_t i = 0;
  while (i < n) {
    size_t ns = 0;
    Start start = Start::kStarted;  // else why q[i] was not started
    {
      std::shared_lock<DataGate> lk(gate_);
      if (RefuseRestLocked(&lk, q, n, i)) return;
      Touched touched;
      for (; i < n && ns < kAsyncBatchMax; ++i) {
        if (AnswerTrivial(q[i])) continue;
        AsyncWrite* w;
        try {
          w = StartPlainLocked(q[i], n > 1 ? &touched : nullptr, &start);
        } catch (...) {  // the range lock's list could not grow
          q[i].done->IoDone(-ENOMEM);
          continue;
        }
        if (!w) break;
        started[ns++] = w;
      }
      SendTouched(&touched);
    }
    for (size_t k = 0; k < ns; ++k) started[k]->Wake();  // this thread's own
    if (start == Start::kNotPlain) {
      BlockDevice::WriteAsync(q[i].off, q[i].len, q[i].buf, q[i].fua, q[i].done);  // Write, here
      ++i;
    } else if (start == Start::kRangeBusy) {
      // Alone, it may wait for the overlapping write: this thread holds no wake of its own.
      WriteAsyncMany(&q[i], 1);
      ++i;
    }
  }
}

// On a thread that must not wait (the NBD connection loop): the longest prefix of q that
// starts as WriteAsyncMany would, with nothing waited for on the way (the gate taken only if
// free, overlapping writes and full replica queues stop it; frames the sockets do not take
// at once go on from a worker). The rest is the caller's, for WriteAsyncMany on a worker.
size_t ReplicatedEngine::TryWriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept {
  AsyncWrite* started[kAsyncBatchMax];
  n = std::min(n, kAsyncBatchMax);
  size_t ns = 0;
  {
    std::shared_lock<DataGate> lk(gate_, std::try_to_lock);
    if (!lk.owns_lock() || RefusalLocked() != 0) return 0;
    Touched touched;
    touched.may_wait = false;
    for (; ns < n; ++ns) {
      if (q[ns].len == 0 || !InRange(q[ns].off, q[ns].len, size_)) break;
      Start why;  // whatever it is, the rest goes to a worker
      AsyncWrite* w = nullptr;
      try {
        w = StartPlainLocked(q[ns], &touched, &why);
      } catch (...) {
        break;  // no memory for the range lock: the worker answers it
      }
      if (!w) break;
      started[ns] = w;
    }
    SendTouched(&touched);
  }
  for (size_t k = 0; k < ns; ++k) started[k]->Wake();  // this thread's own
  return ns;
}

ReplicatedEngine::AsyncWrite* ReplicatedEngine::StartPlainLocked(const AsyncWriteReq& q, Touched* touched,
                                                                  Start* why) {
  const Targets t = RwTargets();
  const bool reserve = touched && !touched->may_wait;
  const bool plain = WoTargets().n == 0 && !fence_pending_.load() && AllRemote(t);
  auto give = [](AsyncWrite* x) { WriteCache::Get().Give(x); };
  std::unique_ptr<AsyncWrite, decltype(give)> w(plain ? WriteCache::Get().Take() : nullptr, give);
  if (!w) {
    *why = Start::kNotPlain;
    return nullptr;
  }
  if (t.n > 1) {
    // In a group, never wait for an overlapping write: it may be one of this thread's,
    // which cannot finish before this thread's own wake (after the group).
    if (!touched) w->range.emplace(ranges_.Lock(q.off, q.len));
    else if (!ranges_.TryLock(q.off, q.len, &w->range)) {
      *why = Start::kRangeBusy;
      return nullptr;
    }
  }
  if (reserve) {
    for (size_t k = 0; k < t.n; ++k) {
      if (slots_[t.idx[k]]->backend->TryReserveWrite(q.len)) continue;
      while (k-- > 0) slots_[t.idx[k]]->backend->CancelReservedWrite();
      *why = Start::kNoRoom;
      return nullptr;
    }
  }
  w->engine = this;
  w->done = q.done;
  w->t = t;
  const uint64_t e = epoch_.load();
  gate_.Detach();
  // The bytes copied once for every replica's frame (each copied its own before: a third of
  // the engine host's CPU on 1 MiB writes). Without memory for it, each copies its own.
  const std::shared_ptr<const ByteBuffer> bytes = t.n > 1 ? SharedCopy(q.buf, q.len) : nullptr;
  // One wake per replica, plus the starting thread's own once it has started them all.
  // From here nothing throws (RemoteReplica::StartWrite reports ENOMEM instead).
  w->unwoken.store(static_cast<uint32_t>(t.n) + 1);
  for (size_t k = 0; k < t.n; ++k) {
    ReplicaBackend* b = slots_[t.idx[k]]->backend.get();
    w->backends[k] = b;
    w->pending[k].waker = w.get();
    w->pending[k].defer_send = touched != nullptr;
    w->pending[k].shared_bytes = bytes;
    w->pending[k].reserved = reserve;
    b->StartWrite(e, q.off, q.len, q.buf, q.fua, &w->pending[k]);
    if (touched) Touch(touched, b);
  }
  return w.release();
}

// A buffer holding a copy of buf (a large one from the BufferPool, and back to it), or
// nullptr without memory for it.
std::shared_ptr<const ByteBuffer> ReplicatedEngine::SharedCopy(const uint8_t* buf, uint32_t len) {
  if (len == 0) return nullptr;
  try {
    std::unique_ptr<ByteBuffer> b(new ByteBuffer(BufferPool::Get().Take(len)));
    std::memcpy(b->data(), buf, len);
    return std::shared_ptr<const ByteBuffer>(b.release(), [](const ByteBuffer* x) {
      BufferPool::Get().Give(std::move(*const_cast<ByteBuffer*>(x)));
      delete x;
    });
  } catch (...) {
    return nullptr;
  }
}

void ReplicatedEngine::Touch(Touched* touched, ReplicaBackend* b) {
  for (size_t j = 0; j < touched->n; ++j)
    if (touched->b[j] == b) return;
  if (touched->n == kMaxReplicas) SendTouched(touched);  // the replicas changed meanwhile
  touched->b[touched->n++] = b;
}

void ReplicatedEngine::SendTouched(Touched* touched) {
  for (size_t j = 0; j < touched->n; ++j) touched->b[j]->SendDeferred(touched->may_wait);
  touched->n = 0;
}

void ReplicatedEngine::FinishAsync(AsyncWrite* w) {
  int rcs[kMaxReplicas];
  for (size_t k = 0; k < w->t.n; ++k) rcs[k] = w->backends[k]->FinishWrite(&w->pending[k]);  // waits no more
  bool marked = false;
  try {
    w->result = SettleRw(w->t, rcs, &marked);
  } catch (...) {  // its list of drops could not grow: fence whatever is pending, fail this one
    w->result = -ENOMEM;
    marked = true;
  }
  w->range.reset();
  gate_.Finish();
  // As in Mutate: a replica dropped (by this write or another) must be durably out of the
  // replica set before this write is answered.
  if (marked || fence_pending_.load()) {
    WorkerPool::Batch b;
    b.Push(w);
    w->run = &ReplicatedEngine::FenceAndAnswer;
    fence_lane_.Submit(&b);
    return;
  }
  IoCompletion* done = w->done;
  const int result = w->result;
  WriteCache::Get().Give(w);
  done->IoDone(result);  // the engine is not touched after this
}

void ReplicatedEngine::FenceAndAnswer(WorkerPool::Job* job) {
  AsyncWrite* w = static_cast<AsyncWrite*>(job);
  int result = w->result;
  const int rc = w->engine->CommitDrops();
  if (rc < 0 && result == 0) result = rc;
  IoCompletion* done = w->done;
  WriteCache::Get().Give(w);
  done->IoDone(result);
}

template <typename Op>
int ReplicatedEngine::ReadFrom(Op op) {
  int rc = -EIO;
  bool marked = false;
  {
    std::shared_lock<DataGate> lk(gate_);
    if (const int refusal = RefusalLocked(); refusal != 0) return refusal;
    const size_t n = slots_.size();
    for (size_t attempt = 0; attempt < n; ++attempt) {
      const size_t pick = PickReadSource();
      if (pick == n) break;
      rc = op(*slots_[pick]->backend);
      if (ReadIsAnswered(rc)) break;
      if (!MarkFailed(pick, rc)) break;  // the last RW replica: its error is the answer
      marked = true;
    }
  }
  if (marked) {
    int frc = CommitDrops();
    if (frc < 0 && rc >= 0) rc = frc;
  }
  return rc;
}

size_t ReplicatedEngine::PickReadSource() const {
  const size_t n = slots_.size();
  const uint32_t start = next_read_.fetch_add(1, std::memory_order_relaxed);
  // A replica in this process first: its read costs no network hop and no remote CPU.
  for (size_t k = 0; k < n; ++k) {
    size_t i = (start + k) % n;
    if (slots_[i]->mode.load() == ReplicaMode::kRW && !slots_[i]->backend->remote()) return i;
  }
  for (size_t k = 0; k < n; ++k) {
    size_t i = (start + k) % n;
    if (slots_[i]->mode.load() == ReplicaMode::kRW) return i;
  }
  return n;
}

// A read from a remote replica without a waiting thread (see WriteAsyncMany); a read from
// a replica in this process is a page-cache copy and runs here (ReadFrom). Several given
// together are started under one hold of the gate, each replica's READ frames sent at the
// end in one message.
void ReplicatedEngine::ReadAsyncMany(const AsyncReadReq* q, size_t n) noexcept {
  size_t i = 0;
  while (i < n) {
    bool local = false;  // q[i] is no remote read (a replica in this process, or no memory): ReadFrom, here
    {
      std::shared_lock<DataGate> lk(gate_);
      if (RefuseRestLocked(&lk, q, n, i)) return;
      Touched touched;
      for (; i < n; ++i) {
        if (AnswerTrivial(q[i])) continue;
        const size_t pick = PickReadSource();
        AsyncRead* r = pick < slots_.size() && slots_[pick]->backend->remote() ? new (std::nothrow) AsyncRead() : nullptr;
        if (!r) {
          local = true;
          break;
        }
        r->engine = this;
        r->done = q[i].done;
        r->pick = pick;
        r->backend = slots_[pick]->backend.get();
        r->off = q[i].off;
        r->len = q[i].len;
        r->buf = q[i].buf;
        r->pending.waker = r;
        r->pending.defer_send = n > 1;
        ReplicaBackend* b = r->backend;
        gate_.Detach();
        b->StartRead(q[i].off, q[i].len, q[i].buf, &r->pending);  // may wake r before it returns
        if (n > 1) Touch(&touched, b);
      }
      SendTouched(&touched);
    }
    if (local) {
      BlockDevice::ReadAsync(q[i].off, q[i].len, q[i].buf, q[i].done);  // Read (ReadFrom), here
      ++i;
    }
  }
}

void ReplicatedEngine::FinishAsyncRead(AsyncRead* r) {
  const int rc = r->backend->FinishRead(&r->pending, r->buf);  // waits no more
  // As ReadFrom: so is the last RW replica's error.
  bool answer = ReadIsAnswered(rc);
  try {
    if (!answer) answer = !MarkFailed(r->pick, rc);
  } catch (...) {  // its list of drops could not grow: the replica's error is the answer
    answer = true;
  }
  gate_.Finish();
  if (!answer) {
    WorkerPool::Batch b;
    b.Push(r);
    r->run = &ReplicatedEngine::RetryRead;
    fence_lane_.Submit(&b);
    return;
  }
  IoCompletion* done = r->done;
  delete r;
  done->IoDone(rc);  // the engine is not touched after this
}

void ReplicatedEngine::RetryRead(WorkerPool::Job* job) {
  AsyncRead* r = static_cast<AsyncRead*>(job);
  ReplicatedEngine* e = r->engine;
  int rc;
  try {
    rc = e->Read(r->off, r->len, r->buf);  // the other RW replicas
  } catch (...) {
    rc = -EIO;
  }
  const int frc = e->CommitDrops();  // the dropped one is out of the set before the answer
  if (frc < 0 && rc >= 0) rc = frc;
  IoCompletion* done = r->done;
  delete r;
  done->IoDone(rc);
}

template <typename Op>
Status ReplicatedEngine::Control(Op op, bool to_wo) {
  // Checked once more under the gate below; this first look answers at once instead of
  // waiting for the gate behind a snapshot read's replica call.
  if (!to_wo && snapshot_reads_.load() > 0)
    return Status::Error(Code::kBusy, "a snapshot is being read (export or copy): snapshot delete and revert wait until it is done",
                         EBUSY);
  Events ev;
  Status result;
  {
    std::unique_lock<DataGate> lk(gate_);
    if (closed_) return Status::Error(Code::kClosed, "engine is closed");
    if (standby_) return Status::Error(Code::kInvalidState, "engine is a standby: it changes no replica until activated", EPERM);
    if (fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
    if (!to_wo && rebuilding_.load())
      return Status::Error(Code::kBusy, "a replica is being rebuilt: snapshot delete and revert wait until it is done",
                           EBUSY);
    if (!to_wo && snapshot_reads_.load() > 0)
      return Status::Error(Code::kBusy, "a snapshot is being read (export or copy): snapshot delete and revert wait until it is done",
                           EBUSY);
    BusyFlag busy(control_busy_);
    const Targets t = RwTargets();
    for (size_t k = 0; k < t.n; ++k) {
      Status st = op(*slots_[t.idx[k]]->backend);
      if (st.ok()) continue;
      if (st.code == Code::kStaleEpoch) {
        fenced_ = true;
        result = st;
        break;
      }
      // Replicas hold identical layer lists, so a refusal by the first one is the answer.
      if (k == 0 && IsRequestError(st.code)) return st;
      if (!MarkFailed(t.idx[k], ErrnoOf(st)) && result.ok()) result = st;
    }
    const Targets w = to_wo ? WoTargets() : Targets{};
    for (size_t k = 0; k < w.n; ++k) {
      Status st = result.ok() ? op(*slots_[w.idx[k]]->backend) : result;
      if (!st.ok()) MarkWoFailed(w.idx[k], ErrnoOf(st));
    }
    int rc = CommitDropsLocked(&ev);
    if (rc < 0 && result.ok()) result = Status::FromErrno(rc, "fencing failed replicas");
  }
  Emit(ev);
  return result;
}

Status ReplicatedEngine::ListSnapshots(std::vector<LayerInfo>* out) {
  std::shared_lock<DataGate> lk(gate_);
  if (closed_) return Status::Error(Code::kClosed, "engine is closed");
  Targets t = RwTargets();
  if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica");
  return slots_[t.idx[0]]->backend->ListLayers(out);
}

Status ReplicatedEngine::SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) {
  std::shared_lock<DataGate> lk(gate_);
  if (closed_) return Status::Error(Code::kClosed, "engine is closed");
  Targets t = RwTargets();
  if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica");
  return slots_[t.idx[0]]->backend->SnapshotLayers(name, out);
}

std::vector<ReplicaState> ReplicatedEngine::Replicas() const {
  std::vector<ReplicaState> out;
  // state_mu_ also keeps CloseReplicas() from closing a replica under the calls below.
  // Allocation is not asked for while a control operation holds the replicas (a snapshot
  // merge can take long): callers may be on the JS thread, so they get the last figure.
  std::lock_guard<std::mutex> lk(state_mu_);
  const bool closed = closed_.load(), busy = control_busy_.load();
  for (const auto& s : slots_) {
    ReplicaState r;
    r.id = s->id;
    r.mode = s->mode.load();
    r.last_error = s->last_error;
    r.epoch = closed ? s->closed_epoch : s->backend->epoch();
    if (!closed && !busy) s->cached_allocated = s->backend->AllocatedBytes();
    r.allocated_bytes = s->cached_allocated.load();
    out.push_back(std::move(r));
  }
  return out;
}

Status ReplicatedEngine::CheckLayers(Events* ev) {
  // Group RW replicas by their layer list; the largest group wins, ties go to the group
  // of the earliest replica. Others missed a snapshot operation and cannot be reconciled
  // by copying heads.
  std::vector<std::string> sig(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->mode.load() != ReplicaMode::kRW) continue;
    std::vector<LayerInfo> layers;
    Status st = slots_[i]->backend->ListLayers(&layers);
    if (!st.ok()) {
      MarkErr(i, ErrnoOf(st), "listing layers of " + slots_[i]->id + ": " + st.message, ev);
      continue;
    }
    for (const LayerInfo& l : layers) sig[i] += l.id + '\0' + l.name + '\0' + l.parent + '\n';
  }
  size_t best = slots_.size(), best_count = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->mode.load() != ReplicaMode::kRW) continue;
    size_t c = 0;
    for (size_t j = 0; j < slots_.size(); ++j)
      if (slots_[j]->mode.load() == ReplicaMode::kRW && sig[j] == sig[i]) ++c;
    if (c > best_count) best = i, best_count = c;
  }
  if (best == slots_.size()) return Status::Ok();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->mode.load() == ReplicaMode::kRW && sig[i] != sig[best])
      MarkErr(i, -EIO, "replica " + slots_[i]->id + " has a different layer list than " + slots_[best]->id, ev);
  }
  return Status::Ok();
}

void ReplicatedEngine::SettleSizeLocked(Events* ev) {
  uint64_t want = 0;
  for (const auto& sl : slots_)
    if (sl->mode.load() == ReplicaMode::kRW) want = std::max(want, sl->backend->size());
  if (want == 0) return;  // no RW replica: the caller fails the open
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& sl = *slots_[i];
    if (sl.mode.load() != ReplicaMode::kRW || sl.backend->size() == want) continue;
    Status st = sl.backend->Grow(want);
    if (!st.ok())
      MarkErr(i, ErrnoOf(st), "replica " + sl.id + " has " + std::to_string(sl.backend->size()) + " bytes and could not grow to the volume's " +
                                  std::to_string(want) + " (a resize cut short): " + st.message, ev);
  }
  size_ = want;
}

Status ReplicatedEngine::Reconcile(Events* ev) {
  uint64_t written = 0, trimmed = 0;
  size_t synced = 0;
  std::string source_id;
  // Restarts with the next RW replica as source if the source fails; each restart drops one.
  for (size_t attempt = 0; attempt < slots_.size(); ++attempt) {
    Targets t = RwTargets();
    if (t.n <= 1) break;
    Slot& src = *slots_[t.idx[0]];
    source_id = src.id;
    Reconciler rec(src.backend.get(), epoch_.load());
    bool source_failed = false;
    for (size_t k = 1; k < t.n; ++k) {
      Reconciler::Result r = rec.Run(slots_[t.idx[k]]->backend.get());
      written += r.bytes_written;
      trimmed += r.bytes_trimmed;
      if (r.error == 0) {
        ++synced;
      } else if (r.source_failed) {
        MarkFailed(t.idx[0], r.error);
        source_failed = true;
        break;
      } else {
        MarkFailed(t.idx[k], r.error);
      }
    }
    if (!source_failed) break;
  }
  ev->push_back({EngineEvent::Type::kReconciled, "", 0, 0, written,
                 "reconciled " + std::to_string(synced) + " replica(s) from " + source_id + ": " +
                     std::to_string(written) + " bytes copied, " + std::to_string(trimmed) +
                     " bytes trimmed"});
  return Status::Ok();
}

Status ReplicatedEngine::Open() {
  if (slots_.empty() || slots_.size() > kMaxReplicas)
    return Status::Error(Code::kInvalidArgument,
                         "an engine needs 1.." + std::to_string(kMaxReplicas) + " replicas");
  std::set<std::string> ids;
  for (const auto& s : slots_) {
    if (!s->backend) return Status::Error(Code::kInvalidArgument, "null replica");
    if (!ids.insert(s->id).second)
      return Status::Error(Code::kInvalidArgument, "replica " + s->id + " is listed twice");
  }
  if (!members_given_)
    return Status::Error(Code::kInvalidArgument, "an engine needs a member name for each replica");
  std::set<std::string> names;
  for (const auto& s : slots_) {
    if (!ReplicaSet::ValidName(s->member))
      return Status::Error(Code::kInvalidArgument, "member name '" + s->member.substr(0, 64) + "' is not [A-Za-z0-9._-]{1,63}");
    if (!names.insert(s->member).second)
      return Status::Error(Code::kInvalidArgument, "member name " + s->member + " is listed twice");
  }
  for (const auto& s : slots_) WatchBackend(s->backend.get());
  // Replicas of different sizes are a resize that a crash cut short: the size rule settles
  // them once it is known which replicas are RW (SettleSizeLocked). Until then, and for a
  // standby (which changes nothing), the largest: a replica that could not be reached
  // (MakeOfflineReplica) reports 0 and opens as ERR.
  size_ = 0;
  for (const auto& s : slots_) size_ = std::max(size_.load(), s->backend->size());
  if (standby_ && salvage_) return Status::Error(Code::kInvalidArgument, "a standby engine cannot salvage");
  if (standby_) return OpenStandby();
  if (open_epoch_ == 0)
    return Status::Error(Code::kInvalidArgument,
                         "an engine needs an epoch allocated for it (docs/single-writer.md); it never picks one itself");

  Events ev;
  std::unique_lock<DataGate> lk(gate_);
  ReplicaSet latest;
  Status st = ClaimLocked(open_epoch_, &latest, &ev, /*need_quorum=*/!salvage_);
  if (!st.ok()) {
    lk.unlock();
    Emit(ev);
    return st;
  }
  epoch_ = open_epoch_;
  ev.push_back({EngineEvent::Type::kEpochClaimed, "", 0, open_epoch_, 0, "claimed epoch " + std::to_string(open_epoch_)});
  // Only replicas in the latest replica set's rw hold every acknowledged write (invariant 3).
  const std::string which = latest.empty() ? std::string("the highest epoch before this claim")
                                           : "replica set " + std::to_string(latest.epoch) + "/" +
                                                 std::to_string(latest.generation);
  std::set<std::string> claimed;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& sl = *slots_[i];
    if (sl.mode.load() != ReplicaMode::kRW) continue;
    claimed.insert(sl.member);
    if (sl.backend->rebuilding()) {
      MarkErr(i, -EIO, "replica " + sl.id + " was left in the middle of a rebuild: it must be rebuilt again", &ev);
    } else if (!latest.IsRw(sl.member) && !salvage_) {
      MarkErr(i, -kErrStaleEpoch, "replica " + sl.id + " (" + sl.member + ") is not RW in " + which +
                                      ": it may lack acknowledged writes and must be rebuilt", &ev);
    }
  }
  // The latest set seen is the volume's latest only if a majority of its members answered.
  if (salvage_) st = ChooseSalvageSourceLocked(latest, HasMajority(latest.members, claimed), claimed.size() == slots_.size(), &ev);
  if (!st.ok()) {
    lk.unlock();
    Emit(ev);
    return st;
  }
  CheckLayers(&ev);
  SettleSizeLocked(&ev);

  // The claim itself marks every replica not clean: what counts is whether each was clean
  // just before it (the last engine flushed them, found them identical and wrote no more).
  bool dirty = false;
  for (const auto& s : slots_)
    if (s->mode.load() == ReplicaMode::kRW && !s->clean_at_claim) dirty = true;
  if (dirty && RwCount() > 1) Reconcile(&ev);
  if (RwCount() == 0) {
    lk.unlock();
    Emit(ev);
    return Status::Error(Code::kNoHealthyReplica, "none of the replicas that hold the latest data (RW in " + which +
                                                      ") could be used");
  }
  // Replicas that failed the reconcile are simply left out of the first replica set.
  std::vector<size_t> pending;
  {
    std::lock_guard<std::mutex> g(state_mu_);
    pending.swap(unfenced_);
    fence_pending_ = false;
  }
  ReplicaSet first;
  first.epoch = open_epoch_;
  first.generation = 1;
  for (const auto& sl : slots_) {
    first.members.push_back(sl->member);
    if (sl->mode.load() == ReplicaMode::kRW) first.rw.push_back(sl->member);
  }
  // A salvage commits over the given replicas alone: the caller asserts the others are gone.
  const int rc = CommitLocked(salvage_ ? first : latest, first, /*hold=*/false, &ev);
  if (rc < 0) {
    lk.unlock();
    Emit(ev);
    if (rc == -kErrStaleEpoch)
      return Status::Error(Code::kStaleEpoch, "another engine claimed the volume while this one opened", ESTALE);
    return Status::Error(Code::kNoQuorum, "the first replica set of epoch " + std::to_string(open_epoch_) +
                                              " could not be stored on a majority of the replicas", kErrNoQuorum);
  }
  {
    std::lock_guard<std::mutex> g(state_mu_);
    std::vector<size_t> more;
    more.swap(unfenced_);
    pending.insert(pending.end(), more.begin(), more.end());
    fence_pending_ = false;
  }
  ReportDropped(pending, &ev);
  lk.unlock();
  Emit(ev);
  return Status::Ok();
}

Status ReplicatedEngine::ChooseSalvageSourceLocked(const ReplicaSet& latest, bool majority, bool all_claimed,
                                                   Events* ev) {
  // Candidates: RW now (claimed, not mid-rebuild). Those in latest's rw hold everything
  // acknowledged up to latest: they stay RW, as at a normal start.
  std::vector<size_t> cand;
  bool any_latest_rw = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i]->mode.load() != ReplicaMode::kRW) continue;
    cand.push_back(i);
    any_latest_rw = any_latest_rw || latest.IsRw(slots_[i]->member);
  }
  if (cand.empty()) return Status::Ok();  // Open fails with kNoHealthyReplica
  const bool complete = majority && any_latest_rw;
  if (!complete && !all_claimed)
    return Status::Error(Code::kNoQuorum,
                         "salvage: a replica given could not be claimed, and without a majority of the latest "
                         "replica set and one of its RW replicas the one that did not answer may hold the newest "
                         "data: try again when every given replica answers, or leave it out",
                         kErrNoQuorum);
  // Rank: RW in latest first, then by last RW set (none recorded, or a server that
  // predates the record: lowest); a tie keeps the first in member order.
  ReplicaSetId last[kMaxReplicas];
  size_t best = cand[0];
  for (size_t i : cand) {
    if (latest.IsRw(slots_[i]->member)) last[i] = ReplicaSetId::Of(latest);
    else if (!slots_[i]->backend->LastRw(&last[i]).ok()) last[i] = ReplicaSetId{};
    if (last[best] < last[i]) best = i;
  }
  for (size_t i : cand) {
    if (i == best || (any_latest_rw && latest.IsRw(slots_[i]->member))) continue;
    MarkErr(i, -kErrStaleEpoch, "salvage: replica " + slots_[i]->id + " (" + slots_[i]->member +
                                    ") is not the one with the newest data; it must be rebuilt", ev);
  }
  const Slot& src = *slots_[best];
  std::string why = complete ? "it is RW in the latest replica set " + std::to_string(latest.epoch) + "/" +
                                   std::to_string(latest.generation) + ", which a majority of its members reported"
                     : any_latest_rw ? "it is RW in the newest replica set the reachable replicas hold, but too few of "
                                       "that set's members answered to know that no later set exists: writes "
                                       "acknowledged after it may be missing"
                                     : "no reachable replica is RW in the newest replica set they hold; it was RW "
                                       "most recently: writes acknowledged after that may be missing";
  EngineEvent e{EngineEvent::Type::kSalvaged, src.id, 0, last[best].epoch, complete ? 1u : 0u,
                "salvage from replica " + src.id + " (" + src.member + "): " + why};
  e.generation = last[best].generation;
  ev->push_back(std::move(e));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// Hand-over (docs/data-engine.md): standby engines, Deactivate, Activate

Status ReplicatedEngine::OpenStandby() {
  // Only what this engine can know without disturbing the active one: which replicas it
  // can reach. Epochs, clean and rebuilding flags and layer lists belong to the engine
  // writing now and are looked at when this one is activated.
  Events ev;
  size_t reachable = 0;
  {
    std::unique_lock<DataGate> lk(gate_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i]->backend->size() == 0) {
        MarkErr(i, -ENOTCONN, "replica " + slots_[i]->id + " is unreachable", &ev);
      } else {
        ++reachable;
      }
    }
  }
  Emit(ev);
  if (reachable == 0) return Status::Error(Code::kNoHealthyReplica, "no replica of the standby engine can be reached");
  return Status::Ok();
}

template <typename F>
void ReplicatedEngine::ForEachParallel(const Targets& t, F f) {
  std::thread helpers[kMaxReplicas];
  for (size_t k = 1; k < t.n; ++k) {
    try {
      helpers[k] = std::thread([&, k] {
        NameThisThread("mr-fanout");
        f(k);
      });
    } catch (const std::system_error&) {
      f(k);  // no thread to be had: run it here
    }
  }
  if (t.n > 0) f(0);
  for (size_t k = 1; k < t.n; ++k)
    if (helpers[k].joinable()) helpers[k].join();
}

Status ReplicatedEngine::Deactivate(HandOver* out) {
  if (out == nullptr) return Status::Error(Code::kInvalidArgument, "no hand-over output");
  {
    std::lock_guard<std::mutex> lk(rebuild_mu_);
    if (shutting_down_) return Status::Error(Code::kClosed, "engine is closed");
    if (handing_over_) return Status::Error(Code::kBusy, "the engine is handing the volume over already", EBUSY);
    handing_over_ = true;  // AddReplica refuses from now on
  }
  struct Done {
    ReplicatedEngine* e;
    ~Done() {
      std::lock_guard<std::mutex> lk(e->rebuild_mu_);
      e->handing_over_ = false;
    }
  } done{this};
  // The target's rebuild cannot be finished by this engine any more, and the next writer
  // cannot continue it: stop it. Its rebuilding flag is durable, so the target is ERR for
  // the next writer too (it is not RW here, so not in the hand-over either), and that
  // engine's self-repair rebuilds it again.
  // Checked again under the gate; here so a refused hand-over does not stop a rebuild.
  if (snapshot_reads_.load() > 0)
    return Status::Error(Code::kBusy, "an export or copy of a snapshot reads from this engine: hand over when it has finished", EBUSY);
  StopRebuild("", -kErrStandby);

  Events ev;
  Status result;
  {
    // Exclusive: waits for every request in flight; requests queued behind it find the
    // engine standby and fail with -EPERM.
    std::unique_lock<DataGate> lk(gate_);
    BusyFlag busy(control_busy_);
    if (closed_) {
      result = Status::Error(Code::kClosed, "engine is closed");
    } else if (standby_) {
      result = Status::Error(Code::kInvalidState, "engine is a standby already: it has nothing to hand over", EPERM);
    } else if (fenced_) {
      result = Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch: another engine owns the volume", ESTALE);
    } else if (snapshot_reads_.load() > 0) {
      // An export or copy pins the snapshot's layers only on this engine; the next writer
      // could delete them under it (a remote replica would not tell the reader in time).
      result = Status::Error(Code::kBusy, "an export or copy of a snapshot reads from this engine: hand over when it has finished", EBUSY);
    } else if (int rc = CommitDropsLocked(&ev); rc < 0) {
      result = Status::FromErrno(rc, "fencing failed replicas before the hand-over");
    } else {
      const Targets t = RwTargets();
      int rcs[kMaxReplicas] = {};
      ForEachParallel(t, [&](size_t k) { rcs[k] = slots_[t.idx[k]]->backend->Flush(); });
      for (size_t k = 0; k < t.n && result.ok(); ++k) {
        if (rcs[k] >= 0) continue;
        // The last RW replica failing its flush: acknowledged writes may not be durable,
        // so nothing is handed over; the engine stays active and the caller decides.
        if (!MarkFailed(t.idx[k], rcs[k]))
          result = Status::FromErrno(rcs[k], "flushing " + slots_[t.idx[k]]->id + " for the hand-over");
      }
      if (result.ok()) {
        if (int rc = CommitDropsLocked(&ev); rc < 0) result = Status::FromErrno(rc, "fencing replicas that failed their flush");
      }
      if (result.ok()) {
        // With state_mu_, so a connection lost from now on is handled as a standby's.
        std::lock_guard<std::mutex> g(state_mu_);
        standby_ = true;
        out->epoch = epoch_.load();
        out->generation = set_.generation;
        out->rw_ids.clear();
        for (const auto& s : slots_)
          if (s->mode.load() == ReplicaMode::kRW) out->rw_ids.push_back(s->id);
      }
    }
  }
  Emit(ev);
  return result;
}

Status ReplicatedEngine::Activate(const HandOver& h, uint64_t epoch) {
  {
    std::lock_guard<std::mutex> lk(rebuild_mu_);
    if (shutting_down_) return Status::Error(Code::kClosed, "engine is closed");
  }
  Events ev;
  Status result;
  {
    std::unique_lock<DataGate> lk(gate_);
    BusyFlag busy(control_busy_);
    if (closed_) {
      result = Status::Error(Code::kClosed, "engine is closed");
    } else if (!standby_) {
      result = Status::Error(Code::kInvalidState, "engine is active already");
    } else if (epoch == 0 || epoch <= h.epoch) {
      result = Status::Error(Code::kInvalidArgument, "activation epoch " + std::to_string(epoch) +
                                                         " must be allocated above the hand-over's " + std::to_string(h.epoch));
    } else {
      result = ActivateLocked(h, epoch, &ev);
    }
  }
  Emit(ev);
  return result;
}

Status ReplicatedEngine::ActivateLocked(const HandOver& h, uint64_t epoch, Events* ev) {
  const std::set<std::string> handed(h.rw_ids.begin(), h.rw_ids.end());
  bool usable = false;
  for (const auto& sl : slots_)
    usable = usable || (handed.count(sl->id) && sl->mode.load() != ReplicaMode::kERR && sl->backend->size() != 0);
  if (!usable)
    return Status::Error(Code::kNoHealthyReplica, "none of the " + std::to_string(h.rw_ids.size()) +
                                                      " RW replica(s) of the hand-over can be used by this engine");
  // Nobody may have claimed since the hand-over: a spent or overtaken hand-over is refused
  // before it claims anything, so it never disturbs the engine that overtook it. (The
  // check after the claims below catches one that races this.)
  ReplicaSet handed_set;
  handed_set.epoch = h.epoch;
  handed_set.generation = h.generation;
  ReplicaSet newest;
  for (const auto& sl : slots_) {
    if (sl->mode.load() == ReplicaMode::kERR || sl->backend->size() == 0) continue;
    ReplicaSet stored;
    if (!sl->backend->PeekReplicaSet(&stored).ok()) continue;  // the claim will tell
    if (stored.NewerThan(newest)) newest = stored;
    if (sl->backend->epoch() > h.epoch || stored.NewerThan(handed_set))
      return Status::Error(Code::kStaleEpoch, "replica " + sl->id + " promised epoch " + std::to_string(sl->backend->epoch()) +
                                                  " (replica set " + std::to_string(stored.epoch) + "/" +
                                                  std::to_string(stored.generation) + "), past the hand-over's " +
                                                  std::to_string(h.epoch) + "/" + std::to_string(h.generation) +
                                                  ": another engine claimed the volume since",
                           ESTALE);
  }
  // The hand-over's set was committed to a majority, so some replica that answers holds it.
  if (h.generation > 0 && !newest.empty() && (newest.epoch != h.epoch || newest.generation != h.generation))
    return Status::Error(Code::kStaleEpoch, "no replica holds the hand-over's replica set " + std::to_string(h.epoch) + "/" +
                                                std::to_string(h.generation) + " (newest: " + std::to_string(newest.epoch) +
                                                "/" + std::to_string(newest.generation) + ")",
                         ESTALE);
  ReplicaSet latest;
  Status st = ClaimLocked(epoch, &latest, ev);
  if (!st.ok()) return st;
  // The hand-over is good only if nobody committed since: its engine's set is the latest.
  // A hand-over from a release before replica sets has generation 0 and its replicas hold
  // none (the legacy set: epoch 0); the epoch check before the claims covered it.
  const bool legacy = h.generation == 0 && latest.empty();
  if (!legacy && (latest.epoch != h.epoch || latest.generation != h.generation))
    return Status::Error(Code::kStaleEpoch, "the volume's latest replica set is " + std::to_string(latest.epoch) + "/" +
                                                std::to_string(latest.generation) + ", not the hand-over's " +
                                                std::to_string(h.epoch) + "/" + std::to_string(h.generation) +
                                                ": another engine wrote the volume since",
                         ESTALE);
  ReplicaSet first;
  first.epoch = epoch;
  first.generation = 1;
  {
    // Under state_mu_ with the mode changes, so a connection lost meanwhile was handled as
    // a standby's (ERR, seen here) or is handled as an active engine's (dropped by a commit).
    std::lock_guard<std::mutex> g(state_mu_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = *slots_[i];
      first.members.push_back(s.member);
      if (s.mode.load() == ReplicaMode::kERR) continue;
      std::string why;
      if (!handed.count(s.id) || !latest.IsRw(s.member))
        why = "replica " + s.id + " was not RW when the volume was handed over (replica set " +
              std::to_string(h.epoch) + "/" + std::to_string(h.generation) + ")";
      else if (s.backend->rebuilding())
        why = "replica " + s.id + " was left in the middle of a rebuild: it must be rebuilt again";
      if (why.empty()) {
        first.rw.push_back(s.member);
        continue;
      }
      s.mode = ReplicaMode::kERR;
      s.last_error = -EIO;
      ev->push_back({EngineEvent::Type::kReplicaError, s.id, -EIO, 0, 0, why});
    }
  }
  // The hand-over's replicas are equal, so this finds nothing to do unless the volume was
  // resized after this standby opened (the claims brought the remote sizes up to date).
  SettleSizeLocked(ev);
  first.rw.clear();
  for (const auto& sl : slots_)
    if (sl->mode.load() == ReplicaMode::kRW) first.rw.push_back(sl->member);
  if (first.rw.empty()) return Status::Error(Code::kNoHealthyReplica, "no replica of the hand-over could be claimed");
  const uint64_t held = epoch_.load();
  epoch_ = epoch;
  const int rc = CommitLocked(latest, first, /*hold=*/false, ev);
  if (rc < 0) {
    epoch_ = held;
    if (rc == -kErrStaleEpoch)
      return Status::Error(Code::kStaleEpoch, "another engine claimed the volume while this one activated", ESTALE);
    return Status::Error(Code::kNoQuorum, "the replica set of epoch " + std::to_string(epoch) +
                                              " could not be stored on a majority of the replicas", kErrNoQuorum);
  }
  {
    std::lock_guard<std::mutex> g(state_mu_);
    standby_ = false;
    fenced_ = false;
    unfenced_.clear();
    fence_pending_ = false;
  }
  ev->push_back({EngineEvent::Type::kEpochClaimed, "", 0, epoch, 0,
                 "claimed epoch " + std::to_string(epoch) + ": activated from the hand-over of replica set " +
                     std::to_string(h.epoch) + "/" + std::to_string(h.generation)});
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// Resize (docs/data-engine.md, "Resize")

Status ReplicatedEngine::Resize(uint64_t size_bytes) {
  if (size_bytes == 0 || size_bytes % 4096 != 0 || size_bytes > kMaxVolumeBytes)
    return Status::Error(Code::kInvalidArgument, "volume size " + std::to_string(size_bytes) + " must be a positive multiple of 4096 up to 2^60",
                         EINVAL);
  Events ev;
  Status result;
  {
    // Exclusive: requests in flight finish first, and none starts until every RW replica
    // and size_ agree. Requests are checked against size_, so nothing reaches the new range
    // before every RW replica has it.
    std::unique_lock<DataGate> lk(gate_);
    const uint64_t old = size_.load();
    if (closed_) return Status::Error(Code::kClosed, "engine is closed");
    if (standby_) return Status::Error(Code::kInvalidState, "engine is a standby: it changes no replica until activated", EPERM);
    if (fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
    if (size_bytes < old)
      return Status::Error(Code::kInvalidArgument, "the volume has " + std::to_string(old) + " bytes: it can grow, not shrink to " +
                                                       std::to_string(size_bytes), EINVAL);
    if (size_bytes == old) return Status::Ok();
    // The rebuild copies a chain of the old size into a target that is not RW, so the grow
    // would miss it: the caller asks again when the rebuild is done.
    if (rebuilding_.load())
      return Status::Error(Code::kBusy, "a replica is being rebuilt: resize the volume once the rebuild is done", EBUSY);
    BusyFlag busy(control_busy_);
    const Targets t = RwTargets();
    if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica to grow");
    for (size_t k = 0; k < t.n; ++k) {
      const Slot& sl = *slots_[t.idx[k]];
      if (!sl.backend->CanGrow())
        return Status::Error(Code::kUnsupported, "replica " + sl.id + " is served by a data engine of a release without resize: upgrade it first (nothing was changed)",
                             ENOTSUP);
    }
    Status sts[kMaxReplicas];
    ForEachParallel(t, [&](size_t k) { sts[k] = slots_[t.idx[k]]->backend->Grow(size_bytes); });
    size_t grown = 0;
    for (size_t k = 0; k < t.n; ++k) grown += sts[k].ok() ? 1 : 0;
    if (grown == 0) {
      // None grew, so the replicas still agree: nothing to drop, the size stays.
      const Slot& sl = *slots_[t.idx[0]];
      return Status::Error(sts[0].code, "growing replica " + sl.id + ": " + sts[0].message, sts[0].sys_errno);
    }
    // Those that failed are behind the others and must never serve the new range: ERR and
    // out of the replica set before the new size is used, as for a failed write. Self-repair
    // rebuilds them, and the rebuild gives them the new size (AdoptChain).
    for (size_t k = 0; k < t.n; ++k)
      if (!sts[k].ok()) MarkFailed(t.idx[k], ErrnoOf(sts[k]));
    if (int rc = CommitDropsLocked(&ev); rc < 0) {
      result = Status::FromErrno(rc, "fencing the replicas that failed to grow");
    } else {
      size_ = size_bytes;
    }
  }
  Emit(ev);
  return result;
}

// ---------------------------------------------------------------------------------------
// Rebuild (docs/rebuild.md)

bool ReplicatedEngine::PickSource(Slot** slot, std::shared_ptr<ReplicaBackend>* backend) const {
  std::lock_guard<std::mutex> lk(state_mu_);
  for (const auto& s : slots_) {
    if (s->mode.load() != ReplicaMode::kRW) continue;
    *slot = s.get();
    *backend = s->backend;
    return true;
  }
  return false;
}

int ReplicatedEngine::RebuildCheck(const Slot* slot) const {
  if (int stop = rebuild_stop_.load(); stop < 0) return stop;
  if (closed_.load()) return -ESHUTDOWN;
  if (standby_.load()) return -kErrStandby;
  if (fenced_.load()) return -kErrStaleEpoch;
  if (slot->mode.load() != ReplicaMode::kWO) {
    std::lock_guard<std::mutex> lk(state_mu_);
    return slot->last_error < 0 ? slot->last_error : -EIO;
  }
  return 0;
}

void ReplicatedEngine::EmitRebuild(EngineEvent::Type type, const std::string& id, const RebuildResult& r,
                                   uint64_t total, int error, const std::string& message) {
  EngineEvent e{type, id, error, 0, r.sent_bytes, message};
  e.scanned_bytes = r.scanned_bytes;
  e.total_bytes = std::max(total, r.scanned_bytes);
  Emit({e});
}

void ReplicatedEngine::StopRebuild(const std::string& id, int why) {
  std::unique_lock<std::mutex> lk(rebuild_mu_);
  if (!rebuild_active_ || (!id.empty() && rebuild_target_ != id)) return;
  rebuild_stop_ = why;
  // The rebuild checks before every window, so this waits for at most one window's
  // compare and copy (or one replica call, when remote, bounded by its I/O timeout).
  rebuild_cv_.wait(lk, [&] { return !rebuild_active_; });
}

Status ReplicatedEngine::StartRebuild(const std::shared_ptr<ReplicaBackend>& target, const std::string& member, Slot** out,
                                      Events* ev) {
  std::unique_lock<DataGate> lk(gate_);
  if (closed_) return Status::Error(Code::kClosed, "engine is closed");
  if (standby_) return Status::Error(Code::kInvalidState, "engine is a standby: it rebuilds nothing until activated", EPERM);
  if (fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
  BusyFlag busy(control_busy_);
  const std::string id = target->id();
  // A target of another size (one that missed a resize while ERR) takes the source's with
  // its chain (AdoptChain): its data is replaced either way.
  // Settles pending fences first, so no slot index is queued in unfenced_ while the list
  // changes, and the epoch the target adopts is the one the RW replicas hold.
  if (int rc = CommitDropsLocked(ev); rc < 0) return Status::FromErrno(rc, "fencing failed replicas before the rebuild");
  if (!ReplicaSet::ValidName(member))
    return Status::Error(Code::kInvalidArgument, "member name '" + member.substr(0, 64) + "' is not [A-Za-z0-9._-]{1,63}");
  size_t existing = slots_.size();
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i]->id == id) existing = i;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (i != existing && slots_[i]->member == member)
      return Status::Error(Code::kInvalidArgument, "member name " + member + " is taken by replica " + slots_[i]->id);
  if (existing < slots_.size() && slots_[existing]->member != member)
    return Status::Error(Code::kInvalidArgument, "replica " + id + " is member " + slots_[existing]->member + ", not " + member);
  if (existing < slots_.size() && slots_[existing]->mode.load() != ReplicaMode::kERR)
    return Status::Error(Code::kInvalidState, "replica " + id + " is already " +
                                                  ReplicaModeName(slots_[existing]->mode.load()) + " in this engine");
  if (existing == slots_.size() && slots_.size() >= kMaxReplicas)
    return Status::Error(Code::kOutOfRange, "an engine has at most " + std::to_string(kMaxReplicas) + " replicas");
  const Targets t = RwTargets();
  if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica to rebuild from");
  std::vector<LayerInfo> layers;
  Status st = slots_[t.idx[0]]->backend->ListLayers(&layers);
  if (!st.ok()) return Status::Error(st.code, "listing the layers of " + slots_[t.idx[0]]->id + ": " + st.message, st.sys_errno);
  // A rebuild copies layers only, never the backing image (every replica reads its own copy
  // on its disk), so the target must sit on the same image. The control plane creates it so;
  // this cheap check (where each side's image holds data) catches a target made without
  // one, or over another image, before it could serve other bytes.
  {
    std::vector<Range> want, have;
    Status ws = slots_[t.idx[0]]->backend->LayerExtents(kBackingImageLayerId, &want);
    Status hs = target->LayerExtents(kBackingImageLayerId, &have);
    if (!ws.ok() && ws.code != Code::kNotFound)
      return Status::Error(ws.code, "backing image of " + slots_[t.idx[0]]->id + ": " + ws.message, ws.sys_errno);
    if (!hs.ok() && hs.code != Code::kNotFound)
      return Status::Error(hs.code, "backing image of rebuild target " + id + ": " + hs.message, hs.sys_errno);
    auto same = [](const std::vector<Range>& a, const std::vector<Range>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i].off != b[i].off || a[i].len != b[i].len) return false;
      return true;
    };
    if (ws.ok() != hs.ok() || (ws.ok() && !same(want, have)))
      return Status::Error(Code::kInvalidArgument,
                           "rebuild target " + id + (hs.ok() ? " has a backing image" : " has no backing image") +
                               (ws.ok() ? (hs.ok() ? " that differs from the one of " : " but ")
                                        : " but ") +
                               slots_[t.idx[0]]->id + (ws.ok() ? (hs.ok() ? "" : " has one") : " has none"));
  }
  st = target->AdoptChain(layers, epoch_.load());
  if (!st.ok()) return Status::Error(st.code, "rebuild target " + id + ": " + st.message, st.sys_errno);
  std::shared_ptr<ReplicaBackend> old;
  {
    std::lock_guard<std::mutex> g(state_mu_);
    if (existing < slots_.size()) {
      Slot& s = *slots_[existing];
      old = std::move(s.backend);
      s.backend = target;
      WatchBackend(target.get());
      s.last_error = 0;
      s.mode = ReplicaMode::kWO;
      *out = &s;
    } else {
      auto s = std::make_unique<Slot>();
      s->backend = target;
      WatchBackend(target.get());
      s->id = id;
      s->member = member;
      s->mode = ReplicaMode::kWO;
      *out = s.get();
      slots_.push_back(std::move(s));
    }
  }
  // The ERR slot's old handle (for a local replica, another share of the same replica).
  if (old) {
    old->SetFailureListener(nullptr);
    old->Close();
  }
  return Status::Ok();
}

Status ReplicatedEngine::FinishRebuildLocked(Slot* slot, const std::vector<std::string>& copied, bool* finished,
                                             Events* ev) {
  *finished = false;
  std::unique_lock<DataGate> lk(gate_);
  BusyFlag busy(control_busy_);
  if (int rc = RebuildCheck(slot); rc < 0) return Status::FromErrno(rc, "rebuild of " + slot->id + " stopped");
  const Targets t = RwTargets();
  if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica left to rebuild from");
  const Slot& src = *slots_[t.idx[0]];
  std::vector<LayerInfo> want, have;
  Status st = src.backend->ListLayers(&want);
  if (!st.ok()) return Status::Error(st.code, "listing the layers of " + src.id + ": " + st.message, st.sys_errno);
  // Snapshots cannot be taken while we hold the gate: if every layer is copied now, the
  // target holds the source's data and every write since (WO), and no more can come in
  // between this check and RW.
  for (const LayerInfo& l : want)
    if (std::find(copied.begin(), copied.end(), l.id) == copied.end()) return Status::Ok();
  st = slot->backend->ListLayers(&have);
  if (!st.ok()) return Status::Error(st.code, "listing the layers of " + slot->id + ": " + st.message, st.sys_errno);
  auto sig = [](const std::vector<LayerInfo>& v) {
    std::string out;
    for (const LayerInfo& l : v)
      out += l.id + '\0' + l.parent + '\0' + l.name + '\0' + (l.head ? "h" : "") + (l.removed ? "r" : "") + '\n';
    return out;
  };
  if (sig(want) != sig(have))
    return Status::Error(Code::kIoError, "rebuild target " + slot->id + " ended with a different layer list than " + src.id);
  if (slot->backend->epoch() < epoch_.load()) {
    st = slot->backend->ClaimEpoch(epoch_.load(), nullptr, nullptr);
    if (!st.ok()) return st;
  }
  st = slot->backend->FinishRebuild();
  if (!st.ok()) return Status::Error(st.code, "finishing the rebuild of " + slot->id + ": " + st.message, st.sys_errno);
  // It holds every acknowledged write now (I/O is quiesced): it joins the replica set, and
  // is RW only once that is committed (docs/single-writer.md).
  if (int rc = CommitDropsLocked(ev, /*hold=*/false); rc < 0)
    return Status::FromErrno(rc, "committing the replica set before " + slot->id + " joins it");
  ReplicaSet next = CommittedSet();
  ++next.generation;
  if (!next.IsMember(slot->member)) next.members.push_back(slot->member);
  if (!next.IsRw(slot->member)) next.rw.push_back(slot->member);
  if (int rc = CommitLocked(CommittedSet(), next, /*hold=*/false, ev); rc < 0)
    return Status::FromErrno(rc, "committing the replica set with " + slot->id + " as RW");
  {
    std::lock_guard<std::mutex> g(state_mu_);
    slot->mode = ReplicaMode::kRW;
    slot->last_error = 0;
  }
  *finished = true;
  return Status::Ok();
}

Status ReplicatedEngine::RunRebuild(Slot* slot, RebuildResult* res, uint64_t* total) {
  Slot* source_slot = nullptr;
  std::shared_ptr<ReplicaBackend> source;
  uint64_t next_progress = kRebuildProgressIntervalBytes;
  Rebuilder::Hooks hooks;
  hooks.ranges = &ranges_;
  hooks.check = [&] { return RebuildCheck(slot); };
  hooks.source_ok = [&] { return source_slot->mode.load() == ReplicaMode::kRW; };
  hooks.epoch = [this] { return epoch_.load(); };
  hooks.on_progress = [&](const RebuildResult& r) {
    if (r.scanned_bytes < next_progress) return;
    EmitRebuild(EngineEvent::Type::kRebuildProgress, slot->id, r, *total);
    next_progress = (r.scanned_bytes / kRebuildProgressIntervalBytes + 1) * kRebuildProgressIntervalBytes;
  };
  // The slot's backend changes only in StartRebuild and RemoveReplica, neither of which
  // runs on this slot while this rebuild does.
  ReplicaBackend* target = slot->backend.get();
  Rebuilder rb(target, std::move(hooks));
  struct Publish {
    const Rebuilder& rb;
    RebuildResult* res;
    ~Publish() { *res = rb.totals(); }
  } publish{rb, res};

  auto stopped = [&](int rc) {
    if (rc == -ECANCELED)
      return Status::Error(Code::kClosed, "rebuild of " + slot->id + " was stopped: the replica was removed", ECANCELED);
    if (rc == -ESHUTDOWN)
      return Status::Error(Code::kClosed, "rebuild of " + slot->id + " was stopped: the engine is closing", ESHUTDOWN);
    if (rc == -kErrStaleEpoch)
      return Status::Error(Code::kStaleEpoch, "rebuild of " + slot->id + " was stopped: the engine was fenced", ESTALE);
    if (rc == -kErrStandby)
      return Status::Error(Code::kInvalidState,
                           "rebuild of " + slot->id + " was stopped: the engine handed the volume over", kErrStandby);
    return Status::FromErrno(rc, "rebuild target " + slot->id + " failed: " + std::strerror(-rc));
  };
  // A failed source: mark it like a failed read, then continue from another RW replica
  // (they hold the same layers, so what was copied stays valid). False if it was the last.
  size_t switches = 0;
  auto source_failed = [&](int rc) {
    if (++switches > kMaxReplicas || !MarkSlotFailed(source_slot, rc)) return false;
    CommitDrops();
    return true;
  };

  std::vector<std::string> copied;
  for (size_t pass = 0; pass < kMaxRebuildPasses; ++pass) {
    if (int rc = RebuildCheck(slot); rc < 0) return stopped(rc);
    if (!PickSource(&source_slot, &source))
      return Status::Error(Code::kNoHealthyReplica, "no RW replica left to rebuild " + slot->id + " from");
    std::vector<LayerInfo> layers;
    Status st;
    {
      // Shared gate: a snapshot applies to the RW replicas and then to the target under
      // the exclusive gate, so a listing taken between the two would name a layer the
      // target does not have yet.
      std::shared_lock<DataGate> g(gate_);
      st = source->ListLayers(&layers);
    }
    if (!st.ok()) {
      if (!source_failed(ErrnoOf(st))) return Status::Error(st.code, "rebuild source " + source_slot->id + ": " + st.message, st.sys_errno);
      continue;
    }
    std::vector<const LayerInfo*> todo;
    for (const LayerInfo& l : layers)
      if (std::find(copied.begin(), copied.end(), l.id) == copied.end()) todo.push_back(&l);
    if (todo.empty()) {
      // Most of the target's dirty data is already on its way to disk (WriteLayer starts
      // writeback); syncing its head here keeps the sync under the gate short.
      if (int rc = target->Flush(); rc < 0) return stopped(rc);
      bool finished = false;
      Events ev;
      st = FinishRebuildLocked(slot, copied, &finished, &ev);
      Emit(ev);
      if (!st.ok() || finished) return st;
      continue;  // a snapshot came in meanwhile: copy its new layer
    }
    // Planned figures for progress events; each layer's real figure replaces its plan.
    std::vector<uint64_t> planned(todo.size(), 0);
    for (size_t i = 0; i < todo.size(); ++i) {
      bool sf = false;
      if (rb.UnionBytes(source.get(), todo[i]->id, &planned[i], &sf) == 0) *total += planned[i];
    }
    bool restart = false;
    for (size_t i = 0; i < todo.size(); ++i) {
      const uint64_t before = rb.totals().scanned_bytes;
      bool sf = false;
      int rc = rb.CopyLayer(source.get(), *todo[i], &sf);
      if (rc < 0) {
        if (!sf) return RebuildCheck(slot) < 0 ? stopped(RebuildCheck(slot)) : stopped(rc);
        if (!source_failed(rc))
          return Status::FromErrno(rc, "rebuild source " + source_slot->id + " failed: " + std::strerror(-rc));
        restart = true;
        break;
      }
      copied.push_back(todo[i]->id);
      *total = *total - std::min(*total, planned[i]) + (rb.totals().scanned_bytes - before);
      planned[i] = 0;
    }
    if (restart) {
      for (uint64_t p : planned) *total -= std::min(*total, p);
    }
  }
  return Status::Error(Code::kBusy, "rebuild of " + slot->id + " did not settle in " +
                                        std::to_string(kMaxRebuildPasses) + " passes (snapshots kept coming)");
}

Status ReplicatedEngine::AddReplica(std::shared_ptr<ReplicaBackend> target, const std::string& member,
                                    RebuildResult* out) {
  if (!target) return Status::Error(Code::kInvalidArgument, "no rebuild target");
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lk(rebuild_mu_);
    Status refuse;
    if (shutting_down_) refuse = Status::Error(Code::kClosed, "engine is closed");
    else if (handing_over_)
      refuse = Status::Error(Code::kInvalidState, "engine is handing the volume over", EPERM);
    else if (rebuild_active_)
      refuse = Status::Error(Code::kBusy, "replica " + rebuild_target_ + " is being rebuilt: one rebuild at a time per engine", EBUSY);
    if (!refuse.ok()) {
      target->Close();
      return refuse;
    }
    rebuild_active_ = true;
    rebuild_target_ = target->id();
    rebuild_stop_ = 0;
    rebuilding_ = true;
  }
  struct Release {
    ReplicatedEngine* e;
    ~Release() {
      {
        std::lock_guard<std::mutex> lk(e->rebuild_mu_);
        e->rebuild_active_ = false;
        e->rebuilding_ = false;
        e->rebuild_target_.clear();
      }
      e->rebuild_cv_.notify_all();
    }
  } release{this};

  Events ev;
  Slot* slot = nullptr;
  Status st = StartRebuild(target, member, &slot, &ev);
  Emit(ev);
  if (!st.ok()) {
    target->Close();
    return st;
  }
  const std::string id = slot->id;
  RebuildResult res;
  uint64_t total = 0;
  EmitRebuild(EngineEvent::Type::kRebuildStarted, id, res, 0);
  st = RunRebuild(slot, &res, &total);
  res.duration_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  if (!st.ok()) {
    const int err = ErrnoOf(st);
    {
      std::lock_guard<std::mutex> lk(state_mu_);
      if (slot->mode.load() == ReplicaMode::kWO) {
        slot->mode = ReplicaMode::kERR;
        slot->last_error = err;
      }
    }
    EmitRebuild(EngineEvent::Type::kRebuildFailed, id, res, total, err, st.message);
    return st;
  }
  EmitRebuild(EngineEvent::Type::kRebuildCompleted, id, res, res.scanned_bytes);
  if (out) *out = res;
  return Status::Ok();
}

Status ReplicatedEngine::RemoveReplica(const std::string& id, bool allow_rw) {
  StopRebuild(id, -ECANCELED);
  Events ev;
  std::shared_ptr<ReplicaBackend> gone;
  {
    std::unique_lock<DataGate> lk(gate_);
    if (closed_) return Status::Error(Code::kClosed, "engine is closed");
    size_t i = 0;
    while (i < slots_.size() && slots_[i]->id != id) ++i;
    if (i == slots_.size()) return Status::Error(Code::kNotFound, "no replica " + id.substr(0, 4096) + " in this engine");
    const ReplicaMode mode = slots_[i]->mode.load();
    if (mode == ReplicaMode::kRW) {
      if (!allow_rw) return Status::Error(Code::kInvalidState, "replica " + id + " is RW: only ERR or WO replicas can be removed");
      size_t rw = 0;
      for (const auto& s : slots_) rw += s->mode.load() == ReplicaMode::kRW ? 1 : 0;
      // No write is in flight (the gate is ours): the commit below takes it out of the set
      // while the others hold every acknowledged write.
      if (rw < 2) return Status::Error(Code::kInvalidState, "replica " + id + " is the only RW replica");
    }
    if (mode == ReplicaMode::kWO)  // a new rebuild of it started after ours was stopped
      return Status::Error(Code::kBusy, "replica " + id + " is being rebuilt", EBUSY);
    // It leaves the replica set's members first, so majorities are counted without it.
    const std::string member = slots_[i]->member;
    if (int rc = CommitDropsLocked(&ev, /*hold=*/false); rc < 0) {
      lk.unlock();
      Emit(ev);
      return Status::FromErrno(rc, "committing the replica set before removing " + id);
    }
    ReplicaSet next = CommittedSet();
    // A standby or fenced engine owns no replica set: it only lets go of the replica.
    if (!standby_ && !fenced_ && next.IsMember(member)) {
      ++next.generation;
      next.members.erase(std::find(next.members.begin(), next.members.end(), member));
      if (next.IsRw(member)) next.rw.erase(std::find(next.rw.begin(), next.rw.end(), member));
      if (int rc = CommitLocked(CommittedSet(), next, /*hold=*/false, &ev); rc < 0) {
        lk.unlock();
        Emit(ev);
        return Status::FromErrno(rc, "committing the replica set without " + id);
      }
    }
    std::lock_guard<std::mutex> g(state_mu_);
    gone = std::move(slots_[i]->backend);
    slots_.erase(slots_.begin() + static_cast<std::ptrdiff_t>(i));
    std::vector<size_t> kept;
    for (size_t u : unfenced_)
      if (u != i) kept.push_back(u > i ? u - 1 : u);
    unfenced_.swap(kept);
    fence_pending_ = !unfenced_.empty();
  }
  Emit(ev);
  if (gone) {
    gone->SetFailureListener(nullptr);
    gone->Close();
  }
  return Status::Ok();
}

Status ReplicatedEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lk(rebuild_mu_);
    shutting_down_ = true;
  }
  // A WO target is left as it is: its rebuilding flag makes it ERR at the next open.
  StopRebuild("", -ESHUTDOWN);
  Events ev;
  Status result;
  {
    std::unique_lock<DataGate> lk(gate_);
    if (closed_) return Status::Ok();
    BusyFlag busy(control_busy_);
    closed_ = true;  // calls queued behind us see it and return -ESHUTDOWN
    // A standby wrote nothing since it flushed (or ever), and another engine may be
    // writing the replicas now: no flush, no fence, no clean mark.
    if (!fenced_ && !standby_) {
      // One try each, no hold: closing must not wait for a majority.
      CommitDropsLocked(&ev, /*hold=*/false);
      const Targets t = RwTargets();
      for (size_t k = 0; k < t.n; ++k) {
        int rc = slots_[t.idx[k]]->backend->Flush();
        if (rc < 0 && !MarkFailed(t.idx[k], rc) && result.ok())
          result = Status::FromErrno(rc, "flushing " + slots_[t.idx[k]]->id);
      }
      // The clean mark promises the next engine that the RW replicas are identical; with
      // a drop not committed, the committed set still names a replica that may differ.
      if (int rc = CommitDropsLocked(&ev, /*hold=*/false); rc < 0 && result.ok())
        result = Status::FromErrno(rc, "committing the replica set at close: replicas are left unclean");
      const Targets clean = RwTargets();
      if (result.ok()) {
        for (size_t k = 0; k < clean.n; ++k) {
          // A replica left unclean is reconciled on the next open: report, go on.
          Status st = slots_[clean.idx[k]]->backend->MarkClean(epoch_.load());
          if (!st.ok() && result.ok()) result = st;
        }
      }
    }
    CloseReplicas();
  }
  Emit(ev);
  return result;
}

void ReplicatedEngine::WatchBackend(ReplicaBackend* b) {
  b->SetFailureListener([this, b](int rc) { OnBackendLost(b, rc); });
}

void ReplicatedEngine::OnBackendLost(const ReplicaBackend* b, int rc) {
  if (closed_.load()) return;
  std::string id;
  bool standby = false;
  {
    // state_mu_ only (not the gate): Shutdown and RemoveReplica clear this listener while
    // holding the gate, and clearing waits for a listener that is running.
    std::lock_guard<std::mutex> lk(state_mu_);
    size_t i = 0;
    while (i < slots_.size() && slots_[i]->backend.get() != b) ++i;
    if (i == slots_.size()) return;
    Slot& sl = *slots_[i];
    if (sl.mode.load() != ReplicaMode::kRW) return;
    if (standby_.load()) {
      // No epoch held, nothing to fence: it is simply not used when activated.
      sl.mode = ReplicaMode::kERR;
      sl.last_error = rc;
      standby = true;
    } else {
      // As an I/O failure: ERR now, durably stale (fenced) before the next write is answered.
      if (!MarkFailedLocked(i, rc)) return;
      sl.reported = true;
    }
    id = sl.id;
  }
  Emit({{EngineEvent::Type::kReplicaError, id, rc, 0, 0,
         "replica " + id + " lost its connection (errno " + std::to_string(-rc) + ") and was dropped" +
             (standby ? std::string("; the standby engine will not use it") : "; it is fenced before the next write is answered")}});
}

void ReplicatedEngine::CloseReplicas() {
  for (auto& s : slots_)
    if (s->backend) s->backend->SetFailureListener(nullptr);
  std::lock_guard<std::mutex> lk(state_mu_);
  closed_ = true;
  for (auto& s : slots_) {
    if (!s->backend) continue;
    s->closed_epoch = s->backend->epoch();
    s->cached_allocated = s->backend->AllocatedBytes();
    s->backend->Close();
  }
}

// ---------------------------------------------------------------------------------------
// Snapshot reads (engine/snapshot-reader.h drives them)
//
// The read holds its replica by backend pointer, never by Slot*: RemoveReplica may erase a
// slot. Every call looks the backend up under the shared gate, so the slot list is stable
// for the call and Shutdown/RemoveReplica cannot close the backend under it.

class ReplicatedEngine::SnapshotReadImpl final : public Engine::SnapshotRead {
 public:
  SnapshotReadImpl(ReplicatedEngine* e, std::shared_ptr<ReplicaBackend> b) : e_(e), backend_(std::move(b)) {}
  // A delete that still sees the count refuses with kBusy: harmless, the read was ending.
  ~SnapshotReadImpl() override { e_->snapshot_reads_.fetch_sub(1); }

  std::string replica_id() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return backend_->id();
  }
  Status ListLayers(std::vector<LayerInfo>* out) override {
    return Call([&](ReplicaBackend& b) { return b.ListLayers(out); });
  }
  Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) override {
    return Call([&](ReplicaBackend& b) { return b.LayerExtents(layer_id, out); });
  }
  int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) override {
    Status st = Call([&](ReplicaBackend& b) {
      int rc = b.ReadLayer(layer_id, off, len, buf);
      return rc < 0 ? Status::FromErrno(rc, "") : Status::Ok();
    });
    if (st.ok()) return 0;
    return st.sys_errno > 0 ? -st.sys_errno : -EIO;
  }

  Status Failover(int neg_errno) override {
    std::shared_ptr<ReplicaBackend> failed;
    {
      std::lock_guard<std::mutex> lk(mu_);
      failed = backend_;
    }
    bool marked = false;
    {
      std::lock_guard<std::mutex> lk(e_->state_mu_);
      for (size_t i = 0; i < e_->slots_.size(); ++i) {
        if (e_->slots_[i]->backend != failed || e_->slots_[i]->mode.load() != ReplicaMode::kRW) continue;
        if (!e_->MarkFailedLocked(i, neg_errno))
          return Status::Error(Code::kNoHealthyReplica, "replica " + failed->id() + " failed (errno " +
                                                            std::to_string(-neg_errno) + ") and is the last RW replica",
                               -neg_errno);
        marked = true;
      }
    }
    if (marked) e_->CommitDrops();
    std::shared_ptr<ReplicaBackend> next;
    {
      std::shared_lock<DataGate> g(e_->gate_);
      Slot* slot = nullptr;
      if (!e_->PickSource(&slot, &next))
        return Status::Error(Code::kNoHealthyReplica, "no RW replica left to read the snapshot from");
    }
    std::lock_guard<std::mutex> lk(mu_);
    backend_ = std::move(next);
    return Status::Ok();
  }

 private:
  // Runs op on the replica under the shared gate, if the engine and the replica can still serve.
  template <typename Op>
  Status Call(Op op) {
    std::shared_ptr<ReplicaBackend> b;
    {
      std::lock_guard<std::mutex> lk(mu_);
      b = backend_;
    }
    std::shared_lock<DataGate> g(e_->gate_);
    if (e_->closed_) return Status::Error(Code::kClosed, "engine is closed", ESHUTDOWN);
    if (e_->fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
    bool rw = false;
    for (const auto& s : e_->slots_)
      if (s->backend == b) rw = s->mode.load() == ReplicaMode::kRW;
    if (!rw) return Status::Error(Code::kIoError, "replica " + b->id() + " is no longer RW", EIO);
    // Under the shared gate our own claims are complete, so a higher epoch on the replica is
    // another engine's: it may delete snapshots, which our pin cannot stop. (A remote
    // backend's epoch() is the last one it was told of, so this sees local claims only.)
    if (b->epoch() > e_->epoch_.load())
      return Status::Error(Code::kStaleEpoch, "replica " + b->id() + " was claimed by another engine (epoch " +
                                                  std::to_string(b->epoch()) + ")", ESTALE);
    return op(*b);
  }

  ReplicatedEngine* e_;
  mutable std::mutex mu_;  // guards backend_ (Failover swaps it)
  std::shared_ptr<ReplicaBackend> backend_;
};

Status ReplicatedEngine::OpenSnapshotRead(std::unique_ptr<SnapshotRead>* out) {
  std::shared_lock<DataGate> lk(gate_);
  if (closed_) return Status::Error(Code::kClosed, "engine is closed", ESHUTDOWN);
  if (fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
  if (standby_) return Status::Error(Code::kInvalidState, "engine is a standby: only the writer reads snapshots", EPERM);
  if (snapshot_reads_.load() >= kMaxSnapshotReads)
    return Status::Error(Code::kBusy, std::to_string(kMaxSnapshotReads) + " snapshot reads run on this engine already", EBUSY);
  Slot* slot = nullptr;
  std::shared_ptr<ReplicaBackend> backend;
  if (!PickSource(&slot, &backend)) return Status::Error(Code::kNoHealthyReplica, "no RW replica to read a snapshot from");
  snapshot_reads_.fetch_add(1);
  out->reset(new SnapshotReadImpl(this, std::move(backend)));
  return Status::Ok();
}

}  // namespace

Status Engine::Start(Options opts, std::unique_ptr<Engine>* out) {
  auto engine = std::make_unique<ReplicatedEngine>(std::move(opts));
  Status st = engine->Open();
  if (!st.ok()) {
    // Nothing was served: close without flushing or marking clean.
    engine->CloseReplicas();
    return st;
  }
  *out = std::move(engine);
  return Status::Ok();
}

}  // namespace mooring
