// LayerFdCache: the process-wide bound on the file descriptors held for read-only layers.
//
// A replica keeps its head layer's file open for its whole life (the data path writes it).
// Every other layer (a snapshot, a removed layer kept for its children) is opened on demand
// and its descriptor is kept in this cache, shared by every replica of the process, which
// holds at most `capacity()` of them: past it the least recently used unpinned one is closed
// (a CLOCK sweep: a layer read since the last sweep gets a second chance). So a 3-replica
// volume with 1,000 snapshots runs under a 1,024 open-file limit, and a process with many
// volumes holds heads + capacity() layer descriptors, whatever the chains' depth.
//
// Capacity: MOORING_LAYER_FDS (an integer 1..1048576) when set at the first use, else a
// quarter of RLIMIT_NOFILE's soft limit at the first use, clamped to [64, 4096]. A read that
// finds every cached descriptor in use opens one over the capacity (the excess is bounded by
// the reads in flight) and the next miss closes it again.
//
// Thread safety: reads pin a descriptor without a lock (Layer::Acquire); the cache's mutex is
// taken only on a miss, on eviction, and when a layer joins or leaves the cache. See layer.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>

namespace mooring {

class Layer;

class LayerFdCache {
 public:
  static LayerFdCache& Instance();

  size_t capacity() const { return capacity_; }
  // Descriptors currently held for cached (non-resident) layers.
  size_t open_count();

  // Opens l's file if it is not open and pins it (l->users_ raised); 0 or -errno.
  int OpenPinned(Layer* l, int* fd);
  // l holds an open descriptor and stops being resident: it joins the cache (which may
  // close another layer's descriptor, or l's own if the cache is full of newer ones).
  void Adopt(Layer* l);
  // l leaves the cache (it becomes resident, or is being closed); its descriptor, if any,
  // stays open and is the caller's.
  void Release(Layer* l);

  // The capacity the environment and limits give (what Instance() uses); exposed for tests.
  static size_t DefaultCapacity();

 private:
  LayerFdCache();
  // Closes unpinned descriptors until fewer than `keep` are open. Caller holds mu_.
  void EvictLocked(size_t keep);
  // Closes l's descriptor unless a reader pins it. Caller holds mu_. True if closed.
  bool TryCloseLocked(Layer* l);

  const size_t capacity_;
  std::mutex mu_;
  // Cached layers with an open descriptor, in CLOCK order (front = next to examine).
  std::list<Layer*> open_;
};

}  // namespace mooring
