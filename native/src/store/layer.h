// Layer: the file of one layer of a replica and the set of 4 KiB blocks it holds.
// Its metadata (name, parent...) lives in ReplicaMetadata; this is the runtime half.
//
// A layer is *resident* (its descriptor stays open until CloseFile: the head) or *cached*
// (every other layer: its descriptor is held by the process-wide LayerFdCache, which may
// close it when it is not in use and reopens it on the next Acquire). Code that reads or
// writes a layer's file takes a LayerFd from Acquire and holds it for the calls it makes;
// a cached descriptor is never closed while a LayerFd pins it. A reopened file must be the
// inode first opened (device and inode number), so a file swapped in the directory since
// is refused (-ESTALE), never read.
//
// Threads: Acquire/LayerFd run concurrently from any thread. MakeResident/MakeCached, Open
// and CloseFile run with the replica's data path excluded (its io_mu_ held exclusively).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <string>

#include "store/extent-map.h"
#include "util/status.h"

namespace mooring {

class Layer;

// A pinned descriptor of a layer's file (see Layer::Acquire). Move-only; unpins when destroyed.
class LayerFd {
 public:
  LayerFd() = default;
  ~LayerFd() { Reset(); }
  LayerFd(const LayerFd&) = delete;
  LayerFd& operator=(const LayerFd&) = delete;
  int fd() const { return fd_; }
  void Reset();

 private:
  friend class Layer;
  Layer* pinned_ = nullptr;  // set when a cached descriptor is pinned
  int fd_ = -1;
};

class Layer {
 public:
  Layer(uint32_t num, std::string id, std::string path);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Opens the existing file read-write and checks it is a regular file of size_bytes.
  // A missing or shorter file is kCorrupt (the metadata names it); EMFILE says to raise
  // RLIMIT_NOFILE. A longer file is cut back to size_bytes: a size change extends files
  // before the metadata commit that records it (Replica::Grow, AdoptChain), so a crash in
  // between leaves files longer than the committed size, whose excess no reader can reach.
  // The layer starts resident.
  Status Open(uint64_t size_bytes);
  // Sets the file's length to size_bytes and syncs it (the new range is a hole). 0 or -errno.
  int Resize(uint64_t size_bytes);
  // A descriptor of the file, valid while *out lives: 0, or -errno (a reopen failed: EMFILE
  // with every cached descriptor in use, or -ESTALE if the file was replaced).
  int Acquire(LayerFd* out);
  // The descriptor stays open until CloseFile or MakeCached (reopened if it was closed).
  // 0 or -errno.
  int MakeResident();
  // The descriptor joins the process-wide cache, which may close it while unused.
  void MakeCached();
  bool resident() const { return resident_.load(); }
  // Rebuilds extents() from the file's allocation (FIEMAP, or SEEK_DATA/SEEK_HOLE where
  // FIEMAP is missing or an extent is preallocated), rounded out to whole blocks.
  Status ScanExtents(uint64_t size_bytes);
  void CloseFile();

  uint32_t num() const { return num_; }
  const std::string& id() const { return id_; }
  const std::string& path() const { return path_; }
  // The descriptor of a resident layer (the head); -1 for a cached layer, which is read
  // through Acquire.
  int fd() const { return resident_.load() ? fd_.load() : -1; }
  // Blocks (4 KiB units) allocated in this layer's file; value = num().
  ExtentMap& extents() { return extents_; }
  const ExtentMap& extents() const { return extents_; }
  // st_blocks * 512 (of the open descriptor, else of the path: no reopen), or 0 if stat fails.
  uint64_t AllocatedBytes() const;

 private:
  friend class LayerFd;
  friend class LayerFdCache;
  uint32_t num_;
  std::string id_;
  std::string path_;
  Status ScanRange(int fd, off_t from, off_t to);
  int ScanWithFiemap(int fd, off_t end);
  // Opens the file again (O_NOFOLLOW) and checks it is the inode Open found: fd or -errno.
  int Reopen() const;

  std::atomic<int> fd_{-1};
  // Readers holding a LayerFd of this (cached) layer's descriptor; the cache closes it only at 0.
  std::atomic<uint32_t> users_{0};
  // Read since the cache's last sweep (the CLOCK bit).
  std::atomic<bool> used_{false};
  std::atomic<bool> resident_{true};
  // Owned by LayerFdCache under its mutex: whether the layer is in its list, and where.
  bool in_cache_ = false;
  std::list<Layer*>::iterator cache_pos_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  ExtentMap extents_;
};

}  // namespace mooring
