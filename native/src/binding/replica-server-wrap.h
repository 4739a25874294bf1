// ReplicaServerWrap: the JS NativeReplicaServer (src/native/binding.ts), made by
// startReplicaServer(). An open server keeps its own JS object alive; close() releases it.
#pragma once

#include <napi.h>

#include <memory>

#include "binding/addon-data.h"
#include "remote/replica-server.h"

namespace mooring {

struct ReplicaServerInit {
  std::shared_ptr<ReplicaServer> server;
};

class ReplicaServerWrap : public Napi::ObjectWrap<ReplicaServerWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6704ULL, 0x2b9d41e7c05a83f6ULL};
  static constexpr const char* kClassName = "NativeReplicaServer";

  static Napi::Function Define(Napi::Env env);
  // startReplicaServer(options): validates on the JS thread, starts on a worker.
  static Napi::Value StartServer(const Napi::CallbackInfo& info);

  explicit ReplicaServerWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Stats(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  Napi::Value GoAway(const Napi::CallbackInfo& info);

  AddonData* addon_ = nullptr;
  std::shared_ptr<ReplicaServer> server_;
  bool closed_ = false;
  ReplicaServerStats final_stats_;
};

}  // namespace mooring
