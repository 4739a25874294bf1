// FileSnapshotSink: a snapshot's content (SnapshotReader, engine/snapshot-reader.h) as a
// new sparse raw image file.
//
// Only data runs are written; zero runs stay holes of the freshly truncated file. The file
// is created with O_EXCL (never over an existing one), fsynced with its directory at the
// end, and removed again when the copy fails, so a failed export leaves nothing behind.
// ENOSPC from any write or from the final fsync becomes kNoSpace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/snapshot-reader.h"

namespace mooring {

class FileSnapshotSink final : public SnapshotSink {
 public:
  // Creates `path` with `size` bytes and no data. `path` must be absolute and name a file
  // (kInvalidArgument), its directory must exist (kInvalidArgument), the file must not
  // (kAlreadyExists, whatever is there). Mode 0600: an image of a VM's disk is as private
  // as the disk.
  static Status Create(const std::string& path, uint64_t size, std::unique_ptr<FileSnapshotSink>* out);
  ~FileSnapshotSink() override;  // removes the file unless Finish succeeded

  Status Data(uint64_t off, const uint8_t* buf, uint32_t len) override;
  Status Zeroes(uint64_t off, uint64_t len) override;
  Status Finish() override;
  void Abort() override;

 private:
  FileSnapshotSink(std::string path, std::string dir, int fd, dev_t dev, ino_t ino)
      : path_(std::move(path)), dir_(std::move(dir)), fd_(fd), dev_(dev), ino_(ino) {}
  Status Error(int err, const std::string& what) const;

  std::string path_;
  std::string dir_;
  int fd_;
  dev_t dev_;  // identity of the file we created: only that file is ever removed
  ino_t ino_;
  bool done_ = false;  // Finish succeeded, or Abort ran
};

}  // namespace mooring
