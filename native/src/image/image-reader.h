// ImageReader: a read-only disk image (raw or qcow2, with its backing chain) as the bottom
// layer of a volume. Every image is hostile input (DESIGN.md invariant 5): its metadata is
// checked against the file sizes and the limits below before it is used, and a problem is
// a coded error, never a crash, never unbounded memory. Rules: docs/image-reader.md.
//
// Thread safety: Read and BlockStatus may run concurrently on any threads. Close waits for
// calls in flight, then closes every file of the chain; later calls return -ESHUTDOWN.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block/block-device.h"
#include "util/status.h"

namespace mooring {

// The data path reports damaged or hostile image metadata with this errno (the kernel's
// "structure needs cleaning", EFSCORRUPTED), so that it maps to CORRUPT_METADATA and not to
// a plain I/O error.
constexpr int kErrCorruptImage = EUCLEAN;

// --- Limits (docs/image-reader.md lists them with their reasons) ---
// Images in one chain, the top included.
constexpr uint32_t kImageChainDepthMax = 16;
// Longest backing file or data file name stored in a qcow2 image (the qcow2 spec's limit).
constexpr size_t kImageFileNameBytesMax = 1023;
// Largest virtual size served: JS numbers address bytes exactly up to 2^53.
constexpr uint64_t kImageSizeBytesMax = (1ull << 53) - 4096;
// Largest active L1 table of one qcow2 image (QEMU's own limit), and of a whole chain.
constexpr uint64_t kQcow2L1BytesMax = 32ull << 20;
constexpr uint64_t kChainL1BytesMax = 64ull << 20;
// Largest refcount table accepted (QEMU's limit); only its position is used, for overlap checks.
constexpr uint64_t kQcow2RefcountTableBytesMax = 8ull << 20;
// Header extensions parsed before the image is refused.
constexpr uint32_t kQcow2HeaderExtensionsMax = 1024;
// Cluster sizes supported: 512 B .. 2 MiB (QEMU's range).
constexpr uint32_t kQcow2ClusterBitsMin = 9;
constexpr uint32_t kQcow2ClusterBitsMax = 21;
// Memory shared by the qcow2 images of one chain: cached L2 tables and decompressed clusters.
constexpr size_t kL2CacheBytesMax = 32u << 20;
constexpr size_t kDecompressedCacheBytesMax = 8u << 20;
// zstd: largest window a compressed cluster may declare (bounds the decoder's memory; a
// 2 MiB cluster compressed by QEMU declares at most 2^21).
constexpr int kZstdWindowLogMax = 23;
// One BlockStatus call examines at most this many clusters and returns early after them
// (callers continue from where it stopped).
constexpr uint64_t kBlockStatusClustersMax = 1ull << 20;

enum class ImageFormat { kRaw, kQcow2 };
// How the caller wants the top image read: probed, or forced.
enum class ImageFormatRequest { kAuto, kRaw, kQcow2 };

inline const char* ImageFormatName(ImageFormat f) { return f == ImageFormat::kQcow2 ? "qcow2" : "raw"; }

// One file of an opened chain, top first (ImageReader::chain()).
struct ImageLayerInfo {
  std::string path;       // as opened (the top as given; backing files resolved)
  ImageFormat format;
  uint64_t size_bytes;    // virtual size this layer reports
  std::string data_file;  // qcow2 external data file, '' if none
  bool dirty = false;     // qcow2 dirty bit (refcounts may be stale; reads are unaffected)
};

class ImageReader {
 public:
  virtual ~ImageReader() = default;

  // Virtual size in bytes, a multiple of 512 as QEMU reports it: raw rounds the file size
  // up (the tail reads as zeros), qcow2 rounds the header's size down (docs/image-reader.md).
  virtual uint64_t size() const = 0;
  virtual ImageFormat format() const = 0;
  virtual const std::string& path() const = 0;

  // Reads [off, off+len); the range must lie inside size(). 0 or a negative errno:
  // -kErrCorruptImage for damaged metadata, -ENOTSUP for a feature this build lacks,
  // -ESHUTDOWN after Close. When `why` is given, a failure also fills it with a message
  // naming the image and the offending structure.
  virtual int Read(uint64_t off, uint32_t len, uint8_t* buf, Status* why = nullptr) = 0;

  // Allocation of [off, off+len) as NBD base:allocation extents: 0 = data, kExtentZero =
  // zeros recorded in the image (a zero cluster or subcluster), kExtentHole|kExtentZero =
  // nothing recorded at any layer of the chain (reads as zeros). Adjacent extents differ.
  // At most max_extents extents; their lengths sum to at most len (less when a limit
  // stopped the scan) and at least one byte.
  virtual int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out,
                          Status* why = nullptr) = 0;

  // The chain, this image first.
  virtual void DescribeChain(std::vector<ImageLayerInfo>* out) const = 0;

  // Waits for calls in flight, closes the files of the whole chain. Idempotent.
  virtual void Close() = 0;
};

// Opens `path` and, for qcow2, its backing chain and data file. Names stored in images are
// resolved beneath the directory of `path` and never leave it (docs/image-reader.md).
Status OpenImage(const std::string& path, ImageFormatRequest format, std::unique_ptr<ImageReader>* out);

// Parses a format name: "raw", "qcow2" or "auto". False for anything else.
bool ParseImageFormatRequest(const std::string& name, ImageFormatRequest* out);

}  // namespace mooring
