// ExtentMap: an interval map from [start, end) to a value, over abstract units (the store
// uses 4 KiB block numbers). Intervals never overlap; adjacent intervals with equal values
// are coalesced, so memory grows with the number of distinct extents, never with the size
// of the address space. Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

namespace mooring {

class ExtentMap {
 public:
  struct Interval {
    uint64_t start;
    uint64_t end;
    uint32_t value;
  };

  // Maps [start, end) to value, replacing whatever was there.
  void Set(uint64_t start, uint64_t end, uint32_t value);
  // Unmaps [start, end).
  void Erase(uint64_t start, uint64_t end);
  void Clear() { map_.clear(); }

  // The value at pos, if mapped.
  bool Lookup(uint64_t pos, uint32_t* value) const;
  // True if any unit of [start, end) is mapped.
  bool Intersects(uint64_t start, uint64_t end) const;
  // True if every unit of [start, end) is mapped (to any values).
  bool Covers(uint64_t start, uint64_t end) const;
  // The first interval ending after pos (it may contain pos or start after it).
  bool NextFrom(uint64_t pos, Interval* out) const;

  // Calls fn(Interval) for each interval intersecting [start, end), clipped to it, in
  // order, until fn returns false. Returns false if stopped.
  template <typename Fn>
  bool ForEachUntil(uint64_t start, uint64_t end, Fn&& fn) const {
    if (start >= end) return true;
    auto it = map_.upper_bound(start);
    if (it != map_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.first > start) it = prev;
    }
    for (; it != map_.end() && it->first < end; ++it) {
      Interval iv{it->first < start ? start : it->first,
                  it->second.first > end ? end : it->second.first, it->second.second};
      if (!fn(iv)) return false;
    }
    return true;
  }
  // Calls fn(Interval) for each interval intersecting [start, end), clipped to it, in order.
  template <typename Fn>
  void ForEach(uint64_t start, uint64_t end, Fn&& fn) const {
    ForEachUntil(start, end, [&](const Interval& iv) {
      fn(iv);
      return true;
    });
  }
  template <typename Fn>
  void ForEachAll(Fn&& fn) const {
    for (const auto& e : map_) fn(Interval{e.first, e.second.first, e.second.second});
  }

  size_t interval_count() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  // Total mapped units (walks the map).
  uint64_t MappedUnits() const;

 private:
  // start -> (end, value)
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> map_;
};

}  // namespace mooring
