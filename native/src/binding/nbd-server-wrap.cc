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

NbdServerWrap::NbdServerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NbdServerWrap>(info) {
  Napi::Env env = info.Env();
  NbdServerInit& init =
      TakePendingInit(env, &AddonData::nbd_server_class, "NativeNbdServer is created by exportNbd(), not with new");
  addon_ = AddonData::Get(env);
  server_ = std::move(init.server);
  engine_ = std::move(init.engine);
  owner_ = init.owner;
  owner_ref_ = Napi::Persistent(owner_->Value());
  AdoptThis(this, info, {{"port", Napi::Number::New(env, server_->port())}});
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
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    // Idempotent: NbdServer::Close is, and a second call while the first runs waits for it.
    auto server = server_;
    return PinnedTask(
        info, [server]() { return server->Close(); }, nullptr,
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
  });
}

}  // namespace mooring
