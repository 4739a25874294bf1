#include "image/qcow2-image.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>

namespace mooring {
namespace {

// L1 and standard L2 entries: bits 9-55 hold a host offset.
constexpr uint64_t kOffsetMask = 0x00fffffffffffe00ull;
constexpr uint64_t kL2Copied = 1ull << 63;
constexpr uint64_t kL2Compressed = 1ull << 62;
constexpr uint64_t kL2ZeroFlag = 1ull << 0;
constexpr uint32_t kSubclusters = 32;
// L1 entries read per pread while loading the table.
constexpr size_t kL1ReadEntries = 8192;
// Runs one BlockStatus call maps before it returns what it has.
constexpr uint32_t kBlockStatusRunsMax = 1u << 16;

std::string Num(uint64_t v) { return std::to_string(v); }

// The status of subcluster `sc` in an extended L2 bitmap: 0 unallocated, 1 allocated, 2 zero.
inline int SubclusterState(uint64_t bitmap, uint32_t sc) {
  if ((bitmap >> sc) & 1) return 1;
  if ((bitmap >> (sc + kSubclusters)) & 1) return 2;
  return 0;
}

}  // namespace

Qcow2Image::Qcow2Image(Parts parts)
    : file_(std::move(parts.file)),
      header_(std::move(parts.header)),
      data_file_(std::move(parts.data_file)),
      backing_(std::move(parts.backing)),
      l2_cache_(std::move(parts.l2_cache)),
      cluster_cache_(std::move(parts.cluster_cache)) {
  size_ = header_.size & ~uint64_t{511};  // QEMU drops a partial last sector of a qcow2 image
  cluster_bits_ = header_.cluster_bits;
  cluster_size_ = header_.cluster_size();
  l2_entry_bytes_ = header_.l2_entry_bytes();
  l2_bits_ = cluster_bits_ - (header_.extended_l2() ? 4 : 3);
  l2_owner_ = l2_cache_->NewOwnerId();
  cluster_owner_ = cluster_cache_->NewOwnerId();
}

Qcow2Image::~Qcow2Image() { Close(); }

Status Qcow2Image::Open(Parts parts, uint64_t* l1_budget_bytes, std::unique_ptr<Qcow2Image>* out) {
  const Qcow2Header& h = parts.header;
  const std::string& path = parts.file->path();
  const uint64_t needed = h.l1_entries_needed();
  if (needed * 8 > *l1_budget_bytes)
    return Status::Error(Code::kUnsupported, path + ": the L1 tables of the backing chain exceed " +
                                                 Num(kChainL1BytesMax) + " bytes in all");

  std::unique_ptr<ClusterDecompressor> decompressor;
  Status st = ClusterDecompressor::Create(
      h.compression_type == Qcow2Header::kCompressionZstd ? ClusterDecompressor::Type::kZstd
                                                          : ClusterDecompressor::Type::kDeflate,
      &decompressor);
  if (!st.ok()) return Status::Error(st.code, path + ": image uses zstd compression, but " + st.message);

  std::unique_ptr<Qcow2Image> img(new Qcow2Image(std::move(parts)));
  img->decompressor_ = std::move(decompressor);
  img->l1_.resize(needed);
  std::vector<uint8_t> chunk(std::min<uint64_t>(needed, kL1ReadEntries) * 8);
  for (uint64_t i = 0; i < needed; i += kL1ReadEntries) {
    const uint64_t n = std::min<uint64_t>(needed - i, kL1ReadEntries);
    int rc = img->file_->ReadAt(h.l1_offset + i * 8, n * 8, chunk.data());
    if (rc < 0) return Status::FromErrno(rc, path + ": reading the L1 table");
    for (uint64_t j = 0; j < n; ++j) img->l1_[i + j] = LoadBe64(chunk.data() + j * 8);
  }
  // Every L2 table must be aligned, inside the file and clear of the header, L1 and
  // refcount tables; and no two L1 entries may share one.
  const uint64_t cs = img->cluster_size_;
  std::vector<uint64_t> l2s;
  for (uint64_t i = 0; i < needed; ++i) {
    const uint64_t l2 = img->l1_[i] & kOffsetMask;
    if (l2 == 0) continue;
    const std::string where = path + ": L1 entry " + Num(i) + ": L2 table at " + Num(l2);
    if (l2 % cs != 0) return Status::Error(Code::kCorrupt, where + " is not cluster-aligned");
    if (!img->file_->Contains(l2, cs)) return Status::Error(Code::kCorrupt, where + " lies beyond the end of the file");
    if (img->OverlapsMetadata(l2, cs)) return Status::Error(Code::kCorrupt, where + " overlaps the header, L1 or refcount table");
    l2s.push_back(l2);
  }
  std::sort(l2s.begin(), l2s.end());
  auto dup = std::adjacent_find(l2s.begin(), l2s.end());
  if (dup != l2s.end()) return Status::Error(Code::kCorrupt, path + ": two L1 entries point to the same L2 table at " + Num(*dup));
  img->l2_offsets_ = std::move(l2s);  // from here on OverlapsMetadata covers the L2 tables too
  img->l1_bytes_charged_ = (img->l1_.size() + img->l2_offsets_.size()) * 8;
  if (img->l1_bytes_charged_ > *l1_budget_bytes)
    return Status::Error(Code::kUnsupported, path + ": the L1 tables of the backing chain exceed " +
                                                 Num(kChainL1BytesMax) + " bytes in all");
  *l1_budget_bytes -= img->l1_bytes_charged_;
  *out = std::move(img);
  return Status::Ok();
}

bool Qcow2Image::OverlapsMetadata(uint64_t off, uint64_t len) const {
  auto overlaps = [&](uint64_t start, uint64_t bytes) { return bytes != 0 && off < start + bytes && start < off + len; };
  if (overlaps(0, cluster_size_)) return true;
  if (overlaps(header_.l1_offset, header_.l1_entries_needed() * 8)) return true;
  if (overlaps(header_.refcount_table_offset, uint64_t{header_.refcount_table_clusters} << cluster_bits_)) return true;
  // L2 tables: the last one starting before the end of the range is the only candidate.
  auto it = std::lower_bound(l2_offsets_.begin(), l2_offsets_.end(), off + len);
  if (it != l2_offsets_.begin() && *(it - 1) + cluster_size_ > off) return true;
  return false;
}

int Qcow2Image::Corrupt(Status* why, const std::string& what) const {
  if (why != nullptr) *why = Status::Error(Code::kCorrupt, path() + ": " + what, kErrCorruptImage);
  return -kErrCorruptImage;
}

int Qcow2Image::LoadL2(uint64_t l2_offset, ClusterCache::Block* out, Status* why) {
  ClusterCache::Block b = l2_cache_->Get(l2_owner_, l2_offset);
  if (!b) {
    auto table = std::make_shared<std::vector<uint8_t>>(cluster_size_);
    int rc = file_->ReadAt(l2_offset, cluster_size_, table->data());
    if (rc < 0) {
      if (why != nullptr) *why = Status::FromErrno(rc, path() + ": reading the L2 table at " + Num(l2_offset));
      return rc;
    }
    b = std::move(table);
    l2_cache_->Put(l2_owner_, l2_offset, b);
  }
  *out = std::move(b);
  return 0;
}

int Qcow2Image::Classify(const uint8_t* entry, uint64_t pos, uint64_t l2_offset, Piece* piece, Status* why) const {
  const uint64_t e = LoadBe64(entry);
  const uint64_t cluster_start = pos & ~(cluster_size_ - 1);
  const uint64_t cluster_end = cluster_start + cluster_size_;
  const std::string where = "L2 entry for guest offset " + Num(cluster_start) + " (L2 table at " + Num(l2_offset) + ")";
  if (e & kL2Compressed) {
    if (data_file_) return Corrupt(why, where + " is compressed, which images with an external data file cannot be");
    const uint32_t x = 62 - (cluster_bits_ - 8);
    const uint64_t host = e & ((uint64_t{1} << x) - 1);
    const uint64_t sectors = (e >> x) & ((uint64_t{1} << (cluster_bits_ - 8)) - 1);
    if (host >> 56) return Corrupt(why, where + ": compressed cluster offset " + Num(host) + " is out of range");
    const uint64_t comp_len = (sectors + 1) * 512 - (host & 511);
    // The file may end inside the last sector of the last compressed cluster (QEMU does
    // not pad it), never earlier.
    const uint64_t file_end = (file_->size() + 511) & ~uint64_t{511};
    if (host >= file_->size() || comp_len > file_end - host)
      return Corrupt(why, where + ": compressed cluster [" + Num(host) + ", " + Num(host + comp_len) +
                              ") runs past the end of the file (" + Num(file_->size()) + " bytes)");
    if (OverlapsMetadata(host, comp_len))
      return Corrupt(why, where + ": compressed cluster at " + Num(host) + " overlaps the image's metadata");
    *piece = Piece{Kind::kCompressed, host, comp_len, cluster_end};
    return 0;
  }

  const uint64_t host_cluster = e & kOffsetMask;
  const bool allocated = host_cluster != 0 || (data_file_ && (e & kL2Copied));
  if (allocated) {
    const ImageFile& target = data_file_ ? *data_file_ : *file_;
    if (host_cluster % cluster_size_ != 0)
      return Corrupt(why, where + ": host offset " + Num(host_cluster) + " is not cluster-aligned");
    if (host_cluster >= target.size())
      return Corrupt(why, where + ": host cluster at " + Num(host_cluster) + " lies beyond the end of " +
                              (data_file_ ? "the data file " : "the file ") + "(" + Num(target.size()) + " bytes)");
    if (!data_file_ && OverlapsMetadata(host_cluster, cluster_size_))
      return Corrupt(why, where + ": host cluster at " + Num(host_cluster) + " overlaps the image's metadata");
  }

  if (!header_.extended_l2()) {
    if (e & kL2ZeroFlag) {
      if (header_.version < 3) return Corrupt(why, where + " has the zero flag, which version 2 images cannot have");
      *piece = Piece{Kind::kZero, 0, 0, cluster_end};
    } else if (!allocated) {
      *piece = Piece{Kind::kUnallocated, 0, 0, cluster_end};
    } else {
      *piece = Piece{Kind::kData, host_cluster + (pos - cluster_start), 0, cluster_end};
    }
    return 0;
  }

  // Extended L2: the second 64 bits say, per subcluster, allocated or reads-as-zero.
  const uint64_t bitmap = LoadBe64(entry + 8);
  if ((bitmap & 0xffffffffull) & (bitmap >> 32))
    return Corrupt(why, where + ": a subcluster is marked both allocated and zero");
  if (!allocated && (bitmap & 0xffffffffull) != 0)
    return Corrupt(why, where + ": unallocated cluster has allocated subclusters");
  const uint64_t sc_size = cluster_size_ / kSubclusters;
  const uint32_t sc = static_cast<uint32_t>((pos - cluster_start) / sc_size);
  const int state = SubclusterState(bitmap, sc);
  uint32_t last = sc + 1;
  while (last < kSubclusters && SubclusterState(bitmap, last) == state) ++last;
  const uint64_t end = cluster_start + uint64_t{last} * sc_size;
  if (state == 1) {
    *piece = Piece{Kind::kData, host_cluster + (pos - cluster_start), 0, end};
  } else if (state == 2) {
    *piece = Piece{Kind::kZero, 0, 0, end};
  } else {
    *piece = Piece{Kind::kUnallocated, 0, 0, end};
  }
  return 0;
}

int Qcow2Image::MapRun(uint64_t off, uint64_t max_len, Run* run, Status* why) {
  const uint32_t span_bits = cluster_bits_ + l2_bits_;  // guest bytes one L2 table maps: 2^span_bits
  const uint64_t l1_index = off >> span_bits;
  if (l1_index >= l1_.size()) return Corrupt(why, "guest offset " + Num(off) + " is not covered by the L1 table");
  const uint64_t span_end = (l1_index + 1) << span_bits;
  const uint64_t limit = std::min(off + max_len, span_end);
  const uint64_t l2_offset = l1_[l1_index] & kOffsetMask;
  if (l2_offset == 0) {
    *run = Run{Kind::kUnallocated, limit - off, 0, 0};
    return 0;
  }
  ClusterCache::Block table;
  int rc = LoadL2(l2_offset, &table, why);
  if (rc < 0) return rc;
  const uint64_t index_mask = (uint64_t{1} << l2_bits_) - 1;
  Piece p;
  rc = Classify(table->data() + ((off >> cluster_bits_) & index_mask) * l2_entry_bytes_, off, l2_offset, &p, why);
  if (rc < 0) return rc;
  Run r{p.kind, 0, p.host, p.comp_len};
  uint64_t pos = p.end;
  // Extend the run over following clusters that map the same way (for data: to the next
  // host bytes, so one pread serves them). A compressed cluster is always a run of its own.
  while (pos < limit && r.kind != Kind::kCompressed) {
    Piece q;
    rc = Classify(table->data() + ((pos >> cluster_bits_) & index_mask) * l2_entry_bytes_, pos, l2_offset, &q, why);
    if (rc < 0) return rc;
    if (q.kind != r.kind || (r.kind == Kind::kData && q.host != r.host + (pos - off))) break;
    pos = q.end;
  }
  r.len = std::min(pos, limit) - off;
  *run = r;
  return 0;
}

int Qcow2Image::LoadCompressed(uint64_t host, uint64_t comp_len, ClusterCache::Block* out, Status* why) {
  ClusterCache::Block b = cluster_cache_->Get(cluster_owner_, host);
  if (!b) {
    std::vector<uint8_t> in(comp_len);
    int rc = file_->ReadAt(host, comp_len, in.data());
    if (rc < 0) {
      if (why != nullptr) *why = Status::FromErrno(rc, path() + ": reading the compressed cluster at " + Num(host));
      return rc;
    }
    auto cluster = std::make_shared<std::vector<uint8_t>>(cluster_size_);
    std::string msg;
    rc = decompressor_->Decompress(in.data(), in.size(), cluster->data(), cluster->size(), &msg);
    if (rc < 0) {
      if (why != nullptr) {
        const std::string what = path() + ": compressed cluster at " + Num(host) + ": " + msg;
        *why = rc == -kErrCorruptImage ? Status::Error(Code::kCorrupt, what, kErrCorruptImage) : Status::FromErrno(rc, what);
      }
      return rc;
    }
    b = std::move(cluster);
    cluster_cache_->Put(cluster_owner_, host, b);
  }
  *out = std::move(b);
  return 0;
}

int Qcow2Image::Read(uint64_t off, uint32_t len, uint8_t* buf, Status* why) {
  std::shared_lock<RwLock> lk(close_lock_);
  if (closed_) return -ESHUTDOWN;
  if (!InRange(off, len, size_)) return -EINVAL;
  return ReadLocked(off, len, buf, why);
}

int Qcow2Image::ReadLocked(uint64_t off, uint32_t len, uint8_t* buf, Status* why) {
  const uint64_t end = off + len;
  uint64_t pos = off;
  while (pos < end) {
    Run run;
    int rc = MapRun(pos, end - pos, &run, why);
    if (rc < 0) return rc;
    uint8_t* dst = buf + (pos - off);
    const size_t n = static_cast<size_t>(run.len);
    switch (run.kind) {
      case Kind::kData: {
        const ImageFile& target = data_file_ ? *data_file_ : *file_;
        rc = target.ReadAt(run.host, n, dst);
        if (rc < 0) {
          if (why != nullptr) *why = Status::FromErrno(rc, target.path() + ": read of " + Num(n) + " bytes at " + Num(run.host));
          return rc;
        }
        break;
      }
      case Kind::kZero:
        std::memset(dst, 0, n);
        break;
      case Kind::kUnallocated: {
        size_t from_backing = 0;
        if (backing_ && pos < backing_->size())
          from_backing = static_cast<size_t>(std::min<uint64_t>(n, backing_->size() - pos));
        if (from_backing > 0) {
          rc = backing_->Read(pos, static_cast<uint32_t>(from_backing), dst, why);
          if (rc < 0) return rc;
        }
        // Past the end of a smaller backing image (or with none): zeros.
        std::memset(dst + from_backing, 0, n - from_backing);
        break;
      }
      case Kind::kCompressed: {
        ClusterCache::Block cluster;
        rc = LoadCompressed(run.host, run.comp_len, &cluster, why);
        if (rc < 0) return rc;
        std::memcpy(dst, cluster->data() + (pos & (cluster_size_ - 1)), n);
        break;
      }
    }
    pos += run.len;
  }
  return 0;
}

int Qcow2Image::BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out, Status* why) {
  std::shared_lock<RwLock> lk(close_lock_);
  if (closed_) return -ESHUTDOWN;
  if (len == 0 || max_extents == 0 || !InRange(off, len, size_)) return -EINVAL;
  out->clear();
  return BlockStatusLocked(off, len, max_extents, out, why);
}

int Qcow2Image::BlockStatusLocked(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out,
                                  Status* why) {
  // Appends an extent, merging it with the last one when the flags match; false when the
  // extent limit leaves no room.
  auto add = [&](uint64_t n, uint32_t flags) {
    if (!out->empty() && out->back().flags == flags) {
      out->back().length += n;
      return true;
    }
    if (out->size() >= max_extents) return false;
    out->push_back(Extent{n, flags});
    return true;
  };
  const uint64_t end = off + len;
  uint64_t pos = off;
  std::vector<Extent> below;
  for (uint32_t runs = 0; pos < end && runs < kBlockStatusRunsMax; ++runs) {
    Run run;
    int rc = MapRun(pos, end - pos, &run, why);
    if (rc < 0) {
      // What was mapped before the failure is still an answer; fail only if there is none.
      if (!out->empty()) return 0;
      return rc;
    }
    if (run.kind == Kind::kData || run.kind == Kind::kCompressed) {
      if (!add(run.len, 0)) return 0;
    } else if (run.kind == Kind::kZero) {
      if (!add(run.len, kExtentZero)) return 0;
    } else {
      uint64_t covered = 0;
      if (backing_ && pos < backing_->size()) {
        const uint64_t ask = std::min(run.len, backing_->size() - pos);
        rc = backing_->BlockStatus(pos, ask, max_extents - static_cast<uint32_t>(out->size()) + 1, &below, why);
        if (rc < 0) {
          if (!out->empty()) return 0;
          return rc;
        }
        for (const Extent& x : below) {
          if (!add(x.length, x.flags)) return 0;
          covered += x.length;
        }
        if (covered < ask) return 0;  // the backing image stopped early: so do we
      }
      if (covered < run.len && !add(run.len - covered, kExtentHole | kExtentZero)) return 0;
    }
    pos += run.len;
  }
  return 0;
}

void Qcow2Image::DescribeChain(std::vector<ImageLayerInfo>* out) const {
  out->push_back(ImageLayerInfo{file_->path(), ImageFormat::kQcow2, size_, data_file_ ? data_file_->path() : "",
                                header_.dirty()});
  if (backing_) backing_->DescribeChain(out);
}

void Qcow2Image::Close() {
  std::unique_lock<RwLock> lk(close_lock_);
  if (closed_) return;
  closed_ = true;
  if (backing_) backing_->Close();
  file_->Close();
  if (data_file_) data_file_->Close();
  l2_cache_->DropOwner(l2_owner_);
  cluster_cache_->DropOwner(cluster_owner_);
}

}  // namespace mooring
