// ImageWrap: the JS NativeImage (src/native/binding.ts) around one opened ImageReader (a
// raw or qcow2 image with its backing chain), read-only.
//
// Lifecycle as ReplicaWrap: an open image keeps its JS object alive and is listed in
// AddonData for the exit cleanup hook; close() waits for calls in flight, closes every
// file of the chain and releases both. After close() every call rejects with CLOSED.
#pragma once

#include <napi.h>

#include <memory>

#include "binding/addon-data.h"
#include "binding/async-worker.h"
#include "image/image-reader.h"

namespace mooring {

struct ImageInit {
  std::shared_ptr<ImageReader> image;
};

class ImageWrap : public Napi::ObjectWrap<ImageWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6749ULL, 0x7c2e91d04b35a8f1ULL};
  static constexpr const char* kClassName = "NativeImage";
  // Largest single read; the same cap as the engine's.
  static constexpr uint32_t kMaxIoBytes = 32u << 20;
  // blockStatus returns at most this many extents.
  static constexpr uint32_t kMaxExtents = 1u << 16;

  static Napi::Function Define(Napi::Env env);
  // openImage(path, { format? }): opens on a pool thread, resolves with a NativeImage.
  static Napi::Value OpenImageJs(const Napi::CallbackInfo& info);

  explicit ImageWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Read(const Napi::CallbackInfo& info);
  Napi::Value BlockStatus(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  void CheckOpen() const;
  void CheckRange(uint64_t off, uint64_t len) const;

  AddonData* addon_ = nullptr;
  std::shared_ptr<ImageReader> image_;
  bool closing_ = false;  // close() called
  bool closed_ = false;   // close() completed
};

}  // namespace mooring
