#include "binding/replica-server-wrap.h"

#include "binding/async-worker.h"
#include "binding/js-args.h"
#include "binding/replica-endpoint-args.h"
#include "net/buffer-pool.h"

namespace mooring {

namespace {

// Bounds of startReplicaServer options (the server checks them again).
constexpr uint32_t kMaxConnectionsOption = 4096;
constexpr uint64_t kBufferBytesMaxOption = 64ull << 30;
// goAway(timeoutMs) at most.
constexpr uint32_t kMaxGoAwayTimeoutMs = 3600 * 1000;

ReplicaServerOptions ParseServerOptions(const Napi::Value& v) {
  Napi::Object o = ToObject(v, "options");
  ReplicaServerOptions opts;
  opts.root = ToStr(o.Get("root"), "options.root");
  if (opts.root[0] != '/') throw ArgError("options.root", "an absolute path");
  if (!o.Get("backingFilesRoot").IsUndefined()) {
    opts.backing_files_root = ToStr(o.Get("backingFilesRoot"), "options.backingFilesRoot");
    if (opts.backing_files_root[0] != '/') throw ArgError("options.backingFilesRoot", "an absolute path");
  }
  if (!o.Get("host").IsUndefined()) opts.host = ToStr(o.Get("host"), "options.host", 1, 255);
  if (!o.Get("port").IsUndefined()) opts.port = static_cast<int>(ToUint(o.Get("port"), "options.port", 65535));
  opts.tls = ParseTls(o.Get("tls"), "options.tls");
  opts.cluster_secret = ParseClusterSecret(o.Get("clusterSecret"), "options.clusterSecret");
  if (!o.Get("maxConnections").IsUndefined()) {
    uint64_t n = ToUint(o.Get("maxConnections"), "options.maxConnections", kMaxConnectionsOption);
    if (n == 0) throw ArgError("options.maxConnections", "at least 1");
    opts.max_connections = static_cast<uint32_t>(n);
  }
  if (!o.Get("handshakingPerPeerMax").IsUndefined()) {
    uint64_t n = ToUint(o.Get("handshakingPerPeerMax"), "options.handshakingPerPeerMax", kMaxConnectionsOption);
    if (n == 0) throw ArgError("options.handshakingPerPeerMax", "at least 1");
    opts.max_handshaking_per_peer = static_cast<uint32_t>(n);
  }
  if (!o.Get("bufferBytesMax").IsUndefined()) {
    // Checked against its bounds by ReplicaServer::Start (INVALID_ARGUMENT).
    opts.max_inflight_bytes_total = ToUint(o.Get("bufferBytesMax"), "options.bufferBytesMax", kBufferBytesMaxOption);
  }
  return opts;
}

}  // namespace

Napi::Function ReplicaServerWrap::Define(Napi::Env env) {
  using W = ReplicaServerWrap;
  return DefineWithMethods<W>(env, {
                                       Method<W, &W::Stats>(env, "stats"),
                                       Method<W, &W::Close>(env, "close"),
                                       Method<W, &W::GoAway>(env, "goAway"),
                                   });
}

Napi::Value ReplicaServerWrap::StartServer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    AddonData* data = AddonData::Get(env);
    const ReplicaServerOptions opts = ParseServerOptions(Arg(info, 0));
    auto started = std::make_shared<std::shared_ptr<ReplicaServer>>();
    return new TaskWorker(
        env,
        [opts, started]() -> Status {
          std::unique_ptr<ReplicaServer> s;
          Status st = ReplicaServer::Start(opts, &s);
          if (st.ok()) *started = std::move(s);
          return st;
        },
        [data, started](Napi::Env) -> Napi::Value {
          // Registered before the wrapper exists, so even a failure below is cleaned up at exit.
          data->replica_servers[started->get()] = *started;
          return data->replica_server_class.New(ReplicaServerInit{*started});
        });
  });
}

ReplicaServerWrap::ReplicaServerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ReplicaServerWrap>(info) {
  Napi::Env env = info.Env();
  ReplicaServerInit& init = TakePendingInit(env, &AddonData::replica_server_class,
                                            "NativeReplicaServer is created by startReplicaServer(), not with new");
  addon_ = AddonData::Get(env);
  server_ = std::move(init.server);
  AdoptThis(this, info, {{"port", Napi::Number::New(env, server_->port())}});
}

Napi::Value ReplicaServerWrap::Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const ReplicaServerStats s = closed_ ? final_stats_ : server_->stats();
  Napi::Object o = Napi::Object::New(env);
  o.Set("connectionsTotal", JsNum(env, s.connections_total));
  o.Set("connectionsOpen", JsNum(env, s.connections_open));
  o.Set("requests", JsNum(env, s.requests));
  o.Set("staleEpochRefusals", JsNum(env, s.stale_epoch_refusals));
  o.Set("protocolErrors", JsNum(env, s.protocol_errors));
  o.Set("authFailures", JsNum(env, s.auth_failures));
  o.Set("connectionsRefused", JsNum(env, s.connections_refused));
  o.Set("handshakesDropped", JsNum(env, s.handshakes_dropped));
  o.Set("bytesRead", JsNum(env, s.bytes_read));
  o.Set("bytesWritten", JsNum(env, s.bytes_written));
  o.Set("inlineWrites", JsNum(env, s.inline_writes));
  o.Set("inlineReads", JsNum(env, s.inline_reads));
  o.Set("bufferBytes", JsNum(env, s.buffer_bytes));
  o.Set("bufferBytesPeak", JsNum(env, s.buffer_bytes_peak));
  o.Set("bufferWaits", JsNum(env, s.buffer_waits));
  // Process-wide: the payload buffers this process keeps for reuse (util/byte-buffer.h).
  o.Set("spareBufferBytes", JsNum(env, BufferPool::Get().spare_bytes()));
  o.Set("spareBufferHits", JsNum(env, BufferPool::Get().hits()));
  return o;
}

Napi::Value ReplicaServerWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    auto server = server_;
    return PinnedTask(
        info, [server]() { return server->Close(); }, nullptr,
        [this](Napi::Env, const Status&) {
          if (closed_) return;
          closed_ = true;
          final_stats_ = server_->stats();
          addon_->replica_servers.erase(server_.get());
          Unref();
        });
  });
}

Napi::Value ReplicaServerWrap::GoAway(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    const uint32_t timeout_ms = static_cast<uint32_t>(ToUint(Arg(info, 0), "timeoutMs", kMaxGoAwayTimeoutMs));
    if (closed_) throw JsError(Code::kClosed, "replica server is closed");
    auto server = server_;
    auto result = std::make_shared<ReplicaServerGoAway>();
    return PinnedTask(
        info, [server, timeout_ms, result]() { return server->GoAway(timeout_ms, result.get()); },
        [result](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("goaway", JsNum(env, result->goaway));
          o.Set("timedOut", JsNum(env, result->timed_out));
          o.Set("closed", JsNum(env, result->closed));
          return o;
        });
  });
}

}  // namespace mooring
