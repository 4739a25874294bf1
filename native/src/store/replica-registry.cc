#include "store/replica-registry.h"

#include <climits>
#include <cstdlib>

namespace mooring {

// A user's view of a shared replica: everything forwards, except Close(), which gives the
// user's share back (the replica closes with its last user).
class ReplicaRegistry::Handle final : public ReplicaBackend {
 public:
  Handle(ReplicaRegistry* reg, std::string key, std::shared_ptr<Replica> r)
      : reg_(reg), key_(std::move(key)), r_(std::move(r)), token_(NextToken()) {}
  ~Handle() override { Close(); }

  std::string id() const override { return r_->id(); }
  uint64_t size() const override { return r_->size(); }
  uint64_t epoch() const override { return r_->epoch(); }
  bool clean() const override { return r_->clean(); }
  bool rebuilding() const override { return r_->rebuilding(); }
  Status ClaimEpoch(uint64_t e, ReplicaSet* stored, bool* was_clean) override { return Live() ? (WriterScope(token_), r_->ClaimEpoch(e, stored, was_clean)) : Closed(); }
  Status SetReplicaSet(const ReplicaSet& set, bool self_rw) override {
    return Live() ? r_->SetReplicaSet(set, self_rw) : Closed();
  }
  Status LastRw(ReplicaSetId* out) override { return Live() ? r_->LastRw(out) : Closed(); }
  Status PeekReplicaSet(ReplicaSet* out) override { return Live() ? r_->PeekReplicaSet(out) : Closed(); }
  Status MarkClean(uint64_t e) override { return Live() ? r_->MarkClean(e) : Closed(); }
  Status Grow(uint64_t size_bytes) override { return Live() ? r_->Grow(size_bytes) : Closed(); }
  int Read(uint64_t off, uint32_t len, uint8_t* buf) override { return Live() ? r_->Read(off, len, buf) : -EBADF; }
  int Write(uint64_t e, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) override {
    return Live() ? (WriterScope(token_), r_->Write(e, off, len, buf, fua)) : -EBADF;
  }
  int TryRead(uint64_t off, uint32_t len, uint8_t* buf) override { return Live() ? r_->TryRead(off, len, buf) : -EBADF; }
  int TryWrite(uint64_t e, uint64_t off, uint32_t len, const uint8_t* buf) override {
    return Live() ? (WriterScope(token_), r_->TryWrite(e, off, len, buf)) : -EBADF;
  }
  int Trim(uint64_t e, uint64_t off, uint64_t len) override { return Live() ? (WriterScope(token_), r_->Trim(e, off, len)) : -EBADF; }
  int WriteZeroes(uint64_t e, uint64_t off, uint64_t len, bool may_trim, bool fast_only, bool fua) override {
    return Live() ? (WriterScope(token_), r_->WriteZeroes(e, off, len, may_trim, fast_only, fua)) : -EBADF;
  }
  int Flush() override { return Live() ? r_->Flush() : -EBADF; }
  int BlockStatus(uint64_t off, uint64_t len, uint32_t max, std::vector<Extent>* out) override {
    return Live() ? r_->BlockStatus(off, len, max, out) : -EBADF;
  }
  Status ListLayers(std::vector<LayerInfo>* out) override { return Live() ? r_->ListLayers(out) : Closed(); }
  Status SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) override {
    return Live() ? r_->SnapshotLayers(name, out) : Closed();
  }
  Status LayerExtents(const std::string& id, std::vector<Range>* out) override {
    return Live() ? r_->LayerExtents(id, out) : Closed();
  }
  int ReadLayer(const std::string& id, uint64_t off, uint32_t len, uint8_t* buf) override {
    return Live() ? r_->ReadLayer(id, off, len, buf) : -EBADF;
  }
  Status Snapshot(const std::string& name, int64_t ms, const Labels& labels, bool user) override {
    return Live() ? r_->Snapshot(name, ms, labels, user) : Closed();
  }
  Status DeleteSnapshot(const std::string& name) override { return Live() ? r_->DeleteSnapshot(name) : Closed(); }
  Status Revert(const std::string& name, int64_t ms) override { return Live() ? r_->Revert(name, ms) : Closed(); }
  Status AdoptChain(const std::vector<LayerInfo>& layers, uint64_t e) override {
    return Live() ? (WriterScope(token_), r_->AdoptChain(layers, e)) : Closed();
  }
  Status LayerDigest(const std::string& id, uint64_t off, uint64_t len, DigestDetail detail,
                     std::vector<UnitDigest>* out) override {
    return Live() ? r_->LayerDigest(id, off, len, detail, out) : Closed();
  }
  int WriteLayer(uint64_t e, const std::string& id, uint64_t off, uint32_t len, const uint8_t* buf) override {
    return Live() ? (WriterScope(token_), r_->WriteLayer(e, id, off, len, buf)) : -EBADF;
  }
  int UnmapLayer(uint64_t e, const std::string& id, uint64_t off, uint64_t len) override {
    return Live() ? (WriterScope(token_), r_->UnmapLayer(e, id, off, len)) : -EBADF;
  }
  Status FinishRebuild() override { return Live() ? r_->FinishRebuild() : Closed(); }
  uint64_t AllocatedBytes() override { return Live() ? r_->AllocatedBytes() : 0; }
  Status Close() override {
    if (released_.exchange(true)) return Status::Ok();
    reg_->Release(key_);
    return Status::Ok();
  }

 private:
  bool Live() const { return !released_.load(); }
  Status Closed() const { return Status::Error(Code::kClosed, "replica " + key_ + " handle is closed", EBADF); }

  // Process-unique, so each user of a shared replica is a writer of its own (WriterScope).
  static uint64_t NextToken() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }

  ReplicaRegistry* reg_;
  const std::string key_;
  const std::shared_ptr<Replica> r_;
  const uint64_t token_;
  std::atomic<bool> released_{false};
};

ReplicaRegistry& ReplicaRegistry::Global() {
  static ReplicaRegistry* g = new ReplicaRegistry();  // leaked: handles may outlive statics at exit
  return *g;
}

Status ReplicaRegistry::Acquire(const std::string& dir, std::shared_ptr<ReplicaBackend>* out) {
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) == nullptr) {
    int err = errno;
    if (err == ENOENT) return Status::Error(Code::kNotFound, "no replica directory " + dir, err);
    return Status::FromErrno(err, "resolving " + dir);
  }
  const std::string key(buf);
  std::unique_lock<std::mutex> lk(mu_);
  // A close in progress still holds the directory lock: opening now would fail BUSY.
  closed_cv_.wait(lk, [&] {
    auto it = open_.find(key);
    return it == open_.end() || !it->second.closing;
  });
  Entry& e = open_[key];
  if (!e.replica) {
    std::unique_ptr<Replica> r;
    Status st = Replica::Open(key, &r);
    if (!st.ok()) {
      open_.erase(key);
      return st;
    }
    e.replica = std::move(r);
  }
  ++e.users;
  *out = std::make_shared<Handle>(this, key, e.replica);
  return Status::Ok();
}

size_t ReplicaRegistry::Users(const std::string& dir) {
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) == nullptr) return 0;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = open_.find(buf);
  return it == open_.end() ? 0 : it->second.users;
}

void ReplicaRegistry::Release(const std::string& key) {
  std::shared_ptr<Replica> last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = open_.find(key);
    if (it == open_.end()) return;
    if (--it->second.users > 0) return;
    it->second.closing = true;
    last = it->second.replica;
  }
  last->Close();  // outside mu_: closing flushes
  {
    std::lock_guard<std::mutex> lk(mu_);
    open_.erase(key);
  }
  closed_cv_.notify_all();
}

}  // namespace mooring
