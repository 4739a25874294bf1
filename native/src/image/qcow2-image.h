// Qcow2Image: a qcow2 image (v2 or v3) read through its L1/L2 tables: data, zero and
// unallocated clusters and subclusters (extended L2 entries), deflate and zstd compressed
// clusters, an external data file, and a backing image below (any ImageReader).
//
// Every table entry is checked where it is used: offsets aligned, inside the file they
// point into, and clear of the image's own metadata (header cluster, L1 table, refcount
// table, L2 tables). A bad entry fails the call with -kErrCorruptImage; nothing is read
// from outside a file and no buffer exceeds a cluster (or two, for compressed input).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "image/cluster-cache.h"
#include "image/cluster-decompressor.h"
#include "image/image-file.h"
#include "image/image-reader.h"
#include "image/qcow2-header.h"
#include "util/rw-lock.h"

namespace mooring {

class Qcow2Image final : public ImageReader {
 public:
  // What the opener (OpenImage) has prepared: the file and its parsed header, the opened
  // data file and backing image, and the caches the chain shares.
  struct Parts {
    std::unique_ptr<ImageFile> file;
    Qcow2Header header;
    std::unique_ptr<ImageFile> data_file;  // null: data clusters are in `file`
    std::unique_ptr<ImageReader> backing;  // null: unallocated clusters read as zeros
    std::shared_ptr<ClusterCache> l2_cache;
    std::shared_ptr<ClusterCache> cluster_cache;
  };

  // Loads the active L1 table and checks every entry. `l1_budget_bytes` is what the chain
  // may still spend on L1 tables; this image's share is taken from it.
  static Status Open(Parts parts, uint64_t* l1_budget_bytes, std::unique_ptr<Qcow2Image>* out);

  ~Qcow2Image() override;

  uint64_t size() const override { return size_; }
  ImageFormat format() const override { return ImageFormat::kQcow2; }
  const std::string& path() const override { return file_->path(); }
  int Read(uint64_t off, uint32_t len, uint8_t* buf, Status* why = nullptr) override;
  int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out,
                  Status* why = nullptr) override;
  void DescribeChain(std::vector<ImageLayerInfo>* out) const override;
  void Close() override;

 private:
  // What a guest range maps to.
  enum class Kind { kData, kZero, kUnallocated, kCompressed };
  // A run of guest bytes [off, off+len) that all map the same way. kData: `host` is the
  // host offset of `off` (contiguous for the whole run). kCompressed: one cluster whose
  // compressed bytes are [host, host+comp_len).
  struct Run {
    Kind kind;
    uint64_t len;
    uint64_t host;
    uint64_t comp_len;
  };
  // One cluster or subcluster's mapping at guest offset `pos`, and where it ends.
  struct Piece {
    Kind kind;
    uint64_t host;
    uint64_t comp_len;
    uint64_t end;
  };

  explicit Qcow2Image(Parts parts);

  int MapRun(uint64_t off, uint64_t max_len, Run* run, Status* why);
  int Classify(const uint8_t* entry, uint64_t pos, uint64_t l2_offset, Piece* piece, Status* why) const;
  int LoadL2(uint64_t l2_offset, ClusterCache::Block* out, Status* why);
  int LoadCompressed(uint64_t host, uint64_t comp_len, ClusterCache::Block* out, Status* why);
  int ReadLocked(uint64_t off, uint32_t len, uint8_t* buf, Status* why);
  int BlockStatusLocked(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out, Status* why);
  // Whether [off, off+len) of the image file touches its own metadata.
  bool OverlapsMetadata(uint64_t off, uint64_t len) const;
  int Corrupt(Status* why, const std::string& what) const;

  std::unique_ptr<ImageFile> file_;
  Qcow2Header header_;
  std::unique_ptr<ImageFile> data_file_;
  std::unique_ptr<ImageReader> backing_;
  std::shared_ptr<ClusterCache> l2_cache_;
  std::shared_ptr<ClusterCache> cluster_cache_;
  std::unique_ptr<ClusterDecompressor> decompressor_;
  uint32_t l2_owner_ = 0;
  uint32_t cluster_owner_ = 0;

  uint64_t size_ = 0;          // virtual size as served (a multiple of 512)
  uint32_t cluster_bits_ = 0;
  uint64_t cluster_size_ = 0;
  uint32_t l2_bits_ = 0;       // log2(entries per L2 table)
  uint64_t l2_entry_bytes_ = 0;
  std::vector<uint64_t> l1_;   // the entries the virtual size needs, host byte order
  std::vector<uint64_t> l2_offsets_;  // sorted, distinct: where the L2 tables are
  uint64_t l1_bytes_charged_ = 0;

  RwLock close_lock_;  // shared by calls, exclusive by Close
  bool closed_ = false;
};

}  // namespace mooring
