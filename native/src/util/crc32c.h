// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven: the check value of
// the replica metadata journal's records (store/metadata-journal.h), which tells a record
// a crash cut short from a whole one. Crc32c("123456789") == 0xE3069283.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mooring {

namespace crc32c_detail {
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<uint32_t, 256> kTable = MakeTable();
}  // namespace crc32c_detail

// Continues a CRC over more bytes: Crc32c(b, Crc32c(a)) == Crc32c(a + b).
inline uint32_t Crc32c(const void* data, size_t len, uint32_t crc = 0) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < len; ++i) crc = crc32c_detail::kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace mooring
