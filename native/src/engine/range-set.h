// Helpers over sorted lists of byte ranges (the extents that LayerExtents returns), shared
// by the Reconciler and the Rebuilder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "block/replica-backend.h"

namespace mooring {

// Sorts by offset and merges overlapping or touching ranges; drops empty ones.
inline void SortAndMerge(std::vector<Range>* v) {
  std::sort(v->begin(), v->end(), [](const Range& a, const Range& b) { return a.off < b.off; });
  std::vector<Range> out;
  for (const Range& r : *v) {
    if (r.len == 0) continue;
    if (!out.empty() && r.off <= out.back().off + out.back().len) {
      uint64_t end = std::max(out.back().off + out.back().len, r.off + r.len);
      out.back().len = end - out.back().off;
    } else {
      out.push_back(r);
    }
  }
  v->swap(out);
}

// The parts of the sorted, merged `ext` inside [a, b).
inline std::vector<Range> Clip(const std::vector<Range>& ext, uint64_t a, uint64_t b) {
  std::vector<Range> out;
  auto it = std::upper_bound(ext.begin(), ext.end(), a, [](uint64_t v, const Range& r) { return v < r.off + r.len; });
  for (; it != ext.end() && it->off < b; ++it) {
    uint64_t s = std::max(a, it->off), e = std::min(b, it->off + it->len);
    if (s < e) out.push_back({s, e - s});
  }
  return out;
}

// Total length of a list of ranges.
inline uint64_t TotalBytes(const std::vector<Range>& v) {
  uint64_t n = 0;
  for (const Range& r : v) n += r.len;
  return n;
}

}  // namespace mooring
