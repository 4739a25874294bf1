// ZstdLibrary: the zstd decoder (libzstd.so.1) opened with dlopen on first use. Node 20
// has no zstd, and a link-time dependency would stop the addon from loading on hosts
// without the library; this way only a zstd-compressed qcow2 image fails there, with an
// UNSUPPORTED error naming the package (docs/dependencies.md).
//
// Only the stable streaming-decoder API (zstd >= 1.4) is used; the few declarations it
// needs are written here from the library's documented ABI, so no header is needed to build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooring {

class ZstdLibrary {
 public:
  static constexpr const char* kSoname = "libzstd.so.1";
  static constexpr const char* kPackage = "libzstd1";
  // Overrides the library path (tests use it to simulate a host without zstd).
  static constexpr const char* kPathEnv = "MOORING_ZSTD_LIBRARY";

  // ZSTD_inBuffer / ZSTD_outBuffer (zstd.h), laid out as the library expects.
  struct InBuffer {
    const void* src;
    size_t size;
    size_t pos;
  };
  struct OutBuffer {
    void* dst;
    size_t size;
    size_t pos;
  };
  // ZSTD_d_windowLogMax and ZSTD_reset_session_only (zstd.h enums).
  static constexpr int kParamWindowLogMax = 100;
  static constexpr int kResetSessionOnly = 1;

  // The loaded library, or nullptr with *error saying why and what to install. Loads once
  // per process; thread-safe; stays loaded until exit.
  static const ZstdLibrary* Get(std::string* error);

  void* (*create_dctx)() = nullptr;
  size_t (*free_dctx)(void*) = nullptr;
  size_t (*dctx_reset)(void*, int reset) = nullptr;
  size_t (*dctx_set_parameter)(void*, int param, int value) = nullptr;
  size_t (*decompress_stream)(void*, OutBuffer*, InBuffer*) = nullptr;
  unsigned (*is_error)(size_t) = nullptr;
  const char* (*get_error_name)(size_t) = nullptr;

 private:
  bool Load(std::string* error);
  void* handle_ = nullptr;
};

}  // namespace mooring
