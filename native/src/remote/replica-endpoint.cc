// OpenReplicaEndpoint / MakeOfflineReplica (block/replica-endpoint.h).
#include "block/replica-endpoint.h"

#include "store/replica-registry.h"

namespace mooring {

Status OpenReplicaEndpoint(const ReplicaEndpoint& ep, std::shared_ptr<ReplicaBackend>* out) {
  if (!ep.remote()) return ReplicaRegistry::Global().Acquire(ep.dir, out);
  return Status::Error(Code::kUnsupported, "remote replica " + ep.Id() + ": the replica client is not implemented yet");
}

std::shared_ptr<ReplicaBackend> MakeOfflineReplica(const ReplicaEndpoint&, const Status&) { return nullptr; }

}  // namespace mooring
