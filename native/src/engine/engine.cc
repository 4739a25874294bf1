// ReplicatedEngine: the Engine over N ReplicaBackends (see engine.h for the contract).
//
// Locking:
// - gate_ (a writer-preferring RwLock, taken at most once per thread): the data path
//   holds it shared; snapshot/delete/revert, fencing and shutdown hold it exclusive. Epoch changes happen only under the exclusive lock, so no
//   write of ours can ever carry an epoch older than a replica's: -ESTALE from a replica
//   always means another engine took the volume over.
// - state_mu_: replica modes and the list of replicas marked ERR but not yet fenced.
//   Modes are also atomics so the data path picks targets without taking it.
//
// Fan-out is sequential for writes (local replicas complete in the page cache) and
// parallel for flushes (Fanout::kParallel). A remote backend (later issue) makes writes
// submit-all-then-wait too; the settlement logic after the loop does not change.
#include "engine/engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <system_error>
#include <thread>

#include "engine/range-lock.h"
#include "engine/reconciler.h"
#include "util/rw-lock.h"

namespace mooring {
namespace {

// Upper bound on replicas per engine; the data path keeps target lists on the stack.
constexpr size_t kMaxReplicas = 16;
// Fencing rounds: each round either succeeds or drops at least one more replica.
constexpr size_t kMaxFenceRounds = kMaxReplicas + 1;

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
  std::atomic<ReplicaMode> mode{ReplicaMode::kRW};
  int last_error = 0;            // guarded by state_mu_
  uint64_t closed_epoch = 0;     // guarded by state_mu_; Replicas() after Close
  std::atomic<uint64_t> cached_allocated{0};
};

using Events = std::vector<EngineEvent>;

struct Targets {
  size_t idx[kMaxReplicas];
  size_t n = 0;
};

class ReplicatedEngine final : public Engine {
 public:
  explicit ReplicatedEngine(Options opts) : sink_(std::move(opts.on_event)) {
    slots_.reserve(opts.replicas.size());
    for (auto& r : opts.replicas) {
      auto s = std::make_unique<Slot>();
      s->backend = std::move(r);
      if (s->backend) s->id = s->backend->id();
      slots_.push_back(std::move(s));
    }
  }
  ~ReplicatedEngine() override { Shutdown(); }

  Status Open();
  void CloseReplicas();

  uint64_t size() const override { return size_; }
  uint64_t epoch() const override { return epoch_.load(); }
  std::vector<ReplicaState> Replicas() const override;

  int Read(uint64_t off, uint32_t len, uint8_t* buf) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return ReadFrom([&](ReplicaBackend& b) { return b.Read(off, len, buf); });
  }
  int Write(uint64_t off, uint32_t len, const uint8_t* buf, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return Mutate(off, len, [&](ReplicaBackend& b, uint64_t e, size_t) { return b.Write(e, off, len, buf, fua); });
  }
  int Flush() override {
    return Mutate(0, 0, [](ReplicaBackend& b, uint64_t, size_t) { return b.Flush(); }, Fanout::kParallel);
  }
  int Trim(uint64_t off, uint32_t len, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return Mutate(off, len, [&](ReplicaBackend& b, uint64_t e, size_t) {
      int rc = b.Trim(e, off, len);
      return rc == 0 && fua ? b.Flush() : rc;
    });
  }
  int WriteZeroes(uint64_t off, uint32_t len, bool may_trim, bool fast_only, bool fua) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    if (len == 0) return 0;
    return Mutate(off, len, [&](ReplicaBackend& b, uint64_t e, size_t k) {
      int rc = b.WriteZeroes(e, off, len, may_trim, fast_only, fua);
      // The first replica decides whether the fast path exists (an -ENOTSUP there
      // aborts with nothing changed); later ones must follow it, slowly if need be.
      if (rc == -ENOTSUP && fast_only && k > 0) rc = b.WriteZeroes(e, off, len, may_trim, false, fua);
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
  int Cache(uint64_t off, uint32_t len) override {
    if (!InRange(off, len, size_)) return -EINVAL;
    return closed_.load() ? -ESHUTDOWN : 0;
  }

  Status Snapshot(const std::string& name, const Labels& labels, bool user_created) override {
    const int64_t now = NowMs();  // one timestamp, identical on every replica
    return Control([&](ReplicaBackend& b) { return b.Snapshot(name, now, labels, user_created); });
  }
  Status ListSnapshots(std::vector<LayerInfo>* out) override;
  Status DeleteSnapshot(const std::string& name) override {
    return Control([&](ReplicaBackend& b) { return b.DeleteSnapshot(name); });
  }
  Status Revert(const std::string& name) override {
    const int64_t now = NowMs();
    return Control([&](ReplicaBackend& b) { return b.Revert(name, now); });
  }
  Status AddReplica(std::shared_ptr<ReplicaBackend> target, RebuildResult* out) override;
  Status RemoveReplica(const std::string& id) override;
  Status Shutdown() override;

 private:
  Targets RwTargets() const {
    Targets t;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i]->mode.load() == ReplicaMode::kRW) t.idx[t.n++] = i;
    return t;
  }
  size_t RwCount() const { return RwTargets().n; }

  // Marks slot i ERR after a failure, unless it is the last RW replica (which keeps
  // serving and passes the error up). Returns true if i no longer counts as RW.
  bool MarkFailed(size_t i, int rc);
  // Unconditional (Start): the replica is unusable even if it is the last one.
  void MarkErr(size_t i, int rc, const std::string& why, Events* ev);
  // Claims epoch+1 on the RW replicas if any replica was marked ERR since the last claim.
  // Caller holds gate_ exclusively. Returns 0 or a negative errno.
  int FenceLocked(Events* ev);
  int Fence() {
    Events ev;
    int rc;
    {
      std::unique_lock<RwLock> lk(gate_);
      rc = FenceLocked(&ev);
    }
    Emit(ev);
    return rc;
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

  // Runs op on every RW replica. [off, off+len) is the range it changes (len 0: none).
  // kSerial calls replicas one after another on this thread (cheap page-cache writes);
  // kParallel runs each extra replica on its own short-lived thread (slow calls such as
  // fdatasync, where waiting for N replicas in series would add their latencies).
  enum class Fanout { kSerial, kParallel };
  template <typename Op>
  int Mutate(uint64_t off, uint64_t len, Op op, Fanout fanout = Fanout::kSerial);
  template <typename Op>
  int ReadFrom(Op op);
  template <typename Op>
  Status Control(Op op);

  Status CheckLayers(Events* ev);
  Status Reconcile(Events* ev);

  std::vector<std::unique_ptr<Slot>> slots_;
  EngineEventSink sink_;
  uint64_t size_ = 0;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> closed_{false};
  std::atomic<bool> fenced_{false};  // another engine claimed a newer epoch
  std::atomic<bool> control_busy_{false};  // a control operation holds the replicas
  std::atomic<bool> fence_pending_{false};  // unfenced_ is not empty
  std::atomic<uint32_t> next_read_{0};
  // Writer-preferring, so a steady stream of requests cannot starve a snapshot.
  mutable RwLock gate_;
  RangeLock ranges_;
  mutable std::mutex state_mu_;
  std::vector<size_t> unfenced_;  // guarded by state_mu_
};

bool ReplicatedEngine::MarkFailed(size_t i, int rc) {
  std::lock_guard<std::mutex> lk(state_mu_);
  Slot& s = *slots_[i];
  if (s.mode.load() != ReplicaMode::kRW) return true;
  if (RwCount() <= 1) return false;
  fence_pending_ = true;  // before the mode change: see Mutate()
  s.mode = ReplicaMode::kERR;
  s.last_error = rc;
  unfenced_.push_back(i);
  return true;
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

int ReplicatedEngine::FenceLocked(Events* ev) {
  for (size_t round = 0; round < kMaxFenceRounds; ++round) {
    std::vector<size_t> pending;
    {
      std::lock_guard<std::mutex> lk(state_mu_);
      pending.swap(unfenced_);
      if (pending.empty()) {
        fence_pending_ = false;
        return 0;
      }
    }
    if (fenced_) return -kErrStaleEpoch;

    const uint64_t next = epoch_.load() + 1;
    Targets t = RwTargets();
    size_t claimed = 0;
    for (size_t k = 0; k < t.n; ++k) {
      Status st = slots_[t.idx[k]]->backend->ClaimEpoch(next);
      if (st.ok()) {
        ++claimed;
      } else if (st.code == Code::kStaleEpoch) {
        fenced_ = true;
      } else {
        MarkFailed(t.idx[k], ErrnoOf(st));  // queued into unfenced_: the next round covers it
      }
    }
    if (fenced_ || claimed == 0) {
      // Keep the replicas pending so a later fence (or Shutdown) retries.
      std::lock_guard<std::mutex> lk(state_mu_);
      unfenced_.insert(unfenced_.end(), pending.begin(), pending.end());
      return fenced_ ? -kErrStaleEpoch : -EIO;
    }
    epoch_ = next;
    for (size_t i : pending) {
      int err;
      {
        std::lock_guard<std::mutex> lk(state_mu_);
        err = slots_[i]->last_error;
      }
      ev->push_back({EngineEvent::Type::kReplicaError, slots_[i]->id, err, 0, 0,
                     "replica " + slots_[i]->id + " failed (errno " + std::to_string(-err) +
                         ") and was dropped; fenced by epoch " + std::to_string(next)});
    }
    ev->push_back({EngineEvent::Type::kEpochClaimed, "", 0, next, 0,
                   "claimed epoch " + std::to_string(next) + " to fence failed replicas"});
  }
  return -EIO;
}

template <typename Op>
int ReplicatedEngine::Mutate(uint64_t off, uint64_t len, Op op, Fanout fanout) {
  int result = 0;
  bool marked = false;
  {
    std::shared_lock<RwLock> lk(gate_);
    if (closed_) return -ESHUTDOWN;
    if (fenced_) return -kErrStaleEpoch;
    const uint64_t e = epoch_.load();
    const Targets t = RwTargets();
    if (t.n == 0) return -EIO;
    // Released before Fence() below: holding it while waiting for the exclusive gate
    // would deadlock against a writer that waits for it while holding the gate shared.
    std::optional<RangeLock::Guard> range;
    if (len > 0 && t.n > 1) range.emplace(ranges_.Lock(off, len));
    int rcs[kMaxReplicas];
    if (fanout == Fanout::kParallel && t.n > 1) {
      // At most kMaxReplicas - 1 threads; a replica whose thread cannot start runs here.
      std::thread helpers[kMaxReplicas];
      for (size_t k = 1; k < t.n; ++k) {
        try {
          helpers[k] = std::thread([&, k] { rcs[k] = op(*slots_[t.idx[k]]->backend, e, k); });
        } catch (const std::system_error&) {
          rcs[k] = op(*slots_[t.idx[k]]->backend, e, k);
        }
      }
      rcs[0] = op(*slots_[t.idx[0]]->backend, e, 0);
      for (size_t k = 1; k < t.n; ++k)
        if (helpers[k].joinable()) helpers[k].join();
    } else {
      for (size_t k = 0; k < t.n; ++k) {
        rcs[k] = op(*slots_[t.idx[k]]->backend, e, k);
        if (k == 0 && IsRequestError(rcs[k])) return rcs[k];  // nothing changed anywhere
      }
    }
    for (size_t k = 0; k < t.n; ++k) {
      const int rc = rcs[k];
      if (rc >= 0) continue;
      if (rc == -kErrStaleEpoch) {
        fenced_ = true;
        result = rc;
      } else if (IsRequestError(rc)) {
        if (result == 0) result = rc;
      } else if (MarkFailed(t.idx[k], rc)) {
        marked = true;
      } else if (result == 0) {
        result = rc;
      }
    }
  }
  // A dropped replica must be durably stale before this request is answered: it may have
  // skipped the replica, and if we crashed before fencing, the replica would reopen as an
  // equal and could be the reconcile source, losing this acknowledged write.
  if (marked || fence_pending_.load()) {
    int rc = Fence();
    if (rc < 0 && result == 0) result = rc;
  }
  return result;
}

template <typename Op>
int ReplicatedEngine::ReadFrom(Op op) {
  int rc = -EIO;
  bool marked = false;
  {
    std::shared_lock<RwLock> lk(gate_);
    if (closed_) return -ESHUTDOWN;
    if (fenced_) return -kErrStaleEpoch;
    const size_t n = slots_.size();
    for (size_t attempt = 0; attempt < n; ++attempt) {
      const uint32_t start = next_read_.fetch_add(1, std::memory_order_relaxed);
      size_t pick = n;
      for (size_t k = 0; k < n && pick == n; ++k) {
        size_t i = (start + k) % n;
        if (slots_[i]->mode.load() == ReplicaMode::kRW) pick = i;
      }
      if (pick == n) break;
      rc = op(*slots_[pick]->backend);
      if (rc >= 0 || IsRequestError(rc)) break;
      if (!MarkFailed(pick, rc)) break;  // the last RW replica: its error is the answer
      marked = true;
    }
  }
  if (marked) {
    int frc = Fence();
    if (frc < 0 && rc >= 0) rc = frc;
  }
  return rc;
}

template <typename Op>
Status ReplicatedEngine::Control(Op op) {
  Events ev;
  Status result;
  {
    std::unique_lock<RwLock> lk(gate_);
    if (closed_) return Status::Error(Code::kClosed, "engine is closed");
    if (fenced_) return Status::Error(Code::kStaleEpoch, "engine was fenced by a newer epoch", ESTALE);
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
    int rc = FenceLocked(&ev);
    if (rc < 0 && result.ok()) result = Status::FromErrno(rc, "fencing failed replicas");
  }
  Emit(ev);
  return result;
}

Status ReplicatedEngine::ListSnapshots(std::vector<LayerInfo>* out) {
  std::shared_lock<RwLock> lk(gate_);
  if (closed_) return Status::Error(Code::kClosed, "engine is closed");
  Targets t = RwTargets();
  if (t.n == 0) return Status::Error(Code::kNoHealthyReplica, "no RW replica");
  return slots_[t.idx[0]]->backend->ListLayers(out);
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
  size_ = slots_[0]->backend->size();
  for (const auto& s : slots_) {
    if (s->backend->size() != size_)
      return Status::Error(Code::kInvalidArgument, "replica " + s->id + " has size " +
                                                       std::to_string(s->backend->size()) + ", " +
                                                       slots_[0]->id + " has " + std::to_string(size_));
  }

  Events ev;
  std::unique_lock<RwLock> lk(gate_);
  uint64_t max_epoch = 0;
  for (const auto& s : slots_) max_epoch = std::max(max_epoch, s->backend->epoch());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const uint64_t e = slots_[i]->backend->epoch();
    if (e < max_epoch)
      MarkErr(i, -kErrStaleEpoch, "replica " + slots_[i]->id + " was fenced (epoch " + std::to_string(e) +
                                      " < " + std::to_string(max_epoch) + ")", &ev);
  }
  CheckLayers(&ev);

  bool dirty = false;
  for (const auto& s : slots_)
    if (s->mode.load() == ReplicaMode::kRW && !s->backend->clean()) dirty = true;

  const uint64_t open_epoch = max_epoch + 1;
  size_t claimed = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = *slots_[i];
    if (s.mode.load() != ReplicaMode::kRW) continue;
    Status st = s.backend->ClaimEpoch(open_epoch);
    if (st.ok()) {
      ++claimed;
    } else if (st.code == Code::kStaleEpoch) {
      // Another engine is claiming this volume right now: do not race it.
      return Status::Error(Code::kStaleEpoch, "replica " + s.id + ": " + st.message, ESTALE);
    } else {
      // The claim may have reached the disk before failing: fence it like a runtime
      // failure (FenceLocked below claims again and reports it).
      std::lock_guard<std::mutex> g(state_mu_);
      fence_pending_ = true;
      s.mode = ReplicaMode::kERR;
      s.last_error = ErrnoOf(st);
      unfenced_.push_back(i);
    }
  }
  if (claimed == 0) {
    Emit(ev);
    return Status::Error(Code::kNoHealthyReplica, "no replica could be opened for writing");
  }
  epoch_ = open_epoch;
  ev.push_back({EngineEvent::Type::kEpochClaimed, "", 0, open_epoch, 0,
                "claimed epoch " + std::to_string(open_epoch)});

  if (dirty && RwCount() > 1) Reconcile(&ev);
  FenceLocked(&ev);
  if (RwCount() == 0) {
    Emit(ev);
    return Status::Error(Code::kNoHealthyReplica, "no replica survived reconcile");
  }
  lk.unlock();
  Emit(ev);
  return Status::Ok();
}

Status ReplicatedEngine::AddReplica(std::shared_ptr<ReplicaBackend>, RebuildResult*) {
  return Status::Error(Code::kUnsupported, "rebuild is not implemented yet");
}

Status ReplicatedEngine::RemoveReplica(const std::string&) {
  return Status::Error(Code::kUnsupported, "removing replicas is not implemented yet");
}

Status ReplicatedEngine::Shutdown() {
  Events ev;
  Status result;
  {
    std::unique_lock<RwLock> lk(gate_);
    if (closed_) return Status::Ok();
    BusyFlag busy(control_busy_);
    closed_ = true;  // calls queued behind us see it and return -ESHUTDOWN
    if (!fenced_) {
      FenceLocked(&ev);
      const Targets t = RwTargets();
      for (size_t k = 0; k < t.n; ++k) {
        int rc = slots_[t.idx[k]]->backend->Flush();
        if (rc < 0 && !MarkFailed(t.idx[k], rc) && result.ok())
          result = Status::FromErrno(rc, "flushing " + slots_[t.idx[k]]->id);
      }
      FenceLocked(&ev);
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

void ReplicatedEngine::CloseReplicas() {
  std::lock_guard<std::mutex> lk(state_mu_);
  closed_ = true;
  for (auto& s : slots_) {
    if (!s->backend) continue;
    s->closed_epoch = s->backend->epoch();
    s->cached_allocated = s->backend->AllocatedBytes();
    s->backend->Close();
  }
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
