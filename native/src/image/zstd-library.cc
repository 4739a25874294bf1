#include "image/zstd-library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace mooring {
namespace {

template <typename Fn>
void Bind(void* handle, const char* symbol, Fn* out, std::string* missing) {
  void* p = dlsym(handle, symbol);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
    return;
  }
  *out = reinterpret_cast<Fn>(p);
}

}  // namespace

bool ZstdLibrary::Load(std::string* error) {
  const char* override_path = std::getenv(kPathEnv);
  const std::string name = override_path != nullptr && *override_path != '\0' ? override_path : kSoname;
  handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    *error = "the zstd library " + name + " cannot be loaded (" + (why != nullptr ? why : "unknown error") +
             "); install the Debian/Ubuntu package " + kPackage + " to read zstd-compressed qcow2 images";
    return false;
  }
  std::string missing;
  Bind(handle_, "ZSTD_createDCtx", &create_dctx, &missing);
  Bind(handle_, "ZSTD_freeDCtx", &free_dctx, &missing);
  Bind(handle_, "ZSTD_DCtx_reset", &dctx_reset, &missing);
  Bind(handle_, "ZSTD_DCtx_setParameter", &dctx_set_parameter, &missing);
  Bind(handle_, "ZSTD_decompressStream", &decompress_stream, &missing);
  Bind(handle_, "ZSTD_isError", &is_error, &missing);
  Bind(handle_, "ZSTD_getErrorName", &get_error_name, &missing);
  if (!missing.empty()) {
    *error = name + " lacks " + missing + " (zstd 1.4 or newer is needed; install " + kPackage + ")";
    dlclose(handle_);
    handle_ = nullptr;
    return false;
  }
  return true;
}

const ZstdLibrary* ZstdLibrary::Get(std::string* error) {
  // Loaded once; a failed load is remembered, so every later call reports the same reason.
  static std::once_flag once;
  static ZstdLibrary* lib = nullptr;
  static std::string load_error;
  std::call_once(once, []() {
    auto* l = new ZstdLibrary();  // never freed: its function pointers are used until exit
    if (l->Load(&load_error)) {
      lib = l;
    } else {
      delete l;
    }
  });
  if (lib == nullptr && error != nullptr) *error = load_error;
  return lib;
}

}  // namespace mooring
