#include "store/layer.h"

#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "store/layer-fd-cache.h"
#include "util/fs-util.h"

namespace mooring {

namespace {
constexpr uint64_t kBlock = 4096;
// Extents asked for per FS_IOC_FIEMAP call.
constexpr uint32_t kFiemapBatch = 512;
}

Layer::Layer(uint32_t num, std::string id, std::string path)
    : num_(num), id_(std::move(id)), path_(std::move(path)) {}

Layer::~Layer() { CloseFile(); }

void LayerFd::Reset() {
  if (pinned_) pinned_->users_.fetch_sub(1);
  pinned_ = nullptr;
  fd_ = -1;
}

void Layer::CloseFile() {
  // Out of the cache first: another replica's eviction may be looking at this layer.
  if (!resident_.load()) LayerFdCache::Instance().Release(this);
  resident_ = true;
  const int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
}

int Layer::Acquire(LayerFd* out) {
  out->Reset();
  if (resident_.load()) {
    const int fd = fd_.load();
    if (fd < 0) return -EBADF;
    out->fd_ = fd;
    return 0;
  }
  // Pin, then look: the cache closes a descriptor only after taking it out of fd_ and
  // seeing no pin (LayerFdCache::TryCloseLocked), so a descriptor seen here stays open.
  users_.fetch_add(1);
  int fd = fd_.load();
  if (fd < 0) {
    users_.fetch_sub(1);
    int rc = LayerFdCache::Instance().OpenPinned(this, &fd);
    if (rc != 0) return rc;
  } else {
    used_.store(true, std::memory_order_relaxed);
  }
  out->pinned_ = this;
  out->fd_ = fd;
  return 0;
}

int Layer::MakeResident() {
  if (resident_.load()) return fd_.load() >= 0 ? 0 : -EBADF;
  LayerFdCache::Instance().Release(this);
  if (fd_.load() < 0) {
    const int fd = Reopen();
    if (fd < 0) {
      // Still cached (closed): the next Acquire tries again.
      return fd;
    }
    fd_.store(fd);
  }
  resident_ = true;
  return 0;
}

void Layer::MakeCached() {
  if (!resident_.load()) return;
  LayerFdCache::Instance().Adopt(this);
}

int Layer::Reopen() const {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  if (!S_ISREG(st.st_mode) || st.st_dev != dev_ || st.st_ino != ino_) {
    ::close(fd);
    return -ESTALE;
  }
  return fd;
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
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  fd_ = fd;
  return Status::Ok();
}

Status Layer::ScanExtents(uint64_t size_bytes) {
  extents_.Clear();
  LayerFd h;
  if (int rc = Acquire(&h); rc != 0) return Status::FromErrno(-rc, "open " + path_ + ": " + std::strerror(-rc));
  const int fd = h.fd();
  const off_t end = static_cast<off_t>(size_bytes);
  // FIEMAP lists hundreds of extents per call where SEEK_DATA/SEEK_HOLE costs two calls per
  // extent (a fragmented layer has tens of thousands, and every open scans). Where it is
  // not supported (tmpfs), or for extents whose content it cannot vouch for, SEEK_DATA decides.
  int rc = ScanWithFiemap(fd, end);
  if (rc == -EOPNOTSUPP || rc == -ENOTTY || rc == -EINVAL) {
    extents_.Clear();
    return ScanRange(fd, 0, end);
  }
  if (rc < 0) return Status::FromErrno(-rc, "FIEMAP on " + path_ + ": " + std::strerror(-rc));
  return Status::Ok();
}

// Records [data, hole) runs in [from, to) from SEEK_DATA/SEEK_HOLE, rounded out to whole blocks.
Status Layer::ScanRange(int fd, off_t from, off_t to) {
  off_t pos = from;
  // Each iteration consumes one data extent, so the loop is bounded by the file's extents.
  while (pos < to) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // no data after pos
      int err = errno;
      return Status::FromErrno(err, "SEEK_DATA on " + path_ + ": " + std::strerror(err));
    }
    if (data >= to) break;
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) {
      int err = errno;
      return Status::FromErrno(err, "SEEK_HOLE on " + path_ + ": " + std::strerror(err));
    }
    if (hole > to) hole = to;
    if (hole <= data) break;  // cannot happen on a sane file system; never loop forever
    uint64_t first = static_cast<uint64_t>(data) / kBlock;
    uint64_t last = (static_cast<uint64_t>(hole) + kBlock - 1) / kBlock;
    extents_.Set(first, last, num_);
    pos = hole;
  }
  return Status::Ok();
}

// 0, or -errno (-EOPNOTSUPP/-ENOTTY/-EINVAL: no FIEMAP here; the caller falls back).
int Layer::ScanWithFiemap(int fd, off_t end) {
  std::vector<uint8_t> buf(sizeof(struct fiemap) + kFiemapBatch * sizeof(struct fiemap_extent));
  auto* fm = reinterpret_cast<struct fiemap*>(buf.data());
  uint64_t pos = 0;
  const uint64_t stop = static_cast<uint64_t>(end);
  while (pos < stop) {
    std::memset(buf.data(), 0, buf.size());
    fm->fm_start = pos;
    fm->fm_length = stop - pos;
    // SYNC: dirty pages not yet allocated (delayed allocation) get their extents first.
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = kFiemapBatch;
    if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) return -errno;
    if (fm->fm_mapped_extents == 0) return 0;
    bool last = false;
    uint64_t next = pos;
    for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const struct fiemap_extent& e = fm->fm_extents[i];
      uint64_t a = e.fe_logical;
      uint64_t b = e.fe_logical + e.fe_length;
      if (b > stop) b = stop;
      if (e.fe_flags & FIEMAP_EXTENT_LAST) last = true;
      if (b <= a || a >= stop) continue;
      next = std::max(next, b);
      // Preallocated (reads as zeros unless written since), delayed or unknown: SEEK_DATA
      // knows whether the page cache holds data there.
      if (e.fe_flags & (FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_UNKNOWN)) {
        Status st = ScanRange(fd, static_cast<off_t>(a), static_cast<off_t>(b));
        if (!st.ok()) return -(st.sys_errno != 0 ? st.sys_errno : EIO);
        continue;
      }
      extents_.Set(a / kBlock, (b + kBlock - 1) / kBlock, num_);
    }
    if (last || next <= pos) return 0;  // no progress would loop forever
    pos = next;
  }
  return 0;
}

int Layer::Resize(uint64_t size_bytes) {
  LayerFd h;
  if (int rc = Acquire(&h); rc != 0) return rc;
  if (::ftruncate(h.fd(), static_cast<off_t>(size_bytes)) != 0) return -errno;
  // fdatasync covers the length: it is needed to read the file back.
  return fsutil::FdataSync(h.fd());
}

uint64_t Layer::AllocatedBytes() const {
  struct stat st;
  // A cached layer is asked by path (the cache may close its descriptor at any time), without
  // taking a descriptor; lstat, so a planted symlink is not followed.
  if (resident_.load() ? ::fstat(fd_.load(), &st) != 0 : (::lstat(path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode)))
    return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace mooring
