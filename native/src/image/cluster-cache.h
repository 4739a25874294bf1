// ClusterCache: a byte-bounded LRU of cluster-sized blocks (qcow2 L2 tables, decompressed
// clusters), shared by the images of one chain so that a chain's cache memory has one
// bound however deep the chain is. Blocks are immutable and handed out as shared_ptr, so a
// reader keeps using a block that another thread evicts meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mooring {

class ClusterCache {
 public:
  using Block = std::shared_ptr<const std::vector<uint8_t>>;

  explicit ClusterCache(size_t bytes_max) : bytes_max_(bytes_max) {}

  // A distinct id for each image using the cache (part of every key).
  uint32_t NewOwnerId();

  // The block cached for (owner, offset), or null.
  Block Get(uint32_t owner, uint64_t offset);
  // Caches a block, evicting the least recently used ones beyond the byte bound. A block
  // larger than the whole bound is not cached.
  void Put(uint32_t owner, uint64_t offset, Block block);
  // Drops every block of `owner`.
  void DropOwner(uint32_t owner);

  size_t bytes() const;

 private:
  struct Key {
    uint32_t owner;
    uint64_t offset;
    bool operator==(const Key& o) const { return owner == o.owner && offset == o.offset; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>()(k.offset ^ (static_cast<uint64_t>(k.owner) * 0x9e3779b97f4a7c15ull));
    }
  };
  struct Entry {
    Key key;
    Block block;
  };

  void EvictLocked();

  const size_t bytes_max_;
  mutable std::mutex mu_;
  uint32_t next_owner_ = 1;
  size_t bytes_ = 0;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index_;
};

}  // namespace mooring
