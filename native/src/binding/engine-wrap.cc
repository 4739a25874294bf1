#include "binding/engine-wrap.h"

#include <cstring>
#include <new>

#include "binding/async-worker.h"
#include "binding/js-args.h"
#include "binding/js-values.h"
#include "binding/nbd-server-wrap.h"
#include "binding/replica-endpoint-args.h"
#include "engine/engine-snapshot-sink.h"
#include "engine/file-snapshot-sink.h"
#include "engine/snapshot-reader.h"

namespace mooring {
namespace {

// Largest unix socket path (sockaddr_un.sun_path holds 108 bytes with the NUL).
constexpr size_t kMaxUnixPathBytes = 107;
// NBD export names and descriptions are at most 4096 bytes (protocol limit).
constexpr size_t kMaxNbdStringBytes = 4096;

NbdServerOptions ParseNbdOptions(const Napi::Value& v) {
  Napi::Object o = ToObject(v, "options");
  NbdServerOptions opts;
  auto has = [&](const char* k) { return !o.Get(k).IsUndefined(); };
  if (has("unixPath")) {
    if (has("tcpHost") || has("tcpPort"))
      throw JsError(Code::kInvalidArgument, "options.unixPath excludes options.tcpHost/tcpPort");
    opts.unix_path = ToStr(o.Get("unixPath"), "options.unixPath", 1, kMaxUnixPathBytes);
  } else {
    opts.tcp_host = has("tcpHost") ? ToStr(o.Get("tcpHost"), "options.tcpHost", 1, 255) : "127.0.0.1";
    if (has("tcpPort")) opts.tcp_port = static_cast<int>(ToUint(o.Get("tcpPort"), "options.tcpPort", 65535));
  }
  if (has("exportName")) opts.export_name = ToStr(o.Get("exportName"), "options.exportName", 0, kMaxNbdStringBytes);
  if (has("description"))
    opts.description = ToStr(o.Get("description"), "options.description", 0, kMaxNbdStringBytes);
  opts.read_only = ToBool(o.Get("readOnly"), "options.readOnly", false);
  if (has("maxRequestBytes")) {
    uint64_t n = ToUint(o.Get("maxRequestBytes"), "options.maxRequestBytes", EngineWrap::kMaxIoBytes);
    if (n < 4096) throw ArgError("options.maxRequestBytes", "at least 4096");
    opts.max_request_bytes = static_cast<uint32_t>(n);
  }
  if (has("ioThreads")) {
    opts.io_threads = static_cast<uint32_t>(ToUint(o.Get("ioThreads"), "options.ioThreads", 256));
    if (opts.io_threads == 0) throw ArgError("options.ioThreads", "at least 1");
  }
  if (has("maxConnections")) {
    opts.max_connections = static_cast<uint32_t>(ToUint(o.Get("maxConnections"), "options.maxConnections", 65536));
    if (opts.max_connections == 0) throw ArgError("options.maxConnections", "at least 1");
  }
  if (has("bufferBytesMax")) opts.max_inflight_bytes_total = EngineWrap::BufferBytesMaxArg(o.Get("bufferBytesMax"));
  opts.tls = ParseTls(o.Get("tls"), "options.tls");
  return opts;
}

// A data-path result as a Status. -EPERM is what a standby engine answers (engine.h):
// INVALID_STATE says what is wrong better than the IO_ERROR every other errno falls to.
Status EngineStatusFromRc(const Engine& engine, int rc, const std::string& what) {
  if (rc == -EPERM && engine.standby())
    return Status::Error(Code::kInvalidState, what + ": the engine is a standby (it serves no I/O until activated)", EPERM);
  return StatusFromRc(rc, what);
}

}  // namespace

uint64_t EngineWrap::BufferBytesMaxArg(const Napi::Value& v) {
  const uint64_t n = ToUint(v, "options.bufferBytesMax", 16.0 * (1ull << 30));
  if (n < kMaxIoBytes) throw ArgError("options.bufferBytesMax", "at least one largest request (32 MiB)");
  return n;
}

Napi::Function EngineWrap::Define(Napi::Env env) {
  using W = EngineWrap;
  return DefineWithMethods<W>(env,
                     {
                         Getter<W, &W::SizeBytes>("sizeBytes"),
                         Method<W, &W::Epoch>(env, "epoch"),
                         Method<W, &W::Resize>(env, "resize"),
                         Method<W, &W::Standby>(env, "standby"),
                         Method<W, &W::Deactivate>(env, "deactivate"),
                         Method<W, &W::Activate>(env, "activate"),
                         Method<W, &W::Replicas>(env, "replicas"),
                         Method<W, &W::Read>(env, "read"),
                         Method<W, &W::Write>(env, "write"),
                         Method<W, &W::Flush>(env, "flush"),
                         Method<W, &W::Trim>(env, "trim"),
                         Method<W, &W::WriteZeroes>(env, "writeZeroes"),
                         Method<W, &W::BlockStatus>(env, "blockStatus"),
                         Method<W, &W::Snapshot>(env, "snapshot"),
                         Method<W, &W::ListSnapshots>(env, "listSnapshots"),
                         Method<W, &W::DeleteSnapshot>(env, "deleteSnapshot"),
                         Method<W, &W::Revert>(env, "revert"),
                         Method<W, &W::AddReplica>(env, "addReplica"),
                         Method<W, &W::RemoveReplica>(env, "removeReplica"),
                         Method<W, &W::ExportNbd>(env, "exportNbd"),
                         Method<W, &W::Close>(env, "close"),
                         Method<W, &W::ExportSnapshot>(env, "exportSnapshot"),
                         Method<W, &W::CopySnapshotTo>(env, "copySnapshotTo"),
                     });
}

EngineWrap::EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
  Napi::Env env = info.Env();
  EngineInit& init =
      TakePendingInit(env, &AddonData::engine_class, "NativeEngine is created by openEngine(), not with new");
  addon_ = AddonData::Get(env);
  engine_ = std::move(init.engine);
  events_ = std::move(init.events);
  replica_count_ = engine_->Replicas().size();
  AdoptThis(this, info, {});
}

void EngineWrap::CheckOpen() const {
  if (closing_) throw JsError(Code::kClosed, "engine is closed");
}

void EngineWrap::CheckRange(uint64_t off, uint64_t len) const {
  const uint64_t size = engine_->size();
  if (!InRange(off, len, size))
    throw JsError(Code::kOutOfRange, "range [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                         ") is beyond the volume size " + std::to_string(size));
}

Napi::Value EngineWrap::Epoch(const Napi::CallbackInfo& info) { return JsNum(info.Env(), engine_->epoch()); }

Napi::Value EngineWrap::SizeBytes(const Napi::CallbackInfo& info) { return JsNum(info.Env(), engine_->size()); }

Napi::Value EngineWrap::Resize(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t size = ToUint(Arg(info, 0), "sizeBytes");
    auto engine = engine_;
    return PinnedTask(info, [engine, size]() { return engine->Resize(size); });
  });
}

Napi::Value EngineWrap::Standby(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), engine_->standby());
}

Napi::Value EngineWrap::Deactivate(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto engine = engine_;
    auto out = std::make_shared<HandOver>();
    return PinnedTask(
        info, [engine, out]() { return engine->Deactivate(out.get()); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("epoch", JsNum(env, out->epoch));
          o.Set("generation", JsNum(env, out->generation));
          Napi::Array ids = Napi::Array::New(env, out->rw_ids.size());
          for (size_t i = 0; i < out->rw_ids.size(); ++i) ids.Set(static_cast<uint32_t>(i), out->rw_ids[i]);
          o.Set("rwReplicaIds", ids);
          return o;
        });
  });
}

Napi::Value EngineWrap::Activate(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    Napi::Object o = ToObject(Arg(info, 0), "handOver");
    HandOver h;
    h.epoch = ToUint(o.Get("epoch"), "handOver.epoch");
    h.generation = ToUint(o.Get("generation"), "handOver.generation");
    const uint64_t epoch = ToUint(Arg(info, 1), "epoch");
    Napi::Value ids = o.Get("rwReplicaIds");
    if (!ids.IsArray()) throw ArgError("handOver.rwReplicaIds", "an array of replica ids");
    Napi::Array arr = ids.As<Napi::Array>();
    if (arr.Length() > kMaxHandOverIds)
      throw ArgError("handOver.rwReplicaIds", "at most " + std::to_string(kMaxHandOverIds) + " replica ids");
    for (uint32_t i = 0; i < arr.Length(); ++i)
      h.rw_ids.push_back(ToStr(arr.Get(i), "handOver.rwReplicaIds[" + std::to_string(i) + "]", 1, kMaxReplicaIdBytes));
    auto engine = engine_;
    return PinnedTask(info, [engine, h, epoch]() { return engine->Activate(h, epoch); });
  });
}

Napi::Value EngineWrap::Replicas(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::vector<ReplicaState> states = engine_->Replicas();
  Napi::Array arr = Napi::Array::New(env, states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("id", states[i].id);
    o.Set("mode", ReplicaModeName(states[i].mode));
    o.Set("epoch", JsNum(env, states[i].epoch));
    o.Set("allocatedBytes", JsNum(env, states[i].allocated_bytes));
    o.Set("lastError", Napi::Number::New(env, states[i].last_error));
    arr.Set(static_cast<uint32_t>(i), o);
  }
  return arr;
}

Napi::Value EngineWrap::Read(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint32_t len = static_cast<uint32_t>(ToUint(Arg(info, 1), "length", kMaxIoBytes));
    CheckRange(off, len);
    auto engine = engine_;
    return PinnedReadTask(info, len, [engine, off, len](uint8_t* buf) {
      return EngineStatusFromRc(*engine, engine->Read(off, len, buf), "engine read of " + std::to_string(len) + " bytes at " + std::to_string(off));
    });
  });
}

Napi::Value EngineWrap::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    Napi::Uint8Array bytes = ToBytes(Arg(info, 1), "data", kMaxIoBytes);
    const uint32_t len = static_cast<uint32_t>(bytes.ByteLength());
    const bool fua = ToBool(Arg(info, 2), "fua", false);
    CheckRange(off, len);
    const uint8_t* p = bytes.Data();
    auto engine = engine_;
    const bool snapshot_bytes = replica_count_ > 1;
    auto* w = PinnedTask(info, [engine, p, off, len, fua, snapshot_bytes]() {
      // With several replicas the engine reads the bytes once per replica; JS code that
      // changes the buffer meanwhile would make the replicas differ. One copy, taken on
      // this pool thread, gives them all the same bytes.
      std::unique_ptr<uint8_t[]> copy;
      const uint8_t* src = p;
      if (snapshot_bytes && len > 0) {
        copy.reset(new (std::nothrow) uint8_t[len]);
        if (!copy) return Status::Error(Code::kIoError, "out of memory", ENOMEM);
        std::memcpy(copy.get(), p, len);
        src = copy.get();
      }
      return EngineStatusFromRc(*engine, engine->Write(off, len, src, fua), "engine write of " + std::to_string(len) + " bytes at " + std::to_string(off));
    });
    w->Pin(bytes);  // the bytes stay valid until the promise settles
    return w;
  });
}

Napi::Value EngineWrap::Flush(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto engine = engine_;
    return PinnedTask(info, [engine]() { return EngineStatusFromRc(*engine, engine->Flush(), "engine flush"); });
  });
}

Napi::Value EngineWrap::Trim(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    CheckRange(off, len);
    auto engine = engine_;
    return PinnedTask(info, [engine, off, len]() {
      for (uint64_t done = 0; done < len;) {
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, kMaxRangeChunkBytes));
        int rc = engine->Trim(off + done, n, false);
        if (rc < 0) return EngineStatusFromRc(*engine, rc, "engine trim at " + std::to_string(off + done));
        done += n;
      }
      return Status::Ok();
    });
  });
}

Napi::Value EngineWrap::WriteZeroes(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    bool may_trim = true, fast_only = false, fua = false;
    if (!Arg(info, 2).IsUndefined()) {
      Napi::Object o = ToObject(Arg(info, 2), "options");
      may_trim = ToBool(o.Get("mayTrim"), "options.mayTrim", true);
      fast_only = ToBool(o.Get("fastOnly"), "options.fastOnly", false);
      fua = ToBool(o.Get("fua"), "options.fua", false);
    }
    CheckRange(off, len);
    auto engine = engine_;
    return PinnedTask(info, [engine, off, len, may_trim, fast_only, fua]() {
      for (uint64_t done = 0; done < len;) {
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, kMaxRangeChunkBytes));
        int rc = engine->WriteZeroes(off + done, n, may_trim, fast_only, fua);
        if (rc < 0) return EngineStatusFromRc(*engine, rc, "engine write-zeroes at " + std::to_string(off + done));
        done += n;
      }
      return Status::Ok();
    });
  });
}

Napi::Value EngineWrap::BlockStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    if (len == 0) throw ArgError("length", "at least 1");
    CheckRange(off, len);
    auto engine = engine_;
    auto out = std::make_shared<std::vector<Extent>>();
    return PinnedTask(
        info,
        [engine, out, off, len]() -> Status {
          // One engine call covers at most 4 GiB; merge the pieces so callers see one list.
          uint64_t covered = 0;
          std::vector<Extent> part;
          while (covered < len && out->size() < kMaxExtents) {
            const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - covered, kMaxRangeChunkBytes));
            part.clear();
            int rc = engine->BlockStatus(off + covered, n, kMaxExtents - static_cast<uint32_t>(out->size()), &part);
            if (rc < 0) return EngineStatusFromRc(*engine, rc, "engine block status at " + std::to_string(off + covered));
            uint64_t got = 0;
            for (const Extent& e : part) {
              if (e.length == 0) continue;
              got += e.length;
              if (!out->empty() && out->back().flags == e.flags) {
                out->back().length += e.length;
              } else {
                out->push_back(e);
              }
            }
            if (got == 0) break;  // a device that reports nothing would loop forever
            covered += got;
          }
          return Status::Ok();
        },
        [out](Napi::Env env) -> Napi::Value { return ExtentsToJs(env, *out); });
  });
}

Napi::Value EngineWrap::Snapshot(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    Napi::Object lo = ToObject(Arg(info, 1), "labels");
    Napi::Array keys = lo.GetPropertyNames();
    if (keys.Length() > kMaxLabels) throw ArgError("labels", "at most " + std::to_string(kMaxLabels) + " entries");
    Labels labels;
    for (uint32_t i = 0; i < keys.Length(); ++i) {
      std::string k = ToStr(keys.Get(i), "labels key", 1, kMaxNameBytes);
      labels[k] = ToStr(lo.Get(k), "labels['" + k + "']", 0, kMaxStringBytes);
    }
    if (!Arg(info, 2).IsBoolean()) throw ArgError("userCreated", "a boolean");
    const bool user_created = Arg(info, 2).As<Napi::Boolean>().Value();
    auto engine = engine_;
    return PinnedTask(info, [engine, name, labels, user_created]() { return engine->Snapshot(name, labels, user_created); });
  });
}

Napi::Value EngineWrap::ListSnapshots(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto engine = engine_;
    auto out = std::make_shared<std::vector<LayerInfo>>();
    // listSnapshots(name): only that snapshot's layer and the way to its visible parent.
    if (info.Length() >= 1 && !info[0].IsUndefined()) {
      const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
      return PinnedTask(
          info, [engine, out, name]() { return engine->SnapshotLayers(name, out.get()); },
          [out](Napi::Env env) -> Napi::Value { return LayerInfosToJs(env, *out); });
    }
    return PinnedTask(
        info, [engine, out]() { return engine->ListSnapshots(out.get()); },
        [out](Napi::Env env) -> Napi::Value { return LayerInfosToJs(env, *out); });
  });
}

Napi::Value EngineWrap::DeleteSnapshot(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    auto engine = engine_;
    return PinnedTask(info, [engine, name]() { return engine->DeleteSnapshot(name); });
  });
}

Napi::Value EngineWrap::Revert(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    if (servers_ > 0) throw JsError(Code::kBusy, "cannot revert while the engine is exported over NBD");
    auto engine = engine_;
    return PinnedTask(info, [engine, name]() { return engine->Revert(name); });
  });
}

Napi::Value EngineWrap::AddReplica(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const ReplicaEndpoint ep = ParseReplicaEndpoint(Arg(info, 0), "endpoint");
    const std::string member = ToStr(Arg(info, 1), "member", 1, ReplicaSet::kMaxNameBytes);
    auto engine = engine_;
    auto res = std::make_shared<RebuildResult>();
    // From now on writes may reach two replicas: copy the caller's bytes (see Write).
    ++replica_count_;
    return PinnedTask(
        info,
        [engine, ep, member, res]() -> Status {
          std::shared_ptr<ReplicaBackend> target;
          Status st = OpenReplicaEndpoint(ep, &target);
          if (!st.ok()) return st;
          // Blocks for the whole copy, on this pool thread (AddReplica closes the target
          // if it could not be added).
          return engine->AddReplica(std::move(target), member, res.get());
        },
        [res](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          o.Set("scannedBytes", JsNum(env, res->scanned_bytes));
          o.Set("sentBytes", JsNum(env, res->sent_bytes));
          o.Set("unmappedBytes", JsNum(env, res->unmapped_bytes));
          o.Set("durationMs", JsNum(env, res->duration_ms));
          return o;
        });
  });
}

Napi::Value EngineWrap::RemoveReplica(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string id = ToStr(Arg(info, 0), "id", 1);
    const bool allow_rw = info.Length() > 1 && info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
    auto engine = engine_;
    return PinnedTask(info, [engine, id, allow_rw]() { return engine->RemoveReplica(id, allow_rw); });
  });
}

Napi::Value EngineWrap::ExportNbd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const NbdServerOptions opts = ParseNbdOptions(Arg(info, 0));
    auto engine = engine_;
    auto server = std::make_shared<std::unique_ptr<NbdServer>>();
    auto* w = PinnedTask(
        info,
        [engine, server, opts]() {
          // The server gets a raw device pointer: the wrapper below holds `engine` for as
          // long as the server may use it.
          return NbdServer::Start(engine.get(), opts, server.get());
        },
        [this, server](Napi::Env env) -> Napi::Value {
          std::shared_ptr<NbdServer> s(std::move(*server));
          addon_->nbd_servers[s.get()] = s;
          return addon_->nbd_server_class.New(NbdServerInit{s, engine_, this});
        },
        [this](Napi::Env, const Status& st) {
          if (!st.ok()) --servers_;
        });
    ++servers_;  // counted from now, so a close() racing the export is refused
    return w;
  });
}

Napi::Value EngineWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (servers_ > 0)
      throw JsError(Code::kBusy, std::to_string(servers_) + " NBD server(s) exported from this engine are open: close them first");
    closing_ = true;
    auto engine = engine_;
    return PinnedTask(
        info, [engine]() { return engine->Shutdown(); }, nullptr,
        [this](Napi::Env, const Status&) {
          // Closed even if the final flush failed: the promise reports that error.
          if (closed_) return;
          closed_ = true;
          if (events_) events_->Close();
          addon_->engines.erase(engine_.get());
          Unref();
        });
  });
}

// ---------------------------------------------------------------------------------------
// Snapshot export and copy

namespace {

SnapshotReader::Progress ProgressEvents(const std::shared_ptr<EventQueue>& events, const std::string& name) {
  if (!events) return nullptr;
  return [events, name](uint64_t done, uint64_t total) {
    EngineEvent e{EngineEvent::Type::kSnapshotCopyProgress, "", 0, 0, done, ""};
    e.total_bytes = total;
    e.snapshot = name;
    events->Push(e);
  };
}

Napi::Value CopyResultToJs(Napi::Env env, const SnapshotCopyResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("sizeBytes", JsNum(env, r.size_bytes));
  o.Set("copiedBytes", JsNum(env, r.copied_bytes));
  o.Set("durationMs", JsNum(env, r.duration_ms));
  return o;
}

}  // namespace

Napi::Value EngineWrap::ExportSnapshot(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    const std::string path = ToStr(Arg(info, 1), "path", 1);
    if (path[0] != '/') throw ArgError("path", "an absolute path");
    auto engine = engine_;
    auto progress = ProgressEvents(events_, name);
    auto res = std::make_shared<SnapshotCopyResult>();
    return PinnedTask(
        info,
        [engine, name, path, progress, res]() -> Status {
          // The snapshot is looked up first, so an unknown one creates no file.
          std::unique_ptr<SnapshotReader> reader;
          Status st = SnapshotReader::Open(engine.get(), name, &reader);
          if (!st.ok()) return st;
          std::unique_ptr<FileSnapshotSink> sink;
          st = FileSnapshotSink::Create(path, reader->size(), &sink);
          if (!st.ok()) return st;
          return reader->CopyTo(sink.get(), progress, res.get());
        },
        [res](Napi::Env env) -> Napi::Value { return CopyResultToJs(env, *res); });
  });
}

Napi::Value EngineWrap::CopySnapshotTo(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    Napi::Value tv = Arg(info, 1);
    if (!tv.IsObject() || !tv.As<Napi::Object>().CheckTypeTag(&kTypeTag)) throw ArgError("target", "a NativeEngine");
    EngineWrap* target = EngineWrap::Unwrap(tv.As<Napi::Object>());
    if (target == this || target->engine_ == engine_)
      throw JsError(Code::kInvalidArgument, "a snapshot cannot be copied into the engine it belongs to");
    if (target->closing_) throw JsError(Code::kClosed, "the target engine is closed");
    if (target->engine_->size() != engine_->size())
      throw JsError(Code::kInvalidArgument, "the target engine's size " + std::to_string(target->engine_->size()) +
                                                " differs from this engine's " + std::to_string(engine_->size()));
    auto engine = engine_;
    auto dest = target->engine_;
    auto progress = ProgressEvents(events_, name);
    auto res = std::make_shared<SnapshotCopyResult>();
    auto* w = PinnedTask(
        info,
        [engine, dest, name, progress, res]() -> Status {
          std::unique_ptr<SnapshotReader> reader;
          Status st = SnapshotReader::Open(engine.get(), name, &reader);
          if (!st.ok()) return st;
          EngineSnapshotSink sink(dest.get());
          return reader->CopyTo(&sink, progress, res.get());
        },
        [res](Napi::Env env) -> Napi::Value { return CopyResultToJs(env, *res); });
    w->Pin(tv);  // the target's handle stays alive until the copy settles
    return w;
  });
}

}  // namespace mooring
