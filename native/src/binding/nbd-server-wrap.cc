#include "binding/nbd-server-wrap.h"

#include "binding/async-worker.h"
#include "binding/engine-wrap.h"
#include "binding/js-args.h"

namespace mooring {

Napi::Function NbdServerWrap::Define(Napi::Env env) {
  using W = NbdServerWrap;
  return DefineWithMethods<W>(env,
                     {
                         Method<W, &W::Stats>(env, "stats"),
                         Method<W, &W::Close>(env, "close"),
                     });
}

Napi::Object NbdServerWrap::NewInstance(Napi::Env env, AddonData* data, NbdServerInit init) {
  data->pending_nbd_server = &init;
  try {
    Napi::Object o = data->nbd_server_ctor.New({});
    data->pending_nbd_server = nullptr;
    return o;
  } catch (...) {
    data->pending_nbd_server = nullptr;
    throw;
  }
}

NbdServerWrap::NbdServerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NbdServerWrap>(info) {
  Napi::Env env = info.Env();
  AddonData* data = AddonData::Get(env);
  NbdServerInit* init = data ? data->pending_nbd_server : nullptr;
  if (init == nullptr)
    throw MakeError(env, Code::kInvalidArgument, "NativeNbdServer is created by exportNbd(), not with new");
  data->pending_nbd_server = nullptr;
  addon_ = data;
  server_ = std::move(init->server);
  engine_ = std::move(init->engine);
  owner_ = init->owner;
  owner_ref_ = Napi::Persistent(owner_->Value());
  Napi::Object self = info.This().As<Napi::Object>();
  self.TypeTag(&kTypeTag);
  self.DefineProperty(Napi::PropertyDescriptor::Value("port", Napi::Number::New(env, server_->port()), napi_enumerable));
  Ref();  // open handles are not collected; Close() drops this
}

Napi::Value NbdServerWrap::Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const NbdServerStats s = closed_ ? final_stats_ : server_->stats();
  Napi::Object o = Napi::Object::New(env);
  o.Set("connectionsTotal", JsNum(env, s.connections_total));
  o.Set("connectionsOpen", JsNum(env, s.connections_open));
  o.Set("requests", JsNum(env, s.requests));
  o.Set("bytesRead", JsNum(env, s.bytes_read));
  o.Set("bytesWritten", JsNum(env, s.bytes_written));
  o.Set("protocolErrors", JsNum(env, s.protocol_errors));
  return o;
}

Napi::Value NbdServerWrap::Close(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    // Idempotent: NbdServer::Close is, and a second call while the first runs waits for it.
    auto server = server_;
    auto* w = new TaskWorker(
        env, [server]() { return server->Close(); }, nullptr,
        [this](Napi::Env, const Status&) {
          if (closed_) return;
          closed_ = true;
          final_stats_ = server_->stats();
          addon_->nbd_servers.erase(server_.get());
          owner_->ServerClosed();
          owner_ref_.Reset();
          engine_.reset();
          Unref();
        });
    w->Pin(info.This());
    return w;
  });
}

}  // namespace mooring
