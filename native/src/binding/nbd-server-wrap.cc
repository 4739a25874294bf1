#include "binding/nbd-server-wrap.h"

#include "binding/async-worker.h"
#include "binding/engine-wrap.h"
#include "binding/handoff-wrap.h"
#include "binding/js-args.h"
#include "binding/replica-endpoint-args.h"

namespace mooring {

namespace {

// Longest freeze wait accepted (NbdConnection::kDrainTimeoutMs is the usual bound).
constexpr double kMaxFreezeTimeoutMs = 600000;

EngineWrap* EngineArg(const Napi::Value& v, const char* name) {
  if (!v.IsObject() || !v.As<Napi::Object>().CheckTypeTag(&EngineWrap::kTypeTag)) throw ArgError(name, "a NativeEngine");
  EngineWrap* e = EngineWrap::Unwrap(v.As<Napi::Object>());
  if (e->closing()) throw JsError(Code::kClosed, std::string(name) + " is closed");
  return e;
}

}  // namespace

Napi::Function NbdServerWrap::Define(Napi::Env env) {
  using W = NbdServerWrap;
  return DefineWithMethods<W>(env,
                     {
                         Method<W, &W::Stats>(env, "stats"),
                         Method<W, &W::IoStats>(env, "ioStats"),
                         Method<W, &W::Close>(env, "close"),
                         Method<W, &W::ConnectionIds>(env, "connectionIds"),
                         Method<W, &W::Freeze>(env, "freeze"),
                         Method<W, &W::Detach>(env, "detach"),
                         Method<W, &W::Unfreeze>(env, "unfreeze"),
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

// Not part of stats() either (same reason): per request kind counts and latency buckets, and
// the export's memory budget, for metrics (src/metrics/, docs/metrics.md).
Napi::Value NbdServerWrap::IoStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const NbdServerStats s = closed_ ? final_stats_ : server_->stats();
  static const char* const kNames[kNbdOpKinds] = {"read", "write", "flush", "trim", "writeZeroes", "other"};
  Napi::Object ops = Napi::Object::New(env);
  for (int k = 0; k < kNbdOpKinds; ++k) {
    const NbdOpStats& op = s.ops[k];
    Napi::Object o = Napi::Object::New(env);
    o.Set("count", JsNum(env, op.count));
    o.Set("errors", JsNum(env, op.errors));
    o.Set("sumNs", JsNum(env, op.sum_ns));
    Napi::Array b = Napi::Array::New(env, kNbdLatencyBuckets);
    for (int i = 0; i < kNbdLatencyBuckets; ++i) b.Set(static_cast<uint32_t>(i), JsNum(env, op.buckets[i]));
    o.Set("buckets", b);
    ops.Set(kNames[k], o);
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("ops", ops);
  o.Set("budgetLimitBytes", JsNum(env, s.budget_limit_bytes));
  o.Set("budgetUsedBytes", JsNum(env, s.budget_used_bytes));
  o.Set("budgetPeakBytes", JsNum(env, s.budget_peak_bytes));
  o.Set("budgetWaits", JsNum(env, s.budget_waits));
  o.Set("inlineReads", JsNum(env, s.inline_reads));
  o.Set("loopWrites", JsNum(env, s.loop_writes));
  o.Set("groupedRequests", JsNum(env, s.grouped_requests));
  return o;
}

// Not part of stats(): stats() is spread into EngineInfo.nbdStats (public, and sent over
// gRPC), whose shape the hand-off does not change.
Napi::Value NbdServerWrap::ConnectionIds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const NbdServerStats s = closed_ ? final_stats_ : server_->stats();
  Napi::Array ids = Napi::Array::New(env, s.connection_ids.size());
  for (size_t i = 0; i < s.connection_ids.size(); ++i) ids.Set(static_cast<uint32_t>(i), JsNum(env, s.connection_ids[i]));
  return ids;
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
          if (counted_) owner_->ServerClosed();
          counted_ = false;
          owner_ref_.Reset();
          engine_.reset();
          Unref();
        });
  });
}

}  // namespace mooring

namespace mooring {

Napi::Value NbdServerWrap::Freeze(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "NBD server is closed");
    const int timeout = static_cast<int>(ToUint(Arg(info, 0), "timeoutMs", kMaxFreezeTimeoutMs));
    const bool hold = ToBool(Arg(info, 1), "hold", false);
    auto server = server_;
    return PinnedTask(info, [server, timeout, hold]() { return server->Freeze(timeout, hold); });
  });
}

Napi::Value NbdServerWrap::Detach(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "NBD server is closed");
    auto server = server_;
    auto rec = std::make_shared<NbdServerRecord>();
    return PinnedTask(
        info, [server, rec]() { return server->Detach(rec.get()); },
        [rec](Napi::Env env) -> Napi::Value { return WrapNbdHandOffRecord(env, rec); },
        [this](Napi::Env, const Status& st) {
          // Detached: the engine may close now (the frozen server never calls it again
          // unless unfreeze() hands it an engine).
          if (!st.ok() || !counted_) return;
          owner_->ServerClosed();
          counted_ = false;
        });
  });
}

Napi::Value NbdServerWrap::Unfreeze(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "NBD server is closed");
    Napi::Value ev = Arg(info, 0);
    EngineWrap* target = owner_;
    if (!ev.IsUndefined()) {
      target = EngineArg(ev, "engine");
    } else if (target->closing()) {
      throw JsError(Code::kInvalidState, "the engine this server served is closed: pass the engine to serve from now on");
    }
    std::shared_ptr<Engine> device = target == owner_ ? nullptr : target->engine();
    target->ServerOpened();  // its close() is refused from now on
    auto server = server_;
    auto* w = PinnedTask(
        info, [server, device]() { return server->Unfreeze(device.get()); }, nullptr,
        [this, target](Napi::Env, const Status& st) {
          if (!st.ok()) {
            target->ServerClosed();
            return;
          }
          if (counted_) owner_->ServerClosed();  // the count moves to target
          if (target != owner_) {
            owner_ = target;
            owner_ref_ = Napi::Persistent(target->Value());
            engine_ = target->engine();
          }
          counted_ = true;
        });
    if (!ev.IsUndefined()) w->Pin(ev);
    return w;
  });
}

Napi::Value NbdServerWrap::AdoptJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    Napi::Value rv = Arg(info, 0);
    if (!rv.IsObject() || !rv.As<Napi::Object>().CheckTypeTag(&NbdHandOffRecordWrap::kTypeTag)) {
      throw ArgError("record", "a NativeNbdHandOffRecord (from receive())");
    }
    EngineWrap* owner = EngineArg(Arg(info, 1), "engine");
    NbdServerOptions runtime;
    Napi::Value ov = Arg(info, 2);
    if (!ov.IsUndefined()) {
      Napi::Object o = ToObject(ov, "options");
      if (!o.Get("ioThreads").IsUndefined()) {
        runtime.io_threads = static_cast<uint32_t>(ToUint(o.Get("ioThreads"), "options.ioThreads", 256));
        if (runtime.io_threads == 0) throw ArgError("options.ioThreads", "at least 1");
      }
      if (!o.Get("maxConnections").IsUndefined()) {
        runtime.max_connections = static_cast<uint32_t>(ToUint(o.Get("maxConnections"), "options.maxConnections", 4096));
        if (runtime.max_connections == 0) throw ArgError("options.maxConnections", "at least 1");
      }
      if (!o.Get("bufferBytesMax").IsUndefined()) runtime.max_inflight_bytes_total = EngineWrap::BufferBytesMaxArg(o.Get("bufferBytesMax"));
      runtime.tls = ParseTls(o.Get("tls"), "options.tls");  // for the clients that connect from now on
    }
    std::shared_ptr<NbdServerRecord> rec = NbdHandOffRecordWrap::Unwrap(rv.As<Napi::Object>())->Take();
    std::shared_ptr<Engine> engine = owner->engine();
    auto made = std::make_shared<std::unique_ptr<NbdServer>>();
    owner->ServerOpened();
    auto* w = new TaskWorker(
        env, [engine, runtime, rec, made]() { return NbdServer::Adopt(engine.get(), runtime, rec.get(), made.get()); },
        [made, engine, owner](Napi::Env env) -> Napi::Value {
          std::shared_ptr<NbdServer> s(std::move(*made));
          AddonData* data = AddonData::Get(env);
          data->nbd_servers[s.get()] = s;
          return data->nbd_server_class.New(NbdServerInit{s, engine, owner});
        },
        [owner](Napi::Env, const Status& st) {
          if (!st.ok()) owner->ServerClosed();
        });
    w->Pin(Arg(info, 1));
    return w;
  });
}

}  // namespace mooring
