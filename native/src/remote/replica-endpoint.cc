// OpenReplicaEndpoint / MakeOfflineReplica (block/replica-endpoint.h).
#include "block/replica-endpoint.h"

#include "remote/remote-replica.h"
#include "store/replica-registry.h"

namespace mooring {

namespace {

// A replica that could not be reached when its engine started. It answers like a replica
// whose connection is gone, so the engine opens it as ERR (epoch 0 is below any claimed
// epoch) and never reads it; the control plane rebuilds it once its host is back.
class OfflineReplica final : public ReplicaBackend {
 public:
  OfflineReplica(std::string id, Status why) : id_(std::move(id)), why_(std::move(why)) {}

  bool remote() const override { return true; }
  std::string id() const override { return id_; }
  uint64_t size() const override { return 0; }
  uint64_t epoch() const override { return 0; }
  bool clean() const override { return false; }
  bool rebuilding() const override { return false; }
  Status ClaimEpoch(uint64_t, ReplicaSet*, bool*) override { return Down(); }
  Status SetReplicaSet(const ReplicaSet&, bool) override { return Down(); }
  Status LastRw(ReplicaSetId*) override { return Down(); }
  Status PeekReplicaSet(ReplicaSet*) override { return Down(); }
  Status MarkClean(uint64_t) override { return Down(); }
  Status Grow(uint64_t) override { return Down(); }
  int Read(uint64_t, uint32_t, uint8_t*) override { return -ENOTCONN; }
  int Write(uint64_t, uint64_t, uint32_t, const uint8_t*, bool) override { return -ENOTCONN; }
  int Trim(uint64_t, uint64_t, uint64_t) override { return -ENOTCONN; }
  int WriteZeroes(uint64_t, uint64_t, uint64_t, bool, bool, bool) override { return -ENOTCONN; }
  int Flush() override { return -ENOTCONN; }
  int BlockStatus(uint64_t, uint64_t, uint32_t, std::vector<Extent>*) override { return -ENOTCONN; }
  Status ListLayers(std::vector<LayerInfo>*) override { return Down(); }
  Status LayerExtents(const std::string&, std::vector<Range>*) override { return Down(); }
  int ReadLayer(const std::string&, uint64_t, uint32_t, uint8_t*) override { return -ENOTCONN; }
  Status Snapshot(const std::string&, int64_t, const Labels&, bool) override { return Down(); }
  Status DeleteSnapshot(const std::string&) override { return Down(); }
  Status Revert(const std::string&, int64_t) override { return Down(); }
  Status AdoptChain(const std::vector<LayerInfo>&, uint64_t) override { return Down(); }
  Status LayerDigest(const std::string&, uint64_t, uint64_t, DigestDetail, std::vector<UnitDigest>*) override { return Down(); }
  int WriteLayer(uint64_t, const std::string&, uint64_t, uint32_t, const uint8_t*) override { return -ENOTCONN; }
  int UnmapLayer(uint64_t, const std::string&, uint64_t, uint64_t) override { return -ENOTCONN; }
  Status FinishRebuild() override { return Down(); }
  uint64_t AllocatedBytes() override { return 0; }
  Status Close() override { return Status::Ok(); }

 private:
  Status Down() const {
    return Status::Error(Code::kUnavailable, "replica " + id_ + " is offline (" + why_.message + ")", ENOTCONN);
  }
  const std::string id_;
  const Status why_;
};

}  // namespace

Status OpenReplicaEndpoint(const ReplicaEndpoint& ep, std::shared_ptr<ReplicaBackend>* out) {
  if (!ep.remote()) return ReplicaRegistry::Global().Acquire(ep.dir, out);
  return RemoteReplica::Connect(ep, out);
}

std::shared_ptr<ReplicaBackend> MakeOfflineReplica(const ReplicaEndpoint& ep, const Status& why) {
  return std::make_shared<OfflineReplica>(ep.Id(), why);
}

}  // namespace mooring
