#include "image/raw-image.h"

#include <mutex>
#include <shared_mutex>

namespace mooring {

Status RawImage::Open(std::unique_ptr<ImageFile> file, std::unique_ptr<RawImage>* out) {
  const uint64_t bytes = file->size();
  if (bytes > kImageSizeBytesMax)
    return Status::Error(Code::kUnsupported, file->path() + ": raw image of " + std::to_string(bytes) +
                                                 " bytes is larger than the largest size served, " +
                                                 std::to_string(kImageSizeBytesMax));
  const uint64_t size = (bytes + 511) & ~uint64_t{511};
  out->reset(new RawImage(std::move(file), size));
  return Status::Ok();
}

int RawImage::Read(uint64_t off, uint32_t len, uint8_t* buf, Status* why) {
  std::shared_lock<RwLock> lk(close_lock_);
  if (closed_) return -ESHUTDOWN;
  if (!InRange(off, len, size_)) return -EINVAL;
  int rc = file_->ReadAt(off, len, buf);
  if (rc < 0 && why != nullptr)
    *why = Status::FromErrno(rc, path() + ": read of " + std::to_string(len) + " bytes at " + std::to_string(off) +
                                     " failed");
  return rc;
}

int RawImage::BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out, Status* why) {
  std::shared_lock<RwLock> lk(close_lock_);
  if (closed_) return -ESHUTDOWN;
  if (len == 0 || max_extents == 0 || !InRange(off, len, size_)) return -EINVAL;
  out->clear();
  const uint64_t end = off + len;
  uint64_t pos = off;
  while (pos < end) {
    uint64_t run_end = end;
    uint32_t flags = kExtentHole | kExtentZero;  // the tail past EOF
    if (pos < file_->size()) {
      bool is_data = false;
      int rc = file_->DataRun(pos, &run_end, &is_data);
      if (rc < 0) {
        if (why != nullptr) *why = Status::FromErrno(rc, path() + ": block status at " + std::to_string(pos));
        return rc;
      }
      flags = is_data ? 0 : (kExtentHole | kExtentZero);
      if (run_end <= pos) run_end = file_->size();  // defensive: always make progress
      if (run_end > end) run_end = end;
    }
    if (!out->empty() && out->back().flags == flags) {
      out->back().length += run_end - pos;
    } else {
      if (out->size() == max_extents) break;
      out->push_back(Extent{run_end - pos, flags});
    }
    pos = run_end;
  }
  return 0;
}

void RawImage::DescribeChain(std::vector<ImageLayerInfo>* out) const {
  out->push_back(ImageLayerInfo{file_->path(), ImageFormat::kRaw, size_, "", false});
}

void RawImage::Close() {
  std::unique_lock<RwLock> lk(close_lock_);
  closed_ = true;
  file_->Close();
}

}  // namespace mooring
