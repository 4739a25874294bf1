// OpenImage: opens the top image, probes or checks its format, and opens its chain (data
// file, backing images) beneath the top image's directory, with a depth limit, loop
// detection and one cache and L1 budget for the whole chain.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "image/cluster-cache.h"
#include "image/image-file.h"
#include "image/image-reader.h"
#include "image/qcow2-header.h"
#include "image/qcow2-image.h"
#include "image/raw-image.h"

namespace mooring {
namespace {

// Bytes read to recognise a format by its magic.
constexpr size_t kProbeBytes = 512;

struct ForeignMagic {
  size_t offset;
  const char* magic;
  size_t len;
  const char* format;
};

// Formats that 'auto' refuses rather than serving their container bytes as a raw disk.
constexpr ForeignMagic kForeignMagics[] = {
    {0, "KDMV", 4, "VMDK"},
    {0, "COWD", 4, "VMDK (version 3)"},
    {0, "# Disk DescriptorFile", 21, "VMDK descriptor"},
    {0, "vhdxfile", 8, "VHDX"},
    {0, "conectix", 8, "VHD (vpc)"},
    {0, "QED\0", 4, "QED"},
    {0, "LUKS\xba\xbe", 6, "LUKS"},
    {0, "WithoutFreeSpace", 16, "Parallels"},
    {0, "WithouFreSpacExt", 16, "Parallels"},
    {0x40, "\x7f\x10\xda\xbe", 4, "VDI"},
};

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinRel(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

std::string RelDir(const std::string& rel) {
  const size_t slash = rel.find_last_of('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

class ImageOpener {
 public:
  ImageOpener(int root_fd, std::string root_path)
      : root_fd_(root_fd),
        root_path_(std::move(root_path)),
        l2_cache_(std::make_shared<ClusterCache>(kL2CacheBytesMax)),
        cluster_cache_(std::make_shared<ClusterCache>(kDecompressedCacheBytesMax)) {}

  // Opens `file` (found at `rel`, relative to the root; '' for the top image) as `format`.
  Status OpenLayer(std::unique_ptr<ImageFile> file, const std::string& rel, ImageFormatRequest format, uint32_t depth,
                   std::unique_ptr<ImageReader>* out) {
    if (depth > kImageChainDepthMax)
      return Status::Error(Code::kCorrupt, file->path() + ": backing chain is deeper than " +
                                               std::to_string(kImageChainDepthMax) + " images");
    const auto id = std::make_pair(file->dev(), file->ino());
    if (!seen_.insert(id).second)
      return Status::Error(Code::kCorrupt, file->path() + ": backing chain loops (this file is already in the chain)");

    if (format == ImageFormatRequest::kAuto) {
      Status st = Probe(*file, &format);
      if (!st.ok()) return st;
    }
    if (format == ImageFormatRequest::kRaw) {
      std::unique_ptr<RawImage> raw;
      Status st = RawImage::Open(std::move(file), &raw);
      if (st.ok()) *out = std::move(raw);
      return st;
    }
    return OpenQcow2(std::move(file), rel, depth, out);
  }

 private:
  static Status Probe(const ImageFile& file, ImageFormatRequest* format) {
    uint8_t head[kProbeBytes];
    const size_t n = static_cast<size_t>(file.size() < kProbeBytes ? file.size() : kProbeBytes);
    int rc = file.ReadAt(0, n, head);
    if (rc < 0) return Status::FromErrno(rc, file.path() + ": reading the image header");
    if (n >= 4 && std::memcmp(head, "QFI\xfb", 4) == 0) {
      *format = ImageFormatRequest::kQcow2;
      return Status::Ok();
    }
    for (const ForeignMagic& m : kForeignMagics) {
      if (n >= m.offset + m.len && std::memcmp(head + m.offset, m.magic, m.len) == 0)
        return Status::Error(Code::kUnsupported, file.path() + " looks like a " + m.format +
                                                     " image, which is not supported; convert it with qemu-img convert " +
                                                     "-O qcow2, or open it with format 'raw' to read its bytes as they are");
    }
    *format = ImageFormatRequest::kRaw;
    return Status::Ok();
  }

  Status OpenQcow2(std::unique_ptr<ImageFile> file, const std::string& rel, uint32_t depth,
                   std::unique_ptr<ImageReader>* out) {
    const std::string path = file->path();
    // The fixed header first (to learn the cluster size), then the whole first cluster.
    uint8_t probe[Qcow2Header::kProbeBytes];
    size_t n = static_cast<size_t>(std::min<uint64_t>(file->size(), sizeof probe));
    int rc = file->ReadAt(0, n, probe);
    if (rc < 0) return Status::FromErrno(rc, path + ": reading the qcow2 header");
    uint32_t cluster_bits = 0;
    Status st = Qcow2Header::PeekClusterBits(probe, n, path, &cluster_bits);
    if (!st.ok()) return st;
    std::vector<uint8_t> head(static_cast<size_t>(std::min<uint64_t>(file->size(), uint64_t{1} << cluster_bits)));
    rc = file->ReadAt(0, head.size(), head.data());
    if (rc < 0) return Status::FromErrno(rc, path + ": reading the qcow2 header");
    Qcow2Image::Parts parts;
    st = Qcow2Header::Parse(head.data(), head.size(), file->size(), path, &parts.header);
    if (!st.ok()) return st;
    const Qcow2Header& h = parts.header;
    const std::string dir = RelDir(rel);

    if (!h.data_file.empty()) {
      st = ImageFile::CheckStoredName(path, "data file name", h.data_file);
      if (!st.ok()) return st;
      st = ImageFile::OpenBeneath(root_fd_, root_path_, JoinRel(dir, h.data_file), &parts.data_file);
      if (!st.ok()) return Status::Error(st.code, path + ": data file: " + st.message, st.sys_errno);
    }
    if (h.has_backing) {
      st = ImageFile::CheckStoredName(path, "backing file name", h.backing_file);
      if (!st.ok()) return st;
      ImageFormatRequest backing_format = ImageFormatRequest::kAuto;
      if (h.backing_format == "qcow2") {
        backing_format = ImageFormatRequest::kQcow2;
      } else if (h.backing_format == "raw") {
        backing_format = ImageFormatRequest::kRaw;
      } else if (!h.backing_format.empty()) {
        std::string shown;
        for (char c : h.backing_format) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
        return Status::Error(Code::kUnsupported, path + ": backing format '" + shown +
                                                     "' is not supported (raw and qcow2 are)");
      }
      const std::string backing_rel = JoinRel(dir, h.backing_file);
      std::unique_ptr<ImageFile> backing_file;
      st = ImageFile::OpenBeneath(root_fd_, root_path_, backing_rel, &backing_file);
      if (!st.ok()) return Status::Error(st.code, path + ": backing file: " + st.message, st.sys_errno);
      st = OpenLayer(std::move(backing_file), backing_rel, backing_format, depth + 1, &parts.backing);
      if (!st.ok()) return st;
    }
    parts.file = std::move(file);
    parts.l2_cache = l2_cache_;
    parts.cluster_cache = cluster_cache_;
    std::unique_ptr<Qcow2Image> img;
    st = Qcow2Image::Open(std::move(parts), &l1_budget_bytes_, &img);
    if (st.ok()) *out = std::move(img);
    return st;
  }

  const int root_fd_;
  const std::string root_path_;
  std::shared_ptr<ClusterCache> l2_cache_;
  std::shared_ptr<ClusterCache> cluster_cache_;
  std::set<std::pair<dev_t, ino_t>> seen_;
  uint64_t l1_budget_bytes_ = kChainL1BytesMax;
};

}  // namespace

bool ParseImageFormatRequest(const std::string& name, ImageFormatRequest* out) {
  if (name == "auto") {
    *out = ImageFormatRequest::kAuto;
  } else if (name == "raw") {
    *out = ImageFormatRequest::kRaw;
  } else if (name == "qcow2") {
    *out = ImageFormatRequest::kQcow2;
  } else {
    return false;
  }
  return true;
}

Status OpenImage(const std::string& path, ImageFormatRequest format, std::unique_ptr<ImageReader>* out) {
  std::unique_ptr<ImageFile> top;
  Status st = ImageFile::Open(path, &top);
  if (!st.ok()) return st;
  const std::string root = DirName(path);
  const int root_fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return Status::FromErrno(errno, "cannot open the directory " + root + " of " + path);
  ImageOpener opener(root_fd, root);
  st = opener.OpenLayer(std::move(top), "", format, 1, out);
  ::close(root_fd);
  return st;
}

}  // namespace mooring
