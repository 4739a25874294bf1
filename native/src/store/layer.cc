#include "store/layer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/fs-util.h"

namespace mooring {

namespace {
constexpr uint64_t kBlock = 4096;
}

Layer::Layer(uint32_t num, std::string id, std::string path)
    : num_(num), id_(std::move(id)), path_(std::move(path)) {}

Layer::~Layer() { CloseFile(); }

void Layer::CloseFile() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status Layer::Open(uint64_t size_bytes) {
  CloseFile();
  // O_NOFOLLOW: a symlink planted in the directory must not redirect I/O elsewhere.
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return Status::Error(Code::kCorrupt, "layer " + id_ + ": file " + path_ + " is missing", err);
    if (err == EMFILE || err == ENFILE)
      return Status::Error(Code::kIoError,
                           "layer " + id_ + ": too many open files (" + std::strerror(err) +
                               "); raise RLIMIT_NOFILE (ulimit -n) for long snapshot chains",
                           err);
    if (err == ELOOP)
      return Status::Error(Code::kCorrupt, "layer " + id_ + ": " + path_ + " is a symlink", err);
    if (err == EISDIR)
      return Status::Error(Code::kCorrupt, "layer " + id_ + ": " + path_ + " is a directory", err);
    return Status::FromErrno(err, "open " + path_ + ": " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "stat " + path_ + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(Code::kCorrupt, "layer " + id_ + ": " + path_ + " is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > size_bytes) {
    // An interrupted size change (see layer.h): the committed size rules.
    int rc = ::ftruncate(fd, static_cast<off_t>(size_bytes)) != 0 ? -errno : fsutil::FdataSync(fd);
    if (rc != 0) {
      const int err = -rc;
      ::close(fd);
      return Status::FromErrno(err, "cutting " + path_ + " back to " + std::to_string(size_bytes) + " bytes: " + std::strerror(err));
    }
    st.st_size = static_cast<off_t>(size_bytes);
  }
  if (static_cast<uint64_t>(st.st_size) != size_bytes) {
    ::close(fd);
    return Status::Error(Code::kCorrupt, "layer " + id_ + ": " + path_ + " is " +
                                             std::to_string(st.st_size) + " bytes, expected " +
                                             std::to_string(size_bytes));
  }
  fd_ = fd;
  return Status::Ok();
}

Status Layer::ScanExtents(uint64_t size_bytes) {
  extents_.Clear();
  const off_t end = static_cast<off_t>(size_bytes);
  off_t pos = 0;
  // Each iteration consumes one data extent, so the loop is bounded by the file's extents.
  while (pos < end) {
    off_t data = ::lseek(fd_, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // no data after pos
      int err = errno;
      return Status::FromErrno(err, "SEEK_DATA on " + path_ + ": " + std::strerror(err));
    }
    if (data >= end) break;
    off_t hole = ::lseek(fd_, data, SEEK_HOLE);
    if (hole < 0) {
      int err = errno;
      return Status::FromErrno(err, "SEEK_HOLE on " + path_ + ": " + std::strerror(err));
    }
    if (hole > end) hole = end;
    if (hole <= data) break;  // cannot happen on a sane file system; never loop forever
    uint64_t first = static_cast<uint64_t>(data) / kBlock;
    uint64_t last = (static_cast<uint64_t>(hole) + kBlock - 1) / kBlock;
    extents_.Set(first, last, num_);
    pos = hole;
  }
  return Status::Ok();
}

int Layer::Resize(uint64_t size_bytes) {
  if (fd_ < 0) return -EBADF;
  if (::ftruncate(fd_, static_cast<off_t>(size_bytes)) != 0) return -errno;
  // fdatasync covers the length: it is needed to read the file back.
  return fsutil::FdataSync(fd_);
}

uint64_t Layer::AllocatedBytes() const {
  struct stat st;
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace mooring
