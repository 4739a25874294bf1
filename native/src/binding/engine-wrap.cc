#include "binding/engine-wrap.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "binding/async-worker.h"
#include "binding/js-args.h"
#include "binding/nbd-server-wrap.h"

namespace mooring {
namespace {

// Largest unix socket path (sockaddr_un.sun_path holds 108 bytes with the NUL).
constexpr size_t kMaxUnixPathBytes = 107;
// NBD export names and descriptions are at most 4096 bytes (protocol limit).
constexpr size_t kMaxNbdStringBytes = 4096;

Napi::Object LayerToJs(Napi::Env env, const LayerInfo& l) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", l.id);
  o.Set("file", l.file);
  o.Set("parent", l.parent);
  o.Set("name", l.name);
  o.Set("head", l.head);
  o.Set("removed", l.removed);
  o.Set("userCreated", l.user_created);
  o.Set("createdMs", Napi::Number::New(env, static_cast<double>(l.created_ms)));
  Napi::Object labels = Napi::Object::New(env);
  for (const auto& kv : l.labels) labels.Set(kv.first, kv.second);
  o.Set("labels", labels);
  o.Set("sizeBytes", JsNum(env, l.size_bytes));
  o.Set("allocatedBytes", JsNum(env, l.allocated_bytes));
  return o;
}

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
  return opts;
}

}  // namespace

Napi::Function EngineWrap::Define(Napi::Env env) {
  using W = EngineWrap;
  return DefineWithMethods<W>(env,
                     {
                         Method<W, &W::Epoch>(env, "epoch"),
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
                         Method<W, &W::ExportNbd>(env, "exportNbd"),
                         Method<W, &W::Close>(env, "close"),
                     });
}

Napi::Object EngineWrap::NewInstance(Napi::Env env, AddonData* data, EngineInit init) {
  data->pending_engine = &init;
  try {
    Napi::Object o = data->engine_ctor.New({});
    data->pending_engine = nullptr;
    return o;
  } catch (...) {
    data->pending_engine = nullptr;
    throw;
  }
}

EngineWrap::EngineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<EngineWrap>(info) {
  Napi::Env env = info.Env();
  AddonData* data = AddonData::Get(env);
  EngineInit* init = data ? data->pending_engine : nullptr;
  if (init == nullptr)
    throw MakeError(env, Code::kInvalidArgument, "NativeEngine is created by openEngine(), not with new");
  data->pending_engine = nullptr;
  addon_ = data;
  engine_ = std::move(init->engine);
  events_ = std::move(init->events);
  replica_count_ = engine_->Replicas().size();
  Napi::Object self = info.This().As<Napi::Object>();
  self.TypeTag(&kTypeTag);
  self.DefineProperty(Napi::PropertyDescriptor::Value("sizeBytes", JsNum(env, engine_->size()), napi_enumerable));
  Ref();  // open handles are not collected; Close() drops this
}

void EngineWrap::CheckOpen() const {
  if (closing_) throw JsError(Code::kClosed, "engine is closed");
}

void EngineWrap::CheckRange(uint64_t off, uint64_t len) const {
  const uint64_t size = engine_->size();
  if (len > size || off > size - len)
    throw JsError(Code::kOutOfRange, "range [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                         ") is beyond the volume size " + std::to_string(size));
}

PromiseWorker* EngineWrap::Simple(const Napi::CallbackInfo& info, std::function<Status()> run) {
  auto* w = new TaskWorker(info.Env(), std::move(run));
  w->Pin(info.This());
  return w;
}

Napi::Value EngineWrap::Epoch(const Napi::CallbackInfo& info) { return JsNum(info.Env(), engine_->epoch()); }

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
    // The data is read into malloc'd memory that the returned Buffer then owns: no copy.
    struct Owned {
      uint8_t* p = nullptr;
      ~Owned() { std::free(p); }
    };
    auto buf = std::make_shared<Owned>();
    auto engine = engine_;
    auto* w = new TaskWorker(
        env,
        [engine, buf, off, len]() -> Status {
          buf->p = static_cast<uint8_t*>(std::malloc(len > 0 ? len : 1));
          if (buf->p == nullptr) return Status::Error(Code::kIoError, "out of memory", ENOMEM);
          return StatusFromRc(engine->Read(off, len, buf->p), "engine read of " + std::to_string(len) + " bytes at " + std::to_string(off));
        },
        [buf, len](Napi::Env env) -> Napi::Value {
          uint8_t* p = buf->p;
          buf->p = nullptr;
          return Napi::Buffer<uint8_t>::NewOrCopy(env, p, len, [](Napi::Env, uint8_t* d) { std::free(d); });
        });
    w->Pin(info.This());
    return w;
  });
}

Napi::Value EngineWrap::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    Napi::Value data = Arg(info, 1);
    if (!data.IsTypedArray() || data.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      throw ArgError("data", "a Uint8Array or Buffer");
    Napi::Uint8Array bytes = data.As<Napi::Uint8Array>();
    if (bytes.ByteLength() > kMaxIoBytes) throw ArgError("data", "at most " + std::to_string(kMaxIoBytes) + " bytes");
    const uint32_t len = static_cast<uint32_t>(bytes.ByteLength());
    const bool fua = ToBool(Arg(info, 2), "fua", false);
    CheckRange(off, len);
    const uint8_t* p = bytes.Data();
    auto engine = engine_;
    const bool snapshot_bytes = replica_count_ > 1;
    auto* w = new TaskWorker(env, [engine, p, off, len, fua, snapshot_bytes]() {
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
      return StatusFromRc(engine->Write(off, len, src, fua), "engine write of " + std::to_string(len) + " bytes at " + std::to_string(off));
    });
    w->Pin(data);  // the bytes stay valid until the promise settles
    w->Pin(info.This());
    return w;
  });
}

Napi::Value EngineWrap::Flush(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto engine = engine_;
    return Simple(info, [engine]() { return StatusFromRc(engine->Flush(), "engine flush"); });
  });
}

Napi::Value EngineWrap::Trim(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    CheckRange(off, len);
    auto engine = engine_;
    return Simple(info, [engine, off, len]() {
      for (uint64_t done = 0; done < len;) {
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, kMaxRangeChunkBytes));
        int rc = engine->Trim(off + done, n, false);
        if (rc < 0) return StatusFromRc(rc, "engine trim at " + std::to_string(off + done));
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
    return Simple(info, [engine, off, len, may_trim, fast_only, fua]() {
      for (uint64_t done = 0; done < len;) {
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, kMaxRangeChunkBytes));
        int rc = engine->WriteZeroes(off + done, n, may_trim, fast_only, fua);
        if (rc < 0) return StatusFromRc(rc, "engine write-zeroes at " + std::to_string(off + done));
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
    auto* w = new TaskWorker(
        env,
        [engine, out, off, len]() -> Status {
          // One engine call covers at most 4 GiB; merge the pieces so callers see one list.
          uint64_t covered = 0;
          std::vector<Extent> part;
          while (covered < len && out->size() < kMaxExtents) {
            const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - covered, kMaxRangeChunkBytes));
            part.clear();
            int rc = engine->BlockStatus(off + covered, n, kMaxExtents - static_cast<uint32_t>(out->size()), &part);
            if (rc < 0) return StatusFromRc(rc, "engine block status at " + std::to_string(off + covered));
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
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array arr = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); ++i) {
            Napi::Object o = Napi::Object::New(env);
            o.Set("length", JsNum(env, (*out)[i].length));
            o.Set("flags", Napi::Number::New(env, (*out)[i].flags));
            arr.Set(static_cast<uint32_t>(i), o);
          }
          return arr;
        });
    w->Pin(info.This());
    return w;
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
    return Simple(info, [engine, name, labels, user_created]() { return engine->Snapshot(name, labels, user_created); });
  });
}

Napi::Value EngineWrap::ListSnapshots(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto engine = engine_;
    auto out = std::make_shared<std::vector<LayerInfo>>();
    auto* w = new TaskWorker(
        env, [engine, out]() { return engine->ListSnapshots(out.get()); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array arr = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); ++i) arr.Set(static_cast<uint32_t>(i), LayerToJs(env, (*out)[i]));
          return arr;
        });
    w->Pin(info.This());
    return w;
  });
}

Napi::Value EngineWrap::DeleteSnapshot(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    auto engine = engine_;
    return Simple(info, [engine, name]() { return engine->DeleteSnapshot(name); });
  });
}

Napi::Value EngineWrap::Revert(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string name = ToStr(Arg(info, 0), "name", 1, kMaxNameBytes);
    if (servers_ > 0) throw JsError(Code::kBusy, "cannot revert while the engine is exported over NBD");
    auto engine = engine_;
    return Simple(info, [engine, name]() { return engine->Revert(name); });
  });
}

Napi::Value EngineWrap::ExportNbd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const NbdServerOptions opts = ParseNbdOptions(Arg(info, 0));
    auto engine = engine_;
    auto server = std::make_shared<std::unique_ptr<NbdServer>>();
    auto* w = new TaskWorker(
        env,
        [engine, server, opts]() {
          // The server gets a raw device pointer: the wrapper below holds `engine` for as
          // long as the server may use it.
          return NbdServer::Start(engine.get(), opts, server.get());
        },
        [this, server](Napi::Env env) -> Napi::Value {
          std::shared_ptr<NbdServer> s(std::move(*server));
          addon_->nbd_servers[s.get()] = s;
          return NbdServerWrap::NewInstance(env, addon_, NbdServerInit{s, engine_, this});
        },
        [this](Napi::Env, const Status& st) {
          if (!st.ok()) --servers_;
        });
    ++servers_;  // counted from now, so a close() racing the export is refused
    w->Pin(info.This());
    return w;
  });
}

Napi::Value EngineWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (servers_ > 0)
      throw JsError(Code::kBusy, std::to_string(servers_) + " NBD server(s) exported from this engine are open: close them first");
    closing_ = true;
    auto engine = engine_;
    auto* w = new TaskWorker(
        info.Env(), [engine]() { return engine->Shutdown(); }, nullptr,
        [this](Napi::Env, const Status&) {
          // Closed even if the final flush failed: the promise reports that error.
          if (closed_) return;
          closed_ = true;
          if (events_) events_->Close();
          addon_->engines.erase(engine_.get());
          Unref();
        });
    w->Pin(info.This());
    return w;
  });
}

}  // namespace mooring
