#include "image/qcow2-header.h"

#include <cstring>
#include <map>
#include <utility>

#include "image/image-reader.h"

namespace mooring {
namespace {

constexpr uint8_t kMagic[4] = {'Q', 'F', 'I', 0xfb};

// Header extension types read here; others are skipped, as the spec allows.
constexpr uint32_t kExtEnd = 0;
constexpr uint32_t kExtBackingFormat = 0xe2792aca;
constexpr uint32_t kExtFeatureNames = 0x6803f857;
constexpr uint32_t kExtDataFile = 0x44415441;
// QEMU keeps the backing format in a 16-byte buffer and refuses longer names.
constexpr uint32_t kBackingFormatBytesMax = 15;
constexpr size_t kFeatureNameEntryBytes = 48;
constexpr size_t kFeatureNameBytes = 46;

Status Corrupt(const std::string& path, const std::string& what) {
  return Status::Error(Code::kCorrupt, path + ": " + what);
}
Status Unsupported(const std::string& path, const std::string& what) {
  return Status::Error(Code::kUnsupported, path + ": " + what);
}

std::string Hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 15]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}

// Checks what every qcow2 file starts with: magic, version and cluster size.
Status CheckPrefix(const uint8_t* head, size_t avail, const std::string& path, uint32_t* version,
                   uint32_t* cluster_bits) {
  if (avail < Qcow2Header::kV2HeaderBytes)
    return Corrupt(path, "file of " + std::to_string(avail) + " bytes is too short for a qcow2 header");
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0) return Corrupt(path, "not a qcow2 image (no QFI\\xfb magic)");
  *version = LoadBe32(head + 4);
  if (*version == 1) return Unsupported(path, "qcow version 1 images are not supported; convert with qemu-img convert -O qcow2");
  if (*version != 2 && *version != 3) return Unsupported(path, "qcow2 version " + std::to_string(*version) + " is not supported (2 and 3 are)");
  *cluster_bits = LoadBe32(head + 20);
  if (*cluster_bits < kQcow2ClusterBitsMin || *cluster_bits > 63)
    return Corrupt(path, "cluster_bits " + std::to_string(*cluster_bits) + " is out of range");
  if (*cluster_bits > kQcow2ClusterBitsMax)
    return Unsupported(path, "cluster size 2^" + std::to_string(*cluster_bits) + " is larger than the 2 MiB supported");
  return Status::Ok();
}

}  // namespace

uint64_t Qcow2Header::l1_entries_needed() const {
  const uint64_t served = size & ~uint64_t{511};
  const uint64_t clusters = (served + cluster_size() - 1) >> cluster_bits;
  return (clusters + l2_entries() - 1) / l2_entries();
}

Status Qcow2Header::PeekClusterBits(const uint8_t* head, size_t avail, const std::string& path, uint32_t* cluster_bits) {
  uint32_t version = 0;
  return CheckPrefix(head, avail, path, &version, cluster_bits);
}

Status Qcow2Header::Parse(const uint8_t* head, size_t avail, uint64_t file_size, const std::string& path,
                          Qcow2Header* out) {
  Qcow2Header h;
  Status st = CheckPrefix(head, avail, path, &h.version, &h.cluster_bits);
  if (!st.ok()) return st;
  const uint64_t cs = h.cluster_size();
  // Everything parsed below must lie in the first cluster and in the file.
  const size_t area = static_cast<size_t>(avail < cs ? avail : cs);

  const uint64_t backing_offset = LoadBe64(head + 8);
  const uint32_t backing_bytes = LoadBe32(head + 16);
  h.size = LoadBe64(head + 24);
  const uint32_t crypt_method = LoadBe32(head + 32);
  h.l1_size = LoadBe32(head + 36);
  h.l1_offset = LoadBe64(head + 40);
  h.refcount_table_offset = LoadBe64(head + 48);
  h.refcount_table_clusters = LoadBe32(head + 56);

  if (h.version == 2) {
    h.header_length = kV2HeaderBytes;
  } else {
    if (area < kV3HeaderBytesMin) return Corrupt(path, "file is too short for a qcow2 v3 header");
    h.incompatible = LoadBe64(head + 72);
    h.compatible = LoadBe64(head + 80);
    h.autoclear = LoadBe64(head + 88);
    h.header_length = LoadBe32(head + 100);
    if (h.header_length < kV3HeaderBytesMin || h.header_length % 8 != 0 || h.header_length > area)
      return Corrupt(path, "header_length " + std::to_string(h.header_length) +
                               " is not a multiple of 8 between 104 and the first cluster (or the file) size");
  }

  // Header extensions: from the end of the header to the backing file name (or the end of
  // the first cluster). Names of incompatible features are kept for the error message.
  std::map<uint32_t, std::string> incompat_names;
  {
    size_t end = area;
    if (backing_offset != 0 && backing_offset < end) end = static_cast<size_t>(backing_offset);
    size_t pos = h.header_length;
    bool seen_format = false, seen_data_file = false, seen_names = false;
    for (uint32_t count = 0; pos < end && end - pos >= 8; ++count) {
      if (count == kQcow2HeaderExtensionsMax)
        return Corrupt(path, "more than " + std::to_string(kQcow2HeaderExtensionsMax) + " header extensions");
      const uint32_t type = LoadBe32(head + pos);
      const uint32_t len = LoadBe32(head + pos + 4);
      pos += 8;
      if (type == kExtEnd) break;
      if (len > end - pos)
        return Corrupt(path, "header extension " + Hex(type) + " of " + std::to_string(len) +
                                 " bytes runs past the end of the header area");
      const char* data = reinterpret_cast<const char*>(head + pos);
      if (type == kExtBackingFormat) {
        if (seen_format) return Corrupt(path, "two backing format header extensions");
        if (len > kBackingFormatBytesMax) return Corrupt(path, "backing format name of " + std::to_string(len) + " bytes is too long");
        seen_format = true;
        h.backing_format.assign(data, len);
      } else if (type == kExtDataFile) {
        if (seen_data_file) return Corrupt(path, "two data file header extensions");
        if (len > kImageFileNameBytesMax) return Corrupt(path, "data file name of " + std::to_string(len) + " bytes is too long");
        seen_data_file = true;
        h.data_file.assign(data, len);
      } else if (type == kExtFeatureNames) {
        if (seen_names) return Corrupt(path, "two feature name table header extensions");
        seen_names = true;
        for (size_t e = 0; e + kFeatureNameEntryBytes <= len; e += kFeatureNameEntryBytes) {
          const uint8_t* entry = head + pos + e;
          if (entry[0] != 0 || entry[1] > 63) continue;  // only incompatible features are named in errors
          const char* name = reinterpret_cast<const char*>(entry + 2);
          incompat_names[entry[1]] = std::string(name, strnlen(name, kFeatureNameBytes));
        }
      }
      const uint64_t padded = (uint64_t{len} + 7) & ~uint64_t{7};
      if (padded > end - pos) break;  // the padding of the last extension may run into the end
      pos += static_cast<size_t>(padded);
    }
  }

  // Features, in the order that gives the most useful message.
  if (crypt_method != 0)
    return Unsupported(path, std::string("image is encrypted (") + (crypt_method == 1 ? "AES" : crypt_method == 2 ? "LUKS" : "method " + std::to_string(crypt_method)) +
                                 "); encrypted images are not supported");
  const uint64_t unknown = h.incompatible & ~kIncompatKnown;
  if (unknown != 0) {
    std::string bits;
    for (uint32_t b = 0; b < 64; ++b) {
      if ((unknown & (1ull << b)) == 0) continue;
      if (!bits.empty()) bits += ", ";
      bits += std::to_string(b);
      auto it = incompat_names.find(b);
      if (it != incompat_names.end() && !it->second.empty()) bits += " (" + it->second + ")";
    }
    return Unsupported(path, "image uses unknown incompatible features: bit " + bits);
  }
  if ((h.incompatible & kIncompatCorrupt) != 0)
    return Corrupt(path, "image is marked corrupt (incompatible feature bit 1); repair it with qemu-img check -r all");
  if ((h.incompatible & kIncompatCompressionType) != 0) {
    if (h.header_length <= kV3HeaderBytesMin)
      return Corrupt(path, "compression type bit is set but the header has no compression_type field");
    h.compression_type = head[104];
    if (h.compression_type == kCompressionDeflate)
      return Corrupt(path, "compression type bit is set but compression_type is 0 (deflate)");
    if (h.compression_type != kCompressionZstd)
      return Unsupported(path, "compression type " + std::to_string(h.compression_type) + " is not supported (deflate and zstd are)");
  } else if (h.header_length > kV3HeaderBytesMin && head[104] != 0) {
    return Corrupt(path, "compression_type is " + std::to_string(head[104]) + " but the compression type bit is not set");
  }
  if (h.extended_l2() && h.cluster_bits < 14)
    return Corrupt(path, "extended L2 entries need clusters of at least 16 KiB, not 2^" + std::to_string(h.cluster_bits));
  if (h.external_data()) {
    if (h.data_file.empty())
      return Unsupported(path, "image keeps its data in an external data file but does not name it");
  } else {
    h.data_file.clear();  // a name without the feature bit is never used
  }

  // Sizes and tables.
  if (h.size > kImageSizeBytesMax)
    return Unsupported(path, "virtual size " + std::to_string(h.size) + " is larger than the largest served, " +
                                 std::to_string(kImageSizeBytesMax));
  const uint64_t needed = h.l1_entries_needed();
  if (h.l1_size < needed)
    return Corrupt(path, "L1 table of " + std::to_string(h.l1_size) + " entries is too small for the virtual size (" +
                             std::to_string(needed) + " needed)");
  if (uint64_t{h.l1_size} * 8 > kQcow2L1BytesMax)
    return Corrupt(path, "L1 table of " + std::to_string(h.l1_size) + " entries is larger than the limit of " +
                             std::to_string(kQcow2L1BytesMax / 8));
  if (needed > 0) {
    if (h.l1_offset % cs != 0) return Corrupt(path, "L1 table offset " + std::to_string(h.l1_offset) + " is not cluster-aligned");
    if (h.l1_offset < cs) return Corrupt(path, "L1 table overlaps the header cluster");
    if (h.l1_offset > file_size || needed * 8 > file_size - h.l1_offset)
      return Corrupt(path, "L1 table at " + std::to_string(h.l1_offset) + " (" + std::to_string(needed) +
                               " entries) lies beyond the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  if (h.refcount_table_clusters != 0) {
    const uint64_t rt_bytes = uint64_t{h.refcount_table_clusters} << h.cluster_bits;
    if (rt_bytes > kQcow2RefcountTableBytesMax)
      return Corrupt(path, "refcount table of " + std::to_string(h.refcount_table_clusters) + " clusters is larger than the limit");
    if (h.refcount_table_offset % cs != 0 || h.refcount_table_offset < cs)
      return Corrupt(path, "refcount table offset " + std::to_string(h.refcount_table_offset) + " is invalid");
    if (h.refcount_table_offset > file_size || rt_bytes > file_size - h.refcount_table_offset)
      return Corrupt(path, "refcount table lies beyond the end of the file");
    if (needed > 0 && h.refcount_table_offset < h.l1_offset + needed * 8 && h.l1_offset < h.refcount_table_offset + rt_bytes)
      return Corrupt(path, "L1 table and refcount table overlap");
  }

  // Backing file name: inside the first cluster, as QEMU writes it.
  if (backing_offset != 0 && backing_bytes != 0) {
    if (backing_bytes > kImageFileNameBytesMax)
      return Corrupt(path, "backing file name of " + std::to_string(backing_bytes) + " bytes is too long");
    if (backing_offset > area || backing_bytes > area - backing_offset)
      return Corrupt(path, "backing file name at " + std::to_string(backing_offset) + " lies outside the first cluster or the file");
    h.has_backing = true;
    h.backing_file.assign(reinterpret_cast<const char*>(head + backing_offset), backing_bytes);
  }
  if (!h.has_backing) h.backing_format.clear();

  *out = std::move(h);
  return Status::Ok();
}

}  // namespace mooring
