// NbdServerWrap: the JS NativeNbdServer (src/native/binding.ts).
//
// While open it keeps the engine it serves alive twice over: the native Engine (the
// server holds a raw BlockDevice pointer into it) and the engine's JS object, whose
// wrapper counts open servers to refuse close() with BUSY. An open server also keeps
// its own JS object alive; close() releases all three.
//
// Hand-off (docs/nbd-frontend.md): freeze() and detach() as NbdServer's. A detached server
// no longer counts against its engine (so that engine can be closed before another process
// opens the same replicas); unfreeze(engine?) counts it again, against `engine` if given
// (a rollback onto an engine reopened meanwhile). adoptNbdServer() makes a server from a
// received record; it starts frozen, and unfreeze() starts it.
#pragma once

#include <napi.h>

#include <memory>

#include "binding/addon-data.h"
#include "engine/engine.h"
#include "nbd/nbd-server.h"

namespace mooring {

class EngineWrap;

struct NbdServerInit {
  std::shared_ptr<NbdServer> server;
  std::shared_ptr<Engine> engine;
  EngineWrap* owner;
};

class NbdServerWrap : public Napi::ObjectWrap<NbdServerWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6702ULL, 0x51c7e09b3a4f26d1ULL};
  static constexpr const char* kClassName = "NativeNbdServer";

  static Napi::Function Define(Napi::Env env);
  // adoptNbdServer(record, engine, options?)
  static Napi::Value AdoptJs(const Napi::CallbackInfo& info);

  explicit NbdServerWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Stats(const Napi::CallbackInfo& info);
  Napi::Value IoStats(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  Napi::Value ConnectionIds(const Napi::CallbackInfo& info);
  Napi::Value Freeze(const Napi::CallbackInfo& info);
  Napi::Value Detach(const Napi::CallbackInfo& info);
  Napi::Value Unfreeze(const Napi::CallbackInfo& info);

  AddonData* addon_ = nullptr;
  std::shared_ptr<NbdServer> server_;
  std::shared_ptr<Engine> engine_;
  EngineWrap* owner_ = nullptr;
  Napi::ObjectReference owner_ref_;
  bool counted_ = true;  // counted in owner_'s open servers (not while detached)
  bool closed_ = false;
  NbdServerStats final_stats_;
};

}  // namespace mooring
