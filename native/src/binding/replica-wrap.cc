#include "binding/replica-wrap.h"

#include <cstdlib>
#include <cstring>

#include "binding/js-args.h"

namespace mooring {
namespace {

// engine-wrap.cc lists layers the same way; both follow NativeLayerInfo.
Napi::Object LayerInfoToJs(Napi::Env env, const LayerInfo& l) {
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

// A data-path result of the replica. The store answers -EBADF once it is closed; when
// close() got there first that is CLOSED, not an I/O failure.
Status ReplicaRc(int rc, const std::atomic<bool>& closed, const std::string& what) {
  if (rc == -EBADF && closed.load()) return Status::Error(Code::kClosed, what + ": replica is closed", EBADF);
  return StatusFromRc(rc, what);
}

}  // namespace

Napi::Function ReplicaWrap::Define(Napi::Env env) {
  using W = ReplicaWrap;
  return DefineWithMethods<W>(env,
                              {
                                  Method<W, &W::Epoch>(env, "epoch"),
                                  Method<W, &W::Clean>(env, "clean"),
                                  Method<W, &W::ClaimEpoch>(env, "claimEpoch"),
                                  Method<W, &W::Read>(env, "read"),
                                  Method<W, &W::Write>(env, "write"),
                                  Method<W, &W::Flush>(env, "flush"),
                                  Method<W, &W::BlockStatus>(env, "blockStatus"),
                                  Method<W, &W::ListLayers>(env, "listLayers"),
                                  Method<W, &W::LayerExtents>(env, "layerExtents"),
                                  Method<W, &W::AllocatedBytes>(env, "allocatedBytes"),
                                  Method<W, &W::Close>(env, "close"),
                              });
}

Napi::Object ReplicaWrap::NewInstance(Napi::Env env, AddonData* data, ReplicaInit init) {
  data->pending_replica = &init;
  try {
    Napi::Object o = data->replica_ctor.New({});
    data->pending_replica = nullptr;
    return o;
  } catch (...) {
    data->pending_replica = nullptr;
    throw;
  }
}

ReplicaWrap::ReplicaWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ReplicaWrap>(info) {
  Napi::Env env = info.Env();
  AddonData* data = AddonData::Get(env);
  ReplicaInit* init = data ? data->pending_replica : nullptr;
  if (init == nullptr)
    throw MakeError(env, Code::kInvalidArgument, "NativeReplica is created by openReplica(), not with new");
  data->pending_replica = nullptr;
  addon_ = data;
  replica_ = std::move(init->replica);
  native_closed_ = std::make_shared<std::atomic<bool>>(false);
  Napi::Object self = info.This().As<Napi::Object>();
  self.TypeTag(&kTypeTag);
  self.DefineProperty(Napi::PropertyDescriptor::Value("id", Napi::String::New(env, replica_->id()), napi_enumerable));
  self.DefineProperty(Napi::PropertyDescriptor::Value("sizeBytes", JsNum(env, replica_->size()), napi_enumerable));
  Ref();  // open handles are not collected; Close() drops this
}

void ReplicaWrap::CheckOpen() const {
  if (closing_) throw JsError(Code::kClosed, "replica " + replica_->id() + " is closed");
}

void ReplicaWrap::CheckRange(uint64_t off, uint64_t len) const {
  const uint64_t size = replica_->size();
  if (len > size || off > size - len)
    throw JsError(Code::kOutOfRange, "range [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                         ") is beyond the size " + std::to_string(size) + " of replica " +
                                         replica_->id());
}

PromiseWorker* ReplicaWrap::Simple(const Napi::CallbackInfo& info, std::function<Status()> run) {
  auto* w = new TaskWorker(info.Env(), std::move(run));
  w->Pin(info.This());
  return w;
}

Napi::Value ReplicaWrap::Epoch(const Napi::CallbackInfo& info) { return JsNum(info.Env(), replica_->epoch()); }

Napi::Value ReplicaWrap::Clean(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), replica_->clean());
}

Napi::Value ReplicaWrap::ClaimEpoch(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t epoch = ToUint(Arg(info, 0), "epoch");
    auto replica = replica_;
    return Simple(info, [replica, epoch]() { return replica->ClaimEpoch(epoch); });
  });
}

Napi::Value ReplicaWrap::Read(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint32_t len = static_cast<uint32_t>(ToUint(Arg(info, 1), "length", kMaxIoBytes));
    CheckRange(off, len);
    // Read into malloc'd memory that the returned Buffer then owns: no copy.
    struct Owned {
      uint8_t* p = nullptr;
      ~Owned() { std::free(p); }
    };
    auto buf = std::make_shared<Owned>();
    auto replica = replica_;
    auto closed = native_closed_;
    auto* w = new TaskWorker(
        env,
        [replica, closed, buf, off, len]() -> Status {
          buf->p = static_cast<uint8_t*>(std::malloc(len > 0 ? len : 1));
          if (buf->p == nullptr) return Status::Error(Code::kIoError, "out of memory", ENOMEM);
          return ReplicaRc(replica->Read(off, len, buf->p), *closed,
                           "replica " + replica->id() + ": read of " + std::to_string(len) + " bytes at " +
                               std::to_string(off));
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

Napi::Value ReplicaWrap::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t epoch = ToUint(Arg(info, 0), "epoch");
    const uint64_t off = ToUint(Arg(info, 1), "offset");
    Napi::Value data = Arg(info, 2);
    if (!data.IsTypedArray() || data.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
      throw ArgError("data", "a Uint8Array or Buffer");
    Napi::Uint8Array bytes = data.As<Napi::Uint8Array>();
    if (bytes.ByteLength() > kMaxIoBytes) throw ArgError("data", "at most " + std::to_string(kMaxIoBytes) + " bytes");
    const uint32_t len = static_cast<uint32_t>(bytes.ByteLength());
    CheckRange(off, len);
    const uint8_t* p = bytes.Data();
    auto replica = replica_;
    auto closed = native_closed_;
    auto* w = new TaskWorker(env, [replica, closed, p, epoch, off, len]() {
      // One replica reads the bytes once, so unlike the engine no private copy is needed.
      return ReplicaRc(replica->Write(epoch, off, len, p, false), *closed,
                       "replica " + replica->id() + ": write of " + std::to_string(len) + " bytes at " +
                           std::to_string(off) + " (epoch " + std::to_string(epoch) + ")");
    });
    w->Pin(data);  // the bytes stay valid until the promise settles
    w->Pin(info.This());
    return w;
  });
}

Napi::Value ReplicaWrap::Flush(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto closed = native_closed_;
    return Simple(info, [replica, closed]() {
      return ReplicaRc(replica->Flush(), *closed, "replica " + replica->id() + ": flush");
    });
  });
}

Napi::Value ReplicaWrap::BlockStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    if (len == 0) throw ArgError("length", "at least 1");
    CheckRange(off, len);
    auto replica = replica_;
    auto closed = native_closed_;
    auto out = std::make_shared<std::vector<Extent>>();
    auto* w = new TaskWorker(
        env,
        [replica, closed, out, off, len]() -> Status {
          // The store takes 64-bit lengths and stops at the extent limit itself.
          return ReplicaRc(replica->BlockStatus(off, len, kMaxExtents, out.get()), *closed,
                           "replica " + replica->id() + ": block status at " + std::to_string(off));
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

Napi::Value ReplicaWrap::ListLayers(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto out = std::make_shared<std::vector<LayerInfo>>();
    auto* w = new TaskWorker(
        env, [replica, out]() { return replica->ListLayers(out.get()); },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array arr = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); ++i) arr.Set(static_cast<uint32_t>(i), LayerInfoToJs(env, (*out)[i]));
          return arr;
        });
    w->Pin(info.This());
    return w;
  });
}

Napi::Value ReplicaWrap::LayerExtents(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string layer_id = ToStr(Arg(info, 0), "layerId", 1, kMaxLayerIdBytes);
    auto replica = replica_;
    auto out = std::make_shared<std::vector<Range>>();
    auto* w = new TaskWorker(
        env,
        [replica, out, layer_id]() -> Status {
          Status st = replica->LayerExtents(layer_id, out.get());
          if (st.ok() && out->size() > kMaxLayerRanges) {
            const size_t n = out->size();
            out->clear();
            out->shrink_to_fit();
            return Status::Error(Code::kOutOfRange, "replica " + replica->id() + ": layer " + layer_id + " has " +
                                                        std::to_string(n) + " extents, more than the " +
                                                        std::to_string(kMaxLayerRanges) + " layerExtents returns");
          }
          return st;
        },
        [out](Napi::Env env) -> Napi::Value {
          Napi::Array arr = Napi::Array::New(env, out->size());
          for (size_t i = 0; i < out->size(); ++i) {
            Napi::Array pair = Napi::Array::New(env, 2);
            pair.Set(0u, JsNum(env, (*out)[i].off));
            pair.Set(1u, JsNum(env, (*out)[i].len));
            arr.Set(static_cast<uint32_t>(i), pair);
          }
          return arr;
        });
    w->Pin(info.This());
    return w;
  });
}

Napi::Value ReplicaWrap::AllocatedBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto closed = native_closed_;
    auto bytes = std::make_shared<uint64_t>(0);
    auto* w = new TaskWorker(
        env,
        [replica, closed, bytes]() -> Status {
          // The store answers 0 once closed; do not pass that off as a figure.
          if (closed->load()) return Status::Error(Code::kClosed, "replica " + replica->id() + " is closed", EBADF);
          *bytes = replica->AllocatedBytes();
          if (closed->load()) return Status::Error(Code::kClosed, "replica " + replica->id() + " is closed", EBADF);
          return Status::Ok();
        },
        [bytes](Napi::Env env) -> Napi::Value { return JsNum(env, *bytes); });
    w->Pin(info.This());
    return w;
  });
}

Napi::Value ReplicaWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    // Idempotent: Replica::Close is, and it waits for calls in flight (it takes the
    // replica's locks exclusively), so a second close() settles after the first.
    closing_ = true;
    auto replica = replica_;
    auto closed = native_closed_;
    auto* w = new TaskWorker(
        info.Env(),
        [replica, closed]() {
          // Set first: from here on a call that finds the replica closed under it answers
          // CLOSED. (The replica is closed even if its final flush fails.)
          closed->store(true);
          return replica->Close();
        },
        nullptr,
        [this](Napi::Env, const Status&) {
          if (closed_) return;
          closed_ = true;
          addon_->replicas.erase(replica_.get());
          Unref();
        });
    w->Pin(info.This());
    return w;
  });
}

}  // namespace mooring
