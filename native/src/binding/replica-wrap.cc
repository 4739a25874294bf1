#include "binding/replica-wrap.h"

#include "binding/js-args.h"
#include "binding/js-values.h"

namespace mooring {
namespace {

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
                                  Getter<W, &W::SizeBytes>("sizeBytes"),
                                  Method<W, &W::Epoch>(env, "epoch"),
                                  Method<W, &W::Grow>(env, "grow"),
                                  Method<W, &W::Clean>(env, "clean"),
                                  Method<W, &W::ClaimEpoch>(env, "claimEpoch"),
                                  Method<W, &W::SetReplicaSet>(env, "setReplicaSet"),
                                  Method<W, &W::LastRw>(env, "lastRw"),
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

ReplicaWrap::ReplicaWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ReplicaWrap>(info) {
  Napi::Env env = info.Env();
  ReplicaInit& init =
      TakePendingInit(env, &AddonData::replica_class, "NativeReplica is created by openReplica(), not with new");
  addon_ = AddonData::Get(env);
  replica_ = std::move(init.replica);
  native_closed_ = std::make_shared<std::atomic<bool>>(false);
  AdoptThis(this, info, {{"id", Napi::String::New(env, replica_->id())}});
}

void ReplicaWrap::CheckOpen() const {
  if (closing_) throw JsError(Code::kClosed, "replica " + replica_->id() + " is closed");
}

void ReplicaWrap::CheckRange(uint64_t off, uint64_t len) const {
  const uint64_t size = replica_->size();
  if (!InRange(off, len, size))
    throw JsError(Code::kOutOfRange, "range [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                         ") is beyond the size " + std::to_string(size) + " of replica " +
                                         replica_->id());
}

Napi::Value ReplicaWrap::Epoch(const Napi::CallbackInfo& info) { return JsNum(info.Env(), replica_->epoch()); }

Napi::Value ReplicaWrap::SizeBytes(const Napi::CallbackInfo& info) { return JsNum(info.Env(), replica_->size()); }

Napi::Value ReplicaWrap::Grow(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t size = ToUint(Arg(info, 0), "sizeBytes");
    auto replica = replica_;
    return PinnedTask(info, [replica, size]() { return replica->Grow(size); });
  });
}

Napi::Value ReplicaWrap::Clean(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), replica_->clean());
}

Napi::Value ReplicaWrap::ClaimEpoch(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t epoch = ToUint(Arg(info, 0), "epoch");
    auto replica = replica_;
    auto stored = std::make_shared<ReplicaSet>();
    return PinnedTask(
        info, [replica, epoch, stored]() { return replica->ClaimEpoch(epoch, stored.get(), nullptr); },
        [stored](Napi::Env env) -> Napi::Value {
          if (stored->empty()) return env.Null();
          Napi::Object o = Napi::Object::New(env);
          o.Set("epoch", JsNum(env, stored->epoch));
          o.Set("generation", JsNum(env, stored->generation));
          for (const auto* names : {&stored->members, &stored->rw}) {
            Napi::Array a = Napi::Array::New(env, names->size());
            for (size_t i = 0; i < names->size(); ++i) a.Set(static_cast<uint32_t>(i), (*names)[i]);
            o.Set(names == &stored->members ? "members" : "rw", a);
          }
          return o;
        });
  });
}

Napi::Value ReplicaWrap::SetReplicaSet(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    Napi::Object o = ToObject(Arg(info, 0), "replicaSet");
    ReplicaSet set;
    set.epoch = ToUint(o.Get("epoch"), "replicaSet.epoch");
    set.generation = ToUint(o.Get("generation"), "replicaSet.generation");
    for (auto* names : {&set.members, &set.rw}) {
      const char* key = names == &set.members ? "members" : "rw";
      Napi::Value v = o.Get(key);
      if (!v.IsArray() || v.As<Napi::Array>().Length() > ReplicaSet::kMaxMembers)
        throw ArgError(std::string("replicaSet.") + key, "an array of at most " + std::to_string(ReplicaSet::kMaxMembers) + " names");
      Napi::Array a = v.As<Napi::Array>();
      for (uint32_t i = 0; i < a.Length(); ++i)
        names->push_back(ToStr(a.Get(i), std::string("replicaSet.") + key, 1, ReplicaSet::kMaxNameBytes));
    }
    const Napi::Value self = info.Length() > 1 ? info[1] : info.Env().Undefined();
    if (!self.IsUndefined() && !self.IsBoolean()) throw ArgError("selfRw", "a boolean");
    const bool self_rw = self.IsBoolean() && self.As<Napi::Boolean>().Value();
    auto replica = replica_;
    return PinnedTask(info, [replica, set, self_rw]() { return replica->SetReplicaSet(set, self_rw); });
  });
}

Napi::Value ReplicaWrap::LastRw(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto last = std::make_shared<ReplicaSetId>();
    return PinnedTask(
        info, [replica, last]() { return replica->LastRw(last.get()); },
        [last](Napi::Env env) -> Napi::Value {
          if (last->empty()) return env.Null();
          Napi::Object o = Napi::Object::New(env);
          o.Set("epoch", JsNum(env, last->epoch));
          o.Set("generation", JsNum(env, last->generation));
          return o;
        });
  });
}

Napi::Value ReplicaWrap::Read(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint32_t len = static_cast<uint32_t>(ToUint(Arg(info, 1), "length", kMaxIoBytes));
    CheckRange(off, len);
    auto replica = replica_;
    auto closed = native_closed_;
    return PinnedReadTask(info, len, [replica, closed, off, len](uint8_t* buf) {
      return ReplicaRc(replica->Read(off, len, buf), *closed,
                       "replica " + replica->id() + ": read of " + std::to_string(len) + " bytes at " +
                           std::to_string(off));
    });
  });
}

Napi::Value ReplicaWrap::Write(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t epoch = ToUint(Arg(info, 0), "epoch");
    const uint64_t off = ToUint(Arg(info, 1), "offset");
    Napi::Uint8Array bytes = ToBytes(Arg(info, 2), "data", kMaxIoBytes);
    const uint32_t len = static_cast<uint32_t>(bytes.ByteLength());
    CheckRange(off, len);
    const uint8_t* p = bytes.Data();
    auto replica = replica_;
    auto closed = native_closed_;
    auto* w = PinnedTask(info, [replica, closed, p, epoch, off, len]() {
      // One replica reads the bytes once, so unlike the engine no private copy is needed.
      return ReplicaRc(replica->Write(epoch, off, len, p, false), *closed,
                       "replica " + replica->id() + ": write of " + std::to_string(len) + " bytes at " +
                           std::to_string(off) + " (epoch " + std::to_string(epoch) + ")");
    });
    w->Pin(bytes);  // the bytes stay valid until the promise settles
    return w;
  });
}

Napi::Value ReplicaWrap::Flush(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto closed = native_closed_;
    return PinnedTask(info, [replica, closed]() {
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
    return PinnedTask(
        info,
        [replica, closed, out, off, len]() -> Status {
          // The store takes 64-bit lengths and stops at the extent limit itself.
          return ReplicaRc(replica->BlockStatus(off, len, kMaxExtents, out.get()), *closed,
                           "replica " + replica->id() + ": block status at " + std::to_string(off));
        },
        [out](Napi::Env env) -> Napi::Value { return ExtentsToJs(env, *out); });
  });
}

Napi::Value ReplicaWrap::ListLayers(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto out = std::make_shared<std::vector<LayerInfo>>();
    return PinnedTask(
        info, [replica, out]() { return replica->ListLayers(out.get()); },
        [out](Napi::Env env) -> Napi::Value { return LayerInfosToJs(env, *out); });
  });
}

Napi::Value ReplicaWrap::LayerExtents(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    const std::string layer_id = ToStr(Arg(info, 0), "layerId", 1, kMaxLayerIdBytes);
    auto replica = replica_;
    auto out = std::make_shared<std::vector<Range>>();
    return PinnedTask(
        info,
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
        [out](Napi::Env env) -> Napi::Value { return RangesToJs(env, *out); });
  });
}

Napi::Value ReplicaWrap::AllocatedBytes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    CheckOpen();
    auto replica = replica_;
    auto closed = native_closed_;
    auto bytes = std::make_shared<uint64_t>(0);
    return PinnedTask(
        info,
        [replica, closed, bytes]() -> Status {
          // The store answers 0 once closed; do not pass that off as a figure.
          if (closed->load()) return Status::Error(Code::kClosed, "replica " + replica->id() + " is closed", EBADF);
          *bytes = replica->AllocatedBytes();
          if (closed->load()) return Status::Error(Code::kClosed, "replica " + replica->id() + " is closed", EBADF);
          return Status::Ok();
        },
        [bytes](Napi::Env env) -> Napi::Value { return JsNum(env, *bytes); });
  });
}

Napi::Value ReplicaWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    // Idempotent: Replica::Close is, and it waits for calls in flight (it takes the
    // replica's locks exclusively), so a second close() settles after the first.
    closing_ = true;
    auto replica = replica_;
    auto closed = native_closed_;
    return PinnedTask(
        info,
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
  });
}

}  // namespace mooring
