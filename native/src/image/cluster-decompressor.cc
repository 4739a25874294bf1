#include "image/cluster-decompressor.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "image/image-reader.h"
#include "image/zstd-library.h"

namespace mooring {
namespace {

// Idle decoder states kept for reuse, per kind, for the whole process. Creating one per
// cluster costs allocations (zlib: ~40 KiB; zstd: its window) on every compressed read.
constexpr size_t kIdleDecodersMax = 4;

// inflate's window: raw deflate (negative) with the largest window, so streams written
// with any window size decode (QEMU writes with 2^12).
constexpr int kInflateWindowBits = -15;

class InflatePool {
 public:
  // A z_stream ready for a new raw-deflate stream, or null if zlib could not allocate.
  z_stream* Take() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!idle_.empty()) {
        z_stream* s = idle_.back();
        idle_.pop_back();
        return s;
      }
    }
    auto* s = new z_stream;
    std::memset(s, 0, sizeof *s);
    if (inflateInit2(s, kInflateWindowBits) != Z_OK) {
      delete s;
      return nullptr;
    }
    return s;
  }
  void Give(z_stream* s) {
    if (inflateReset(s) == Z_OK) {
      std::lock_guard<std::mutex> lk(mu_);
      if (idle_.size() < kIdleDecodersMax) {
        idle_.push_back(s);
        return;
      }
    }
    inflateEnd(s);
    delete s;
  }

 private:
  std::mutex mu_;
  std::vector<z_stream*> idle_;
};

class ZstdPool {
 public:
  void* Take(const ZstdLibrary* lib) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!idle_.empty()) {
        void* d = idle_.back();
        idle_.pop_back();
        return d;
      }
    }
    void* d = lib->create_dctx();
    if (d == nullptr) return nullptr;
    // Bounds the window a hostile frame can make the decoder allocate.
    if (lib->is_error(lib->dctx_set_parameter(d, ZstdLibrary::kParamWindowLogMax, kZstdWindowLogMax))) {
      lib->free_dctx(d);
      return nullptr;
    }
    return d;
  }
  void Give(const ZstdLibrary* lib, void* d) {
    if (!lib->is_error(lib->dctx_reset(d, ZstdLibrary::kResetSessionOnly))) {
      std::lock_guard<std::mutex> lk(mu_);
      if (idle_.size() < kIdleDecodersMax) {
        idle_.push_back(d);
        return;
      }
    }
    lib->free_dctx(d);
  }

 private:
  std::mutex mu_;
  std::vector<void*> idle_;
};

// Leaked on purpose: pooled states may be handed back by threads still running at exit.
InflatePool& Inflaters() {
  static auto* pool = new InflatePool();
  return *pool;
}
ZstdPool& ZstdDecoders() {
  static auto* pool = new ZstdPool();
  return *pool;
}

int Corrupt(std::string* why, const std::string& msg) {
  if (why != nullptr) *why = msg;
  return -kErrCorruptImage;
}

}  // namespace

Status ClusterDecompressor::Create(Type type, std::unique_ptr<ClusterDecompressor>* out) {
  if (type == Type::kZstd) {
    std::string error;
    if (ZstdLibrary::Get(&error) == nullptr) return Status::Error(Code::kUnsupported, error);
  }
  out->reset(new ClusterDecompressor(type));
  return Status::Ok();
}

int ClusterDecompressor::Decompress(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len,
                                    std::string* why) const {
  return type_ == Type::kZstd ? Unzstd(in, in_len, out, out_len, why) : Inflate(in, in_len, out, out_len, why);
}

int ClusterDecompressor::Inflate(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len,
                                 std::string* why) const {
  z_stream* s = Inflaters().Take();
  if (s == nullptr) {
    if (why != nullptr) *why = "zlib cannot allocate a decoder";
    return -ENOMEM;
  }
  s->next_in = const_cast<Bytef*>(in);
  s->avail_in = static_cast<uInt>(in_len);
  s->next_out = out;
  s->avail_out = static_cast<uInt>(out_len);
  int ret = inflate(s, Z_FINISH);
  int rc = 0;
  if (ret == Z_STREAM_END) {
    if (s->avail_out != 0)
      rc = Corrupt(why, "deflate stream ends after " + std::to_string(out_len - s->avail_out) +
                            " bytes, short of the cluster size " + std::to_string(out_len));
  } else if ((ret == Z_OK || ret == Z_BUF_ERROR) && s->avail_out == 0) {
    // The cluster is full but the stream has not ended: it either ends right here (its
    // end marker still unread) or would produce more than a cluster, a decompression bomb.
    uint8_t extra[1];
    s->next_out = extra;
    s->avail_out = sizeof extra;
    ret = inflate(s, Z_FINISH);
    if (s->avail_out == 0)
      rc = Corrupt(why, "deflate stream decompresses to more than the cluster size " + std::to_string(out_len));
    else if (ret != Z_STREAM_END && ret != Z_BUF_ERROR)
      rc = Corrupt(why, std::string("deflate stream is damaged after a full cluster: ") + (s->msg ? s->msg : "zlib error"));
  } else if (ret == Z_OK || ret == Z_BUF_ERROR) {
    rc = Corrupt(why, "compressed data ends after " + std::to_string(out_len - s->avail_out) +
                          " bytes, before a full cluster of " + std::to_string(out_len));
  } else if (ret == Z_MEM_ERROR) {
    if (why != nullptr) *why = "zlib is out of memory";
    rc = -ENOMEM;
  } else {
    rc = Corrupt(why, std::string("deflate stream is damaged: ") + (s->msg ? s->msg : "zlib error " + std::to_string(ret)));
  }
  Inflaters().Give(s);
  return rc;
}

int ClusterDecompressor::Unzstd(const uint8_t* in, size_t in_len, uint8_t* out, size_t out_len,
                                std::string* why) const {
  std::string error;
  const ZstdLibrary* lib = ZstdLibrary::Get(&error);
  if (lib == nullptr) {
    if (why != nullptr) *why = error;
    return -ENOTSUP;
  }
  void* d = ZstdDecoders().Take(lib);
  if (d == nullptr) {
    if (why != nullptr) *why = "zstd cannot allocate a decoder";
    return -ENOMEM;
  }
  ZstdLibrary::InBuffer ib{in, in_len, 0};
  ZstdLibrary::OutBuffer ob{out, out_len, 0};
  size_t ret = 1;
  int rc = 0;
  // A cluster may span several frames: decode until it is full. Each step must make
  // progress, or the input ended before a full cluster.
  while (ob.pos < ob.size) {
    const size_t in_before = ib.pos;
    const size_t out_before = ob.pos;
    ret = lib->decompress_stream(d, &ob, &ib);
    if (lib->is_error(ret)) {
      rc = Corrupt(why, std::string("zstd data is damaged: ") + lib->get_error_name(ret));
      break;
    }
    if (ib.pos == in_before && ob.pos == out_before) {
      rc = Corrupt(why, "compressed data ends after " + std::to_string(ob.pos) + " bytes, before a full cluster of " +
                            std::to_string(out_len));
      break;
    }
  }
  // A full cluster must also be the end of its frame; otherwise the frame holds more than a
  // cluster (a decompression bomb) or is cut short.
  if (rc == 0 && ret != 0)
    rc = Corrupt(why, "zstd frame does not end at the cluster size " + std::to_string(out_len) +
                          " (it decompresses to more, or is truncated)");
  ZstdDecoders().Give(lib, d);
  return rc;
}

}  // namespace mooring
