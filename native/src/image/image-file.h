// ImageFile: one read-only file of an image chain (an image, a backing file, a qcow2
// external data file), with the size it had when opened. Every offset taken from image
// metadata is checked against that size before it is read.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace mooring {

class ImageFile {
 public:
  ~ImageFile();
  ImageFile(const ImageFile&) = delete;
  ImageFile& operator=(const ImageFile&) = delete;

  // Opens a path the caller chose (the top image): regular files and block devices only.
  static Status Open(const std::string& path, std::unique_ptr<ImageFile>* out);

  // Opens `rel` (a name stored in an image, already checked by CheckStoredName) beneath the
  // directory `root_fd`, so that neither the name nor a symlink on the way can leave it.
  // `root_path` is only for messages and ImageFile::path().
  static Status OpenBeneath(int root_fd, const std::string& root_path, const std::string& rel,
                            std::unique_ptr<ImageFile>* out);

  // A name stored in an image must be a relative path made of plain components: no leading
  // '/', no '.', '..' or empty components, no NUL or control characters. `what` names the
  // field in the message.
  static Status CheckStoredName(const std::string& image_path, const std::string& what, const std::string& name);

  // Reads [off, off+len). Bytes past the end of the file (as opened) read as zeros, as
  // QEMU's file driver does for the tail of a file whose size is not sector-aligned.
  // 0 or a negative errno.
  int ReadAt(uint64_t off, size_t len, uint8_t* buf) const;

  // Whether [off, off+len) lies inside the file as opened; never overflows.
  bool Contains(uint64_t off, uint64_t len) const { return off <= size_ && len <= size_ - off; }

  // SEEK_DATA/SEEK_HOLE: the end of the run of data (or hole) that starts at `off`, and
  // whether it is data. Filesystems without hole reporting answer "data to EOF".
  int DataRun(uint64_t off, uint64_t* run_end, bool* is_data) const;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }
  const std::string& path() const { return path_; }

  void Close();

 private:
  ImageFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status Stat();

  int fd_ = -1;
  uint64_t size_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::string path_;
};

}  // namespace mooring
