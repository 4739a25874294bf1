// Module entry: exports the functions typed as NativeAddon in src/native/binding.ts. State lives in AddonData (napi instance data), one per env.
#include <napi.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "binding/addon-data.h"
#include "binding/async-worker.h"
#include "binding/engine-wrap.h"
#include "binding/event-queue.h"
#include "binding/handoff-wrap.h"
#include "binding/image-wrap.h"
#include "binding/js-args.h"
#include "binding/nbd-server-wrap.h"
#include "binding/replica-endpoint-args.h"
#include "binding/replica-server-wrap.h"
#include "binding/replica-wrap.h"
#include "binding/js-values.h"
#include "binding/sanlock-binding.h"
#include "remote/remote-replica.h"
#include "store/replica-registry.h"
#include "store/replica.h"

#ifndef MOORING_VERSION
#define MOORING_VERSION "0.0.0-unknown"  // binding.gyp defines it from package.json
#endif

namespace mooring {
namespace {

// Replicas one engine may be opened over (the engine's own limit is the same).
constexpr uint32_t kMaxReplicasPerEngine = 16;
// Largest quorumHoldMs (src/util/limits.ts QUORUM_HOLD_MS_MAX).
constexpr double kMaxQuorumHoldMs = 600000;

Napi::Value CreateReplica(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    const std::string dir = ToStr(Arg(info, 0), "dir");
    const uint64_t size = ToUint(Arg(info, 1), "sizeBytes");
    // Optional third argument: { backingImage?: { dir, format, virtualSizeBytes } }. The
    // store validates the values (INVALID_ARGUMENT); here only the types are checked.
    auto backing = std::make_shared<std::optional<BackingImageRef>>();
    Napi::Value opts = Arg(info, 2);
    if (!opts.IsUndefined()) {
      Napi::Value bi = ToObject(opts, "options").Get("backingImage");
      if (!bi.IsUndefined() && !bi.IsNull()) {
        Napi::Object o = ToObject(bi, "options.backingImage");
        BackingImageRef ref;
        ref.dir = ToStr(o.Get("dir"), "options.backingImage.dir", 1, ReplicaMetadata::kMaxBackingImageDirLength);
        ref.format = ToStr(o.Get("format"), "options.backingImage.format", 1, 16);
        ref.virtual_size_bytes = ToUint(o.Get("virtualSizeBytes"), "options.backingImage.virtualSizeBytes");
        *backing = std::move(ref);
      }
    }
    return new TaskWorker(env, [dir, size, backing]() {
      return Replica::Create(dir, size, backing->has_value() ? &backing->value() : nullptr);
    });
  });
}

Napi::Value OpenEngine(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    AddonData* data = AddonData::Get(env);
    Napi::Object o = ToObject(Arg(info, 0), "options");
    Napi::Value reps = o.Get("replicas");
    if (!reps.IsArray()) throw ArgError("options.replicas", "an array of replica endpoints");
    Napi::Array arr = reps.As<Napi::Array>();
    if (arr.Length() == 0 || arr.Length() > kMaxReplicasPerEngine)
      throw ArgError("options.replicas", "1.." + std::to_string(kMaxReplicasPerEngine) + " replica endpoints");
    std::vector<ReplicaEndpoint> endpoints;
    for (uint32_t i = 0; i < arr.Length(); ++i)
      endpoints.push_back(ParseReplicaEndpoint(arr.Get(i), "options.replicas[" + std::to_string(i) + "]"));
    Napi::Value cb = o.Get("onEvents");
    if (!cb.IsUndefined() && !cb.IsFunction()) throw ArgError("options.onEvents", "a function");
    const bool standby = ToBool(o.Get("standby"), "options.standby", false);
    const bool salvage = ToBool(o.Get("salvage"), "options.salvage", false);
    if (standby && salvage) throw ArgError("options.salvage", "false for a standby engine");
    const uint64_t epoch = o.Get("epoch").IsUndefined() ? 0 : ToUint(o.Get("epoch"), "options.epoch");
    const uint32_t hold_ms = o.Get("quorumHoldMs").IsUndefined()
                                 ? Engine::Options{}.quorum_hold_ms
                                 : static_cast<uint32_t>(ToUint(o.Get("quorumHoldMs"), "options.quorumHoldMs", kMaxQuorumHoldMs));
    std::vector<std::string> members;
    Napi::Value mv = o.Get("members");
    if (!mv.IsUndefined()) {
      if (!mv.IsArray() || mv.As<Napi::Array>().Length() != arr.Length())
        throw ArgError("options.members", "an array with one member name per replica");
      Napi::Array ma = mv.As<Napi::Array>();
      for (uint32_t i = 0; i < ma.Length(); ++i)
        members.push_back(ToStr(ma.Get(i), "options.members[" + std::to_string(i) + "]", 1, ReplicaSet::kMaxNameBytes));
    }

    std::shared_ptr<EventQueue> events;
    if (cb.IsFunction()) events = EventQueue::Create(env, cb.As<Napi::Function>());
    auto opened = std::make_shared<std::shared_ptr<Engine>>();
    return new TaskWorker(
        env,
        [endpoints, events, opened, standby, salvage, epoch, hold_ms, members]() -> Status {
          Engine::Options eo;
          eo.standby = standby;
          eo.salvage = salvage;
          eo.epoch = epoch;
          eo.quorum_hold_ms = hold_ms;
          eo.members = members;
          for (const ReplicaEndpoint& ep : endpoints) {
            std::shared_ptr<ReplicaBackend> r;
            Status st = OpenReplicaEndpoint(ep, &r);
            // A remote replica that cannot be reached now is opened as ERR (the control
            // plane rebuilds it when its host is back); a local one that fails is an error.
            if (!st.ok() && ep.remote()) r = MakeOfflineReplica(ep, st);
            if (!r) {
              for (auto& done : eo.replicas) done->Close();
              return st;
            }
            eo.replicas.push_back(std::move(r));
          }
          if (events) eo.on_event = [events](const EngineEvent& e) { events->Push(e); };
          std::unique_ptr<Engine> engine;
          Status st = Engine::Start(std::move(eo), &engine);
          if (st.ok()) *opened = std::move(engine);
          return st;
        },
        [data, opened, events](Napi::Env env) -> Napi::Value {
          // Registered before the wrapper exists, so even a failure below is cleaned up at exit.
          data->engines[opened->get()] = AddonData::OpenEngine{*opened, events};
          Napi::Object obj = data->engine_class.New(EngineInit{*opened, events});
          if (events) events->Resume();
          return obj;
        },
        [events](Napi::Env, const Status& st) {
          if (!st.ok() && events) events->Close();
        });
  });
}

// openReplica(dir | endpoint): a local replica directory (its lock held until close), or a
// remote endpoint (a backing image file pulled from another data engine's replica server).
Napi::Value OpenReplica(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    AddonData* data = AddonData::Get(env);
    ReplicaEndpoint ep;
    if (Arg(info, 0).IsString()) {
      ep.dir = ToStr(Arg(info, 0), "dir");
    } else {
      ep = ParseReplicaEndpoint(Arg(info, 0), "endpoint", true);
    }
    auto opened = std::make_shared<std::shared_ptr<ReplicaBackend>>();
    return new TaskWorker(
        env,
        [ep, opened]() -> Status {
          if (ep.remote()) return RemoteReplica::Connect(ep, opened.get());
          std::unique_ptr<Replica> r;
          Status st = Replica::Open(ep.dir, &r);
          if (st.ok()) *opened = std::move(r);
          return st;
        },
        [data, opened](Napi::Env env) -> Napi::Value {
          // Registered before the wrapper exists, so even a failure below is cleaned up at exit.
          data->replicas[opened->get()] = *opened;
          return data->replica_class.New(ReplicaInit{*opened});
        });
  });
}

// inspectReplica(dir): metadata read without the replica's lock, plus how many handles
// this process has open on it (engines, replica server).
Napi::Value InspectReplica(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    const std::string dir = ToStr(Arg(info, 0), "dir");
    auto out = std::make_shared<ReplicaInfo>();
    auto users = std::make_shared<size_t>(0);
    return new TaskWorker(
        env,
        [dir, out, users]() -> Status {
          Status st = Replica::Inspect(dir, out.get());
          if (st.ok()) *users = ReplicaRegistry::Global().Users(dir);
          return st;
        },
        [out, users](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("sizeBytes", JsNum(env, out->size_bytes));
          o.Set("epoch", JsNum(env, out->epoch));
          o.Set("clean", out->clean);
          o.Set("rebuilding", out->rebuilding);
          o.Set("allocatedBytes", JsNum(env, out->allocated_bytes));
          if (out->backing_image) {
            Napi::Object bi = Napi::Object::New(env);
            bi.Set("dir", out->backing_image->dir);
            bi.Set("format", out->backing_image->format);
            bi.Set("virtualSizeBytes", JsNum(env, out->backing_image->virtual_size_bytes));
            o.Set("backingImage", bi);
          } else {
            o.Set("backingImage", env.Null());
          }
          o.Set("users", JsNum(env, *users));
          return o;
        });
  });
}

// process.exit() ends the main thread without running env cleanup hooks, so open engines
// would be left unflushed and not marked clean. This is the one process-wide list: the
// live AddonData of every env, closed from an atexit handler. Workers' envs run their
// cleanup hooks (and leave the list) before process.exit() calls exit().
std::mutex g_exit_mu;
std::set<AddonData*>* g_live = nullptr;  // leaked on purpose: used during exit

void CloseAllAtExit() {
  std::lock_guard<std::mutex> lk(g_exit_mu);
  if (g_live == nullptr) return;
  for (AddonData* d : *g_live) d->CloseAll();
}

void CleanupHook(void* arg) {
  auto* data = static_cast<AddonData*>(arg);
  data->CloseAll();
  std::lock_guard<std::mutex> lk(g_exit_mu);
  g_live->erase(data);
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  data->engine_class.ctor = Napi::Persistent(EngineWrap::Define(env));
  data->nbd_server_class.ctor = Napi::Persistent(NbdServerWrap::Define(env));
  data->replica_class.ctor = Napi::Persistent(ReplicaWrap::Define(env));
  data->replica_server_class.ctor = Napi::Persistent(ReplicaServerWrap::Define(env));
  data->image_class.ctor = Napi::Persistent(ImageWrap::Define(env));
  data->nbd_record_class.ctor = Napi::Persistent(NbdHandOffRecordWrap::Define(env));
  data->handoff_channel_class.ctor = Napi::Persistent(HandOffChannelWrap::Define(env));
  data->handoff_listener_class.ctor = Napi::Persistent(HandOffListenerWrap::Define(env));
  env.SetInstanceData<AddonData>(data);  // deleted by Node after the cleanup hook ran
  napi_add_env_cleanup_hook(env, CleanupHook, data);
  {
    std::lock_guard<std::mutex> lk(g_exit_mu);
    if (g_live == nullptr) {
      g_live = new std::set<AddonData*>();
      std::atexit(CloseAllAtExit);
    }
    g_live->insert(data);
  }

  exports.Set("version", Napi::String::New(env, MOORING_VERSION));
  exports.Set("createReplica", Napi::Function::New(env, CreateReplica, "createReplica"));
  exports.Set("openEngine", Napi::Function::New(env, OpenEngine, "openEngine"));
  exports.Set("openReplica", Napi::Function::New(env, OpenReplica, "openReplica"));
  exports.Set("startReplicaServer", Napi::Function::New(env, ReplicaServerWrap::StartServer, "startReplicaServer"));
  exports.Set("inspectReplica", Napi::Function::New(env, InspectReplica, "inspectReplica"));
  // sanlock (disk locks, host liveness): loaded with dlopen on first use, see sanlock-binding.h.
  exports.Set("sanlock", CreateSanlockBinding(env));
  // --- images (raw, qcow2 and their chains), see image-wrap.h ---
  exports.Set("openImage", Napi::Function::New(env, ImageWrap::OpenImageJs, "openImage"));
  // --- NBD hand-off between processes, see handoff-wrap.h and nbd-server-wrap.h ---
  exports.Set("handOff", CreateHandOffBinding(env));
  exports.Set("adoptNbdServer", Napi::Function::New(env, NbdServerWrap::AdoptJs, "adoptNbdServer"));
  return exports;
}

}  // namespace
}  // namespace mooring

static Napi::Object InitMooring(Napi::Env env, Napi::Object exports) { return mooring::Init(env, exports); }

NODE_API_MODULE(mooring, InitMooring)
