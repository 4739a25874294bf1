#include "store/extent-map.h"

namespace mooring {

void ExtentMap::Erase(uint64_t start, uint64_t end) {
  if (start >= end) return;
  auto it = map_.lower_bound(start);
  if (it != map_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.first > start) {
      const uint64_t prev_end = prev->second.first;
      const uint32_t value = prev->second.second;
      prev->second.first = start;
      if (prev_end > end) {
        // [start, end) lies inside one interval: split it in two.
        map_.emplace_hint(it, end, std::make_pair(prev_end, value));
        return;
      }
    }
  }
  while (it != map_.end() && it->first < end) {
    if (it->second.first > end) {
      auto tail = it->second;
      map_.erase(it);
      map_.emplace(end, tail);
      return;
    }
    it = map_.erase(it);
  }
}

void ExtentMap::Set(uint64_t start, uint64_t end, uint32_t value) {
  if (start >= end) return;
  Erase(start, end);
  auto next = map_.lower_bound(start);
  if (next != map_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.first == start && prev->second.second == value) {
      start = prev->first;
      map_.erase(prev);
    }
  }
  if (next != map_.end() && next->first == end && next->second.second == value) {
    end = next->second.first;
    next = map_.erase(next);
  }
  map_.emplace_hint(next, start, std::make_pair(end, value));
}

bool ExtentMap::Lookup(uint64_t pos, uint32_t* value) const {
  auto it = map_.upper_bound(pos);
  if (it == map_.begin()) return false;
  --it;
  if (it->second.first <= pos) return false;
  if (value) *value = it->second.second;
  return true;
}

bool ExtentMap::NextFrom(uint64_t pos, Interval* out) const {
  auto it = map_.upper_bound(pos);
  if (it != map_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.first > pos) it = prev;
  }
  if (it == map_.end()) return false;
  *out = Interval{it->first, it->second.first, it->second.second};
  return true;
}

bool ExtentMap::Intersects(uint64_t start, uint64_t end) const {
  if (start >= end) return false;
  Interval iv;
  return NextFrom(start, &iv) && iv.start < end;
}

bool ExtentMap::Covers(uint64_t start, uint64_t end) const {
  uint64_t pos = start;
  while (pos < end) {
    Interval iv;
    if (!NextFrom(pos, &iv) || iv.start > pos) return false;
    pos = iv.end;
  }
  return true;
}

uint64_t ExtentMap::MappedUnits() const {
  uint64_t total = 0;
  for (const auto& e : map_) total += e.second.first - e.first;
  return total;
}

}  // namespace mooring
