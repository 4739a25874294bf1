// Qcow2Header: the header of a qcow2 image (v2 and v3) and its header extensions, parsed
// from the bytes of the first cluster and checked against the file size and the limits of
// image-reader.h. Field layout: the qcow2 specification (qemu docs/interop/qcow2.rst).
//
// Parse refuses with a coded error: UNSUPPORTED for valid images this reader does not
// read (encryption, unknown incompatible features, qcow v1, unknown compression types,
// sizes beyond the limits); CORRUPT_METADATA for anything inconsistent or out of range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "util/status.h"

namespace mooring {

struct Qcow2Header {
  // Bytes every qcow2 header has (the whole v2 header), and the fixed part of v3.
  static constexpr size_t kV2HeaderBytes = 72;
  static constexpr size_t kV3HeaderBytesMin = 104;
  // Bytes Parse needs before it knows the cluster size.
  static constexpr size_t kProbeBytes = kV3HeaderBytesMin;

  // incompatible_features bits.
  static constexpr uint64_t kIncompatDirty = 1ull << 0;
  static constexpr uint64_t kIncompatCorrupt = 1ull << 1;
  static constexpr uint64_t kIncompatDataFile = 1ull << 2;
  static constexpr uint64_t kIncompatCompressionType = 1ull << 3;
  static constexpr uint64_t kIncompatExtendedL2 = 1ull << 4;
  static constexpr uint64_t kIncompatKnown = (1ull << 5) - 1;
  // autoclear_features bit: the external data file is a valid raw image by itself.
  static constexpr uint64_t kAutoclearDataFileRaw = 1ull << 1;

  static constexpr uint8_t kCompressionDeflate = 0;
  static constexpr uint8_t kCompressionZstd = 1;

  uint32_t version = 0;
  uint32_t cluster_bits = 0;
  uint64_t size = 0;  // virtual size as stored
  uint32_t l1_size = 0;
  uint64_t l1_offset = 0;
  uint64_t refcount_table_offset = 0;
  uint32_t refcount_table_clusters = 0;
  uint64_t incompatible = 0;
  uint64_t compatible = 0;
  uint64_t autoclear = 0;
  uint32_t header_length = 0;
  uint8_t compression_type = kCompressionDeflate;
  bool has_backing = false;
  std::string backing_file;
  std::string backing_format;  // from the extension; '' when absent (then probed)
  std::string data_file;       // from the extension; '' when absent

  uint64_t cluster_size() const { return uint64_t{1} << cluster_bits; }
  bool extended_l2() const { return (incompatible & kIncompatExtendedL2) != 0; }
  bool external_data() const { return (incompatible & kIncompatDataFile) != 0; }
  bool dirty() const { return (incompatible & kIncompatDirty) != 0; }
  // Bytes per L2 entry and entries per L2 table.
  uint64_t l2_entry_bytes() const { return extended_l2() ? 16 : 8; }
  uint64_t l2_entries() const { return cluster_size() / l2_entry_bytes(); }
  // L1 entries needed to map `size` as it is served (rounded down to 512 bytes, as QEMU does).
  uint64_t l1_entries_needed() const;

  // Reads the cluster size from the first kProbeBytes bytes (after the magic and version
  // checks), so the caller knows how much of the first cluster to read for Parse. Errors as Parse.
  static Status PeekClusterBits(const uint8_t* head, size_t avail, const std::string& path, uint32_t* cluster_bits);

  // Parses and checks the header. `head` holds the start of the file: the whole first
  // cluster, or the whole file if it is shorter.
  static Status Parse(const uint8_t* head, size_t avail, uint64_t file_size, const std::string& path,
                      Qcow2Header* out);
};

// Big-endian field readers (the qcow2 format is big-endian throughout).
inline uint32_t LoadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline uint64_t LoadBe64(const uint8_t* p) { return (uint64_t{LoadBe32(p)} << 32) | LoadBe32(p + 4); }

}  // namespace mooring
