// ReplicaBackend: what the Engine talks to for each replica. A local Replica (store/)
// implements it directly; a remote replica client (replica protocol, a later issue) will
// implement it over TCP. All data-path methods are thread-safe and return 0 or -errno.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "block/block-device.h"
#include "util/status.h"

namespace mooring {

struct Range {
  uint64_t off;
  uint64_t len;
};

using Labels = std::map<std::string, std::string>;

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

class ReplicaBackend {
 public:
  virtual ~ReplicaBackend() = default;

  virtual std::string id() const = 0;   // the replica's directory, or host:port/path when remote
  virtual uint64_t size() const = 0;
  virtual uint64_t epoch() const = 0;   // highest epoch claimed on this replica (durable)
  virtual bool clean() const = 0;       // last engine closed it cleanly (MarkClean after flush)

  // Durably records `epoch` (must be > epoch(), else Code::kStaleEpoch) and marks the
  // replica not clean. After this returns, writes carrying an older epoch are refused
  // with -kErrStaleEpoch and no write carrying an older epoch is still in progress.
  virtual Status ClaimEpoch(uint64_t epoch) = 0;
  // Durably marks the replica clean. Caller has flushed and will write no more.
  virtual Status MarkClean(uint64_t epoch) = 0;

  // Data path. `epoch` is the writer's epoch: refused with -kErrStaleEpoch if older
  // than epoch().
  virtual int Read(uint64_t off, uint32_t len, uint8_t* buf) = 0;
  virtual int Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) = 0;
  virtual int Trim(uint64_t epoch, uint64_t off, uint64_t len) = 0;
  virtual int WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim, bool fast_only, bool fua) = 0;
  virtual int Flush() = 0;
  // Allocation across the whole chain (see BlockDevice::BlockStatus).
  virtual int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) = 0;

  // Per-layer access (reconcile, rebuild, export).
  virtual Status ListLayers(std::vector<LayerInfo>* out) = 0;       // every layer, bottom first
  virtual Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) = 0;
  virtual int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) = 0;

  // Snapshots. The caller (Engine) has quiesced I/O to this replica.
  virtual Status Snapshot(const std::string& name, int64_t created_ms, const Labels& labels,
                          bool user_created) = 0;
  virtual Status DeleteSnapshot(const std::string& name) = 0;
  virtual Status Revert(const std::string& name, int64_t created_ms) = 0;

  virtual uint64_t AllocatedBytes() = 0;  // sum over all layer files
  virtual Status Close() = 0;             // idempotent; later calls return -EBADF / kClosed
};

}  // namespace mooring
