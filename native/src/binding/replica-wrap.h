// ReplicaWrap: the JS NativeReplica (src/native/binding.ts) around one replica opened
// directly, without an engine: a local Replica (inspection, verification), or a remote one
// over the replica protocol (a backing image file pulled from another data engine).
//
// Lifecycle rules (JS thread bookkeeping, no locks needed):
// - An open replica keeps its JS object alive (a strong self-reference) and is listed in
//   AddonData for the exit cleanup hook; close() releases both. The replica's directory
//   lock is held until then, so an engine (or a second openReplica) gets BUSY meanwhile.
// - After close() every method except epoch()/clean() rejects with CLOSED; those two
//   return the last known state.
// - Writes carry the writer's epoch, which the replica checks (invariant 2): an older one
//   is refused with STALE_EPOCH and changes nothing.
#pragma once

#include <napi.h>

#include <atomic>
#include <memory>

#include "binding/addon-data.h"
#include "binding/async-worker.h"
#include "block/replica-backend.h"

namespace mooring {

struct ReplicaInit {
  std::shared_ptr<ReplicaBackend> replica;
};

class ReplicaWrap : public Napi::ObjectWrap<ReplicaWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6703ULL, 0x2f8b6c19d4e7a053ULL};
  static constexpr const char* kClassName = "NativeReplica";
  // Largest single read or write; the same cap as the engine's.
  static constexpr uint32_t kMaxIoBytes = 32u << 20;
  // blockStatus returns at most this many extents (their lengths then sum to less than
  // the requested length).
  static constexpr uint32_t kMaxExtents = 1u << 16;
  // layerExtents returns at most this many ranges; a layer with more fails OUT_OF_RANGE
  // rather than building an unbounded array on the JS thread.
  static constexpr size_t kMaxLayerRanges = 1u << 20;
  // Layer ids are short ("L000003"); anything longer cannot name a layer.
  static constexpr size_t kMaxLayerIdBytes = 64;

  static Napi::Function Define(Napi::Env env);

  explicit ReplicaWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Epoch(const Napi::CallbackInfo& info);
  Napi::Value SizeBytes(const Napi::CallbackInfo& info);
  Napi::Value Grow(const Napi::CallbackInfo& info);
  Napi::Value Clean(const Napi::CallbackInfo& info);
  Napi::Value ClaimEpoch(const Napi::CallbackInfo& info);
  Napi::Value SetReplicaSet(const Napi::CallbackInfo& info);
  Napi::Value LastRw(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  Napi::Value Flush(const Napi::CallbackInfo& info);
  Napi::Value BlockStatus(const Napi::CallbackInfo& info);
  Napi::Value ListLayers(const Napi::CallbackInfo& info);
  Napi::Value LayerExtents(const Napi::CallbackInfo& info);
  Napi::Value AllocatedBytes(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  void CheckOpen() const;
  void CheckRange(uint64_t off, uint64_t len) const;

  AddonData* addon_ = nullptr;
  std::shared_ptr<ReplicaBackend> replica_;
  // Set on the pool thread once Replica::Close returned: a data-path -EBADF seen after it
  // means "closed under the call" (CLOSED), not an I/O failure.
  std::shared_ptr<std::atomic<bool>> native_closed_;
  bool closing_ = false;  // close() called
  bool closed_ = false;   // close() completed
};

}  // namespace mooring
