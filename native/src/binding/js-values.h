// Native results as JS values, shaped as typed in src/native/binding.ts. JS thread only,
// except the read itself in PinnedReadTask.
#pragma once

#include <napi.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "binding/async-worker.h"
#include "block/block-device.h"
#include "block/replica-backend.h"
#include "util/status.h"

namespace mooring {

// A uint64 as a JS number. Values above 2^53 lose precision; volumes are capped below it.
inline Napi::Number JsNum(Napi::Env env, uint64_t v) { return Napi::Number::New(env, static_cast<double>(v)); }

// NativeLayerInfo.
inline Napi::Object LayerInfoToJs(Napi::Env env, const LayerInfo& l) {
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

// NativeLayerInfo[].
inline Napi::Array LayerInfosToJs(Napi::Env env, const std::vector<LayerInfo>& layers) {
  Napi::Array arr = Napi::Array::New(env, layers.size());
  for (size_t i = 0; i < layers.size(); ++i) arr.Set(static_cast<uint32_t>(i), LayerInfoToJs(env, layers[i]));
  return arr;
}

// NativeExtent[].
inline Napi::Array ExtentsToJs(Napi::Env env, const std::vector<Extent>& extents) {
  Napi::Array arr = Napi::Array::New(env, extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("length", JsNum(env, extents[i].length));
    o.Set("flags", Napi::Number::New(env, extents[i].flags));
    arr.Set(static_cast<uint32_t>(i), o);
  }
  return arr;
}

// Allocated [offset, length] pairs, as layerExtents returns them.
inline Napi::Array RangesToJs(Napi::Env env, const std::vector<Range>& ranges) {
  Napi::Array arr = Napi::Array::New(env, ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    Napi::Array pair = Napi::Array::New(env, 2);
    pair.Set(0u, JsNum(env, ranges[i].off));
    pair.Set(1u, JsNum(env, ranges[i].len));
    arr.Set(static_cast<uint32_t>(i), pair);
  }
  return arr;
}

// The bytes of a read: filled on a pool thread in malloc'd memory, which the Buffer that
// ToJs() returns on the JS thread then owns, so the data is never copied.
class ReadBuffer {
 public:
  ReadBuffer() = default;
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  ~ReadBuffer() { std::free(p_); }

  // Pool thread, before the read.
  Status Allocate(uint32_t len) {
    p_ = static_cast<uint8_t*>(std::malloc(len > 0 ? len : 1));
    if (p_ == nullptr) return Status::Error(Code::kIoError, "out of memory", ENOMEM);
    return Status::Ok();
  }
  uint8_t* data() { return p_; }

  // JS thread, after a successful read: hands the memory to a Buffer of `len` bytes.
  Napi::Value ToJs(Napi::Env env, uint32_t len) {
    uint8_t* p = p_;
    p_ = nullptr;
    return Napi::Buffer<uint8_t>::NewOrCopy(env, p, len, [](Napi::Env, uint8_t* d) { std::free(d); });
  }

 private:
  uint8_t* p_ = nullptr;
};

// A read of `len` bytes for a method of a wrapped object (pinned like PinnedTask): `read`
// fills the memory it is given on a pool thread; the promise resolves with a Buffer of it.
inline TaskWorker* PinnedReadTask(const Napi::CallbackInfo& info, uint32_t len,
                                  std::function<Status(uint8_t*)> read) {
  auto buf = std::make_shared<ReadBuffer>();
  return PinnedTask(
      info,
      [buf, len, read = std::move(read)]() -> Status {
        Status st = buf->Allocate(len);
        if (!st.ok()) return st;
        return read(buf->data());
      },
      [buf, len](Napi::Env env) -> Napi::Value { return buf->ToJs(env, len); });
}

}  // namespace mooring
