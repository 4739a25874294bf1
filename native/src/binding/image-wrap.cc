#include "binding/image-wrap.h"

#include "binding/js-args.h"
#include "binding/js-values.h"

namespace mooring {
namespace {

// A data-path result of the image: the reader's own Status when it gave one (it names the
// structure at fault), else one built from the errno.
Status ImageRc(int rc, const Status& why, const std::string& what) {
  if (rc >= 0) return Status::Ok();
  if (!why.ok()) return why;
  if (rc == -kErrCorruptImage) return Status::Error(Code::kCorrupt, what + ": damaged image metadata", kErrCorruptImage);
  return StatusFromRc(rc, what);
}

Napi::Array ChainToJs(Napi::Env env, const std::vector<ImageLayerInfo>& chain) {
  Napi::Array arr = Napi::Array::New(env, chain.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("path", chain[i].path);
    o.Set("format", ImageFormatName(chain[i].format));
    o.Set("sizeBytes", JsNum(env, chain[i].size_bytes));
    o.Set("dataFile", chain[i].data_file);
    o.Set("dirty", chain[i].dirty);
    arr.Set(static_cast<uint32_t>(i), o);
  }
  return arr;
}

}  // namespace

Napi::Function ImageWrap::Define(Napi::Env env) {
  using W = ImageWrap;
  return DefineWithMethods<W>(env, {
                                       Method<W, &W::Read>(env, "read"),
                                       Method<W, &W::BlockStatus>(env, "blockStatus"),
                                       Method<W, &W::Close>(env, "close"),
                                   });
}

Napi::Value ImageWrap::OpenImageJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    AddonData* data = AddonData::Get(env);
    const std::string path = ToStr(Arg(info, 0), "path");
    ImageFormatRequest format = ImageFormatRequest::kAuto;
    Napi::Value opts = Arg(info, 1);
    if (!opts.IsUndefined()) {
      Napi::Value f = ToObject(opts, "options").Get("format");
      if (!f.IsUndefined() && !ParseImageFormatRequest(ToStr(f, "options.format", 1, 16), &format))
        throw ArgError("options.format", "'raw', 'qcow2' or 'auto'");
    }
    auto opened = std::make_shared<std::shared_ptr<ImageReader>>();
    return new TaskWorker(
        env,
        [path, format, opened]() -> Status {
          std::unique_ptr<ImageReader> image;
          Status st = OpenImage(path, format, &image);
          if (st.ok()) *opened = std::move(image);
          return st;
        },
        [data, opened](Napi::Env env) -> Napi::Value {
          // Registered before the wrapper exists, so even a failure below is cleaned up at exit.
          data->images[opened->get()] = *opened;
          return data->image_class.New(ImageInit{*opened});
        });
  });
}

ImageWrap::ImageWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ImageWrap>(info) {
  Napi::Env env = info.Env();
  ImageInit& init = TakePendingInit(env, &AddonData::image_class, "NativeImage is created by openImage(), not with new");
  addon_ = AddonData::Get(env);
  image_ = std::move(init.image);
  std::vector<ImageLayerInfo> chain;
  image_->DescribeChain(&chain);
  AdoptThis(this, info,
            {{"path", Napi::String::New(env, image_->path())},
             {"format", Napi::String::New(env, ImageFormatName(image_->format()))},
             {"sizeBytes", JsNum(env, image_->size())},
             {"chain", ChainToJs(env, chain)}});
}

void ImageWrap::CheckOpen() const {
  if (closing_) throw JsError(Code::kClosed, "image " + image_->path() + " is closed");
}

void ImageWrap::CheckRange(uint64_t off, uint64_t len) const {
  const uint64_t size = image_->size();
  if (!InRange(off, len, size))
    throw JsError(Code::kOutOfRange, "range [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                         ") is beyond the size " + std::to_string(size) + " of image " + image_->path());
}

Napi::Value ImageWrap::Read(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint32_t len = static_cast<uint32_t>(ToUint(Arg(info, 1), "length", kMaxIoBytes));
    CheckRange(off, len);
    auto image = image_;
    return PinnedReadTask(info, len, [image, off, len](uint8_t* buf) {
      Status why;
      const int rc = image->Read(off, len, buf, &why);
      return ImageRc(rc, why, "image " + image->path() + ": read of " + std::to_string(len) + " bytes at " + std::to_string(off));
    });
  });
}

Napi::Value ImageWrap::BlockStatus(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    CheckOpen();
    const uint64_t off = ToUint(Arg(info, 0), "offset");
    const uint64_t len = ToUint(Arg(info, 1), "length");
    if (len == 0) throw ArgError("length", "at least 1");
    CheckRange(off, len);
    auto image = image_;
    auto out = std::make_shared<std::vector<Extent>>();
    return PinnedTask(
        info,
        [image, out, off, len]() -> Status {
          Status why;
          const int rc = image->BlockStatus(off, len, kMaxExtents, out.get(), &why);
          return ImageRc(rc, why, "image " + image->path() + ": block status at " + std::to_string(off));
        },
        [out](Napi::Env env) -> Napi::Value { return ExtentsToJs(env, *out); });
  });
}

Napi::Value ImageWrap::Close(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    // Idempotent: ImageReader::Close is, and it waits for calls in flight.
    closing_ = true;
    auto image = image_;
    return PinnedTask(
        info,
        [image]() {
          image->Close();
          return Status::Ok();
        },
        nullptr,
        [this](Napi::Env, const Status&) {
          if (closed_) return;
          closed_ = true;
          addon_->images.erase(image_.get());
          Unref();
        });
  });
}

}  // namespace mooring
