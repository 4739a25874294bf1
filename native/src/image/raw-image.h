// RawImage: a raw image file read as it is. Its size is the file size rounded up to 512
// bytes (as QEMU reports it), and the bytes past the end of the file read as zeros, so a
// file of any length works (docs/image-reader.md, "Sizes").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "image/image-file.h"
#include "image/image-reader.h"
#include "util/rw-lock.h"

namespace mooring {

class RawImage final : public ImageReader {
 public:
  static Status Open(std::unique_ptr<ImageFile> file, std::unique_ptr<RawImage>* out);

  uint64_t size() const override { return size_; }
  ImageFormat format() const override { return ImageFormat::kRaw; }
  const std::string& path() const override { return file_->path(); }
  int Read(uint64_t off, uint32_t len, uint8_t* buf, Status* why = nullptr) override;
  int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out,
                  Status* why = nullptr) override;
  void DescribeChain(std::vector<ImageLayerInfo>* out) const override;
  void Close() override;

 private:
  RawImage(std::unique_ptr<ImageFile> file, uint64_t size) : file_(std::move(file)), size_(size) {}

  std::unique_ptr<ImageFile> file_;
  const uint64_t size_;
  RwLock close_lock_;  // shared by calls, exclusive by Close
  bool closed_ = false;
};

}  // namespace mooring
