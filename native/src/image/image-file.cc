#include "image/image-file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "image/image-reader.h"

namespace mooring {
namespace {

Status OpenError(int err, const std::string& path, const std::string& what) {
  if (err == ENOENT) return Status::Error(Code::kNotFound, what + " " + path + " does not exist", err);
  if (err == ELOOP || err == EXDEV)
    return Status::Error(Code::kUnsupported,
                         what + " " + path + " resolves outside the image's directory (through '..' or a symlink); " +
                             "images may only name files beneath their own directory",
                         err);
  return Status::FromErrno(err, "cannot open " + what + " " + path + ": " + std::strerror(err));
}

// openat2 with RESOLVE_BENEATH: the kernel refuses any path (symlinks included) that would
// leave `root_fd`. -ENOSYS where the kernel or a seccomp filter lacks it.
int OpenAt2Beneath(int root_fd, const char* rel) {
#ifdef SYS_openat2
  struct open_how how;
  std::memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long fd = ::syscall(SYS_openat2, root_fd, rel, &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EINTR) return -errno;
  }
#else
  (void)root_fd;
  (void)rel;
  return -ENOSYS;
#endif
}

}  // namespace

ImageFile::~ImageFile() { Close(); }

void ImageFile::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status ImageFile::Stat() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "fstat " + path_ + ": " + std::strerror(errno));
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (S_ISREG(st.st_mode)) {
    size_ = static_cast<uint64_t>(st.st_size);
  } else if (S_ISBLK(st.st_mode)) {
    uint64_t bytes = 0;
    if (::ioctl(fd_, BLKGETSIZE64, &bytes) != 0)
      return Status::FromErrno(errno, "BLKGETSIZE64 " + path_ + ": " + std::strerror(errno));
    size_ = bytes;
  } else {
    return Status::Error(Code::kUnsupported, path_ + " is not a regular file or block device");
  }
  // Opened O_NONBLOCK so that a FIFO cannot block open(); files and block devices read as usual without it.
  int fl = ::fcntl(fd_, F_GETFL);
  if (fl >= 0) ::fcntl(fd_, F_SETFL, fl & ~O_NONBLOCK);
  return Status::Ok();
}

Status ImageFile::Open(const std::string& path, std::unique_ptr<ImageFile>* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return OpenError(errno, path, "image");
  std::unique_ptr<ImageFile> f(new ImageFile(fd, path));
  Status st = f->Stat();
  if (!st.ok()) return st;
  *out = std::move(f);
  return Status::Ok();
}

Status ImageFile::OpenBeneath(int root_fd, const std::string& root_path, const std::string& rel,
                              std::unique_ptr<ImageFile>* out) {
  const std::string shown = root_path.empty() || root_path == "." ? rel : root_path + "/" + rel;
  int fd = OpenAt2Beneath(root_fd, rel.c_str());
  if (fd == -ENOSYS || fd == -EPERM) {
    // No openat2 (kernel < 5.6 or a seccomp filter): a single plain component opened
    // without following a final symlink cannot leave the directory either.
    if (rel.find('/') != std::string::npos)
      return Status::Error(Code::kUnsupported,
                           "file " + shown + " is in a subdirectory, which needs openat2 (Linux 5.6 or newer)");
    fd = ::openat(root_fd, rel.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
    if (fd < 0) fd = -errno;
  }
  if (fd < 0) return OpenError(-fd, shown, "file");
  std::unique_ptr<ImageFile> f(new ImageFile(fd, shown));
  Status st = f->Stat();
  if (!st.ok()) return st;
  *out = std::move(f);
  return Status::Ok();
}

Status ImageFile::CheckStoredName(const std::string& image_path, const std::string& what, const std::string& name) {
  auto bad = [&](Code code, const std::string& why) {
    return Status::Error(code, image_path + ": " + what + " '" + name + "' " + why);
  };
  if (name.empty()) return bad(Code::kCorrupt, "is empty");
  if (name.size() > kImageFileNameBytesMax) return bad(Code::kCorrupt, "is longer than " + std::to_string(kImageFileNameBytesMax) + " bytes");
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) return bad(Code::kCorrupt, "contains a control character");
  }
  if (name[0] == '/') return bad(Code::kUnsupported, "is an absolute path; images may only name files beneath their own directory");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(start, end - start);
    if (part.empty()) return bad(Code::kCorrupt, "has an empty path component");
    if (part == "." || part == "..")
      return bad(Code::kUnsupported, "has a '" + part + "' component; images may only name files beneath their own directory");
    start = end + 1;
  }
  // A protocol prefix ("nbd:", "http://") would be a network source in QEMU; here it can
  // only be a file name, which the checks above already allow or refuse.
  return Status::Ok();
}

int ImageFile::ReadAt(uint64_t off, size_t len, uint8_t* buf) const {
  if (fd_ < 0) return -ESHUTDOWN;
  size_t in_file = 0;
  if (off < size_) in_file = static_cast<size_t>(len < size_ - off ? len : size_ - off);
  size_t done = 0;
  while (done < in_file) {
    ssize_t n = ::pread(fd_, buf + done, in_file - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;  // the file shrank since it was opened: the rest reads as zeros
    done += static_cast<size_t>(n);
  }
  if (done < len) std::memset(buf + done, 0, len - done);
  return 0;
}

int ImageFile::DataRun(uint64_t off, uint64_t* run_end, bool* is_data) const {
  if (fd_ < 0) return -ESHUTDOWN;
  if (off >= size_) {
    *run_end = off;
    *is_data = false;
    return 0;
  }
  off_t data = ::lseek(fd_, static_cast<off_t>(off), SEEK_DATA);
  if (data < 0) {
    if (errno == ENXIO) {  // a hole up to the end of the file
      *run_end = size_;
      *is_data = false;
      return 0;
    }
    *run_end = size_;  // no hole reporting: all data
    *is_data = true;
    return 0;
  }
  if (static_cast<uint64_t>(data) > off) {
    *run_end = static_cast<uint64_t>(data) < size_ ? static_cast<uint64_t>(data) : size_;
    *is_data = false;
    return 0;
  }
  off_t hole = ::lseek(fd_, static_cast<off_t>(off), SEEK_HOLE);
  uint64_t end = hole < 0 ? size_ : static_cast<uint64_t>(hole);
  if (end > size_ || end <= off) end = size_;
  *run_end = end;
  *is_data = true;
  return 0;
}

}  // namespace mooring
