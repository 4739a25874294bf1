// AddonData: per-instance state of the addon (one per Node environment: the main thread
// and each worker thread load their own), kept as napi instance data instead of globals.
#pragma once

#include <napi.h>

#include <map>
#include <memory>

#include "binding/async-worker.h"
#include "binding/event-queue.h"
#include "binding/wrap-init.h"
#include "engine/engine.h"
#include "handoff/handoff-channel.h"
#include "image/image-reader.h"
#include "nbd/nbd-server.h"
#include "remote/replica-server.h"
#include "store/replica.h"

namespace mooring {

struct EngineInit;
struct HandOffChannelInit;
struct HandOffListenerInit;
struct ImageInit;
struct NbdHandOffRecordInit;
struct NbdServerInit;
struct ReplicaInit;
struct ReplicaServerInit;

struct AddonData {
  // The wrapper classes. Their constructors refuse to run without an Init from native
  // code, so `new (engine.constructor)()` from JS cannot build a hollow handle.
  NativeClass<EngineInit> engine_class;
  NativeClass<NbdServerInit> nbd_server_class;
  NativeClass<ReplicaInit> replica_class;
  NativeClass<ReplicaServerInit> replica_server_class;
  NativeClass<ImageInit> image_class;  // images (native/src/image): openImage
  // NBD hand-off between processes (handoff-wrap.h).
  NativeClass<NbdHandOffRecordInit> nbd_record_class;
  NativeClass<HandOffChannelInit> handoff_channel_class;
  NativeClass<HandOffListenerInit> handoff_listener_class;

  // Everything still open, so the env cleanup hook can close it when the process or
  // worker exits without close(). JS thread only.
  struct OpenEngine {
    std::shared_ptr<Engine> engine;
    std::shared_ptr<EventQueue> events;  // may be null
  };
  std::map<const Engine*, OpenEngine> engines;
  std::map<const NbdServer*, std::shared_ptr<NbdServer>> nbd_servers;
  std::map<const ReplicaBackend*, std::shared_ptr<ReplicaBackend>> replicas;  // opened by openReplica
  std::map<const ReplicaServer*, std::shared_ptr<ReplicaServer>> replica_servers;
  std::map<const ImageReader*, std::shared_ptr<ImageReader>> images;  // opened by openImage
  std::map<const HandOffChannel*, std::shared_ptr<HandOffChannel>> handoff_channels;
  std::map<const HandOffListener*, std::shared_ptr<HandOffListener>> handoff_listeners;

  // Env teardown: servers first (they use engines), then engines (drain, flush, mark
  // clean), then replicas opened directly. Blocks, which is acceptable only here: nothing
  // else runs any more.
  void CloseAll() {
    // Hand-off links first: a peer waiting on one sees it close. A listener removes its
    // socket file.
    for (auto& kv : handoff_channels) kv.second->Close();
    handoff_channels.clear();
    for (auto& kv : handoff_listeners) kv.second->Close();
    handoff_listeners.clear();
    auto servers = std::move(nbd_servers);
    nbd_servers.clear();
    for (auto& kv : servers) kv.second->Close();
    // Replica servers give their replicas back to the registry before engines close theirs.
    auto rservers = std::move(replica_servers);
    replica_servers.clear();
    for (auto& kv : rservers) kv.second->Close();
    auto open = std::move(engines);
    engines.clear();
    for (auto& kv : open) {
      if (kv.second.events) kv.second.events->Detach();
      kv.second.engine->Shutdown();
    }
    // Replicas opened directly: flush and release their directory locks. Not marked
    // clean: nothing here knows whether their writer was done.
    auto direct = std::move(replicas);
    replicas.clear();
    for (auto& kv : direct) kv.second->Close();
    // Images (read-only): close their files.
    auto imgs = std::move(images);
    images.clear();
    for (auto& kv : imgs) kv.second->Close();
  }

  static AddonData* Get(Napi::Env env) { return env.GetInstanceData<AddonData>(); }
};

// For a wrapper constructor: the Init that native code handed over through `cls`. Throws
// INVALID_ARGUMENT with `refusal` when JS code called the constructor itself.
template <typename Init>
Init& TakePendingInit(Napi::Env env, NativeClass<Init> AddonData::*cls, const char* refusal) {
  AddonData* data = AddonData::Get(env);
  Init* init = data ? (data->*cls).Take() : nullptr;
  if (init == nullptr) throw MakeError(env, Code::kInvalidArgument, refusal);
  return *init;
}

}  // namespace mooring
