#include "image/cluster-cache.h"

namespace mooring {

uint32_t ClusterCache::NewOwnerId() {
  std::lock_guard<std::mutex> lk(mu_);
  return next_owner_++;
}

ClusterCache::Block ClusterCache::Get(uint32_t owner, uint64_t offset) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(Key{owner, offset});
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->block;
}

void ClusterCache::Put(uint32_t owner, uint64_t offset, Block block) {
  if (!block || block->size() > bytes_max_) return;
  std::lock_guard<std::mutex> lk(mu_);
  const Key key{owner, offset};
  auto it = index_.find(key);
  if (it != index_.end()) {
    // Another thread loaded the same block meanwhile: keep one copy.
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  bytes_ += block->size();
  lru_.push_front(Entry{key, std::move(block)});
  index_[key] = lru_.begin();
  EvictLocked();
}

void ClusterCache::DropOwner(uint32_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.owner == owner) {
      bytes_ -= it->block->size();
      index_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t ClusterCache::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return bytes_;
}

void ClusterCache::EvictLocked() {
  while (bytes_ > bytes_max_ && !lru_.empty()) {
    Entry& victim = lru_.back();
    bytes_ -= victim.block->size();
    index_.erase(victim.key);
    lru_.pop_back();
  }
}

}  // namespace mooring
