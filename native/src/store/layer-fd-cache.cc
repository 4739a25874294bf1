#include "store/layer-fd-cache.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "store/layer.h"

namespace mooring {

namespace {
constexpr size_t kMinCapacity = 64;
constexpr size_t kMaxDefaultCapacity = 4096;
constexpr unsigned long long kMaxCapacity = 1u << 20;
constexpr const char* kCapacityEnv = "MOORING_LAYER_FDS";
}  // namespace

size_t LayerFdCache::DefaultCapacity() {
  if (const char* v = std::getenv(kCapacityEnv)) {
    // Digits only, 1..2^20; anything else falls back to the default below.
    const std::string s(v);
    if (!s.empty() && s.size() <= 8 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const unsigned long long n = std::strtoull(s.c_str(), nullptr, 10);
      if (n >= 1 && n <= kMaxCapacity) return static_cast<size_t>(n);
    }
  }
  struct rlimit rl;
  size_t quarter = kMaxDefaultCapacity;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    quarter = static_cast<size_t>(std::min<rlim_t>(rl.rlim_cur / 4, kMaxDefaultCapacity));
  return std::clamp(quarter, kMinCapacity, kMaxDefaultCapacity);
}

LayerFdCache::LayerFdCache() : capacity_(DefaultCapacity()) {}

LayerFdCache& LayerFdCache::Instance() {
  // Never destroyed: layers closed during static destruction still find it.
  static LayerFdCache* cache = new LayerFdCache();
  return *cache;
}

size_t LayerFdCache::open_count() {
  std::lock_guard<std::mutex> g(mu_);
  return open_.size();
}

bool LayerFdCache::TryCloseLocked(Layer* l) {
  // Take the descriptor out of fd_ first, then look for pins: a reader pins before it loads
  // fd_, so either it loaded -1 (and comes here for a new one, after us) or its pin is seen
  // now and the descriptor is put back.
  if (l->users_.load() != 0) return false;
  const int fd = l->fd_.exchange(-1);
  if (l->users_.load() != 0) {
    l->fd_.store(fd);
    return false;
  }
  if (fd >= 0) ::close(fd);
  open_.erase(l->cache_pos_);
  l->in_cache_ = false;
  return true;
}

void LayerFdCache::EvictLocked(size_t keep) {
  // Each layer is looked at most twice (once to clear its CLOCK bit), so this ends even
  // when every descriptor is pinned.
  for (size_t looked = 0, limit = 2 * open_.size(); open_.size() > keep && looked < limit; ++looked) {
    Layer* l = open_.front();
    if (!l->used_.exchange(false) && TryCloseLocked(l)) continue;
    open_.splice(open_.end(), open_, open_.begin());
  }
}

int LayerFdCache::OpenPinned(Layer* l, int* fd_out) {
  std::lock_guard<std::mutex> g(mu_);
  // Only this mutex's holder stores a descriptor into a cached layer, and only under it is
  // one closed: a descriptor seen here stays open until the pin taken below is dropped.
  int fd = l->fd_.load();
  if (fd < 0) {
    EvictLocked(capacity_ > 0 ? capacity_ - 1 : 0);
    fd = l->Reopen();
    if (fd == -EMFILE || fd == -ENFILE) {
      // The process is at its limit: give back every descriptor no reader holds, once.
      EvictLocked(0);
      fd = l->Reopen();
    }
    if (fd < 0) return fd;
    l->fd_.store(fd);
    if (!l->in_cache_) {
      l->cache_pos_ = open_.insert(open_.end(), l);
      l->in_cache_ = true;
    }
  }
  l->users_.fetch_add(1);
  l->used_.store(true, std::memory_order_relaxed);
  *fd_out = fd;
  return 0;
}

void LayerFdCache::Adopt(Layer* l) {
  std::lock_guard<std::mutex> g(mu_);
  l->resident_ = false;
  if (l->fd_.load() >= 0 && !l->in_cache_) {
    l->cache_pos_ = open_.insert(open_.end(), l);
    l->in_cache_ = true;
    l->used_.store(true, std::memory_order_relaxed);
  }
  EvictLocked(capacity_);
}

void LayerFdCache::Release(Layer* l) {
  std::lock_guard<std::mutex> g(mu_);
  if (l->in_cache_) open_.erase(l->cache_pos_);
  l->in_cache_ = false;
}

}  // namespace mooring
