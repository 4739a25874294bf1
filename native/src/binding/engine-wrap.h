// EngineWrap: the JS NativeEngine (src/native/binding.ts) around a shared Engine.
//
// Lifecycle rules (JS thread bookkeeping, no locks needed):
// - An open engine keeps its JS object alive (a strong self-reference) and is listed in
//   AddonData for the exit cleanup hook; close() releases both.
// - close() refuses with BUSY while an NBD server exported from this engine is open or
//   opening: servers must be closed first (they flush through the engine), and refusing
//   is more predictable than closing someone else's server. revert() refuses with BUSY
//   while exported for the same reason (reverting under a client corrupts its view).
// - After close() every method except epoch()/standby()/replicas() rejects with CLOSED;
//   those return the last known state.
// - A standby engine (openEngine({standby: true}), or after deactivate()) fails data-path
//   calls with INVALID_STATE (errno EPERM) and control calls with INVALID_STATE.
#pragma once

#include <napi.h>

#include <memory>

#include "binding/addon-data.h"
#include "binding/async-worker.h"
#include "binding/event-queue.h"
#include "engine/engine.h"

namespace mooring {

struct EngineInit {
  std::shared_ptr<Engine> engine;
  std::shared_ptr<EventQueue> events;
};

class EngineWrap : public Napi::ObjectWrap<EngineWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6701ULL, 0x9e3c41f0a2b7d855ULL};
  static constexpr const char* kClassName = "NativeEngine";
  // Largest single read or write; matches the NBD server's request cap.
  static constexpr uint32_t kMaxIoBytes = 32u << 20;
  // options.bufferBytesMax of an export (exportNbd, adoptNbdServer): one largest request
  // (kMaxIoBytes) up to 16 GiB (NBD_LIMITS.bufferBytesMaxMin/Max).
  static uint64_t BufferBytesMaxArg(const Napi::Value& v);
  // trim/writeZeroes over larger ranges are split into calls of at most this size.
  static constexpr uint32_t kMaxRangeChunkBytes = 1u << 30;
  // blockStatus returns at most this many extents (their lengths then sum to less than
  // the requested length).
  static constexpr uint32_t kMaxExtents = 1u << 16;
  static constexpr size_t kMaxLabels = 64;
  static constexpr size_t kMaxNameBytes = 255;
  // activate(): replica ids in a hand-over (an engine has at most 16 replicas; a few more
  // are tolerated so a caller's list with stale entries is not refused for its length).
  static constexpr uint32_t kMaxHandOverIds = 64;
  // activate(): longest replica id (a directory path, or host:port/name).
  static constexpr size_t kMaxReplicaIdBytes = 4096;

  static Napi::Function Define(Napi::Env env);

  explicit EngineWrap(const Napi::CallbackInfo& info);

  // Called by NbdServerWrap (JS thread): servers counted against close().
  void ServerOpened() { ++servers_; }
  void ServerClosed() { --servers_; }
  bool closing() const { return closing_; }
  const std::shared_ptr<Engine>& engine() const { return engine_; }

 private:
  Napi::Value Epoch(const Napi::CallbackInfo& info);
  Napi::Value Standby(const Napi::CallbackInfo& info);
  Napi::Value Deactivate(const Napi::CallbackInfo& info);
  Napi::Value Activate(const Napi::CallbackInfo& info);
  Napi::Value Replicas(const Napi::CallbackInfo& info);
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value Write(const Napi::CallbackInfo& info);
  Napi::Value Flush(const Napi::CallbackInfo& info);
  Napi::Value Trim(const Napi::CallbackInfo& info);
  Napi::Value WriteZeroes(const Napi::CallbackInfo& info);
  Napi::Value BlockStatus(const Napi::CallbackInfo& info);
  Napi::Value Snapshot(const Napi::CallbackInfo& info);
  Napi::Value ListSnapshots(const Napi::CallbackInfo& info);
  Napi::Value DeleteSnapshot(const Napi::CallbackInfo& info);
  Napi::Value Revert(const Napi::CallbackInfo& info);
  Napi::Value AddReplica(const Napi::CallbackInfo& info);
  Napi::Value RemoveReplica(const Napi::CallbackInfo& info);
  Napi::Value ExportNbd(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  Napi::Value SizeBytes(const Napi::CallbackInfo& info);
  Napi::Value Resize(const Napi::CallbackInfo& info);
  // Snapshot content (engine/snapshot-reader.h): into a new raw file, or into another
  // engine through its write path. Each runs on one pool thread for the whole copy;
  // progress goes out as snapshot-copy-progress events of this engine.
  Napi::Value ExportSnapshot(const Napi::CallbackInfo& info);
  Napi::Value CopySnapshotTo(const Napi::CallbackInfo& info);

  void CheckOpen() const;
  void CheckRange(uint64_t off, uint64_t len) const;

  AddonData* addon_ = nullptr;
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<EventQueue> events_;
  // Replicas the engine may write to; only grows (addReplica), since it only decides
  // whether write() copies the caller's bytes before the fan-out.
  size_t replica_count_ = 0;
  uint32_t servers_ = 0;  // NBD servers open or opening on this engine
  bool closing_ = false;  // close() called
  bool closed_ = false;   // close() completed
};

}  // namespace mooring
