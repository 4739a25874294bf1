// Layer: the open file of one layer of a replica and the set of 4 KiB blocks it holds.
// Its metadata (name, parent...) lives in ReplicaMetadata; this is the runtime half.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "store/extent-map.h"
#include "util/status.h"

namespace mooring {

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
  Status Open(uint64_t size_bytes);
  // Sets the file's length to size_bytes and syncs it (the new range is a hole). 0 or -errno.
  int Resize(uint64_t size_bytes);
  // Rebuilds extents() from the file's allocation (FIEMAP, or SEEK_DATA/SEEK_HOLE where
  // FIEMAP is missing or an extent is preallocated), rounded out to whole blocks.
  Status ScanExtents(uint64_t size_bytes);
  void CloseFile();

  uint32_t num() const { return num_; }
  const std::string& id() const { return id_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  // Blocks (4 KiB units) allocated in this layer's file; value = num().
  ExtentMap& extents() { return extents_; }
  const ExtentMap& extents() const { return extents_; }
  // st_blocks * 512, or 0 if stat fails.
  uint64_t AllocatedBytes() const;

 private:
  uint32_t num_;
  std::string id_;
  std::string path_;
  Status ScanRange(off_t from, off_t to);
  int ScanWithFiemap(off_t end);

  int fd_ = -1;
  ExtentMap extents_;
};

}  // namespace mooring
