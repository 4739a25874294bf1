// ClusterDecompressor: turns one compressed qcow2 cluster back into exactly one cluster of
// bytes, with deflate (raw, no zlib header) or zstd.
//
// The output buffer is the cluster: decompression can never write more, so a
// decompression bomb costs at most one cluster of CPU and memory. A stream that would
// produce more than a cluster, or ends before filling one, is corrupt (-kErrCorruptImage).
// zlib comes from the Node binary the addon runs in (the fuzz harness links libz);
// zstd is loaded with dlopen (ZstdLibrary).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace mooring {

class ClusterDecompressor {
 public:
  enum class Type { kDeflate, kZstd };

  // For zstd, fails with UNSUPPORTED (naming the package) when libzstd cannot be loaded.
  static Status Create(Type type, std::unique_ptr<ClusterDecompressor>* out);

  // Decompresses `in` (the compressed bytes, possibly followed by unrelated bytes up to the
  // end of their last sector) into exactly `out_len` bytes at `out`. 0, or
  // -kErrCorruptImage (or -ENOMEM) with *why saying what is wrong.
  int Decompress(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len, std::string* why) const;

  Type type() const { return type_; }

 private:
  explicit ClusterDecompressor(Type type) : type_(type) {}
  int Inflate(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len, std::string* why) const;
  int Unzstd(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len, std::string* why) const;

  Type type_;
};

}  // namespace mooring
